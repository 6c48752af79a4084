//! The poll hub: hands tasks read from Redis to the PollTasks calls waiting
//! in this server.
//!
//! One reader per server reads the streams of every queue some poll waits
//! on, with one blocking XREADGROUP over all of them, so the Redis
//! connections of a server (the reader's and one for control) do not grow
//! with the number of queues. A poll naming a queue outside the read in
//! flight XADDs to the server's wake stream, which is part of every read,
//! so the read returns and starts again with the new queue. A queue no poll
//! has waited on for `reader_idle` is forgotten and its streams, if empty,
//! deleted: a worker polling made-up queue names leaves nothing behind.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use composer_store::{
    Store, StoreError,
    tasks::{self, LeasedTask},
};
use redis::{AsyncCommands, streams::StreamReadReply};
use tokio::{
    sync::{Notify, oneshot},
    time::Instant,
};
use uuid::Uuid;

use crate::{
    dispatch::rate_limit::{self, Limit, LimitCache},
    dispatch::redis_conn::{RedisClient, RedisConnection, by_slot},
    dispatch::streams::{DEFAULT_PRIORITY, DispatchConfig, GROUP, PRIORITIES, priority_stream_key},
    error::CoordinatorError,
};

/// Queues of one namespace that polls on one server may wait on at once;
/// past it a poll naming a new queue is refused, so one tenant's made-up
/// queue names cost a bounded amount and never slow another's reads.
pub const MAX_POLLED_QUEUES_PER_NAMESPACE: usize = 1024;

/// How long a task found DISPATCHED is trusted to still be, when a held
/// queue offers it again (a task leased meanwhile by another server then
/// costs a token, which only undershoots the limit).
const CHECK_FRESH: Duration = Duration::from_secs(2);

/// Messages read from one stream per XREADGROUP, at most.
const MAX_READ_COUNT: usize = 1000;

/// On a Redis Cluster a read cannot block (one XREADGROUP names one slot,
/// and a blocked read would stall its node's connection): the reader reads
/// every slot without blocking and, when nothing came, pauses this long,
/// doubling up to [`CLUSTER_PAUSE_MAX`], or until a poll arrives.
const CLUSTER_PAUSE_MIN: Duration = Duration::from_millis(5);

/// The longest pause between two reads of a cluster: a task published to
/// an idle cluster waits about this long at most before it is read.
const CLUSTER_PAUSE_MAX: Duration = Duration::from_millis(100);

/// Tasks a rate-limited queue keeps read but not handed out, at most: the
/// look-ahead that lets one key's tasks pass another key's backlog. Past
/// it the queue's streams are not read until some are handed out.
const MAX_HELD_BUFFERED: usize = 1000;

/// Why a poll was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PollError {
    /// The namespace already has the most queues polled on this server.
    #[error(
        "namespace {namespace:?} already has {limit} queues polled on this server; \
         poll fewer distinct queues"
    )]
    TooManyQueues {
        /// The namespace.
        namespace: String,
        /// [`MAX_POLLED_QUEUES_PER_NAMESPACE`].
        limit: usize,
    },
}

/// What one poll asks for.
#[derive(Debug, Clone, Copy)]
pub struct PollRequest<'a> {
    /// Recorded as the lease owner.
    pub worker_id: &'a str,
    /// At most this many tasks.
    pub max: usize,
    /// How long to wait for one.
    pub wait: Duration,
    /// The worker confirms receipt with a first heartbeat (see
    /// `PollTasksRequest.confirm_receipt`).
    pub confirm_receipt: bool,
}

/// A PollTasks call waiting in this server.
struct Waiter {
    worker_id: String,
    want: usize,
    /// Set when the worker confirms receipt: its lease's first length.
    receipt: Option<Duration>,
    sender: Mutex<Option<oneshot::Sender<Vec<LeasedTask>>>>,
}

impl Waiter {
    fn take_sender(&self) -> Option<oneshot::Sender<Vec<LeasedTask>>> {
        lock(&self.sender).take()
    }

    fn is_waiting(&self) -> bool {
        lock(&self.sender).as_ref().is_some_and(|s| !s.is_closed())
    }
}

/// A poll waiting in this server, taken for tasks an event armed: they
/// are leased in the event's transaction and sent to it after the commit
/// (decision 0034). Dropped unsent, the poll answers with no task and its
/// worker polls again.
pub(crate) struct WaitingPoll {
    /// Recorded as the lease owner.
    pub(crate) worker_id: String,
    /// At most this many tasks.
    pub(crate) want: usize,
    /// Its lease's first length when the worker confirms receipt.
    pub(crate) receipt: Option<Duration>,
    sender: oneshot::Sender<Vec<LeasedTask>>,
}

impl WaitingPoll {
    /// Hands the poll the tasks leased to it, as [`deliver`] does.
    pub(crate) async fn deliver(self, store: &Store, tasks: Vec<LeasedTask>) {
        deliver(store, &self.worker_id, self.sender, tasks).await;
    }
}

/// Sends a poll the tasks leased to its worker, counted and traced; a poll
/// gone meanwhile has their leases released (or they expire). Returns the
/// ids it received.
async fn deliver(
    store: &Store,
    worker_id: &str,
    sender: oneshot::Sender<Vec<LeasedTask>>,
    mut leased: Vec<LeasedTask>,
) -> Vec<Uuid> {
    for task in &mut leased {
        crate::observe::metrics::task_leased(&task.namespace, &task.queue, task.dispatched_at);
        trace_lease(task, worker_id);
    }
    let ids = leased.iter().map(|t| t.id).collect();
    let Err(unsent) = sender.send(leased) else {
        return ids;
    };
    let leases: Vec<(Uuid, Uuid)> = unsent.iter().map(|t| (t.id, t.lease_token)).collect();
    if let Err(error) = tasks::release_leases(store.pool(), &leases).await {
        tracing::warn!(%error, "could not release leases of a vanished poll; they will expire");
    }
    Vec::new()
}

