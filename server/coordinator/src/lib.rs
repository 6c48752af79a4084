//! The coordinator: applies each event in one Postgres transaction (lock →
//! decide → persist → commit) and moves dispatch through Redis Streams.
//!
//! - [`events`]: every change to a run, each in one transaction (alone or in
//!   a group commit), and the feed that announces it.
//! - [`dispatch`]: getting armed tasks to workers (Redis Streams, the poll
//!   hub, direct hand-off, queue rate limits).
//! - [`time`]: the loops the clock drives (schedules, recovery).
//! - [`http`]: the server's own HTTP work (the executor and its worker).
//! - [`observe`]: metrics and traces.
//! - [`limits`]: namespace quotas and the CPU pool.
//! - [`workflows`]: registered workflows and the compiled-definition cache.
//! - [`error`]: what the coordinator refuses, and why.
//!
//! [`Coordinator`] is what they share: each module adds its methods to it.

pub mod dispatch;
pub mod error;
pub mod events;
pub mod http;
pub mod limits;
pub mod observe;
pub mod payloads;
pub mod secrets;
pub mod time;
pub mod versions;
pub mod workflows;

use std::sync::Arc;

pub use composer_engine::names;
use composer_store::Store;
pub use dispatch::{broker::Broker, redis_conn::BrokerError};
pub use error::{CoordinatorError, FieldProblem};
pub use events::{
    apply::{SYSTEM, correlation_text},
    group::{GroupCommitStats, MAX_GROUP_ITEMS, MAX_GROUPS_IN_FLIGHT},
    reports::{HeartbeatAnswer, Reporter, TaskReport},
    runs::{EventTarget, RunView, SendEventResult, StartRun},
};
use limits::{cpu_pool, quotas};
use workflows::WorkflowCache;

/// The backends every server needs: Postgres (the truth) and Redis (dispatch).
#[derive(Debug, Clone)]
pub struct Backends {
    /// Postgres.
    pub store: Store,
    /// Redis.
    pub broker: Broker,
}

/// Why a readiness check failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadinessError {
    /// Postgres did not answer.
    #[error("postgres: {0}")]
    Postgres(#[from] composer_store::StoreError),
    /// Redis did not answer.
    #[error("redis: {0}")]
    Redis(#[from] BrokerError),
}

impl Backends {
    /// Checks that Postgres and Redis both answer now.
    pub async fn check_ready(&self) -> Result<(), ReadinessError> {
        self.store.ping().await?;
        self.broker.ping().await?;
        Ok(())
    }
}

/// Limits and tunables of the coordinator.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Largest input, output or event payload, in bytes of JSON, inline or
    /// in the blob store.
    pub max_payload_bytes: usize,
    /// A value whose JSON is longer goes to the blob store (0: none does).
    pub payload_offload_bytes: usize,
    /// The most of a blob an expression reads.
    pub max_expression_blob_bytes: u64,
    /// How long an event sent to a correlation key waits for a run.
    pub correlation_retention_secs: f64,
    /// Most runs one root run's tree may hold (the root included).
    pub max_runs_per_tree: i32,
    /// How long a group of StartRuns and reports gathers while another is
    /// being applied (decision 0023); zero: every one alone.
    pub group_commit_window: std::time::Duration,
    /// Most StartRuns and runs' report batches in one group transaction
    /// (1 to [`MAX_GROUP_ITEMS`]; 1: every one alone).
    pub group_commit_max: usize,
    /// Group transactions this server applies at once (1 to
    /// [`MAX_GROUPS_IN_FLIGHT`]).
    pub group_commit_in_flight: usize,
    /// Each namespace's quotas (decision 0038), shared with the gRPC layer
    /// and replaced when the quotas file is read again.
    pub quotas: Arc<quotas::NamespaceQuotas>,
    /// The pool the CPU-heavy checks of requests run on (decision 0036).
    pub cpu_pool: cpu_pool::CpuPoolConfig,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            max_payload_bytes: 2 * 1024 * 1024,
            payload_offload_bytes: 64 * 1024,
            max_expression_blob_bytes: 16 * 1024 * 1024,
            correlation_retention_secs: 24.0 * 3600.0,
            max_runs_per_tree: 100_000,
            group_commit_window: std::time::Duration::from_millis(1),
            group_commit_max: MAX_GROUP_ITEMS,
            group_commit_in_flight: 4,
            quotas: Arc::default(),
            cpu_pool: cpu_pool::CpuPoolConfig::default(),
        }
    }
}

