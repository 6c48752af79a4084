//! WatchRun's change feed (docs/decisions/0035-watch-from-one-feed.md), on
//! real Postgres and Redis: the streams of a run share one read per change
//! and the run is forgotten when they go; a burst of changes is read a few
//! times a second, not once per change; and a change whose announcement
//! was lost is read once the subscription comes back, not a minute later.

use crate::common;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use composer_coordinator::{
    Coordinator, CoordinatorConfig, EventTarget,
    events::watch::{ChangeFeed, MIN_READ_INTERVAL, RunChanges, RunSnapshot, RunWatch, Watched},
};
use composer_store::runs::RunRow;
use serde_json::json;
use tokio::sync::watch;

const WAITER: &str = "name: waiter\nnodes:\n  - { id: go, type: WAIT_FOR_EVENT, event: go }\n  - { id: more, type: WAIT_FOR_EVENT, event: more }\nedges:\n  - { from: go, to: more }\n";

/// Held to read by the tests that count on their subscription, and to
/// write by the one that breaks subscriptions: `CLIENT KILL TYPE pubsub`
/// breaks every subscription on the Redis server, another test's too.
static SUBSCRIPTIONS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Well under the safety read's interval (45 s at the earliest).
const PROMPTLY: Duration = Duration::from_secs(10);

/// One server's side of the feed: a coordinator that announces what it
/// commits, one that announces nothing (its announcements are "lost"),
/// and the subscription with its followed runs.
struct Feed {
    announced: Coordinator,
    unannounced: Coordinator,
    changes: RunChanges,
    redis_url: String,
    _stop: watch::Sender<bool>,
}

async fn feed() -> Feed {
    let store = common::fresh_store(8).await;
    let redis_url = composer_testkit::fresh_redis_url();
    let (announcer, publishing) = ChangeFeed::new(&redis_url).expect("feed");
    tokio::spawn(publishing);
    let unannounced = Coordinator::new(store.clone(), CoordinatorConfig::default());
    let announced = Coordinator::new(store, CoordinatorConfig::default()).with_changes(announcer);
    announced
        .workflows()
        .register(announced.store(), "default", WAITER)
        .await
        .expect("register");
    let changes = RunChanges::new();
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(changes.clone().run(redis_url.clone(), stopped));
    let deadline = Instant::now() + PROMPTLY;
    while !changes.subscribed() {
        assert!(Instant::now() < deadline, "the subscription never came up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Feed {
        announced,
        unannounced,
        changes,
        redis_url,
        _stop: stop,
    }
}

impl Feed {
    async fn start(&self) -> RunRow {
        self.announced
            .start_run(common::start_request("waiter", json!({})))
            .await
            .expect("start")
            .0
    }

    async fn send(&self, coordinator: &Coordinator, run: &RunRow, name: &str) {
        coordinator
            .send_event(
                "default",
                EventTarget::Run(run.id),
                name,
                json!({}),
                None,
                "test",
            )
            .await
            .expect("send");
    }
}

/// The watch's next snapshot, within [`PROMPTLY`].
async fn next(watch: &mut RunWatch) -> Arc<RunSnapshot> {
    match tokio::time::timeout(PROMPTLY, watch.next()).await {
        Ok(Some(Watched::Snapshot(snapshot))) => snapshot,
        other => panic!("no snapshot within {PROMPTLY:?}: {other:?}"),
    }
}

fn node_status<'a>(snapshot: &'a RunSnapshot, node: &str) -> Option<&'a str> {
    snapshot
        .view
        .nodes
        .iter()
        .find(|n| n.key == node)
        .map(|n| n.status.as_str())
}

