//! Concurrency keys end to end (issue 17, point 4): at most `max` runs per
//! key value at a time across servers, the rest QUEUED in arrival order,
//! `cancel_new` and `cancel_oldest`, cancels and retries of keyed runs, and
//! keys that never cross namespaces; and TASK node slots (`concurrency:
//! {key, max}` on a TASK): at most `max` tasks per key value leased at a
//! time, handed on as tasks end, fail, are cancelled or their run pauses.
//! The real binary on real Postgres and
//! Redis; workers played by the test through the raw worker protocol.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use composer_grpc::auth::{NewToken, SigningKey, mint};
use composer_proto::v1::{
    CancelRunRequest, CompleteTaskRequest, CountRunsRequest, FailTaskRequest, ListRunsRequest,
    PauseRunRequest, PollTasksRequest, RegisterWorkflowRequest, ResumeRunRequest, RetryRunRequest,
    Run, RunStatus, StartRunRequest, Task, run_service_client::RunServiceClient,
    worker_service_client::WorkerServiceClient, workflow_service_client::WorkflowServiceClient,
};
use composer_testkit::{ServerProcess, client::TestClient, worker::value_of};
use serde_json::{Value as Json, json};
use tonic::{Request, transport::Channel};
use tonic_types::StatusExt;

const WAIT: Duration = Duration::from_secs(60);
const SECRET: &str = "a-test-secret-that-is-long-enough-for-hs256-0123456789";

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

async fn channel(server: &ServerProcess) -> Channel {
    Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

const PER_TENANT: &str = r#"
name: per_tenant
concurrency: { key: "input.tenant", max: 1 }
nodes:
  - { id: work, type: TASK, queue: conc, task: work, retry: { max_attempts: 1 } }
"#;

fn keyed(name: &str, on_limit: &str, queue: &str) -> String {
    format!(
        "name: {name}\nconcurrency: {{ key: \"input.tenant\", max: 1, on_limit: {on_limit} }}\n\
         nodes:\n  - {{ id: work, type: TASK, queue: {queue}, task: work, retry: {{ max_attempts: 1 }} }}\n"
    )
}

async fn start(runs: &mut RunServiceClient<Channel>, workflow: &str, input: Json) -> Run {
    runs.start_run(StartRunRequest {
        workflow_name: workflow.to_owned(),
        input: Some(value_of(&input)),
        ..Default::default()
    })
    .await
    .expect("start")
    .into_inner()
    .run
    .expect("run")
}

async fn poll(workers: &mut WorkerServiceClient<Channel>, queue: &str, max: i32) -> Vec<Task> {
    workers
        .poll_tasks(PollTasksRequest {
            worker_id: "conc-test".to_owned(),
            queues: vec![queue.to_owned()],
            max_tasks: max,
            wait: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            confirm_receipt: false,
        })
        .await
        .expect("poll")
        .into_inner()
        .tasks
}

async fn poll_one(workers: &mut WorkerServiceClient<Channel>, queue: &str) -> Task {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(task) = poll(workers, queue, 1).await.into_iter().next() {
            return task;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no task on {queue} within {WAIT:?}"
        );
    }
}

async fn complete(workers: &mut WorkerServiceClient<Channel>, task: &Task) {
    workers
        .complete_task(CompleteTaskRequest {
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            lease_token: task.lease_token.clone(),
            output: Some(value_of(&json!({"done": task.run_id}))),
        })
        .await
        .expect("complete");
}

async fn fail(workers: &mut WorkerServiceClient<Channel>, task: &Task) {
    workers
        .fail_task(FailTaskRequest {
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            lease_token: task.lease_token.clone(),
            error_code: "BROKEN".to_owned(),
            message: "failed by the test".to_owned(),
            retryable: false,
            details: None,
        })
        .await
        .expect("fail");
}

