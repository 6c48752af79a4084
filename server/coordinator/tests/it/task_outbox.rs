//! The task row is its own outbox (docs/decisions/0024-task-row-outbox.md):
//! a task armed by an event is sent to Redis by the server that committed
//! it, with no outbox row written; a task Redis does not take gets one
//! then; a task whose send was lost (a crash right after the commit) is
//! found by the lost-dispatch pass. Real Postgres and Redis throughout.

use crate::common;

use std::sync::Arc;

use composer_coordinator::{Coordinator, CoordinatorConfig, dispatch::streams::Publisher};
use composer_store::tasks;
use serde_json::json;
use uuid::Uuid;

const WORKFLOW: &str =
    "name: one\nnodes:\n  - { id: work, type: TASK, queue: outboxed, task: work }\n";

/// A coordinator on a fresh database whose committed tasks go to
/// `redis_url` at once.
async fn coordinator_publishing_to(redis_url: &str) -> Coordinator {
    let store = common::fresh_store(4).await;
    let (publisher, deleter) = Publisher::new(store.clone(), redis_url, 1).expect("publisher");
    tokio::spawn(deleter);
    let coordinator = Coordinator::new(store, CoordinatorConfig::default())
        .with_publisher(Arc::clone(&publisher));
    coordinator
        .workflows()
        .register(coordinator.store(), "default", WORKFLOW)
        .await
        .expect("register");
    coordinator
}

async fn start_one(coordinator: &Coordinator) -> Uuid {
    let (run, created) = coordinator
        .start_run(common::start_request("one", json!({})))
        .await
        .expect("start");
    assert!(created);
    run.id
}

async fn task_of(coordinator: &Coordinator, run_id: Uuid) -> (Uuid, String) {
    sqlx::query_as("SELECT id, status FROM tasks WHERE run_id = $1")
        .bind(run_id)
        .fetch_one(coordinator.store().pool())
        .await
        .expect("the run's task")
}

async fn outbox_rows_of(coordinator: &Coordinator, task_id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE task_id = $1")
        .bind(task_id)
        .fetch_one(coordinator.store().pool())
        .await
        .expect("count")
}

/// Every task id in the test queue's stream. Only that stream: a database
/// index can hold what an earlier test process left in it.
async fn task_ids_in_redis(redis_url: &str) -> Vec<Uuid> {
    let client = redis::Client::open(redis_url).expect("redis url");
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    // one shard: the publisher of `coordinator_publishing_to`
    let key = composer_coordinator::dispatch::streams::stream_key("default", "outboxed", 0);
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await
        .expect("xrange");
    entries
        .ids
        .iter()
        .map(|entry| {
            let id: String = entry.get("task_id").expect("task_id field");
            id.parse().expect("a uuid")
        })
        .collect()
}

#[tokio::test]
async fn a_committed_task_goes_to_redis_with_no_outbox_row_written() {
    let redis_url = composer_testkit::fresh_redis_url();
    let coordinator = coordinator_publishing_to(&redis_url).await;
    let run_id = start_one(&coordinator).await;
    let (task_id, status) = task_of(&coordinator, run_id).await;
    assert_eq!(status, "DISPATCHED");
    assert_eq!(task_ids_in_redis(&redis_url).await, vec![task_id]);
    assert_eq!(
        outbox_rows_of(&coordinator, task_id).await,
        0,
        "the task row is its own outbox"
    );
}

#[tokio::test]
async fn a_task_redis_does_not_take_is_left_in_the_outbox_for_the_enqueuer() {
    // nothing listens on port 1 of loopback: every send fails
    let coordinator = coordinator_publishing_to("redis://127.0.0.1:1/").await;
    let run_id = start_one(&coordinator).await;
    let (task_id, status) = task_of(&coordinator, run_id).await;
    assert_eq!(status, "DISPATCHED");
    assert_eq!(outbox_rows_of(&coordinator, task_id).await, 1);

    // the enqueuer's own statement takes it, ready for any server to send
    let mut tx = coordinator.store().begin().await.expect("begin");
    let taken = tasks::take_outbox(&mut tx, 10, 0).await.expect("take");
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].task_id, task_id);
    assert_eq!(taken[0].attempt, 1);
    assert_eq!(taken[0].shard_key, run_id);
}

#[tokio::test]
async fn a_send_lost_after_the_commit_is_found_by_the_lost_dispatch_pass_of_a_served_queue() {
    let redis_url = composer_testkit::fresh_redis_url();
    let coordinator = coordinator_publishing_to(&redis_url).await;
    let run_id = start_one(&coordinator).await;
    let (task_id, _) = task_of(&coordinator, run_id).await;
    // what a crash between the commit and the XADD leaves: the task row
    // DISPATCHED, no outbox row, nothing in Redis
    let client = redis::Client::open(redis_url.as_str()).expect("redis url");
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let () = redis::cmd("FLUSHDB")
        .query_async(&mut redis)
        .await
        .expect("flushdb");
    assert!(task_ids_in_redis(&redis_url).await.is_empty());
    assert_eq!(outbox_rows_of(&coordinator, task_id).await, 0);

    let pool = coordinator.store().pool();
    let elsewhere = [
        ("default".to_owned(), "another".to_owned()),
        ("other".to_owned(), "outboxed".to_owned()),
    ];
    assert_eq!(
        tasks::republish_lost_dispatches(pool, 0, 100, &elsewhere)
            .await
            .expect("pass"),
        0,
        "a queue no poll of this server serves keeps its messages in its stream"
    );
    let served = [("default".to_owned(), "outboxed".to_owned())];
    assert_eq!(
        tasks::republish_lost_dispatches(pool, 60_000, 100, &served)
            .await
            .expect("pass"),
        0,
        "within the grace the task is not lost yet"
    );
    assert_eq!(
        tasks::republish_lost_dispatches(pool, 0, 100, &served)
            .await
            .expect("pass"),
        1
    );
    assert_eq!(outbox_rows_of(&coordinator, task_id).await, 1);
}