#[tokio::test]
async fn the_streams_of_a_run_share_one_read_per_change_and_the_run_is_forgotten_with_them() {
    let _shared = SUBSCRIPTIONS.read().await;
    let feed = feed().await;
    let run = feed.start().await;
    let mut watches: Vec<RunWatch> = (0..100)
        .map(|_| feed.changes.watch(&feed.announced, &run))
        .collect();
    assert_eq!(feed.changes.followed_runs(), 1, "one entry for 100 streams");

    let mut firsts = Vec::new();
    for watch in &mut watches {
        firsts.push(next(watch).await);
    }
    assert!(
        firsts.iter().all(|s| Arc::ptr_eq(s, &firsts[0])),
        "every stream got the same read"
    );
    assert_eq!(node_status(&firsts[0], "go"), Some("WAITING"));

    feed.send(&feed.announced, &run, "go").await;
    let mut changed = Vec::new();
    for watch in &mut watches {
        changed.push(next(watch).await);
    }
    assert!(changed.iter().all(|s| Arc::ptr_eq(s, &changed[0])));
    assert_eq!(node_status(&changed[0], "go"), Some("COMPLETED"));
    assert_eq!(
        changed[0].after_seq,
        firsts[0].last_seq(),
        "the second read carries only the events after the first"
    );

    drop(watches);
    let deadline = Instant::now() + PROMPTLY;
    while feed.changes.followed_runs() > 0 {
        assert!(Instant::now() < deadline, "the run is still followed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// the server's runtime has a thread per core: the reads go on while the
// senders wait on Postgres
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_changes_is_read_a_few_times_a_second_not_once_per_change() {
    let _shared = SUBSCRIPTIONS.read().await;
    let feed = feed().await;
    let run = feed.start().await;
    let mut watch = feed.changes.watch(&feed.announced, &run);
    next(&mut watch).await;
    // the stream reads on while the changes come; it learns the last
    // event's number once they are all in
    let (last_known, mut last) = watch::channel(i64::MAX);
    let reader = tokio::spawn(async move {
        let mut snapshots = 0_u32;
        loop {
            let snapshot = next(&mut watch).await;
            snapshots += 1;
            if snapshot.last_seq() >= *last.borrow_and_update() {
                return snapshots;
            }
        }
    });

    let began = Instant::now();
    let mut senders = Vec::new();
    for _ in 0..8 {
        let (coordinator, run) = (feed.announced.clone(), run.clone());
        senders.push(tokio::spawn(async move {
            for _ in 0..40 {
                coordinator
                    .send_event(
                        "default",
                        EventTarget::Run(run.id),
                        "noise",
                        json!({}),
                        None,
                        "test",
                    )
                    .await
                    .expect("send");
            }
        }));
    }
    for sender in senders {
        sender.await.expect("sender");
    }
    let last_seq = feed
        .announced
        .history(Some("default"), &run.id.to_string(), 0, 10_000)
        .await
        .expect("history")
        .last()
        .map(|event| event.seq)
        .expect("events");
    last_known.send_replace(last_seq);
    // a stream waiting on a snapshot already read learns of the end with
    // the next announcement
    feed.send(&feed.announced, &run, "noise").await;
    let snapshots = reader.await.expect("reader");

    let elapsed = began.elapsed();
    let most = elapsed.as_secs_f64() / MIN_READ_INTERVAL.as_secs_f64() + 2.0;
    println!("321 changes in {elapsed:?}: {snapshots} snapshots (at most {most:.0})");
    assert!(
        f64::from(snapshots) <= most,
        "{snapshots} snapshots in {elapsed:?}"
    );
    assert!(snapshots >= 2, "the changes were read while they came");
}

#[tokio::test]
async fn a_change_whose_announcement_was_lost_is_read_once_the_subscription_comes_back() {
    let _alone = SUBSCRIPTIONS.write().await;
    let feed = feed().await;
    let run = feed.start().await;
    let mut watch = feed.changes.watch(&feed.announced, &run);
    next(&mut watch).await;

    // committed, never announced: as if the PUBLISH were lost
    feed.send(&feed.unannounced, &run, "go").await;
    // the subscription breaks and comes back
    let redis = redis::Client::open(feed.redis_url.as_str()).expect("redis url");
    let mut connection = redis
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut connection)
        .await
        .expect("client kill");

    let began = Instant::now();
    let snapshot = next(&mut watch).await;
    println!("read {:?} after the subscription broke", began.elapsed());
    assert_eq!(node_status(&snapshot, "go"), Some("COMPLETED"));
}