/// (namespace, queue)
type QueueKey = (String, String);

/// A buffered task with its priority: (priority, task id, attempt).
type Ranked = (i16, Uuid, i32);

/// Tasks that got tokens, each with its rate-limit key, and the Redis time
/// of the grant (what a refund names).
struct Admitted {
    granted: Vec<(Ranked, Option<String>)>,
    at: i64,
}

/// Tasks read for one queue but not leased yet, by priority: handed out
/// highest priority first, oldest first within one.
#[derive(Default)]
struct Buffered {
    /// Index `priority - 1`.
    levels: [VecDeque<(Uuid, i32)>; 5],
}

impl Buffered {
    fn level(priority: i16) -> usize {
        usize::try_from(priority.clamp(*PRIORITIES.start(), *PRIORITIES.end()) - 1).unwrap_or(0)
    }

    fn push(&mut self, priority: i16, task: (Uuid, i32)) {
        self.levels[Self::level(priority)].push_back(task);
    }

    fn is_empty(&self) -> bool {
        self.levels.iter().all(VecDeque::is_empty)
    }

    fn len(&self) -> usize {
        self.levels.iter().map(VecDeque::len).sum()
    }

    /// Takes up to `n` tasks with their priority, highest priority first.
    fn take_ranked(&mut self, mut n: usize) -> Vec<Ranked> {
        let mut taken = Vec::with_capacity(n);
        for (i, level) in self.levels.iter_mut().enumerate().rev() {
            let here = n.min(level.len());
            let priority = i16::try_from(i + 1).unwrap_or(DEFAULT_PRIORITY);
            taken.extend(
                level
                    .drain(..here)
                    .map(|(id, attempt)| (priority, id, attempt)),
            );
            n -= here;
        }
        taken
    }

    /// Puts tasks taken by [`Buffered::take_ranked`] back in front, in
    /// their order.
    fn put_back(&mut self, tasks: Vec<Ranked>) {
        for (priority, id, attempt) in tasks.into_iter().rev() {
            self.levels[Self::level(priority)].push_front((id, attempt));
        }
    }

    /// The highest priority with a task, if any.
    fn best(&self) -> Option<i16> {
        (0..5)
            .rev()
            .find(|&i| !self.levels[i].is_empty())
            .and_then(|i| i16::try_from(i + 1).ok())
    }

    /// Takes up to `n` tasks, highest priority first.
    fn take(&mut self, mut n: usize) -> Vec<(Uuid, i32)> {
        let mut taken = Vec::with_capacity(n);
        for level in self.levels.iter_mut().rev() {
            let here = n.min(level.len());
            taken.extend(level.drain(..here));
            n -= here;
        }
        taken
    }
}

/// The polls waiting on one queue, and what was read for it but not leased.
struct QueueState {
    waiters: VecDeque<Arc<Waiter>>,
    buffered: Buffered,
    last_waited: Instant,
    /// A rate limit holds the queue's hand-outs until then.
    held_until: Option<Instant>,
    /// The hold is the queue's own bucket (not only some keys'): reading
    /// more of its streams would not get anything handed out sooner.
    held_by_queue: bool,
    /// Tasks held back by a limit, found DISPATCHED at this time with this
    /// rate-limit key: offered again soon after, they skip the check, so a
    /// hold's end costs one round trip (the tokens) before the lease.
    checked: HashMap<(Uuid, i32), (Option<String>, Instant)>,
}

impl QueueState {
    fn new() -> Self {
        Self {
            waiters: VecDeque::new(),
            buffered: Buffered::default(),
            last_waited: Instant::now(),
            held_until: None,
            held_by_queue: false,
            checked: HashMap::new(),
        }
    }

    fn is_held(&self) -> bool {
        self.held_until.is_some_and(|until| until > Instant::now())
    }

    /// Whether the next read should leave this queue's streams alone: a
    /// rate limit holds it and what it has read already is enough.
    fn has_enough(&self) -> bool {
        let len = self.buffered.len();
        len >= MAX_HELD_BUFFERED || (len > 0 && self.held_by_queue && self.is_held())
    }
}