/// Waits until the run is in `status` (or panics after [`WAIT`]).
async fn wait_status(client: &mut TestClient, run_id: &str, status: RunStatus) -> Run {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let run = client.get(run_id).await;
        if run.status() == status {
            return run;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "run {run_id} still {:?}, not {status:?}",
            run.status()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn millis(time: &Option<prost_types::Timestamp>) -> i128 {
    let time = time.as_ref().expect("time");
    i128::from(time.seconds) * 1_000_000_000 + i128::from(time.nanos)
}

/// When the run started and ended, as its history says (nanoseconds).
async fn started_and_ended(client: &mut TestClient, run_id: &str) -> (i128, i128) {
    let history = client.history(run_id).await;
    let at = |kind: &str| {
        history
            .iter()
            .find(|e| e.event_type == kind)
            .map(|e| millis(&e.event_time))
            .unwrap_or_else(|| panic!("run {run_id} has no {kind}: {history:?}"))
    };
    (at("run_started"), at("run_completed"))
}

/// The reason a cancelled run's history gives.
async fn cancel_reason(client: &mut TestClient, run_id: &str) -> String {
    let history = client.history(run_id).await;
    let cancelled = history
        .iter()
        .find(|e| e.event_type == "run_cancelled")
        .unwrap_or_else(|| panic!("run {run_id} was not cancelled: {history:?}"));
    let details = composer_testkit::worker::json_of(cancelled.details.clone().expect("details"));
    details["reason"].as_str().unwrap_or_default().to_owned()
}

/// A worker on one server: completes every task of `queue` after a short
/// random delay, until `stop`.
fn spawn_worker(
    mut workers: WorkerServiceClient<Channel>,
    queue: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut done = 0;
        while !stop.load(Ordering::Relaxed) {
            for task in poll(&mut workers, queue, 5).await {
                let delay = uuid::Uuid::new_v4().as_u128() % 25;
                tokio::time::sleep(Duration::from_millis(delay as u64)).await;
                complete(&mut workers, &task).await;
                done += 1;
            }
        }
        done
    })
}

/// Concurrency key max 1: 50 runs on 5 keys started at once through two
/// servers on one database; from the histories, no two runs of a key ever
/// overlap between their start and end, every run completes, and per key
/// they start in the order they arrived (their create_time).
#[tokio::test]
async fn fifty_runs_on_five_keys_with_max_one_never_overlap_and_start_in_arrival_order() {
    let database_url = composer_testkit::fresh_database().await;
    let redis_url = composer_testkit::fresh_redis_url();
    let first = ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let second =
        ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let mut client = TestClient::connect(&first.url()).await;
    client.register(PER_TENANT).await;

    let stop = Arc::new(AtomicBool::new(false));
    let worker_a = spawn_worker(
        WorkerServiceClient::new(channel(&first).await),
        "conc",
        Arc::clone(&stop),
    );
    let worker_b = spawn_worker(
        WorkerServiceClient::new(channel(&second).await),
        "conc",
        Arc::clone(&stop),
    );

    // ten starters, five on each server, five runs each, all at once
    let mut starters = Vec::new();
    for starter in 0..10 {
        let server = if starter % 2 == 0 { &first } else { &second };
        let mut runs = RunServiceClient::new(channel(server).await);
        starters.push(tokio::spawn(async move {
            let mut started = Vec::new();
            for i in 0..5 {
                let tenant = format!("tenant-{}", (starter + i) % 5);
                let run = start(&mut runs, "per_tenant", json!({ "tenant": tenant })).await;
                assert!(
                    matches!(run.status(), RunStatus::Running | RunStatus::Queued),
                    "{run:?}"
                );
                assert_eq!(run.concurrency_key, tenant);
                started.push(run.run_id);
            }
            started
        }));
    }
    let mut run_ids = Vec::new();
    for starter in starters {
        run_ids.extend(starter.await.expect("starter"));
    }
    assert_eq!(run_ids.len(), 50);

    // per key: (create_time, started, ended, run id)
    let mut by_key: BTreeMap<String, Vec<(i128, i128, i128, String)>> = BTreeMap::new();
    for run_id in &run_ids {
        let run = client.wait_done(run_id, Duration::from_secs(120)).await;
        assert_eq!(run.status(), RunStatus::Completed, "{run:?}");
        let (started, ended) = started_and_ended(&mut client, run_id).await;
        by_key
            .entry(run.concurrency_key.clone())
            .or_default()
            .push((millis(&run.create_time), started, ended, run_id.clone()));
    }
    stop.store(true, Ordering::Relaxed);
    let done = worker_a.await.expect("worker") + worker_b.await.expect("worker");
    assert_eq!(done, 50, "one task per run");

    assert_eq!(by_key.len(), 5);
    for (key, runs) in &mut by_key {
        assert_eq!(runs.len(), 10, "{key}");
        runs.sort_by_key(|r| r.1);
        for pair in runs.windows(2) {
            assert!(
                pair[1].1 >= pair[0].2,
                "key {key}: run {} started before run {} ended",
                pair[1].3,
                pair[0].3
            );
        }
        let by_start: Vec<&String> = runs.iter().map(|r| &r.3).collect();
        let mut by_arrival = runs.clone();
        by_arrival.sort_by_key(|r| r.0);
        let by_arrival: Vec<&String> = by_arrival.iter().map(|r| &r.3).collect();
        assert_eq!(
            by_start, by_arrival,
            "key {key}: started out of arrival order"
        );
    }
}

