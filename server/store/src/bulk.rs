//! Bulk operations on runs (decision 0019): one row each, claimed by any
//! server whose lease on it lapsed, walked a page of runs at a time. Every
//! change a worker makes is fenced by `lease_owner`, so a server that lost
//! the operation to another changes nothing.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value as Json, json};
use sqlx::{PgConnection, PgPool, Row, postgres::PgRow};
use uuid::Uuid;

use crate::{
    StoreError,
    runs::{self, RunFilter, filter_conditions},
};

/// Failures an operation keeps.
pub const MAX_FAILURES: i64 = 20;

/// Not yet claimed.
pub const PENDING: &str = "PENDING";
/// A server works on it.
pub const RUNNING: &str = "RUNNING";
/// Every matching run was acted on or skipped.
pub const SUCCEEDED: &str = "SUCCEEDED";
/// Stopped on request.
pub const CANCELLED: &str = "CANCELLED";
/// Stopped on an error.
pub const FAILED: &str = "FAILED";

/// A bulk operation as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct BulkOperationRow {
    /// Namespace.
    pub namespace: String,
    /// Id.
    pub id: Uuid,
    /// CANCEL, RETRY, PAUSE, RESUME or MIGRATE.
    pub kind: String,
    /// PENDING, RUNNING, SUCCEEDED, CANCELLED or FAILED.
    pub status: String,
    /// The filter as given (without the operation's own time bound).
    pub filter: RunFilter,
    /// The reason given.
    pub reason: String,
    /// The kind's own arguments (MIGRATE: target version and node mapping).
    pub params: Json,
    /// The request id given.
    pub request_id: Option<String>,
    /// Runs matched when it was created.
    pub matched: i64,
    /// Runs acted on.
    pub succeeded: i64,
    /// Runs passed over.
    pub skipped: i64,
    /// Runs the action failed on.
    pub failed: i64,
    /// The first failures: `[{run_id, message}]`.
    pub failures: Json,
    /// Who created it.
    pub created_by: String,
    /// Why it failed.
    pub error: Option<String>,
    /// The last run done, in walk order.
    pub cursor: Option<(DateTime<Utc>, Uuid)>,
    /// Set by CancelBulkOperation.
    pub cancel_requested: bool,
    /// Created (runs created before it match).
    pub created_at: DateTime<Utc>,
    /// Last progress.
    pub updated_at: DateTime<Utc>,
    /// Ended.
    pub ended_at: Option<DateTime<Utc>>,
}

impl BulkOperationRow {
    /// True once it ended.
    pub fn has_ended(&self) -> bool {
        !matches!(self.status.as_str(), PENDING | RUNNING)
    }

    /// The filter the walk applies: the one given, bounded by the
    /// operation's create time so runs started later are never touched.
    pub fn bounded_filter(&self) -> RunFilter {
        bounded(&self.filter, self.created_at)
    }
}

fn bounded(filter: &RunFilter, created_at: DateTime<Utc>) -> RunFilter {
    let before = filter
        .created_before
        .map_or(created_at, |given| given.min(created_at));
    RunFilter {
        created_before: Some(before),
        ..filter.clone()
    }
}

const BULK_COLUMNS: &str = "namespace, id, kind, status, filter, reason, params, request_id, matched, \
    succeeded, skipped, failed, failures, created_by, error, cursor_created_at, cursor_run_id, \
    cancel_requested, created_at, updated_at, ended_at";

fn bulk_from_row(row: &PgRow) -> Result<BulkOperationRow, StoreError> {
    let filter: Json = row.try_get("filter")?;
    let cursor_time: Option<DateTime<Utc>> = row.try_get("cursor_created_at")?;
    let cursor_id: Option<Uuid> = row.try_get("cursor_run_id")?;
    Ok(BulkOperationRow {
        namespace: row.try_get("namespace")?,
        id: row.try_get("id")?,
        kind: row.try_get("kind")?,
        status: row.try_get("status")?,
        filter: serde_json::from_value(filter)
            .map_err(|e| StoreError::Database(sqlx::Error::Decode(Box::new(e))))?,
        reason: row.try_get("reason")?,
        params: row.try_get("params")?,
        request_id: row.try_get("request_id")?,
        matched: row.try_get("matched")?,
        succeeded: row.try_get("succeeded")?,
        skipped: row.try_get("skipped")?,
        failed: row.try_get("failed")?,
        failures: row.try_get("failures")?,
        created_by: row.try_get("created_by")?,
        error: row.try_get("error")?,
        cursor: cursor_time.zip(cursor_id),
        cancel_requested: row.try_get("cancel_requested")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        ended_at: row.try_get("ended_at")?,
    })
}

