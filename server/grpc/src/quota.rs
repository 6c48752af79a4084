//! Per-namespace quotas on calls (decision 0038), enforced by every server
//! for itself, in memory, before a request is decoded: a token bucket per
//! namespace and class of call (reads, writes, worker calls), and counts
//! of open WatchRun streams and waiting PollTasks calls per namespace and
//! per token. One tower layer right after authentication, where the
//! caller's namespace is known, so no service can forget it; a stream or
//! poll holds its place until its response body is dropped (the stream
//! ended or the caller went away).
//!
//! Over a quota the call is RESOURCE_EXHAUSTED with google.rpc.QuotaFailure
//! and RetryInfo (`crate::status::quota_exceeded`). The refusal is held
//! back for its retry delay (at least [`MIN_HOLD`], at most [`MAX_HOLD`],
//! and up to half again at random) before it is answered, so a client that ignores RetryInfo and calls
//! again at once costs the servers at most one refusal per call in flight
//! every 100 ms, not one per round trip. Held refusals are bounded per
//! namespace and per server; past the bound a refusal is answered at once.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use composer_coordinator::limits::quotas::{
    NamespaceQuotas, Quota, QuotaExceeded, Quotas, Rate, Subject, TokenBucket,
};
use http::{Request, Response};
use tonic::body::Body;
use tower::{Layer, Service};

use crate::{auth::Caller, held_body::holding};

/// What a call costs the servers, for the rate it is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallClass {
    /// Reads stored state and changes nothing.
    Read,
    /// Changes state, or compiles a definition (as costly as a change).
    Write,
    /// The worker protocol: polls and reports.
    Worker,
}

impl CallClass {
    fn index(self) -> usize {
        match self {
            CallClass::Read => 0,
            CallClass::Write => 1,
            CallClass::Worker => 2,
        }
    }

    fn quota(self) -> Quota {
        match self {
            CallClass::Read => Quota::Reads,
            CallClass::Write => Quota::Writes,
            CallClass::Worker => Quota::WorkerCalls,
        }
    }

    fn rate(self, quotas: &Quotas) -> Rate {
        match self {
            CallClass::Read => quotas.reads,
            CallClass::Write => quotas.writes,
            CallClass::Worker => quotas.worker_calls,
        }
    }
}

use CallClass::{Read, Worker, Write};