/// `cancel_new`: a run arriving at a full key is created CANCELLED, with a
/// reason naming the key; the caller gets the run, not an error. Other keys
/// are not affected.
#[tokio::test]
async fn cancel_new_creates_the_run_cancelled_naming_its_key() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(&keyed("drop_new", "cancel_new", "cn"))
        .await;
    let mut runs = RunServiceClient::new(channel(&server).await);

    let (first_id, created) = client
        .start_with_key("drop_new", json!({"tenant": "a"}), "once")
        .await;
    assert!(created);
    // the same idempotency key again names the first run: nothing cancelled
    let (again, created) = client
        .start_with_key("drop_new", json!({"tenant": "a"}), "once")
        .await;
    assert_eq!((again.as_str(), created), (first_id.as_str(), false));
    let first = client.get(&first_id).await;
    assert_eq!(first.status(), RunStatus::Running);
    let second = start(&mut runs, "drop_new", json!({"tenant": "a"})).await;
    assert_eq!(second.status(), RunStatus::Cancelled);
    assert_eq!(second.concurrency_key, "a");
    let reason = cancel_reason(&mut client, &second.run_id).await;
    assert!(
        reason.contains("\"a\"") && reason.contains("cancel_new"),
        "{reason}"
    );
    let other_key = start(&mut runs, "drop_new", json!({"tenant": "b"})).await;
    assert_eq!(other_key.status(), RunStatus::Running);

    // once the first ends, the key takes a run again
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    for _ in 0..2 {
        let task = poll_one(&mut workers, "cn").await;
        complete(&mut workers, &task).await;
    }
    client.wait_done(&first.run_id, WAIT).await;
    let third = start(&mut runs, "drop_new", json!({"tenant": "a"})).await;
    assert_eq!(third.status(), RunStatus::Running);
}

/// `cancel_oldest`: the oldest running run of the key is cancelled and the
/// new one runs in its place.
#[tokio::test]
async fn cancel_oldest_cancels_the_oldest_run_of_the_key_and_runs_the_new_one() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(&keyed("newest_wins", "cancel_oldest", "co"))
        .await;
    let mut runs = RunServiceClient::new(channel(&server).await);
    let mut workers = WorkerServiceClient::new(channel(&server).await);

    let oldest = start(&mut runs, "newest_wins", json!({"tenant": "a"})).await;
    assert_eq!(oldest.status(), RunStatus::Running);
    let oldest_task = poll_one(&mut workers, "co").await;
    assert_eq!(oldest_task.run_id, oldest.run_id);

    let newest = start(&mut runs, "newest_wins", json!({"tenant": "a"})).await;
    let cancelled = client.wait_done(&oldest.run_id, WAIT).await;
    assert_eq!(cancelled.status(), RunStatus::Cancelled);
    let reason = cancel_reason(&mut client, &oldest.run_id).await;
    assert!(reason.contains("cancel_oldest"), "{reason}");
    wait_status(&mut client, &newest.run_id, RunStatus::Running).await;
    let task = poll_one(&mut workers, "co").await;
    assert_eq!(task.run_id, newest.run_id);
    complete(&mut workers, &task).await;
    let done = client.wait_done(&newest.run_id, WAIT).await;
    assert_eq!(done.status(), RunStatus::Completed);
}

