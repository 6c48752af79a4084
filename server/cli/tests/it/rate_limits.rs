//! Queue rate limits end to end (issue 17, decision 0021): the real binary
//! on real Postgres and Redis, workers played through the raw worker
//! protocol, each task's hand-out time read from its lease as the server
//! wrote it (`lease_expire_time - lease_duration`), and each grant's time
//! read from its bucket's log in Redis, the clock the limit is kept in.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use composer_coordinator::dispatch::rate_limit::{key_bucket_key, queue_bucket_key};
use composer_grpc::auth::{NewToken, SigningKey, mint};
use composer_proto::v1::{
    CompleteTaskRequest, DeleteQueueRateLimitRequest, GetQueueRateLimitRequest,
    ListQueueRateLimitsRequest, PollTasksRequest, QueueRateLimit, RegisterWorkflowRequest,
    SetQueueRateLimitRequest, StartRunRequest, Task, queue_service_client::QueueServiceClient,
    run_service_client::RunServiceClient, worker_service_client::WorkerServiceClient,
    workflow_service_client::WorkflowServiceClient,
};
use composer_testkit::{ServerProcess, client::TestClient, fresh_database, fresh_redis_url};
use serde_json::json;
use tonic::{Code, Request, Status, transport::Channel};
use tonic_types::StatusExt;

use crate::common::violated_field;

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

fn limit(queue: &str, per_second: f64, burst: i32) -> QueueRateLimit {
    QueueRateLimit {
        queue: queue.to_owned(),
        per_second,
        burst,
        ..QueueRateLimit::default()
    }
}

async fn set_limit(
    queues: &mut QueueServiceClient<Channel>,
    limit: QueueRateLimit,
) -> Result<QueueRateLimit, Status> {
    Ok(queues
        .set_queue_rate_limit(SetQueueRateLimitRequest { limit: Some(limit) })
        .await?
        .into_inner()
        .limit
        .expect("limit"))
}

fn poll_request(queue: &str, max_tasks: i32, wait: Duration) -> PollTasksRequest {
    PollTasksRequest {
        worker_id: "rate-test".to_owned(),
        queues: vec![queue.to_owned()],
        max_tasks,
        wait: Some(prost_types::Duration {
            seconds: i64::try_from(wait.as_secs()).unwrap_or(0),
            nanos: i32::try_from(wait.subsec_nanos()).unwrap_or(0),
        }),
        confirm_receipt: false,
    }
}

async fn poll(
    workers: &mut WorkerServiceClient<Channel>,
    queue: &str,
    max_tasks: i32,
    wait: Duration,
) -> Vec<Task> {
    workers
        .poll_tasks(poll_request(queue, max_tasks, wait))
        .await
        .expect("poll")
        .into_inner()
        .tasks
}

async fn complete(workers: &mut WorkerServiceClient<Channel>, task: &Task) {
    workers
        .complete_task(CompleteTaskRequest {
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            lease_token: task.lease_token.clone(),
            output: Some(composer_grpc::convert::from_json(&json!({}))),
        })
        .await
        .expect("complete");
}

/// When the server leased the task, in microseconds since the epoch.
fn leased_at_micros(task: &Task) -> i64 {
    let expires = task.lease_expire_time.as_ref().expect("lease expiry");
    let duration = task.lease_duration.as_ref().expect("lease duration");
    let micros = |seconds: i64, nanos: i32| seconds * 1_000_000 + i64::from(nanos) / 1_000;
    micros(expires.seconds, expires.nanos) - micros(duration.seconds, duration.nanos)
}

/// The most hand-outs in any one-second window `[t, t + 1 s)`.
fn busiest_second(times: &[i64]) -> usize {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    let mut most = 0;
    let mut end = 0;
    for start in 0..sorted.len() {
        while end < sorted.len() && sorted[end] < sorted[start] + 1_000_000 {
            end += 1;
        }
        most = most.max(end - start);
    }
    most
}