/// Hands tasks read from Redis to the polls waiting in this server.
pub struct PollHub {
    store: Store,
    redis: RedisClient,
    consumer: String,
    wake_key: String,
    config: DispatchConfig,
    queues: Mutex<HashMap<QueueKey, QueueState>>,
    /// The queues of the read in flight, or of the next one.
    reading: Mutex<HashSet<QueueKey>>,
    wake: Notify,
    reader_started: AtomicBool,
    /// Set by [`PollHub::stop`]: the reader and the limits loop end.
    stopped: AtomicBool,
    stopping: Notify,
    /// The reader's and the limits loop's tasks, awaited by `stop`.
    loops: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    control: tokio::sync::Mutex<Option<RedisConnection>>,
    limits: LimitCache,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl PollHub {
    /// A hub for this server (`consumer` names it in the consumer group).
    pub fn new(
        store: Store,
        redis_url: &str,
        config: DispatchConfig,
    ) -> Result<Arc<Self>, CoordinatorError> {
        let redis =
            RedisClient::open(redis_url).map_err(|e| CoordinatorError::Redis(e.to_string()))?;
        let consumer = format!("server-{}", Uuid::new_v4().simple());
        Ok(Arc::new(Self {
            store,
            redis,
            wake_key: format!("composer:wake:{{{consumer}}}"),
            consumer,
            config,
            queues: Mutex::new(HashMap::new()),
            reading: Mutex::new(HashSet::new()),
            wake: Notify::new(),
            reader_started: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            stopping: Notify::new(),
            loops: Mutex::new(Vec::new()),
            control: tokio::sync::Mutex::new(None),
            limits: LimitCache::default(),
        }))
    }

    /// Waits up to `request.wait` for tasks on `queues`; returns at most
    /// `request.max`, each leased to `request.worker_id`.
    pub async fn poll(
        self: &Arc<Self>,
        namespace: &str,
        queues: &[String],
        request: PollRequest<'_>,
    ) -> Result<Vec<LeasedTask>, PollError> {
        self.start_reader();
        let wait = request.wait;
        let (sender, mut receiver) = oneshot::channel();
        let waiter = Arc::new(Waiter {
            worker_id: request.worker_id.to_owned(),
            want: request.max.max(1),
            receipt: request
                .confirm_receipt
                .then_some(self.config.receipt_timeout),
            sender: Mutex::new(Some(sender)),
        });
        let outside_the_read = self.enlist(namespace, queues, &waiter)?;
        self.wake.notify_one();
        if outside_the_read {
            self.interrupt_read().await;
        }
        Ok(tokio::select! {
            got = &mut receiver => got.unwrap_or_default(),
            () = tokio::time::sleep(wait) => {
                if waiter.take_sender().is_some() {
                    // nobody was handing us tasks: none will be
                    return Ok(Vec::new());
                }
                // the reader is leasing for us right now: take what it sends
                receiver.await.unwrap_or_default()
            }
        })
    }

    /// The queues some poll of this server waited on within `reader_idle`:
    /// the ones whose lost messages recovery republishes.
    pub fn served_queues(&self) -> Vec<(String, String)> {
        lock(&self.queues).keys().cloned().collect()
    }

    /// How many polls wait in this server on the queue now.
    pub fn polls_waiting(&self, namespace: &str, queue: &str) -> usize {
        let key = (namespace.to_owned(), queue.to_owned());
        lock(&self.queues)
            .get(&key)
            .map_or(0, |s| s.waiters.iter().filter(|w| w.is_waiting()).count())
    }

    /// The first poll waiting on the queue, taken out of it, when a task
    /// armed for the queue may go to it directly: the queue is known to
    /// have no rate limit (a limited one hands out through its tokens) and
    /// nothing read for it waits (what was read first goes first).
    pub(crate) fn take_waiting_poll(&self, namespace: &str, queue: &str) -> Option<WaitingPoll> {
        let key = (namespace.to_owned(), queue.to_owned());
        if !self.limits.is_known_unlimited(&key) {
            return None;
        }
        let mut states = lock(&self.queues);
        let state = states.get_mut(&key)?;
        if !state.buffered.is_empty() {
            return None;
        }
        while let Some(waiter) = state.waiters.pop_front() {
            let Some(sender) = waiter.take_sender() else {
                continue;
            };
            if sender.is_closed() {
                continue;
            }
            return Some(WaitingPoll {
                worker_id: waiter.worker_id.clone(),
                want: waiter.want,
                receipt: waiter.receipt,
                sender,
            });
        }
        None
    }

    /// Adds the waiter to each queue; true when one of them is not in the
    /// read in flight (or has tasks waiting), so the reader must look again.
    fn enlist(
        &self,
        namespace: &str,
        queues: &[String],
        waiter: &Arc<Waiter>,
    ) -> Result<bool, PollError> {
        let mut states = lock(&self.queues);
        let new = queues
            .iter()
            .filter(|q| !states.contains_key(&(namespace.to_owned(), (*q).clone())))
            .count();
        if new > 0 {
            let known = states.keys().filter(|(ns, _)| ns == namespace).count();
            if known + new > MAX_POLLED_QUEUES_PER_NAMESPACE {
                return Err(PollError::TooManyQueues {
                    namespace: namespace.to_owned(),
                    limit: MAX_POLLED_QUEUES_PER_NAMESPACE,
                });
            }
        }
        let reading = lock(&self.reading);
        let mut outside = false;
        for queue in queues {
            let key = (namespace.to_owned(), queue.clone());
            outside |= !reading.contains(&key);
            let state = states.entry(key).or_insert_with(QueueState::new);
            outside |= !state.buffered.is_empty();
            state.waiters.push_back(Arc::clone(waiter));
            state.last_waited = Instant::now();
        }
        Ok(outside)
    }

    fn start_reader(self: &Arc<Self>) {
        if self.reader_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let hub = Arc::clone(self);
        let reader = tokio::spawn(async move { hub.read_loop().await });
        let hub = Arc::clone(self);
        let refresher = tokio::spawn(async move { hub.refresh_limits_loop().await });
        lock(&self.loops).extend([reader, refresher]);
    }

    /// Ends the reader (after the read in flight) and the limits loop, and
    /// waits for them: the server is stopping, and what is left in the
    /// streams is claimed by the servers that stay. Nothing of this hub
    /// touches Redis or Postgres once it returns.
    pub async fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.stopping.notify_waiters();
        self.wake.notify_one();
        let loops: Vec<_> = lock(&self.loops).drain(..).collect();
        if !loops.is_empty() {
            // a blocked read returns at the wake message
            self.interrupt_read().await;
        }
        for task in loops {
            let _ = task.await;
        }
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Reads the rate limits of the queues this server serves every
    /// [`rate_limit::REFRESH`], so a change reaches every server within it.
    /// Postgres down: the last limits read stay in force.
    async fn refresh_limits_loop(self: Arc<Self>) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(rate_limit::REFRESH) => {}
                () = self.stopping.notified() => return,
            }
            if self.is_stopped() {
                return;
            }
            let queues: Vec<QueueKey> = lock(&self.queues).keys().cloned().collect();
            if let Err(error) = self.limits.refresh(&self.store, &queues).await {
                tracing::warn!(%error, "could not refresh queue rate limits; keeping the last ones");
            }
        }
    }

    /// A clone of the control connection, opened if needed.
    async fn control_connection(&self) -> Option<RedisConnection> {
        let mut guard = self.control.lock().await;
        if guard.is_none() {
            *guard = self.redis.connect().await.ok();
        }
        guard.clone()
    }

    /// Drops the control connection after a failure (not a cluster's: it
    /// finds a node that comes back by itself).
    async fn drop_control_connection(&self) {
        if !self.redis.is_cluster() {
            *self.control.lock().await = None;
        }
    }

    /// Makes a blocked read return: a message on the wake stream. (A
    /// cluster's reads do not block: the hub's own wake-up is enough.)
    async fn interrupt_read(&self) {
        if self.redis.is_cluster() {
            return;
        }
        let mut guard = self.control.lock().await;
        if guard.is_none() {
            *guard = self.redis.connect().await.ok();
        }
        let Some(connection) = guard.as_mut() else {
            return;
        };
        let sent: redis::RedisResult<()> = redis::pipe()
            .cmd("XADD")
            .arg(&self.wake_key)
            .arg("MAXLEN")
            .arg("~")
            .arg(16)
            .arg("*")
            .arg("wake")
            .arg(1)
            .ignore()
            // a server that dies leaves its wake stream for an hour at most
            .cmd("EXPIRE")
            .arg(&self.wake_key)
            .arg(3600)
            .ignore()
            .query_async(connection)
            .await;
        if let Err(error) = sent {
            crate::observe::metrics::redis_error("wake");
            tracing::warn!(%error, "could not wake the stream reader");
            *guard = None;
        }
    }

    /// The one reader of this server.
    async fn read_loop(self: Arc<Self>) {
        let mut connection: Option<RedisConnection> = None;
        let mut grouped: HashSet<String> = HashSet::new();
        let cluster = self.redis.is_cluster();
        let mut pause = CLUSTER_PAUSE_MIN;
        loop {
            if self.is_stopped() {
                return;
            }
            self.forget_idle_queues().await;
            self.read_higher(&mut connection, &mut grouped).await;
            self.hand_out_all().await;
            let (wanted, count) = self.wanted();
            let next_hold = self.next_hold_end();
            if wanted.is_empty() {
                let nap =
                    next_hold.map_or(Duration::from_secs(1), |h| h.min(Duration::from_secs(1)));
                let _ = tokio::time::timeout(nap, self.wake.notified()).await;
                continue;
            }
            if connection.is_none() {
                connection = self.reader_connection().await;
                grouped.clear();
            }
            let Some(active) = connection.as_mut() else {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            };
            let streams = self.streams_of(&wanted);
            let keys = self.keys_to_read(&streams);
            let (keys, failed) = ensure_groups(&self.redis, active, &keys, &mut grouped).await;
            if let Some(error) = failed {
                crate::observe::metrics::redis_error("groups");
                tracing::warn!(%error, "could not create consumer groups");
                // on a cluster, the slots of the nodes that answered are
                // still read
                if !cluster {
                    connection = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
            // a held queue is handed out when its hold ends, not a whole
            // block later
            let block = next_hold.map_or(self.config.read_block, |h| {
                h.clamp(Duration::from_millis(1), self.config.read_block)
            });
            let block = (!cluster).then_some(block);
            let (read, failed) = read_groups(
                &self.redis,
                active,
                &keys,
                &self.consumer,
                count,
                block,
                &mut grouped,
            )
            .await;
            let got_some = !read.is_empty();
            self.buffer(read, &streams);
            if let Some(error) = failed {
                crate::observe::metrics::redis_error("read");
                tracing::warn!(%error, "stream read failed");
                // a cluster's failed slots rest while the others are read
                if !cluster {
                    connection = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
            if cluster {
                pause = if got_some {
                    CLUSTER_PAUSE_MIN
                } else {
                    self.pause_between_sweeps(pause, next_hold).await
                };
            }
        }
    }

    /// Waits `pause` (less when a hold ends sooner) or until a poll
    /// arrives; returns the next pause.
    async fn pause_between_sweeps(&self, pause: Duration, next_hold: Option<Duration>) -> Duration {
        let wait = next_hold.map_or(pause, |h| h.min(pause));
        match tokio::time::timeout(wait, self.wake.notified()).await {
            Ok(()) => CLUSTER_PAUSE_MIN,
            Err(_) => (pause * 2).min(CLUSTER_PAUSE_MAX),
        }
    }

    /// The keys of `streams` to read now: on a cluster, not those of a node
    /// that failed a moment ago (the other nodes' are read meanwhile).
    fn keys_to_read<'s>(
        &self,
        streams: &'s HashMap<String, Option<(QueueKey, i16)>>,
    ) -> Vec<&'s str> {
        streams
            .keys()
            .map(String::as_str)
            .filter(|key| !self.redis.is_resting(key))
            .collect()
    }

    /// The streams to read for `wanted`, each with its queue and priority;
    /// the wake stream maps to no queue.
    fn streams_of(&self, wanted: &[QueueKey]) -> HashMap<String, Option<(QueueKey, i16)>> {
        let mut streams = HashMap::new();
        if !self.redis.is_cluster() {
            streams.insert(self.wake_key.clone(), None);
        }
        for key in wanted {
            self.queue_streams(key, *PRIORITIES.start(), &mut streams);
        }
        streams
    }

    /// Adds the streams of one queue at `from` priority and above.
    fn queue_streams(
        &self,
        key: &QueueKey,
        from: i16,
        streams: &mut HashMap<String, Option<(QueueKey, i16)>>,
    ) {
        let (namespace, queue) = key;
        for priority in from..=*PRIORITIES.end() {
            let shards = if priority == DEFAULT_PRIORITY {
                self.config.shards.max(1)
            } else {
                1
            };
            for shard in 0..shards {
                streams.insert(
                    priority_stream_key(namespace, queue, shard, priority),
                    Some((key.clone(), priority)),
                );
            }
        }
    }

    /// A queue with tasks read but not leased and polls waiting: before
    /// handing those out, reads (without blocking) what came since on its
    /// streams of higher priority, so a task of higher priority is never
    /// queued behind the buffer (issue 17: at most one poll of delay).
    async fn read_higher(
        &self,
        connection: &mut Option<RedisConnection>,
        grouped: &mut HashSet<String>,
    ) {
        let (streams, count) = {
            let states = lock(&self.queues);
            let mut streams = HashMap::new();
            let mut count = 0;
            for (key, state) in states.iter() {
                let Some(best) = state.buffered.best() else {
                    continue;
                };
                if best >= *PRIORITIES.end()
                    || state.waiters.is_empty()
                    || state.buffered.len() >= MAX_HELD_BUFFERED
                {
                    continue;
                }
                self.queue_streams(key, best + 1, &mut streams);
                count += state.waiters.iter().map(|w| w.want).sum::<usize>();
            }
            (streams, count.clamp(1, MAX_READ_COUNT))
        };
        if streams.is_empty() {
            return;
        }
        let Some(active) = connection.as_mut() else {
            return;
        };
        let keys = self.keys_to_read(&streams);
        let cluster = self.redis.is_cluster();
        let (keys, failed) = ensure_groups(&self.redis, active, &keys, grouped).await;
        if failed.is_some() && !cluster {
            return;
        }
        let (read, failed) = read_groups(
            &self.redis,
            active,
            &keys,
            &self.consumer,
            count,
            None,
            grouped,
        )
        .await;
        self.buffer(read, &streams);
        if let Some(error) = failed {
            crate::observe::metrics::redis_error("read");
            tracing::warn!(%error, "stream read failed");
            if !cluster {
                *connection = None;
            }
        }
    }

    /// The queues with a waiting poll and the most any of them wants; drops
    /// polls that went away. They become the queues of the next read in the
    /// same step (under the same lock as [`PollHub::enlist`]), so a poll
    /// either is in the next read or sees that it is not and wakes it.
    fn wanted(&self) -> (Vec<QueueKey>, usize) {
        let mut states = lock(&self.queues);
        let mut wanted = Vec::new();
        let mut count = 1;
        for (key, state) in states.iter_mut() {
            state.waiters.retain(|w| w.is_waiting());
            if state.waiters.is_empty() {
                continue;
            }
            state.last_waited = Instant::now();
            if state.has_enough() {
                continue;
            }
            let want: usize = state.waiters.iter().map(|w| w.want).sum();
            // a limited queue reads about what its polls want across its
            // shards, not that from each: the rest stays in the streams for
            // whichever server has a poll when the limit allows
            let want = if self.limits.is_limited(key) {
                want.div_ceil(usize::try_from(self.config.shards.max(1)).unwrap_or(1))
            } else {
                want
            };
            count = count.max(want);
            wanted.push(key.clone());
        }
        *lock(&self.reading) = wanted.iter().cloned().collect();
        (wanted, count.min(MAX_READ_COUNT))
    }

    fn buffer(
        &self,
        read: Vec<(String, Uuid, i32)>,
        streams: &HashMap<String, Option<(QueueKey, i16)>>,
    ) {
        let mut states = lock(&self.queues);
        for (key, task, attempt) in read {
            let Some(Some((queue, priority))) = streams.get(&key) else {
                continue;
            };
            let state = states.entry(queue.clone()).or_insert_with(QueueState::new);
            state.buffered.push(*priority, (task, attempt));
            if !state.held_by_queue {
                // a new task may have a key with tokens left
                state.held_until = None;
            }
        }
    }

    /// Forgets queues no poll waited on for `reader_idle`, and deletes
    /// their streams when they are empty. Tasks read for such a queue but
    /// never leased are offered again by recovery.
    async fn forget_idle_queues(&self) {
        let idle: Vec<QueueKey> = {
            let mut states = lock(&self.queues);
            let idle: Vec<QueueKey> = states
                .iter()
                .filter(|(_, s)| {
                    s.waiters.is_empty() && s.last_waited.elapsed() > self.config.reader_idle
                })
                .map(|(k, _)| k.clone())
                .collect();
            for key in &idle {
                states.remove(key);
            }
            idle
        };
        if idle.is_empty() {
            return;
        }
        let mut guard = self.control.lock().await;
        if guard.is_none() {
            *guard = self.redis.connect().await.ok();
        }
        let Some(connection) = guard.as_mut() else {
            return;
        };
        let script = redis::Script::new(DELETE_IF_EMPTY);
        for queue in &idle {
            let mut streams = HashMap::new();
            self.queue_streams(queue, *PRIORITIES.start(), &mut streams);
            for key in streams.keys() {
                // one key per call: the shards live in different slots of a
                // Redis Cluster
                let deleted: redis::RedisResult<i64> =
                    script.key(key).invoke_async(connection).await;
                if let Err(error) = deleted {
                    crate::observe::metrics::redis_error("clean_up");
                    tracing::warn!(%error, "could not clean up an idle stream");
                    *guard = None;
                    return;
                }
            }
        }
    }

    /// Leases buffered tasks to the polls waiting for them.
    async fn hand_out_all(&self) {
        let ready: Vec<QueueKey> = lock(&self.queues)
            .iter()
            .filter(|(_, s)| !s.buffered.is_empty() && !s.waiters.is_empty() && !s.is_held())
            .map(|(k, _)| k.clone())
            .collect();
        for key in ready {
            self.hand_out(&key).await;
        }
    }

    /// Leases one queue's buffered tasks to its waiting polls, first come
    /// first served, within the queue's rate limit if it has one.
    async fn hand_out(&self, key: &QueueKey) {
        let limit = match self.limits.get(&self.store, key).await {
            Ok(limit) => limit,
            Err(error) => {
                tracing::warn!(%error, "could not read the queue's rate limit; holding its tasks");
                self.hold(key, Duration::from_secs(1), true);
                return;
            }
        };
        if let Some(limit) = limit {
            return self.hand_out_limited(key, &limit).await;
        }
        while let Some((waiter, sender, candidates)) = self.next_hand_out(key) {
            self.lease_and_send(key, &waiter, sender, &candidates).await;
        }
    }

    /// [`PollHub::hand_out`] for a rate-limited queue: tokens are taken for
    /// the tasks still dispatched, highest priority first, before a poll is
    /// taken; what gets none goes back to the front of the buffer and the
    /// queue is held for the time the bucket names (no busy loop).
    async fn hand_out_limited(&self, key: &QueueKey, limit: &Limit) {
        loop {
            let Some((want, candidates)) = self.peek_hand_out(key, limit.per_key.is_some()) else {
                return;
            };
            let Some(admitted) = self.admit(key, limit, want, candidates).await else {
                return;
            };
            let ranked: Vec<Ranked> = admitted.granted.iter().map(|(r, _)| *r).collect();
            let leased = match self.next_waiter(key, ranked) {
                Some((waiter, sender, handed)) => {
                    self.lease_and_send(key, &waiter, sender, &handed).await
                }
                None => Vec::new(),
            };
            // a token not used for a lease (a duplicate another server
            // leased first, a poll gone) goes back
            let unused: Vec<Option<&str>> = admitted
                .granted
                .iter()
                .filter(|(r, _)| !leased.contains(&r.1))
                .map(|(_, k)| k.as_deref())
                .collect();
            if !unused.is_empty() {
                self.refund(key, limit, admitted.at, &unused).await;
            }
            if leased.is_empty() {
                return;
            }
        }
    }

    async fn refund(&self, key: &QueueKey, limit: &Limit, at: i64, keys: &[Option<&str>]) {
        let Some(mut connection) = self.control_connection().await else {
            return;
        };
        if let Err(error) = rate_limit::refund_tokens(&mut connection, key, limit, at, keys).await {
            crate::observe::metrics::redis_error("rate_limit");
            tracing::warn!(%error, "could not give back unused rate-limit tokens");
        }
    }

    /// The want of the first waiting poll and the buffered tasks to offer
    /// it (with a per-key limit, a look-ahead past that want), taken out
    /// of the buffer; None when held, empty or without a poll.
    fn peek_hand_out(&self, key: &QueueKey, look_ahead: bool) -> Option<(usize, Vec<Ranked>)> {
        let mut states = lock(&self.queues);
        let state = states.get_mut(key)?;
        if state.is_held() || state.buffered.is_empty() {
            return None;
        }
        let want = state.waiters.iter().find(|w| w.is_waiting())?.want;
        let take = if look_ahead { MAX_HELD_BUFFERED } else { want };
        Some((want, state.buffered.take_ranked(take)))
    }

    /// Takes tokens for up to `want` of `candidates`; returns the granted
    /// ones and puts the rest (still dispatched) back, holding the queue.
    async fn admit(
        &self,
        key: &QueueKey,
        limit: &Limit,
        want: usize,
        candidates: Vec<Ranked>,
    ) -> Option<Admitted> {
        let mut keys = self.recently_checked(key);
        let pairs: Vec<(Uuid, i32)> = candidates
            .iter()
            .map(|c| (c.1, c.2))
            .filter(|pair| !keys.contains_key(pair))
            .collect();
        let live =
            match tasks::dispatched_with_keys(self.store.pool(), &pairs, &key.0, &key.1).await {
                Ok(live) => live,
                Err(error) => {
                    tracing::warn!(%error, "could not read tasks to rate-limit; holding them");
                    self.put_back(key, candidates);
                    self.hold(key, Duration::from_secs(1), true);
                    return None;
                }
            };
        keys.extend(live.into_iter().map(|(id, attempt, k)| ((id, attempt), k)));
        // stale messages and duplicates cost no token
        let mut seen = HashSet::new();
        let candidates: Vec<Ranked> = candidates
            .into_iter()
            .filter(|c| keys.contains_key(&(c.1, c.2)) && seen.insert((c.1, c.2)))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let task_keys: Vec<Option<&str>> = candidates
            .iter()
            .map(|c| keys.get(&(c.1, c.2)).and_then(Option::as_deref))
            .collect();
        let max_keys = self.config.quotas.of(&key.0).rate_limit_keys_per_queue;
        let grant = match self.control_connection().await {
            Some(mut connection) => {
                rate_limit::take_tokens(&mut connection, key, limit, &task_keys, want, max_keys)
                    .await
            }
            None => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no connection",
            ))),
        };
        let grant = match grant {
            Ok(grant) => grant,
            Err(error) => {
                // as for every Redis outage: nothing is handed out
                crate::observe::metrics::redis_error("rate_limit");
                tracing::warn!(%error, "could not take rate-limit tokens; holding the queue");
                self.drop_control_connection().await;
                self.put_back(key, candidates);
                self.hold(key, Duration::from_millis(500), true);
                return None;
            }
        };
        let granted_at: HashSet<usize> = grant.granted.iter().copied().collect();
        let mut granted = Vec::with_capacity(granted_at.len());
        let mut rest = Vec::new();
        for (i, candidate) in candidates.into_iter().enumerate() {
            if granted_at.contains(&i) {
                let task_key = keys.get(&(candidate.1, candidate.2)).cloned().flatten();
                granted.push((candidate, task_key));
            } else {
                rest.push(candidate);
            }
        }
        let held_back = if grant.queue_wait.is_some() || grant.key_wait.is_some() {
            rest.len()
        } else {
            0
        };
        crate::observe::metrics::tasks_rate_limited(
            &key.0,
            &key.1,
            u64::try_from(held_back).unwrap_or(0),
        );
        crate::observe::metrics::quota_throttled(
            &key.0,
            crate::limits::quotas::Quota::RateLimitKeysPerQueue.name(),
            grant.over_key_quota,
        );
        self.remember_checked(key, &rest, &keys);
        self.put_back(key, rest);
        match (grant.queue_wait, grant.key_wait) {
            (Some(wait), _) => self.hold(key, wait, true),
            (None, Some(wait)) if held_back > 0 => self.hold(key, wait, false),
            _ => {}
        }
        (!granted.is_empty()).then_some(Admitted {
            granted,
            at: grant.at,
        })
    }

    /// The keys of tasks found DISPATCHED within [`CHECK_FRESH`]; older
    /// entries are dropped.
    fn recently_checked(&self, key: &QueueKey) -> HashMap<(Uuid, i32), Option<String>> {
        let mut states = lock(&self.queues);
        let Some(state) = states.get_mut(key) else {
            return HashMap::new();
        };
        state
            .checked
            .retain(|_, (_, at)| at.elapsed() < CHECK_FRESH);
        state
            .checked
            .iter()
            .map(|(pair, (k, _))| (*pair, k.clone()))
            .collect()
    }

    /// Records the keys of tasks held back (and only those: a granted task
    /// is leased, and its entry would only go stale).
    fn remember_checked(
        &self,
        key: &QueueKey,
        held: &[Ranked],
        keys: &HashMap<(Uuid, i32), Option<String>>,
    ) {
        let mut states = lock(&self.queues);
        let Some(state) = states.get_mut(key) else {
            return;
        };
        let now = Instant::now();
        state.checked.clear();
        for (_, id, attempt) in held {
            if let Some(k) = keys.get(&(*id, *attempt)) {
                state.checked.insert((*id, *attempt), (k.clone(), now));
            }
        }
    }

    fn put_back(&self, key: &QueueKey, tasks: Vec<Ranked>) {
        if tasks.is_empty() {
            return;
        }
        lock(&self.queues)
            .entry(key.clone())
            .or_insert_with(QueueState::new)
            .buffered
            .put_back(tasks);
    }

    fn hold(&self, key: &QueueKey, wait: Duration, by_queue: bool) {
        if let Some(state) = lock(&self.queues).get_mut(key) {
            state.held_until = Some(Instant::now() + wait);
            state.held_by_queue = by_queue;
        }
    }

    /// How long until the first hold ends, if any queue is held.
    fn next_hold_end(&self) -> Option<Duration> {
        let now = Instant::now();
        lock(&self.queues)
            .values()
            .filter(|s| !s.waiters.is_empty() && !s.buffered.is_empty())
            .filter_map(|s| s.held_until)
            .filter(|until| *until > now)
            .min()
            .map(|until| until - now)
    }

    /// The first poll still waiting on the queue, with at most its want of
    /// `granted`; the rest go back to the buffer (their tokens are spent:
    /// the poll went away in between, which only undershoots the limit).
    #[allow(clippy::type_complexity)]
    fn next_waiter(
        &self,
        key: &QueueKey,
        mut granted: Vec<Ranked>,
    ) -> Option<(
        Arc<Waiter>,
        oneshot::Sender<Vec<LeasedTask>>,
        Vec<(Uuid, i32)>,
    )> {
        let mut states = lock(&self.queues);
        let state = states.get_mut(key)?;
        while let Some(waiter) = state.waiters.pop_front() {
            let Some(sender) = waiter.take_sender() else {
                continue;
            };
            if sender.is_closed() {
                continue;
            }
            let rest = granted.split_off(waiter.want.min(granted.len()));
            state.buffered.put_back(rest);
            let granted = granted.into_iter().map(|(_, id, attempt)| (id, attempt));
            return Some((waiter, sender, granted.collect()));
        }
        state.buffered.put_back(granted);
        None
    }

    /// Leases `candidates` to one poll and sends them; a poll gone by then
    /// has its leases released.
    async fn lease_and_send(
        &self,
        key: &QueueKey,
        waiter: &Waiter,
        sender: oneshot::Sender<Vec<LeasedTask>>,
        candidates: &[(Uuid, i32)],
    ) -> Vec<Uuid> {
        {
            let lease = tasks::lease_tasks(
                self.store.pool(),
                candidates,
                &waiter.worker_id,
                &key.0,
                &key.1,
                waiter.receipt,
            );
            let leased = match tokio::time::timeout(self.config.lease_timeout, lease)
                .await
                .unwrap_or(Err(StoreError::TimedOut))
            {
                Ok(leased) => leased,
                Err(error) => {
                    tracing::warn!(%error, "lease failed; recovery offers the tasks again");
                    let _ = sender.send(Vec::new());
                    return Vec::new();
                }
            };
            deliver(&self.store, &waiter.worker_id, sender, leased).await
        }
    }

    /// The next waiting poll of a queue with tasks for it, taken from the
    /// queue's state.
    #[allow(clippy::type_complexity)]
    fn next_hand_out(
        &self,
        key: &QueueKey,
    ) -> Option<(
        Arc<Waiter>,
        oneshot::Sender<Vec<LeasedTask>>,
        Vec<(Uuid, i32)>,
    )> {
        let mut states = lock(&self.queues);
        let state = states.get_mut(key)?;
        while !state.buffered.is_empty() {
            let waiter = state.waiters.pop_front()?;
            let Some(sender) = waiter.take_sender() else {
                continue;
            };
            // a poll whose caller went away would cost a lease and its release
            if sender.is_closed() {
                continue;
            }
            let take = waiter.want.min(state.buffered.len());
            let candidates = state.buffered.take(take);
            return Some((waiter, sender, candidates));
        }
        None
    }

    async fn reader_connection(&self) -> Option<RedisConnection> {
        match self.redis.connect().await {
            Ok(mut connection) => {
                // a blocking read must not time out before its BLOCK does:
                // with NOACK, a reply dropped by a timeout loses its messages
                // until recovery republishes them
                connection.set_response_timeout(self.config.read_block + Duration::from_secs(5));
                Some(connection)
            }
            Err(error) => {
                crate::observe::metrics::redis_error("connect");
                tracing::warn!(%error, "redis unreachable for the stream reader");
                None
            }
        }
    }
}