/// A QUEUED run is listed and counted as QUEUED; cancelling it ends it at
/// once without a slot, and the slot then goes to the next one in line.
#[tokio::test]
async fn a_queued_run_is_listed_cancelled_without_a_slot_and_skipped() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(&keyed("in_line", "queue", "ql")).await;
    let mut runs = RunServiceClient::new(channel(&server).await);
    let mut workers = WorkerServiceClient::new(channel(&server).await);

    let running = start(&mut runs, "in_line", json!({"tenant": "a"})).await;
    let second = start(&mut runs, "in_line", json!({"tenant": "a"})).await;
    let third = start(&mut runs, "in_line", json!({"tenant": "a"})).await;
    assert_eq!(running.status(), RunStatus::Running);
    assert_eq!(second.status(), RunStatus::Queued);
    assert_eq!(third.status(), RunStatus::Queued);
    assert_eq!(client.get(&second.run_id).await.status(), RunStatus::Queued);

    let queued = runs
        .list_runs(ListRunsRequest {
            statuses: vec![RunStatus::Queued as i32],
            page_size: 10,
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .runs;
    assert_eq!(queued.len(), 2);
    let counts = runs
        .count_runs(CountRunsRequest {
            workflow_name: "in_line".to_owned(),
            ..Default::default()
        })
        .await
        .expect("count")
        .into_inner();
    assert!(
        counts
            .counts
            .iter()
            .any(|c| c.status() == RunStatus::Queued && c.count == 2),
        "{counts:?}"
    );

    let cancelled = runs
        .cancel_run(CancelRunRequest {
            run_id: second.run_id.clone(),
            reason: "not needed".to_owned(),
        })
        .await
        .expect("cancel")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(cancelled.status(), RunStatus::Cancelled);
    assert!(
        client
            .history(&second.run_id)
            .await
            .iter()
            .all(|e| e.event_type != "run_started"),
        "a cancelled queued run never started"
    );

    // the slot goes to the third run, never to the cancelled one
    let task = poll_one(&mut workers, "ql").await;
    assert_eq!(task.run_id, running.run_id);
    complete(&mut workers, &task).await;
    let task = poll_one(&mut workers, "ql").await;
    assert_eq!(task.run_id, third.run_id);
    complete(&mut workers, &task).await;
    assert_eq!(
        client.wait_done(&third.run_id, WAIT).await.status(),
        RunStatus::Completed
    );
}

/// A run with a key that fails gives its slot to the next; RetryRun then
/// needs a slot again, so it waits QUEUED behind the run holding it and
/// resumes when that one ends.
#[tokio::test]
async fn a_failed_run_retried_takes_a_slot_again_or_waits_queued() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(&keyed("retry_in_line", "queue", "rq"))
        .await;
    let mut runs = RunServiceClient::new(channel(&server).await);
    let mut workers = WorkerServiceClient::new(channel(&server).await);

    let failing = start(&mut runs, "retry_in_line", json!({"tenant": "a"})).await;
    let next = start(&mut runs, "retry_in_line", json!({"tenant": "a"})).await;
    assert_eq!(next.status(), RunStatus::Queued);
    let task = poll_one(&mut workers, "rq").await;
    assert_eq!(task.run_id, failing.run_id);
    fail(&mut workers, &task).await;
    assert_eq!(
        client.wait_done(&failing.run_id, WAIT).await.status(),
        RunStatus::Failed
    );
    wait_status(&mut client, &next.run_id, RunStatus::Running).await;

    let retried = runs
        .retry_run(RetryRunRequest {
            run_id: failing.run_id.clone(),
        })
        .await
        .expect("retry")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(
        retried.status(),
        RunStatus::Queued,
        "the key's slot is taken"
    );

    let task = poll_one(&mut workers, "rq").await;
    assert_eq!(task.run_id, next.run_id);
    complete(&mut workers, &task).await;
    let task = poll_one(&mut workers, "rq").await;
    assert_eq!(
        task.run_id, failing.run_id,
        "the retry resumes in the freed slot"
    );
    assert_eq!(task.attempt, 2);
    complete(&mut workers, &task).await;
    assert_eq!(
        client.wait_done(&failing.run_id, WAIT).await.status(),
        RunStatus::Completed
    );
}

