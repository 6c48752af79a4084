//! Bulk operations on runs end to end (issue 17): BulkRetryRuns and its
//! siblings over a ListRuns filter, as long-running operations that count
//! exactly, survive the death of the server working on them, stop when
//! cancelled, and stay inside their namespace. The real binary on real
//! Postgres and Redis; the exactness checks read history with SQL (run_events_each).

use std::{collections::HashMap, path::PathBuf, time::Duration};

use composer_grpc::auth::{NewToken, SigningKey, mint};
use composer_proto::v1::{
    BulkCancelRunsRequest, BulkOperation, BulkOperationStatus, BulkPauseRunsRequest,
    BulkResumeRunsRequest, BulkRetryRunsRequest, CancelBulkOperationRequest,
    GetBulkOperationRequest, ListBulkOperationsRequest, RegisterWorkflowRequest, RunFilter,
    RunStatus, StartRunRequest, run_service_client::RunServiceClient,
    workflow_service_client::WorkflowServiceClient,
};
use composer_testkit::{ServerProcess, client::TestClient, fresh_database, fresh_redis_url};
use futures::{StreamExt, stream};
use serde_json::json;
use sqlx::PgPool;
use tonic::{Code, Request, Status, transport::Channel};

use crate::common::violated_field;

const WAIT: Duration = Duration::from_secs(120);
const SECRET: &str = "a-test-secret-that-is-long-enough-for-hs256-0123456789";

/// The issue's 10,000 failed runs: created, retried and checked in about
/// 80 s in a debug build.
const FAILED_RUNS: usize = 10_000;

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

/// Fails at its start when `input.fail` holds (the task's input reads a
/// field that is not there), so a failed run costs one StartRun and no
/// worker; otherwise it completes after a timer of no length. A retry
/// fails the same way again.
const FAIL_FAST: &str = r#"
name: fail_fast
nodes:
  - { id: route, type: SWITCH }
  - { id: broken, type: TASK, queue: nobody, task: t, input: "${input.missing.field}" }
  - { id: done, type: WAIT, duration: 0s }
edges:
  - { from: route, to: broken, when: "${input.fail}" }
  - { from: route, to: done }
"#;

/// Waits on a queue nobody polls: its runs stay RUNNING.
const WAITS: &str = r#"
name: waits
nodes:
  - { id: a, type: TASK, queue: nobody, task: t }
"#;

fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn by_label(key: &str, value: &str) -> Option<RunFilter> {
    Some(RunFilter {
        labels: labels(&[(key, value)]),
        ..RunFilter::default()
    })
}

