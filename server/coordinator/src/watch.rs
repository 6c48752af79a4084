//! Run-change notifications for WatchRun, through Redis pub/sub.
//!
//! The server that commits an event announces the run's id after the commit
//! ([`ChangeFeed`]); every server keeps one subscription and fans the ids
//! out to its watchers ([`RunChanges`]). Announcements are best effort: a
//! watcher also re-reads the run every second, so a lost one only delays
//! it. (Postgres NOTIFY did this before, but a notifying commit holds a
//! database-wide lock until its WAL is flushed, which serialised every
//! event transaction; see docs/decisions/0009.)

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{broadcast, mpsc, watch};
use uuid::Uuid;

use crate::{
    broker::BrokerError,
    redis_conn::{RedisClient, RedisConnection},
};

/// The Redis pub/sub channel run changes go to: a message is the ids of the
/// changed runs, separated by spaces.
pub const CHANNEL: &str = "composer:runs";

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
        if connection.is_none() {
            connection = client.connect().await.ok();
        }
        let Some(active) = connection.as_mut() else {
            // Redis is down: watchers fall back to their periodic re-read
            batch.clear();
            continue;
        };
        let message = batch
            .iter()
            .map(Uuid::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        batch.clear();
        let sent: redis::RedisResult<i64> = redis::cmd("PUBLISH")
            .arg(CHANNEL)
            .arg(message)
            .query_async(active)
            .await;
        if let Err(error) = sent {
            tracing::debug!(%error, "run change not announced");
            connection = None;
        }
    }
}

/// Broadcasts, inside this server, the id of every run that changed.
#[derive(Clone)]
pub struct RunChanges {
    sender: broadcast::Sender<Uuid>,
}

impl RunChanges {
    /// A broadcaster with no subscription yet.
    pub fn new() -> Self {
        Self {
            sender: broadcast::channel(4096).0,
        }
    }

    /// Subscribes to changes.
    pub fn subscribe(&self) -> broadcast::Receiver<Uuid> {
        self.sender.subscribe()
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
            let mut messages = pubsub.on_message();
            loop {
                tokio::select! {
                    message = messages.next() => {
                        let Some(message) = message else {
                            tracing::warn!("run change subscription lost");
                            break;
                        };
                        let payload: String = message.get_payload().unwrap_or_default();
                        for id in payload.split(' ').filter_map(|id| Uuid::parse_str(id).ok()) {
                            let _ = self.sender.send(id);
                        }
                    }
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}

impl Default for RunChanges {
    fn default() -> Self {
        Self::new()
    }
}
