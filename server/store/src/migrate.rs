//! Moving a run to another version of its workflow (MigrateRuns, decision
//! 0043). Called inside the event transaction that holds the run's lock,
//! after the engine found the target able to continue the run.

use serde_json::Value as Json;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::StoreError;

/// One run's move, as the coordinator computed it.
#[derive(Debug, Clone)]
pub struct RunMove<'a> {
    /// The run (locked by the caller).
    pub run_id: Uuid,
    /// The version it goes on under.
    pub to_version: i32,
    /// Its engine record, naming the new version and the new node ids.
    pub record: &'a Json,
    /// Node rows renamed: old key, new key, the state under its new name.
    pub renamed_nodes: &'a [(String, String, Json)],
    /// Node ids renamed, old then new: the run's tasks (a MAP's elements
    /// too) and its child runs' `parent_node` follow. Only nodes with no
    /// work in flight are renamed (the caller checks), so no task, timer or
    /// wait that a server may be holding names an old id.
    pub renamed_ids: &'a [(String, String)],
}

/// Writes a run's move: its version and record, its renamed node rows,
/// tasks and children.
pub async fn move_run(conn: &mut PgConnection, change: &RunMove<'_>) -> Result<(), StoreError> {
    // move_run_row: primary key; the run's lock is already held
    sqlx::query(
        "UPDATE runs SET workflow_version = $2, record = $3, updated_at = now() WHERE id = $1",
    )
    .bind(change.run_id)
    .bind(change.to_version)
    .bind(change.record)
    .execute(&mut *conn)
    .await?;
    // move_run_tasks: the run's tasks through tasks' unique (run_id,
    // node_key); a lease and its token are left as they are
    sqlx::query(
        "UPDATE tasks SET workflow_version = $2 WHERE run_id = $1 AND workflow_version <> $2",
    )
    .bind(change.run_id)
    .bind(change.to_version)
    .execute(&mut *conn)
    .await?;
    if !change.renamed_nodes.is_empty() {
        rename_nodes(conn, change.run_id, change.renamed_nodes).await?;
    }
    if !change.renamed_ids.is_empty() {
        rename_task_and_child_nodes(conn, change.run_id, change.renamed_ids).await?;
    }
    Ok(())
}

async fn rename_nodes(
    conn: &mut PgConnection,
    run_id: Uuid,
    renamed: &[(String, String, Json)],
) -> Result<(), StoreError> {
    // rename_run_nodes: run_nodes' primary key per pair; the new keys are
    // ids the run's own definition does not have, so none exists yet
    sqlx::query(
        "UPDATE run_nodes n SET node_key = m.new_key, state = m.state, updated_at = now() \
         FROM UNNEST($2::text[], $3::text[], $4::jsonb[]) AS m(old_key, new_key, state) \
         WHERE n.run_id = $1 AND n.node_key = m.old_key",
    )
    .bind(run_id)
    .bind(renamed.iter().map(|r| r.0.as_str()).collect::<Vec<_>>())
    .bind(renamed.iter().map(|r| r.1.as_str()).collect::<Vec<_>>())
    .bind(renamed.iter().map(|r| r.2.clone()).collect::<Vec<_>>())
    .execute(conn)
    .await?;
    Ok(())
}

async fn rename_task_and_child_nodes(
    conn: &mut PgConnection,
    run_id: Uuid,
    renamed: &[(String, String)],
) -> Result<(), StoreError> {
    let old: Vec<&str> = renamed.iter().map(|r| r.0.as_str()).collect();
    let new: Vec<&str> = renamed.iter().map(|r| r.1.as_str()).collect();
    // rename_task_nodes: the run's tasks (unique (run_id, node_key)); a
    // key is the node id, or the id and a MAP element's `[index]`
    sqlx::query(
        "UPDATE tasks t SET node_key = m.new_id || substr(t.node_key, length(m.old_id) + 1) \
         FROM UNNEST($2::text[], $3::text[]) AS m(old_id, new_id) \
         WHERE t.run_id = $1 \
           AND (t.node_key = m.old_id OR left(t.node_key, length(m.old_id) + 1) = m.old_id || '[')",
    )
    .bind(run_id)
    .bind(&old)
    .bind(&new)
    .execute(&mut *conn)
    .await?;
    // rename_child_parent_nodes: runs_by_parent; children in flight are
    // never renamed (the caller checks), so this locks only ended ones
    sqlx::query(
        "UPDATE runs c SET parent_node = m.new_id || substr(c.parent_node, length(m.old_id) + 1) \
         FROM UNNEST($2::text[], $3::text[]) AS m(old_id, new_id) \
         WHERE c.parent_run_id = $1 \
           AND (c.parent_node = m.old_id \
             OR left(c.parent_node, length(m.old_id) + 1) = m.old_id || '[')",
    )
    .bind(run_id)
    .bind(&old)
    .bind(&new)
    .execute(conn)
    .await?;
    Ok(())
}

/// Whether events for the run wait in its inbox (a child's end, say): a
/// run is moved only once they are applied, as they may name old ids.
pub async fn has_inbox_events(conn: &mut PgConnection, run_id: Uuid) -> Result<bool, StoreError> {
    // run_has_inbox_events: run_inbox_by_run
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM run_inbox WHERE run_id = $1)")
            .bind(run_id)
            .fetch_one(conn)
            .await?,
    )
}
