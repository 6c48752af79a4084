//! Per-namespace quotas (decision 0038): how much of a server and of the
//! shared stores one namespace may use, so no tenant's load slows another.
//!
//! The limits are built-in defaults, optionally overridden by a YAML file
//! (`--quotas-file`) of defaults and per-namespace values that the server
//! reads again while it runs. Rates and concurrent calls are counted by
//! each server in memory (`composer-grpc`'s `quota` module); what a
//! namespace holds (schedules, queue rate limits, concurrency keys,
//! rate-limit keys) is counted where it is created.

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    path::Path,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use serde::Deserialize;

/// The error code a node fails with when what it needs is over a quota
/// (a child run's new concurrency key): retried as its policy says.
pub const QUOTA_EXCEEDED: &str = "QUOTA_EXCEEDED";

/// Every quota, by the name the file and the errors use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quota {
    /// Read calls per second, per server.
    Reads,
    /// Calls that change state (or compile a definition) per second, per server.
    Writes,
    /// WorkerService calls per second, per server.
    WorkerCalls,
    /// WatchRun streams open at once, per server.
    WatchStreams,
    /// WatchRun streams one token holds open at once, per server.
    WatchStreamsPerToken,
    /// PollTasks calls waiting at once, per server.
    LongPolls,
    /// PollTasks calls one token has waiting at once, per server.
    LongPollsPerToken,
    /// Blob uploads and downloads open at once, per server (each holds up
    /// to a few MiB of the server's memory while it lasts).
    BlobTransfers,
    /// Blob uploads and downloads one token has open at once, per server.
    BlobTransfersPerToken,
    /// Schedules the namespace holds.
    Schedules,
    /// Queue rate limits the namespace holds.
    QueueRateLimits,
    /// Run concurrency key values in use in the namespace.
    ConcurrencyKeys,
    /// Live per-key rate-limit buckets of one queue.
    RateLimitKeysPerQueue,
    /// Tasks armed per second, per server: what a namespace's runs add to
    /// the shared stores, whatever the number of calls that armed them.
    Tasks,
}

impl Quota {
    /// Every quota.
    pub const ALL: [Quota; 14] = [
        Quota::Reads,
        Quota::Writes,
        Quota::WorkerCalls,
        Quota::WatchStreams,
        Quota::WatchStreamsPerToken,
        Quota::LongPolls,
        Quota::LongPollsPerToken,
        Quota::BlobTransfers,
        Quota::BlobTransfersPerToken,
        Quota::Schedules,
        Quota::QueueRateLimits,
        Quota::ConcurrencyKeys,
        Quota::RateLimitKeysPerQueue,
        Quota::Tasks,
    ];

    /// The quota's name: its key in the file (a rate's `_per_second` key).
    pub fn name(self) -> &'static str {
        match self {
            Quota::Reads => "reads_per_second",
            Quota::Writes => "writes_per_second",
            Quota::WorkerCalls => "worker_calls_per_second",
            Quota::WatchStreams => "watch_streams",
            Quota::WatchStreamsPerToken => "watch_streams_per_token",
            Quota::LongPolls => "long_polls",
            Quota::LongPollsPerToken => "long_polls_per_token",
            Quota::BlobTransfers => "blob_transfers",
            Quota::BlobTransfersPerToken => "blob_transfers_per_token",
            Quota::Schedules => "schedules",
            Quota::QueueRateLimits => "queue_rate_limits",
            Quota::ConcurrencyKeys => "concurrency_keys",
            Quota::RateLimitKeysPerQueue => "rate_limit_keys_per_queue",
            Quota::Tasks => "tasks_per_second",
        }
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A token bucket's settings: refilled at `per_second`, holding at most
/// `burst` calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Calls per second, sustained.
    pub per_second: f64,
    /// Calls that may arrive at once after a quiet spell.
    pub burst: f64,
}

impl Rate {
    const fn new(per_second: f64, burst: f64) -> Self {
        Self { per_second, burst }
    }
}

