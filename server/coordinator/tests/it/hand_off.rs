//! Direct hand-off (docs/decisions/0034-direct-hand-off.md): the task a
//! report arms, for a queue on which a poll waits in this server, is
//! leased to that poll in the report's own transaction and never goes
//! through Redis. Without such a poll (none waits, it went away, the queue
//! is rate-limited) the task goes through Redis as before. Real Postgres
//! and Redis throughout; a stream's `entries-added` counts its XADDs.

use crate::common;

use std::{sync::Arc, time::Duration};

use composer_coordinator::{
    Coordinator, CoordinatorConfig, Reporter, TaskReport,
    dispatch::{
        answer_sent::{self, AnswerSent},
        poll_hub::{PollHub, PollRequest},
        streams::{DispatchConfig, Publisher, priority_stream_key},
    },
};
use composer_store::{
    rate_limits::RateLimitSetting,
    tasks::{LeasedTask, TaskScope},
};
use serde_json::json;
use tokio::task::JoinHandle;
use uuid::Uuid;

/// A server's dispatch, in one process: the coordinator, its publisher and
/// its poll hub, on a fresh database and Redis, one stream per queue.
struct Server {
    coordinator: Coordinator,
    hub: Arc<PollHub>,
    redis_url: String,
    queue: String,
}

async fn server(group_commit_window: Duration) -> Server {
    let store = common::fresh_store(8).await;
    let redis_url = composer_testkit::fresh_redis_url();
    let (publisher, deleter) = Publisher::new(store.clone(), &redis_url, 1).expect("publisher");
    tokio::spawn(deleter);
    let hub = PollHub::new(
        store.clone(),
        &redis_url,
        DispatchConfig {
            shards: 1,
            ..DispatchConfig::default()
        },
    )
    .expect("hub");
    let coordinator = Coordinator::new(
        store,
        CoordinatorConfig {
            group_commit_window,
            ..CoordinatorConfig::default()
        },
    )
    .with_publisher(publisher)
    .with_hand_off(Arc::clone(&hub));
    // a queue of its own: a Redis database index may hold an earlier
    // process's streams
    let queue = format!("handed{}", Uuid::new_v4().simple());
    let workflow = format!(
        "name: two\nnodes:\n  - {{ id: a, type: TASK, queue: {queue}, task: a }}\n  \
         - {{ id: b, type: TASK, queue: {queue}, task: b }}\nedges:\n  - {{ from: a, to: b }}\n"
    );
    coordinator
        .workflows()
        .register(coordinator.store(), "default", &workflow)
        .await
        .expect("register");
    Server {
        coordinator,
        hub,
        redis_url,
        queue,
    }
}

/// Reports the task completed, as its worker would.
async fn complete(coordinator: &Coordinator, task: &LeasedTask) {
    complete_telling(coordinator, task, None).await;
}

/// Reports the task completed; `answer_sent` says when the transport has
/// written the answer.
async fn complete_telling(
    coordinator: &Coordinator,
    task: &LeasedTask,
    answer_sent: Option<AnswerSent>,
) {
    coordinator
        .report(
            &TaskScope {
                namespace: "default".to_owned(),
                queues: None,
            },
            &task.id.to_string(),
            task.attempt,
            &task.lease_token.to_string(),
            TaskReport::Completed {
                output: json!({"done": task.task_name}),
            },
            Reporter {
                actor: "worker:w",
                traceparent: None,
                answer_sent,
            },
        )
        .await
        .expect("report");
}

impl Server {
    async fn start(&self) -> Uuid {
        let (run, created) = self
            .coordinator
            .start_run(common::start_request("two", json!({})))
            .await
            .expect("start");
        assert!(created);
        run.id
    }

    /// A poll of the queue by `worker`, waiting up to 10 s, in a task; as
    /// the worker service does, the server remembers what it leased, so
    /// that their reports are applied here.
    fn poll(&self, worker: &'static str) -> JoinHandle<Vec<LeasedTask>> {
        let hub = Arc::clone(&self.hub);
        let coordinator = self.coordinator.clone();
        let queue = self.queue.clone();
        tokio::spawn(async move {
            let leased = hub
                .poll(
                    "default",
                    &[queue],
                    PollRequest {
                        worker_id: worker,
                        max: 8,
                        wait: Duration::from_secs(10),
                        confirm_receipt: false,
                    },
                )
                .await
                .expect("poll");
            coordinator.remember_leases(&leased);
            leased
        })
    }