/// Deletes a stream that holds no message (and is not being written: the
/// check and the delete are one step in Redis). An XADD after it creates the
/// stream again, without the group; the next read then re-creates the group
/// from the stream's start, so that message is read.
const DELETE_IF_EMPTY: &str = "if redis.call('XLEN', KEYS[1]) == 0 then \
     return redis.call('DEL', KEYS[1]) else return 0 end";

/// Creates the consumer group (and the stream) of each key not grouped yet,
/// all at once (a cluster's dead node costs one timeout, not one per key);
/// returns the keys that have their group, and the first failure (a
/// cluster's node that is down fails its keys only).
async fn ensure_groups<'k>(
    client: &RedisClient,
    connection: &RedisConnection,
    keys: &[&'k str],
    grouped: &mut HashSet<String>,
) -> (Vec<&'k str>, Option<redis::RedisError>) {
    let (mut ready, missing): (Vec<&'k str>, Vec<&'k str>) =
        keys.iter().partition(|key| grouped.contains(**key));
    let creations = missing.into_iter().map(|key| {
        let mut connection = connection.clone();
        async move {
            let created: redis::RedisResult<()> =
                connection.xgroup_create_mkstream(key, GROUP, "0").await;
            (key, created)
        }
    });
    let mut failed = None;
    for (key, created) in futures::future::join_all(creations).await {
        match created {
            Err(error) if error.code() != Some("BUSYGROUP") => {
                client.rest(key);
                failed.get_or_insert(error);
            }
            _ => {
                grouped.insert(key.to_owned());
                ready.push(key);
            }
        }
    }
    (ready, failed)
}