async fn channel(server: &ServerProcess) -> Channel {
    Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

/// Starts `count` runs of `workflow` with `input` and `labels`, 16 at a
/// time; returns their ids.
async fn start_runs(
    runs: &RunServiceClient<Channel>,
    workflow: &str,
    input: serde_json::Value,
    labels: &HashMap<String, String>,
    count: usize,
) -> Vec<String> {
    stream::iter(0..count)
        .map(|_| {
            let mut runs = runs.clone();
            let request = StartRunRequest {
                workflow_name: workflow.to_owned(),
                input: Some(composer_grpc::convert::from_json(&input)),
                labels: labels.clone(),
                ..StartRunRequest::default()
            };
            async move {
                runs.start_run(request)
                    .await
                    .expect("start")
                    .into_inner()
                    .run
                    .expect("run")
                    .run_id
            }
        })
        .buffer_unordered(16)
        .collect()
        .await
}

async fn get_operation(runs: &mut RunServiceClient<Channel>, id: &str) -> BulkOperation {
    runs.get_bulk_operation(GetBulkOperationRequest {
        operation_id: id.to_owned(),
    })
    .await
    .expect("get operation")
    .into_inner()
    .operation
    .expect("operation")
}

fn has_ended(op: &BulkOperation) -> bool {
    !matches!(
        op.status(),
        BulkOperationStatus::Pending | BulkOperationStatus::Running
    )
}

/// Polls the operation until `until` holds; panics when it went [`WAIT`]
/// without acting on one more run (a stall, not a slow machine: a loaded
/// CI machine walks 10,000 runs at half the pace of an idle one).
async fn wait_operation(
    runs: &mut RunServiceClient<Channel>,
    id: &str,
    until: impl Fn(&BulkOperation) -> bool,
) -> BulkOperation {
    let done = |op: &BulkOperation| op.succeeded + op.skipped + op.failed;
    let mut progress = (None, tokio::time::Instant::now());
    loop {
        let op = get_operation(runs, id).await;
        if until(&op) {
            return op;
        }
        if progress.0 != Some(done(&op)) {
            progress = (Some(done(&op)), tokio::time::Instant::now());
        }
        assert!(
            progress.1.elapsed() < WAIT,
            "operation made no progress for {WAIT:?}: {op:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn retry_by_label(runs: &mut RunServiceClient<Channel>, value: &str) -> BulkOperation {
    runs.bulk_retry_runs(BulkRetryRunsRequest {
        filter: by_label("batch", value),
        ..BulkRetryRunsRequest::default()
    })
    .await
    .expect("bulk retry")
    .into_inner()
    .operation
    .expect("operation")
}

/// How many retry events each run has.
async fn retries_per_run(pool: &PgPool) -> HashMap<String, i64> {
    let rows: Vec<(uuid::Uuid, i64)> = sqlx::query_as(
        "SELECT run_id, count(*) FROM run_events_each WHERE event_type = 'retry_requested_by' \
         GROUP BY run_id",
    )
    .fetch_all(pool)
    .await
    .expect("count retries");
    rows.into_iter()
        .map(|(id, n)| (id.to_string(), n))
        .collect()
}

fn assert_retried_once(retries: &HashMap<String, i64>, run_ids: &[String]) {
    let wrong: Vec<_> = run_ids
        .iter()
        .filter(|id| retries.get(*id).copied() != Some(1))
        .take(5)
        .collect();
    assert!(wrong.is_empty(), "runs not retried exactly once: {wrong:?}");
}

async fn server_with_pool(args: &[&str]) -> (ServerProcess, PgPool, String, String) {
    let database_url = fresh_database().await;
    let redis_url = fresh_redis_url();
    let server =
        ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, args).await;
    let pool = PgPool::connect(&database_url).await.expect("pool");
    (server, pool, database_url, redis_url)
}

/// Every failed run with the label is retried exactly once; the completed
/// ones with the label are skipped; failed runs without it are untouched.
#[tokio::test]
async fn bulk_retry_retries_each_failed_run_once_with_exact_counts() {
    // full speed: this test counts, the benchmark measures the pacing
    let (server, pool, _, _) =
        server_with_pool(&["--bulk-batch-size", "200", "--bulk-batch-pause", "10ms"]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(FAIL_FAST).await;
    let outage = labels(&[("batch", "outage")]);
    let failed = start_runs(
        &client.runs,
        "fail_fast",
        json!({"fail": true}),
        &outage,
        FAILED_RUNS,
    )
    .await;
    let completed = start_runs(
        &client.runs,
        "fail_fast",
        json!({"fail": false}),
        &outage,
        50,
    )
    .await;
    let elsewhere = start_runs(
        &client.runs,
        "fail_fast",
        json!({"fail": true}),
        &labels(&[("batch", "other")]),
        20,
    )
    .await;
    assert_eq!(client.get(&failed[0]).await.status(), RunStatus::Failed);
    for id in &completed {
        client.wait_done(id, WAIT).await;
    }

    let started = retry_by_label(&mut client.runs, "outage").await;
    assert_eq!(started.matched, (FAILED_RUNS + 50) as i64);
    let done = wait_operation(&mut client.runs, &started.operation_id, has_ended).await;

    assert_eq!(done.status(), BulkOperationStatus::Succeeded, "{done:?}");
    assert_eq!(
        (done.matched, done.succeeded, done.skipped, done.failed),
        ((FAILED_RUNS + 50) as i64, FAILED_RUNS as i64, 50, 0)
    );
    assert!(done.failures.is_empty());
    assert!(done.end_time.is_some());
    let retries = retries_per_run(&pool).await;
    assert_retried_once(&retries, &failed);
    assert_eq!(
        retries.len(),
        FAILED_RUNS,
        "only the failed runs with the label"
    );
    for id in completed.iter().chain(&elsewhere) {
        assert!(!retries.contains_key(id), "{id} was retried");
    }
    // the history as a caller reads it says the same
    for id in failed.iter().take(5) {
        let events = client.history(id).await;
        let retried = events
            .iter()
            .filter(|e| e.event_type == "retry_requested_by")
            .count();
        assert_eq!(retried, 1, "{id}: {events:?}");
    }
}

/// Two servers on one database: whichever claims the operation is killed
/// mid-way (SIGKILL) and the other finishes it with exact counts.
#[tokio::test]
async fn a_killed_servers_operation_is_finished_by_another_with_exact_counts() {
    // slow pages, so the operation is mid-way when its server dies
    let args = [
        "--bulk-batch-size",
        "20",
        "--bulk-batch-pause",
        "200ms",
        "--bulk-lease",
        "2s",
    ];
    let (first, pool, database_url, redis_url) = server_with_pool(&args).await;
    let second =
        ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &args).await;
    let mut client = TestClient::connect(&first.url()).await;
    client.register(FAIL_FAST).await;
    let batch = labels(&[("batch", "crash")]);
    let failed = start_runs(
        &client.runs,
        "fail_fast",
        json!({"fail": true}),
        &batch,
        600,
    )
    .await;
    let started = retry_by_label(&mut client.runs, "crash").await;
    wait_operation(&mut client.runs, &started.operation_id, |op| {
        op.succeeded >= 60
    })
    .await;

    let claimed = |server: &ServerProcess| {
        server
            .stderr_lines()
            .iter()
            .any(|l| l.contains("bulk operation claimed") && l.contains(&started.operation_id))
    };
    let (mut holder, survivor) = if claimed(&first) {
        (first, second)
    } else {
        (second, first)
    };
    assert!(claimed(&holder), "no server logged the claim");
    holder.kill().await;
    let mut runs = RunServiceClient::new(channel(&survivor).await);
    let before = get_operation(&mut runs, &started.operation_id).await;
    assert!(
        before.succeeded < 600,
        "finished before the kill: {before:?}"
    );

    let done = wait_operation(&mut runs, &started.operation_id, has_ended).await;
    assert_eq!(done.status(), BulkOperationStatus::Succeeded, "{done:?}");
    assert_eq!(
        (done.matched, done.succeeded, done.skipped, done.failed),
        (600, 600, 0, 0)
    );
    assert!(claimed(&survivor), "the survivor never took it over");
    let retries = retries_per_run(&pool).await;
    assert_retried_once(&retries, &failed);
    assert_eq!(retries.len(), 600);
}

/// CancelBulkOperation mid-way: CANCELLED, the counts add up to no more
/// than matched, and exactly the runs counted were retried.
#[tokio::test]
async fn a_cancelled_operation_stops_and_leaves_the_rest_untouched() {
    let (server, pool, _, _) =
        server_with_pool(&["--bulk-batch-size", "20", "--bulk-batch-pause", "200ms"]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(FAIL_FAST).await;
    let batch = labels(&[("batch", "stop")]);
    let failed = start_runs(
        &client.runs,
        "fail_fast",
        json!({"fail": true}),
        &batch,
        600,
    )
    .await;
    let started = retry_by_label(&mut client.runs, "stop").await;
    wait_operation(&mut client.runs, &started.operation_id, |op| {
        op.succeeded >= 40
    })
    .await;

    let cancelled = client
        .runs
        .cancel_bulk_operation(CancelBulkOperationRequest {
            operation_id: started.operation_id.clone(),
        })
        .await
        .expect("cancel")
        .into_inner()
        .operation
        .expect("operation");
    assert!(matches!(
        cancelled.status(),
        BulkOperationStatus::Running | BulkOperationStatus::Cancelled
    ));
    let done = wait_operation(&mut client.runs, &started.operation_id, has_ended).await;
    assert_eq!(done.status(), BulkOperationStatus::Cancelled, "{done:?}");
    assert!(done.succeeded + done.skipped + done.failed <= done.matched);
    assert!(done.succeeded < 600, "not stopped: {done:?}");
    // nothing moves after the end
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = get_operation(&mut client.runs, &started.operation_id).await;
    assert_eq!(later.succeeded, done.succeeded);
    let retries = retries_per_run(&pool).await;
    assert_eq!(retries.len() as i64, done.succeeded, "retried = counted");
    assert!(retries.values().all(|&n| n == 1));
    assert!(failed.iter().filter(|id| retries.contains_key(*id)).count() as i64 == done.succeeded);
    // cancelling again is OK
    client
        .runs
        .cancel_bulk_operation(CancelBulkOperationRequest {
            operation_id: started.operation_id.clone(),
        })
        .await
        .expect("cancel again");
}

/// Bulk pause, resume and cancel on a small set; a run created after an
/// operation started is never touched by it.
#[tokio::test]
async fn bulk_pause_resume_and_cancel_leave_later_runs_alone() {
    // one run per page and a pause between: the operations are still
    // walking when the later run is created
    let (server, _pool, _, _) =
        server_with_pool(&["--bulk-batch-size", "1", "--bulk-batch-pause", "300ms"]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(WAITS).await;
    let set = labels(&[("set", "s")]);
    let early = start_runs(&client.runs, "waits", json!({}), &set, 5).await;

    let pause = client
        .runs
        .bulk_pause_runs(BulkPauseRunsRequest {
            filter: by_label("set", "s"),
            reason: "maintenance".to_owned(),
            ..BulkPauseRunsRequest::default()
        })
        .await
        .expect("bulk pause")
        .into_inner()
        .operation
        .expect("operation");
    let late = start_runs(&client.runs, "waits", json!({}), &set, 1)
        .await
        .remove(0);
    let paused = wait_operation(&mut client.runs, &pause.operation_id, has_ended).await;
    assert_eq!(paused.status(), BulkOperationStatus::Succeeded);
    assert_eq!(
        (paused.matched, paused.succeeded, paused.skipped),
        (5, 5, 0)
    );
    for id in &early {
        assert_eq!(client.get(id).await.status(), RunStatus::Paused);
    }
    assert_eq!(client.get(&late).await.status(), RunStatus::Running);

    // resume: the five paused ones; the later run is not paused, so skipped
    let resume = client
        .runs
        .bulk_resume_runs(BulkResumeRunsRequest {
            filter: by_label("set", "s"),
            ..BulkResumeRunsRequest::default()
        })
        .await
        .expect("bulk resume")
        .into_inner()
        .operation
        .expect("operation");
    let resumed = wait_operation(&mut client.runs, &resume.operation_id, has_ended).await;
    assert_eq!(
        (resumed.matched, resumed.succeeded, resumed.skipped),
        (6, 5, 1)
    );
    for id in &early {
        assert_eq!(client.get(id).await.status(), RunStatus::Running);
    }

    let cancel = client
        .runs
        .bulk_cancel_runs(BulkCancelRunsRequest {
            filter: by_label("set", "s"),
            reason: "cleanup".to_owned(),
            ..BulkCancelRunsRequest::default()
        })
        .await
        .expect("bulk cancel")
        .into_inner()
        .operation
        .expect("operation");
    let latest = start_runs(&client.runs, "waits", json!({}), &set, 1)
        .await
        .remove(0);
    let cancelled = wait_operation(&mut client.runs, &cancel.operation_id, has_ended).await;
    assert_eq!(
        (cancelled.matched, cancelled.succeeded, cancelled.skipped),
        (6, 6, 0)
    );
    for id in early.iter().chain([&late]) {
        assert_eq!(client.get(id).await.status(), RunStatus::Cancelled);
    }
    let history = client.history(&late).await;
    assert!(
        history.iter().any(|e| e.event_type == "cancel_requested_by"
            && format!("{:?}", e.details).contains("cleanup")),
        "{history:?}"
    );
    assert_eq!(client.get(&latest).await.status(), RunStatus::Running);

    let listed = client
        .runs
        .list_bulk_operations(ListBulkOperationsRequest {
            page_size: 2,
            page_token: String::new(),
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.operations.len(), 2);
    assert_eq!(
        listed.operations[0].operation_id, cancel.operation_id,
        "newest first"
    );
    let rest = client
        .runs
        .list_bulk_operations(ListBulkOperationsRequest {
            page_size: 2,
            page_token: listed.next_page_token,
        })
        .await
        .expect("list page 2")
        .into_inner();
    assert_eq!(rest.operations.len(), 1);
    assert_eq!(rest.operations[0].operation_id, pause.operation_id);
    assert!(rest.next_page_token.is_empty());
}

fn token(ns: &str, roles: &[&str]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    mint(
        &NewToken {
            sub: format!("{ns}-{}", roles.join("-")),
            ns: ns.to_owned(),
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
            queues: None,
            iat: now,
            nbf: now,
            exp: now + 3600,
            iss: None,
            aud: None,
        },
        SigningKey::Secret(SECRET.as_bytes()),
        None,
    )
    .expect("mint")
}

fn authed<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

async fn bulk_cancel_as(
    runs: &mut RunServiceClient<Channel>,
    token: &str,
    request: BulkCancelRunsRequest,
) -> Result<(BulkOperation, bool), Status> {
    let response = runs
        .bulk_cancel_runs(authed(request, token))
        .await?
        .into_inner();
    Ok((response.operation.expect("operation"), response.created))
}

/// Filters are checked as ListRuns checks them, under `filter.`; an empty
/// filter needs `all`; a request id names one operation; a reader may look
/// but not act; another namespace neither sees the operation nor has its
/// runs touched.
#[tokio::test]
async fn bulk_requests_are_checked_and_stay_inside_the_namespace() {
    let server = ServerProcess::start(&composer_binary(), &["--auth-secret", SECRET]).await;
    let channel = channel(&server).await;
    let mut runs = RunServiceClient::new(channel.clone());
    let mut workflows = WorkflowServiceClient::new(channel);
    let owner = token("tenant-a", &["operator"]);
    workflows
        .register_workflow(authed(
            RegisterWorkflowRequest {
                source: WAITS.to_owned(),
            },
            &owner,
        ))
        .await
        .expect("register");
    let run = runs
        .start_run(authed(
            StartRunRequest {
                workflow_name: "waits".to_owned(),
                labels: labels(&[("set", "s")]),
                ..StartRunRequest::default()
            },
            &owner,
        ))
        .await
        .expect("start")
        .into_inner()
        .run
        .expect("run");

    let bad = [
        (
            RunFilter {
                workflow_version: -1,
                ..RunFilter::default()
            },
            "filter.workflow_version",
        ),
        (
            RunFilter {
                statuses: vec![99],
                ..RunFilter::default()
            },
            "filter.statuses[0]",
        ),
        (
            RunFilter {
                workflow_name: "Not A Name!".to_owned(),
                ..RunFilter::default()
            },
            "filter.workflow_name",
        ),
        (
            RunFilter {
                parent_run_id: "nope".to_owned(),
                ..RunFilter::default()
            },
            "filter.parent_run_id",
        ),
    ];
    for (filter, field) in bad {
        let error = bulk_cancel_as(
            &mut runs,
            &owner,
            BulkCancelRunsRequest {
                filter: Some(filter),
                ..BulkCancelRunsRequest::default()
            },
        )
        .await
        .expect_err(field);
        assert_eq!(error.code(), Code::InvalidArgument, "{field}: {error:?}");
        assert_eq!(violated_field(&error), field);
    }
    let long_reason = bulk_cancel_as(
        &mut runs,
        &owner,
        BulkCancelRunsRequest {
            filter: by_label("set", "s"),
            reason: "x".repeat(5000),
            ..BulkCancelRunsRequest::default()
        },
    )
    .await
    .expect_err("long reason");
    assert_eq!(violated_field(&long_reason), "reason");
    let empty = bulk_cancel_as(&mut runs, &owner, BulkCancelRunsRequest::default())
        .await
        .expect_err("empty filter");
    assert_eq!(empty.code(), Code::FailedPrecondition);

    // a reader may not act, in any of the four
    let reader = token("tenant-a", &["reader"]);
    let denied = [
        bulk_cancel_as(
            &mut runs,
            &reader,
            BulkCancelRunsRequest {
                all: true,
                ..BulkCancelRunsRequest::default()
            },
        )
        .await
        .map(|_| ()),
        runs.bulk_retry_runs(authed(
            BulkRetryRunsRequest {
                all: true,
                ..BulkRetryRunsRequest::default()
            },
            &reader,
        ))
        .await
        .map(|_| ()),
        runs.bulk_pause_runs(authed(
            BulkPauseRunsRequest {
                all: true,
                ..BulkPauseRunsRequest::default()
            },
            &reader,
        ))
        .await
        .map(|_| ()),
        runs.bulk_resume_runs(authed(
            BulkResumeRunsRequest {
                all: true,
                ..BulkResumeRunsRequest::default()
            },
            &reader,
        ))
        .await
        .map(|_| ()),
    ];
    for result in denied {
        assert_eq!(result.expect_err("reader").code(), Code::PermissionDenied);
    }

    // a request id names one operation
    let pause = |token: &str| {
        authed(
            BulkPauseRunsRequest {
                filter: by_label("set", "s"),
                request_id: "pause-1".to_owned(),
                ..BulkPauseRunsRequest::default()
            },
            token,
        )
    };
    let first = runs
        .bulk_pause_runs(pause(&owner))
        .await
        .expect("pause")
        .into_inner();
    let again = runs
        .bulk_pause_runs(pause(&owner))
        .await
        .expect("again")
        .into_inner();
    assert!(first.created);
    assert!(!again.created);
    let id = first.operation.expect("operation").operation_id;
    assert_eq!(again.operation.expect("operation").operation_id, id);

    // the reader may watch it
    let seen = runs
        .get_bulk_operation(authed(
            GetBulkOperationRequest {
                operation_id: id.clone(),
            },
            &reader,
        ))
        .await
        .expect("reader gets")
        .into_inner()
        .operation
        .expect("operation");
    assert_eq!(seen.namespace, "tenant-a");
    let listed = runs
        .list_bulk_operations(authed(ListBulkOperationsRequest::default(), &reader))
        .await
        .expect("reader lists")
        .into_inner();
    assert_eq!(listed.operations.len(), 1);

    // another namespace: not found, not listed, and its `all` never
    // reaches tenant-a's runs
    let stranger = token("tenant-b", &["admin"]);
    let hidden = runs
        .get_bulk_operation(authed(
            GetBulkOperationRequest {
                operation_id: id.clone(),
            },
            &stranger,
        ))
        .await
        .expect_err("another namespace");
    assert_eq!(hidden.code(), Code::NotFound);
    let hidden = runs
        .cancel_bulk_operation(authed(
            CancelBulkOperationRequest {
                operation_id: id.clone(),
            },
            &stranger,
        ))
        .await
        .expect_err("another namespace");
    assert_eq!(hidden.code(), Code::NotFound);
    let theirs = runs
        .list_bulk_operations(authed(ListBulkOperationsRequest::default(), &stranger))
        .await
        .expect("list")
        .into_inner();
    assert!(theirs.operations.is_empty());
    let (sweep, _) = bulk_cancel_as(
        &mut runs,
        &stranger,
        BulkCancelRunsRequest {
            all: true,
            ..BulkCancelRunsRequest::default()
        },
    )
    .await
    .expect("cancel all of tenant-b");
    assert_eq!(sweep.matched, 0);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let op = runs
            .get_bulk_operation(authed(
                GetBulkOperationRequest {
                    operation_id: sweep.operation_id.clone(),
                },
                &stranger,
            ))
            .await
            .expect("get")
            .into_inner()
            .operation
            .expect("operation");
        if has_ended(&op) {
            assert_eq!((op.succeeded, op.skipped, op.failed), (0, 0, 0));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mine = runs
        .get_run(authed(
            composer_proto::v1::GetRunRequest {
                run_id: run.run_id.clone(),
                skip_nodes: true,
            },
            &owner,
        ))
        .await
        .expect("get run")
        .into_inner()
        .run
        .expect("run");
    assert_ne!(mine.status(), RunStatus::Cancelled);
}

/// `composer <args> --address <server>`, run to its end: exit code, stdout,
/// stderr.
async fn cli(server: &ServerProcess, args: &[&str]) -> (i32, String, String) {
    let output = tokio::process::Command::new(composer_binary())
        .args(args)
        .args(["--address", &server.url()])
        .env_remove("COMPOSER_ADDRESS")
        .env_remove("COMPOSER_TOKEN")
        .env_remove("COMPOSER_NAMESPACE")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run composer");
    (
        output.status.code().expect("exited"),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The CLI starts a bulk retry by `run list` flags and follows it to its
/// end; `operation get|list|cancel` read and stop it; a filterless command
/// is refused unless `--all`.
#[tokio::test]
async fn the_cli_starts_follows_and_lists_bulk_operations() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(FAIL_FAST).await;
    let batch = labels(&[("batch", "cli")]);
    start_runs(&client.runs, "fail_fast", json!({"fail": true}), &batch, 30).await;

    let (code, stdout, stderr) = cli(
        &server,
        &[
            "run",
            "bulk-retry",
            "--label",
            "batch=cli",
            "--status",
            "failed",
            "--wait",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let op: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(op["status"], "BULK_OPERATION_STATUS_SUCCEEDED");
    assert_eq!(op["kind"], "BULK_OPERATION_KIND_RETRY");
    assert_eq!(op["matched"], 30, "{op}");
    assert_eq!(op["succeeded"], 30);
    let id = op["operation_id"].as_str().expect("id").to_owned();

    let (code, stdout, _) = cli(&server, &["operation", "get", &id]).await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains("SUCCEEDED") && stdout.contains("batch=cli"),
        "{stdout}"
    );
    let (code, stdout, _) = cli(&server, &["operation", "list"]).await;
    assert_eq!(code, 0);
    assert!(stdout.contains(&id), "{stdout}");
    // cancelling an ended operation is FAILED_PRECONDITION (19)
    let (code, _, stderr) = cli(&server, &["operation", "cancel", &id]).await;
    assert_eq!(code, 19, "{stderr}");
    let (code, _, stderr) = cli(&server, &["run", "bulk-cancel"]).await;
    assert_eq!(code, 19, "{stderr}");
    let (code, _, stderr) = cli(&server, &["operation", "get", "no-such-id"]).await;
    assert_eq!(code, 15, "{stderr}");
}
