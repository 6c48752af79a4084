//! Concurrency keys (decision 0020): a slot row per (namespace, workflow,
//! key value) counts the runs holding a slot. Admissions and releases lock
//! it first, so per key they happen one at a time, across servers.
//!
//! Lock order: a run's own row (the event transaction's lock) before the
//! slot row; other runs' rows only with SKIP LOCKED, never waited for.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Row};
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
    /// True when this statement created the row: the key was not in use.
    pub created: bool,
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
         RETURNING running, nextval('run_arrival_seq') AS seq, clock_timestamp() AS arrived_at, \
           (xmax = 0) AS created",
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
        created: row.try_get("created")?,
    })
}

/// The concurrency keys the namespace has in use (its slot rows, this
/// transaction's new one included), counted up to `cap` + 1: what a new
/// key is checked against, at a cost bounded by the quota.
pub async fn count_keys(
    conn: &mut PgConnection,
    namespace: &str,
    cap: i64,
) -> Result<i64, StoreError> {
    // count_keys: the primary key's namespace prefix, at most cap + 1 entries
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM concurrency_slots WHERE namespace = $1 LIMIT $2) k",
    )
    .bind(namespace)
    .bind(cap.saturating_add(1))
    .fetch_one(conn)
    .await?)
}

/// Deletes the slot row this transaction just created for a key it may
/// not use (over the namespace's quota): the refusal leaves nothing.
pub async fn forget_new_slot(conn: &mut PgConnection, slot: SlotKey<'_>) -> Result<(), StoreError> {
    // forget_new_slot: primary key delete of the caller's own new row
    sqlx::query(
        "DELETE FROM concurrency_slots \
         WHERE namespace = $1 AND workflow_name = $2 AND key_value = $3 AND running = 0",
    )
    .bind(slot.namespace)
    .bind(slot.workflow_name)
    .bind(slot.key)
    .execute(conn)
    .await?;
    Ok(())
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
    if running == 0 {
        forget_unused_slot(conn, slot).await?;
    }
    Ok(handed)
}

/// Deletes the key's slot row when no run holds a slot of it and none
/// waits for one: a key not in use keeps no row (decision 0037). The
/// caller holds the row's lock, so no admission of the key is in between;
/// one that comes later waits on the lock, then its upsert inserts the row
/// again. A statement of its own: it sees every QUEUED run committed
/// before the lock was taken, skipped ones (locked right now) included.
async fn forget_unused_slot(conn: &mut PgConnection, slot: SlotKey<'_>) -> Result<(), StoreError> {
    // forget_unused_slot: primary key delete under the caller's lock, and
    // a runs_queued_by_key probe
    sqlx::query(
        "DELETE FROM concurrency_slots \
         WHERE namespace = $1 AND workflow_name = $2 AND key_value = $3 AND running = 0 \
           AND NOT EXISTS (SELECT 1 FROM runs \
             WHERE namespace = $1 AND workflow_name = $2 AND concurrency_key = $3 \
               AND status = 'QUEUED')",
    )
    .bind(slot.namespace)
    .bind(slot.workflow_name)
    .bind(slot.key)
    .execute(conn)
    .await?;
    Ok(())
}

/// A `task_slots s` row no task holds (DISPATCHED, LEASED, HELD) or waits
/// for (WAITING_SLOT).
/// Two probes, as the tasks' indexes on holders and on waiters differ.
const TASK_SLOT_UNUSED: &str = "NOT EXISTS (SELECT 1 FROM tasks t \
       WHERE t.namespace = s.namespace AND t.workflow_name = s.workflow_name \
         AND t.concurrency_node = s.node_id AND t.concurrency_key = s.key_value \
         AND t.status IN ('DISPATCHED', 'LEASED', 'HELD')) \
     AND NOT EXISTS (SELECT 1 FROM tasks t \
       WHERE t.namespace = s.namespace AND t.workflow_name = s.workflow_name \
         AND t.concurrency_node = s.node_id AND t.concurrency_key = s.key_value \
         AND t.status = 'WAITING_SLOT')";

/// What one sweep of unused slot rows deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Run concurrency keys (`concurrency_slots`).
    pub run_keys: u64,
    /// TASK node concurrency keys (`task_slots`).
    pub task_keys: u64,
}

/// Deletes up to `limit` slot rows of each kind whose key no run or task
/// holds or waits for: what a release left because a waiter was locked at
/// that moment (and was then cancelled), or a rolled-back one. Rows another
/// transaction holds are skipped. Each kind in a transaction of two
/// statements: lock the candidates, then delete those still unused, seen
/// by a snapshot taken after the locks.
pub async fn sweep_unused_slots(pool: &PgPool, limit: i64) -> Result<Swept, StoreError> {
    let mut tx = pool.begin().await?;
    // unused_run_slots: empty rows, locked; a concurrent admission of one
    // of these keys waits for this transaction, then inserts it again
    let keys: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT namespace, workflow_name, key_value FROM concurrency_slots \
         WHERE running = 0 LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    let (namespaces, workflows, values) = unzip3(keys);
    // delete_unused_run_slots: those with no QUEUED run
    let run_keys = sqlx::query(
        "DELETE FROM concurrency_slots s \
         USING UNNEST($1::text[], $2::text[], $3::text[]) AS k(namespace, workflow_name, key_value) \
         WHERE s.namespace = k.namespace AND s.workflow_name = k.workflow_name \
           AND s.key_value = k.key_value AND s.running = 0 \
           AND NOT EXISTS (SELECT 1 FROM runs r \
             WHERE r.namespace = s.namespace AND r.workflow_name = s.workflow_name \
               AND r.concurrency_key = s.key_value AND r.status = 'QUEUED')",
    )
    .bind(&namespaces)
    .bind(&workflows)
    .bind(&values)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;

    let mut tx = pool.begin().await?;
    // unused_task_slots: rows with no holding or waiting task, locked
    let keys: Vec<(String, String, String, String)> = sqlx::query_as(&format!(
        "SELECT namespace, workflow_name, node_id, key_value FROM task_slots s \
             WHERE {TASK_SLOT_UNUSED} LIMIT $1 FOR UPDATE SKIP LOCKED"
    ))
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    let mut namespaces = Vec::with_capacity(keys.len());
    let mut workflows = Vec::with_capacity(keys.len());
    let mut nodes = Vec::with_capacity(keys.len());
    let mut values = Vec::with_capacity(keys.len());
    for (namespace, workflow, node, value) in keys {
        namespaces.push(namespace);
        workflows.push(workflow);
        nodes.push(node);
        values.push(value);
    }
    // delete_unused_task_slots: those still with no holder and no waiter
    let task_keys = sqlx::query(&format!(
        "DELETE FROM task_slots s \
         USING UNNEST($1::text[], $2::text[], $3::text[], $4::text[]) \
           AS k(namespace, workflow_name, node_id, key_value) \
         WHERE s.namespace = k.namespace AND s.workflow_name = k.workflow_name \
           AND s.node_id = k.node_id AND s.key_value = k.key_value AND {TASK_SLOT_UNUSED}"
    ))
    .bind(&namespaces)
    .bind(&workflows)
    .bind(&nodes)
    .bind(&values)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(Swept {
        run_keys,
        task_keys,
    })
}

fn unzip3(rows: Vec<(String, String, String)>) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut first = Vec::with_capacity(rows.len());
    let mut second = Vec::with_capacity(rows.len());
    let mut third = Vec::with_capacity(rows.len());
    for (a, b, c) in rows {
        first.push(a);
        second.push(b);
        third.push(c);
    }
    (first, second, third)
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