/// Reads `keys` with [`read_batch`]: in one command on one Redis, in one
/// per hash slot (sent at once) on a cluster. Returns what was read and the
/// first failure; what the slots that answered gave is kept either way.
async fn read_groups(
    client: &RedisClient,
    connection: &RedisConnection,
    keys: &[&str],
    consumer: &str,
    count: usize,
    block: Option<Duration>,
    grouped: &mut HashSet<String>,
) -> (Vec<(String, Uuid, i32)>, Option<redis::RedisError>) {
    let reads = by_slot(client.is_cluster(), keys.to_vec(), |k| k)
        .into_iter()
        .map(|group| {
            let mut connection = connection.clone();
            async move {
                let read = read_batch(&mut connection, &group, consumer, count, block).await;
                (group, read)
            }
        });
    let mut all = Vec::new();
    let mut failed = None;
    for (group, read) in futures::future::join_all(reads).await {
        match read {
            Ok(read) => all.extend(read),
            Err(error) if error.code() == Some("NOGROUP") => {
                // Redis lost its data (FLUSHALL, a restart, a cluster node
                // back empty) or an empty stream was cleaned up: create the
                // groups again; recovery republishes what was lost
                for key in group {
                    grouped.remove(key);
                }
            }
            Err(error) => {
                if let Some(key) = group.first() {
                    client.rest(key);
                }
                failed.get_or_insert(error);
            }
        }
    }
    (all, failed)
}