/// A key expression of the wrong type is refused at registration, naming
/// its path; a key the input cannot give refuses the start, naming `input`.
#[tokio::test]
async fn a_key_of_the_wrong_type_is_refused_at_registration_and_a_missing_one_at_start() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut workflows = WorkflowServiceClient::new(channel(&server).await);
    let source = "name: bad_key\ninput_schema: { type: object, properties: { n: { type: integer } } }\n\
                  concurrency: { key: 'input.n * 2', max: 1 }\n\
                  nodes:\n  - { id: a, type: TASK, queue: q, task: t }\n";
    let status = workflows
        .register_workflow(RegisterWorkflowRequest {
            source: source.to_owned(),
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let violations = status
        .get_details_bad_request()
        .expect("details")
        .field_violations;
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].field, "concurrency.key");
    assert!(
        violations[0].description.contains("string"),
        "{violations:?}"
    );

    let mut client = TestClient::connect(&server.url()).await;
    client.register(&keyed("needs_tenant", "queue", "nt")).await;
    let mut runs = RunServiceClient::new(channel(&server).await);
    let status = runs
        .start_run(StartRunRequest {
            workflow_name: "needs_tenant".to_owned(),
            input: Some(value_of(&json!({"tenant": 42}))),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let violations = status
        .get_details_bad_request()
        .expect("details")
        .field_violations;
    assert_eq!(violations[0].field, "input");
}

fn token(ns: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    mint(
        &NewToken {
            sub: format!("{ns}-operator"),
            ns: ns.to_owned(),
            roles: vec!["operator".to_owned()],
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

/// The same workflow name and key value in two namespaces are two keys: a
/// tenant's runs never wait for another tenant's.
#[tokio::test]
async fn a_namespace_never_shares_slots_with_another() {
    let server = ServerProcess::start(&composer_binary(), &["--auth-secret", SECRET]).await;
    let mut runs = RunServiceClient::new(channel(&server).await);
    let mut workflows = WorkflowServiceClient::new(channel(&server).await);
    let mut start_in = async |ns: &str| {
        let token = token(ns);
        workflows
            .register_workflow(authed(
                RegisterWorkflowRequest {
                    source: PER_TENANT.to_owned(),
                },
                &token,
            ))
            .await
            .expect("register");
        runs.start_run(authed(
            StartRunRequest {
                workflow_name: "per_tenant".to_owned(),
                input: Some(value_of(&json!({"tenant": "same"}))),
                ..Default::default()
            },
            &token,
        ))
        .await
        .expect("start")
        .into_inner()
        .run
        .expect("run")
    };
    let in_a = start_in("tenant-a").await;
    let in_b = start_in("tenant-b").await;
    assert_eq!(in_a.status(), RunStatus::Running);
    assert_eq!(
        in_b.status(),
        RunStatus::Running,
        "tenant-a's run holds no slot of tenant-b"
    );
    let again_in_a = start_in("tenant-a").await;
    assert_eq!(again_in_a.status(), RunStatus::Queued);
}

/// Child runs are admitted like any run: a MAP of three children of one key
/// with max 1 runs them one at a time, and the parent completes with every
/// result.
#[tokio::test]
async fn child_runs_of_one_key_run_one_at_a_time_and_the_parent_completes() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(&keyed("child_keyed", "queue", "ck")).await;
    client
        .register(
            "name: fan_out\nnodes:\n  - id: each\n    type: MAP\n    items: input.items\n    workflow: child_keyed\n    input: { tenant: \"same\", n: \"${item}\" }\n",
        )
        .await;
    let parent = client.start("fan_out", json!({"items": [1, 2, 3]})).await;
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    let mut children = Vec::new();
    for _ in 0..3 {
        let task = poll_one(&mut workers, "ck").await;
        // while this child holds the key, no other child's task is out
        assert!(poll(&mut workers, "ck", 5).await.is_empty());
        children.push(task.run_id.clone());
        complete(&mut workers, &task).await;
    }
    children.sort();
    children.dedup();
    assert_eq!(children.len(), 3);
    let done = client.wait_done(&parent, WAIT).await;
    assert_eq!(done.status(), RunStatus::Completed, "{done:?}");
}

// ------------------------------------------------------------ TASK slots

/// A TASK node with `concurrency: {key, max: 2}`; the workflow itself has
/// no key, so every run starts at once and only its task waits.
fn task_keyed(name: &str, queue: &str, max: u32, retry: &str) -> String {
    format!(
        "name: {name}\nnodes:\n  - {{ id: work, type: TASK, queue: {queue}, task: work, \
         retry: {retry}, concurrency: {{ key: \"input.key\", max: {max} }} }}\n"
    )
}

/// What the eager workers saw: per key, how many leases are out now and at
/// most; and every lease in the order it was handed out.
#[derive(Default)]
struct LeaseLog {
    out: BTreeMap<String, usize>,
    most: BTreeMap<String, usize>,
    order: Vec<(String, String)>,
}

/// A worker on one server that polls eagerly (up to 5 tasks a poll) and
/// holds each task for `hold` before completing it, many at once. A task's
/// lease is counted out before the complete is sent, so the count never
/// lags behind a slot the server freed.
fn spawn_holding_worker(
    mut workers: WorkerServiceClient<Channel>,
    queue: &'static str,
    hold: Duration,
    log: Arc<std::sync::Mutex<LeaseLog>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut holding = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            for task in poll(&mut workers, queue, 5).await {
                let key = json_key(&task);
                {
                    let mut log = log.lock().expect("log");
                    let out = log.out.entry(key.clone()).or_default();
                    *out += 1;
                    let now = *out;
                    let most = log.most.entry(key.clone()).or_default();
                    *most = (*most).max(now);
                    log.order.push((key.clone(), task.run_id.clone()));
                }
                let mut workers = workers.clone();
                let log = Arc::clone(&log);
                holding.push(tokio::spawn(async move {
                    tokio::time::sleep(hold).await;
                    *log.lock().expect("log").out.entry(key).or_default() -= 1;
                    complete(&mut workers, &task).await;
                }));
            }
        }
        for task in holding {
            task.await.expect("holder");
        }
    })
}