/// The class of every RPC of `composer.v1`: the one table (a test checks
/// that every method of every service is in it).
pub const RPC_CLASSES: &[(&str, CallClass)] = &[
    ("/composer.v1.ServerService/GetServerInfo", Read),
    ("/composer.v1.WorkflowService/RegisterWorkflow", Write),
    ("/composer.v1.WorkflowService/ValidateWorkflow", Write),
    ("/composer.v1.WorkflowService/GetWorkflow", Read),
    ("/composer.v1.WorkflowService/ListWorkflows", Read),
    ("/composer.v1.WorkflowService/ListWorkflowVersions", Read),
    ("/composer.v1.WorkflowService/ReplayRun", Read),
    ("/composer.v1.WorkflowService/CheckWorkflowVersion", Read),
    ("/composer.v1.RunService/StartRun", Write),
    ("/composer.v1.RunService/GetRun", Read),
    ("/composer.v1.RunService/ListRuns", Read),
    ("/composer.v1.RunService/CountRuns", Read),
    ("/composer.v1.RunService/CancelRun", Write),
    ("/composer.v1.RunService/RetryRun", Write),
    ("/composer.v1.RunService/PauseRun", Write),
    ("/composer.v1.RunService/ResumeRun", Write),
    ("/composer.v1.RunService/SendEvent", Write),
    ("/composer.v1.RunService/GetRunHistory", Read),
    ("/composer.v1.RunService/BulkCancelRuns", Write),
    ("/composer.v1.RunService/BulkRetryRuns", Write),
    ("/composer.v1.RunService/BulkPauseRuns", Write),
    ("/composer.v1.RunService/BulkResumeRuns", Write),
    ("/composer.v1.RunService/MigrateRuns", Write),
    ("/composer.v1.SecretService/SetSecret", Write),
    ("/composer.v1.SecretService/ListSecrets", Read),
    ("/composer.v1.SecretService/DeleteSecret", Write),
    ("/composer.v1.SecretService/RewrapSecretKeys", Write),
    ("/composer.v1.RunService/GetBulkOperation", Read),
    ("/composer.v1.RunService/ListBulkOperations", Read),
    ("/composer.v1.RunService/CancelBulkOperation", Write),
    ("/composer.v1.RunService/WatchRun", Read),
    ("/composer.v1.ScheduleService/CreateSchedule", Write),
    ("/composer.v1.ScheduleService/GetSchedule", Read),
    ("/composer.v1.ScheduleService/ListSchedules", Read),
    ("/composer.v1.ScheduleService/UpdateSchedule", Write),
    ("/composer.v1.ScheduleService/PauseSchedule", Write),
    ("/composer.v1.ScheduleService/ResumeSchedule", Write),
    ("/composer.v1.ScheduleService/DeleteSchedule", Write),
    ("/composer.v1.ScheduleService/TriggerSchedule", Write),
    ("/composer.v1.QueueService/SetQueueRateLimit", Write),
    ("/composer.v1.QueueService/GetQueueRateLimit", Read),
    ("/composer.v1.QueueService/ListQueueRateLimits", Read),
    ("/composer.v1.QueueService/DeleteQueueRateLimit", Write),
    ("/composer.v1.BlobService/UploadBlob", Write),
    ("/composer.v1.BlobService/DownloadBlob", Read),
    ("/composer.v1.BlobService/GetBlobUrl", Read),
    ("/composer.v1.BlobService/StartBlobUpload", Write),
    ("/composer.v1.BlobService/FinishBlobUpload", Write),
    ("/composer.v1.WorkerService/PollTasks", Worker),
    ("/composer.v1.WorkerService/Heartbeat", Worker),
    ("/composer.v1.WorkerService/CompleteTask", Worker),
    ("/composer.v1.WorkerService/FailTask", Worker),
];

/// The class of the call to `path`. A path not in the table (no such
/// method: it will be UNIMPLEMENTED) counts as a write, the scarcest.
pub fn class_of(path: &str) -> CallClass {
    RPC_CLASSES
        .iter()
        .find(|(rpc, _)| *rpc == path)
        .map_or(Write, |(_, class)| *class)
}

/// Calls that hold a place while they last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    WatchStream,
    LongPoll,
    BlobTransfer,
}

impl Held {
    fn of(path: &str) -> Option<Held> {
        match path {
            "/composer.v1.RunService/WatchRun" => Some(Held::WatchStream),
            "/composer.v1.WorkerService/PollTasks" => Some(Held::LongPoll),
            // a finished upload is read whole by the server
            "/composer.v1.BlobService/UploadBlob"
            | "/composer.v1.BlobService/DownloadBlob"
            | "/composer.v1.BlobService/FinishBlobUpload" => Some(Held::BlobTransfer),
            _ => None,
        }
    }

    /// The namespace's quota and limit, then the token's.
    fn limits(self, quotas: &Quotas) -> [(Quota, u32); 2] {
        match self {
            Held::WatchStream => [
                (Quota::WatchStreams, quotas.watch_streams),
                (Quota::WatchStreamsPerToken, quotas.watch_streams_per_token),
            ],
            Held::LongPoll => [
                (Quota::LongPolls, quotas.long_polls),
                (Quota::LongPollsPerToken, quotas.long_polls_per_token),
            ],
            Held::BlobTransfer => [
                (Quota::BlobTransfers, quotas.blob_transfers),
                (
                    Quota::BlobTransfersPerToken,
                    quotas.blob_transfers_per_token,
                ),
            ],
        }
    }
}

/// How soon a call refused a stream or a poll may try again: places free
/// as other streams end and polls return (at most a poll's wait).
const HELD_RETRY: Duration = Duration::from_secs(1);

