//! Run changes for WatchRun: one feed per server, one read per change.
//!
//! The server that commits an event announces the run's id after the commit
//! ([`ChangeFeed`], Redis pub/sub on [`CHANNEL`]). Every server keeps one
//! subscription and a registry of the runs its WatchRun streams follow
//! ([`RunChanges`]): one entry per run, however many streams follow it. An
//! announcement of a followed run wakes that entry's reader, which reads
//! the run once and publishes the result, an `Arc`'d [`RunSnapshot`] in a
//! `tokio::sync::watch`, to every stream of the run. A stream waits on that
//! watch and on nothing else: an idle stream costs no CPU and no read, and
//! a slow one skips to the latest snapshot instead of queueing each.
//!
//! An entry reads at most once per [`MIN_READ_INTERVAL`], so a run that
//! changes a thousand times a second is read a few times a second. As
//! announcements are best effort, an entry also reads:
//!
//! - when the subscription comes (back) up, spread over [`RESYNC_SPREAD`]:
//!   what was announced while it was down is lost;
//! - about every [`OUTAGE_INTERVAL`] while the subscription is down;
//! - about every [`SAFETY_INTERVAL`] otherwise: a server that cannot
//!   publish drops the announcement, and the subscribers, still connected,
//!   never learn of it.
//!
//! A read that finds nothing new publishes nothing. The entry goes when its
//! last stream closes.
//!
//! The API sends the whole run in every message. The streams that have
//! sent everything before a snapshot (all of them, unless one joined late
//! or fell behind) send it as one message encoded once
//! ([`RunSnapshot::message`]), sharing its bytes. A stream out of step
//! builds a message of its own, and only when its connection asks for one;
//! what those messages hold that their connections have not taken yet is
//! bounded server-wide by [`SEND_BUDGET_BYTES`] ([`RunWatch::admit`]). A
//! client that stops reading holds its share for [`MAX_SEND_HOLD`] at
//! most, then only its own one message.
//!
//! Postgres NOTIFY carried the ids before Redis, but a notifying commit
//! holds a database-wide lock until its WAL is flushed, which serialised
//! every event transaction (docs/decisions/0009). Why one feed per server
//! and shared snapshots: docs/decisions/0035.

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError},
    time::{Duration, Instant},
};

use composer_store::runs::{self, HistoryRow, NodeRow, RunRow};
use futures::StreamExt;
use serde_json::Value as Json;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};
use uuid::Uuid;

use crate::{
    Coordinator, CoordinatorError, RunView,
    dispatch::redis_conn::{BrokerError, RedisClient, RedisConnection},
    observe::metrics,
};

/// The Redis pub/sub channel run changes go to: a message is the ids of the
/// changed runs, separated by spaces.
pub const CHANNEL: &str = "composer:runs";

/// History events one snapshot (or one WatchRun message) carries, at most.
pub const HISTORY_PAGE: i64 = 1000;

/// The shortest time between two reads of one run: announcements within it
/// make one read at its end.
pub const MIN_READ_INTERVAL: Duration = Duration::from_millis(200);

/// About how often a followed run is read while the subscription is up and
/// nothing is announced (jittered by a quarter either way).
pub const SAFETY_INTERVAL: Duration = Duration::from_secs(60);

/// About how often a followed run is read while the subscription is down
/// (jittered by a quarter either way).
pub const OUTAGE_INTERVAL: Duration = Duration::from_secs(5);

/// When the subscription comes back, the followed runs are read again at
/// random moments within this window, not all at once.
pub const RESYNC_SPREAD: Duration = Duration::from_secs(2);

/// Bytes of WatchRun messages the server's streams may have built that
/// their connections have not taken yet, all streams together.
pub const SEND_BUDGET_BYTES: usize = 16 << 20;

/// How long one message counts against [`SEND_BUDGET_BYTES`] at most.
pub const MAX_SEND_HOLD: Duration = Duration::from_secs(1);

/// The budget in the units of its semaphore, KiB.
const SEND_BUDGET_KIB: u32 = (SEND_BUDGET_BYTES / 1024) as u32;

/// The longest pause before a failed read is tried again.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(16);

/// Ids per message, at most.
const BATCH: usize = 256;

/// Announces changed runs to every server. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ChangeFeed {
    sender: mpsc::UnboundedSender<Uuid>,
}

