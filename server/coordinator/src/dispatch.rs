//! Dispatch through Redis Streams.
//!
//! - The outbox enqueuer (every server) wakes on NOTIFY or a short poll,
//!   takes outbox rows `FOR UPDATE SKIP LOCKED`, XADDs them, and commits the
//!   deletion only once Redis has them. Redis down: rows wait in Postgres.
//! - The poll hub (every server) keeps ONE stream reader per (namespace,
//!   queue) on a connection of its own (a blocking XREADGROUP holds its
//!   connection) and hands what it reads to the PollTasks calls waiting in
//!   this server, leasing each task in Postgres with a conditional update.
//!   Only leased tasks reach a worker; a duplicate message loses the update.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use composer_store::{
    Store, StoreError,
    runs::OUTBOX_CHANNEL,
    tasks::{self, LeasedTask, OutboxMessage},
};
use redis::{AsyncCommands, streams::StreamReadReply};
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, oneshot, watch};
use uuid::Uuid;

use crate::error::CoordinatorError;

/// The consumer group every server reads with.
const GROUP: &str = "composer";

/// Tunables of dispatch.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// Streams per queue; a task's shard is its run id modulo this.
    pub shards: u32,
    /// Outbox rows per drain transaction.
    pub outbox_batch: i64,
    /// How often the enqueuer looks at the outbox without a NOTIFY.
    pub outbox_poll: Duration,
    /// Outbox rows younger than this are left to the server that wrote
    /// them, which publishes right after its commit.
    pub outbox_min_age: Duration,
    /// How long one XREADGROUP blocks.
    pub read_block: Duration,
    /// A reader with no waiting poll for this long stops.
    pub reader_idle: Duration,
    /// The longest a lease statement may take (`--db-timeout`); past it the
    /// tasks stay dispatched and recovery offers them again.
    pub lease_timeout: Duration,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            shards: 4,
            outbox_batch: 500,
            outbox_poll: Duration::from_millis(250),
            outbox_min_age: Duration::from_secs(1),
            read_block: Duration::from_millis(1000),
            reader_idle: Duration::from_secs(60),
            lease_timeout: Duration::from_secs(5),
        }
    }
}

/// The stream of one shard of a queue. The braces are a Redis Cluster hash
/// tag, so each shard may live on its own node. The namespace's length
/// leads, so no two (namespace, queue, shard) triples share a key whatever
/// the names hold (the name rule keeps `:` and braces out of them too; the
/// key does not rely on it, and the lease statement trusts neither).
pub fn stream_key(namespace: &str, queue: &str, shard: u32) -> String {
    format!(
        "composer:tasks:{{{}:{namespace}:{queue}:{shard}}}",
        namespace.len()
    )
}

fn shard_of(run_id: Uuid, shards: u32) -> u32 {
    let shards = u128::from(shards.max(1));
    u32::try_from(run_id.as_u128() % shards).unwrap_or(0)
}

/// Moves outbox rows to Redis until `shutdown` flips.
pub async fn run_enqueuer(
    store: Store,
    redis_url: String,
    config: DispatchConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut listener = connect_listener(&store).await;
    let mut redis: Option<redis::aio::MultiplexedConnection> = None;
    let mut backoff = Duration::from_millis(100);
    while !*shutdown.borrow() {
        if redis.is_none() {
            redis = connect_redis(&redis_url).await;
        }
        if let Some(connection) = redis.as_mut() {
            match drain_outbox(&store, connection, &config).await {
                Ok(_) => backoff = Duration::from_millis(100),
                Err(error) => {
                    tracing::warn!(%error, "outbox drain failed; rows stay in postgres");
                    redis = None;
                    sleep_or_stop(backoff, &mut shutdown).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        } else {
            sleep_or_stop(backoff, &mut shutdown).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
            continue;
        }
        wait_for_outbox(&mut listener, &store, config.outbox_poll, &mut shutdown).await;
    }
}

async fn connect_listener(store: &Store) -> Option<PgListener> {
    let mut listener = PgListener::connect_with(store.pool()).await.ok()?;
    listener.listen(OUTBOX_CHANNEL).await.ok()?;
    Some(listener)
}

async fn connect_redis(url: &str) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).ok()?;
    match client.get_multiplexed_async_connection().await {
        Ok(connection) => Some(connection),
        Err(error) => {
            tracing::warn!(%error, "redis unreachable");
            None
        }
    }
}

