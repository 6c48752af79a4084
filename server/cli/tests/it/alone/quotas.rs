//! Per-namespace quotas against the real server (decision 0038,
//! docs/operations.md "Quotas"): a namespace over a quota is refused with
//! RESOURCE_EXHAUSTED naming the quota (google.rpc.QuotaFailure, RetryInfo,
//! ErrorInfo `QUOTA_EXCEEDED`) while other namespaces and tokens are
//! untouched; the quotas come from `--quotas-file`, read again on SIGHUP
//! and when the file changes.

use crate::common;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::{SECRET, authed, channel, composer_binary, register, token};
use composer_proto::v1::{
    CreateScheduleRequest, DeleteScheduleRequest, PollTasksRequest, PollTasksResponse,
    QueueRateLimit, RunStatus, ScheduleAction, ScheduleSpec, SetQueueRateLimitRequest,
    StartRunRequest, WatchRunRequest, WatchRunResponse, queue_service_client::QueueServiceClient,
    run_service_client::RunServiceClient, schedule_service_client::ScheduleServiceClient,
    worker_service_client::WorkerServiceClient,
};
use composer_testkit::{
    ServerProcess,
    client::TestClient,
    worker::{Outcome, TestWorker, value_of},
};
use futures::StreamExt;
use serde_json::json;
use tonic::{Code, Status, Streaming, transport::Channel};
use tonic_types::StatusExt;

const WAIT: Duration = Duration::from_secs(120);
/// A run that waits until told: it stays open for as long as a test needs.
const WAITING: &str = "name: waiting\nnodes:\n  - { id: go, type: WAIT_FOR_EVENT, event: go }\n";

/// A quotas file holding `yaml`, kept while the returned directory lives.
fn quotas_file(yaml: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("quotas.yaml");
    std::fs::write(&path, yaml).expect("write quotas");
    (dir, path)
}

/// A server checking tokens, with the quotas file `path` and `extra`.
async fn server_with_tokens(path: &Path, extra: &[&str]) -> ServerProcess {
    let path = path.to_str().expect("utf-8 path");
    let mut args = vec![
        "--auth-secret",
        SECRET,
        "--auth-audience",
        "composer",
        "--quotas-file",
        path,
    ];
    args.extend_from_slice(extra);
    ServerProcess::start(&composer_binary(), &args).await
}

/// A server without tokens, with the quotas file `path`, and the address
/// of its metrics.
async fn server_with_metrics(path: &Path) -> (ServerProcess, String) {
    let metrics = common::free_addr();
    let path = path.to_str().expect("utf-8 path");
    let args = ["--quotas-file", path, "--metrics-listen", &metrics];
    (
        ServerProcess::start(&composer_binary(), &args).await,
        metrics,
    )
}

fn start_request(workflow: &str, input: serde_json::Value) -> StartRunRequest {
    StartRunRequest {
        workflow_name: workflow.to_owned(),
        input: Some(value_of(&input)),
        ..Default::default()
    }
}

async fn start(channel: &Channel, token: &str, workflow: &str) -> Result<String, Status> {
    let response = RunServiceClient::new(channel.clone())
        .start_run(authed(start_request(workflow, json!({})), token))
        .await?;
    Ok(response.into_inner().run.expect("run").run_id)
}

/// What a quota refusal says: the quota (ErrorInfo), the QuotaFailure
/// subject and description, and the RetryInfo delay. Checks that every
/// part is there and names the same quota.
struct Refusal {
    quota: String,
    subject: String,
    description: String,
    retry: Duration,
}