    /// A poll by `worker` that has reached the hub and waits there.
    async fn waiting_poll(&self, worker: &'static str) -> JoinHandle<Vec<LeasedTask>> {
        let before = self.hub.polls_waiting("default", &self.queue);
        let poll = self.poll(worker);
        while self.hub.polls_waiting("default", &self.queue) == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        poll
    }

    /// The first task of a new run, through Redis (which also tells the
    /// hub that the queue has no rate limit).
    async fn first_task(&self) -> LeasedTask {
        self.start().await;
        let mut got = self.poll("first").await.expect("poll");
        assert_eq!(got.len(), 1, "the run's first task");
        got.remove(0)
    }

    async fn complete(&self, task: &LeasedTask) {
        complete(&self.coordinator, task).await;
    }

    /// `runs` new runs' first tasks, through Redis.
    async fn first_tasks(&self, runs: usize) -> Vec<LeasedTask> {
        for _ in 0..runs {
            self.start().await;
        }
        let mut first = Vec::new();
        while first.len() < runs {
            first.extend(self.poll("first").await.expect("poll"));
        }
        first
    }

    /// Reports every task completed at once, as many workers would.
    async fn complete_at_once(&self, tasks: Vec<LeasedTask>) {
        let reports: Vec<_> = tasks
            .into_iter()
            .map(|task| {
                let coordinator = self.coordinator.clone();
                tokio::spawn(async move { complete(&coordinator, &task).await })
            })
            .collect();
        for report in reports {
            report.await.expect("report");
        }
    }

    /// How many messages were ever XADDed to the queue's stream.
    async fn messages_sent_to_redis(&self) -> i64 {
        let client = redis::Client::open(self.redis_url.as_str()).expect("redis url");
        let mut redis = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis");
        let key = priority_stream_key("default", &self.queue, 0, 3);
        let info: redis::Value = redis::cmd("XINFO")
            .arg("STREAM")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .expect("xinfo");
        let redis::Value::Array(fields) = info else {
            panic!("XINFO STREAM answers an array: {info:?}");
        };
        let at = fields
            .iter()
            .position(|f| matches!(f, redis::Value::BulkString(name) if name == b"entries-added"))
            .expect("entries-added");
        match &fields[at + 1] {
            redis::Value::Int(count) => *count,
            other => panic!("entries-added is a count: {other:?}"),
        }
    }

    /// The task's status, lease owner and token.
    async fn row(&self, task_id: Uuid) -> (String, Option<String>, Option<Uuid>) {
        sqlx::query_as("SELECT status, lease_owner, lease_token FROM tasks WHERE id = $1")
            .bind(task_id)
            .fetch_one(self.coordinator.store().pool())
            .await
            .expect("task row")
    }

    async fn task_of(&self, run_id: Uuid, node: &str) -> Uuid {
        sqlx::query_scalar("SELECT id FROM tasks WHERE run_id = $1 AND node_key = $2")
            .bind(run_id)
            .bind(node)
            .fetch_one(self.coordinator.store().pool())
            .await
            .expect("task")
    }

