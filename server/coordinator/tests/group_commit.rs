//! Group commit (docs/decisions/0023-group-commit.md): StartRuns and
//! reports of different runs that arrive together share one transaction,
//! and each still gets its own answer, only after the commit. The window
//! here is long (200 ms) so that the calls of a test reliably meet in
//! groups; no assertion is on time.

use std::time::Duration;

use composer_coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorError, Reporter, StartRun, TaskReport,
};
use composer_store::{
    Store, StoreConfig,
    tasks::{self, TaskScope},
};
use serde_json::{Value as Json, json};
use tokio::task::JoinSet;
use uuid::Uuid;

const WORKFLOW: &str =
    "name: one\nnodes:\n  - { id: work, type: TASK, queue: grouped, task: work }\n";

async fn coordinator() -> Coordinator {
    let store = Store::connect(&StoreConfig {
        database_url: composer_testkit::fresh_database().await,
        max_connections: 8,
        connect_timeout: Duration::from_secs(10),
        query_timeout: Duration::from_secs(30),
    })
    .await
    .expect("connect");
    store.migrate().await.expect("migrate");
    let coordinator = Coordinator::new(
        store,
        CoordinatorConfig {
            group_commit_window: Duration::from_millis(200),
            ..CoordinatorConfig::default()
        },
    );
    coordinator
        .workflows()
        .register(coordinator.store(), "default", WORKFLOW)
        .await
        .expect("register");
    coordinator
}

fn start(input: Json, key: Option<&str>) -> StartRun {
    StartRun {
        namespace: "default".to_owned(),
        workflow_name: "one".to_owned(),
        version: None,
        input,
        idempotency_key: key.map(str::to_owned),
        labels: json!({}),
        actor: "test".to_owned(),
        traceparent: None,
        priority: 3,
    }
}

/// What one StartRun of the crowd was, and what it got.
#[derive(Debug)]
enum Started {
    Created(Uuid, Option<String>),
    Existing(Uuid, Option<String>),
    Failed(String),
}

/// Starts the runs at once; each caller, as soon as its answer comes,
/// reads its run back: an answer never comes before the commit.
async fn start_all(coordinator: &Coordinator, requests: Vec<StartRun>) -> Vec<Started> {
    let mut calls = JoinSet::new();
    for request in requests {
        let coordinator = coordinator.clone();
        calls.spawn(async move {
            let key = request.idempotency_key.clone();
            match coordinator.start_run(request).await {
                Ok((run, created)) => {
                    let seen = coordinator
                        .get_run(Some("default"), &run.id.to_string(), false)
                        .await
                        .expect("a started run is visible as soon as StartRun answers");
                    assert_eq!(seen.run.id, run.id);
                    if created {
                        Started::Created(run.id, key)
                    } else {
                        Started::Existing(run.id, key)
                    }
                }
                Err(error) => Started::Failed(error.to_string()),
            }
        });
    }
    let mut started = Vec::new();
    while let Some(joined) = calls.join_next().await {
        started.push(joined.expect("call"));
    }
    started
}

async fn count_runs(coordinator: &Coordinator) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(coordinator.store().pool())
        .await
        .expect("count")
}

