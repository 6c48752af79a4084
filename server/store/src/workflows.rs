//! Workflow definitions: immutable versions per (namespace, name).

use chrono::{DateTime, Utc};
use serde_json::Value as Json;
use sqlx::{PgConnection, PgPool, Row, postgres::PgRow};

use crate::StoreError;

/// One stored version of a workflow.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowRow {
    /// The namespace it belongs to.
    pub namespace: String,
    /// The workflow's name.
    pub name: String,
    /// The version, from 1.
    pub version: i32,
    /// The definition's description.
    pub description: String,
    /// The text as registered.
    pub source: String,
    /// The parsed definition as JSON.
    pub definition: Json,
    /// Hex SHA-256 of the canonical definition.
    pub content_hash: String,
    /// When it was registered.
    pub created_at: DateTime<Utc>,
}

/// A version to register.
#[derive(Debug, Clone)]
pub struct NewWorkflow<'a> {
    /// The namespace it belongs to.
    pub namespace: &'a str,
    /// The workflow's name.
    pub name: &'a str,
    /// The definition's description.
    pub description: &'a str,
    /// The text as registered.
    pub source: &'a str,
    /// The parsed definition as JSON.
    pub definition: &'a Json,
    /// Hex SHA-256 of the canonical definition.
    pub content_hash: &'a str,
}

fn workflow_from_row(row: &PgRow) -> Result<WorkflowRow, sqlx::Error> {
    Ok(WorkflowRow {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        version: row.try_get("version")?,
        description: row.try_get("description")?,
        source: row.try_get("source")?,
        definition: row.try_get("definition")?,
        content_hash: row.try_get("content_hash")?,
        created_at: row.try_get("created_at")?,
    })
}

const WORKFLOW_COLUMNS: &str =
    "namespace, name, version, description, source, definition, content_hash, created_at";

/// Registers a version: returns the latest version unchanged when its
/// content hash is the same (`false`), else inserts the next version
/// (`true`). Concurrent registrations of one name are serialised by a
/// transaction-scoped advisory lock on (namespace, name).
pub async fn register_workflow(
    pool: &PgPool,
    new: NewWorkflow<'_>,
) -> Result<(WorkflowRow, bool), StoreError> {
    let mut tx = pool.begin().await?;
    // lock_workflow_name: one registration per (namespace, name) at a time
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))")
        .bind(new.namespace)
        .bind(new.name)
        .execute(&mut *tx)
        .await?;
    if let Some(latest) = latest_version(&mut tx, new.namespace, new.name).await?
        && latest.content_hash == new.content_hash
    {
        tx.commit().await?;
        return Ok((latest, false));
    }
    // insert_workflow_version: the next version number under the lock
    let row = sqlx::query(&format!(
        "INSERT INTO workflow_definitions \
           (namespace, name, version, description, source, definition, content_hash) \
         SELECT $1, $2, COALESCE(MAX(version), 0) + 1, $3, $4, $5, $6 \
           FROM workflow_definitions WHERE namespace = $1 AND name = $2 \
         RETURNING {WORKFLOW_COLUMNS}"
    ))
    .bind(new.namespace)
    .bind(new.name)
    .bind(new.description)
    .bind(new.source)
    .bind(new.definition)
    .bind(new.content_hash)
    .fetch_one(&mut *tx)
    .await?;
    let created = workflow_from_row(&row)?;
    tx.commit().await?;
    Ok((created, true))
}

async fn latest_version(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
) -> Result<Option<WorkflowRow>, StoreError> {
    // latest_workflow_version: the highest version of one name (primary key)
    let row = sqlx::query(&format!(
        "SELECT {WORKFLOW_COLUMNS} FROM workflow_definitions \
         WHERE namespace = $1 AND name = $2 ORDER BY version DESC LIMIT 1"
    ))
    .bind(namespace)
    .bind(name)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.as_ref().map(workflow_from_row).transpose()?)
}

/// One version of a workflow; the latest when `version` is `None`. Takes a
/// connection, not the pool: a caller inside a transaction reads on it
/// instead of waiting for a second connection (under a burst, every
/// connection of the pool could be waiting for another).
pub async fn get_workflow(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
    version: Option<i32>,
) -> Result<Option<WorkflowRow>, StoreError> {
    let Some(version) = version else {
        return latest_version(conn, namespace, name).await;
    };
    // get_workflow_version: one version by primary key
    let row = sqlx::query(&format!(
        "SELECT {WORKFLOW_COLUMNS} FROM workflow_definitions \
         WHERE namespace = $1 AND name = $2 AND version = $3"
    ))
    .bind(namespace)
    .bind(name)
    .bind(version)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.as_ref().map(workflow_from_row).transpose()?)
}

/// Workflow names after `after_name` (exclusive), by name, each with its
/// latest version; at most `limit`.
pub async fn list_workflows(
    pool: &PgPool,
    namespace: &str,
    name_prefix: &str,
    after_name: &str,
    limit: i64,
) -> Result<Vec<WorkflowRow>, StoreError> {
    // list_latest_workflows: keyset page over the primary key, latest per name
    let rows = sqlx::query(&format!(
        "SELECT DISTINCT ON (name) {WORKFLOW_COLUMNS} FROM workflow_definitions \
         WHERE namespace = $1 AND name > $2 AND starts_with(name, $3) \
         ORDER BY name, version DESC LIMIT $4"
    ))
    .bind(namespace)
    .bind(after_name)
    .bind(name_prefix)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(workflow_from_row)
        .collect::<Result<_, _>>()?)
}

/// Versions of one workflow below `before_version` (exclusive), newest
/// first; at most `limit`.
pub async fn list_workflow_versions(
    pool: &PgPool,
    namespace: &str,
    name: &str,
    before_version: i32,
    limit: i64,
) -> Result<Vec<WorkflowRow>, StoreError> {
    // list_workflow_versions: keyset page over the primary key, newest first
    let rows = sqlx::query(&format!(
        "SELECT {WORKFLOW_COLUMNS} FROM workflow_definitions \
         WHERE namespace = $1 AND name = $2 AND version < $3 \
         ORDER BY version DESC LIMIT $4"
    ))
    .bind(namespace)
    .bind(name)
    .bind(before_version)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(workflow_from_row)
        .collect::<Result<_, _>>()?)
}

/// Every namespace that has registered a workflow (the HTTP worker serves
/// their `_http` queues).
pub async fn namespaces(pool: &PgPool) -> Result<Vec<String>, StoreError> {
    // namespaces: a loose index scan would do; the table is small
    Ok(
        sqlx::query_scalar("SELECT DISTINCT namespace FROM workflow_definitions ORDER BY 1")
            .fetch_all(pool)
            .await?,
    )
}