    async fn run_status(&self, run_id: Uuid) -> String {
        sqlx::query_scalar("SELECT status FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_one(self.coordinator.store().pool())
            .await
            .expect("run")
    }
}

#[tokio::test]
async fn a_reports_next_task_is_leased_to_a_poll_waiting_here_in_the_reports_transaction() {
    let server = server(Duration::from_millis(1)).await;
    let a = server.first_task().await;
    assert_eq!(server.messages_sent_to_redis().await, 1);

    let poll = server.waiting_poll("w2").await;
    server.complete(&a).await;
    let got = poll.await.expect("poll");

    assert_eq!(got.len(), 1, "the next task, handed to the waiting poll");
    let b = &got[0];
    assert_eq!(b.task_name, "b");
    assert_eq!(b.run_id, a.run_id);
    assert_eq!(
        server.row(b.id).await,
        (
            "LEASED".to_owned(),
            Some("w2".to_owned()),
            Some(b.lease_token)
        ),
        "leased to the poll's worker with the token it was sent"
    );
    assert_eq!(
        server.messages_sent_to_redis().await,
        1,
        "the handed task never went through Redis"
    );
    // the hand-off's lease fences as any other
    server.complete(b).await;
    assert_eq!(server.run_status(a.run_id).await, "COMPLETED");
}

/// The order a worker sees: told its step is done, then given the next.
/// Alone (no group commit) and in a group transaction alike.
#[tokio::test]
async fn a_handed_task_goes_out_only_once_the_reports_answer_is_written() {
    for group_commit_window in [Duration::ZERO, Duration::from_millis(1)] {
        let server = server(group_commit_window).await;
        let a = server.first_task().await;
        let poll = server.waiting_poll("w2").await;
        let (in_flight, sent) = answer_sent::signal();

        complete_telling(&server.coordinator, &a, Some(sent)).await;
        // committed and answered, but the answer is not yet written: time
        // for a premature send to show (well under the longest wait)
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !poll.is_finished(),
            "no next task before the report's answer is out ({group_commit_window:?})"
        );
        let b = server.task_of(a.run_id, "b").await;
        assert_eq!(
            server.row(b).await.0,
            "LEASED",
            "leased in the report's transaction all the same"
        );

        drop(in_flight);
        let got = poll.await.expect("poll");
        assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), vec![b]);
        assert_eq!(server.messages_sent_to_redis().await, 1, "handed, not sent");
    }
}

/// A worker that never reads its answer cannot hold another's task: the
/// handed task goes out after a short bound (`answer_sent::MOST_WAIT`).
#[tokio::test]
async fn an_answer_never_written_delays_the_handed_task_only_briefly() {
    let server = server(Duration::from_millis(1)).await;
    let a = server.first_task().await;
    let poll = server.waiting_poll("w2").await;
    let (in_flight, sent) = answer_sent::signal();

    complete_telling(&server.coordinator, &a, Some(sent)).await;
    let got = poll.await.expect("poll");

    assert_eq!(got.len(), 1, "the next task, handed");
    assert_eq!(got[0].task_name, "b");
    drop(in_flight);
}

#[tokio::test]
async fn without_a_waiting_poll_the_next_task_goes_through_redis() {
    let server = server(Duration::from_millis(1)).await;
    let a = server.first_task().await;

    server.complete(&a).await;
    let b = server.task_of(a.run_id, "b").await;
    assert_eq!(server.row(b).await.0, "DISPATCHED");
    assert_eq!(server.messages_sent_to_redis().await, 2);

    let got = server.poll("w2").await.expect("poll");
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), vec![b]);
}

#[tokio::test]
async fn a_poll_that_went_away_is_handed_nothing() {
    let server = server(Duration::from_millis(1)).await;
    let a = server.first_task().await;

    let gone = server.waiting_poll("gone").await;
    gone.abort();
    let _ = gone.await;
    server.complete(&a).await;

    let b = server.task_of(a.run_id, "b").await;
    assert_eq!(
        server.row(b).await,
        ("DISPATCHED".to_owned(), None, None),
        "not leased to a poll that is gone"
    );
    assert_eq!(server.messages_sent_to_redis().await, 2);
    let got = server.poll("w2").await.expect("poll");
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), vec![b]);
}

#[tokio::test]
async fn a_rate_limited_queues_tasks_go_through_its_tokens_not_by_hand_off() {
    let server = server(Duration::from_millis(1)).await;
    server
        .coordinator
        .set_queue_rate_limit(&RateLimitSetting {
            namespace: "default",
            queue: &server.queue,
            per_second: 1000.0,
            burst: 1000,
            per_key_per_second: None,
            per_key_burst: None,
        })
        .await
        .expect("rate limit");
    let a = server.first_task().await;

    let poll = server.waiting_poll("w2").await;
    server.complete(&a).await;
    let got = poll.await.expect("poll");

    assert_eq!(got.len(), 1, "the poll still gets the task, through Redis");
    assert_eq!(got[0].task_name, "b");
    assert_eq!(server.messages_sent_to_redis().await, 2);
}