#[tokio::test]
async fn many_starts_at_once_each_get_their_own_answer_and_a_failing_one_fails_alone() {
    let coordinator = coordinator().await;
    let mut requests: Vec<StartRun> = (0..30).map(|i| start(json!({ "n": i }), None)).collect();
    // the same key six times: one run, five callers told it exists
    requests.extend((0..6).map(|i| start(json!({ "n": 100 + i }), Some("same"))));
    requests.extend((0..3).map(|i| start(json!({ "n": 200 + i }), Some(&format!("own-{i}")))));
    // Postgres refuses a NUL in jsonb: this insert fails inside its group
    requests.push(start(json!({ "n": "nul\u{0}here" }), None));
    let started = start_all(&coordinator, requests).await;

    let created: Vec<&Started> = started
        .iter()
        .filter(|s| matches!(s, Started::Created(..)))
        .collect();
    let existing: Vec<&Started> = started
        .iter()
        .filter(|s| matches!(s, Started::Existing(..)))
        .collect();
    let failed: Vec<&Started> = started
        .iter()
        .filter(|s| matches!(s, Started::Failed(_)))
        .collect();
    assert_eq!(created.len(), 34, "{started:?}");
    assert_eq!(existing.len(), 5, "{started:?}");
    assert_eq!(failed.len(), 1, "only the NUL input fails: {started:?}");
    assert!(
        matches!(failed[0], Started::Failed(message) if message.starts_with("database error")),
        "{failed:?}"
    );
    let same_key: Vec<Uuid> = started
        .iter()
        .filter_map(|s| match s {
            Started::Created(id, Some(key)) | Started::Existing(id, Some(key)) if key == "same" => {
                Some(*id)
            }
            _ => None,
        })
        .collect();
    assert_eq!(same_key.len(), 6);
    assert!(
        same_key.iter().all(|id| *id == same_key[0]),
        "one key, one run"
    );
    assert_eq!(count_runs(&coordinator).await, 34);
    let stats = coordinator.group_commit_stats();
    assert!(
        stats.groups >= 1 && stats.items > stats.groups,
        "the starts met in groups: {stats:?}"
    );
}

#[tokio::test]
async fn a_report_whose_lease_was_lost_gets_lease_lost_while_its_group_applies() {
    let coordinator = coordinator().await;
    let requests = (0..20).map(|i| start(json!({ "n": i }), None)).collect();
    let started = start_all(&coordinator, requests).await;
    assert_eq!(started.len(), 20);

    let candidates: Vec<(Uuid, i32)> =
        sqlx::query_as("SELECT id, attempt FROM tasks WHERE status = 'DISPATCHED'")
            .fetch_all(coordinator.store().pool())
            .await
            .expect("tasks");
    assert_eq!(candidates.len(), 20);
    let leased = tasks::lease_tasks(
        coordinator.store().pool(),
        &candidates,
        "worker-1",
        "default",
        "grouped",
        None,
    )
    .await
    .expect("lease");
    assert_eq!(leased.len(), 20);
    coordinator.remember_leases(&leased);
    let before = coordinator.group_commit_stats();

    let stale = leased[7].id;
    let mut reports = JoinSet::new();
    for task in &leased {
        let coordinator = coordinator.clone();
        let (task_id, run_id, attempt) = (task.id, task.run_id, task.attempt);
        // one report names a lease that is not (or no longer) the task's
        let token = if task_id == stale {
            Uuid::new_v4()
        } else {
            task.lease_token
        };
        reports.spawn(async move {
            let scope = TaskScope {
                namespace: "default".to_owned(),
                queues: None,
            };
            let answer = coordinator
                .report(
                    &scope,
                    &task_id.to_string(),
                    attempt,
                    &token.to_string(),
                    TaskReport::Completed {
                        output: json!({ "done": true }),
                    },
                    Reporter {
                        actor: "worker:w",
                        traceparent: None,
                    },
                )
                .await;
            // answered after the commit: the run shows the report at once
            let status = coordinator
                .get_run(Some("default"), &run_id.to_string(), false)
                .await
                .expect("run")
                .run
                .status;
            (task_id, answer, status)
        });
    }
    while let Some(joined) = reports.join_next().await {
        let (task_id, answer, status) = joined.expect("report");
        if task_id == stale {
            assert!(
                matches!(answer, Err(CoordinatorError::LeaseLost { .. })),
                "{answer:?}"
            );
            assert_eq!(status, "RUNNING");
        } else {
            assert!(answer.is_ok(), "{answer:?}");
            assert_eq!(status, "COMPLETED");
        }
    }
    let after = coordinator.group_commit_stats();
    assert!(
        after.groups > before.groups && after.items - before.items > after.groups - before.groups,
        "the reports met in groups: {before:?} → {after:?}"
    );
}