/// How often idle namespaces are forgotten (their buckets full again).
const PRUNE_EVERY: Duration = Duration::from_secs(10);

/// The shortest and longest a refusal is held before it is answered.
pub const MIN_HOLD: Duration = Duration::from_millis(100);
/// See [`MIN_HOLD`].
pub const MAX_HOLD: Duration = Duration::from_secs(1);

/// Refusals held at once for one namespace, then for the whole server:
/// each costs a timer and a few hundred bytes (the request is dropped
/// before the hold).
const HELD_REFUSALS_PER_NAMESPACE: u32 = 1_000;
const HELD_REFUSALS_PER_SERVER: u32 = 10_000;

/// What one namespace uses of this server now.
#[derive(Debug, Default)]
struct NamespaceUse {
    buckets: [Option<TokenBucket>; 3],
    open: Open,
    held_refusals: u32,
}

impl NamespaceUse {
    fn is_idle(&self, now: Instant) -> bool {
        self.open.is_empty()
            && self.held_refusals == 0
            && self.buckets.iter().flatten().all(|b| b.is_full(now))
    }
}

/// Open streams and waiting polls.
#[derive(Debug, Default, Clone, Copy)]
struct Open {
    watch_streams: u32,
    long_polls: u32,
    blob_transfers: u32,
}

impl Open {
    fn of(&mut self, held: Held) -> &mut u32 {
        match held {
            Held::WatchStream => &mut self.watch_streams,
            Held::LongPoll => &mut self.long_polls,
            Held::BlobTransfer => &mut self.blob_transfers,
        }
    }

    fn count(&self, held: Held) -> u32 {
        match held {
            Held::WatchStream => self.watch_streams,
            Held::LongPoll => self.long_polls,
            Held::BlobTransfer => self.blob_transfers,
        }
    }

    fn is_empty(&self) -> bool {
        self.watch_streams == 0 && self.long_polls == 0 && self.blob_transfers == 0
    }
}

#[derive(Debug)]
struct State {
    namespaces: HashMap<String, NamespaceUse>,
    /// By [`Caller::token`]: entries leave when their last place is freed.
    tokens: HashMap<String, Open>,
    held_refusals: u32,
    pruned_at: Instant,
}

/// This server's count of what each namespace uses, against its quotas.
#[derive(Debug)]
pub struct QuotaEnforcer {
    quotas: Arc<NamespaceQuotas>,
    state: Mutex<State>,
}