/// An operation to create.
#[derive(Debug, Clone)]
pub struct NewBulkOperation<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Id.
    pub id: Uuid,
    /// CANCEL, RETRY, PAUSE, RESUME or MIGRATE.
    pub kind: &'a str,
    /// The filter as given.
    pub filter: &'a RunFilter,
    /// The reason given.
    pub reason: &'a str,
    /// The kind's own arguments (an empty object for most).
    pub params: &'a Json,
    /// Optional request id.
    pub request_id: Option<&'a str>,
    /// Who asks.
    pub created_by: &'a str,
}

/// Creates an operation with the count of runs it matches now, or returns
/// the one its request id already names (false).
pub async fn insert_bulk_operation(
    pool: &PgPool,
    new: &NewBulkOperation<'_>,
) -> Result<(BulkOperationRow, bool), StoreError> {
    let mut tx = pool.begin().await?;
    if let Some(existing) = by_request_id(&mut tx, new.namespace, new.request_id).await? {
        return Ok((existing, false));
    }
    let filter = serde_json::to_value(new.filter)
        .map_err(|e| StoreError::Database(sqlx::Error::Encode(Box::new(e))))?;
    // insert_bulk_operation: created_at is the transaction's now(), the
    // bound the count below and the walk both apply
    let row = sqlx::query(&format!(
        "INSERT INTO bulk_operations (namespace, id, kind, status, filter, reason, request_id, \
           created_by, params) VALUES ($1, $2, $3, 'PENDING', $4, $5, $6, $7, $8) \
         ON CONFLICT (namespace, request_id) WHERE request_id IS NOT NULL DO NOTHING \
         RETURNING {BULK_COLUMNS}"
    ))
    .bind(new.namespace)
    .bind(new.id)
    .bind(new.kind)
    .bind(&filter)
    .bind(new.reason)
    .bind(new.request_id)
    .bind(new.created_by)
    .bind(new.params)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        // a concurrent create with the same request id won
        drop(tx);
        let mut conn = pool.acquire().await?;
        let existing = by_request_id(&mut conn, new.namespace, new.request_id).await?;
        return existing
            .map(|op| (op, false))
            .ok_or(StoreError::Database(sqlx::Error::RowNotFound));
    };
    let mut op = bulk_from_row(&row)?;
    op.matched = count_matching(&mut tx, &op).await?;
    // set_matched: primary key
    sqlx::query("UPDATE bulk_operations SET matched = $2 WHERE id = $1")
        .bind(op.id)
        .bind(op.matched)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok((op, true))
}

async fn by_request_id(
    conn: &mut PgConnection,
    namespace: &str,
    request_id: Option<&str>,
) -> Result<Option<BulkOperationRow>, StoreError> {
    let Some(request_id) = request_id else {
        return Ok(None);
    };
    // bulk_by_request_id: served by bulk_operations_request_id
    let row = sqlx::query(&format!(
        "SELECT {BULK_COLUMNS} FROM bulk_operations WHERE namespace = $1 AND request_id = $2"
    ))
    .bind(namespace)
    .bind(request_id)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(bulk_from_row).transpose()
}

/// How many runs the operation's bounded filter matches.
async fn count_matching(conn: &mut PgConnection, op: &BulkOperationRow) -> Result<i64, StoreError> {
    // count_matching: the ListRuns conditions, bounded by the create time
    let c = filter_conditions(&op.namespace, &op.bounded_filter())?;
    let sql = format!("SELECT count(*) FROM runs WHERE {}", c.sql());
    runs::plan_by_values(conn).await?;
    Ok(sqlx::query_scalar_with(&sql, c.arguments)
        .fetch_one(conn)
        .await?)
}

/// An operation of the namespace.
pub async fn get_bulk_operation(
    pool: &PgPool,
    namespace: &str,
    id: Uuid,
) -> Result<Option<BulkOperationRow>, StoreError> {
    // get_bulk_operation: primary key, in its namespace
    let row = sqlx::query(&format!(
        "SELECT {BULK_COLUMNS} FROM bulk_operations WHERE id = $1 AND namespace = $2"
    ))
    .bind(id)
    .bind(namespace)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(bulk_from_row).transpose()
}