impl ChangeFeed {
    /// A feed to `redis_url`, and the task that publishes what it is given
    /// (run it until shutdown; it ends when every feed is dropped).
    pub fn new(
        redis_url: &str,
    ) -> Result<(Self, impl std::future::Future<Output = ()> + Send + use<>), BrokerError> {
        let client = RedisClient::open(redis_url)?;
        let (sender, receiver) = mpsc::unbounded_channel();
        Ok((Self { sender }, publish_changes(client, receiver)))
    }

    /// Announces, after its commit, that `run_id` changed.
    pub fn changed(&self, run_id: Uuid) {
        let _ = self.sender.send(run_id);
    }
}

/// Publishes the ids queued since the last message as one message.
async fn publish_changes(client: RedisClient, mut ids: mpsc::UnboundedReceiver<Uuid>) {
    let mut connection: Option<RedisConnection> = None;
    let mut batch: Vec<Uuid> = Vec::new();
    while let Some(id) = ids.recv().await {
        batch.push(id);
        while batch.len() < BATCH {
            match ids.try_recv() {
                Ok(id) => batch.push(id),
                Err(_) => break,
            }
        }
        let message = batch
            .iter()
            .map(Uuid::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        batch.clear();
        // a connection that broke since the last message gets one fresh
        // try: a lost announcement waits for the watchers' safety read
        for _ in 0..2 {
            if connection.is_none() {
                connection = client.connect().await.ok();
            }
            let Some(active) = connection.as_mut() else {
                break;
            };
            let sent: redis::RedisResult<i64> = redis::cmd("PUBLISH")
                .arg(CHANNEL)
                .arg(&message)
                .query_async(active)
                .await;
            match sent {
                Ok(_) => break,
                Err(error) => {
                    tracing::debug!(%error, "run change not announced");
                    connection = None;
                }
            }
        }
    }
}

/// One read of a followed run, shared by every stream that follows it.
#[derive(Debug)]
pub struct RunSnapshot {
    /// The run with its node states.
    pub view: RunView,
    /// History events after `after_seq`, oldest first, at most
    /// [`HISTORY_PAGE`] of them.
    pub events: Vec<HistoryRow>,
    /// The sequence number `events` follow.
    pub after_seq: i64,
    /// About how many bytes the run takes in a message, events aside.
    pub view_bytes: usize,
    /// This snapshot as one encoded WatchRun message, the run with all of
    /// `events`: made once, by the API layer, for every stream that sent
    /// everything up to `after_seq` (the streams in step send the same
    /// bytes, not a copy each).
    pub message: OnceLock<Arc<[u8]>>,
}

impl RunSnapshot {
    /// The sequence number of the last event this snapshot knows of.
    pub fn last_seq(&self) -> i64 {
        self.events.last().map_or(self.after_seq, |event| event.seq)
    }

    /// Whether the run has a final status.
    pub fn has_ended(&self) -> bool {
        matches!(
            self.view.run.status.as_str(),
            "COMPLETED" | "FAILED" | "CANCELLED"
        )
    }

    /// The events after `seq`, if this snapshot reaches back to it (None:
    /// the caller missed events this snapshot does not carry).
    pub fn events_after(&self, seq: i64) -> Option<&[HistoryRow]> {
        if seq < self.after_seq {
            return None;
        }
        let first = self.events.partition_point(|event| event.seq <= seq);
        Some(&self.events[first..])
    }

    /// Whether `newer` shows nothing this snapshot does not.
    fn same_as(&self, newer: &RunSnapshot) -> bool {
        newer.events.is_empty()
            && self.view.run == newer.view.run
            && self.view.nodes == newer.view.nodes
    }
}

/// What the streams of a run see of it.
#[derive(Clone, Debug)]
pub enum Watched {
    /// The run as last read.
    Snapshot(Arc<RunSnapshot>),
    /// The run no longer exists (retention deleted it).
    Gone,
}

/// Why a followed run is read (a label of `composer_watch_reads_total`).
#[derive(Clone, Copy, Debug)]
enum ReadCause {
    /// A stream started following it.
    First,
    /// Its change was announced.
    Announced,
    /// The subscription came back: announcements may have been lost.
    Resubscribed,
    /// Nothing announced within the safety (or outage) interval.
    Fallback,
    /// The last read brought a full page of history.
    MoreHistory,
    /// The last read failed.
    Retry,
}

impl ReadCause {
    fn label(self) -> &'static str {
        match self {
            ReadCause::First => "first",
            ReadCause::Announced => "announced",
            ReadCause::Resubscribed => "resubscribed",
            ReadCause::Fallback => "fallback",
            ReadCause::MoreHistory => "more_history",
            ReadCause::Retry => "retry",
        }
    }
}