fn json_key(task: &Task) -> String {
    let input = composer_testkit::worker::json_of(task.input.clone().expect("input"));
    input["key"].as_str().expect("key").to_owned()
}

/// TASK concurrency max 2 (issue 17 point 4): ten runs of key `a` and three
/// of `b`, through two servers, with a worker on each that takes every task
/// it can and holds it 200 ms. At no moment are more than two tasks of a
/// key leased; `b` is not held back by `a`'s queue; every run completes;
/// per key the tasks are handed out in the order their runs arrived (two
/// freed at once may swap: each slot's own line is in order).
#[tokio::test]
async fn task_slots_allow_max_tasks_per_key_across_servers_in_arrival_order() {
    let database_url = composer_testkit::fresh_database().await;
    let redis_url = composer_testkit::fresh_redis_url();
    let first = ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let second =
        ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let mut client = TestClient::connect(&first.url()).await;
    client
        .register(&task_keyed("task_slots", "tslot", 2, "{ max_attempts: 1 }"))
        .await;

    let log = Arc::new(std::sync::Mutex::new(LeaseLog::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let hold = Duration::from_millis(200);
    let worker_a = spawn_holding_worker(
        WorkerServiceClient::new(channel(&first).await),
        "tslot",
        hold,
        Arc::clone(&log),
        Arc::clone(&stop),
    );
    let worker_b = spawn_holding_worker(
        WorkerServiceClient::new(channel(&second).await),
        "tslot",
        hold,
        Arc::clone(&log),
        Arc::clone(&stop),
    );

    let mut runs_first = RunServiceClient::new(channel(&first).await);
    let mut runs_second = RunServiceClient::new(channel(&second).await);
    let mut arrival: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..13 {
        let key = if i < 10 { "a" } else { "b" };
        let runs = if i % 2 == 0 {
            &mut runs_first
        } else {
            &mut runs_second
        };
        let run = start(runs, "task_slots", json!({ "key": key, "i": i })).await;
        assert_eq!(run.status(), RunStatus::Running, "only the task waits");
        arrival.entry(key.to_owned()).or_default().push(run.run_id);
    }
    for run_id in arrival.values().flatten() {
        let run = client.wait_done(run_id, Duration::from_secs(120)).await;
        assert_eq!(run.status(), RunStatus::Completed, "{run:?}");
    }
    stop.store(true, Ordering::Relaxed);
    worker_a.await.expect("worker");
    worker_b.await.expect("worker");

    let log = log.lock().expect("log");
    assert_eq!(log.order.len(), 13, "one lease per task: {:?}", log.order);
    assert_eq!(log.most.get("a"), Some(&2), "{:?}", log.most);
    assert_eq!(log.most.get("b"), Some(&2), "{:?}", log.most);
    // b's three tasks are all out before a's queue of ten has drained
    let last_of = |key: &str| {
        log.order
            .iter()
            .rposition(|(k, _)| k == key)
            .expect("leased")
    };
    assert!(
        last_of("b") < last_of("a"),
        "b waited behind a: {:?}",
        log.order
    );
    for (key, runs) in &arrival {
        let leased: Vec<&String> = log
            .order
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, run)| run)
            .collect();
        let position = |run: &String| leased.iter().position(|r| *r == run).expect("leased");
        for (i, earlier) in runs.iter().enumerate() {
            for later in runs.iter().skip(i + 2) {
                assert!(
                    position(earlier) < position(later),
                    "key {key}: {later} was handed out before {earlier}, two arrivals earlier: {leased:?}"
                );
            }
        }
    }
}

