//! Group commit (docs/decisions/0023-group-commit.md): StartRuns and
//! reports of different runs that arrive together share one transaction,
//! and each still gets its own answer, only after the commit. The window
//! here is long (200 ms) so that the calls of a test reliably meet in
//! groups; no assertion is on time.

use std::time::Duration;

use crate::common;

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
    coordinator_with(Duration::from_millis(200)).await
}

/// A coordinator whose groups gather for `window` (zero: group commit off).
async fn coordinator_with(window: Duration) -> Coordinator {
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
            group_commit_window: window,
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

/// Registers `definition` (named `name`) and starts `count` runs of it at
/// once, with inputs `{"n": 0}` and up.
async fn register_and_start(
    coordinator: &Coordinator,
    definition: &str,
    name: &str,
    count: i64,
) -> Vec<Started> {
    coordinator
        .workflows()
        .register(coordinator.store(), "default", definition)
        .await
        .expect("register");
    let requests = (0..count)
        .map(|i| StartRun {
            workflow_name: name.to_owned(),
            ..start(json!({ "n": i }), None)
        })
        .collect();
    start_all(coordinator, requests).await
}

/// The runs the StartRuns with idempotency key `key` got, created or found.
fn runs_of_key(started: &[Started], key: &str) -> Vec<Uuid> {
    started
        .iter()
        .filter_map(|s| match s {
            Started::Created(id, Some(k)) | Started::Existing(id, Some(k)) if k == key => Some(*id),
            _ => None,
        })
        .collect()
}

async fn count_runs(coordinator: &Coordinator) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(coordinator.store().pool())
        .await
        .expect("count")
}

/// Leases every dispatched task to this server's worker, as a poll would;
/// there must be `expected` of them.
async fn lease_all(coordinator: &Coordinator, expected: usize) -> Vec<tasks::LeasedTask> {
    lease_all_of(coordinator, "grouped", expected).await
}

async fn lease_all_of(
    coordinator: &Coordinator,
    queue: &str,
    expected: usize,
) -> Vec<tasks::LeasedTask> {
    let candidates: Vec<(Uuid, i32)> =
        sqlx::query_as("SELECT id, attempt FROM tasks WHERE status = 'DISPATCHED'")
            .fetch_all(coordinator.store().pool())
            .await
            .expect("tasks");
    assert_eq!(candidates.len(), expected);
    let leased = tasks::lease_tasks(
        coordinator.store().pool(),
        &candidates,
        "worker-1",
        "default",
        queue,
        None,
    )
    .await
    .expect("lease");
    assert_eq!(leased.len(), expected);
    coordinator.remember_leases(&leased);
    leased
}

/// One report, as worker `w` of the default namespace sends it.
async fn report_as_worker(
    coordinator: &Coordinator,
    task_id: Uuid,
    attempt: i32,
    lease_token: Uuid,
    report: TaskReport,
) -> Result<(), CoordinatorError> {
    let scope = TaskScope {
        namespace: "default".to_owned(),
        queues: None,
    };
    let reporter = Reporter {
        actor: "worker:w",
        traceparent: None,
        answer_sent: None,
    };
    coordinator
        .report(
            &scope,
            &task_id.to_string(),
            attempt,
            &lease_token.to_string(),
            report,
            reporter,
        )
        .await
}