/// One namespace's quotas.
#[derive(Debug, Clone, PartialEq)]
pub struct Quotas {
    /// Read calls, per server.
    pub reads: Rate,
    /// Writing calls, per server.
    pub writes: Rate,
    /// Worker calls, per server.
    pub worker_calls: Rate,
    /// Open WatchRun streams, per server.
    pub watch_streams: u32,
    /// Open WatchRun streams of one token, per server.
    pub watch_streams_per_token: u32,
    /// Waiting PollTasks calls, per server.
    pub long_polls: u32,
    /// Waiting PollTasks calls of one token, per server.
    pub long_polls_per_token: u32,
    /// Open blob uploads and downloads, per server.
    pub blob_transfers: u32,
    /// Open blob uploads and downloads of one token, per server.
    pub blob_transfers_per_token: u32,
    /// Schedules held.
    pub schedules: u32,
    /// Queue rate limits held.
    pub queue_rate_limits: u32,
    /// Run concurrency key values in use.
    pub concurrency_keys: u32,
    /// Live per-key rate-limit buckets of one queue.
    pub rate_limit_keys_per_queue: u32,
    /// Tasks armed, per server.
    pub tasks: Rate,
}

impl Default for Quotas {
    /// Generous enough for one namespace running thousands of tasks a
    /// second on one server (benchmark B1); a shared cluster sets its own.
    fn default() -> Self {
        Self {
            reads: Rate::new(10_000.0, 20_000.0),
            writes: Rate::new(10_000.0, 20_000.0),
            worker_calls: Rate::new(50_000.0, 100_000.0),
            watch_streams: 10_000,
            watch_streams_per_token: 2_500,
            long_polls: 10_000,
            long_polls_per_token: 5_000,
            // a transfer of a blob under 5 MiB holds its size, a larger one
            // up to 15 MiB: enough for one namespace's B1 at 100 KB
            blob_transfers: 256,
            blob_transfers_per_token: 256,
            schedules: 10_000,
            queue_rate_limits: 1_000,
            concurrency_keys: 10_000,
            rate_limit_keys_per_queue: 10_000,
            tasks: Rate::new(50_000.0, 100_000.0),
        }
    }
}

impl Quotas {
    /// What `quota` allows, in words, for a refusal.
    pub fn describe(&self, quota: Quota) -> String {
        let rate = |what: &str, rate: Rate| {
            format!(
                "at most {} {what} calls per second (burst {}) on each server",
                rate.per_second, rate.burst
            )
        };
        match quota {
            Quota::Reads => rate("read", self.reads),
            Quota::Writes => rate("writing", self.writes),
            Quota::WorkerCalls => rate("worker", self.worker_calls),
            Quota::WatchStreams => format!(
                "at most {} open WatchRun streams on each server",
                self.watch_streams
            ),
            Quota::WatchStreamsPerToken => format!(
                "at most {} open WatchRun streams per token on each server",
                self.watch_streams_per_token
            ),
            Quota::LongPolls => format!(
                "at most {} waiting PollTasks calls on each server",
                self.long_polls
            ),
            Quota::LongPollsPerToken => format!(
                "at most {} waiting PollTasks calls per token on each server",
                self.long_polls_per_token
            ),
            Quota::BlobTransfers => format!(
                "at most {} blob uploads and downloads open on each server",
                self.blob_transfers
            ),
            Quota::BlobTransfersPerToken => format!(
                "at most {} blob uploads and downloads open per token on each server",
                self.blob_transfers_per_token
            ),
            Quota::Schedules => format!("at most {} schedules", self.schedules),
            Quota::QueueRateLimits => {
                format!("at most {} queue rate limits", self.queue_rate_limits)
            }
            Quota::ConcurrencyKeys => format!(
                "at most {} concurrency key values in use",
                self.concurrency_keys
            ),
            Quota::RateLimitKeysPerQueue => format!(
                "at most {} rate-limit keys in use per queue",
                self.rate_limit_keys_per_queue
            ),
            Quota::Tasks => format!(
                "at most {} tasks armed per second (burst {}) on each server; \
                 StartRun waits while more were armed",
                self.tasks.per_second, self.tasks.burst
            ),
        }
    }
}

/// Who a quota was counted for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A namespace.
    Namespace(String),
    /// A token (`jti:<id>`, or `<namespace>/<subject>` without a `jti`).
    Token(String),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Namespace(namespace) => write!(f, "namespace:{namespace}"),
            Subject::Token(token) => write!(f, "token:{token}"),
        }
    }
}

