//! What the coordinator's integration tests share: a migrated store on a
//! fresh database, a StartRun request, a bare run row, and what a run left
//! in the tables.

use std::time::Duration;

use composer_coordinator::{Coordinator, CoordinatorConfig, StartRun};
use composer_store::{Store, StoreConfig};
use serde_json::{Value as Json, json};
use uuid::Uuid;

/// A workflow whose runs wait for an event that never comes.
pub const WAITS: &str = "name: waits\nnodes:\n  - { id: a, type: WAIT_FOR_EVENT, event: never }\n";

/// A coordinator on a fresh store (four connections) with `source`
/// registered in the default namespace.
pub async fn coordinator_with(source: &str) -> Coordinator {
    let coordinator = Coordinator::new(fresh_store(4).await, CoordinatorConfig::default());
    coordinator
        .workflows()
        .register(coordinator.store(), "default", source)
        .await
        .expect("register");
    coordinator
}

/// How many runs of the default namespace ListRuns finds with `filter`
/// (up to 100).
pub async fn listed(coordinator: &Coordinator, filter: composer_store::runs::RunFilter) -> usize {
    coordinator
        .list_runs("default", &filter, None, 100)
        .await
        .expect("list")
        .len()
}

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

/// What a run left in every table a write touches, without ids and times.
pub async fn run_snapshot(pool: &sqlx::PgPool, run_id: Uuid) -> String {
    let run: (String, i64, bool, Option<Json>) = sqlx::query_as(
        "SELECT status, history_seq, ended_at IS NOT NULL, error FROM runs WHERE id = $1",
    )
    .bind(run_id)
    .fetch_one(pool)
    .await
    .expect("run");
    let nodes: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT node_key, status, ended_at IS NOT NULL FROM run_nodes WHERE run_id = $1 \
         ORDER BY node_key",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await
    .expect("nodes");
    let history: Vec<(i64, String, Option<String>, Option<i32>)> = sqlx::query_as(
        "SELECT seq, event_type, node_key, attempt FROM run_events_each WHERE run_id = $1 ORDER BY seq",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await
    .expect("history");
    let tasks: Vec<(String, String, i32, Option<String>)> = sqlx::query_as(
        "SELECT node_key, status, attempt, outcome FROM tasks WHERE run_id = $1 ORDER BY node_key",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await
    .expect("tasks");
    let timers: Vec<(String, bool)> =
        sqlx::query_as("SELECT timer_key, held FROM timers WHERE run_id = $1 ORDER BY timer_key")
            .bind(run_id)
            .fetch_all(pool)
            .await
            .expect("timers");
    format!("{run:?}\n{nodes:?}\n{history:?}\n{tasks:?}\n{timers:?}")
}