/// The namespace's operations newest first, after the keyset cursor.
pub async fn list_bulk_operations(
    pool: &PgPool,
    namespace: &str,
    cursor: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<BulkOperationRow>, StoreError> {
    let (time, id) = cursor.unzip();
    // list_bulk_operations: served by bulk_operations_by_created
    let rows = sqlx::query(&format!(
        "SELECT {BULK_COLUMNS} FROM bulk_operations WHERE namespace = $1 \
           AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3)) \
         ORDER BY created_at DESC, id DESC LIMIT $4"
    ))
    .bind(namespace)
    .bind(time)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(bulk_from_row).collect()
}

/// What a cancel request found.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelRequest {
    /// Marked (a PENDING one no server took ends CANCELLED at once).
    Marked(Box<BulkOperationRow>),
    /// It had ended already.
    Ended(Box<BulkOperationRow>),
    /// No such operation in the namespace.
    NotFound,
}

/// Asks an operation to stop. Waits for the run transaction holding its
/// row, so the answer reflects every run done so far.
pub async fn request_cancel(
    pool: &PgPool,
    namespace: &str,
    id: Uuid,
) -> Result<CancelRequest, StoreError> {
    let mut tx = pool.begin().await?;
    // lock_bulk_operation: primary key
    let row = sqlx::query(&format!(
        "SELECT {BULK_COLUMNS} FROM bulk_operations WHERE id = $1 AND namespace = $2 FOR UPDATE"
    ))
    .bind(id)
    .bind(namespace)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(CancelRequest::NotFound);
    };
    let op = bulk_from_row(&row)?;
    if op.has_ended() {
        return Ok(CancelRequest::Ended(Box::new(op)));
    }
    // mark_cancel_requested: an operation nobody holds ends now; a held one
    // ends when its server next records a run
    let row = sqlx::query(&format!(
        "UPDATE bulk_operations SET cancel_requested = true, updated_at = now(), \
           status = CASE WHEN status = 'PENDING' THEN 'CANCELLED' ELSE status END, \
           ended_at = CASE WHEN status = 'PENDING' THEN now() ELSE ended_at END \
         WHERE id = $1 RETURNING {BULK_COLUMNS}"
    ))
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    let op = bulk_from_row(&row)?;
    tx.commit().await?;
    Ok(CancelRequest::Marked(Box::new(op)))
}

/// Takes the oldest live operation whose lease lapsed (or that no server
/// took yet) for `owner` until `lease` from now; operations another
/// transaction holds are skipped.
pub async fn claim_bulk_operation(
    pool: &PgPool,
    owner: &str,
    lease: Duration,
) -> Result<Option<BulkOperationRow>, StoreError> {
    // claim_bulk_operation: served by bulk_operations_live
    let row = sqlx::query(&format!(
        "UPDATE bulk_operations SET status = 'RUNNING', lease_owner = $1, \
           lease_expires_at = clock_timestamp() + make_interval(secs => $2), updated_at = now() \
         WHERE id = (SELECT id FROM bulk_operations \
           WHERE status IN ('PENDING', 'RUNNING') \
             AND (lease_expires_at IS NULL OR lease_expires_at < clock_timestamp()) \
           ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED) \
         RETURNING {BULK_COLUMNS}"
    ))
    .bind(owner)
    .bind(lease.as_secs_f64())
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(bulk_from_row).transpose()
}

/// Where a held operation stands for its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Still ours, lease renewed.
    Held,
    /// Still ours, and asked to stop.
    CancelRequested,
    /// Another server took it, or it ended.
    Lost,
}

/// Renews `owner`'s lease and says whether to go on.
pub async fn renew_lease(
    pool: &PgPool,
    id: Uuid,
    owner: &str,
    lease: Duration,
) -> Result<Hold, StoreError> {
    // renew_bulk_lease: primary key, fenced by the owner
    let cancel: Option<bool> = sqlx::query_scalar(
        "UPDATE bulk_operations \
         SET lease_expires_at = clock_timestamp() + make_interval(secs => $3) \
         WHERE id = $1 AND lease_owner = $2 AND status = 'RUNNING' RETURNING cancel_requested",
    )
    .bind(id)
    .bind(owner)
    .bind(lease.as_secs_f64())
    .fetch_optional(pool)
    .await?;
    Ok(match cancel {
        None => Hold::Lost,
        Some(true) => Hold::CancelRequested,
        Some(false) => Hold::Held,
    })
}