/// A call or an action refused because it would go over a quota.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("quota {quota} exceeded for {subject}: {description}")]
pub struct QuotaExceeded {
    /// The quota.
    pub quota: Quota,
    /// Who it was counted for.
    pub subject: Subject,
    /// What the quota allows, in words.
    pub description: String,
    /// When trying again may succeed.
    pub retry_after: Duration,
}

impl QuotaExceeded {
    /// A refusal of `quota` for `subject` under `quotas`.
    pub fn new(quota: Quota, subject: Subject, quotas: &Quotas, retry_after: Duration) -> Self {
        Self {
            quota,
            subject,
            description: quotas.describe(quota),
            retry_after,
        }
    }

    /// [`QuotaExceeded::new`], counted in the namespace's throttled metric.
    pub fn counted(quota: Quota, subject: Subject, quotas: &Quotas, retry_after: Duration) -> Self {
        if let Subject::Namespace(namespace) = &subject {
            crate::observe::metrics::quota_throttled(namespace, quota.name(), 1);
        }
        Self::new(quota, subject, quotas, retry_after)
    }
}

/// The quotas of every namespace: the defaults and the namespaces that
/// override some of them.
#[derive(Debug, Clone, Default)]
pub struct QuotaTable {
    defaults: Arc<Quotas>,
    namespaces: HashMap<String, Arc<Quotas>>,
}

impl QuotaTable {
    /// The quotas of `namespace`.
    pub fn of(&self, namespace: &str) -> &Arc<Quotas> {
        self.namespaces.get(namespace).unwrap_or(&self.defaults)
    }

    /// How many namespaces have quotas of their own.
    pub fn overridden(&self) -> usize {
        self.namespaces.len()
    }

    /// Reads a quotas file.
    pub fn load(path: &Path) -> Result<Self, QuotaFileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| QuotaFileError::Read(path.display().to_string(), e.to_string()))?;
        Self::parse(&text)
    }

    /// Parses a quotas file: `defaults` and `namespaces.<name>`, each a map
    /// of quota names to values. A namespace takes what it does not set
    /// from `defaults`, which takes what it does not set from the built-in
    /// defaults; a rate set without its burst gets a burst of one second.
    pub fn parse(text: &str) -> Result<Self, QuotaFileError> {
        let file: QuotaFile = if text.trim().is_empty() {
            QuotaFile::default()
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| QuotaFileError::Parse(e.to_string()))?
        };
        let defaults = file.defaults.apply(Quotas::default(), "defaults")?;
        let mut namespaces = HashMap::with_capacity(file.namespaces.len());
        for (namespace, overrides) in file.namespaces {
            composer_engine::names::check_name(&namespace).map_err(|problem| {
                QuotaFileError::Invalid(format!("namespaces.{namespace}: the name {problem}"))
            })?;
            let quotas = overrides.apply(defaults.clone(), &format!("namespaces.{namespace}"))?;
            namespaces.insert(namespace, Arc::new(quotas));
        }
        Ok(Self {
            defaults: Arc::new(defaults),
            namespaces,
        })
    }
}

/// Why a quotas file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaFileError {
    /// The file could not be read.
    #[error("{0}: {1}")]
    Read(String, String),
    /// The file is not YAML of the expected shape.
    #[error("{0}")]
    Parse(String),
    /// A value is out of range or a namespace name is invalid.
    #[error("{0}")]
    Invalid(String),
}

/// The smallest and largest rate a file may set, calls per second.
pub const RATE_RANGE: (f64, f64) = (0.01, 10_000_000.0);
/// The largest burst a file may set.
pub const MAX_BURST: f64 = 100_000_000.0;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaFile {
    #[serde(default)]
    defaults: Overrides,
    #[serde(default)]
    namespaces: BTreeMap<String, Overrides>,
}

/// The quotas one section of the file sets.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Overrides {
    reads_per_second: Option<f64>,
    reads_burst: Option<f64>,
    writes_per_second: Option<f64>,
    writes_burst: Option<f64>,
    worker_calls_per_second: Option<f64>,
    worker_calls_burst: Option<f64>,
    tasks_per_second: Option<f64>,
    tasks_burst: Option<f64>,
    watch_streams: Option<u32>,
    watch_streams_per_token: Option<u32>,
    long_polls: Option<u32>,
    long_polls_per_token: Option<u32>,
    blob_transfers: Option<u32>,
    blob_transfers_per_token: Option<u32>,
    schedules: Option<u32>,
    queue_rate_limits: Option<u32>,
    concurrency_keys: Option<u32>,
    rate_limit_keys_per_queue: Option<u32>,
}

