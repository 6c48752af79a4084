//! Schedules: one row each, claimed by the scheduler of any server with
//! `FOR UPDATE SKIP LOCKED` when due (decision 0016).

use chrono::{DateTime, Utc};
use serde_json::Value as Json;
use sqlx::{PgConnection, PgPool, Row, postgres::PgRow};
use uuid::Uuid;

use crate::StoreError;

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRow {
    /// Namespace.
    pub namespace: String,
    /// Id (a name).
    pub id: String,
    /// `composer_engine::schedule::ScheduleSpec` as JSON.
    pub spec: Json,
    /// `{workflow_name, version, input, labels}`.
    pub action: Json,
    /// SKIP, BUFFER_ONE, ALLOW_ALL, CANCEL_PREVIOUS.
    pub overlap: String,
    /// Catch-up window, ms.
    pub catch_up_window_ms: i64,
    /// Largest jitter, ms.
    pub jitter_ms: i64,
    /// Paused.
    pub paused: bool,
    /// The note of the last pause or resume.
    pub note: String,
    /// The next fire time (None: never again).
    pub next_fire_at: Option<DateTime<Utc>>,
    /// The next fire time with its jitter.
    pub next_due_at: Option<DateTime<Utc>>,
    /// A fire waiting for the running run to end (BUFFER_ONE).
    pub buffered_fire_at: Option<DateTime<Utc>>,
    /// The run of the last fire that started one.
    pub last_run_id: Option<Uuid>,
    /// The last fires, newest first.
    pub recent_fires: Json,
    /// Fires that started a run.
    pub fired_count: i64,
    /// Fires skipped by the overlap policy.
    pub skipped_count: i64,
    /// Fires older than the catch-up window, never started.
    pub missed_count: i64,
    /// Why the last fire started nothing.
    pub last_error: Option<String>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
}

const SCHEDULE_COLUMNS: &str = "namespace, id, spec, action, overlap, catch_up_window_ms, \
    jitter_ms, paused, note, next_fire_at, next_due_at, buffered_fire_at, last_run_id, \
    recent_fires, fired_count, skipped_count, missed_count, last_error, created_at, updated_at";