/// Reports of many runs at once, alone and in group transactions, with
/// four polls waiting: each transaction hands tasks to one poll at most;
/// every next task is either handed (leased to the poll that received it)
/// or sent through Redis (and leased by a later poll), never both and
/// never lost.
#[tokio::test]
async fn reports_applied_together_hand_off_some_tasks_and_send_the_rest() {
    const RUNS: usize = 12;
    let server = server(Duration::from_millis(50)).await;
    let first = server.first_tasks(RUNS).await;
    let sent_before = server.messages_sent_to_redis().await;
    assert_eq!(sent_before, i64::try_from(RUNS).expect("count"));

    let mut waiting = Vec::new();
    for _ in 0..4 {
        waiting.push(server.waiting_poll("w2").await);
    }
    server.complete_at_once(first).await;
    let mut received = Vec::new();
    for poll in waiting {
        received.extend(poll.await.expect("poll"));
    }
    let through_redis =
        usize::try_from(server.messages_sent_to_redis().await - sent_before).expect("count");
    assert!(
        through_redis < RUNS,
        "the first report, alone at an idle server, hands its task to a waiting poll"
    );
    while received.len() < RUNS {
        received.extend(server.poll("w3").await.expect("poll"));
    }
    let mut ids: Vec<Uuid> = received.iter().map(|t| t.id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids.len(),
        RUNS,
        "every next task received once: {received:?}"
    );
    for task in &received {
        assert_eq!(task.task_name, "b");
        let (status, owner, token) = server.row(task.id).await;
        assert_eq!(status, "LEASED");
        assert_eq!(
            token,
            Some(task.lease_token),
            "leased to the poll that got it"
        );
        assert!(owner.is_some());
    }
    for task in &received {
        server.complete(task).await;
    }
    let done: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'COMPLETED'")
        .fetch_one(server.coordinator.store().pool())
        .await
        .expect("count");
    assert_eq!(done, i64::try_from(RUNS).expect("count"));
}

/// Decision 0051: reports applied together write the tasks they hand off
/// LEASED as they arm them, one row write each instead of an insert and a
/// lease. A row written once by a statement keeps that statement's command
/// id (`cmin`), the same as the history rows the statement wrote beside
/// it; a lease after the write would be a later command.
#[tokio::test]
async fn tasks_handed_off_by_a_shared_write_are_leased_as_they_are_armed() {
    const RUNS: usize = 6;
    let server = server(Duration::from_millis(50)).await;
    let first = server.first_tasks(RUNS).await;
    let sent_before = server.messages_sent_to_redis().await;
    let poll = server.waiting_poll("w2").await;
    server.complete_at_once(first).await;
    let handed = poll.await.expect("poll");
    assert!(!handed.is_empty(), "the waiting poll was handed tasks");
    let mut written_once = 0;
    for task in &handed {
        let (status, owner, token) = server.row(task.id).await;
        assert_eq!(
            (status.as_str(), owner.as_deref(), token),
            ("LEASED", Some("w2"), Some(task.lease_token)),
            "leased to the poll's worker with the token it was sent"
        );
        let (expires, dispatched): (
            Option<chrono::DateTime<chrono::Utc>>,
            Option<chrono::DateTime<chrono::Utc>>,
        ) = sqlx::query_as("SELECT lease_expires_at, dispatched_at FROM tasks WHERE id = $1")
            .bind(task.id)
            .fetch_one(server.coordinator.store().pool())
            .await
            .expect("task row");
        assert_eq!(
            expires,
            Some(task.lease_expires_at),
            "the lease it was sent"
        );
        assert!(dispatched.is_some());
        let once: bool = sqlx::query_scalar(
            "SELECT t.xmin::text = e.xmin::text AND t.cmin::text = e.cmin::text \
             FROM tasks t JOIN run_events e ON e.run_id = t.run_id \
               AND ((e.event_type = 'node_started' AND e.node_key = t.node_key) \
                 OR e.more @> jsonb_build_array(jsonb_build_array('node_started', t.node_key))) \
             WHERE t.id = $1",
        )
        .bind(task.id)
        .fetch_one(server.coordinator.store().pool())
        .await
        .expect("versions");
        written_once += usize::from(once);
    }
    assert!(
        written_once > 0,
        "a shared write's handed tasks are written leased, by the statement that armed them"
    );
    // handed tasks never went through Redis, and they fence as any other
    let through_redis = server.messages_sent_to_redis().await - sent_before;
    assert_eq!(
        usize::try_from(through_redis).expect("count") + handed.len(),
        RUNS,
        "each next task sent once: handed or through Redis"
    );
    for task in &handed {
        server.complete(task).await;
        assert_eq!(server.run_status(task.run_id).await, "COMPLETED");
    }
}