impl Overrides {
    fn apply(&self, mut quotas: Quotas, section: &str) -> Result<Quotas, QuotaFileError> {
        let rates = [
            (
                "reads",
                self.reads_per_second,
                self.reads_burst,
                &mut quotas.reads,
            ),
            (
                "writes",
                self.writes_per_second,
                self.writes_burst,
                &mut quotas.writes,
            ),
            (
                "worker_calls",
                self.worker_calls_per_second,
                self.worker_calls_burst,
                &mut quotas.worker_calls,
            ),
            (
                "tasks",
                self.tasks_per_second,
                self.tasks_burst,
                &mut quotas.tasks,
            ),
        ];
        for (name, per_second, burst, rate) in rates {
            set_rate(rate, per_second, burst)
                .map_err(|problem| QuotaFileError::Invalid(format!("{section}.{name}{problem}")))?;
        }
        let counts = [
            (self.watch_streams, &mut quotas.watch_streams),
            (
                self.watch_streams_per_token,
                &mut quotas.watch_streams_per_token,
            ),
            (self.long_polls, &mut quotas.long_polls),
            (self.long_polls_per_token, &mut quotas.long_polls_per_token),
            (self.blob_transfers, &mut quotas.blob_transfers),
            (
                self.blob_transfers_per_token,
                &mut quotas.blob_transfers_per_token,
            ),
            (self.schedules, &mut quotas.schedules),
            (self.queue_rate_limits, &mut quotas.queue_rate_limits),
            (self.concurrency_keys, &mut quotas.concurrency_keys),
            (
                self.rate_limit_keys_per_queue,
                &mut quotas.rate_limit_keys_per_queue,
            ),
        ];
        for (value, count) in counts {
            if let Some(value) = value {
                *count = value;
            }
        }
        Ok(quotas)
    }
}

/// Sets a rate from a section; the problem text follows the rate's name.
fn set_rate(rate: &mut Rate, per_second: Option<f64>, burst: Option<f64>) -> Result<(), String> {
    if let Some(per_second) = per_second {
        let (least, most) = RATE_RANGE;
        if !(least..=most).contains(&per_second) {
            return Err(format!(
                "_per_second: {per_second} is not from {least} to {most}"
            ));
        }
        rate.per_second = per_second;
        // one second of calls, and at least one call, unless set
        rate.burst = per_second.ceil().max(1.0);
    }
    if let Some(burst) = burst {
        if !(1.0..=MAX_BURST).contains(&burst) {
            return Err(format!("_burst: {burst} is not from 1 to {MAX_BURST}"));
        }
        rate.burst = burst;
    }
    Ok(())
}

/// A token bucket: `burst` calls at once, refilled at `per_second`. The
/// rate is given at each take, so a reloaded quota applies at once.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    updated: Instant,
    rate: Rate,
}

impl TokenBucket {
    /// A full bucket.
    pub fn full(rate: Rate, now: Instant) -> Self {
        Self {
            tokens: rate.burst,
            updated: now,
            rate,
        }
    }

    /// Takes one call's token, or says how long until there is one.
    pub fn take(&mut self, rate: Rate, now: Instant) -> Result<(), Duration> {
        self.refill(rate, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(self.time_to(1.0))
    }

    /// Spends `amount` tokens that were used already: the bucket may go
    /// into debt, repaid at its rate.
    pub fn spend(&mut self, rate: Rate, now: Instant, amount: f64) {
        self.refill(rate, now);
        self.tokens -= amount;
    }

    /// Gives back `amount` tokens reserved earlier, up to a full bucket.
    pub fn refund(&mut self, rate: Rate, now: Instant, amount: f64) {
        self.refill(rate, now);
        self.tokens = (self.tokens + amount).min(rate.burst);
    }

    /// None while the bucket holds `need` tokens; short of them, how long
    /// until it does.
    pub fn shortfall(&mut self, rate: Rate, now: Instant, need: f64) -> Option<Duration> {
        self.refill(rate, now);
        (self.tokens < need).then(|| self.time_to(need))
    }

    /// True when the bucket would be full at `now`: forgetting it then
    /// loses nothing (a new one starts full).
    pub fn is_full(&self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens + elapsed * self.rate.per_second >= self.rate.burst
    }

    fn time_to(&self, tokens: f64) -> Duration {
        let missing = tokens - self.tokens;
        Duration::from_secs_f64(missing / self.rate.per_second).max(Duration::from_millis(1))
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_second).min(rate.burst);
        self.updated = now;
        self.rate = rate;
    }
}

