//! Durable timers: WAIT, retry back-off, event timeouts, attempt and run
//! timeouts. A timer is a row, never a sleeping thread.

use chrono::{DateTime, Utc};
use serde_json::Value as Json;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::StoreError;

/// A timer to schedule (or move, if its key exists).
#[derive(Debug, Clone)]
pub struct TimerWrite {
    /// Unique per run.
    pub key: String,
    /// The engine's timer id.
    pub timer: Json,
    /// When it fires.
    pub fire_at: DateTime<Utc>,
}

/// Schedules timers in one statement.
pub async fn schedule_timers(
    conn: &mut PgConnection,
    run_id: Uuid,
    namespace: &str,
    timers: &[TimerWrite],
) -> Result<(), StoreError> {
    if timers.is_empty() {
        return Ok(());
    }
    let keys: Vec<&str> = timers.iter().map(|t| t.key.as_str()).collect();
    let ids: Vec<&Json> = timers.iter().map(|t| &t.timer).collect();
    let fire_at: Vec<DateTime<Utc>> = timers.iter().map(|t| t.fire_at).collect();
    // schedule_timers: upsert by (run_id, timer_key)
    sqlx::query(
        "INSERT INTO timers (run_id, timer_key, namespace, timer, fire_at) \
         SELECT $1, k, $2, t, f FROM UNNEST($3::text[], $4::jsonb[], $5::timestamptz[]) AS x(k, t, f) \
         ON CONFLICT (run_id, timer_key) DO UPDATE SET timer = EXCLUDED.timer, fire_at = EXCLUDED.fire_at",
    )
    .bind(run_id)
    .bind(namespace)
    .bind(&keys)
    .bind(&ids)
    .bind(&fire_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Removes timers of a run by key.
pub async fn cancel_timers(
    conn: &mut PgConnection,
    run_id: Uuid,
    keys: &[String],
) -> Result<(), StoreError> {
    if keys.is_empty() {
        return Ok(());
    }
    // cancel_timers: primary key deletes
    sqlx::query("DELETE FROM timers WHERE run_id = $1 AND timer_key = ANY($2)")
        .bind(run_id)
        .bind(keys)
        .execute(conn)
        .await?;
    Ok(())
}

/// Removes every timer of a run (cancellation, run end).
pub async fn cancel_all_timers(conn: &mut PgConnection, run_id: Uuid) -> Result<(), StoreError> {
    // cancel_all_timers: primary key prefix delete
    sqlx::query("DELETE FROM timers WHERE run_id = $1")
        .bind(run_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// A due timer.
#[derive(Debug, Clone, PartialEq)]
pub struct DueTimer {
    /// Run.
    pub run_id: Uuid,
    /// Key.
    pub key: String,
}

/// Timers due now, earliest first (candidates: each is taken under its run
/// lock with [`take_timer`], so two servers never fire one twice).
pub async fn due_timers(pool: &PgPool, limit: i64) -> Result<Vec<DueTimer>, StoreError> {
    // due_timers: served by timers_due
    let rows = sqlx::query(
        "SELECT run_id, timer_key FROM timers WHERE fire_at <= now() ORDER BY fire_at LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(DueTimer {
                run_id: row.try_get("run_id")?,
                key: row.try_get("timer_key")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// Deletes a due timer and returns its id, or None if it is gone (fired by
/// another server, or cancelled) or not due. Under the run lock.
pub async fn take_timer(
    conn: &mut PgConnection,
    run_id: Uuid,
    key: &str,
) -> Result<Option<Json>, StoreError> {
    // take_timer: the one deletion that fires a timer
    Ok(sqlx::query_scalar(
        "DELETE FROM timers WHERE run_id = $1 AND timer_key = $2 AND fire_at <= now() RETURNING timer",
    )
    .bind(run_id)
    .bind(key)
    .fetch_optional(conn)
    .await?)
}