fn refusal(status: &Status) -> Refusal {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let info = status.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "QUOTA_EXCEEDED", "{status:?}");
    let quota = info.metadata.get("quota").expect("the quota").clone();
    let failure = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(failure.violations.len(), 1, "{status:?}");
    let violation = &failure.violations[0];
    let retry = status
        .get_details_retry_info()
        .expect("RetryInfo")
        .retry_delay
        .expect("a retry delay");
    assert!(
        status.message().contains(&quota),
        "the message names the quota: {status:?}"
    );
    assert!(
        violation.description.contains(&quota),
        "the violation names the quota: {status:?}"
    );
    assert!(retry > Duration::ZERO, "{status:?}");
    Refusal {
        quota,
        subject: violation.subject.clone(),
        description: violation.description.clone(),
        retry,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// The value of `metric` with all of `labels`, from the metrics port.
async fn metric(addr: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .filter(|line| line.starts_with(&format!("{metric}{{")))
        .find(|line| labels.iter().all(|l| line.contains(l)))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// Waits (up to 10 s) until `metric` reaches `at_least`; returns its value.
async fn metric_reaching(addr: &str, name: &str, labels: &[&str], at_least: f64) -> f64 {
    let mut value = 0.0;
    for _ in 0..100 {
        value = metric(addr, name, labels).await.unwrap_or(0.0);
        if value >= at_least {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    value
}

/// Retries `attempt` every 100 ms until it returns Some, for at most 10 s.
async fn eventually<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(done) = attempt().await {
            return done;
        }
        assert!(Instant::now() < deadline, "{what} within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_namespace_flooding_start_run_is_throttled_while_another_keeps_starting_runs() {
    const RATE: usize = 5;
    const FLOODERS: usize = 8;
    const FLOOD: Duration = Duration::from_secs(3);
    let (_dir, path) = quotas_file(&format!(
        "namespaces:\n  flood:\n    writes_per_second: {RATE}\n"
    ));
    let metrics = common::free_addr();
    let server = server_with_tokens(&path, &["--metrics-listen", &metrics]).await;
    let channel = channel(&server).await;
    let flood = token("flood", "ci", &["operator"]);
    let calm = token("calm", "ci", &["operator"]);
    register(&channel, &flood, WAITING).await;
    register(&channel, &calm, WAITING).await;

    let began = Instant::now();
    let mut flooders = Vec::new();
    for _ in 0..FLOODERS {
        let (channel, flood) = (channel.clone(), flood.clone());
        flooders.push(tokio::spawn(async move {
            let (mut accepted, mut refused) = (0_usize, Vec::new());
            while began.elapsed() < FLOOD {
                match start(&channel, &flood, "waiting").await {
                    Ok(_) => accepted += 1,
                    Err(status) if status.code() == Code::ResourceExhausted => {
                        refused.push(status);
                    }
                    Err(status) => panic!("the flood got {status:?}"),
                }
            }
            (accepted, refused)
        }));
    }
    // the calm namespace's client on a thread and connection of its own,
    // so its latencies are the server's, not the flooders' client's
    let url = server.url();
    let calm_client = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let channel = Channel::from_shared(url)
                .expect("url")
                .connect()
                .await
                .expect("connect");
            let mut latencies = Vec::new();
            while began.elapsed() < FLOOD {
                let sent = Instant::now();
                start(&channel, &calm, "waiting")
                    .await
                    .expect("the other namespace keeps starting runs");
                latencies.push(sent.elapsed());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            latencies
        })
    });
    let mut latencies = tokio::task::spawn_blocking(move || calm_client.join())
        .await
        .expect("join")
        .expect("the calm client");
    let (mut accepted, mut refusals) = (0, Vec::new());
    for flooder in flooders {
        let (a, r) = flooder.await.expect("flooder");
        accepted += a;
        refusals.extend(r);
    }
    let elapsed = began.elapsed();
    latencies.sort();
    println!(
        "namespace flood: {accepted} StartRuns accepted, {} throttled in {:.1} s; namespace \
         calm: {} StartRuns, p50 {:?}, p99 {:?}, max {:?}",
        refusals.len(),
        elapsed.as_secs_f64(),
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().expect("calm started runs"),
    );

    assert!(!refusals.is_empty(), "the flood went over its quota");
    // the burst (one second of the rate) and the rate since: the mechanism
    // holds it exactly; a margin of one second for the clocks
    let allowed = RATE + RATE * (elapsed.as_secs() as usize + 1);
    assert!(
        accepted <= allowed,
        "{accepted} accepted, more than {allowed} for {RATE}/s over {elapsed:?}"
    );
    let first = refusal(&refusals[0]);
    assert_eq!(first.quota, "writes_per_second");
    assert_eq!(first.subject, "namespace:flood");
    assert!(
        first
            .description
            .contains(&format!("at most {RATE} writing calls per second")),
        "{}",
        first.description
    );
    assert!(first.retry <= Duration::from_secs(1), "{:?}", first.retry);

    let counted = metric_reaching(
        &metrics,
        "composer_quota_throttled_total",
        &["namespace=\"flood\"", "quota=\"writes_per_second\""],
        refusals.len() as f64,
    )
    .await;
    assert_eq!(
        counted,
        refusals.len() as f64,
        "every refusal is counted for its namespace and quota"
    );
    assert!(
        metric(
            &metrics,
            "composer_quota_throttled_total",
            &["namespace=\"calm\""]
        )
        .await
        .is_none(),
        "the calm namespace was never throttled"
    );
}

async fn watch(
    channel: &Channel,
    token: &str,
    run_id: &str,
) -> Result<Streaming<WatchRunResponse>, Status> {
    let mut stream = RunServiceClient::new(channel.clone())
        .watch_run(authed(
            WatchRunRequest {
                run_id: run_id.to_owned(),
            },
            token,
        ))
        .await?
        .into_inner();
    // the first snapshot: the stream is open on the server
    stream
        .message()
        .await?
        .expect("a first snapshot of the run");
    Ok(stream)
}

fn poll_request(wait: Duration) -> PollTasksRequest {
    PollTasksRequest {
        worker_id: "quota-test".to_owned(),
        queues: vec!["nothing-here".to_owned()],
        max_tasks: 1,
        wait: Some(prost_types::Duration {
            seconds: i64::try_from(wait.as_secs()).expect("seconds"),
            nanos: 0,
        }),
        confirm_receipt: false,
    }
}

/// A poll that waits a minute, in the background.
fn long_poll(
    channel: &Channel,
    token: &str,
) -> tokio::task::JoinHandle<Result<tonic::Response<PollTasksResponse>, Status>> {
    let mut workers = WorkerServiceClient::new(channel.clone());
    let request = authed(poll_request(Duration::from_secs(60)), token);
    tokio::spawn(async move { workers.poll_tasks(request).await })
}

/// A poll that returns at once: Ok when it was let in.
async fn quick_poll(channel: &Channel, token: &str) -> Result<(), Status> {
    WorkerServiceClient::new(channel.clone())
        .poll_tasks(authed(poll_request(Duration::ZERO), token))
        .await
        .map(|_| ())
}

/// Waits until the long polls `polls` of `token` all wait on the server,
/// as a quick poll of `token` then is refused, and returns that refusal.
/// A probe may reach the server before a long poll sent earlier and take
/// its place: a long poll refused so is sent again.
async fn refused_poll(
    channel: &Channel,
    token: &str,
    polls: &mut [tokio::task::JoinHandle<Result<tonic::Response<PollTasksResponse>, Status>>],
) -> Status {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for poll in polls.iter_mut() {
            if poll.is_finished() {
                *poll = long_poll(channel, token);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Err(refused) = quick_poll(channel, token).await {
            return refused;
        }
        assert!(Instant::now() < deadline, "a poll refused within 10 s");
    }
}

#[tokio::test]
async fn streams_and_long_polls_past_their_token_and_namespace_limits_are_refused() {
    let (_dir, path) = quotas_file(
        "namespaces:\n  tight:\n    watch_streams: 4\n    watch_streams_per_token: 3\n    \
         long_polls: 4\n    long_polls_per_token: 3\n",
    );
    let server = server_with_tokens(&path, &[]).await;
    let channel = channel(&server).await;
    let operator = token("tight", "ops", &["operator"]);
    let other_operator = token("other", "ops", &["operator"]);
    register(&channel, &operator, WAITING).await;
    register(&channel, &other_operator, WAITING).await;
    let run = start(&channel, &operator, "waiting").await.expect("run");
    let other_run = start(&channel, &other_operator, "waiting")
        .await
        .expect("run");

    // WatchRun: three per token, four in the namespace
    let alice = token("tight", "alice", &["reader"]);
    let bob = token("tight", "bob", &["reader"]);
    let mut alices = Vec::new();
    for _ in 0..3 {
        alices.push(
            watch(&channel, &alice, &run)
                .await
                .expect("alice's streams"),
        );
    }
    let refused = refusal(
        &watch(&channel, &alice, &run)
            .await
            .expect_err("alice's fourth stream"),
    );
    assert_eq!(refused.quota, "watch_streams_per_token");
    assert_eq!(refused.subject, "token:tight/alice");
    let bobs = watch(&channel, &bob, &run)
        .await
        .expect("another token of the namespace");
    let refused = refusal(
        &watch(&channel, &bob, &run)
            .await
            .expect_err("the namespace's fifth stream"),
    );
    assert_eq!(refused.quota, "watch_streams");
    assert_eq!(refused.subject, "namespace:tight");
    assert!(
        refused.description.contains("at most 4"),
        "{}",
        refused.description
    );
    // the same subject in another namespace is another token, unaffected
    let elsewhere = token("other", "alice", &["reader"]);
    let mut others = Vec::new();
    for _ in 0..5 {
        others.push(
            watch(&channel, &elsewhere, &other_run)
                .await
                .expect("another namespace"),
        );
    }
    // a stream closed gives its place back
    alices.pop();
    let reopened = eventually("a closed stream's place back", || async {
        watch(&channel, &bob, &run).await.ok()
    })
    .await;
    drop((alices, bobs, reopened, others));

    // PollTasks: three waiting per token, four in the namespace
    let walter = token("tight", "walter", &["worker"]);
    let wendy = token("tight", "wendy", &["worker"]);
    let mut walters: Vec<_> = (0..3).map(|_| long_poll(&channel, &walter)).collect();
    let refused = refusal(&refused_poll(&channel, &walter, &mut walters).await);
    assert_eq!(refused.quota, "long_polls_per_token");
    assert_eq!(refused.subject, "token:tight/walter");
    let mut wendys = [long_poll(&channel, &wendy)];
    let refused = refusal(&refused_poll(&channel, &wendy, &mut wendys).await);
    assert_eq!(refused.quota, "long_polls");
    assert_eq!(refused.subject, "namespace:tight");
    let outsider = token("other", "walter", &["worker"]);
    let outsiders: Vec<_> = (0..5).map(|_| long_poll(&channel, &outsider)).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    quick_poll(&channel, &outsider)
        .await
        .expect("another namespace polls");
    // a poll that ends (here: its caller gives up) gives its place back
    walters.pop().expect("a poll").abort();
    eventually("a finished poll's place back", || async {
        quick_poll(&channel, &wendy).await.ok()
    })
    .await;
    for poll in walters.into_iter().chain(wendys).chain(outsiders) {
        poll.abort();
    }
}

fn schedule(id: &str) -> CreateScheduleRequest {
    CreateScheduleRequest {
        schedule_id: id.to_owned(),
        spec: Some(ScheduleSpec {
            interval: Some(prost_types::Duration {
                seconds: 3600,
                nanos: 0,
            }),
            ..Default::default()
        }),
        action: Some(ScheduleAction {
            workflow_name: "waiting".to_owned(),
            ..Default::default()
        }),
        paused: true,
        ..Default::default()
    }
}

async fn create_schedule(channel: &Channel, token: &str, id: &str) -> Result<(), Status> {
    ScheduleServiceClient::new(channel.clone())
        .create_schedule(authed(schedule(id), token))
        .await
        .map(|_| ())
}

#[tokio::test]
async fn schedules_past_the_quota_are_refused_and_the_file_is_followed_while_serving() {
    let (_dir, path) = quotas_file("namespaces:\n  few:\n    schedules: 2\n");
    let server = server_with_tokens(&path, &[]).await;
    let channel = channel(&server).await;
    let few = token("few", "ops", &["operator"]);
    let many = token("many", "ops", &["operator"]);
    register(&channel, &few, WAITING).await;
    register(&channel, &many, WAITING).await;

    for id in ["s1", "s2"] {
        create_schedule(&channel, &few, id).await.expect("within");
    }
    let refused = refusal(
        &create_schedule(&channel, &few, "s3")
            .await
            .expect_err("a third schedule"),
    );
    assert_eq!(refused.quota, "schedules");
    assert_eq!(refused.subject, "namespace:few");
    assert!(
        refused.description.contains("at most 2 schedules"),
        "{}",
        refused.description
    );
    for id in ["s1", "s2", "s3", "s4"] {
        create_schedule(&channel, &many, id)
            .await
            .expect("another namespace has the default quota");
    }
    // a deleted schedule frees its place
    ScheduleServiceClient::new(channel.clone())
        .delete_schedule(authed(
            DeleteScheduleRequest {
                schedule_id: "s2".to_owned(),
            },
            &few,
        ))
        .await
        .expect("delete");
    create_schedule(&channel, &few, "s2b")
        .await
        .expect("the freed place");

    // raised, then read again on SIGHUP
    std::fs::write(&path, "namespaces:\n  few:\n    schedules: 3\n").expect("rewrite");
    server.signal(nix::sys::signal::Signal::SIGHUP);
    eventually("the raised quota after SIGHUP", || async {
        create_schedule(&channel, &few, "s3").await.ok()
    })
    .await;
    assert_eq!(
        refusal(
            &create_schedule(&channel, &few, "s4")
                .await
                .expect_err("past the raised quota")
        )
        .quota,
        "schedules"
    );

    // raised again with no signal: the change itself is noticed
    std::fs::write(&path, "namespaces:\n  few:\n    schedules: 4\n").expect("rewrite");
    eventually("the file's change noticed", || async {
        create_schedule(&channel, &few, "s4").await.ok()
    })
    .await;

    // a broken file is reported and the quotas in force stay
    std::fs::write(&path, "namespaces:\n  few:\n    schedules: lots\n").expect("rewrite");
    server.signal(nix::sys::signal::Signal::SIGHUP);
    eventually("the broken file reported", || async {
        server
            .stderr_lines()
            .iter()
            .any(|l| l.contains("quotas file invalid"))
            .then_some(())
    })
    .await;
    assert_eq!(
        refusal(
            &create_schedule(&channel, &few, "s5")
                .await
                .expect_err("the quota in force stays")
        )
        .quota,
        "schedules"
    );
}

/// A MAP arming one task per item at once, on a queue nobody polls.
const FAN_OUT: &str = "name: fan_out\nnodes:\n  - { id: each, type: MAP, items: input.items, concurrency: \
                       1000, queue: unpolled, task: work }\n";

#[tokio::test]
async fn a_namespace_that_armed_more_tasks_than_its_rate_cannot_start_runs_until_repaid() {
    let (_dir, path) =
        quotas_file("namespaces:\n  default:\n    tasks_per_second: 100\n    tasks_burst: 100\n");
    let (server, metrics) = server_with_metrics(&path).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(FAN_OUT).await;
    let items: Vec<u32> = (0..300).collect();
    // one call arms 300 tasks: admitted (the bucket held something), then
    // 200 tasks in debt, repaid at 100 a second; the next start of fan_out
    // is expected to arm 300 too, so it also waits for a full bucket (100)
    client.start("fan_out", json!({ "items": items })).await;
    let refused = client
        .runs
        .start_run(start_request("fan_out", json!({ "items": [1] })))
        .await
        .expect_err("the namespace is in debt");
    let refused = refusal(&refused);
    assert_eq!(refused.quota, "tasks_per_second");
    assert_eq!(refused.subject, "namespace:default");
    assert!(
        refused.retry > Duration::from_millis(2_200) && refused.retry <= Duration::from_secs(3),
        "about 2 s of debt left, and 1 s to fill the bucket: {:?}",
        refused.retry
    );
    eventually("the debt repaid", || async {
        let mut runs = client.runs.clone();
        runs.start_run(start_request("fan_out", json!({ "items": [1] })))
            .await
            .ok()
    })
    .await;
    let throttled = metric_reaching(
        &metrics,
        "composer_quota_throttled_total",
        &["namespace=\"default\"", "quota=\"tasks_per_second\""],
        1.0,
    )
    .await;
    assert!(throttled >= 1.0, "every refusal is counted: {throttled}");
}

#[tokio::test]
async fn a_run_needing_a_concurrency_key_past_the_quota_is_refused_and_a_child_run_fails_its_node()
{
    let (_dir, path) = quotas_file("namespaces:\n  default:\n    concurrency_keys: 2\n");
    let server = ServerProcess::start(
        &composer_binary(),
        &["--quotas-file", path.to_str().expect("path")],
    )
    .await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(
            "name: keyed\nconcurrency: { key: \"input.customer\", max: 1 }\nnodes:\n  - { id: go, \
             type: WAIT_FOR_EVENT, event: go }\n",
        )
        .await;
    client
        .register(
            "name: parent\nnodes:\n  - { id: child, type: SUB_WORKFLOW, workflow: keyed, input: { \
             customer: \"${input.customer}\" }, retry: { max_attempts: 1 } }\n",
        )
        .await;
    client.start("keyed", json!({ "customer": "a" })).await;
    client.start("keyed", json!({ "customer": "b" })).await;
    let refused = client
        .runs
        .start_run(start_request("keyed", json!({ "customer": "c" })))
        .await
        .expect_err("a third key");
    let refused = refusal(&refused);
    assert_eq!(refused.quota, "concurrency_keys");
    assert_eq!(refused.subject, "namespace:default");
    assert!(
        refused.description.contains("at most 2 concurrency key"),
        "{}",
        refused.description
    );
    // a key in use takes no new place: the run waits for its slot
    let queued = client.start("keyed", json!({ "customer": "a" })).await;
    assert_eq!(client.get(&queued).await.status(), RunStatus::Queued);

    // a child run needing a new key fails its node with QUOTA_EXCEEDED
    let parent = client.start("parent", json!({ "customer": "z" })).await;
    let ended = client.wait_done(&parent, WAIT).await;
    assert_eq!(ended.status(), RunStatus::Failed, "{ended:#?}");
    let said = format!("{ended:?}");
    assert!(said.contains("QUOTA_EXCEEDED"), "{ended:#?}");
    assert!(said.contains("concurrency_keys"), "{ended:#?}");
}

#[tokio::test]
async fn a_queue_uses_at_most_its_quota_of_rate_limit_keys_and_the_rest_wait() {
    let (_dir, path) = quotas_file("namespaces:\n  default:\n    rate_limit_keys_per_queue: 2\n");
    let (server, metrics) = server_with_metrics(&path).await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(
            "name: keyed\nnodes:\n  - { id: step, type: TASK, queue: keyed, task: step, \
             rate_limit_key: \"input.key\" }\n",
        )
        .await;
    QueueServiceClient::new(channel(&server).await)
        .set_queue_rate_limit(SetQueueRateLimitRequest {
            limit: Some(QueueRateLimit {
                queue: "keyed".to_owned(),
                per_key_per_second: 1.0,
                ..Default::default()
            }),
        })
        .await
        .expect("a per-key limit");
    // every task is dispatched before a worker polls: one hand-out sees
    // all four keys at once
    let mut runs = Vec::new();
    for key in ["k1", "k2", "k3", "k4"] {
        runs.push(client.start("keyed", json!({ "key": key })).await);
    }
    let leased_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let recorder = Arc::clone(&leased_at);
    let _worker = TestWorker::start(&server.url(), &["keyed"], 2, 4, move |lease| {
        let key = lease.input["key"].as_str().unwrap_or_default().to_owned();
        recorder
            .lock()
            .expect("leases")
            .entry(key)
            .or_insert_with(Instant::now);
        Outcome::Complete(json!({}))
    })
    .await;
    for run in &runs {
        assert_eq!(
            client.wait_done(run, WAIT).await.status(),
            RunStatus::Completed
        );
    }
    let leased_at = leased_at.lock().expect("leases").clone();
    assert_eq!(leased_at.len(), 4, "{leased_at:?}");
    let first = *leased_at.values().min().expect("a lease");
    let mut after: Vec<(String, Duration)> = leased_at
        .iter()
        .map(|(key, at)| (key.clone(), at.duration_since(first)))
        .collect();
    after.sort_by_key(|(_, d)| *d);
    println!("leased after the first: {after:?}");
    // a key past the two live buckets waits until one expires (seconds,
    // at this rate); without the quota all four go at once
    let early = after
        .iter()
        .filter(|(_, d)| *d < Duration::from_secs(1))
        .count();
    assert_eq!(early, 2, "two keys at once, the others later: {after:?}");
    let held = metric_reaching(
        &metrics,
        "composer_quota_throttled_total",
        &[
            "namespace=\"default\"",
            "quota=\"rate_limit_keys_per_queue\"",
        ],
        1.0,
    )
    .await;
    assert!(held >= 1.0, "tasks held back by the key quota are counted");
}

/// An upload that sends one chunk and then waits forever: it holds its
/// place until the task is aborted.
fn stalled_upload(channel: &Channel, token: &str) -> tokio::task::JoinHandle<Result<(), Status>> {
    let channel = channel.clone();
    let request = authed(
        futures::stream::iter([composer_proto::v1::UploadBlobRequest {
            data: b"\"partial".to_vec().into(),
        }])
        .chain(futures::stream::pending()),
        token,
    );
    tokio::spawn(async move {
        composer_proto::v1::blob_service_client::BlobServiceClient::new(channel)
            .upload_blob(request)
            .await
            .map(|_| ())
    })
}

async fn upload(channel: &Channel, token: &str, text: &str) -> Result<String, Status> {
    let chunk = composer_proto::v1::UploadBlobRequest {
        data: text.as_bytes().to_vec().into(),
    };
    let answer = composer_proto::v1::blob_service_client::BlobServiceClient::new(channel.clone())
        .upload_blob(authed(futures::stream::iter([chunk]), token))
        .await?;
    Ok(answer.into_inner().blob.expect("reference").sha256)
}

#[tokio::test]
async fn blob_transfers_past_their_limits_are_refused_while_another_namespace_uploads() {
    let (_dir, path) = quotas_file(
        "namespaces:\n  tight:\n    blob_transfers: 3\n    blob_transfers_per_token: 2\n",
    );
    let server = server_with_tokens(&path, &[]).await;
    let channel = channel(&server).await;
    let alice = token("tight", "alice", &["client"]);
    let bob = token("tight", "bob", &["client"]);
    let other = token("other", "carol", &["client"]);

    // alice holds two uploads open: her token's two
    let mut held: Vec<_> = (0..2).map(|_| stalled_upload(&channel, &alice)).collect();
    // both admitted before a third tries (a third first would take a place)
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        held.iter().all(|u| !u.is_finished()),
        "a stalled upload ended"
    );
    let refused = eventually("alice's third upload refused", || async {
        upload(&channel, &alice, "\"a\"").await.err()
    })
    .await;
    let refused = refusal(&refused);
    assert_eq!(refused.quota, "blob_transfers_per_token");
    assert_eq!(refused.subject, "token:tight/alice");
    // bob holds one more: the namespace's three
    held.push(stalled_upload(&channel, &bob));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        held.iter().all(|u| !u.is_finished()),
        "a stalled upload ended"
    );
    let refused = eventually("bob's second upload refused", || async {
        upload(&channel, &bob, "\"b\"").await.err()
    })
    .await;
    let refused = refusal(&refused);
    assert_eq!(refused.quota, "blob_transfers");
    assert_eq!(refused.subject, "namespace:tight");

    // another namespace uploads meanwhile, and its uploads take their time
    let mut took = Vec::new();
    for n in 0..20 {
        let began = Instant::now();
        upload(&channel, &other, &format!("\"other {n}\""))
            .await
            .expect("another namespace uploads");
        took.push(began.elapsed());
    }
    took.sort();
    eprintln!(
        "another namespace's uploads while tight is full: p50 {:?}, max {:?}",
        percentile(&took, 0.5),
        took[took.len() - 1]
    );

    // a place given back is taken again
    for upload in held {
        upload.abort();
    }
    eventually("tight uploads again", || async {
        upload(&channel, &alice, "\"again\"").await.ok()
    })
    .await;
}