/// A task with a key that fails and is retried gives its slot back while it
/// waits for the retry, and its retry takes a slot again: with max 1, the
/// next run's task runs in between, and the retry waits for it to finish.
#[tokio::test]
async fn a_failed_task_frees_its_slot_and_its_retry_takes_one_again() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(&task_keyed(
            "task_retry",
            "tretry",
            1,
            "{ max_attempts: 2, initial_interval: 200ms }",
        ))
        .await;
    let mut runs = RunServiceClient::new(channel(&server).await);
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    let first = start(&mut runs, "task_retry", json!({"key": "k"})).await;
    let second = start(&mut runs, "task_retry", json!({"key": "k"})).await;

    let attempt_one = poll_one(&mut workers, "tretry").await;
    assert_eq!(attempt_one.run_id, first.run_id);
    assert!(poll(&mut workers, "tretry", 5).await.is_empty(), "max 1");
    workers
        .fail_task(FailTaskRequest {
            task_id: attempt_one.task_id.clone(),
            attempt: attempt_one.attempt,
            lease_token: attempt_one.lease_token.clone(),
            error_code: "FLAKY".to_owned(),
            message: "try again".to_owned(),
            retryable: true,
            details: None,
        })
        .await
        .expect("fail");

    // the failed task's slot went to the second run's task
    let other = poll_one(&mut workers, "tretry").await;
    assert_eq!(other.run_id, second.run_id);
    // the retry (due after 200 ms) waits while the second holds the slot
    assert!(poll(&mut workers, "tretry", 5).await.is_empty());
    assert!(poll(&mut workers, "tretry", 5).await.is_empty());
    complete(&mut workers, &other).await;
    let attempt_two = poll_one(&mut workers, "tretry").await;
    assert_eq!(
        (attempt_two.run_id.as_str(), attempt_two.attempt),
        (first.run_id.as_str(), 2)
    );
    complete(&mut workers, &attempt_two).await;
    for run in [&first, &second] {
        let done = client.wait_done(&run.run_id, WAIT).await;
        assert_eq!(done.status(), RunStatus::Completed, "{done:?}");
    }
}

/// Cancelling a run whose task holds the slot hands the slot on; a waiting
/// task whose run is cancelled leaves the line without taking one.
#[tokio::test]
async fn cancelling_a_run_frees_its_task_slot_for_the_next_in_line() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(&task_keyed(
            "task_cancel",
            "tcancel",
            1,
            "{ max_attempts: 1 }",
        ))
        .await;
    let mut runs = RunServiceClient::new(channel(&server).await);
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    let holder = start(&mut runs, "task_cancel", json!({"key": "k"})).await;
    let waiting = start(&mut runs, "task_cancel", json!({"key": "k"})).await;
    let third = start(&mut runs, "task_cancel", json!({"key": "k"})).await;
    let held = poll_one(&mut workers, "tcancel").await;
    assert_eq!(held.run_id, holder.run_id);

    for run in [&waiting, &holder] {
        runs.cancel_run(CancelRunRequest {
            run_id: run.run_id.clone(),
            reason: "not needed".to_owned(),
        })
        .await
        .expect("cancel");
        let done = client.wait_done(&run.run_id, WAIT).await;
        assert_eq!(done.status(), RunStatus::Cancelled);
    }
    let next = poll_one(&mut workers, "tcancel").await;
    assert_eq!(
        next.run_id, third.run_id,
        "the cancelled waiter took no slot"
    );
    complete(&mut workers, &next).await;
    let done = client.wait_done(&third.run_id, WAIT).await;
    assert_eq!(done.status(), RunStatus::Completed);
}