/// The latest state of a followed run, `None` before its first read.
type Latest = Option<Watched>;

/// The subscription, as the followed runs see it.
#[derive(Clone, Copy, Debug, Default)]
struct FeedState {
    /// Whether announcements arrive.
    subscribed: bool,
}

/// This server's subscription to run changes and the runs its streams
/// follow. Cheap to clone.
#[derive(Clone)]
pub struct RunChanges {
    registry: Arc<Registry>,
}

struct Registry {
    /// The followed runs by id.
    runs: Mutex<HashMap<Uuid, Arc<Followed>>>,
    /// Whether the subscription is up; followed runs watch it.
    feed: watch::Sender<FeedState>,
    /// Bounds what the streams have built and not sent.
    budget: SendBudget,
}

/// One followed run.
struct Followed {
    /// The latest read; a receiver per stream.
    latest: watch::Sender<Latest>,
    /// Set by an announcement of the run; coalesces any number of them.
    announced: Notify,
}

/// A stream's view of its run: the latest snapshot, without a queue.
pub struct RunWatch {
    latest: watch::Receiver<Latest>,
    registry: Arc<Registry>,
}

impl RunWatch {
    /// The run's state this watch has not returned yet, waiting for a newer
    /// one when it has returned the latest. None: the server stopped
    /// following the run.
    pub async fn next(&mut self) -> Option<Watched> {
        loop {
            self.latest.changed().await.ok()?;
            if let Some(state) = self.latest.borrow_and_update().clone() {
                return Some(state);
            }
        }
    }

    /// The run's latest state, returned or not, without waiting.
    pub fn current(&mut self) -> Option<Watched> {
        self.latest.borrow_and_update().clone()
    }

    /// Waits until a message of about `bytes` fits in the server's send
    /// budget. Keep the permit until the connection asks for the next
    /// message: that it asks shows it took this one.
    pub async fn admit(&self, bytes: usize) -> SendPermit {
        self.registry.budget.admit(bytes).await
    }
}

/// The part of the server's send budget one message holds; it goes back
/// when dropped or after [`MAX_SEND_HOLD`], whichever comes first.
pub struct SendPermit {
    share: Share,
}

impl Drop for SendPermit {
    fn drop(&mut self) {
        take_back(&self.share);
    }
}

type Share = Arc<Mutex<Option<OwnedSemaphorePermit>>>;

fn take_back(share: &Share) {
    share.lock().unwrap_or_else(PoisonError::into_inner).take();
}

/// What this server's streams have built and their connections not taken.
struct SendBudget {
    permits: Arc<Semaphore>,
    /// Shares to take back when their hold ends, in the order they end.
    holds: OnceLock<mpsc::UnboundedSender<(Instant, Share)>>,
}

impl SendBudget {
    fn new() -> Self {
        Self {
            permits: Arc::new(Semaphore::new(SEND_BUDGET_KIB as usize)),
            holds: OnceLock::new(),
        }
    }

    async fn admit(&self, bytes: usize) -> SendPermit {
        // larger than the whole budget: waits for all of it
        let kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .clamp(1, SEND_BUDGET_KIB);
        // the semaphore is never closed
        let permit = self.permits.clone().acquire_many_owned(kib).await.ok();
        let share = Arc::new(Mutex::new(permit));
        let holds = self.holds.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(end_holds(receiver));
            sender
        });
        let _ = holds.send((Instant::now() + MAX_SEND_HOLD, share.clone()));
        SendPermit { share }
    }
}

/// Takes each share back when its hold ends (every hold is as long, so
/// they end in the order they began).
async fn end_holds(mut holds: mpsc::UnboundedReceiver<(Instant, Share)>) {
    while let Some((ends, share)) = holds.recv().await {
        tokio::time::sleep_until(ends.into()).await;
        take_back(&share);
    }
}

