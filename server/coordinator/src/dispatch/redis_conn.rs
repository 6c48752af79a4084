//! One Redis, or a Redis Cluster, behind one connection type (decision
//! 0022). `--redis-url` names a cluster as `redis+cluster://h1:p1,h2:p2` or
//! as several comma-separated seed URLs; a single `redis://` URL is one
//! Redis, talked to exactly as before.
//!
//! In a cluster every key of one command, Lua script or pipeline must hash
//! to one slot: callers group keys with [`hash_tag`] before they pipeline
//! them ([`RedisClient::is_cluster`] tells them when it matters).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use redis::{
    Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value,
    aio::{ConnectionLike, MultiplexedConnection},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
};

/// Errors talking to Redis.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The Redis URL could not be parsed.
    #[error("invalid Redis URL: {0}")]
    InvalidUrl(String),
    /// Redis did not answer.
    #[error("cannot reach Redis: {0}")]
    Unreachable(String),
}

/// The scheme that names a cluster by its seed nodes.
const CLUSTER_SCHEME: &str = "redis+cluster://";

/// How long a cluster connection waits on one node (to connect, or for a
/// reply) before it counts the node as down.
const CLUSTER_NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// The least and most wait before a cluster command is retried (after a
/// MOVED or a node lost), milliseconds.
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (10, 100);

/// How long opening a cluster connection may take (its seeds, then its slot
/// map) before it counts as failed.
const CLUSTER_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the slots of a cluster node that failed a command are left
/// alone: each failure makes the cluster client refresh its slot map, which
/// holds up every other command, so a dead node is tried about once a
/// second, not by every read and publish.
const SLOT_REST: Duration = Duration::from_secs(1);

/// What `--redis-url` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One Redis.
    Single(String),
    /// A Redis Cluster, by the URLs of some of its nodes.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// Parses a URL: `redis://host:port/db` (one Redis),
    /// `redis+cluster://[user:password@]h1:p1,h2:p2` or
    /// `redis://h1:p1,redis://h2:p2` (a cluster).
    pub fn parse(url: &str) -> Result<Self, BrokerError> {
        let url = url.trim();
        if url.is_empty() {
            return Err(BrokerError::InvalidUrl("empty".to_owned()));
        }
        let target = if let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) {
            Self::Cluster(expand_cluster_url(rest)?)
        } else if url.contains(',') {
            Self::Cluster(url.split(',').map(|s| s.trim().to_owned()).collect())
        } else {
            Self::Single(url.to_owned())
        };
        target.validate()?;
        Ok(target)
    }

    fn validate(&self) -> Result<(), BrokerError> {
        match self {
            Self::Single(url) => check_url(url).map(|_| ()),
            Self::Cluster(seeds) => {
                for seed in seeds {
                    if seed.is_empty() {
                        return Err(BrokerError::InvalidUrl(
                            "an empty entry in the cluster's node list".to_owned(),
                        ));
                    }
                    let db = check_url(seed)?;
                    if db != 0 {
                        return Err(BrokerError::InvalidUrl(format!(
                            "{}: a Redis Cluster has only database 0",
                            redact(seed)
                        )));
                    }
                }
                Ok(())
            }
        }
    }
}

/// `[user:password@]h1:p1,h2:p2[/path][?query]` into one URL per node,
/// each with the credentials and the path.
fn expand_cluster_url(rest: &str) -> Result<Vec<String>, BrokerError> {
    let (credentials, hosts_and_path) = match rest.rsplit_once('@') {
        Some((credentials, after)) => (format!("{credentials}@"), after),
        None => (String::new(), rest),
    };
    let split = hosts_and_path
        .find(['/', '?'])
        .unwrap_or(hosts_and_path.len());
    let (hosts, path) = hosts_and_path.split_at(split);
    if hosts.trim().is_empty() {
        return Err(BrokerError::InvalidUrl(
            "redis+cluster:// names no node".to_owned(),
        ));
    }
    Ok(hosts
        .split(',')
        .map(|host| {
            let host = host.trim();
            if host.is_empty() {
                String::new()
            } else {
                format!("redis://{credentials}{host}{path}")
            }
        })
        .collect())
}