/// Lets another server take the operation at once (a server that stops).
pub async fn release_lease(pool: &PgPool, id: Uuid, owner: &str) -> Result<(), StoreError> {
    // release_bulk_lease: primary key, fenced by the owner
    sqlx::query(
        "UPDATE bulk_operations SET lease_expires_at = NULL \
         WHERE id = $1 AND lease_owner = $2 AND status = 'RUNNING'",
    )
    .bind(id)
    .bind(owner)
    .execute(pool)
    .await?;
    Ok(())
}

/// The next page of runs to act on, strictly after `cursor` in walk order
/// (newest first): `(created_at, id)` of each.
pub async fn next_runs(
    pool: &PgPool,
    op: &BulkOperationRow,
    cursor: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<(DateTime<Utc>, Uuid)>, StoreError> {
    // next_bulk_runs: list_runs' conditions and keyset order, keys only
    let mut c = filter_conditions(&op.namespace, &op.bounded_filter())?;
    if let Some((time, id)) = cursor {
        let (t, i) = (c.bind(time)?, c.bind(id)?);
        c.and(format!("(created_at, id) < ({t}, {i})"));
    }
    let limit = c.bind(limit)?;
    let sql = format!(
        "SELECT created_at, id FROM runs WHERE {} ORDER BY created_at DESC, id DESC LIMIT {limit}",
        c.sql()
    );
    let rows = runs::fetch_filtered(pool, &sql, c).await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// What became of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// Acted on.
    Succeeded,
    /// Not in a status the action applies to.
    Skipped,
    /// The action failed, with why.
    Failed(String),
}

/// Counts one run's outcome and moves the cursor past it, in the caller's
/// transaction (the run's own, when it was acted on). False, changing
/// nothing, when `owner` no longer holds the operation or it was asked to
/// stop: the caller then rolls back.
pub async fn record_run(
    conn: &mut PgConnection,
    id: Uuid,
    owner: &str,
    lease: Duration,
    run: (DateTime<Utc>, Uuid),
    outcome: &RunOutcome,
) -> Result<bool, StoreError> {
    let (succeeded, skipped, failure) = match outcome {
        RunOutcome::Succeeded => (1_i64, 0_i64, None),
        RunOutcome::Skipped => (0, 1, None),
        RunOutcome::Failed(message) => (0, 0, Some(json!([{"run_id": run.1, "message": message}]))),
    };
    // record_bulk_run: primary key, fenced by the owner and the cancel flag
    let done = sqlx::query(
        "UPDATE bulk_operations SET succeeded = succeeded + $4, skipped = skipped + $5, \
           failed = failed + $6, \
           failures = CASE WHEN $7::jsonb IS NOT NULL AND jsonb_array_length(failures) < $8 \
             THEN failures || $7::jsonb ELSE failures END, \
           cursor_created_at = $9, cursor_run_id = $10, updated_at = now(), \
           lease_expires_at = clock_timestamp() + make_interval(secs => $3) \
         WHERE id = $1 AND lease_owner = $2 AND status = 'RUNNING' AND NOT cancel_requested",
    )
    .bind(id)
    .bind(owner)
    .bind(lease.as_secs_f64())
    .bind(succeeded)
    .bind(skipped)
    .bind(i64::from(failure.is_some()))
    .bind(failure)
    .bind(MAX_FAILURES)
    .bind(run.0)
    .bind(run.1)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Ends an operation `owner` holds. On SUCCEEDED, runs that matched at the
/// start but left the filter before their turn count as skipped, and runs
/// that entered it raise `matched`, so the counts add up.
pub async fn finish(
    pool: &PgPool,
    id: Uuid,
    owner: &str,
    status: &str,
    error: Option<&str>,
) -> Result<Option<BulkOperationRow>, StoreError> {
    // finish_bulk_operation: primary key, fenced by the owner
    let row = sqlx::query(&format!(
        "UPDATE bulk_operations SET status = $3, error = $4, ended_at = now(), \
           updated_at = now(), lease_owner = NULL, lease_expires_at = NULL, \
           skipped = CASE WHEN $3 = 'SUCCEEDED' \
             THEN skipped + greatest(0, matched - succeeded - skipped - failed) ELSE skipped END, \
           matched = CASE WHEN $3 = 'SUCCEEDED' \
             THEN greatest(matched, succeeded + skipped + failed) ELSE matched END \
         WHERE id = $1 AND lease_owner = $2 AND status = 'RUNNING' RETURNING {BULK_COLUMNS}"
    ))
    .bind(id)
    .bind(owner)
    .bind(status)
    .bind(error)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(bulk_from_row).transpose()
}