fn schedule_from_row(row: &PgRow) -> Result<ScheduleRow, sqlx::Error> {
    Ok(ScheduleRow {
        namespace: row.try_get("namespace")?,
        id: row.try_get("id")?,
        spec: row.try_get("spec")?,
        action: row.try_get("action")?,
        overlap: row.try_get("overlap")?,
        catch_up_window_ms: row.try_get("catch_up_window_ms")?,
        jitter_ms: row.try_get("jitter_ms")?,
        paused: row.try_get("paused")?,
        note: row.try_get("note")?,
        next_fire_at: row.try_get("next_fire_at")?,
        next_due_at: row.try_get("next_due_at")?,
        buffered_fire_at: row.try_get("buffered_fire_at")?,
        last_run_id: row.try_get("last_run_id")?,
        recent_fires: row.try_get("recent_fires")?,
        fired_count: row.try_get("fired_count")?,
        skipped_count: row.try_get("skipped_count")?,
        missed_count: row.try_get("missed_count")?,
        last_error: row.try_get("last_error")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// What a schedule's definition holds (create and update).
#[derive(Debug, Clone)]
pub struct ScheduleDefinition<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Id.
    pub id: &'a str,
    /// Spec JSON.
    pub spec: &'a Json,
    /// Action JSON.
    pub action: &'a Json,
    /// Overlap policy.
    pub overlap: &'a str,
    /// Catch-up window, ms.
    pub catch_up_window_ms: i64,
    /// Jitter, ms.
    pub jitter_ms: i64,
    /// The first fire time.
    pub next_fire_at: Option<DateTime<Utc>>,
    /// It with its jitter.
    pub next_due_at: Option<DateTime<Utc>>,
}

/// What an insert did.
#[derive(Debug, Clone, PartialEq)]
pub enum Inserted {
    /// The new row.
    Created(Box<ScheduleRow>),
    /// The namespace already has a schedule with this id.
    Exists,
    /// The namespace holds `cap` schedules already.
    Full,
}

/// Inserts a schedule unless its id is taken or its namespace holds `cap`
/// schedules. The caller's transaction holds the namespace's lock from
/// here to its commit, so two creates cannot both take the last place.
pub async fn insert_schedule(
    conn: &mut PgConnection,
    schedule: &ScheduleDefinition<'_>,
    paused: bool,
    note: &str,
    cap: i64,
) -> Result<Inserted, StoreError> {
    // insert_schedule: creates of one namespace in turn (transaction lock)
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('schedules:' || $1, 0))")
        .bind(schedule.namespace)
        .execute(&mut *conn)
        .await?;
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM schedules WHERE namespace = $1")
        .bind(schedule.namespace)
        .fetch_one(&mut *conn)
        .await?;
    if count >= cap {
        return Ok(Inserted::Full);
    }
    let row = sqlx::query(&format!(
        "INSERT INTO schedules (namespace, id, spec, action, overlap, catch_up_window_ms, \
           jitter_ms, next_fire_at, next_due_at, paused, note) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
         ON CONFLICT (namespace, id) DO NOTHING RETURNING {SCHEDULE_COLUMNS}"
    ))
    .bind(schedule.namespace)
    .bind(schedule.id)
    .bind(schedule.spec)
    .bind(schedule.action)
    .bind(schedule.overlap)
    .bind(schedule.catch_up_window_ms)
    .bind(schedule.jitter_ms)
    .bind(schedule.next_fire_at)
    .bind(schedule.next_due_at)
    .bind(paused)
    .bind(note)
    .fetch_optional(conn)
    .await?;
    match row {
        Some(row) => Ok(Inserted::Created(Box::new(schedule_from_row(&row)?))),
        None => Ok(Inserted::Exists),
    }
}

/// A schedule of the namespace.
pub async fn get_schedule(
    pool: &PgPool,
    namespace: &str,
    id: &str,
) -> Result<Option<ScheduleRow>, StoreError> {
    // get_schedule: primary key
    let row = sqlx::query(&format!(
        "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE namespace = $1 AND id = $2"
    ))
    .bind(namespace)
    .bind(id)
    .fetch_optional(pool)
    .await?;
    Ok(row.as_ref().map(schedule_from_row).transpose()?)
}

/// Locks a schedule of the namespace for the rest of the transaction.
pub async fn lock_schedule(
    conn: &mut PgConnection,
    namespace: &str,
    id: &str,
) -> Result<Option<ScheduleRow>, StoreError> {
    // lock_schedule: primary key; fires and changes of one schedule in turn
    let row = sqlx::query(&format!(
        "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE namespace = $1 AND id = $2 FOR UPDATE"
    ))
    .bind(namespace)
    .bind(id)
    .fetch_optional(conn)
    .await?;
    Ok(row.as_ref().map(schedule_from_row).transpose()?)
}

/// One page of the namespace's schedules by id, after `after_id`.
pub async fn list_schedules(
    pool: &PgPool,
    namespace: &str,
    after_id: Option<&str>,
    limit: i64,
) -> Result<Vec<ScheduleRow>, StoreError> {
    // list_schedules: primary key range
    let rows = sqlx::query(&format!(
        "SELECT {SCHEDULE_COLUMNS} FROM schedules \
         WHERE namespace = $1 AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3"
    ))
    .bind(namespace)
    .bind(after_id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(schedule_from_row)
        .collect::<Result<_, _>>()
        .map_err(StoreError::from)
}

/// Replaces a locked schedule's definition and its next fire; a buffered
/// fire is dropped (it belonged to the old spec).
pub async fn update_definition(
    conn: &mut PgConnection,
    schedule: &ScheduleDefinition<'_>,
) -> Result<ScheduleRow, StoreError> {
    // update_definition: primary key
    let row = sqlx::query(&format!(
        "UPDATE schedules SET spec = $3, action = $4, overlap = $5, catch_up_window_ms = $6, \
           jitter_ms = $7, next_fire_at = $8, next_due_at = $9, buffered_fire_at = NULL, \
           updated_at = now() \
         WHERE namespace = $1 AND id = $2 RETURNING {SCHEDULE_COLUMNS}"
    ))
    .bind(schedule.namespace)
    .bind(schedule.id)
    .bind(schedule.spec)
    .bind(schedule.action)
    .bind(schedule.overlap)
    .bind(schedule.catch_up_window_ms)
    .bind(schedule.jitter_ms)
    .bind(schedule.next_fire_at)
    .bind(schedule.next_due_at)
    .fetch_one(conn)
    .await?;
    Ok(schedule_from_row(&row)?)
}

/// A next fire time and when it is due (its jitter added); None: none.
pub type NextFire = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// Pauses or resumes a locked schedule with a note; a resume sets the next
/// fire (fires that fell in the pause are not caught up).
pub async fn set_paused(
    conn: &mut PgConnection,
    namespace: &str,
    id: &str,
    paused: bool,
    note: &str,
    next: Option<NextFire>,
) -> Result<ScheduleRow, StoreError> {
    // set_paused: primary key
    let (next_fire_at, next_due_at) = next.unwrap_or_default();
    let row = sqlx::query(&format!(
        "UPDATE schedules SET paused = $3, note = $4, \
           next_fire_at = CASE WHEN $5 THEN $6 ELSE next_fire_at END, \
           next_due_at = CASE WHEN $5 THEN $7 ELSE next_due_at END, \
           buffered_fire_at = CASE WHEN $3 THEN NULL ELSE buffered_fire_at END, \
           updated_at = now() \
         WHERE namespace = $1 AND id = $2 RETURNING {SCHEDULE_COLUMNS}"
    ))
    .bind(namespace)
    .bind(id)
    .bind(paused)
    .bind(note)
    .bind(next.is_some())
    .bind(next_fire_at)
    .bind(next_due_at)
    .fetch_one(conn)
    .await?;
    Ok(schedule_from_row(&row)?)
}

/// Deletes a schedule; false when it did not exist. Its runs stay.
pub async fn delete_schedule(pool: &PgPool, namespace: &str, id: &str) -> Result<bool, StoreError> {
    // delete_schedule: primary key
    let done = sqlx::query("DELETE FROM schedules WHERE namespace = $1 AND id = $2")
        .bind(namespace)
        .bind(id)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// Takes one schedule that is due (its next fire, jitter included, is at
/// or before now) or holds a buffered fire whose previous run ended, locked for the transaction;
/// schedules another server holds are skipped. Returns it and the
/// database's clock, the one clock every server compares with.
pub async fn claim_due_schedule(
    conn: &mut PgConnection,
) -> Result<Option<(ScheduleRow, DateTime<Utc>)>, StoreError> {
    // claim_due_schedule: served by schedules_due and schedules_buffered
    let row = sqlx::query(&format!(
        "SELECT {SCHEDULE_COLUMNS}, clock_timestamp() AS now FROM schedules \
         WHERE NOT paused AND (next_due_at <= clock_timestamp() \
           OR (buffered_fire_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM runs \
             WHERE runs.id = schedules.last_run_id \
               AND runs.status IN ('PENDING', 'RUNNING', 'COMPENSATING')))) \
         ORDER BY next_due_at LIMIT 1 FOR UPDATE OF schedules SKIP LOCKED"
    ))
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some((schedule_from_row(&row)?, row.try_get("now")?)))
}

/// The database's clock.
pub async fn database_now(conn: &mut PgConnection) -> Result<DateTime<Utc>, StoreError> {
    // database_now: no table
    Ok(sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(conn)
        .await?)
}

/// What a pass of the scheduler changed on a locked schedule.
#[derive(Debug, Clone, Default)]
pub struct FireState {
    /// The next fire time.
    pub next_fire_at: Option<DateTime<Utc>>,
    /// It with its jitter.
    pub next_due_at: Option<DateTime<Utc>>,
    /// The buffered fire.
    pub buffered_fire_at: Option<DateTime<Utc>>,
    /// The last run started.
    pub last_run_id: Option<Uuid>,
    /// The last fires, newest first.
    pub recent_fires: Json,
    /// Runs started by this pass.
    pub fired: i64,
    /// Fires skipped by this pass.
    pub skipped: i64,
    /// Fires missed.
    pub missed: i64,
    /// Why the last fire started nothing (None: it started).
    pub last_error: Option<String>,
}

/// Writes a pass's result on a locked schedule.
pub async fn save_fire_state(
    conn: &mut PgConnection,
    namespace: &str,
    id: &str,
    state: &FireState,
) -> Result<(), StoreError> {
    // save_fire_state: primary key
    sqlx::query(
        "UPDATE schedules SET next_fire_at = $3, next_due_at = $4, buffered_fire_at = $5, \
           last_run_id = $6, recent_fires = $7, fired_count = fired_count + $8, \
           skipped_count = skipped_count + $9, missed_count = missed_count + $10, \
           last_error = $11, updated_at = now() \
         WHERE namespace = $1 AND id = $2",
    )
    .bind(namespace)
    .bind(id)
    .bind(state.next_fire_at)
    .bind(state.next_due_at)
    .bind(state.buffered_fire_at)
    .bind(state.last_run_id)
    .bind(&state.recent_fires)
    .bind(state.fired)
    .bind(state.skipped)
    .bind(state.missed)
    .bind(&state.last_error)
    .execute(conn)
    .await?;
    Ok(())
}

/// The stored status of a run (None: it is gone, e.g. by retention).
pub async fn run_status(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<String>, StoreError> {
    // run_status: primary key of runs
    Ok(sqlx::query_scalar("SELECT status FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(conn)
        .await?)
}
