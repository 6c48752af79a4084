//! Concurrency keys (decision 0020): a slot row per (namespace, workflow,
//! key value) counts the runs holding a slot. Admissions and releases lock
//! it first, so per key they happen one at a time, across servers.
//!
//! Lock order: a run's own row (the event transaction's lock) before the
//! slot row; other runs' rows only with SKIP LOCKED, never waited for.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use crate::StoreError;

/// The stored status of a run waiting for a slot.
pub const QUEUED: &str = "QUEUED";

/// The slot row of one key.
#[derive(Debug, Clone, Copy)]
pub struct SlotKey<'a> {
    pub namespace: &'a str,
    pub workflow_name: &'a str,
    pub key: &'a str,
}

/// A slot row locked for the rest of the transaction.
#[derive(Debug, Clone)]
pub struct LockedSlot {
    /// Runs holding a slot of the key now.
    pub running: i32,
    /// The arrival sequence of the run being admitted.
    pub seq: i64,
    /// When it arrived (the run's created_at): taken under the lock, so per
    /// key it orders runs as their admissions committed.
    pub arrived_at: DateTime<Utc>,
}

/// Locks the slot row of `slot` (creating it at 0) and draws an arrival.
pub async fn lock_slot(
    conn: &mut PgConnection,
    slot: SlotKey<'_>,
) -> Result<LockedSlot, StoreError> {
    // lock_slot: the upsert locks the row, existing or new, in one statement
    let row = sqlx::query(
        "INSERT INTO concurrency_slots (namespace, workflow_name, key_value) VALUES ($1, $2, $3) \
         ON CONFLICT (namespace, workflow_name, key_value) \
           DO UPDATE SET running = concurrency_slots.running \
         RETURNING running, nextval('run_arrival_seq') AS seq, clock_timestamp() AS arrived_at",
    )
    .bind(slot.namespace)
    .bind(slot.workflow_name)
    .bind(slot.key)
    .fetch_one(conn)
    .await?;
    Ok(LockedSlot {
        running: row.try_get("running")?,
        seq: row.try_get("seq")?,
        arrived_at: row.try_get("arrived_at")?,
    })
}

/// Takes one slot of a locked slot row.
pub async fn take_slot(conn: &mut PgConnection, slot: SlotKey<'_>) -> Result<(), StoreError> {
    // take_slot: primary key update under the caller's lock
    sqlx::query(
        "UPDATE concurrency_slots SET running = running + 1 \
         WHERE namespace = $1 AND workflow_name = $2 AND key_value = $3",
    )
    .bind(slot.namespace)
    .bind(slot.workflow_name)
    .bind(slot.key)
    .execute(conn)
    .await?;
    Ok(())
}

/// The oldest run holding a slot of the key that no transaction is writing
/// right now (on_limit: cancel_oldest), key-share locked so it stays.
/// Skipping locked rows keeps the lock order: a run in an event
/// transaction may be waiting for this very slot row.
pub async fn oldest_holder(
    conn: &mut PgConnection,
    slot: SlotKey<'_>,
) -> Result<Option<Uuid>, StoreError> {
    // oldest_holder: runs_holding_by_key, first unlocked
    Ok(sqlx::query_scalar(
        "SELECT id FROM runs \
         WHERE namespace = $1 AND workflow_name = $2 AND concurrency_key = $3 \
           AND concurrency_holds AND status <> 'CANCELLED' \
         ORDER BY concurrency_seq LIMIT 1 FOR KEY SHARE SKIP LOCKED",
    )
    .bind(slot.namespace)
    .bind(slot.workflow_name)
    .bind(slot.key)
    .fetch_optional(conn)
    .await?)
}

/// A locked run (already admitted once, e.g. FAILED) takes a slot again
/// (`holds`) or waits for one as QUEUED, with a new arrival.
pub async fn readmit_run(
    conn: &mut PgConnection,
    run_id: Uuid,
    seq: i64,
    holds: bool,
) -> Result<(), StoreError> {
    // readmit_run: primary key update of the caller's locked run
    sqlx::query(
        "UPDATE runs SET concurrency_seq = $2, concurrency_holds = $3, \
           status = CASE WHEN $3 THEN status ELSE 'QUEUED' END, updated_at = now() \
         WHERE id = $1",
    )
    .bind(run_id)
    .bind(seq)
    .bind(holds)
    .execute(conn)
    .await?;
    Ok(())
}

/// A QUEUED run a freed slot was handed to.
#[derive(Debug, Clone)]
pub struct HandedOver {
    pub run_id: Uuid,
    /// The engine's status underneath QUEUED (PENDING for a run never
    /// started, FAILED for a retry): what to apply to it next.
    pub engine_status: String,
}

/// Most QUEUED runs one release starts (more only when a new version
/// raised `max`; the rest start as later runs of the key end).
const MAX_HAND_OVERS: usize = 64;

/// The end of a locked run holding a slot: gives the slot back and hands
/// the free slots to the oldest QUEUED runs of the key, which now hold them
/// and show their engine status again. The caller applies their start.
pub async fn release_slot(
    conn: &mut PgConnection,
    run_id: Uuid,
    slot: SlotKey<'_>,
) -> Result<Vec<HandedOver>, StoreError> {
    // release_slot: the slot row (locked) and the run's own row
    let running: i32 = sqlx::query_scalar(
        "WITH run_row AS (UPDATE runs SET concurrency_holds = false WHERE id = $4) \
         UPDATE concurrency_slots SET running = GREATEST(running - 1, 0) \
         WHERE namespace = $1 AND workflow_name = $2 AND key_value = $3 RETURNING running",
    )
    .bind(slot.namespace)
    .bind(slot.workflow_name)
    .bind(slot.key)
    .bind(run_id)
    .fetch_optional(&mut *conn)
    .await?
    .unwrap_or(0);
    let mut handed = Vec::new();
    let mut running = running;
    while handed.len() < MAX_HAND_OVERS {
        let Some(next) = hand_over_next(conn, slot, running).await? else {
            break;
        };
        handed.push(next);
        running += 1;
    }
    Ok(handed)
}

/// Hands one slot to the oldest QUEUED run of the key, when `running`
/// leaves room under that run's `max`.
async fn hand_over_next(
    conn: &mut PgConnection,
    slot: SlotKey<'_>,
    running: i32,
) -> Result<Option<HandedOver>, StoreError> {
    // hand_over_next: runs_queued_by_key's first unlocked row (one being
    // cancelled is skipped), then the slot count
    let row = sqlx::query(
        "WITH next AS ( \
           SELECT id FROM runs \
           WHERE namespace = $1 AND workflow_name = $2 AND concurrency_key = $3 \
             AND status = 'QUEUED' AND concurrency_max > $4 \
           ORDER BY concurrency_seq LIMIT 1 FOR UPDATE SKIP LOCKED), \
         started AS ( \
           UPDATE runs SET status = record->>'status', concurrency_holds = true, \
             updated_at = now() \
           WHERE id = (SELECT id FROM next) RETURNING id, status), \
         counted AS ( \
           UPDATE concurrency_slots SET running = running + 1 \
           WHERE namespace = $1 AND workflow_name = $2 AND key_value = $3 \
             AND EXISTS (SELECT 1 FROM started)) \
         SELECT id, status FROM started",
    )
    .bind(slot.namespace)
    .bind(slot.workflow_name)
    .bind(slot.key)
    .bind(running)
    .fetch_optional(conn)
    .await?;
    row.map(|row| {
        Ok(HandedOver {
            run_id: row.try_get("id")?,
            engine_status: row.try_get("status")?,
        })
    })
    .transpose()
}
