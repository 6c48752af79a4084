//! Polling many queues costs the server a bounded amount: one Redis reader
//! for all of them, a limit on the distinct queues a namespace may have
//! polled, and nothing left in Redis once the polls stop.

use crate::common;

use std::time::Duration;

use composer_proto::v1::{PollTasksRequest, RunStatus, worker_service_client::WorkerServiceClient};
use composer_testkit::{
    ServerProcess,
    client::TestClient,
    worker::{Outcome, TestWorker},
};
use serde_json::json;
use tonic::transport::Channel;

use common::composer_binary;

const WAIT: Duration = Duration::from_secs(120);

async fn redis(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis")
}

/// Clients connected to Redis (this test's own connection included).
async fn redis_clients(connection: &mut redis::aio::MultiplexedConnection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(connection)
        .await
        .expect("CLIENT LIST");
    list.lines().count()
}

/// The task streams of workers' queues (the server's own HTTP worker polls
/// `_http` all the time).
async fn task_streams(connection: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("composer:tasks:*")
        .query_async(connection)
        .await
        .expect("KEYS");
    keys.into_iter()
        .filter(|k| !k.contains(":_http:"))
        .collect()
}

fn made_up_queues(poll: usize) -> Vec<String> {
    (0..64).map(|i| format!("junk-{poll}-{i}")).collect()
}

async fn poll(
    workers: &mut WorkerServiceClient<Channel>,
    queues: Vec<String>,
    wait_secs: i64,
) -> Result<usize, tonic::Status> {
    workers
        .poll_tasks(PollTasksRequest {
            confirm_receipt: false,
            worker_id: "prober".to_owned(),
            queues,
            max_tasks: 1,
            wait: Some(prost_types::Duration {
                seconds: wait_secs,
                nanos: 0,
            }),
        })
        .await
        .map(|r| r.into_inner().tasks.len())
}

#[tokio::test]
async fn a_thousand_polled_queues_share_one_reader_and_leave_no_stream_behind() {
    let (services, server) = common::server_on_private_services(&["--queue-idle", "1s"]).await;
    let mut client = TestClient::connect(&server.url()).await;
    let channel = Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut redis = redis(&services.redis_url).await;
    client
        .register("name: real\nnodes:\n  - { id: work, type: TASK, queue: real, task: t }\n")
        .await;
    let worker = TestWorker::start(&server.url(), &["real"], 1, 1, |_| {
        Outcome::Complete(json!({}))
    })
    .await;
    let warm = client.start("real", json!({})).await;
    assert_eq!(
        client.wait_done(&warm, WAIT).await.status(),
        RunStatus::Completed
    );
    let clients_before = redis_clients(&mut redis).await;

    // 15 polls of 64 made-up queues each: 960 queues, on top of `real`
    let mut junk = Vec::new();
    for n in 0..15 {
        let mut workers = WorkerServiceClient::new(channel.clone());
        junk.push(tokio::spawn(async move {
            poll(&mut workers, made_up_queues(n), 10).await
        }));
    }
    let mut workers = WorkerServiceClient::new(channel.clone());
    while task_streams(&mut redis).await.len() < 960 * 4 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        redis_clients(&mut redis).await <= clients_before + 1,
        "960 more queues, at most one more Redis connection (the reader's control)"
    );

    // a real task is still handed out while the made-up queues are polled
    let run = client.start("real", json!({})).await;
    assert_eq!(
        client.wait_done(&run, WAIT).await.status(),
        RunStatus::Completed
    );
    assert!(
        junk.iter().all(|poll| !poll.is_finished()),
        "the task went out while every made-up poll was still waiting"
    );

    // past 1,024 distinct queues the namespace's next new queues are refused
    let refused = poll(&mut workers, made_up_queues(99), 1)
        .await
        .expect_err("over the limit");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(refused.message().contains("1024 queues"), "{refused:?}");
    // queues already polled still are
    assert_eq!(
        poll(&mut workers, made_up_queues(3), 1)
            .await
            .expect("known queues"),
        0
    );

    for poll in junk {
        assert_eq!(poll.await.expect("join").expect("poll"), 0);
    }
    drop(worker);
    // idle queues are forgotten and their empty streams deleted
    let mut left = task_streams(&mut redis).await;
    for _ in 0..600 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = task_streams(&mut redis).await;
    }
    assert!(left.is_empty(), "streams left behind: {}", left.len());
    // and forgotten queues free the namespace's budget
    assert_eq!(
        poll(&mut workers, made_up_queues(99), 1)
            .await
            .expect("under the limit again"),
        0
    );
    drop(server);
    services.stop().await;
}

#[tokio::test]
async fn a_poll_whose_caller_went_away_holds_no_task() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register("name: left\nnodes:\n  - { id: work, type: TASK, queue: left, task: t }\n")
        .await;
    // a poll waiting 30 s whose caller gives up after 300 ms
    let mut workers = WorkerServiceClient::new(
        Channel::from_shared(server.url())
            .expect("url")
            .connect()
            .await
            .expect("connect"),
    );
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        poll(&mut workers, vec!["left".to_owned()], 30),
    )
    .await;
    assert!(abandoned.is_err(), "the caller left before an answer");
    drop(workers);

    let run_id = client.start("left", json!({})).await;
    let worker = TestWorker::start(&server.url(), &["left"], 1, 1, |_| {
        Outcome::Complete(json!({}))
    })
    .await;
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed);
    assert_eq!(worker.leases().len(), 1);
    assert_eq!(worker.leases()[0].attempt, 1);
    let leased: Vec<String> = client
        .history(&run_id)
        .await
        .into_iter()
        .filter(|e| {
            e.details.clone().is_some_and(|d| {
                composer_testkit::worker::json_of(d)
                    .get("worker_id")
                    .is_some()
            })
        })
        .map(|e| e.event_type)
        .collect();
    assert_eq!(leased, ["node_completed"], "one lease, the live worker's");
}