impl QuotaEnforcer {
    /// An enforcer of `quotas`.
    pub fn new(quotas: Arc<NamespaceQuotas>) -> Arc<Self> {
        Arc::new(Self {
            quotas,
            state: Mutex::new(State {
                namespaces: HashMap::new(),
                tokens: HashMap::new(),
                held_refusals: 0,
                pruned_at: Instant::now(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a call of `caller` to `path`, or says which quota refuses it.
    /// A stream or a poll gets the place it holds until the slot drops.
    fn admit(
        self: &Arc<Self>,
        caller: &Caller,
        path: &str,
        now: Instant,
    ) -> Result<Option<Slot>, QuotaExceeded> {
        let quotas = self.quotas.of(&caller.namespace);
        let class = class_of(path);
        let held = Held::of(path);
        let mut state = self.lock();
        state.prune(now);
        let State {
            namespaces, tokens, ..
        } = &mut *state;
        let usage = match namespaces.get_mut(&caller.namespace) {
            Some(usage) => usage,
            None => namespaces.entry(caller.namespace.clone()).or_default(),
        };
        let rate = class.rate(&quotas);
        let bucket =
            usage.buckets[class.index()].get_or_insert_with(|| TokenBucket::full(rate, now));
        if let Err(wait) = bucket.take(rate, now) {
            return Err(refusal(class.quota(), namespace_of(caller), &quotas, wait));
        }
        let Some(held) = held else {
            return Ok(None);
        };
        let [
            (namespace_quota, namespace_limit),
            (token_quota, token_limit),
        ] = held.limits(&quotas);
        if usage.open.count(held) >= namespace_limit {
            return Err(refusal(
                namespace_quota,
                namespace_of(caller),
                &quotas,
                HELD_RETRY,
            ));
        }
        let token = tokens.get(&caller.token).copied().unwrap_or_default();
        if token.count(held) >= token_limit {
            let subject = Subject::Token(caller.token.clone());
            return Err(refusal(token_quota, subject, &quotas, HELD_RETRY));
        }
        *usage.open.of(held) += 1;
        *tokens.entry(caller.token.clone()).or_default().of(held) += 1;
        Ok(Some(Slot {
            enforcer: Arc::clone(self),
            held,
            namespace: caller.namespace.clone(),
            token: caller.token.clone(),
        }))
    }

    fn release(&self, slot: &Slot) {
        let mut state = self.lock();
        if let Some(usage) = state.namespaces.get_mut(&slot.namespace) {
            let open = usage.open.of(slot.held);
            *open = open.saturating_sub(1);
        }
        if let Some(token) = state.tokens.get_mut(&slot.token) {
            let open = token.of(slot.held);
            *open = open.saturating_sub(1);
            if token.is_empty() {
                state.tokens.remove(&slot.token);
            }
        }
    }

    /// How long to hold `refused` before answering it, with the place it
    /// holds meanwhile; `None` when the namespace or the server already
    /// holds as many refusals as it may (answer at once).
    fn hold(self: &Arc<Self>, namespace: &str, refused: &QuotaExceeded) -> Option<HeldRefusal> {
        let mut state = self.lock();
        if state.held_refusals >= HELD_REFUSALS_PER_SERVER {
            return None;
        }
        let usage = state.namespaces.get_mut(namespace)?;
        if usage.held_refusals >= HELD_REFUSALS_PER_NAMESPACE {
            return None;
        }
        usage.held_refusals += 1;
        state.held_refusals += 1;
        Some(HeldRefusal {
            enforcer: Arc::clone(self),
            namespace: namespace.to_owned(),
            duration: jittered(refused.retry_after.clamp(MIN_HOLD, MAX_HOLD)),
        })
    }

    fn release_refusal(&self, namespace: &str) {
        let mut state = self.lock();
        state.held_refusals = state.held_refusals.saturating_sub(1);
        if let Some(usage) = state.namespaces.get_mut(namespace) {
            usage.held_refusals = usage.held_refusals.saturating_sub(1);
        }
    }

    /// Refusals held now: for `namespace`, and for the whole server.
    pub fn held_refusals(&self, namespace: &str) -> (u32, u32) {
        let state = self.lock();
        let of_namespace = state
            .namespaces
            .get(namespace)
            .map_or(0, |u| u.held_refusals);
        (of_namespace, state.held_refusals)
    }

    /// Open streams and waiting polls of `namespace` on this server.
    pub fn open_of(&self, namespace: &str) -> (u32, u32) {
        self.lock()
            .namespaces
            .get(namespace)
            .map_or((0, 0), |u| (u.open.watch_streams, u.open.long_polls))
    }
}

impl State {
    /// Forgets namespaces that hold nothing and whose buckets are full
    /// again, so callers naming many namespaces cannot grow the map.
    fn prune(&mut self, now: Instant) {
        if now.saturating_duration_since(self.pruned_at) < PRUNE_EVERY {
            return;
        }
        self.pruned_at = now;
        self.namespaces.retain(|_, usage| !usage.is_idle(now));
    }
}

fn namespace_of(caller: &Caller) -> Subject {
    Subject::Namespace(caller.namespace.clone())
}

fn refusal(quota: Quota, subject: Subject, quotas: &Quotas, wait: Duration) -> QuotaExceeded {
    QuotaExceeded::new(quota, subject, quotas, wait)
}

/// The place a stream or a poll holds, freed when dropped.
#[derive(Debug)]
pub struct Slot {
    enforcer: Arc<QuotaEnforcer>,
    held: Held,
    namespace: String,
    token: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.enforcer.release(self);
    }
}

/// `hold` and up to half again, at most [`MAX_HOLD`]: the calls refused
/// together do not all come back together.
fn jittered(hold: Duration) -> Duration {
    let fraction = (uuid::Uuid::new_v4().as_u64_pair().0 >> 11) as f64 / (1u64 << 53) as f64;
    hold.mul_f64(1.0 + fraction / 2.0).min(MAX_HOLD)
}

/// A refusal's place among the held ones, freed when dropped (answered,
/// or the caller went away).
#[derive(Debug)]
struct HeldRefusal {
    enforcer: Arc<QuotaEnforcer>,
    namespace: String,
    duration: Duration,
}

impl Drop for HeldRefusal {
    fn drop(&mut self) {
        self.enforcer.release_refusal(&self.namespace);
    }
}

/// The layer; see the module's documentation.
#[derive(Clone, Debug)]
pub struct QuotaLayer {
    enforcer: Arc<QuotaEnforcer>,
}

impl QuotaLayer {
    /// Enforces with `enforcer`.
    pub fn new(enforcer: Arc<QuotaEnforcer>) -> Self {
        Self { enforcer }
    }
}

impl<S> Layer<S> for QuotaLayer {
    type Service = QuotaService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        QuotaService {
            inner,
            enforcer: Arc::clone(&self.enforcer),
        }
    }
}

/// The service [`QuotaLayer`] wraps.
#[derive(Clone, Debug)]
pub struct QuotaService<S> {
    inner: S,
    enforcer: Arc<QuotaEnforcer>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B> Service<Request<B>> for QuotaService<S>
where
    S: Service<Request<B>, Response = Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // health and reflection carry no caller and cost no quota
        let Some(caller) = request.extensions().get::<Caller>() else {
            return Box::pin(self.inner.call(request));
        };
        match self
            .enforcer
            .admit(caller, request.uri().path(), Instant::now())
        {
            Ok(None) => Box::pin(self.inner.call(request)),
            Ok(Some(slot)) => {
                let future = self.inner.call(request);
                Box::pin(async move {
                    let response = future.await?;
                    Ok(response.map(|body| holding(body, slot)))
                })
            }
            Err(refused) => {
                composer_coordinator::observe::metrics::quota_throttled(
                    &caller.namespace,
                    refused.quota.name(),
                    1,
                );
                tracing::debug!(
                    namespace = %caller.namespace,
                    quota = %refused.quota,
                    "call refused by a quota"
                );
                let response = crate::status::quota_exceeded(&refused).into_http::<Body>();
                let held = self.enforcer.hold(&caller.namespace, &refused);
                drop(request);
                Box::pin(async move {
                    if let Some(held) = held {
                        tokio::time::sleep(held.duration).await;
                    }
                    Ok(response)
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use composer_coordinator::limits::quotas::QuotaTable;
    use prost::Message;

    use super::*;

    fn rate(per_second: f64, burst: f64) -> Rate {
        Rate { per_second, burst }
    }

    #[test]
    fn a_bucket_lets_its_burst_through_then_its_rate() {
        let start = Instant::now();
        let limit = rate(10.0, 3.0);
        let mut bucket = TokenBucket::full(limit, start);
        for _ in 0..3 {
            bucket.take(limit, start).expect("the burst");
        }
        let wait = bucket.take(limit, start).expect_err("burst spent");
        assert!(
            wait.abs_diff(Duration::from_millis(100)) < Duration::from_micros(1),
            "one token every 100 ms: {wait:?}"
        );
        bucket
            .take(limit, start + Duration::from_millis(100))
            .expect("refilled one");
        bucket
            .take(limit, start + Duration::from_millis(150))
            .expect_err("half a token is not a token");
    }

    #[test]
    fn a_bucket_never_holds_more_than_its_burst() {
        let start = Instant::now();
        let limit = rate(1000.0, 2.0);
        let mut bucket = TokenBucket::full(limit, start);
        let later = start + Duration::from_secs(3600);
        bucket.take(limit, later).expect("one");
        bucket.take(limit, later).expect("two");
        bucket
            .take(limit, later)
            .expect_err("an hour idle still holds only two");
        assert!(!bucket.is_full(later));
        assert!(bucket.is_full(later + Duration::from_millis(2)));
    }

    #[test]
    fn a_lowered_quota_applies_to_a_bucket_at_its_next_take() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(rate(100.0, 100.0), start);
        let lowered = rate(1.0, 1.0);
        bucket.take(lowered, start).expect("capped to one");
        let wait = bucket.take(lowered, start).expect_err("then one a second");
        assert_eq!(wait, Duration::from_secs(1));
    }

    fn caller(namespace: &str, token: &str) -> Caller {
        Caller {
            namespace: namespace.to_owned(),
            subject: token.to_owned(),
            roles: vec![crate::auth::Role::Reader],
            queues: None,
            token: format!("{namespace}/{token}"),
        }
    }

    fn enforcer(file: &str) -> Arc<QuotaEnforcer> {
        QuotaEnforcer::new(Arc::new(NamespaceQuotas::new(
            QuotaTable::parse(file).expect("quotas"),
        )))
    }

    const START_RUN: &str = "/composer.v1.RunService/StartRun";
    const GET_RUN: &str = "/composer.v1.RunService/GetRun";
    const WATCH_RUN: &str = "/composer.v1.RunService/WatchRun";
    const POLL: &str = "/composer.v1.WorkerService/PollTasks";

    #[test]
    fn each_namespace_and_class_has_a_bucket_of_its_own() {
        let quotas = enforcer("namespaces:\n  a:\n    writes_per_second: 2\n");
        let now = Instant::now();
        let a = caller("a", "t");
        quotas.admit(&a, START_RUN, now).expect("1");
        quotas.admit(&a, START_RUN, now).expect("2");
        let refused = quotas.admit(&a, START_RUN, now).expect_err("3");
        assert_eq!(refused.quota, Quota::Writes);
        assert_eq!(refused.subject, Subject::Namespace("a".to_owned()));
        assert_eq!(refused.retry_after, Duration::from_millis(500));
        quotas
            .admit(&a, GET_RUN, now)
            .expect("reads are another bucket");
        quotas
            .admit(&caller("b", "t"), START_RUN, now)
            .expect("another namespace is untouched");
    }

    #[test]
    fn streams_are_limited_per_namespace_and_per_token_and_come_back_when_dropped() {
        let quotas =
            enforcer("namespaces:\n  a:\n    watch_streams: 3\n    watch_streams_per_token: 2\n");
        let now = Instant::now();
        let first = caller("a", "first");
        let one = quotas.admit(&first, WATCH_RUN, now).expect("one");
        let two = quotas.admit(&first, WATCH_RUN, now).expect("two");
        let refused = quotas
            .admit(&first, WATCH_RUN, now)
            .expect_err("the token's third");
        assert_eq!(refused.quota, Quota::WatchStreamsPerToken);
        assert_eq!(refused.subject, Subject::Token("a/first".to_owned()));
        let second = caller("a", "second");
        let three = quotas
            .admit(&second, WATCH_RUN, now)
            .expect("another token");
        let refused = quotas
            .admit(&second, WATCH_RUN, now)
            .expect_err("the namespace's fourth");
        assert_eq!(refused.quota, Quota::WatchStreams);
        quotas
            .admit(&caller("b", "first"), WATCH_RUN, now)
            .expect("another namespace");
        quotas
            .admit(&first, POLL, now)
            .expect("polls are counted apart");
        assert_eq!(
            quotas.open_of("a"),
            (3, 0),
            "the dropped poll freed its place"
        );
        drop((one, two, three));
        assert_eq!(quotas.open_of("a"), (0, 0));
        quotas
            .admit(&first, WATCH_RUN, now)
            .expect("places come back");
        assert!(quotas.lock().tokens.len() <= 1, "idle tokens are forgotten");
    }

    #[test]
    fn refusals_are_held_for_their_retry_delay_up_to_a_bound_per_namespace() {
        let quotas = enforcer(
            "namespaces:\n  a:\n    writes_per_second: 1\n    writes_burst: 1\n  b:\n    writes_per_second: 1000\n    writes_burst: 1\n",
        );
        let now = Instant::now();
        let a = caller("a", "t");
        quotas.admit(&a, START_RUN, now).expect("the burst");
        let refused = quotas.admit(&a, START_RUN, now).expect_err("then refused");
        let mut held = Vec::new();
        for _ in 0..HELD_REFUSALS_PER_NAMESPACE {
            let hold = quotas.hold("a", &refused).expect("held");
            assert_eq!(
                hold.duration, MAX_HOLD,
                "a's retry delay, 1 s, is the longest"
            );
            held.push(hold);
        }
        assert!(
            quotas.hold("a", &refused).is_none(),
            "past the bound: answered at once"
        );
        let b = caller("b", "t");
        quotas.admit(&b, START_RUN, now).expect("the burst");
        let refused_b = quotas.admit(&b, START_RUN, now).expect_err("then refused");
        let hold = quotas
            .hold("b", &refused_b)
            .expect("b has places of its own");
        assert!(
            (MIN_HOLD..=MIN_HOLD * 3 / 2).contains(&hold.duration),
            "a 1 ms retry delay is held 100 to 150 ms: {:?}",
            hold.duration
        );
        assert_eq!(
            quotas.held_refusals("b"),
            (1, HELD_REFUSALS_PER_NAMESPACE + 1)
        );
        drop(held);
        assert_eq!(
            quotas.held_refusals("a"),
            (0, 1),
            "answered refusals free their place"
        );
    }

    #[test]
    fn idle_namespaces_are_forgotten() {
        let quotas = enforcer("");
        let now = Instant::now();
        for i in 0..100 {
            quotas
                .admit(&caller(&format!("n{i}"), "t"), GET_RUN, now)
                .expect("admitted");
        }
        let later = now + PRUNE_EVERY + Duration::from_secs(1);
        quotas
            .admit(&caller("last", "t"), GET_RUN, later)
            .expect("admitted");
        assert_eq!(quotas.lock().namespaces.len(), 1);
    }

    /// `/package.Service/Method` of every method of `composer.v1`.
    fn api_methods() -> HashSet<String> {
        let set = prost_types::FileDescriptorSet::decode(composer_proto::FILE_DESCRIPTOR_SET)
            .expect("descriptors");
        let mut methods = HashSet::new();
        for file in set.file.iter().filter(|f| f.package() == "composer.v1") {
            for service in &file.service {
                for method in &service.method {
                    methods.insert(format!(
                        "/{}.{}/{}",
                        file.package(),
                        service.name(),
                        method.name()
                    ));
                }
            }
        }
        methods
    }

    #[test]
    fn every_method_of_every_service_is_classified_once() {
        let methods = api_methods();
        assert!(methods.len() >= 40, "{methods:?}");
        let classified: Vec<&str> = RPC_CLASSES.iter().map(|(path, _)| *path).collect();
        let unique: HashSet<&str> = classified.iter().copied().collect();
        assert_eq!(unique.len(), classified.len(), "a method classified twice");
        for method in &methods {
            assert!(
                unique.contains(method.as_str()),
                "{method} has no class in RPC_CLASSES"
            );
        }
        for path in unique {
            assert!(methods.contains(path), "{path} is not a method of the API");
        }
    }

    #[test]
    fn worker_calls_are_the_worker_service_and_nothing_else() {
        for (path, class) in RPC_CLASSES {
            assert_eq!(
                *class == Worker,
                path.starts_with("/composer.v1.WorkerService/"),
                "{path}"
            );
        }
    }
}
