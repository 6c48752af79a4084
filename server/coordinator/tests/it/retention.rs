//! Retention against the real Postgres: finished runs go with everything
//! that hangs off them; old history partitions are dropped whole.

use crate::common;

use std::time::Duration;

use composer_coordinator::{Coordinator, CoordinatorConfig, StartRun};
use serde_json::json;

async fn coordinator() -> Coordinator {
    Coordinator::new(common::fresh_store(4).await, CoordinatorConfig::default())
}

fn start(workflow: &str) -> StartRun {
    common::start_request(workflow, json!({}))
}

async fn count(coordinator: &Coordinator, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(coordinator.store().pool())
        .await
        .expect(sql)
}

#[tokio::test]
async fn retention_deletes_finished_runs_and_drops_old_history_partitions_only() {
    let coordinator = coordinator().await;
    coordinator
        .workflows()
        .register(
            coordinator.store(),
            "default",
            "name: idle\nnodes:\n  - { id: wait, type: WAIT_FOR_EVENT, event: go }\n",
        )
        .await
        .expect("register");
    // a task's row, whose run has no foreign key to take it along
    coordinator
        .workflows()
        .register(
            coordinator.store(),
            "default",
            "name: work\nnodes:\n  - { id: step, type: TASK, queue: q, task: t }\n",
        )
        .await
        .expect("register");
    let (finished, _) = coordinator.start_run(start("work")).await.expect("start");
    coordinator
        .cancel_run(None, &finished.id.to_string(), "done", "test")
        .await
        .expect("cancel");
    let task_rows = format!(
        "SELECT count(*) FROM tasks WHERE run_id = '{}'",
        finished.id
    );
    assert_eq!(count(&coordinator, &task_rows).await, 1, "the task's row");
    let (running, _) = coordinator.start_run(start("idle")).await.expect("start");
    sqlx::query(
        "CREATE TABLE run_events_20200101 PARTITION OF run_events \
         FOR VALUES FROM ('2020-01-01 00:00+00') TO ('2020-01-02 00:00+00')",
    )
    .execute(coordinator.store().pool())
    .await
    .expect("an old partition");

    let (runs, partitions) = coordinator
        .apply_retention(Duration::ZERO, 10)
        .await
        .expect("retention");

    assert_eq!((runs, partitions), (1, 1));
    let ids = format!("'{}'", finished.id);
    assert_eq!(
        count(
            &coordinator,
            &format!("SELECT count(*) FROM runs WHERE id = {ids}")
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &coordinator,
            &format!("SELECT count(*) FROM run_events WHERE run_id = {ids}")
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &coordinator,
            &format!("SELECT count(*) FROM run_nodes WHERE run_id = {ids}")
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &coordinator,
            &format!("SELECT count(*) FROM tasks WHERE run_id = {ids}")
        )
        .await,
        0
    );
    let live = format!("'{}'", running.id);
    assert_eq!(
        count(
            &coordinator,
            &format!("SELECT count(*) FROM runs WHERE id = {live}")
        )
        .await,
        1
    );
    assert!(
        count(
            &coordinator,
            &format!("SELECT count(*) FROM run_events WHERE run_id = {live}")
        )
        .await
            > 0
    );
    assert_eq!(
        count(
            &coordinator,
            "SELECT count(*) FROM pg_class WHERE relname = 'run_events_20200101'"
        )
        .await,
        0,
        "the old partition is gone"
    );
    let today = chrono::Utc::now().format("run_events_%Y%m%d").to_string();
    assert_eq!(
        count(
            &coordinator,
            &format!("SELECT count(*) FROM pg_class WHERE relname = '{today}'")
        )
        .await,
        1,
        "today's partition stays"
    );
}