/// Checks one node's URL; returns its database index.
fn check_url(url: &str) -> Result<i64, BrokerError> {
    if !(url.starts_with("redis://")
        || url.starts_with("rediss://")
        || url.starts_with("unix://")
        || url.starts_with("redis+unix://"))
    {
        return Err(BrokerError::InvalidUrl(format!(
            "{}: expected redis://host:port, redis+cluster://host:port,host:port \
             or comma-separated redis:// URLs",
            redact(url)
        )));
    }
    let info = url
        .into_connection_info()
        .map_err(|e| BrokerError::InvalidUrl(format!("{}: {e}", redact(url))))?;
    Ok(info.redis_settings().db())
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Opens connections to the Redis or cluster `--redis-url` names. Cheap to
/// clone.
#[derive(Clone)]
pub struct RedisClient {
    inner: ClientKind,
    /// Hash tags whose commands failed lately, until when they rest
    /// (cluster only).
    resting: Arc<Mutex<HashMap<String, Instant>>>,
}

#[derive(Clone)]
enum ClientKind {
    Single(redis::Client),
    Cluster {
        client: Box<ClusterClient>,
        /// One client per seed: pub/sub goes through one node at a time.
        seeds: Vec<redis::Client>,
    },
}

impl std::fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClient")
            .field("cluster", &self.is_cluster())
            .finish_non_exhaustive()
    }
}

impl RedisClient {
    /// A client for `url` (see [`RedisTarget::parse`]); connects to nothing.
    pub fn open(url: &str) -> Result<Self, BrokerError> {
        Self::for_target(&RedisTarget::parse(url)?)
    }

    /// A client for a parsed target.
    pub fn for_target(target: &RedisTarget) -> Result<Self, BrokerError> {
        let invalid = |e: redis::RedisError| BrokerError::InvalidUrl(e.to_string());
        let inner = match target {
            RedisTarget::Single(url) => {
                ClientKind::Single(redis::Client::open(url.as_str()).map_err(invalid)?)
            }
            RedisTarget::Cluster(seeds) => {
                let client = ClusterClient::builder(seeds.iter().map(String::as_str))
                    .connection_timeout(CLUSTER_NODE_TIMEOUT)
                    .response_timeout(CLUSTER_NODE_TIMEOUT)
                    // a node that is down fails its own commands quickly
                    // (the crate's default waits seconds between retries,
                    // and a read or publish waits on its slowest slot);
                    // Postgres keeps what they carried
                    .retries(2)
                    .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
                    .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1)
                    .build()
                    .map_err(invalid)?;
                let seeds = seeds
                    .iter()
                    .map(|seed| redis::Client::open(seed.as_str()))
                    .collect::<Result<_, _>>()
                    .map_err(invalid)?;
                ClientKind::Cluster {
                    client: Box::new(client),
                    seeds,
                }
            }
        };
        Ok(Self {
            inner,
            resting: Arc::default(),
        })
    }

    fn resting(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.resting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether commands on `key`'s slot are being left alone after a
    /// failure (never on one Redis: its failures drop the connection).
    pub fn is_resting(&self, key: &str) -> bool {
        if !self.is_cluster() {
            return false;
        }
        let mut resting = self.resting();
        let tag = hash_tag(key);
        match resting.get(tag) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                resting.remove(tag);
                false
            }
            None => false,
        }
    }

    /// Leaves `key`'s slot alone for a while: a command on it failed.
    pub fn rest(&self, key: &str) {
        if self.is_cluster() {
            self.resting()
                .insert(hash_tag(key).to_owned(), Instant::now() + SLOT_REST);
        }
    }

    /// Whether this is a cluster: multi-key commands and pipelines must then
    /// stay within one hash slot.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner, ClientKind::Cluster { .. })
    }

    /// A new multiplexed connection (to every node of a cluster).
    pub async fn connect(&self) -> redis::RedisResult<RedisConnection> {
        match &self.inner {
            ClientKind::Single(client) => client
                .get_multiplexed_async_connection()
                .await
                .map(RedisConnection::Single),
            ClientKind::Cluster { client, .. } => {
                let client = Arc::new((**client).clone());
                let connection = open_cluster(&client).await?;
                Ok(RedisConnection::Cluster(HealingCluster::new(
                    client, connection,
                )))
            }
        }
    }

    /// The clients a pub/sub subscription may go through, to try in turn:
    /// the one Redis, or each seed of a cluster (a message published on
    /// any node reaches subscribers on every node).
    pub fn pubsub_clients(&self) -> Vec<redis::Client> {
        match &self.inner {
            ClientKind::Single(client) => vec![client.clone()],
            ClientKind::Cluster { seeds, .. } => seeds.clone(),
        }
    }
}

