//! Pausing runs: a paused run's tasks are HELD (no outbox row, no lease)
//! and its timers held (out of the timer loop's index) until it resumes.
//! Every statement here runs under the run's lock.

use sqlx::PgConnection;
use uuid::Uuid;

use crate::{StoreError, tasks::OutboxMessage};

/// The stored status of a paused run.
pub const PAUSED: &str = "PAUSED";

/// Marks a locked run PAUSED, takes back its dispatched but unleased tasks
/// (DISPATCHED -> HELD: a message still in Redis then loses the lease
/// update) and holds its timers, in one statement. Returns how many tasks
/// were taken back.
pub async fn pause_run(conn: &mut PgConnection, run_id: Uuid) -> Result<i64, StoreError> {
    // pause_run: the run row, its DISPATCHED tasks and its timers, together
    let held: i64 = sqlx::query_scalar(
        "WITH run_row AS ( \
           UPDATE runs SET status = 'PAUSED', updated_at = now() WHERE id = $1 RETURNING id), \
         held_timers AS (UPDATE timers SET held = true WHERE run_id = $1 AND NOT held), \
         held_tasks AS ( \
           UPDATE tasks SET status = 'HELD', updated_at = now() \
           WHERE run_id = $1 AND status = 'DISPATCHED' RETURNING id) \
         SELECT count(*) FROM held_tasks",
    )
    .bind(run_id)
    .fetch_one(conn)
    .await?;
    Ok(held)
}

/// Resumes a locked run: its status becomes `status` (the engine's, kept
/// while paused), its HELD tasks DISPATCHED again at the same attempt with
/// fresh outbox rows, its timers back in the timer loop's index. Returns
/// the outbox messages, for the committing server to publish.
pub async fn resume_run(
    conn: &mut PgConnection,
    run_id: Uuid,
    status: &str,
) -> Result<Vec<OutboxMessage>, StoreError> {
    // resume_run: the run row, its HELD tasks (re-enqueued) and its timers
    let rows = sqlx::query(
        "WITH run_row AS ( \
           UPDATE runs SET status = $2, updated_at = now() WHERE id = $1 RETURNING id), \
         released_timers AS (UPDATE timers SET held = false WHERE run_id = $1 AND held), \
         released AS ( \
           UPDATE tasks SET status = 'DISPATCHED', dispatched_at = now(), updated_at = now() \
           WHERE run_id = $1 AND status = 'HELD' \
           RETURNING namespace, queue, id, attempt, run_id, priority) \
         INSERT INTO outbox (namespace, queue, task_id, attempt, shard_key, priority) \
         SELECT namespace, queue, id, attempt, run_id, priority FROM released \
         RETURNING id AS outbox_id, namespace, queue, task_id, attempt, shard_key, priority",
    )
    .bind(run_id)
    .bind(status)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(crate::tasks::outbox_from_row)
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// Puts a paused run's timers back in the timer loop's index without
/// touching its tasks (a cancel of a paused run: the cancel itself removes
/// tasks and timers; this keeps none behind if it does not).
pub async fn release_timers(conn: &mut PgConnection, run_id: Uuid) -> Result<(), StoreError> {
    // release_timers: primary key prefix update
    sqlx::query("UPDATE timers SET held = false WHERE run_id = $1 AND held")
        .bind(run_id)
        .execute(conn)
        .await?;
    Ok(())
}