/// The grants a bucket made, read from its log in Redis (`time:count`
/// pairs in Redis time) every 100 ms until `done` is set. An entry stays
/// in the log for the window (1.025 s), so none is missed; one gone from
/// the log while still inside the window was refunded (its lease found
/// the task taken) and counts as nothing.
///
/// The burst bounds grants, which is what the limit decides. A hand-out's
/// lease time follows its grant by the lease statement's latency, which
/// on a loaded machine can be long enough to bunch leases up, so a window
/// over lease times would measure Postgres, not the limit.
async fn grant_log(redis_url: String, bucket: String, done: Arc<AtomicBool>) -> Vec<i64> {
    let client = redis::Client::open(redis_url.as_str()).expect("redis url");
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let window = composer_coordinator::dispatch::rate_limit::WINDOW_MICROS;
    let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
    loop {
        let finished = done.load(Ordering::SeqCst);
        let ((seconds, micros), log): ((i64, i64), Option<String>) = redis::pipe()
            .cmd("TIME")
            .cmd("HGET")
            .arg(&bucket)
            .arg("log")
            .query_async(&mut redis)
            .await
            .expect("read the bucket");
        let now = seconds * 1_000_000 + micros;
        let logged: BTreeMap<i64, usize> = log
            .unwrap_or_default()
            .split(',')
            .filter_map(|pair| {
                let (time, count) = pair.split_once(':')?;
                Some((time.parse().ok()?, count.parse().ok()?))
            })
            .collect();
        for (time, count) in seen.iter_mut() {
            if *time > now - window {
                *count = logged.get(time).copied().unwrap_or(0);
            }
        }
        seen.extend(logged);
        if finished {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen.into_iter()
        .flat_map(|(time, count)| std::iter::repeat_n(time, count))
        .collect()
}

/// A [`grant_log`] running while workers poll.
struct GrantWatch {
    done: Arc<AtomicBool>,
    reader: tokio::task::JoinHandle<Vec<i64>>,
}

impl GrantWatch {
    fn start(redis_url: &str, bucket: String) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let reader = tokio::spawn(grant_log(redis_url.to_owned(), bucket, done.clone()));
        GrantWatch { done, reader }
    }

    /// Every grant's Redis time, in microseconds, once the workers are done.
    async fn grants(self) -> Vec<i64> {
        self.done.store(true, Ordering::SeqCst);
        self.reader.await.expect("grant log")
    }
}

/// Polls `queue` on `server` until `total` tasks were handed out (across
/// every worker sharing `seen`), completing each; returns their lease
/// times.
async fn eager_worker(
    server_url: String,
    queue: &'static str,
    seen: Arc<AtomicUsize>,
    total: usize,
) -> Vec<(i64, String)> {
    let channel = Channel::from_shared(server_url)
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut workers = WorkerServiceClient::new(channel);
    let mut leased = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while seen.load(Ordering::SeqCst) < total {
        assert!(tokio::time::Instant::now() < deadline, "tasks never came");
        let tasks = poll(&mut workers, queue, 10, Duration::from_millis(500)).await;
        seen.fetch_add(tasks.len(), Ordering::SeqCst);
        for task in &tasks {
            let key = composer_grpc::convert::to_json(task.input.clone(), "input")
                .ok()
                .and_then(|input| input.get("key").and_then(|k| k.as_str().map(str::to_owned)))
                .unwrap_or_default();
            leased.push((leased_at_micros(task), key));
            complete(&mut workers, task).await;
        }
    }
    leased
}

const ONE_TASK: &str = r#"
name: limited
nodes:
  - { id: step, type: TASK, queue: limited, task: step }
"#;

const KEYED: &str = r#"
name: keyed
nodes:
  - { id: step, type: TASK, queue: keyed, task: step, rate_limit_key: "input.key" }
"#;

/// The issue's measure: 20/s on a queue, 400 tasks, workers polling eagerly
/// from two servers on one database: done in 20 s +/- 10 %, and no
/// one-second window holds more than the burst.
#[tokio::test]
async fn a_queue_limit_holds_across_two_servers() {
    let database_url = fresh_database().await;
    let redis_url = fresh_redis_url();
    let one = ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let two = ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let mut client = TestClient::connect(&one.url()).await;
    client.register(ONE_TASK).await;
    let mut queues = QueueServiceClient::new(channel(&one).await);
    let set = set_limit(&mut queues, limit("limited", 20.0, 20))
        .await
        .expect("set the limit");
    assert_eq!((set.per_second, set.burst), (20.0, 20));
    for _ in 0..400 {
        client.start("limited", json!({})).await;
    }
    let grants = GrantWatch::start(&redis_url, queue_bucket_key("default", "limited"));
    let seen = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for server in [&one, &two, &one, &two] {
        workers.push(tokio::spawn(eager_worker(
            server.url(),
            "limited",
            seen.clone(),
            400,
        )));
    }
    let mut times = Vec::new();
    for worker in workers {
        times.extend(worker.await.expect("worker").into_iter().map(|(t, _)| t));
    }
    assert_eq!(times.len(), 400, "every task handed out once");
    let first = times.iter().min().copied().unwrap_or_default();
    let last = times.iter().max().copied().unwrap_or_default();
    let took = Duration::from_micros(u64::try_from(last - first).unwrap_or(0));
    assert!(
        took >= Duration::from_secs(18) && took <= Duration::from_secs(22),
        "400 tasks at 20/s took {took:?}"
    );
    let grants = grants.grants().await;
    assert_eq!(grants.len(), 400, "one grant per hand-out");
    assert!(
        busiest_second(&grants) <= 20,
        "a one-second window held {} grants",
        busiest_second(&grants)
    );
}

/// Two keys each limited to 5/s with the queue itself unlimited: each key
/// keeps its own limit, and one key's backlog does not hold the other's
/// tasks behind it.
#[tokio::test]
async fn each_key_has_its_own_limit_and_does_not_wait_behind_another() {
    let redis_url = fresh_redis_url();
    let server =
        ServerProcess::start_with(&composer_binary(), &fresh_database().await, &redis_url, &[])
            .await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(KEYED).await;
    let mut queues = QueueServiceClient::new(channel(&server).await);
    let mut per_key = limit("keyed", 0.0, 0);
    per_key.per_key_per_second = 5.0;
    let set = set_limit(&mut queues, per_key).await.expect("set");
    assert_eq!((set.per_key_per_second, set.per_key_burst), (5.0, 5));
    for _ in 0..30 {
        client.start("keyed", json!({ "key": "a" })).await;
    }
    for _ in 0..5 {
        client.start("keyed", json!({ "key": "b" })).await;
    }
    let watch = |key: &str| GrantWatch::start(&redis_url, key_bucket_key("default", "keyed", key));
    let (grants_a, grants_b) = (watch("a"), watch("b"));
    let seen = Arc::new(AtomicUsize::new(0));
    let mut leased = eager_worker(server.url(), "keyed", seen, 35).await;
    leased.sort();
    let of = |key: &str| -> Vec<i64> {
        leased
            .iter()
            .filter(|(_, k)| k == key)
            .map(|(t, _)| *t)
            .collect()
    };
    let (a, b) = (of("a"), of("b"));
    assert_eq!((a.len(), b.len()), (30, 5));
    let (grants_a, grants_b) = (grants_a.grants().await, grants_b.grants().await);
    assert_eq!((grants_a.len(), grants_b.len()), (30, 5));
    assert!(
        busiest_second(&grants_a) <= 5,
        "key a: {}",
        busiest_second(&grants_a)
    );
    assert!(
        busiest_second(&grants_b) <= 5,
        "key b: {}",
        busiest_second(&grants_b)
    );
    let last_b = b.iter().max().copied().unwrap_or_default();
    let a_before_last_b = a.iter().filter(|t| **t <= last_b).count();
    assert!(
        a_before_last_b <= 10,
        "key b waited behind key a: {a_before_last_b} of a's tasks went first"
    );
}

/// A limited queue's backlog holds back no other queue, and a changed
/// limit takes effect on the running server.
#[tokio::test]
async fn other_queues_pass_and_a_changed_limit_takes_effect_without_restart() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(ONE_TASK).await;
    client
        .register("name: other\nnodes:\n  - { id: step, type: TASK, queue: other, task: step }\n")
        .await;
    let mut queues = QueueServiceClient::new(channel(&server).await);
    set_limit(&mut queues, limit("limited", 0.5, 1))
        .await
        .expect("set");
    for _ in 0..20 {
        client.start("limited", json!({})).await;
    }
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    let first = poll(&mut workers, "limited", 20, Duration::from_secs(5)).await;
    assert_eq!(first.len(), 1, "a burst of one");
    let held = poll(&mut workers, "limited", 20, Duration::from_millis(500)).await;
    assert!(held.is_empty(), "the bucket is empty for two seconds");

    client.start("other", json!({})).await;
    let other = poll(&mut workers, "other", 1, Duration::from_secs(10)).await;
    assert_eq!(other.len(), 1, "another queue's task is handed out at once");

    set_limit(&mut queues, limit("limited", 1000.0, 1000))
        .await
        .expect("raise");
    let mut rest = 0;
    // at 0.5/s the 19 left would take 38 s; the raised limit hands them out
    // within a few polls
    for _ in 0..10 {
        rest += poll(&mut workers, "limited", 20, Duration::from_secs(1))
            .await
            .len();
        if rest == 19 {
            break;
        }
    }
    assert_eq!(rest, 19, "the raised limit took effect");
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

/// Bad values are refused naming the field; a reader may read but not set;
/// another namespace neither sees nor changes a limit, and its queue of the
/// same name is not limited by it.
#[tokio::test]
async fn limits_are_checked_and_stay_inside_their_namespace() {
    let server = ServerProcess::start(&composer_binary(), &["--auth-secret", SECRET]).await;
    let channel = channel(&server).await;
    let mut queues = QueueServiceClient::new(channel.clone());
    let operator = token("tenant-a", &["operator"]);
    let set = |l: QueueRateLimit, t: &str| authed(SetQueueRateLimitRequest { limit: Some(l) }, t);

    let mut bad_cases = vec![
        (limit("q", -1.0, 0), "limit.per_second"),
        (limit("q", f64::NAN, 0), "limit.per_second"),
        (limit("q", 1_000_000.0, 0), "limit.per_second"),
        (limit("q", 20.0, 5), "limit.burst"),
        (limit("q", 20.0, 200_000), "limit.burst"),
        (limit("q", 0.0, 0), "limit.per_second"),
        (limit("no such queue!", 1.0, 0), "limit.queue"),
    ];
    let mut key_burst_alone = limit("q", 1.0, 0);
    key_burst_alone.per_key_burst = 3;
    bad_cases.push((key_burst_alone, "limit.per_key_burst"));
    let mut key_rate_negative = limit("q", 1.0, 0);
    key_rate_negative.per_key_per_second = -2.0;
    bad_cases.push((key_rate_negative, "limit.per_key_per_second"));
    for (bad, field) in bad_cases {
        let refused = queues
            .set_queue_rate_limit(set(bad.clone(), &operator))
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument, "{bad:?}");
        assert_eq!(violated_field(&refused), field, "{bad:?}");
    }

    queues
        .set_queue_rate_limit(set(limit("q", 0.5, 1), &operator))
        .await
        .expect("operator sets");
    let reader = token("tenant-a", &["reader"]);
    let denied = queues
        .set_queue_rate_limit(set(limit("q", 100.0, 100), &reader))
        .await
        .expect_err("reader may not set");
    assert_eq!(denied.code(), Code::PermissionDenied);
    let read = queues
        .get_queue_rate_limit(authed(
            GetQueueRateLimitRequest {
                queue: "q".to_owned(),
            },
            &reader,
        ))
        .await
        .expect("reader gets")
        .into_inner()
        .limit
        .expect("limit");
    assert_eq!((read.per_second, read.burst), (0.5, 1));

    let stranger = token("tenant-b", &["admin"]);
    let hidden = queues
        .get_queue_rate_limit(authed(
            GetQueueRateLimitRequest {
                queue: "q".to_owned(),
            },
            &stranger,
        ))
        .await
        .expect_err("hidden");
    assert_eq!(hidden.code(), Code::NotFound);
    let listed = queues
        .list_queue_rate_limits(authed(ListQueueRateLimitsRequest::default(), &stranger))
        .await
        .expect("list")
        .into_inner();
    assert!(listed.limits.is_empty(), "{listed:?}");
    let untouched = queues
        .delete_queue_rate_limit(authed(
            DeleteQueueRateLimitRequest {
                queue: "q".to_owned(),
            },
            &stranger,
        ))
        .await
        .expect_err("not theirs");
    assert_eq!(untouched.code(), Code::NotFound);

    // tenant-b's own queue "q" is not limited by tenant-a's limit
    let mut workflows = WorkflowServiceClient::new(channel.clone());
    let mut runs = RunServiceClient::new(channel.clone());
    let mut workers = WorkerServiceClient::new(channel);
    workflows
        .register_workflow(authed(
            RegisterWorkflowRequest {
                source: "name: w\nnodes:\n  - { id: s, type: TASK, queue: q, task: s }\n"
                    .to_owned(),
            },
            &stranger,
        ))
        .await
        .expect("register");
    for _ in 0..10 {
        runs.start_run(authed(
            StartRunRequest {
                workflow_name: "w".to_owned(),
                ..StartRunRequest::default()
            },
            &stranger,
        ))
        .await
        .expect("start");
    }
    let worker = token("tenant-b", &["worker"]);
    let mut got = 0;
    for _ in 0..5 {
        got += workers
            .poll_tasks(authed(
                poll_request("q", 10, Duration::from_secs(2)),
                &worker,
            ))
            .await
            .expect("poll")
            .into_inner()
            .tasks
            .len();
        if got == 10 {
            break;
        }
    }
    assert_eq!(got, 10, "tenant-a's limit held back tenant-b's queue");

    queues
        .delete_queue_rate_limit(authed(
            DeleteQueueRateLimitRequest {
                queue: "q".to_owned(),
            },
            &operator,
        ))
        .await
        .expect("owner deletes");
}

