//! Dispatch through Redis Streams.
//!
//! - The outbox enqueuer (every server) wakes on NOTIFY or a short poll,
//!   takes outbox rows `FOR UPDATE SKIP LOCKED`, XADDs them, and commits the
//!   deletion only once Redis has them. Redis down: rows wait in Postgres.
//! - The poll hub (every server, `poll_hub.rs`) reads the streams of every
//!   queue its PollTasks calls wait on with one blocking XREADGROUP, and
//!   leases what it reads in Postgres with a conditional update. Only leased
//!   tasks reach a worker; a duplicate message loses the update.

use std::{sync::Arc, time::Duration};

use composer_store::{
    Store,
    tasks::{self, OUTBOX_CHANNEL, OutboxMessage},
};
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use uuid::Uuid;

use crate::{
    dispatch::redis_conn::{RedisClient, RedisConnection, by_slot},
    error::CoordinatorError,
};

/// The consumer group every server reads with.
pub(crate) const GROUP: &str = "composer";

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
    /// How long a lease lasts before its worker's first heartbeat, when the
    /// worker confirms receipt (`--lease-receipt-timeout`).
    pub receipt_timeout: Duration,
    /// Each namespace's quotas: the rate-limit keys a queue may use.
    pub quotas: std::sync::Arc<crate::limits::quotas::NamespaceQuotas>,
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
            receipt_timeout: Duration::from_secs(5),
            quotas: std::sync::Arc::default(),
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

/// The priority of a run that asks for none.
pub const DEFAULT_PRIORITY: i16 = 3;

/// The priorities a run may have, lowest first.
pub const PRIORITIES: std::ops::RangeInclusive<i16> = 1..=5;