/// Applies events to runs. Cheap to clone; holds no run state of its own.
#[derive(Clone)]
pub struct Coordinator {
    store: Store,
    workflows: Arc<WorkflowCache>,
    config: CoordinatorConfig,
    publisher: Option<Arc<dispatch::streams::Publisher>>,
    changes: Option<events::watch::ChangeFeed>,
    lease_hints: Arc<events::reports::LeaseHints>,
    report_queues: Arc<events::reports::ReportQueues>,
    group_commit: Arc<events::group::GroupCommit>,
    /// The tasks each namespace armed here, against its quota.
    task_rates: Arc<quotas::TaskRates>,
    /// Wakes this server's bulk loop when a bulk operation is created here.
    bulk_wake: Arc<tokio::sync::Notify>,
    /// The polls waiting in this server, which tasks armed here may go to
    /// directly (decision 0034); None: every task goes through Redis.
    polls: Option<Arc<dispatch::poll_hub::PollHub>>,
    /// The secret store's keys (none given: secrets refused).
    secret_keys: Arc<secrets::SecretKeys>,
    /// Where large payloads go (none: they stay inline).
    payloads: Option<Arc<payloads::Payloads>>,
}

impl Coordinator {
    /// A coordinator over `store`.
    pub fn new(store: Store, config: CoordinatorConfig) -> Self {
        let group_commit = Arc::new(events::group::GroupCommit::new(
            config.group_commit_window,
            config.group_commit_max,
            config.group_commit_in_flight,
        ));
        Self {
            store,
            workflows: Arc::new(WorkflowCache::new(
                config.max_payload_bytes,
                cpu_pool::CpuPool::new(config.cpu_pool),
            )),
            config,
            publisher: None,
            changes: None,
            lease_hints: Arc::default(),
            report_queues: Arc::default(),
            group_commit,
            task_rates: Arc::default(),
            bulk_wake: Arc::default(),
            polls: None,
            secret_keys: Arc::default(),
            payloads: None,
        }
    }

    /// Seals and opens secrets with `ring`'s keys (decision 0044).
    pub fn with_secret_keys(mut self, ring: secrets::KeyRing) -> Self {
        self.secret_keys = secrets::SecretKeys::new(ring);
        self
    }

    pub(crate) fn secret_keys(&self) -> &secrets::SecretKeys {
        &self.secret_keys
    }

    /// The same coordinator (caches, publisher, queues) over another pool:
    /// the server runs its recovery loops on a pool of their own, so a flood
    /// of requests cannot keep due timers and expired leases waiting for a
    /// connection.
    pub fn on_store(&self, store: Store) -> Self {
        Self {
            store,
            ..self.clone()
        }
    }

    /// Announces every run change it commits on `feed` (for WatchRun).
    pub fn with_changes(mut self, feed: events::watch::ChangeFeed) -> Self {
        self.changes = Some(feed);
        self
    }

    /// Announces, after its commit, that a run changed.
    pub(crate) fn run_changed(&self, run_id: uuid::Uuid) {
        if run_id.is_nil() {
            return;
        }
        if let Some(changes) = &self.changes {
            changes.changed(run_id);
        }
    }

    /// Leases the tasks reports arm to the polls waiting in `polls`, when
    /// one waits on their queue, in the reports' own transaction (decision
    /// 0034), instead of sending them through Redis.
    pub fn with_hand_off(mut self, polls: Arc<dispatch::poll_hub::PollHub>) -> Self {
        self.polls = Some(polls);
        self
    }

    /// Publishes the tasks this coordinator arms itself, right after each
    /// commit, instead of leaving them to the outbox enqueuer's next pass.
    pub fn with_publisher(mut self, publisher: Arc<dispatch::streams::Publisher>) -> Self {
        self.publisher = Some(publisher);
        self
    }

    /// Sends freshly committed outbox messages to Redis (the fast path); a
    /// message it cannot send stays in the outbox for the enqueuer.
    pub(crate) async fn publish(&self, messages: Vec<composer_store::tasks::OutboxMessage>) {
        self.count_armed(&messages);
        if let Some(publisher) = &self.publisher
            && !messages.is_empty()
        {
            publisher.publish(messages).await;
        }
    }

    /// Counts committed tasks against their namespaces' task rates.
    fn count_armed(&self, messages: &[composer_store::tasks::OutboxMessage]) {
        let now = std::time::Instant::now();
        let mut rest = messages;
        while let Some(first) = rest.first() {
            // a transaction's tasks are one namespace's, so this is one pass
            let same = rest
                .iter()
                .take_while(|m| m.namespace == first.namespace)
                .count();
            let quotas = self.config.quotas.of(&first.namespace);
            self.task_rates.spend(&first.namespace, &quotas, same, now);
            rest = &rest[same..];
        }
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Each namespace's quotas.
    pub fn quotas(&self) -> &Arc<quotas::NamespaceQuotas> {
        &self.config.quotas
    }

    /// The compiled-workflow cache.
    pub fn workflows(&self) -> &WorkflowCache {
        &self.workflows
    }

    /// How many group transactions this server began, and their items.
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        self.group_commit.stats()
    }

    /// The configuration.
    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    fn check_payload(
        &self,
        field: &str,
        value: &serde_json::Value,
    ) -> Result<(), CoordinatorError> {
        let size = composer_engine::json_text::len(value);
        if size > self.config.max_payload_bytes {
            return Err(CoordinatorError::PayloadTooLarge {
                field: field.to_owned(),
                size,
                limit: self.config.max_payload_bytes,
            });
        }
        Ok(())
    }
}
