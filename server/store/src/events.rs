//! External events (waits and pending events), the run inbox, and request
//! idempotency keys.

use serde_json::Value as Json;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::StoreError;

/// Records that a node waits for an event.
pub async fn insert_wait(
    conn: &mut PgConnection,
    run_id: Uuid,
    node_key: &str,
    namespace: &str,
    event_name: &str,
    correlation_key: Option<&str>,
) -> Result<(), StoreError> {
    // insert_wait: one row per waiting node
    sqlx::query(
        "INSERT INTO event_waits (run_id, node_key, namespace, event_name, correlation_key) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (run_id, node_key) DO UPDATE \
         SET event_name = EXCLUDED.event_name, correlation_key = EXCLUDED.correlation_key",
    )
    .bind(run_id)
    .bind(node_key)
    .bind(namespace)
    .bind(event_name)
    .bind(correlation_key)
    .execute(conn)
    .await?;
    Ok(())
}

/// The node of a run waiting for `event_name`, if any; removes the wait.
pub async fn take_wait(
    conn: &mut PgConnection,
    run_id: Uuid,
    event_name: &str,
    correlation_key: Option<&str>,
) -> Result<Option<String>, StoreError> {
    // take_wait: the oldest wait of the run for this event (and key)
    Ok(sqlx::query_scalar(
        "DELETE FROM event_waits WHERE (run_id, node_key) = ( \
           SELECT run_id, node_key FROM event_waits WHERE run_id = $1 AND event_name = $2 \
             AND ($3::text IS NULL OR correlation_key = $3) \
           ORDER BY created_at LIMIT 1) RETURNING node_key",
    )
    .bind(run_id)
    .bind(event_name)
    .bind(correlation_key)
    .fetch_optional(conn)
    .await?)
}

/// Removes a node's wait (it timed out or the run ended).
pub async fn delete_waits(
    conn: &mut PgConnection,
    run_id: Uuid,
    node_key: Option<&str>,
) -> Result<(), StoreError> {
    // delete_waits: one node's wait, or all of the run's
    sqlx::query(
        "DELETE FROM event_waits WHERE run_id = $1 AND ($2::text IS NULL OR node_key = $2)",
    )
    .bind(run_id)
    .bind(node_key)
    .execute(conn)
    .await?;
    Ok(())
}

/// Runs waiting for an event on a correlation key.
pub async fn runs_waiting_on(
    pool: &PgPool,
    namespace: &str,
    correlation_key: &str,
    event_name: &str,
) -> Result<Vec<Uuid>, StoreError> {
    // runs_waiting_on: served by event_waits_by_correlation
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT run_id FROM event_waits \
         WHERE namespace = $1 AND correlation_key = $2 AND event_name = $3",
    )
    .bind(namespace)
    .bind(correlation_key)
    .bind(event_name)
    .fetch_all(pool)
    .await?)
}

/// Keeps an event for a wait not reached yet.
pub async fn store_pending(
    conn: &mut PgConnection,
    namespace: &str,
    run_id: Option<Uuid>,
    correlation_key: Option<&str>,
    event_name: &str,
    payload: &Json,
    retention_secs: Option<f64>,
) -> Result<(), StoreError> {
    // store_pending: to a run (kept until consumed or the run ends) or to a
    // correlation key (kept for the retention)
    sqlx::query(
        "INSERT INTO pending_events (namespace, run_id, correlation_key, event_name, payload, expires_at) \
         VALUES ($1, $2, $3, $4, $5, CASE WHEN $6::float8 IS NULL THEN NULL \
           ELSE now() + make_interval(secs => $6) END)",
    )
    .bind(namespace)
    .bind(run_id)
    .bind(correlation_key)
    .bind(event_name)
    .bind(payload)
    .bind(retention_secs)
    .execute(conn)
    .await?;
    Ok(())
}

/// Takes the oldest pending event for a run (or, with a correlation key,
/// for that key), deleting it. Skips rows another transaction holds.
pub async fn take_pending(
    conn: &mut PgConnection,
    namespace: &str,
    run_id: Uuid,
    correlation_key: Option<&str>,
    event_name: &str,
) -> Result<Option<Json>, StoreError> {
    // take_pending: one event, first in first out
    Ok(sqlx::query_scalar(
        "DELETE FROM pending_events WHERE id = ( \
           SELECT id FROM pending_events WHERE namespace = $1 AND event_name = $4 \
             AND ((run_id = $2) OR ($3::text IS NOT NULL AND correlation_key = $3 \
                  AND (expires_at IS NULL OR expires_at > now()))) \
           ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) \
         RETURNING payload",
    )
    .bind(namespace)
    .bind(run_id)
    .bind(correlation_key)
    .bind(event_name)
    .fetch_optional(conn)
    .await?)
}

/// Writes an event for another run, applied in that run's own transaction.
pub async fn push_inbox(
    conn: &mut PgConnection,
    run_id: Uuid,
    event: &Json,
    actor: &str,
) -> Result<(), StoreError> {
    // push_inbox: durable hand-off between runs
    sqlx::query("INSERT INTO run_inbox (run_id, event, actor) VALUES ($1, $2, $3)")
        .bind(run_id)
        .bind(event)
        .bind(actor)
        .execute(conn)
        .await?;
    Ok(())
}

/// Takes a run's inbox, oldest first; under the run lock.
pub async fn take_inbox(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Vec<(Json, String)>, StoreError> {
    // take_inbox: every message of the run, deleted in its transaction
    let rows = sqlx::query("DELETE FROM run_inbox WHERE run_id = $1 RETURNING id, event, actor")
        .bind(run_id)
        .fetch_all(conn)
        .await?;
    let mut messages = rows
        .iter()
        .map(|row| {
            Ok((
                row.try_get::<i64, _>("id")?,
                row.try_get::<Json, _>("event")?,
                row.try_get::<String, _>("actor")?,
            ))
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    messages.sort_by_key(|m| m.0);
    Ok(messages.into_iter().map(|(_, e, a)| (e, a)).collect())
}

/// Runs with inbox messages (recovery: a hand-off whose apply was lost).
pub async fn runs_with_inbox(pool: &PgPool, limit: i64) -> Result<Vec<Uuid>, StoreError> {
    // runs_with_inbox: served by run_inbox_by_run
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT run_id FROM (SELECT run_id FROM run_inbox ORDER BY id LIMIT $1) t",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// The result recorded for a request id, if any.
pub async fn idempotent_result(
    conn: &mut PgConnection,
    namespace: &str,
    scope: &str,
    key: &str,
) -> Result<Option<Json>, StoreError> {
    // idempotent_result: primary key lookup
    Ok(sqlx::query_scalar(
        "SELECT result FROM idempotency_keys WHERE namespace = $1 AND scope = $2 AND key = $3",
    )
    .bind(namespace)
    .bind(scope)
    .bind(key)
    .fetch_optional(conn)
    .await?)
}

/// Records a request id's result; `false` if it was recorded already.
pub async fn record_idempotent_result(
    conn: &mut PgConnection,
    namespace: &str,
    scope: &str,
    key: &str,
    result: &Json,
) -> Result<bool, StoreError> {
    // record_idempotent_result: first writer wins
    Ok(sqlx::query(
        "INSERT INTO idempotency_keys (namespace, scope, key, result) VALUES ($1, $2, $3, $4) \
         ON CONFLICT DO NOTHING",
    )
    .bind(namespace)
    .bind(scope)
    .bind(key)
    .bind(result)
    .execute(conn)
    .await?
    .rows_affected()
        == 1)
}