/// Reads up to `count` new messages from each stream (NOACK: Postgres, not
/// a pending list, is what recovers a lost message) and deletes them from
/// the streams so they do not grow. Each message comes with its stream.
async fn read_batch(
    connection: &mut RedisConnection,
    keys: &[&str],
    consumer: &str,
    count: usize,
    block: Option<Duration>,
) -> redis::RedisResult<Vec<(String, Uuid, i32)>> {
    let mut command = redis::cmd("XREADGROUP");
    command
        .arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(count);
    // without BLOCK the read answers at once with what is there
    if let Some(block) = block {
        command
            .arg("BLOCK")
            .arg(u64::try_from(block.as_millis()).unwrap_or(1000));
    }
    command.arg("NOACK").arg("STREAMS").arg(keys);
    for _ in keys {
        command.arg(">");
    }
    let reply: Option<StreamReadReply> = command.query_async(connection).await?;
    let Some(reply) = reply else {
        return Ok(Vec::new());
    };
    let mut read = Vec::new();
    let mut pipe = redis::pipe();
    for stream in &reply.keys {
        let ids: Vec<&str> = stream.ids.iter().map(|m| m.id.as_str()).collect();
        if !ids.is_empty() {
            pipe.cmd("XDEL").arg(&stream.key).arg(&ids).ignore();
        }
        for message in &stream.ids {
            let task: Option<String> = message.get("task_id");
            let attempt: Option<i32> = message.get("attempt");
            if let (Some(task), Some(attempt)) =
                (task.and_then(|t| Uuid::parse_str(&t).ok()), attempt)
            {
                read.push((stream.key.clone(), task, attempt));
            }
        }
    }
    pipe.query_async::<()>(connection).await?;
    Ok(read)
}