/// Waits for a NOTIFY, the poll period, or shutdown.
async fn wait_for_outbox(
    listener: &mut Option<PgListener>,
    store: &Store,
    period: Duration,
    shutdown: &mut watch::Receiver<bool>,
) {
    let Some(active) = listener.as_mut() else {
        *listener = connect_listener(store).await;
        sleep_or_stop(period, shutdown).await;
        return;
    };
    tokio::select! {
        received = tokio::time::timeout(period, active.recv()) => {
            if let Ok(Err(error)) = received {
                tracing::warn!(%error, "outbox listener lost; polling until it is back");
                *listener = None;
            }
        }
        _ = shutdown.changed() => {}
    }
}

/// Sends every outbox row, batch by batch; a batch's rows are deleted only
/// when Redis took all of it.
async fn drain_outbox(
    store: &Store,
    redis: &mut redis::aio::MultiplexedConnection,
    config: &DispatchConfig,
) -> Result<usize, CoordinatorError> {
    let mut sent = 0;
    loop {
        let mut tx = store.begin().await?;
        let min_age = i64::try_from(config.outbox_min_age.as_millis()).unwrap_or(i64::MAX);
        let batch = tasks::take_outbox(&mut tx, config.outbox_batch, min_age).await?;
        if batch.is_empty() {
            tx.rollback().await?;
            return Ok(sent);
        }
        publish(redis, &batch, config.shards)
            .await
            .map_err(|e| CoordinatorError::Redis(format!("XADD: {e}")))?;
        tx.commit().await?;
        sent += batch.len();
    }
}

async fn publish(
    redis: &mut redis::aio::MultiplexedConnection,
    batch: &[OutboxMessage],
    shards: u32,
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for message in batch {
        let key = stream_key(
            &message.namespace,
            &message.queue,
            shard_of(message.shard_key, shards),
        );
        pipe.cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("task_id")
            .arg(message.task_id.to_string())
            .arg("attempt")
            .arg(message.attempt)
            .ignore();
    }
    pipe.query_async::<()>(redis).await
}

/// The fast path of dispatch: the server that committed an event XADDs its
/// new tasks at once, then deletes their outbox rows in batches. Anything it
/// fails to send stays in the outbox, where the enqueuer finds it.
pub struct Publisher {
    redis: redis::Client,
    connection: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    shards: u32,
    published: tokio::sync::mpsc::UnboundedSender<i64>,
}

impl Publisher {
    /// A publisher to `redis_url`, and the task that deletes what it sent
    /// (run it until shutdown).
    pub fn new(
        store: Store,
        redis_url: &str,
        shards: u32,
    ) -> Result<
        (
            Arc<Self>,
            impl std::future::Future<Output = ()> + Send + use<>,
        ),
        CoordinatorError,
    > {
        let redis = redis::Client::open(redis_url)
            .map_err(|e| CoordinatorError::Redis(format!("url: {e}")))?;
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let publisher = Arc::new(Self {
            redis,
            connection: tokio::sync::Mutex::new(None),
            shards,
            published: sender,
        });
        Ok((publisher, delete_published(store, receiver)))
    }

