//! Fault injection: Redis wiped, the server killed, several servers, HTTP
//! nodes against a flaky endpoint. Real processes, real Postgres and Redis.

use crate::common;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use composer_cli::local_services::LocalServices;
use composer_proto::v1::RunStatus;
use composer_testkit::{
    ServerProcess,
    client::{TestClient, output_of},
    worker::{Outcome, TestWorker},
};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use common::composer_binary;

const WAIT: Duration = Duration::from_secs(120);

const PIPELINE: &str = r#"
name: pipeline
nodes:
  - { id: a, type: TASK, queue: qf, task: step, heartbeat_timeout: 2s }
  - { id: b, type: TASK, queue: qf, task: step, heartbeat_timeout: 2s }
  - { id: c, type: TASK, queue: qf, task: step, heartbeat_timeout: 2s }
edges:
  - { from: a, to: b }
  - { from: b, to: c }
output: { n: "${input.n}" }
"#;

fn step(_: &composer_testkit::worker::LeaseRecord) -> Outcome {
    Outcome::Slow(Duration::from_millis(5), json!({"ok": true}))
}

async fn start_runs(client: &mut TestClient, count: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        ids.push(client.start("pipeline", json!({ "n": n })).await);
    }
    ids
}

async fn assert_all_completed_once(client: &mut TestClient, ids: &[String]) {
    for id in ids {
        let run = client.wait_done(id, WAIT).await;
        assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
        let history = client.history(id).await;
        let mut completed: HashMap<String, usize> = HashMap::new();
        for event in history.iter().filter(|e| e.event_type == "node_completed") {
            *completed.entry(event.node_id.clone()).or_default() += 1;
        }
        assert_eq!(completed.len(), 3, "{id}: {completed:?}");
        assert!(
            completed.values().all(|&n| n == 1),
            "{id}: a step completed twice: {completed:?}"
        );
    }
}

async fn redis_command(port: u16, command: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("redis");
    stream.write_all(command).await.expect("send");
    let mut reply = [0u8; 64];
    let n = stream.read(&mut reply).await.expect("reply");
    String::from_utf8_lossy(&reply[..n]).into_owned()
}

#[tokio::test]
async fn flushall_on_redis_in_the_middle_of_200_runs_loses_none() {
    let (services, server) =
        common::server_on_private_services(&["--lost-dispatch-grace", "2s"]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(PIPELINE).await;
    let worker = TestWorker::start(&server.url(), &["qf"], 4, 10, step).await;
    let ids = start_runs(&mut client, 200).await;
    while worker.leases().len() < 150 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        redis_command(services.redis_port, b"FLUSHALL\r\n")
            .await
            .trim(),
        "+OK"
    );
    assert_all_completed_once(&mut client, &ids).await;
    drop(worker);
    drop(server);
    services.stop().await;
}

#[tokio::test]
async fn the_server_killed_mid_way_through_200_runs_restarts_and_finishes_them_all() {
    let database = composer_testkit::fresh_database().await;
    let redis = composer_testkit::fresh_redis_url();
    let args = ["--lost-dispatch-grace", "2s"];
    let mut server = ServerProcess::start_with(&composer_binary(), &database, &redis, &args).await;
    let addr = server.addr.clone();
    let mut client = TestClient::connect(&server.url()).await;
    client.register(PIPELINE).await;
    let worker = TestWorker::start(&server.url(), &["qf"], 4, 10, step).await;
    let ids = start_runs(&mut client, 200).await;
    while worker.leases().len() < 200 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill().await;
    let _restarted =
        ServerProcess::start_on(&composer_binary(), &addr, &database, &redis, &args).await;
    assert_all_completed_once(&mut client, &ids).await;
}