/// A connection to one Redis or to a cluster; every command helper of the
/// `redis` crate takes it.
#[derive(Clone)]
pub enum RedisConnection {
    /// One Redis.
    Single(MultiplexedConnection),
    /// A cluster: each command goes to the node of its keys' slot.
    Cluster(HealingCluster),
}

impl RedisConnection {
    /// Bounds how long a reply may take (one Redis only; a cluster
    /// connection keeps its per-node timeout).
    pub fn set_response_timeout(&mut self, timeout: Duration) {
        if let Self::Single(connection) = self {
            connection.set_response_timeout(timeout);
        }
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(connection) => connection.req_packed_command(cmd),
            Self::Cluster(connection) => Box::pin(connection.command(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(connection) => connection.req_packed_commands(pipeline, offset, count),
            Self::Cluster(connection) => Box::pin(connection.pipeline(pipeline, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(connection) => connection.get_db(),
            Self::Cluster(_) => 0,
        }
    }
}

/// Opens a cluster connection, in at most [`CLUSTER_CONNECT_TIMEOUT`].
async fn open_cluster(client: &ClusterClient) -> redis::RedisResult<ClusterConnection> {
    tokio::time::timeout(CLUSTER_CONNECT_TIMEOUT, client.get_async_connection())
        .await
        .map_err(|_| {
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "opening the cluster connection timed out",
            ))
        })?
}

/// A cluster connection that replaces itself when a command times out.
///
/// Why: the `redis` crate's cluster connection can wedge after a node dies.
/// A slot refresh that never ends holds every later command of that
/// connection, on every node, until its timeout, for good (seen in 4 of
/// 72 runs of `redis_cluster.rs`, decision 0028). A command
/// that times out therefore retires the connection it used, and the next
/// command opens a fresh one; a dead node's own commands keep failing fast
/// and resting their slots ([`RedisClient::rest`]) meanwhile. Clones share
/// the current connection.
#[derive(Clone)]
pub struct HealingCluster {
    client: Arc<ClusterClient>,
    current: Arc<tokio::sync::Mutex<Current>>,
}

/// The connection in use, and how many have been opened before it.
struct Current {
    generation: u64,
    connection: Option<ClusterConnection>,
}

impl HealingCluster {
    fn new(client: Arc<ClusterClient>, connection: ClusterConnection) -> Self {
        Self {
            client,
            current: Arc::new(tokio::sync::Mutex::new(Current {
                generation: 0,
                connection: Some(connection),
            })),
        }
    }

    /// The connection to use and its generation; opens one when the last
    /// was retired (callers wait for it: one open at a time).
    async fn checkout(&self) -> redis::RedisResult<(u64, ClusterConnection)> {
        let mut current = self.current.lock().await;
        if let Some(connection) = &current.connection {
            return Ok((current.generation, connection.clone()));
        }
        let connection = open_cluster(&self.client).await?;
        current.generation += 1;
        current.connection = Some(connection.clone());
        tracing::info!(
            generation = current.generation,
            "opened a fresh cluster connection"
        );
        Ok((current.generation, connection))
    }

    /// Retires the connection of `generation` after `error`, when that is
    /// a timeout and the connection is still the current one.
    async fn after(&self, generation: u64, error: &redis::RedisError) {
        if !error.is_timeout() {
            return;
        }
        let mut current = self.current.lock().await;
        if current.generation == generation && current.connection.take().is_some() {
            crate::observe::metrics::redis_error("cluster_retired");
            tracing::warn!(%error, "a cluster command timed out; its connection is retired");
        }
    }

    async fn command(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let (generation, mut connection) = self.checkout().await?;
        let reply = connection.req_packed_command(cmd).await;
        if let Err(error) = &reply {
            self.after(generation, error).await;
        }
        reply
    }