/// Namespaces whose buckets this many are forgotten once full again.
const TASK_BUCKETS_KEPT: usize = 1_000;

/// The tasks each namespace armed on this server, against its
/// `tasks_per_second` quota. Tasks are counted once armed (a MAP's
/// thousand items are a thousand, whatever call armed them), so the
/// bucket may go into debt; while it is, the namespace's StartRuns are
/// refused, which bounds the work it adds to what it is allowed.
///
/// An admitted StartRun reserves the tasks it is expected to arm until it
/// ends: concurrent starts of a wide MAP are then admitted one after the
/// other as the debt is repaid, not all at the moment it is, so a
/// namespace at its quota adds its work evenly and never several large
/// transactions at once.
#[derive(Debug, Default)]
pub struct TaskRates {
    buckets: Mutex<HashMap<String, TokenBucket>>,
}

impl TaskRates {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TokenBucket>> {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a StartRun of `namespace` expected to arm `expected` tasks
    /// once its bucket holds them (a full bucket will do for more than it
    /// can hold; none expected: once it is out of debt). They stay
    /// reserved until the returned reservation is dropped.
    pub fn admit(
        self: &Arc<Self>,
        namespace: &str,
        quotas: &Quotas,
        expected: u64,
        now: Instant,
    ) -> Result<TaskReservation, QuotaExceeded> {
        let mut buckets = self.lock();
        let bucket = match buckets.get_mut(namespace) {
            Some(bucket) => bucket,
            None if expected == 0 => return Ok(TaskReservation::none()),
            None => Self::bucket(&mut buckets, namespace, quotas, now),
        };
        let need = (expected as f64).min(quotas.tasks.burst);
        if let Some(wait) = bucket.shortfall(quotas.tasks, now, need) {
            return Err(QuotaExceeded::counted(
                Quota::Tasks,
                Subject::Namespace(namespace.to_owned()),
                quotas,
                wait,
            ));
        }
        if expected == 0 {
            return Ok(TaskReservation::none());
        }
        let amount = expected as f64;
        bucket.spend(quotas.tasks, now, amount);
        Ok(TaskReservation(Some(Reserved {
            rates: Arc::clone(self),
            namespace: namespace.to_owned(),
            rate: quotas.tasks,
            amount,
        })))
    }

    /// Counts `count` tasks armed for `namespace`.
    pub fn spend(&self, namespace: &str, quotas: &Quotas, count: usize, now: Instant) {
        let mut buckets = self.lock();
        Self::bucket(&mut buckets, namespace, quotas, now).spend(quotas.tasks, now, count as f64);
    }

    /// The namespace's bucket, a full one if it has none; full ones are
    /// forgotten first when too many are kept.
    fn bucket<'b>(
        buckets: &'b mut HashMap<String, TokenBucket>,
        namespace: &str,
        quotas: &Quotas,
        now: Instant,
    ) -> &'b mut TokenBucket {
        if buckets.len() >= TASK_BUCKETS_KEPT && !buckets.contains_key(namespace) {
            buckets.retain(|_, bucket| !bucket.is_full(now));
        }
        buckets
            .entry(namespace.to_owned())
            .or_insert_with(|| TokenBucket::full(quotas.tasks, now))
    }

    fn refund(&self, namespace: &str, rate: Rate, amount: f64) {
        if let Some(bucket) = self.lock().get_mut(namespace) {
            bucket.refund(rate, Instant::now(), amount);
        }
    }
}

/// Tasks an admitted StartRun reserved in its namespace's bucket, given
/// back when it is dropped: by then the tasks it armed were counted.
#[derive(Debug)]
#[must_use = "the reservation is given back when dropped"]
pub struct TaskReservation(Option<Reserved>);

/// What a reservation holds (none when nothing was expected).
#[derive(Debug)]
struct Reserved {
    rates: Arc<TaskRates>,
    namespace: String,
    rate: Rate,
    amount: f64,
}

impl TaskReservation {
    fn none() -> Self {
        Self(None)
    }
}

