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
/// lock with [`crate::runs::lock_runs_taking_timers`], so two servers never
/// fire one twice).
pub async fn due_timers(pool: &PgPool, limit: i64) -> Result<Vec<DueTimer>, StoreError> {
    // due_timers: served by timers_due (held timers of paused runs are not in it)
    let rows = sqlx::query(
        "SELECT run_id, timer_key FROM timers WHERE fire_at <= now() AND NOT held \
         ORDER BY fire_at LIMIT $1",
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