impl RunChanges {
    /// A registry with no subscription yet.
    pub fn new() -> Self {
        Self {
            registry: Arc::new(Registry {
                runs: Mutex::default(),
                feed: watch::Sender::new(FeedState::default()),
                budget: SendBudget::new(),
            }),
        }
    }

    /// Follows `run` for one stream: its latest snapshot comes first (at
    /// once if another stream follows it already). The caller has checked
    /// that the stream may see the run.
    pub fn watch(&self, coordinator: &Coordinator, run: &RunRow) -> RunWatch {
        let mut runs = self.registry.runs();
        let followed = runs.entry(run.id).or_insert_with(|| {
            let followed = Arc::new(Followed {
                latest: watch::Sender::new(None),
                announced: Notify::new(),
            });
            tokio::spawn(self.registry.clone().follow(
                followed.clone(),
                coordinator.clone(),
                run.id,
                run.namespace.clone(),
            ));
            followed
        });
        let mut latest = followed.latest.subscribe();
        latest.mark_changed();
        RunWatch {
            latest,
            registry: self.registry.clone(),
        }
    }

    /// How many runs this server follows.
    pub fn followed_runs(&self) -> usize {
        self.registry.runs().len()
    }

    /// Whether the subscription is up (announcements arrive).
    pub fn subscribed(&self) -> bool {
        self.registry.feed.borrow().subscribed
    }

    /// Follows the Redis channel until `shutdown` flips, resubscribing after
    /// a failure. On a cluster the subscription goes through one seed node
    /// and moves to the next when that one fails: a message published on
    /// any node reaches every node's subscribers.
    pub async fn run(self, redis_url: String, mut shutdown: watch::Receiver<bool>) {
        let clients = match RedisClient::open(&redis_url) {
            Ok(client) => client.pubsub_clients(),
            Err(error) => {
                tracing::error!(%error, "run change subscription not started");
                return;
            }
        };
        let mut next = 0;
        while !*shutdown.borrow() {
            let client = &clients[next % clients.len()];
            next += 1;
            let subscription = async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(CHANNEL).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            let mut pubsub = match subscription.await {
                Ok(pubsub) => pubsub,
                Err(error) => {
                    tracing::warn!(%error, "run change subscription");
                    // a cluster's other seeds are tried at once, then a pause
                    let pause = if next % clients.len() == 0 {
                        Duration::from_secs(1)
                    } else {
                        Duration::ZERO
                    };
                    tokio::select! {
                        () = tokio::time::sleep(pause) => continue,
                        _ = shutdown.changed() => return,
                    }
                }
            };
            // what was announced while down is lost: every run is read again
            self.registry.set_subscribed(true);
            let mut messages = pubsub.on_message();
            loop {
                tokio::select! {
                    message = messages.next() => {
                        let Some(message) = message else {
                            tracing::warn!("run change subscription lost");
                            break;
                        };
                        let payload: String = message.get_payload().unwrap_or_default();
                        self.registry.announce(&payload);
                    }
                    _ = shutdown.changed() => return,
                }
            }
            self.registry.set_subscribed(false);
        }
    }
}

impl Default for RunChanges {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    fn runs(&self) -> MutexGuard<'_, HashMap<Uuid, Arc<Followed>>> {
        // the map stays consistent whatever a panicking holder did
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_subscribed(&self, subscribed: bool) {
        self.feed.send_replace(FeedState { subscribed });
    }

    /// Wakes the followed runs among the ids of one message.
    fn announce(&self, payload: &str) {
        let runs = self.runs();
        for id in payload.split(' ').filter_map(|id| Uuid::parse_str(id).ok()) {
            if let Some(followed) = runs.get(&id) {
                followed.announced.notify_one();
            }
        }
    }

    /// Forgets `followed` if no stream follows it any more (false: one
    /// came back meanwhile).
    fn forget_if_unwatched(&self, run_id: Uuid, followed: &Arc<Followed>) -> bool {
        let mut runs = self.runs();
        if followed.latest.receiver_count() > 0 {
            return false;
        }
        if runs
            .get(&run_id)
            .is_some_and(|entry| Arc::ptr_eq(entry, followed))
        {
            runs.remove(&run_id);
        }
        metrics::watched_runs(runs.len());
        true
    }

