//! What a tenant creates can be cleaned (decision 0037), against the real
//! server on real Postgres and Redis: a concurrency key's slot row goes
//! when the key is no longer in use, a rate-limit bucket expires within a
//! day whatever its rate, rates below one a day are refused, and nothing
//! the server writes to Redis but its task streams lives without a TTL.

use crate::common;

use std::time::Duration;

use common::{channel, composer_binary};
use composer_proto::v1::{
    PollTasksRequest, QueueRateLimit, RunStatus, SetQueueRateLimitRequest, Task,
    queue_service_client::QueueServiceClient, worker_service_client::WorkerServiceClient,
};
use composer_testkit::{
    ServerProcess,
    client::TestClient,
    fresh_database, fresh_redis_url,
    worker::{Outcome, TestWorker},
};
use futures::StreamExt;
use serde_json::json;
use sqlx::{Connection, PgConnection};
use tonic::{Code, transport::Channel};

use crate::common::violated_field;

const WAIT: Duration = Duration::from_secs(180);
/// A day, in seconds: the longest a rate-limit bucket may live in Redis.
const DAY_SECS: i64 = 86_400;

/// A run key and a task key per customer: every run of a new customer
/// makes a row in both slot tables.
const PER_CUSTOMER: &str = r#"
name: per_customer
concurrency: { key: "input.customer", max: 1 }
nodes:
  - id: bill
    type: TASK
    queue: billing
    task: bill
    concurrency: { key: "input.customer", max: 1 }
"#;

/// Runs of distinct keys the slot test starts.
const DISTINCT_KEYS: usize = 2_000;

async fn slot_rows(database: &mut PgConnection) -> (i64, i64) {
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM concurrency_slots")
        .fetch_one(&mut *database)
        .await
        .expect("count run slots");
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM task_slots")
        .fetch_one(&mut *database)
        .await
        .expect("count task slots");
    (runs, tasks)
}

#[tokio::test]
async fn runs_of_distinct_concurrency_keys_leave_no_slot_rows_once_they_end() {
    let database_url = fresh_database().await;
    let server =
        ServerProcess::start_with(&composer_binary(), &database_url, &fresh_redis_url(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(PER_CUSTOMER).await;
    let worker = TestWorker::start(&server.url(), &["billing"], 4, 16, |_| {
        Outcome::Complete(json!({ "billed": true }))
    })
    .await;

    let started: Vec<String> = futures::stream::iter(0..DISTINCT_KEYS)
        .map(|i| {
            let mut client = client.clone();
            async move {
                client
                    .start(
                        "per_customer",
                        json!({ "customer": format!("customer-{i}") }),
                    )
                    .await
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for run in &started {
        assert_eq!(
            client.wait_done(run, WAIT).await.status(),
            RunStatus::Completed,
            "{run}"
        );
    }
    drop(worker);

    let mut database = PgConnection::connect(&database_url)
        .await
        .expect("database");
    let (run_keys, task_keys) = slot_rows(&mut database).await;
    println!(
        "{DISTINCT_KEYS} runs of distinct keys ended: {run_keys} run slot rows, {task_keys} task slot rows left"
    );
    assert_eq!(
        (run_keys, task_keys),
        (0, 0),
        "a key no longer in use keeps no slot row"
    );
}

fn limit(queue: &str, per_second: f64, burst: i32) -> QueueRateLimit {
    QueueRateLimit {
        queue: queue.to_owned(),
        per_second,
        burst,
        ..QueueRateLimit::default()
    }
}

fn per_key(queue: &str, per_key_per_second: f64, per_key_burst: i32) -> QueueRateLimit {
    QueueRateLimit {
        queue: queue.to_owned(),
        per_key_per_second,
        per_key_burst,
        ..QueueRateLimit::default()
    }
}

#[tokio::test]
async fn rates_below_one_a_day_and_absurd_ones_are_refused_naming_the_field() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut queues = QueueServiceClient::new(channel(&server).await);
    let cases = [
        (limit("q", 1e-300, 0), "limit.per_second"),
        (limit("q", 1e-8, 0), "limit.per_second"),
        // one every two days
        (limit("q", 1.0 / 172_800.0, 0), "limit.per_second"),
        (limit("q", f64::INFINITY, 0), "limit.per_second"),
        (limit("q", f64::NAN, 0), "limit.per_second"),
        (limit("q", -0.5, 0), "limit.per_second"),
        (limit("q", 1e300, 0), "limit.per_second"),
        (per_key("q", 1e-8, 0), "limit.per_key_per_second"),
        (per_key("q", 1e-300, 0), "limit.per_key_per_second"),
        (
            per_key("q", f64::NEG_INFINITY, 0),
            "limit.per_key_per_second",
        ),
        // ten a day, in a bucket of 100: refilling it takes ten days
        (limit("q", 10.0 / 86_400.0, 100), "limit.burst"),
        (per_key("q", 0.001, 1_000), "limit.per_key_burst"),
    ];
    for (bad, field) in cases {
        let refused = queues
            .set_queue_rate_limit(SetQueueRateLimitRequest {
                limit: Some(bad.clone()),
            })
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument, "{bad:?}");
        assert_eq!(violated_field(&refused), field, "{bad:?}: {refused:?}");
    }
    // one a day, and a bucket that refills within the day, are fine
    for fine in [
        limit("q", 1.0 / 86_400.0, 0),
        per_key("q", 1.0 / 86_400.0, 1),
        per_key("q", 0.001, 86),
    ] {
        queues
            .set_queue_rate_limit(SetQueueRateLimitRequest {
                limit: Some(fine.clone()),
            })
            .await
            .unwrap_or_else(|e| panic!("{fine:?}: {e:?}"));
    }
}

const KEYED: &str = r#"
name: keyed
nodes:
  - { id: step, type: TASK, queue: keyed, task: step, rate_limit_key: "input.key" }
"#;

async fn poll_one(workers: &mut WorkerServiceClient<Channel>) -> Task {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let tasks = workers
            .poll_tasks(PollTasksRequest {
                worker_id: "cleanup-test".to_owned(),
                queues: vec!["keyed".to_owned()],
                max_tasks: 1,
                wait: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                confirm_receipt: false,
            })
            .await
            .expect("poll")
            .into_inner()
            .tasks;
        if let Some(task) = tasks.into_iter().next() {
            return task;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no task leased within {WAIT:?}"
        );
    }
}

/// Every key in the server's Redis database but its streams, with its TTL
/// in seconds (-1: none).
async fn ttls(redis: &mut redis::aio::MultiplexedConnection) -> Vec<(String, String, i64)> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(redis)
        .await
        .expect("keys");
    let mut found = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(redis)
            .await
            .expect("type");
        let ttl: i64 = redis::cmd("TTL")
            .arg(&key)
            .query_async(redis)
            .await
            .expect("ttl");
        found.push((key, kind, ttl));
    }
    found
}