#[tokio::test]
async fn three_servers_complete_1000_runs_and_never_lease_an_attempt_twice() {
    let database = composer_testkit::fresh_database().await;
    let redis = composer_testkit::fresh_redis_url();
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(ServerProcess::start_with(&composer_binary(), &database, &redis, &[]).await);
    }
    let mut clients = Vec::new();
    let mut workers = Vec::new();
    for server in &servers {
        clients.push(TestClient::connect(&server.url()).await);
        workers.push(
            TestWorker::start(&server.url(), &["qf"], 2, 20, |_| {
                Outcome::Complete(json!({"ok": true}))
            })
            .await,
        );
    }
    clients[0].register(PIPELINE).await;
    let mut ids = Vec::new();
    for n in 0..1000 {
        let client = &mut clients[n % 3];
        ids.push(client.start("pipeline", json!({ "n": n })).await);
    }
    for id in &ids {
        let run = clients[0].wait_done(id, WAIT).await;
        assert_eq!(run.status(), RunStatus::Completed);
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for worker in &workers {
        for lease in worker.leases() {
            total += 1;
            assert!(
                seen.insert((lease.task_id.clone(), lease.attempt)),
                "leased twice: {lease:?}"
            );
        }
    }
    assert_eq!(
        total, 3000,
        "every task leased exactly once across three servers"
    );
    let leased_by_every_server = workers.iter().all(|w| !w.leases().is_empty());
    assert!(leased_by_every_server);

    // the tasks table agrees: 3000 tasks, each completed at attempt 1
    let pool = sqlx::PgPool::connect(&database).await.expect("connect");
    let (tasks, attempts): (i64, i64) = sqlx::query_as(
        "SELECT count(*), COALESCE(sum(attempt), 0)::bigint FROM tasks WHERE status = 'COMPLETED'",
    )
    .fetch_one(&pool)
    .await
    .expect("count tasks");
    assert_eq!((tasks, attempts), (3000, 3000));
}

/// A local endpoint that answers 503 twice, then 200 with JSON, recording
/// every request's Idempotency-Key.
async fn flaky_endpoint() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&keys);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 16 * 1024];
                let mut read = 0;
                while !String::from_utf8_lossy(&buffer[..read]).contains("\r\n\r\n") {
                    match socket.read(&mut buffer[read..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read += n,
                    }
                }
                let request = String::from_utf8_lossy(&buffer[..read]).to_lowercase();
                let key = request
                    .lines()
                    .find_map(|l| l.strip_prefix("idempotency-key:"))
                    .map(|v| v.trim().to_owned())
                    .unwrap_or_default();
                let count = {
                    let mut keys = seen.lock().expect("keys");
                    keys.push(key);
                    keys.len()
                };
                let response = if count <= 2 {
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\nconnection: close\r\n\r\nbusy".to_owned()
                } else {
                    let body = r#"{"id":"ch_1"}"#;
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    (format!("http://{addr}"), keys)
}

#[tokio::test]
async fn an_http_node_retries_503s_with_one_idempotency_key_and_the_ssrf_guard_refuses_metadata() {
    let server = ServerProcess::start(&composer_binary(), &["--http-allow-loopback"]).await;
    let mut client = TestClient::connect(&server.url()).await;
    let (endpoint, keys) = flaky_endpoint().await;
    client
        .register(&format!(
            r#"
name: charge
nodes:
  - id: charge
    type: HTTP
    http: {{ method: POST, url: "{endpoint}/charge", body: {{ amount: "${{input.amount}}" }} }}
    retry: {{ max_attempts: 5, initial_interval: 100ms }}
output: {{ id: "${{nodes.charge.output.body.id}}", status: "${{nodes.charge.output.status}}" }}
"#
        ))
        .await;
    let run_id = client.start("charge", json!({"amount": 12})).await;
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
    assert_eq!(output_of(&run), json!({"id": "ch_1", "status": 200}));
    let keys = keys.lock().expect("keys").clone();
    assert_eq!(keys.len(), 3, "503, 503, 200");
    assert!(!keys[0].is_empty());
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "one Idempotency-Key on every attempt: {keys:?}"
    );

    client
        .register(
            "name: metadata\nnodes:\n  - { id: steal, type: HTTP, http: { method: GET, url: \"http://169.254.169.254/latest/meta-data/\" } }\n",
        )
        .await;
    let run_id = client.start("metadata", json!({})).await;
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Failed);
    assert_eq!(run.error.expect("error").code, "SSRF_BLOCKED");
}