    /// Reads the run whenever it may have changed and publishes what is
    /// new, until no stream follows it.
    async fn follow(
        self: Arc<Self>,
        followed: Arc<Followed>,
        coordinator: Coordinator,
        run_id: Uuid,
        namespace: String,
    ) {
        metrics::watched_runs(self.runs().len());
        // seen from the start: a subscription that comes back at any time
        // after makes a read
        let mut feed = self.feed.subscribe();
        let mut after_seq = 0;
        let mut failures = 0;
        let mut cause = ReadCause::First;
        loop {
            metrics::watch_read(cause.label());
            match read(&coordinator, &namespace, run_id, after_seq).await {
                Ok(snapshot) => {
                    failures = 0;
                    let more = snapshot.events.len() as i64 >= HISTORY_PAGE;
                    after_seq = snapshot.last_seq();
                    publish(&followed, snapshot);
                    if more {
                        // a page of history came back full: read the rest
                        cause = ReadCause::MoreHistory;
                        continue;
                    }
                }
                Err(CoordinatorError::RunNotFound(_)) => {
                    followed.latest.send_replace(Some(Watched::Gone));
                    self.wait_until_unwatched(&followed, run_id).await;
                    return;
                }
                Err(error) => {
                    failures += 1;
                    tracing::warn!(%error, %run_id, failures, "watched run not read");
                    if !self.pause(&followed, run_id, retry_pause(failures)).await {
                        return;
                    }
                    cause = ReadCause::Retry;
                    continue;
                }
            }
            match self.wait_for_change(&followed, run_id, &mut feed).await {
                Some(next) => cause = next,
                None => return,
            }
        }
    }

    /// Waits until the run may have changed (and says why), or no stream
    /// follows it any more (None, and it is forgotten).
    async fn wait_for_change(
        &self,
        followed: &Arc<Followed>,
        run_id: Uuid,
        feed: &mut watch::Receiver<FeedState>,
    ) -> Option<ReadCause> {
        // announcements during the pause make one read after it
        if !self.pause(followed, run_id, MIN_READ_INTERVAL).await {
            return None;
        }
        loop {
            let fallback = if feed.borrow().subscribed {
                jittered(SAFETY_INTERVAL)
            } else {
                jittered(OUTAGE_INTERVAL)
            };
            tokio::select! {
                () = followed.announced.notified() => return Some(ReadCause::Announced),
                () = tokio::time::sleep(fallback) => return Some(ReadCause::Fallback),
                changed = feed.changed() => {
                    if changed.is_ok() && feed.borrow_and_update().subscribed {
                        // back up: announcements made meanwhile are lost
                        let spread = spread(RESYNC_SPREAD);
                        return self
                            .pause(followed, run_id, spread)
                            .await
                            .then_some(ReadCause::Resubscribed);
                    }
                    // down: read at the outage pace
                }
                () = followed.latest.closed() => {
                    if self.forget_if_unwatched(run_id, followed) {
                        return None;
                    }
                }
            }
        }
    }

    /// Sleeps `pause`: true, or false when no stream follows the run any
    /// more (it is then forgotten).
    async fn pause(&self, followed: &Arc<Followed>, run_id: Uuid, pause: Duration) -> bool {
        let wake = tokio::time::sleep(pause);
        tokio::pin!(wake);
        loop {
            tokio::select! {
                () = &mut wake => return true,
                () = followed.latest.closed() => {
                    if self.forget_if_unwatched(run_id, followed) {
                        return false;
                    }
                }
            }
        }
    }

    async fn wait_until_unwatched(&self, followed: &Arc<Followed>, run_id: Uuid) {
        loop {
            followed.latest.closed().await;
            if self.forget_if_unwatched(run_id, followed) {
                return;
            }
        }
    }
}

/// Reads the run and its history after `after_seq`.
async fn read(
    coordinator: &Coordinator,
    namespace: &str,
    run_id: Uuid,
    after_seq: i64,
) -> Result<RunSnapshot, CoordinatorError> {
    let view = coordinator
        .get_run(Some(namespace), &run_id.to_string(), true)
        .await?;
    // the run is known to exist: its history needs no second look-up
    let events =
        runs::history_page(coordinator.store.pool(), run_id, after_seq, HISTORY_PAGE).await?;
    Ok(RunSnapshot {
        view_bytes: view_bytes(&view),
        view,
        events,
        after_seq,
        message: OnceLock::new(),
    })
}