/// A rate-limit key expression that is not a string is refused at
/// registration, named by its path.
#[tokio::test]
async fn a_key_expression_of_the_wrong_type_is_refused_with_its_path() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut workflows = WorkflowServiceClient::new(channel(&server).await);
    let refused = workflows
        .register_workflow(RegisterWorkflowRequest {
            source: r#"
name: typed
nodes:
  - { id: a, type: TASK, queue: q, task: a }
  - { id: b, type: TASK, queue: q, task: b, rate_limit_key: "1 + 2" }
edges:
  - { from: a, to: b }
"#
            .to_owned(),
        })
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
    let violations = refused
        .get_details_bad_request()
        .map(|b| b.field_violations)
        .unwrap_or_default();
    assert!(
        violations
            .iter()
            .any(|v| v.field == "nodes[1].rate_limit_key" && v.description.contains("string")),
        "{violations:?}"
    );
}

/// `composer queue rate-limit ...` with no connection settings from the
/// environment; returns (exit code, stdout).
async fn cli(server: &ServerProcess, args: &[&str]) -> (i32, String) {
    let output = tokio::process::Command::new(composer_binary())
        .args(args)
        .args(["--address", &server.url()])
        .env_remove("COMPOSER_ADDRESS")
        .env_remove("COMPOSER_TOKEN")
        .env_remove("COMPOSER_NAMESPACE")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run the cli");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

/// The CLI sets, reads, lists and deletes a limit; a bad value exits as an
/// invalid argument.
#[tokio::test]
async fn the_cli_sets_reads_lists_and_deletes_limits() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let (code, out) = cli(
        &server,
        &[
            "queue",
            "rate-limit",
            "set",
            "emails",
            "--per-second",
            "2.5",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2.5/s, burst 3"), "{out}");
    let (code, out) = cli(
        &server,
        &["queue", "rate-limit", "get", "emails", "-o", "json"],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let got: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(got["limit"]["per_second"], json!(2.5));
    assert_eq!(got["limit"]["burst"], json!(3));
    let (code, out) = cli(&server, &["queue", "rate-limit", "list"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("emails"), "{out}");
    let (code, _) = cli(
        &server,
        &["queue", "rate-limit", "set", "emails", "--per-second", "-1"],
    )
    .await;
    assert_ne!(code, 0, "a negative rate is refused");
    let (code, out) = cli(&server, &["queue", "rate-limit", "delete", "emails"]).await;
    assert_eq!(code, 0, "{out}");
    let (code, _) = cli(&server, &["queue", "rate-limit", "get", "emails"]).await;
    assert_ne!(code, 0, "deleted");
}