/// Opens and closes the task's lease span (traces on only) and hands the
/// worker its traceparent in place of the arming transaction's.
fn trace_lease(task: &mut LeasedTask, worker_id: &str) {
    if task.traceparent.is_none() {
        return;
    }
    let span = crate::observe::traces::lease(
        task.traceparent.as_deref(),
        &task.id.to_string(),
        &task.queue,
        worker_id,
    );
    if let Some(waited) = task.dispatched_at {
        let waited = (chrono::Utc::now() - waited).num_milliseconds();
        crate::observe::traces::attribute(&span, "composer.queue_wait_ms", waited.to_string());
    }
    task.traceparent = crate::observe::traces::traceparent(&span);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_held_back_go_back_in_front_in_priority_order() {
        let ids: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        let mut buffered = Buffered::default();
        buffered.push(3, (ids[0], 1));
        buffered.push(5, (ids[1], 1));
        buffered.push(3, (ids[2], 1));
        buffered.push(1, (ids[3], 1));
        let taken = buffered.take_ranked(3);
        assert_eq!(
            taken.iter().map(|t| t.1).collect::<Vec<_>>(),
            vec![ids[1], ids[0], ids[2]],
            "highest priority first, oldest first within one"
        );
        buffered.put_back(taken[1..].to_vec());
        assert_eq!(buffered.best(), Some(3));
        assert_eq!(
            buffered.take(3).iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![ids[0], ids[2], ids[3]],
            "put back ahead of what came later, in their order"
        );
    }
}