/// The stream a task of `priority` goes to: the default priority keeps the
/// sharded streams of [`stream_key`]; each other priority has one stream
/// per queue (the key of shard 0 with a `:p<priority>` suffix, outside the
/// hash tag), so a poll reads `shards + 4` streams per queue, not five
/// times as many. Decision 0017.
pub fn priority_stream_key(namespace: &str, queue: &str, shard: u32, priority: i16) -> String {
    if priority == DEFAULT_PRIORITY {
        stream_key(namespace, queue, shard)
    } else {
        format!("{}:p{priority}", stream_key(namespace, queue, 0))
    }
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
    let client = match RedisClient::open(&redis_url) {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "outbox enqueuer not started");
            return;
        }
    };
    let mut listener = connect_listener(&store).await;
    let mut redis: Option<RedisConnection> = None;
    let mut backoff = Duration::from_millis(100);
    while !*shutdown.borrow() {
        if redis.is_none() {
            redis = connect_redis(&client).await;
        }
        if let Some(connection) = redis.as_mut() {
            match drain_outbox(&store, &client, connection, &config).await {
                Ok(_) => backoff = Duration::from_millis(100),
                Err(error) => {
                    crate::observe::metrics::redis_error("enqueue");
                    tracing::warn!(%error, "outbox drain failed; rows stay in postgres");
                    // a cluster connection finds a node that comes back by itself
                    if !client.is_cluster() {
                        redis = None;
                    }
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

async fn connect_redis(client: &RedisClient) -> Option<RedisConnection> {
    match client.connect().await {
        Ok(connection) => Some(connection),
        Err(error) => {
            crate::observe::metrics::redis_error("connect");
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
/// when Redis took all of it (on a cluster, a node down keeps the whole
/// batch: what other nodes took is sent again, and a duplicate loses its
/// lease update).
async fn drain_outbox(
    store: &Store,
    client: &RedisClient,
    redis: &mut RedisConnection,
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
        for (_, sent) in publish(client, redis, &batch, config.shards).await {
            match sent {
                Sent::Taken => {}
                Sent::Resting => {
                    return Err(CoordinatorError::Redis(
                        "XADD: a slot's node failed a moment ago".to_owned(),
                    ));
                }
                Sent::Failed(error) => {
                    return Err(CoordinatorError::Redis(format!("XADD: {error}")));
                }
            }
        }
        tx.commit().await?;
        sent += batch.len();
    }
}

/// What became of one pipeline of a publish.
enum Sent {
    /// Redis has the messages.
    Taken,
    /// Not sent: the slot's node failed a moment ago (cluster only).
    Resting,
    /// Redis refused them or did not answer.
    Failed(redis::RedisError),
}

/// XADDs the batch: one pipeline on one Redis, one per hash slot (sent at
/// once) on a cluster. Returns each pipeline's messages with its fate.
async fn publish<'a>(
    client: &RedisClient,
    redis: &RedisConnection,
    batch: &'a [OutboxMessage],
    shards: u32,
) -> Vec<(Vec<&'a OutboxMessage>, Sent)> {
    let keyed: Vec<(String, &OutboxMessage)> = batch
        .iter()
        .map(|message| {
            let key = priority_stream_key(
                &message.namespace,
                &message.queue,
                shard_of(message.shard_key, shards),
                message.priority,
            );
            (key, message)
        })
        .collect();
    let sends = by_slot(client.is_cluster(), keyed, |(key, _)| key)
        .into_iter()
        .map(|group| {
            let mut connection = redis.clone();
            async move {
                let key = group.first().map_or("", |(key, _)| key.as_str());
                let sent = if client.is_resting(key) {
                    Sent::Resting
                } else {
                    match publish_group(&mut connection, &group).await {
                        Ok(()) => Sent::Taken,
                        Err(error) => {
                            client.rest(key);
                            Sent::Failed(error)
                        }
                    }
                };
                let messages: Vec<&OutboxMessage> = group.iter().map(|(_, m)| *m).collect();
                if matches!(sent, Sent::Taken) {
                    count_dispatched(&messages);
                }
                (messages, sent)
            }
        });
    futures::future::join_all(sends).await
}

/// XADDs messages whose keys share a slot, in one pipeline.
async fn publish_group(
    redis: &mut RedisConnection,
    group: &[(String, &OutboxMessage)],
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for (key, message) in group {
        pipe.cmd("XADD")
            .arg(key)
            .arg("*")
            .arg("task_id")
            .arg(message.task_id.to_string())
            .arg("attempt")
            .arg(message.attempt)
            .ignore();
    }
    pipe.query_async::<()>(redis).await
}

/// Counts what one publish sent, by namespace and queue.
fn count_dispatched(batch: &[&OutboxMessage]) {
    let mut by_queue: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
    for message in batch {
        *by_queue
            .entry((message.namespace.as_str(), message.queue.as_str()))
            .or_default() += 1;
    }
    for ((namespace, queue), count) in by_queue {
        crate::observe::metrics::tasks_dispatched(namespace, queue, count);
    }
}

/// The fast path of dispatch: the server that committed an event XADDs its
/// new tasks at once. A task armed by an event has no outbox row (its row
/// is its own outbox, decision 0024): what Redis does not take is written
/// to the outbox then, for the enqueuer; a crash before the send leaves it
/// to the lost-dispatch pass. Messages that came with an outbox row (a
/// resume, a handed slot) have it deleted, in batches, once sent.
pub struct Publisher {
    redis: RedisClient,
    store: Store,
    connection: tokio::sync::Mutex<Option<RedisConnection>>,
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
        let redis =
            RedisClient::open(redis_url).map_err(|e| CoordinatorError::Redis(e.to_string()))?;
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let publisher = Arc::new(Self {
            redis,
            store: store.clone(),
            connection: tokio::sync::Mutex::new(None),
            shards,
            published: sender,
        });
        Ok((publisher, delete_published(store, receiver)))
    }

    /// XADDs the messages; the outbox rows of those Redis took are queued
    /// for deletion; those it did not take are left to the enqueuer.
    pub async fn publish(&self, messages: Vec<OutboxMessage>) {
        let Some(connection) = self.connection().await else {
            self.leave_to_enqueuer(messages.iter()).await;
            return;
        };
        let mut failed = false;
        let mut unsent = Vec::new();
        for (messages, sent) in publish(&self.redis, &connection, &messages, self.shards).await {
            match sent {
                Sent::Taken => {
                    for id in messages.iter().filter_map(|m| m.outbox_id) {
                        let _ = self.published.send(id);
                    }
                }
                Sent::Resting => unsent.extend(messages),
                Sent::Failed(error) => {
                    crate::observe::metrics::redis_error("publish");
                    tracing::warn!(%error, "publish failed; the enqueuer will send it");
                    failed = true;
                    unsent.extend(messages);
                }
            }
        }
        self.leave_to_enqueuer(unsent.into_iter()).await;
        // a cluster connection finds a node that comes back by itself
        if failed && !self.redis.is_cluster() {
            *self.connection.lock().await = None;
        }
    }

    async fn connection(&self) -> Option<RedisConnection> {
        let mut guard = self.connection.lock().await;
        if guard.is_none() {
            *guard = self.redis.connect().await.ok();
        }
        guard.clone()
    }

    /// Writes outbox rows for unsent messages that have none (those with
    /// one keep it). If Postgres refuses too, the lost-dispatch pass finds
    /// the tasks after its grace.
    async fn leave_to_enqueuer<'m>(&self, unsent: impl Iterator<Item = &'m OutboxMessage>) {
        let rowless: Vec<OutboxMessage> = unsent
            .filter(|message| message.outbox_id.is_none())
            .cloned()
            .collect();
        if let Err(error) = tasks::queue_unsent(self.store.pool(), &rowless).await {
            tracing::warn!(%error, count = rowless.len(),
                "could not queue unsent tasks; the lost-dispatch pass will send them");
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