/// A waiting task of a paused run is handed its slot HELD, not dispatched:
/// no worker gets it, and it keeps the slot until the run resumes.
#[tokio::test]
async fn a_waiting_task_of_a_paused_run_takes_its_slot_held_and_runs_on_resume() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(&task_keyed(
            "task_pause",
            "tpause",
            1,
            "{ max_attempts: 1 }",
        ))
        .await;
    let mut runs = RunServiceClient::new(channel(&server).await);
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    let first = start(&mut runs, "task_pause", json!({"key": "k"})).await;
    let paused = start(&mut runs, "task_pause", json!({"key": "k"})).await;
    let held = poll_one(&mut workers, "tpause").await;
    assert_eq!(held.run_id, first.run_id);
    runs.pause_run(PauseRunRequest {
        run_id: paused.run_id.clone(),
        reason: "hold on".to_owned(),
    })
    .await
    .expect("pause");

    complete(&mut workers, &held).await;
    client.wait_done(&first.run_id, WAIT).await;
    let later = start(&mut runs, "task_pause", json!({"key": "k"})).await;
    // the paused run's task holds the slot (HELD): nothing is handed out
    assert!(poll(&mut workers, "tpause", 5).await.is_empty());
    assert!(poll(&mut workers, "tpause", 5).await.is_empty());

    runs.resume_run(ResumeRunRequest {
        run_id: paused.run_id.clone(),
    })
    .await
    .expect("resume");
    let resumed = poll_one(&mut workers, "tpause").await;
    assert_eq!(resumed.run_id, paused.run_id);
    assert!(poll(&mut workers, "tpause", 5).await.is_empty(), "max 1");
    complete(&mut workers, &resumed).await;
    let last = poll_one(&mut workers, "tpause").await;
    assert_eq!(last.run_id, later.run_id);
    complete(&mut workers, &last).await;
    for run in [&paused, &later] {
        let done = client.wait_done(&run.run_id, WAIT).await;
        assert_eq!(done.status(), RunStatus::Completed, "{done:?}");
    }
}

/// A TASK node's key that does not type as a string is refused at
/// registration, naming its path.
#[tokio::test]
async fn a_task_key_of_the_wrong_type_is_refused_naming_its_path() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut workflows = WorkflowServiceClient::new(channel(&server).await);
    let source = "name: bad_task_key\n\
                  input_schema: { type: object, properties: { n: { type: integer } } }\n\
                  nodes:\n  - { id: a, type: TASK, queue: q, task: t }\n  \
                  - { id: b, type: TASK, queue: q, task: t, concurrency: { key: 'input.n * 2', max: 2 } }\n\
                  edges:\n  - { from: a, to: b }\n";
    let status = workflows
        .register_workflow(RegisterWorkflowRequest {
            source: source.to_owned(),
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let violations = status
        .get_details_bad_request()
        .expect("details")
        .field_violations;
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].field, "nodes[1].concurrency.key");
    assert!(
        violations[0].description.contains("string"),
        "{violations:?}"
    );
}

/// A keyed task whose lease expires gives its slot back in the expiry's
/// transaction, and its retry asks for a slot again like a new arrival.
#[tokio::test]
async fn an_expired_lease_frees_its_slot_and_the_retry_waits_for_one() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(
            "name: task_expiry\nnodes:\n  - { id: work, type: TASK, queue: texpiry, task: work, \
             heartbeat_timeout: 3s, retry: { max_attempts: 2, initial_interval: 100ms }, \
             concurrency: { key: \"input.key\", max: 1 } }\n",
        )
        .await;
    let mut runs = RunServiceClient::new(channel(&server).await);
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    let first = start(&mut runs, "task_expiry", json!({"key": "k"})).await;
    let second = start(&mut runs, "task_expiry", json!({"key": "k"})).await;
    let abandoned = poll_one(&mut workers, "texpiry").await;
    assert_eq!(abandoned.run_id, first.run_id);

    // no heartbeat: the lease expires and the slot goes to the second run,
    // whose own lease (3 s) outlives the one-second poll below
    let other = poll_one(&mut workers, "texpiry").await;
    assert_eq!(other.run_id, second.run_id);
    let early: Vec<_> = poll(&mut workers, "texpiry", 5)
        .await
        .into_iter()
        .map(|t| (t.run_id == first.run_id, t.attempt))
        .collect();
    assert!(
        early.is_empty(),
        "the retry waits: (first run?, attempt) {early:?}"
    );
    complete(&mut workers, &other).await;
    let retry = poll_one(&mut workers, "texpiry").await;
    assert_eq!(
        (retry.run_id.as_str(), retry.attempt),
        (first.run_id.as_str(), 2)
    );
    complete(&mut workers, &retry).await;
    for run in [&first, &second] {
        let done = client.wait_done(&run.run_id, WAIT).await;
        assert_eq!(done.status(), RunStatus::Completed, "{done:?}");
    }
}