/// About how many bytes `view` takes in a WatchRun message.
fn view_bytes(view: &RunView) -> usize {
    let run = &view.run;
    let nodes: usize = view.nodes.iter().map(node_bytes).sum();
    FIELDS_BYTES
        + json_bytes(&run.input)
        + run.output.as_ref().map_or(0, json_bytes)
        + run.error.as_ref().map_or(0, json_bytes)
        + json_bytes(&run.labels)
        + nodes
}

fn node_bytes(node: &NodeRow) -> usize {
    FIELDS_BYTES
        + node.state.get("output").map_or(0, json_bytes)
        + node.state.get("error").map_or(0, json_bytes)
        + node.task.as_ref().map_or(0, |task| json_bytes(&task.input))
}

/// About how many bytes `events` take in a WatchRun message.
pub fn history_bytes(events: &[HistoryRow]) -> usize {
    events
        .iter()
        .map(|event| FIELDS_BYTES + json_bytes(&event.details))
        .sum()
}

/// What the fixed fields of a run, node or event take, about.
const FIELDS_BYTES: usize = 128;

/// About how many bytes `value` takes as a protobuf Value.
fn json_bytes(value: &Json) -> usize {
    match value {
        Json::Null | Json::Bool(_) => 2,
        Json::Number(_) => 9,
        Json::String(text) => 3 + text.len(),
        Json::Array(items) => 3 + items.iter().map(json_bytes).sum::<usize>(),
        Json::Object(fields) => {
            3 + fields
                .iter()
                .map(|(key, value)| 6 + key.len() + json_bytes(value))
                .sum::<usize>()
        }
    }
}

/// Gives the streams `snapshot`, unless it shows nothing new.
fn publish(followed: &Followed, snapshot: RunSnapshot) {
    followed.latest.send_if_modified(|latest| {
        if let Some(Watched::Snapshot(current)) = latest
            && current.same_as(&snapshot)
        {
            return false;
        }
        *latest = Some(Watched::Snapshot(Arc::new(snapshot)));
        true
    });
}

/// 1 s, 2 s, 4 s, ... up to [`MAX_RETRY_PAUSE`].
fn retry_pause(failures: u32) -> Duration {
    Duration::from_secs(1 << failures.saturating_sub(1).min(4)).min(MAX_RETRY_PAUSE)
}

/// `base`, give or take a quarter, so that runs followed together are not
/// read together.
fn jittered(base: Duration) -> Duration {
    base.mul_f64(0.75 + random_fraction() / 2.0)
}

/// A random moment within `window`.
fn spread(window: Duration) -> Duration {
    window.mul_f64(random_fraction())
}