/// Sends every report at once, as many workers would; the answers by
/// task.
async fn report_all(
    coordinator: &Coordinator,
    reports: Vec<(tasks::LeasedTask, TaskReport)>,
) -> std::collections::HashMap<Uuid, Result<(), CoordinatorError>> {
    let mut calls = JoinSet::new();
    for (task, report) in reports {
        let coordinator = coordinator.clone();
        calls.spawn(async move {
            let answer = report_as_worker(
                &coordinator,
                task.id,
                task.attempt,
                task.lease_token,
                report,
            )
            .await;
            (task.id, answer)
        });
    }
    let mut answers = std::collections::HashMap::new();
    while let Some(joined) = calls.join_next().await {
        let (task_id, answer) = joined.expect("report");
        answers.insert(task_id, answer);
    }
    answers
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
    let same_key = runs_of_key(&started, "same");
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

/// StartRuns of one group insert their runs in one statement (decision
/// 0026); one idempotency key there still makes one run, the first.
#[tokio::test]
async fn starts_inserted_together_keep_one_run_per_key() {
    let coordinator = coordinator().await;
    let mut requests: Vec<StartRun> = (0..12).map(|i| start(json!({ "n": i }), None)).collect();
    requests.extend((0..6).map(|i| start(json!({ "n": 100 + i }), Some("one-key"))));
    let started = start_all(&coordinator, requests).await;
    let created = started
        .iter()
        .filter(|s| matches!(s, Started::Created(..)))
        .count();
    let keyed = runs_of_key(&started, "one-key");
    assert_eq!(created, 13, "{started:?}");
    assert_eq!(keyed.len(), 6);
    assert!(keyed.iter().all(|id| *id == keyed[0]), "{started:?}");
    assert_eq!(count_runs(&coordinator).await, 13);
    let stats = coordinator.group_commit_stats();
    assert!(stats.shared_writes >= 2, "inserted together: {stats:?}");
}

#[tokio::test]
async fn a_report_whose_lease_was_lost_gets_lease_lost_while_its_group_applies() {
    let coordinator = coordinator().await;
    let requests = (0..20).map(|i| start(json!({ "n": i }), None)).collect();
    let started = start_all(&coordinator, requests).await;
    assert_eq!(started.len(), 20);

    let leased = lease_all(&coordinator, 20).await;
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
            let done = TaskReport::Completed {
                output: json!({ "done": true }),
            };
            let answer = report_as_worker(&coordinator, task_id, attempt, token, done).await;
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

const TWO_BRANCHES: &str = r#"
name: two
nodes:
  - { id: start, type: FORK }
  - { id: left, type: TASK, queue: grouped, task: left }
  - { id: right, type: TASK, queue: grouped, task: right }
  - { id: both, type: JOIN }
edges:
  - { from: start, to: left }
  - { from: start, to: right }
  - { from: left, to: both }
  - { from: right, to: both }
output: "${nodes.both.output}"
"#;

/// A group locks all its runs in one statement. Two callers whose scopes
/// differ report on one run through two batches, which can meet in one
/// group: the second must see what the first wrote, or the JOIN would
/// never hear of one branch and the run would not complete.
#[tokio::test]
async fn two_batches_of_one_run_in_a_group_each_see_the_other() {
    let coordinator = coordinator().await;
    let started = register_and_start(&coordinator, TWO_BRANCHES, "two", 30).await;
    assert!(started.iter().all(|s| matches!(s, Started::Created(..))));

    let leased = lease_all(&coordinator, 60).await;
    let before = coordinator.group_commit_stats();

    let mut reports = JoinSet::new();
    for task in &leased {
        let coordinator = coordinator.clone();
        let (task_id, attempt, token) = (task.id, task.attempt, task.lease_token);
        // the left branch's worker may touch any queue, the right's only
        // this one: two scopes, so two report queues of one run
        let queues = (task.node_key == "right").then(|| vec!["grouped".to_owned()]);
        let output = json!({ "node": task.node_key });
        reports.spawn(async move {
            let scope = TaskScope {
                namespace: "default".to_owned(),
                queues,
            };
            coordinator
                .report(
                    &scope,
                    &task_id.to_string(),
                    attempt,
                    &token.to_string(),
                    TaskReport::Completed { output },
                    Reporter {
                        actor: "worker:w",
                        traceparent: None,
                        answer_sent: None,
                    },
                )
                .await
        });
    }
    while let Some(joined) = reports.join_next().await {
        let answer = joined.expect("report");
        assert!(answer.is_ok(), "{answer:?}");
    }
    for started in &started {
        let Started::Created(run_id, _) = started else {
            unreachable!("every start created its run");
        };
        let run = coordinator
            .get_run(Some("default"), &run_id.to_string(), false)
            .await
            .expect("run")
            .run;
        assert_eq!(run.status, "COMPLETED", "{run_id}");
        assert_eq!(
            run.output,
            Some(json!({ "left": { "node": "left" }, "right": { "node": "right" } })),
            "{run_id}"
        );
    }
    let after = coordinator.group_commit_stats();
    assert!(
        after.items - before.items > after.groups - before.groups,
        "the reports met in groups: {before:?} → {after:?}"
    );
}

const MIXED: &str = r#"
name: mixed
nodes:
  - { id: start, type: FORK }
  - { id: left, type: TASK, queue: mixed, task: left, retry: { max_attempts: 2, initial_interval: 1h } }
  - { id: right, type: TASK, queue: mixed, task: right, timeout: 1h }
  - { id: both, type: JOIN }
edges:
  - { from: start, to: left }
  - { from: start, to: right }
  - { from: left, to: both }
  - { from: right, to: both }
"#;

/// Runs of `mixed` met by reports all at once: half see their left task
/// fail for a retry (a timer is scheduled) and their right one complete
/// (its attempt timeout's timer goes); the other half see their left task
/// fail for good, so the run fails, its live right task is cancelled and
/// its timers go. Returns each run's snapshot by its input.
async fn mixed_reports(coordinator: &Coordinator) -> std::collections::BTreeMap<i64, String> {
    let started = register_and_start(coordinator, MIXED, "mixed", 24).await;
    assert!(
        started.iter().all(|s| matches!(s, Started::Created(..))),
        "{started:?}"
    );
    let inputs: Vec<(Uuid, i64)> =
        sqlx::query_as("SELECT id, (input->>'n')::bigint FROM runs WHERE workflow_name = 'mixed'")
            .fetch_all(coordinator.store().pool())
            .await
            .expect("inputs");
    let by_run: std::collections::HashMap<Uuid, i64> = inputs.iter().copied().collect();

    let leased = lease_all_of(coordinator, "mixed", 48).await;
    let mut reports = Vec::new();
    for task in leased {
        let n = by_run[&task.run_id];
        let report = match (task.node_key.as_str(), n % 2) {
            ("left", retryable) => TaskReport::Failed {
                code: "boom".to_owned(),
                message: "left failed".to_owned(),
                retryable: retryable == 0,
                details: None,
            },
            // the failing half's right task is still running when its run ends
            (_, 1) => continue,
            _ => TaskReport::Completed {
                output: json!({ "right": n }),
            },
        };
        reports.push((task, report));
    }
    let answers = report_all(coordinator, reports).await;
    assert!(answers.values().all(Result::is_ok), "{answers:?}");

    let mut snapshots = std::collections::BTreeMap::new();
    for (run_id, n) in inputs {
        snapshots.insert(
            n,
            common::run_snapshot(coordinator.store().pool(), run_id).await,
        );
    }
    snapshots
}

/// The group's runs written in one statement (decision 0026) end exactly
/// as runs written one statement each: node rows, gap-free history, armed
/// and cancelled tasks, scheduled and removed timers, the run's end.
#[tokio::test]
async fn runs_written_together_end_as_runs_written_alone() {
    let together = coordinator().await;
    let grouped = mixed_reports(&together).await;
    assert!(
        together.group_commit_stats().shared_writes >= 2,
        "the reports' runs were written together: {:?}",
        together.group_commit_stats()
    );
    let alone = coordinator_with(Duration::ZERO).await;
    let single = mixed_reports(&alone).await;
    assert_eq!(alone.group_commit_stats().shared_writes, 0);

    assert_eq!(grouped.len(), 24);
    for (n, snapshot) in &grouped {
        assert_eq!(Some(snapshot), single.get(n), "run {n}");
        let expected = if n % 2 == 0 {
            "\"RUNNING\""
        } else {
            "\"FAILED\""
        };
        assert!(
            snapshot.starts_with(&format!("({expected}")),
            "run {n}: {snapshot}"
        );
    }
    // the retrying half waits on its backoff timer; the failed half has none
    assert!(
        grouped[&0].ends_with("\n[(\"RETRY:left:2\", false)]"),
        "{}",
        grouped[&0]
    );
    assert!(grouped[&1].ends_with("\n[]"), "{}", grouped[&1]);
}

/// A run whose part of the shared write fails (Postgres refuses a NUL in
/// jsonb) fails alone: the group goes again with a write per run, which
/// names it, and every other report applies.
#[tokio::test]
async fn a_run_whose_shared_write_fails_fails_alone() {
    let coordinator = coordinator().await;
    let requests = (0..20).map(|i| start(json!({ "n": i }), None)).collect();
    start_all(&coordinator, requests).await;
    let leased = lease_all(&coordinator, 20).await;
    let poisoned = leased[5].id;
    let reports = leased
        .iter()
        .map(|task| {
            let output = if task.id == poisoned {
                json!({ "text": "nul\u{0}here" })
            } else {
                json!({ "done": true })
            };
            (task.clone(), TaskReport::Completed { output })
        })
        .collect();
    let answers = report_all(&coordinator, reports).await;
    for task in &leased {
        let answer = &answers[&task.id];
        let status = coordinator
            .get_run(Some("default"), &task.run_id.to_string(), false)
            .await
            .expect("run")
            .run
            .status;
        if task.id == poisoned {
            assert!(
                matches!(answer, Err(CoordinatorError::Store(_))),
                "{answer:?}"
            );
            assert_eq!(status, "RUNNING");
        } else {
            assert!(answer.is_ok(), "{answer:?}");
            assert_eq!(status, "COMPLETED");
        }
    }
}

const AGAIN: &str = r#"
name: again
nodes:
  - { id: work, type: TASK, queue: again, task: work, retry: { max_attempts: 3, initial_interval: 1s } }
"#;

/// Retry timers fired together re-arm each task in its own row (the
/// shared write updates the rows that exist, decision 0060): the same
/// task id at its next attempt, dispatched again, one row per node.
#[tokio::test]
async fn retries_fired_together_re_arm_each_task_in_its_row() {
    let coordinator = coordinator().await;
    register_and_start(&coordinator, AGAIN, "again", 8).await;
    let first = lease_all_of(&coordinator, "again", 8).await;
    let failed = first
        .iter()
        .map(|task| {
            let report = TaskReport::Failed {
                code: "boom".to_owned(),
                message: "try again".to_owned(),
                retryable: true,
                details: None,
            };
            (task.clone(), report)
        })
        .collect();
    let answers = report_all(&coordinator, failed).await;
    assert!(answers.values().all(Result::is_ok), "{answers:?}");

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let due = composer_store::timers::due_timers(coordinator.store().pool(), 100)
        .await
        .expect("due");
    assert_eq!(due.len(), 8, "{due:?}");
    assert_eq!(coordinator.fire_timers(&due).await.expect("fire"), 8);

    let rows: Vec<(Uuid, Uuid, String, i32, String)> = sqlx::query_as(
        "SELECT run_id, id, node_key, attempt, status FROM tasks \
         WHERE workflow_name = 'again' ORDER BY run_id",
    )
    .fetch_all(coordinator.store().pool())
    .await
    .expect("tasks");
    assert_eq!(rows.len(), 8, "one row per run's node: {rows:?}");
    for task in &first {
        let row = rows
            .iter()
            .find(|row| row.0 == task.run_id)
            .expect("the run's task row");
        assert_eq!(
            (row.1, row.2.as_str(), row.3, row.4.as_str()),
            (task.id, "work", 2, "DISPATCHED"),
            "{row:?}"
        );
    }
    // and the second attempt leases and completes as any other
    let second = lease_all_of(&coordinator, "again", 8).await;
    assert!(second.iter().all(|t| t.attempt == 2), "{second:?}");
    let done = second
        .into_iter()
        .map(|task| {
            let report = TaskReport::Completed {
                output: json!({ "ok": true }),
            };
            (task, report)
        })
        .collect();
    let answers = report_all(&coordinator, done).await;
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    let completed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM runs WHERE workflow_name = 'again' AND status = 'COMPLETED'",
    )
    .fetch_one(coordinator.store().pool())
    .await
    .expect("runs");
    assert_eq!(completed, 8);
}