/// Postgres and every backend stopped (SIGSTOP; each backend is a session
/// of its own, so each is signalled): connections stay open and nothing
/// answers. Continued when dropped.
struct FrozenDatabase(Vec<nix::unistd::Pid>);

impl FrozenDatabase {
    fn freeze(services: &LocalServices) -> Self {
        let postmaster = services.postgres_pid().expect("postgres pid");
        let mut pids = vec![postmaster];
        pids.extend(children_of(postmaster));
        let pids: Vec<_> = pids.into_iter().map(nix::unistd::Pid::from_raw).collect();
        for &pid in &pids {
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
        }
        Self(pids)
    }
}

impl Drop for FrozenDatabase {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        }
    }
}

/// The processes whose parent is `parent` (from /proc).
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // the field after the parenthesised command is the state, then the parent
            let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
            after.split_whitespace().nth(1) == Some(parent.to_string().as_str())
        })
        .collect()
}

#[tokio::test]
async fn a_frozen_database_makes_calls_unavailable_by_the_server_not_the_callers_deadline() {
    use composer_proto::v1::{GetRunRequest, ListRunsRequest, StartRunRequest};
    let (services, server) = common::server_on_private_services(&["--db-timeout", "1s"]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(PIPELINE).await;
    let before = client.start("pipeline", json!({ "n": 1 })).await;
    let start = || StartRunRequest {
        workflow_name: "pipeline".to_owned(),
        input: Some(composer_grpc::convert::from_json(&json!({ "n": 2 }))),
        idempotency_key: "during-the-freeze".to_owned(),
        ..Default::default()
    };
    // a caller's deadline far away: the answer must come from the server
    fn patient<T>(message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(Duration::from_secs(120));
        request
    }

    let frozen = FrozenDatabase::freeze(&services);
    let answers = [
        client
            .runs
            .get_run(patient(GetRunRequest {
                run_id: before.clone(),
                ..Default::default()
            }))
            .await
            .map(|_| ())
            .expect_err("no answer from a frozen database"),
        client
            .runs
            .list_runs(patient(ListRunsRequest::default()))
            .await
            .map(|_| ())
            .expect_err("no answer from a frozen database"),
        client
            .runs
            .start_run(patient(start()))
            .await
            .map(|_| ())
            .expect_err("no answer from a frozen database"),
    ];
    for status in &answers {
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(status.message().contains("--db-timeout"), "{status:?}");
    }
    drop(frozen);

    // nothing was lost or doubled: the start retried with its key makes
    // one run, and both runs finish once the database answers again
    let retried = client
        .runs
        .start_run(start())
        .await
        .expect("start after the freeze")
        .into_inner()
        .run
        .expect("run")
        .run_id;
    let again = client
        .runs
        .start_run(start())
        .await
        .expect("same key")
        .into_inner()
        .run
        .expect("run")
        .run_id;
    assert_eq!(retried, again);
    let worker = TestWorker::start(&server.url(), &["qf"], 1, 4, step).await;
    assert_all_completed_once(&mut client, &[before, retried]).await;
    drop(worker);
    drop(server);
    services.stop().await;
}

/// One long poll of `queue` for at most one task, as worker `worker_id`
/// that confirms receipt, waiting up to `wait_seconds`.
async fn poll_once_confirming(
    workers: &mut composer_proto::v1::worker_service_client::WorkerServiceClient<
        tonic::transport::Channel,
    >,
    worker_id: String,
    queue: &str,
    wait_seconds: i64,
) -> Option<composer_proto::v1::Task> {
    workers
        .poll_tasks(composer_proto::v1::PollTasksRequest {
            worker_id,
            queues: vec![queue.to_owned()],
            max_tasks: 1,
            wait: Some(prost_types::Duration {
                seconds: wait_seconds,
                nanos: 0,
            }),
            confirm_receipt: true,
        })
        .await
        .expect("poll")
        .into_inner()
        .tasks
        .into_iter()
        .next()
}

/// Polls `queue` until it gets one task, as a worker that confirms receipt.
async fn poll_confirming(
    workers: &mut composer_proto::v1::worker_service_client::WorkerServiceClient<
        tonic::transport::Channel,
    >,
    queue: &str,
) -> composer_proto::v1::Task {
    loop {
        if let Some(task) = poll_once_confirming(workers, "confirming".to_owned(), queue, 5).await {
            return task;
        }
    }
}

#[tokio::test]
async fn a_poll_answer_that_never_arrives_offers_the_task_again_without_spending_an_attempt() {
    use composer_proto::v1::{
        CompleteTaskRequest, HeartbeatRequest, worker_service_client::WorkerServiceClient,
    };
    let database = composer_testkit::fresh_database().await;
    let redis = composer_testkit::fresh_redis_url();
    let server = ServerProcess::start_with(
        &composer_binary(),
        &database,
        &redis,
        &["--lease-receipt-timeout", "1s"],
    )
    .await;
    let mut client = TestClient::connect(&server.url()).await;
    // one attempt only, and a heartbeat timeout far longer than the test
    client
        .register(
            "name: once\nnodes:\n  - { id: only, type: TASK, queue: qr, task: t, \
             heartbeat_timeout: 1h, retry: { max_attempts: 1 } }\n\
             output: '${nodes.only.output}'\n",
        )
        .await;
    let channel = tonic::transport::Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut workers = WorkerServiceClient::new(channel);
    let run_id = client.start("once", json!({})).await;

    // the answer "never arrives": this worker takes it and never confirms
    let lost = poll_confirming(&mut workers, "qr").await;
    assert_eq!(lost.attempt, 1);
    let lease_ends = lost.lease_expire_time.expect("expiry");
    let heartbeat_ends = lost.lease_duration.expect("lease duration");
    assert!(
        heartbeat_ends.seconds == 3600 && lease_ends.seconds < now_seconds() + 60,
        "until confirmed the lease is the receipt timeout, not the hour: {lost:?}"
    );

    // offered again, same attempt: the node's only attempt is not spent
    let again = poll_confirming(&mut workers, "qr").await;
    assert_eq!(again.task_id, lost.task_id);
    assert_eq!(again.attempt, 1, "the lost lease cost no attempt");
    assert_ne!(again.lease_token, lost.lease_token);

    // confirmed at once, the lease is the node's full heartbeat timeout and
    // outlives the receipt timeout
    let confirmed = workers
        .heartbeat(HeartbeatRequest {
            task_id: again.task_id.clone(),
            attempt: again.attempt,
            lease_token: again.lease_token.clone(),
        })
        .await
        .expect("confirm")
        .into_inner();
    assert!(confirmed.lease_expire_time.expect("expiry").seconds > now_seconds() + 600);
    tokio::time::sleep(Duration::from_millis(2500)).await;

    // the lost lease's token is fenced out; the confirmed one completes
    let stale = workers
        .complete_task(CompleteTaskRequest {
            task_id: lost.task_id.clone(),
            attempt: lost.attempt,
            lease_token: lost.lease_token.clone(),
            output: Some(composer_grpc::convert::from_json(
                &json!({ "from": "lost" }),
            )),
        })
        .await
        .expect_err("the lost lease is no longer the task's");
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    workers
        .complete_task(CompleteTaskRequest {
            task_id: again.task_id.clone(),
            attempt: again.attempt,
            lease_token: again.lease_token.clone(),
            output: Some(composer_grpc::convert::from_json(
                &json!({ "from": "confirmed" }),
            )),
        })
        .await
        .expect("the confirmed lease reports");
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
    assert_eq!(output_of(&run), json!({ "from": "confirmed" }));
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

/// A worker that takes a task and dies before its first heartbeat, over and
/// over, as a supervisor restarting a worker whose task crashes it would:
/// polls `queue` as a worker that confirms receipt, holds each task for
/// `holds` (the handler's time before the crash) and then drops it, until
/// `run_id` ends or the task was delivered far more often than it may be.
/// Returns the (task, attempt) of every delivery.
async fn crash_loop(
    server_url: String,
    queue: &str,
    holds: Duration,
    run_id: String,
) -> Vec<(String, i32)> {
    use composer_proto::v1::worker_service_client::WorkerServiceClient;
    let mut client = TestClient::connect(&server_url).await;
    let mut deliveries = Vec::new();
    loop {
        // each "restart" is a new process: a new connection and worker id
        let channel = tonic::transport::Channel::from_shared(server_url.clone())
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let mut workers = WorkerServiceClient::new(channel);
        let worker_id = format!("crashing-{}", deliveries.len());
        if let Some(task) = poll_once_confirming(&mut workers, worker_id, queue, 1).await {
            deliveries.push((task.task_id, task.attempt));
            tokio::time::sleep(holds).await;
        }
        let status = client.get(&run_id).await.status();
        let ended = matches!(
            status,
            RunStatus::Failed | RunStatus::Completed | RunStatus::Cancelled
        );
        if ended || deliveries.len() > 12 {
            return deliveries;
        }
    }
}

#[tokio::test]
async fn a_task_that_kills_every_worker_fails_with_worker_lost_after_two_deliveries_per_attempt() {
    let database = composer_testkit::fresh_database().await;
    let redis = composer_testkit::fresh_redis_url();
    let metrics_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|probe| probe.local_addr())
        .expect("a free port")
        .to_string();
    // the default receipt timeout (5 s): the case as a user meets it
    let server = ServerProcess::start_with(
        &composer_binary(),
        &database,
        &redis,
        &["--metrics-listen", &metrics_addr],
    )
    .await;
    let mut client = TestClient::connect(&server.url()).await;
    for queue in ["poison_now", "poison_late"] {
        client
            .register(&format!(
                "name: {queue}\nnodes:\n  - {{ id: only, type: TASK, queue: {queue}, task: t, \
                 retry: {{ max_attempts: 3, initial_interval: 100ms }} }}\n\
                 output: '${{nodes.only.output}}'\n"
            ))
            .await;
    }
    let started = tokio::time::Instant::now();
    let at_once = client.start("poison_now", json!({})).await;
    let after_a_second = client.start("poison_late", json!({})).await;
    let (now_deliveries, late_deliveries) = tokio::join!(
        crash_loop(server.url(), "poison_now", Duration::ZERO, at_once.clone()),
        crash_loop(
            server.url(),
            "poison_late",
            Duration::from_secs(1),
            after_a_second.clone()
        ),
    );
    println!(
        "both runs ended {:.1} s after they started",
        started.elapsed().as_secs_f64()
    );

    for (run_id, deliveries) in [
        (&at_once, now_deliveries),
        (&after_a_second, late_deliveries),
    ] {
        let run = client.wait_done(run_id, WAIT).await;
        assert_eq!(run.status(), RunStatus::Failed, "{run:#?}");
        let error = run.error.clone().expect("the run's error");
        assert_eq!(error.code, "WORKER_LOST", "{error:?}");
        // each attempt: the free hand-back (a lost poll answer) and the
        // delivery that spends it; nothing more
        let attempts: Vec<i32> = deliveries.iter().map(|d| d.1).collect();
        assert_eq!(attempts, [1, 1, 2, 2, 3, 3], "{deliveries:?}");

        let history = client.history(run_id).await;
        let lost: Vec<_> = history
            .iter()
            .filter(|e| e.event_type == "lease_expired")
            .map(|e| {
                let details =
                    composer_testkit::worker::json_of(e.details.clone().expect("details"));
                (
                    e.attempt,
                    details["worker_lost"].clone(),
                    details["deliveries"].clone(),
                )
            })
            .collect();
        assert_eq!(
            lost,
            [1, 2, 3].map(|attempt| (attempt, json!(true), json!(2))),
            "{history:#?}"
        );
        assert!(
            history.iter().any(|e| e.event_type == "run_failed"),
            "the run took its failure path: {history:#?}"
        );
    }
    let metrics = reqwest::get(format!("http://{metrics_addr}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    let lost: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("composer_workers_lost_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(lost, 6.0, "three attempts of each run: {metrics}");
}