/// A number in [0, 1), random enough to spread reads (each RandomState
/// has fresh keys).
fn random_fraction() -> f64 {
    let bits = RandomState::new().hash_one(Instant::now());
    (bits >> 11) as f64 / (1_u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;
    use serde_json::json;

    use super::*;

    #[test]
    fn every_read_cause_is_a_label_the_metrics_start_at_zero() {
        let causes = [
            ReadCause::First,
            ReadCause::Announced,
            ReadCause::Resubscribed,
            ReadCause::Fallback,
            ReadCause::MoreHistory,
            ReadCause::Retry,
        ];
        let labels: Vec<&str> = causes.iter().map(|c| c.label()).collect();
        assert_eq!(labels, crate::observe::metrics::WATCH_READ_CAUSES);
    }

    fn event(seq: i64) -> HistoryRow {
        HistoryRow {
            seq,
            created_at: DateTime::UNIX_EPOCH,
            event_type: "node_started".to_owned(),
            node_key: None,
            attempt: None,
            actor: String::new(),
            details: json!({}),
        }
    }

    fn snapshot(after_seq: i64, seqs: &[i64]) -> RunSnapshot {
        RunSnapshot {
            view: RunView {
                run: RunRow {
                    id: Uuid::nil(),
                    namespace: "default".to_owned(),
                    workflow_name: "w".to_owned(),
                    workflow_version: 1,
                    status: "RUNNING".to_owned(),
                    input: json!({}),
                    output: None,
                    error: None,
                    labels: json!({}),
                    idempotency_key: None,
                    parent_run_id: None,
                    parent_node: None,
                    parent_attempt: None,
                    record: json!({}),
                    created_at: DateTime::UNIX_EPOCH,
                    updated_at: DateTime::UNIX_EPOCH,
                    ended_at: None,
                    traceparent: None,
                    priority: 3,
                    concurrency_key: None,
                    concurrency_holds: false,
                },
                nodes: Vec::new(),
                node_types: HashMap::new(),
            },
            events: seqs.iter().copied().map(event).collect(),
            after_seq,
            view_bytes: 0,
            message: OnceLock::new(),
        }
    }

    fn seqs(events: Option<&[HistoryRow]>) -> Option<Vec<i64>> {
        events.map(|events| events.iter().map(|e| e.seq).collect())
    }

    #[test]
    fn a_stream_takes_the_shared_events_it_has_not_sent() {
        let shared = snapshot(4, &[5, 6, 7]);
        assert_eq!(seqs(shared.events_after(4)), Some(vec![5, 6, 7]));
        assert_eq!(seqs(shared.events_after(6)), Some(vec![7]));
        assert_eq!(seqs(shared.events_after(9)), Some(vec![]));
        assert_eq!(shared.last_seq(), 7);
    }

    #[test]
    fn a_stream_that_missed_events_is_told_to_read_them() {
        assert_eq!(seqs(snapshot(4, &[5, 6]).events_after(3)), None);
        assert_eq!(seqs(snapshot(0, &[]).events_after(0)), Some(vec![]));
    }

    #[test]
    fn a_read_that_finds_nothing_new_is_not_published() {
        let followed = Followed {
            latest: watch::Sender::new(None),
            announced: Notify::new(),
        };
        let mut stream = followed.latest.subscribe();
        publish(&followed, snapshot(0, &[1, 2]));
        assert!(stream.has_changed().unwrap_or(false), "the first read");
        stream.borrow_and_update();
        publish(&followed, snapshot(2, &[]));
        assert!(!stream.has_changed().unwrap_or(true), "nothing new");
        publish(&followed, snapshot(2, &[3]));
        assert!(stream.has_changed().unwrap_or(false), "a new event");
        stream.borrow_and_update();
        let mut ended = snapshot(3, &[]);
        ended.view.run.status = "COMPLETED".to_owned();
        publish(&followed, ended);
        assert!(stream.has_changed().unwrap_or(false), "a new status");
    }

    #[tokio::test]
    async fn a_message_waits_until_the_connections_took_what_fills_the_budget() {
        let budget = SendBudget::new();
        let whole = budget.admit(SEND_BUDGET_BYTES).await;
        let waited = tokio::time::timeout(Duration::from_millis(100), budget.admit(1)).await;
        assert!(waited.is_err(), "the budget is spent");
        drop(whole);
        tokio::time::timeout(Duration::from_millis(100), budget.admit(1))
            .await
            .expect("admitted once the first message was taken");
    }

    #[tokio::test]
    async fn a_message_never_taken_gives_its_share_back_after_the_hold() {
        let budget = SendBudget::new();
        // larger than the budget: takes all of it
        let _never_taken = budget.admit(2 * SEND_BUDGET_BYTES).await;
        let began = Instant::now();
        let _next = tokio::time::timeout(3 * MAX_SEND_HOLD, budget.admit(1024))
            .await
            .expect("the share came back");
        assert!(
            began.elapsed() >= MAX_SEND_HOLD / 2,
            "{:?}",
            began.elapsed()
        );
    }

    #[test]
    fn the_fallback_reads_are_spread() {
        for _ in 0..100 {
            let pause = jittered(SAFETY_INTERVAL);
            assert!(
                pause >= SAFETY_INTERVAL.mul_f64(0.75) && pause <= SAFETY_INTERVAL.mul_f64(1.25)
            );
            assert!(spread(RESYNC_SPREAD) < RESYNC_SPREAD);
        }
        assert_eq!(retry_pause(1), Duration::from_secs(1));
        assert_eq!(retry_pause(3), Duration::from_secs(4));
        assert_eq!(retry_pause(40), MAX_RETRY_PAUSE);
    }
}