#[tokio::test]
async fn every_rate_limit_bucket_expires_within_a_day_whatever_its_rate() {
    let database_url = fresh_database().await;
    let redis_url = fresh_redis_url();
    let server =
        ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let channel = channel(&server).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(KEYED).await;
    QueueServiceClient::new(channel.clone())
        .set_queue_rate_limit(SetQueueRateLimitRequest {
            limit: Some(per_key("keyed", 1e-3, 0)),
        })
        .await
        .expect("one task per key every 1000 s");
    let mut workers = WorkerServiceClient::new(channel);
    client.start("keyed", json!({ "key": "slow" })).await;
    poll_one(&mut workers).await;

    // a limit stored before the minimum existed (or edited by hand): the
    // server applies it at one a day rather than keep its bucket for years
    let mut database = PgConnection::connect(&database_url)
        .await
        .expect("database");
    sqlx::query("UPDATE queue_rate_limits SET per_key_per_second = 1e-8 WHERE queue = 'keyed'")
        .execute(&mut database)
        .await
        .expect("store a tiny rate");
    // every server reads its limits again within a second
    tokio::time::sleep(Duration::from_secs(3)).await;
    client.start("keyed", json!({ "key": "glacial" })).await;
    poll_one(&mut workers).await;

    let mut redis = redis::Client::open(redis_url.as_str())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let found = ttls(&mut redis).await;
    println!("redis keys after two keyed tasks: {found:?}");
    let buckets: Vec<_> = found
        .iter()
        .filter(|(key, _, _)| key.contains(":key:"))
        .collect();
    assert_eq!(buckets.len(), 2, "a bucket per key: {found:?}");
    for (key, _, ttl) in &buckets {
        assert!(
            (1..=DAY_SECS).contains(ttl),
            "{key} lives {ttl} s; at most a day"
        );
    }
    // nothing but a stream lives without a TTL (task streams are emptied
    // as they are read and deleted once empty: docs/operations.md)
    for (key, kind, ttl) in &found {
        if kind != "stream" {
            assert!(*ttl >= 0, "{key} ({kind}) has no TTL");
        }
    }
}

/// A workflow whose task goes to a queue no worker polls.
const UNPOLLED: &str =
    "name: unpolled\nnodes:\n  - { id: work, type: TASK, queue: unpolled, task: work }\n";

/// Messages in the streams of the queue `unpolled`.
async fn unpolled_messages(redis: &mut redis::aio::MultiplexedConnection) -> i64 {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("composer:tasks:*unpolled*")
        .query_async(redis)
        .await
        .expect("keys");
    let mut messages = 0;
    for key in keys {
        let length: i64 = redis::cmd("XLEN")
            .arg(&key)
            .query_async(redis)
            .await
            .expect("xlen");
        messages += length;
    }
    messages
}

#[tokio::test]
async fn a_queue_nobody_polls_keeps_one_message_per_task_however_long_it_waits() {
    let redis_url = fresh_redis_url();
    let server = ServerProcess::start_with(
        &composer_binary(),
        &fresh_database().await,
        &redis_url,
        &["--lost-dispatch-grace", "1s"],
    )
    .await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(UNPOLLED).await;
    const TASKS: i64 = 20;
    for _ in 0..TASKS {
        client.start("unpolled", json!({})).await;
    }
    let mut redis = redis::Client::open(redis_url.as_str())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    // recovery looks every 2 s: three passes well past the grace
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(
        unpolled_messages(&mut redis).await,
        TASKS,
        "nothing is republished into the stream of a queue nobody polls"
    );

    // the messages are lost; a worker comes: its server republishes them
    let () = redis::cmd("FLUSHDB")
        .query_async(&mut redis)
        .await
        .expect("flushdb");
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    let mut leased = 0;
    let deadline = tokio::time::Instant::now() + WAIT;
    while leased < TASKS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{leased} of {TASKS} leased"
        );
        let answer = workers
            .poll_tasks(PollTasksRequest {
                worker_id: "late".to_owned(),
                queues: vec!["unpolled".to_owned()],
                max_tasks: 10,
                wait: Some(prost_types::Duration {
                    seconds: 2,
                    nanos: 0,
                }),
                confirm_receipt: false,
            })
            .await
            .expect("poll");
        leased += answer.into_inner().tasks.len() as i64;
    }
}
