//! Queue rate limits (decision 0021): one row per (namespace, queue), read
//! by every server's poll hub.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Row, postgres::PgRow};

use crate::StoreError;

/// A queue's rate limit as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitRow {
    /// Namespace.
    pub namespace: String,
    /// Queue.
    pub queue: String,
    /// Tasks per second handed out, over time.
    pub per_second: f64,
    /// Most tasks handed out in any one-second window.
    pub burst: i32,
    /// Tasks per second for each distinct rate-limit key, if limited.
    pub per_key_per_second: Option<f64>,
    /// Most tasks of one key in any one-second window.
    pub per_key_burst: Option<i32>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
}

/// The settings of a limit, to write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimitSetting<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Queue.
    pub queue: &'a str,
    /// Tasks per second.
    pub per_second: f64,
    /// Burst.
    pub burst: i32,
    /// Per key: tasks per second.
    pub per_key_per_second: Option<f64>,
    /// Per key: burst.
    pub per_key_burst: Option<i32>,
}

const COLUMNS: &str = "namespace, queue, per_second, burst, per_key_per_second, per_key_burst, \
    created_at, updated_at";

fn from_row(row: &PgRow) -> Result<RateLimitRow, sqlx::Error> {
    Ok(RateLimitRow {
        namespace: row.try_get("namespace")?,
        queue: row.try_get("queue")?,
        per_second: row.try_get("per_second")?,
        burst: row.try_get("burst")?,
        per_key_per_second: row.try_get("per_key_per_second")?,
        per_key_burst: row.try_get("per_key_burst")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// What a set did.
#[derive(Debug, Clone, PartialEq)]
pub enum Set {
    /// The row as written (new or replaced).
    Written(Box<RateLimitRow>),
    /// The queue has no limit yet and the namespace holds `cap` already.
    Full,
}

/// Creates or replaces a queue's limit, unless that adds one to a
/// namespace holding `cap`. The transaction lock makes the count and the
/// insert one step for the namespace.
pub async fn set_rate_limit(
    conn: &mut PgConnection,
    limit: &RateLimitSetting<'_>,
    cap: i64,
) -> Result<Set, StoreError> {
    // set_rate_limit: sets of one namespace in turn (transaction lock)
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('rate_limits:' || $1, 0))")
        .bind(limit.namespace)
        .execute(&mut *conn)
        .await?;
    let (count, exists): (i64, bool) = sqlx::query_as(
        "SELECT count(*), bool_or(queue = $2) IS TRUE FROM queue_rate_limits WHERE namespace = $1",
    )
    .bind(limit.namespace)
    .bind(limit.queue)
    .fetch_one(&mut *conn)
    .await?;
    if !exists && count >= cap {
        return Ok(Set::Full);
    }
    let row = sqlx::query(&format!(
        "INSERT INTO queue_rate_limits (namespace, queue, per_second, burst, \
           per_key_per_second, per_key_burst) VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (namespace, queue) DO UPDATE SET per_second = EXCLUDED.per_second, \
           burst = EXCLUDED.burst, per_key_per_second = EXCLUDED.per_key_per_second, \
           per_key_burst = EXCLUDED.per_key_burst, updated_at = now() \
         RETURNING {COLUMNS}"
    ))
    .bind(limit.namespace)
    .bind(limit.queue)
    .bind(limit.per_second)
    .bind(limit.burst)
    .bind(limit.per_key_per_second)
    .bind(limit.per_key_burst)
    .fetch_one(conn)
    .await?;
    Ok(Set::Written(Box::new(from_row(&row)?)))
}

/// A queue's limit.
pub async fn get_rate_limit(
    pool: &PgPool,
    namespace: &str,
    queue: &str,
) -> Result<Option<RateLimitRow>, StoreError> {
    // get_rate_limit: primary key
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM queue_rate_limits WHERE namespace = $1 AND queue = $2"
    ))
    .bind(namespace)
    .bind(queue)
    .fetch_optional(pool)
    .await?;
    Ok(row.as_ref().map(from_row).transpose()?)
}

/// One page of the namespace's limits by queue, after `after_queue`.
pub async fn list_rate_limits(
    pool: &PgPool,
    namespace: &str,
    after_queue: Option<&str>,
    limit: i64,
) -> Result<Vec<RateLimitRow>, StoreError> {
    // list_rate_limits: primary key range
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM queue_rate_limits \
         WHERE namespace = $1 AND ($2::text IS NULL OR queue > $2) ORDER BY queue LIMIT $3"
    ))
    .bind(namespace)
    .bind(after_queue)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(from_row)
        .collect::<Result<_, _>>()
        .map_err(StoreError::from)
}

/// Deletes a queue's limit; false when it had none.
pub async fn delete_rate_limit(
    pool: &PgPool,
    namespace: &str,
    queue: &str,
) -> Result<bool, StoreError> {
    // delete_rate_limit: primary key
    let deleted = sqlx::query("DELETE FROM queue_rate_limits WHERE namespace = $1 AND queue = $2")
        .bind(namespace)
        .bind(queue)
        .execute(pool)
        .await?;
    Ok(deleted.rows_affected() > 0)
}

/// The limits of the given (namespace, queue) pairs that have one: what a
/// poll hub refreshes for the queues it serves.
pub async fn rate_limits_of(
    pool: &PgPool,
    queues: &[(String, String)],
) -> Result<Vec<RateLimitRow>, StoreError> {
    // rate_limits_of: primary key lookups
    let namespaces: Vec<&str> = queues.iter().map(|(n, _)| n.as_str()).collect();
    let names: Vec<&str> = queues.iter().map(|(_, q)| q.as_str()).collect();
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM queue_rate_limits \
         WHERE (namespace, queue) IN (SELECT * FROM UNNEST($1::text[], $2::text[]))"
    ))
    .bind(&namespaces)
    .bind(&names)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(from_row)
        .collect::<Result<_, _>>()
        .map_err(StoreError::from)
}
