//! Composer on a three-master Redis Cluster (decision 0022): streams spread
//! over every master, a master killed mid-run loses nothing, a seed list
//! finds the nodes it does not name, and a malformed cluster URL stops the
//! server with one line naming the setting.

use std::{collections::HashMap, path::PathBuf, process::Command as StdCommand, time::Duration};

use composer_proto::v1::RunStatus;
use composer_testkit::{
    ServerProcess,
    client::TestClient,
    redis_cluster::RedisCluster,
    worker::{LeaseRecord, Outcome, TestWorker},
};
use serde_json::json;

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

const WAIT: Duration = Duration::from_secs(180);

/// Queues whose streams (four shards each) land on all three masters.
const QUEUES: [&str; 6] = ["cq1", "cq2", "cq3", "cq4", "cq5", "cq6"];

fn pipeline(queue: &str) -> String {
    format!(
        r#"
name: pipeline-{queue}
nodes:
  - {{ id: a, type: TASK, queue: {queue}, task: step, heartbeat_timeout: 2s }}
  - {{ id: b, type: TASK, queue: {queue}, task: step, heartbeat_timeout: 2s }}
  - {{ id: c, type: TASK, queue: {queue}, task: step, heartbeat_timeout: 2s }}
edges:
  - {{ from: a, to: b }}
  - {{ from: b, to: c }}
output: {{ n: "${{input.n}}" }}
"#
    )
}

fn step(_: &LeaseRecord) -> Outcome {
    Outcome::Slow(Duration::from_millis(5), json!({"ok": true}))
}

/// Registers one pipeline per queue, starts `count` runs spread over them,
/// then a worker on every queue (so the runs are mostly ahead of it).
async fn start_runs(server: &ServerProcess, count: usize) -> (TestClient, TestWorker, Vec<String>) {
    let mut client = TestClient::connect(&server.url()).await;
    for queue in QUEUES {
        client.register(&pipeline(queue)).await;
    }
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        let workflow = format!("pipeline-{}", QUEUES[n % QUEUES.len()]);
        ids.push(client.start(&workflow, json!({ "n": n })).await);
    }
    let worker = TestWorker::start(&server.url(), &QUEUES, 4, 10, step).await;
    (client, worker, ids)
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

/// Every master holds some of the task streams: the cluster really spreads
/// them, so killing any master takes some away.
async fn assert_streams_on_every_master(cluster: &RedisCluster) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut counts = Vec::new();
        for index in 0..cluster.ports().len() {
            counts.push(cluster.keys_on(index, "composer:tasks:*").await.len());
        }
        if counts.iter().all(|&n| n > 0) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task streams per master: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The server's last `count` stderr lines, for a failure's message.
fn last_lines(server: &ServerProcess, count: usize) -> String {
    let lines = server.stderr_lines();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

#[tokio::test]
async fn a_master_killed_in_the_middle_of_300_runs_on_a_cluster_loses_none() {
    let mut cluster = RedisCluster::start(3).await;
    let database = composer_testkit::fresh_database().await;
    let server = ServerProcess::start_with(
        &composer_binary(),
        &database,
        &cluster.cluster_url(),
        &["--lost-dispatch-grace", "2s"],
    )
    .await;
    let (mut client, worker, ids) = start_runs(&server, 300).await;
    while worker.leases().len() < 150 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_streams_on_every_master(&cluster).await;
    // the first seed: the run-change subscription goes through it
    cluster.kill(0);
    // the other masters' slots keep flowing meanwhile (the harness's node
    // timeout keeps the cluster from failing as a whole before this)
    let leased_at_kill = worker.leases().len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(50);
    while worker.leases().len() < leased_at_kill + 50 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} tasks leased while one master of three was down; the server's last lines:\n{}",
            worker.leases().len() - leased_at_kill,
            last_lines(&server, 40)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // a while longer down: what the master held is gone for good
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.restart(0).await;
    assert_all_completed_once(&mut client, &ids).await;
    assert!(
        !cluster.keys_on(0, "composer:tasks:*").await.is_empty(),
        "the restarted master (empty) serves its streams again"
    );
}

#[tokio::test]
async fn a_list_of_seed_urls_finds_the_node_it_does_not_name() {
    let cluster = RedisCluster::start(3).await;
    let database = composer_testkit::fresh_database().await;
    let server = ServerProcess::start_with(
        &composer_binary(),
        &database,
        &cluster.seed_urls(&[1, 2]),
        &[],
    )
    .await;
    let (mut client, _worker, ids) = start_runs(&server, 60).await;
    assert_all_completed_once(&mut client, &ids).await;
    assert_streams_on_every_master(&cluster).await;
}

#[test]
fn a_malformed_cluster_url_stops_the_server_with_one_line_naming_the_setting() {
    for (url, reason) in [
        ("redis+cluster://127.0.0.1:1,,127.0.0.1:2", "empty entry"),
        (
            "redis+cluster://127.0.0.1:1,127.0.0.1:2/4",
            "only database 0",
        ),
        ("redis://127.0.0.1:1,127.0.0.1:2", "expected redis://"),
    ] {
        let output = StdCommand::new(composer_binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--insecure"])
            .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
            .args(["--redis-url", url])
            .output()
            .expect("composer runs");
        assert!(!output.status.success(), "{url}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{url}: one line, got:\n{stderr}");
        assert!(
            stderr.contains("COMPOSER_REDIS_URL (--redis-url)") && stderr.contains(reason),
            "{url}: {stderr}"
        );
    }
}