    async fn pipeline(
        &mut self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<Value>> {
        let (generation, mut connection) = self.checkout().await?;
        let reply = connection
            .req_packed_commands(pipeline, offset, count)
            .await;
        if let Err(error) = &reply {
            self.after(generation, error).await;
        }
        reply
    }
}

/// The part of `key` Redis Cluster hashes to pick its slot: the text
/// between the first `{` and the next `}` when that is not empty, else the
/// whole key. Keys with one tag share a slot.
pub fn hash_tag(key: &str) -> &str {
    let Some(open) = key.find('{') else {
        return key;
    };
    match key[open + 1..].find('}') {
        Some(0) | None => key,
        Some(len) => &key[open + 1..open + 1 + len],
    }
}

/// Groups `items` by the hash tag of their key, keeping their order within
/// a group: on a cluster each group may be one pipeline or one command; on
/// one Redis (`cluster` false) everything is one group.
pub fn by_slot<T>(cluster: bool, items: Vec<T>, key: impl Fn(&T) -> &str) -> Vec<Vec<T>> {
    if !cluster {
        return if items.is_empty() {
            Vec::new()
        } else {
            vec![items]
        };
    }
    let mut groups: BTreeMap<String, Vec<T>> = BTreeMap::new();
    for item in items {
        groups
            .entry(hash_tag(key(&item)).to_owned())
            .or_default()
            .push(item);
    }
    groups.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_url_is_one_redis_and_lists_are_clusters() {
        assert_eq!(
            RedisTarget::parse("redis://127.0.0.1:6379/3").unwrap(),
            RedisTarget::Single("redis://127.0.0.1:6379/3".to_owned())
        );
        assert_eq!(
            RedisTarget::parse("redis+cluster://a:7000,b:7001").unwrap(),
            RedisTarget::Cluster(vec![
                "redis://a:7000".to_owned(),
                "redis://b:7001".to_owned()
            ])
        );
        assert_eq!(
            RedisTarget::parse("redis+cluster://u:p@a:7000,b:7001/0?protocol=resp3").unwrap(),
            RedisTarget::Cluster(vec![
                "redis://u:p@a:7000/0?protocol=resp3".to_owned(),
                "redis://u:p@b:7001/0?protocol=resp3".to_owned()
            ])
        );
        assert_eq!(
            RedisTarget::parse(" redis://a:7000, redis://b:7001 ").unwrap(),
            RedisTarget::Cluster(vec![
                "redis://a:7000".to_owned(),
                "redis://b:7001".to_owned()
            ])
        );
        assert_eq!(
            RedisTarget::parse("redis+cluster://a:7000").unwrap(),
            RedisTarget::Cluster(vec!["redis://a:7000".to_owned()]),
            "a cluster of one seed is still a cluster"
        );
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        for (url, reason) in [
            ("", "empty"),
            ("localhost:6379", "expected redis://"),
            ("http://a:1", "expected redis://"),
            ("redis+cluster://", "names no node"),
            ("redis+cluster://a:7000,,b:7001", "empty entry"),
            ("redis://a:7000,", "empty entry"),
            ("redis://a:7000,b:7001", "expected redis://"),
            ("redis+cluster://a:7000,b:7001/3", "only database 0"),
            ("redis://a:notaport", ""),
        ] {
            let error = RedisTarget::parse(url).expect_err(url).to_string();
            assert!(error.contains(reason), "{url}: {error}");
        }
        let error = RedisTarget::parse("ftp://user:secret@a:1").unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
    }

    #[test]
    fn hash_tags_follow_redis_rules() {
        assert_eq!(hash_tag("composer:tasks:{2:ns:q:0}"), "2:ns:q:0");
        assert_eq!(hash_tag("composer:tasks:{2:ns:q:0}:p5"), "2:ns:q:0");
        assert_eq!(hash_tag("plain"), "plain");
        assert_eq!(hash_tag("a{}b"), "a{}b");
        assert_eq!(hash_tag("a{b"), "a{b");
        assert_eq!(hash_tag("a{b}{c}"), "b");
        let groups = by_slot(true, vec!["x{1}", "y{2}", "z{1}"], |k| k);
        assert_eq!(groups, vec![vec!["x{1}", "z{1}"], vec!["y{2}"]]);
        assert_eq!(by_slot(false, vec!["x{1}", "y{2}"], |k| k).len(), 1);
        assert!(by_slot(false, Vec::<&str>::new(), |k| k).is_empty());
    }
}
