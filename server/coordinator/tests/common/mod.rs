//! What the coordinator's integration tests share: a migrated store on a
//! fresh database, a StartRun request, and a bare run row.

use std::time::Duration;

use composer_coordinator::StartRun;
use composer_store::{Store, StoreConfig};
use serde_json::{Value as Json, json};
use uuid::Uuid;

/// A store on a database of its own, migrated.
pub async fn fresh_store(max_connections: u32) -> Store {
    let store = Store::connect(&StoreConfig {
        database_url: composer_testkit::fresh_database().await,
        max_connections,
        connect_timeout: Duration::from_secs(10),
        query_timeout: Duration::from_secs(30),
    })
    .await
    .expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// A StartRun of `workflow` in the default namespace, no key, no labels.
pub fn start_request(workflow: &str, input: Json) -> StartRun {
    StartRun {
        namespace: "default".to_owned(),
        workflow_name: workflow.to_owned(),
        version: None,
        input,
        idempotency_key: None,
        labels: json!({}),
        actor: "test".to_owned(),
        traceparent: None,
        priority: 3,
    }
}

/// A RUNNING run row of workflow `wf` version 1 in the default namespace,
/// for tests that write task rows directly; returns its id.
pub async fn insert_run(pool: &sqlx::PgPool) -> Uuid {
    let run_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO runs (id, namespace, workflow_name, workflow_version, status, input, record) \
         VALUES ($1, 'default', 'wf', 1, 'RUNNING', '{}', '{}')",
    )
    .bind(run_id)
    .execute(pool)
    .await
    .expect("run");
    run_id
}