impl Drop for TaskReservation {
    fn drop(&mut self) {
        if let Some(reserved) = self.0.take() {
            reserved
                .rates
                .refund(&reserved.namespace, reserved.rate, reserved.amount);
        }
    }
}

/// The quota table of a running server, replaced whole when the file is
/// read again; readers take the current one without waiting for a reload.
#[derive(Debug, Default)]
pub struct NamespaceQuotas {
    table: RwLock<Arc<QuotaTable>>,
}

impl NamespaceQuotas {
    /// Quotas from `table`.
    pub fn new(table: QuotaTable) -> Self {
        Self {
            table: RwLock::new(Arc::new(table)),
        }
    }

    /// The quotas of `namespace` now.
    pub fn of(&self, namespace: &str) -> Arc<Quotas> {
        Arc::clone(self.table().of(namespace))
    }

    /// The table now.
    pub fn table(&self) -> Arc<QuotaTable> {
        Arc::clone(&self.table.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Replaces the table (a reload of the file).
    pub fn replace(&self, table: QuotaTable) {
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_is_the_built_in_defaults() {
        let table = QuotaTable::parse("").expect("empty");
        assert_eq!(**table.of("anything"), Quotas::default());
        assert_eq!(table.overridden(), 0);
    }

    #[test]
    fn a_namespace_takes_what_it_does_not_set_from_the_file_defaults() {
        let table = QuotaTable::parse(
            "defaults:\n  schedules: 50\n  reads_per_second: 300\nnamespaces:\n  shop:\n    \
             writes_per_second: 20\n    watch_streams: 3\n",
        )
        .expect("file");
        let shop = table.of("shop");
        assert_eq!(shop.schedules, 50, "from the file's defaults");
        assert_eq!(shop.reads, Rate::new(300.0, 300.0));
        assert_eq!(
            shop.writes,
            Rate::new(20.0, 20.0),
            "a rate without a burst has a burst of one second"
        );
        assert_eq!(shop.watch_streams, 3);
        assert_eq!(
            shop.long_polls,
            Quotas::default().long_polls,
            "built in, set nowhere"
        );
        let other = table.of("other");
        assert_eq!(other.schedules, 50);
        assert_eq!(other.writes, Quotas::default().writes);
    }

    #[test]
    fn a_burst_may_be_set_apart_from_its_rate() {
        let table = QuotaTable::parse(
            "namespaces:\n  a:\n    writes_per_second: 0.5\n    writes_burst: 5\n  b:\n    \
             reads_burst: 7\n",
        )
        .expect("file");
        assert_eq!(table.of("a").writes, Rate::new(0.5, 5.0));
        assert_eq!(
            table.of("b").reads,
            Rate::new(Quotas::default().reads.per_second, 7.0)
        );
    }

    #[test]
    fn a_typo_an_out_of_range_value_or_a_bad_name_is_refused_with_its_place() {
        let typo = QuotaTable::parse("defaults:\n  schedule: 5\n").expect_err("typo");
        assert!(typo.to_string().contains("schedule"), "{typo}");
        let zero = QuotaTable::parse("namespaces:\n  a:\n    reads_per_second: 0\n")
            .expect_err("zero rate");
        assert!(
            zero.to_string().contains("namespaces.a.reads_per_second"),
            "{zero}"
        );
        let burst =
            QuotaTable::parse("defaults:\n  writes_burst: 0.5\n").expect_err("burst under one");
        assert!(
            burst.to_string().contains("defaults.writes_burst"),
            "{burst}"
        );
        let name = QuotaTable::parse("namespaces:\n  'a b':\n    schedules: 1\n")
            .expect_err("bad namespace");
        assert!(name.to_string().contains("namespaces.a b"), "{name}");
        let negative =
            QuotaTable::parse("defaults:\n  long_polls: -1\n").expect_err("negative count");
        assert!(negative.to_string().contains("long_polls"), "{negative}");
    }

    #[test]
    fn a_refusal_names_the_quota_the_subject_and_the_limit() {
        let quotas = Quotas {
            watch_streams_per_token: 4,
            ..Quotas::default()
        };
        let refusal = QuotaExceeded::new(
            Quota::WatchStreamsPerToken,
            Subject::Token("shop/ci".to_owned()),
            &quotas,
            Duration::from_secs(1),
        );
        assert_eq!(
            refusal.to_string(),
            "quota watch_streams_per_token exceeded for token:shop/ci: at most 4 open WatchRun \
             streams per token on each server"
        );
    }

    #[test]
    fn every_quota_has_a_distinct_name_and_a_description() {
        let quotas = Quotas::default();
        let names: std::collections::HashSet<_> = Quota::ALL.iter().map(|q| q.name()).collect();
        assert_eq!(names.len(), Quota::ALL.len());
        for quota in Quota::ALL {
            assert!(quotas.describe(quota).starts_with("at most"), "{quota}");
        }
    }

    #[test]
    fn tasks_armed_past_the_rate_refuse_starts_until_the_debt_is_repaid() {
        let quotas = Quotas {
            tasks: Rate::new(1_000.0, 1_000.0),
            ..Quotas::default()
        };
        let rates = Arc::new(TaskRates::default());
        let now = Instant::now();
        drop(
            rates
                .admit("shop", &quotas, 0, now)
                .expect("nothing armed yet"),
        );
        rates.spend("shop", &quotas, 1_000, now);
        drop(
            rates
                .admit("shop", &quotas, 0, now)
                .expect("the burst spent, not overspent"),
        );
        rates.spend("shop", &quotas, 1_500, now);
        let refused = rates.admit("shop", &quotas, 0, now).expect_err("in debt");
        assert_eq!(refused.quota, Quota::Tasks);
        assert_eq!(refused.subject, Subject::Namespace("shop".to_owned()));
        assert!(
            refused.retry_after.abs_diff(Duration::from_millis(1_500)) < Duration::from_millis(1),
            "1,500 tasks over at 1,000 a second: {:?}",
            refused.retry_after
        );
        drop(
            rates
                .admit("other", &quotas, 0, now)
                .expect("another namespace is untouched"),
        );
        drop(
            rates
                .admit("shop", &quotas, 0, now + Duration::from_millis(1_500))
                .expect("repaid"),
        );
    }

    #[test]
    fn a_start_waits_until_its_bucket_holds_what_it_is_expected_to_arm() {
        let quotas = Quotas {
            tasks: Rate::new(1_000.0, 2_000.0),
            ..Quotas::default()
        };
        let rates = Arc::new(TaskRates::default());
        let now = Instant::now();
        let first = rates
            .admit("shop", &quotas, 800, now)
            .expect("a full bucket");
        let second = rates
            .admit("shop", &quotas, 800, now)
            .expect("1,200 tokens left");
        let refused = rates
            .admit("shop", &quotas, 800, now)
            .expect_err("400 left: the third waits, though not in debt");
        assert!(
            refused.retry_after.abs_diff(Duration::from_millis(400)) < Duration::from_millis(1),
            "400 tasks short at 1,000 a second: {:?}",
            refused.retry_after
        );
        drop(
            rates
                .admit("shop", &quotas, 5_000, now + Duration::from_millis(1_600))
                .expect("more than a bucket holds: a full bucket will do"),
        );
        drop((first, second));
    }

    #[test]
    fn a_dropped_reservation_gives_back_what_it_took_and_the_spent_tasks_stay_spent() {
        let quotas = Quotas {
            tasks: Rate::new(1_000.0, 1_000.0),
            ..Quotas::default()
        };
        let rates = Arc::new(TaskRates::default());
        let now = Instant::now();
        let reserved = rates
            .admit("shop", &quotas, 600, now)
            .expect("a full bucket");
        rates
            .admit("shop", &quotas, 600, now)
            .expect_err("600 reserved: 400 left");
        // the start armed 300: counted, then its reservation given back
        rates.spend("shop", &quotas, 300, now);
        drop(reserved);
        drop(
            rates
                .admit("shop", &quotas, 600, now)
                .expect("700 left: the reservation went back"),
        );
        rates
            .admit("shop", &quotas, 800, now)
            .expect_err("the 300 armed stay spent");
    }

    #[test]
    fn a_replaced_table_is_what_readers_see_next() {
        let quotas = NamespaceQuotas::default();
        assert_eq!(quotas.of("shop").schedules, 10_000);
        quotas
            .replace(QuotaTable::parse("namespaces:\n  shop:\n    schedules: 2\n").expect("file"));
        assert_eq!(quotas.of("shop").schedules, 2);
        assert_eq!(quotas.of("other").schedules, 10_000);
    }
}