    /// XADDs the messages; on success their outbox rows are queued for
    /// deletion, on failure they stay for the enqueuer.
    pub async fn publish(&self, messages: Vec<OutboxMessage>) {
        let mut guard = self.connection.lock().await;
        if guard.is_none() {
            *guard = self.redis.get_multiplexed_async_connection().await.ok();
        }
        let Some(connection) = guard.as_mut() else {
            return;
        };
        let mut connection = connection.clone();
        drop(guard);
        match publish(&mut connection, &messages, self.shards).await {
            Ok(()) => {
                for message in &messages {
                    let _ = self.published.send(message.outbox_id);
                }
            }
            Err(error) => {
                tracing::warn!(%error, "publish failed; the enqueuer will send it");
                *self.connection.lock().await = None;
            }
        }
    }
}

/// Deletes published outbox rows in batches (one transaction per batch).
async fn delete_published(store: Store, mut ids: tokio::sync::mpsc::UnboundedReceiver<i64>) {
    let mut batch = Vec::new();
    while let Some(id) = ids.recv().await {
        batch.push(id);
        while batch.len() < 1000 {
            match ids.try_recv() {
                Ok(id) => batch.push(id),
                Err(_) => break,
            }
        }
        if let Err(error) = tasks::delete_published(store.pool(), &batch).await {
            tracing::warn!(%error, "could not delete published outbox rows; they may be sent again");
        }
        batch.clear();
        // let a few more commits add to the next batch
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn sleep_or_stop(period: Duration, shutdown: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep(period) => {},
        _ = shutdown.changed() => {},
    }
}

/// A PollTasks call waiting in this server.
struct Waiter {
    worker_id: String,
    want: usize,
    sender: Mutex<Option<oneshot::Sender<Vec<LeasedTask>>>>,
}

impl Waiter {
    fn take_sender(&self) -> Option<oneshot::Sender<Vec<LeasedTask>>> {
        self.sender.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

#[derive(Default)]
struct ReaderShared {
    waiters: Mutex<VecDeque<Arc<Waiter>>>,
    wake: Notify,
}

/// Hands tasks read from Redis to the polls waiting in this server.
pub struct PollHub {
    store: Store,
    redis: redis::Client,
    consumer: String,
    config: DispatchConfig,
    readers: Mutex<HashMap<(String, String), Arc<ReaderShared>>>,
}

impl PollHub {
    /// A hub for this server (`consumer` names it in the consumer group).
    pub fn new(
        store: Store,
        redis_url: &str,
        config: DispatchConfig,
    ) -> Result<Arc<Self>, CoordinatorError> {
        let redis = redis::Client::open(redis_url)
            .map_err(|e| CoordinatorError::Redis(format!("url: {e}")))?;
        Ok(Arc::new(Self {
            store,
            redis,
            consumer: format!("server-{}", Uuid::new_v4().simple()),
            config,
            readers: Mutex::new(HashMap::new()),
        }))
    }

    /// Waits up to `wait` for tasks on `queues`; returns at most `max`, each
    /// leased to `worker_id`.
    pub async fn poll(
        self: &Arc<Self>,
        namespace: &str,
        queues: &[String],
        worker_id: &str,
        max: usize,
        wait: Duration,
    ) -> Vec<LeasedTask> {
        let (sender, receiver) = oneshot::channel();
        let waiter = Arc::new(Waiter {
            worker_id: worker_id.to_owned(),
            want: max.max(1),
            sender: Mutex::new(Some(sender)),
        });
        for queue in queues {
            let shared = self.reader(namespace, queue);
            shared
                .waiters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(Arc::clone(&waiter));
            shared.wake.notify_one();
        }
        let mut receiver = receiver;
        tokio::select! {
            got = &mut receiver => got.unwrap_or_default(),
            () = tokio::time::sleep(wait) => {
                if waiter.take_sender().is_some() {
                    // nobody was handing us tasks: none will be
                    return Vec::new();
                }
                // a reader is leasing for us right now: take what it sends
                receiver.await.unwrap_or_default()
            }
        }
    }

    fn reader(self: &Arc<Self>, namespace: &str, queue: &str) -> Arc<ReaderShared> {
        let key = (namespace.to_owned(), queue.to_owned());
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(shared) = readers.get(&key) {
            return Arc::clone(shared);
        }
        let shared = Arc::new(ReaderShared::default());
        readers.insert(key.clone(), Arc::clone(&shared));
        let hub = Arc::clone(self);
        let reader_shared = Arc::clone(&shared);
        tokio::spawn(async move {
            hub.read_queue(&key.0, &key.1, reader_shared).await;
            hub.readers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
        });
        shared
    }

    /// One queue's reader: reads while polls wait, stops when idle.
    async fn read_queue(&self, namespace: &str, queue: &str, shared: Arc<ReaderShared>) {
        let keys: Vec<String> = (0..self.config.shards.max(1))
            .map(|shard| stream_key(namespace, queue, shard))
            .collect();
        let mut connection: Option<redis::aio::MultiplexedConnection> = None;
        let mut buffered: VecDeque<(Uuid, i32)> = VecDeque::new();
        let mut idle_since = tokio::time::Instant::now();
        loop {
            drop_closed_waiters(&shared);
            let wanted = wanted_count(&shared);
            if wanted == 0 {
                if idle_since.elapsed() > self.config.reader_idle {
                    return;
                }
                let _ = tokio::time::timeout(Duration::from_secs(1), shared.wake.notified()).await;
                continue;
            }
            idle_since = tokio::time::Instant::now();
            if buffered.is_empty() {
                if connection.is_none() {
                    connection = self.reader_connection(&keys).await;
                }
                let Some(active) = connection.as_mut() else {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                };
                match read_batch(
                    active,
                    &keys,
                    &self.consumer,
                    wanted,
                    self.config.read_block,
                )
                .await
                {
                    Ok(read) => buffered.extend(read),
                    Err(error) => {
                        if error.code() == Some("NOGROUP") {
                            // Redis lost its data (FLUSHALL, restart): recreate
                            // the groups; recovery republishes what was lost
                            let _ = ensure_groups(active, &keys).await;
                        } else {
                            tracing::warn!(%error, queue, "stream read failed");
                            connection = None;
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        continue;
                    }
                }
            }
            self.hand_out((namespace, queue), &shared, &mut buffered)
                .await;
        }
    }

    async fn reader_connection(
        &self,
        keys: &[String],
    ) -> Option<redis::aio::MultiplexedConnection> {
        let mut connection = match self.redis.get_multiplexed_async_connection().await {
            Ok(mut connection) => {
                // a blocking read must not time out before its BLOCK does:
                // with NOACK, a reply dropped by a timeout loses its messages
                // until recovery republishes them
                connection.set_response_timeout(self.config.read_block + Duration::from_secs(5));
                connection
            }
            Err(error) => {
                tracing::warn!(%error, "redis unreachable for a stream reader");
                return None;
            }
        };
        ensure_groups(&mut connection, keys).await.ok()?;
        Some(connection)
    }

    /// Leases buffered tasks to waiting polls, first come first served.
    async fn hand_out(
        &self,
        (namespace, queue): (&str, &str),
        shared: &ReaderShared,
        buffered: &mut VecDeque<(Uuid, i32)>,
    ) {
        while !buffered.is_empty() {
            let Some(waiter) = shared
                .waiters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front()
            else {
                return;
            };
            let Some(sender) = waiter.take_sender() else {
                continue;
            };
            let take = waiter.want.min(buffered.len());
            let candidates: Vec<(Uuid, i32)> = buffered.drain(..take).collect();
            let lease = tasks::lease_tasks(
                self.store.pool(),
                &candidates,
                &waiter.worker_id,
                namespace,
                queue,
            );
            let leased = match tokio::time::timeout(self.config.lease_timeout, lease)
                .await
                .unwrap_or_else(|_| Err(StoreError::TimedOut))
            {
                Ok(leased) => leased,
                Err(error) => {
                    tracing::warn!(%error, "lease failed; tasks stay dispatched");
                    let _ = sender.send(Vec::new());
                    continue;
                }
            };
            if let Err(unsent) = sender.send(leased) {
                let leases: Vec<(Uuid, Uuid)> =
                    unsent.iter().map(|t| (t.id, t.lease_token)).collect();
                if let Err(error) = tasks::release_leases(self.store.pool(), &leases).await {
                    tracing::warn!(%error, "could not release leases of a vanished poll; they will expire");
                }
            }
        }
    }
}

fn drop_closed_waiters(shared: &ReaderShared) {
    shared
        .waiters
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|w| {
            w.sender
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(|s| !s.is_closed())
        });
}

fn wanted_count(shared: &ReaderShared) -> usize {
    let waiters = shared.waiters.lock().unwrap_or_else(|p| p.into_inner());
    waiters.iter().map(|w| w.want).sum::<usize>().min(1000)
}

async fn ensure_groups(
    connection: &mut redis::aio::MultiplexedConnection,
    keys: &[String],
) -> redis::RedisResult<()> {
    for key in keys {
        let created: redis::RedisResult<()> =
            connection.xgroup_create_mkstream(key, GROUP, "0").await;
        if let Err(error) = created
            && error.code() != Some("BUSYGROUP")
        {
            return Err(error);
        }
    }
    Ok(())
}

/// Reads up to `count` new messages from the shards (NOACK: Postgres, not
/// a pending list, is what recovers a lost message) and deletes them from
/// the streams so they do not grow.
async fn read_batch(
    connection: &mut redis::aio::MultiplexedConnection,
    keys: &[String],
    consumer: &str,
    count: usize,
    block: Duration,
) -> redis::RedisResult<Vec<(Uuid, i32)>> {
    let mut command = redis::cmd("XREADGROUP");
    command
        .arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("BLOCK")
        .arg(u64::try_from(block.as_millis()).unwrap_or(1000))
        .arg("NOACK")
        .arg("STREAMS")
        .arg(keys);
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
                read.push((task, attempt));
            }
        }
    }
    pipe.query_async::<()>(connection).await?;
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_spread_runs_and_stay_in_range() {
        let mut seen = [0u32; 4];
        for _ in 0..400 {
            let shard = shard_of(Uuid::new_v4(), 4);
            assert!(shard < 4);
            seen[shard as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 40), "{seen:?}");
        assert_eq!(stream_key("ns", "q", 3), "composer:tasks:{2:ns:q:3}");
    }

    /// Reads a key back into its triple: possible for every key, which is
    /// what makes two different triples' keys differ.
    fn triple_of(key: &str) -> (String, String, u32) {
        let inner = key
            .strip_prefix("composer:tasks:{")
            .and_then(|k| k.strip_suffix('}'))
            .expect("key shape");
        let (len, rest) = inner.split_once(':').expect("length");
        let len: usize = len.parse().expect("length digits");
        let (namespace, rest) = rest.split_at(len);
        let rest = rest.strip_prefix(':').expect("separator");
        let (queue, shard) = rest.rsplit_once(':').expect("shard");
        (
            namespace.to_owned(),
            queue.to_owned(),
            shard.parse().expect("shard digits"),
        )
    }

    #[test]
    fn the_collision_once_found_is_gone() {
        assert_ne!(
            stream_key("org", "prod:email", 0),
            stream_key("org:prod", "email", 0)
        );
        assert_ne!(stream_key("a}", "b", 1), stream_key("a", "}b", 1));
    }

    proptest::proptest! {
        #[test]
        fn stream_keys_never_collide(
            a in ("[a:{}1_.-]{0,6}", "[a:{}1_.-]{0,6}", 0u32..12),
            b in ("[a:{}1_.-]{0,6}", "[a:{}1_.-]{0,6}", 0u32..12),
        ) {
            let key_a = stream_key(&a.0, &a.1, a.2);
            let key_b = stream_key(&b.0, &b.1, b.2);
            proptest::prop_assert_eq!(triple_of(&key_a), a.clone());
            proptest::prop_assert_eq!(key_a == key_b, a == b);
        }
    }
}
