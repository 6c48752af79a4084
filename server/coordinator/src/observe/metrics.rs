//! What the coordinator counts, through the `metrics` facade. Without a
//! recorder installed (`--metrics-listen` unset) every call here is a no-op
//! that costs a branch.
//!
//! Names follow Prometheus' conventions (`composer_..._total`,
//! `..._seconds`). Labels are bounded: a namespace, workflow or queue name
//! comes from tenants, so each kind keeps its first [`MAX_LABEL_VALUES`]
//! values and reports the rest as `_other`. No run or task id is a label.

use std::{
    collections::HashSet,
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, Utc};
use metrics::{counter, gauge, histogram};

/// Distinct values one label kind may take before the rest are `_other`.
pub const MAX_LABEL_VALUES: usize = 500;

/// Every metric this process may report, with its help text (for
/// `describe_all` and docs/operations.md).
pub const METRICS: &[(&str, &str)] = &[
    (RUNS_STARTED, "runs started, by namespace and workflow"),
    (
        RUNS_ENDED,
        "runs ended, by namespace, workflow and status (completed, failed, cancelled)",
    ),
    (
        TASKS_DISPATCHED,
        "task messages sent to Redis, by namespace and queue",
    ),
    (
        TASKS_LEASED,
        "tasks leased to workers, by namespace and queue",
    ),
    (
        TASKS_REPORTED,
        "task reports applied, by namespace, queue and outcome (completed, failed)",
    ),
    (
        LEASES_EXPIRED,
        "leases that expired (an attempt spent), by namespace and queue",
    ),
    (
        LEASES_RETURNED,
        "leases never confirmed by their worker, offered again without spending an attempt",
    ),
    (
        WORKERS_LOST,
        "attempts spent because their worker never confirmed receipt of a second delivery \
         (the task kills or loses its workers; it fails with WORKER_LOST), by namespace and queue",
    ),
    (
        DISPATCH_LATENCY,
        "from the commit that made a task due (or its re-offer) to its lease, by namespace and queue",
    ),
    (
        EVENT_TX_SECONDS,
        "duration of one event transaction (lock, decide, write, commit)",
    ),
    (EVENT_TX_EVENTS, "events applied in one event transaction"),
    (OUTBOX_WAITING, "outbox rows not yet sent to Redis"),
    (OUTBOX_OLDEST, "age of the oldest outbox row"),
    (TIMERS_DUE, "timers past their time and not yet fired"),
    (TIMER_LAG, "how late the most overdue timer is"),
    (
        RECOVERY_ACTIONS,
        "what the recovery loops did, by loop and action",
    ),
    (
        DB_POOL_CONNECTIONS,
        "database connections by pool and state (in_use, idle)",
    ),
    (
        SCHEDULE_FIRES,
        "schedule fires, by namespace and outcome (started, skipped, buffered, failed, missed)",
    ),
    (
        TASKS_RATE_LIMITED,
        "tasks a poll could not be handed because of a queue's rate limit, by namespace and queue \
         (a task held back at several hand-outs counts at each)",
    ),
    (
        BULK_OPERATIONS,
        "bulk operations ended, by kind (cancel, retry, pause, resume) and status",
    ),
    (
        BULK_RUNS,
        "runs a bulk operation went through, by kind and outcome (succeeded, skipped, failed)",
    ),
    (REDIS_ERRORS, "failed Redis operations, by operation"),
    (
        WATCHED_RUNS,
        "runs this server follows for its WatchRun streams (one read per change each, decision 0035)",
    ),
    (
        WATCH_READS,
        "reads of runs followed for WatchRun streams, by cause (first, announced, resubscribed, \
         fallback, more_history, retry)",
    ),
    (
        QUOTA_THROTTLED,
        "calls refused and tasks held back by a namespace quota, by namespace and quota \
         (docs/operations.md, Quotas)",
    ),
    (
        CPU_CHECKS_REFUSED,
        "requests refused because their namespace (or the server) had as many CPU-heavy \
         checks waiting as it may (--cpu-pool-queue), by namespace",
    ),
    (GRPC_REQUESTS, "gRPC requests by method and status code"),
    (
        GRPC_SECONDS,
        "gRPC request duration until the response starts, by method",
    ),
];

pub const RUNS_STARTED: &str = "composer_runs_started_total";
pub const RUNS_ENDED: &str = "composer_runs_ended_total";
pub const TASKS_DISPATCHED: &str = "composer_tasks_dispatched_total";
pub const TASKS_LEASED: &str = "composer_tasks_leased_total";
pub const TASKS_REPORTED: &str = "composer_tasks_reported_total";
pub const LEASES_EXPIRED: &str = "composer_leases_expired_total";
pub const LEASES_RETURNED: &str = "composer_leases_returned_total";
pub const WORKERS_LOST: &str = "composer_workers_lost_total";
pub const DISPATCH_LATENCY: &str = "composer_task_dispatch_latency_seconds";
pub const EVENT_TX_SECONDS: &str = "composer_event_transaction_seconds";
pub const EVENT_TX_EVENTS: &str = "composer_event_transaction_events";
pub const OUTBOX_WAITING: &str = "composer_outbox_rows";
pub const OUTBOX_OLDEST: &str = "composer_outbox_oldest_age_seconds";
pub const TIMERS_DUE: &str = "composer_timers_due";
pub const TIMER_LAG: &str = "composer_timer_lag_seconds";
pub const RECOVERY_ACTIONS: &str = "composer_recovery_actions_total";
pub const DB_POOL_CONNECTIONS: &str = "composer_db_pool_connections";
pub const SCHEDULE_FIRES: &str = "composer_schedule_fires_total";
pub const TASKS_RATE_LIMITED: &str = "composer_tasks_rate_limited_total";
pub const BULK_OPERATIONS: &str = "composer_bulk_operations_total";
pub const BULK_RUNS: &str = "composer_bulk_runs_total";
pub const REDIS_ERRORS: &str = "composer_redis_errors_total";
pub const WATCHED_RUNS: &str = "composer_watched_runs";
pub const WATCH_READS: &str = "composer_watch_reads_total";
pub const QUOTA_THROTTLED: &str = "composer_quota_throttled_total";
pub const CPU_CHECKS_REFUSED: &str = "composer_cpu_checks_refused_total";
pub const GRPC_REQUESTS: &str = "composer_grpc_requests_total";
pub const GRPC_SECONDS: &str = "composer_grpc_request_duration_seconds";

/// Set once a recorder is installed: until then nothing here builds a
/// label or takes a lock.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns counting on (after installing a recorder).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether anything is counted.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Registers the help text of every metric with the installed recorder.
pub fn describe_all() {
    for (name, help) in METRICS {
        if name.ends_with("_total") {
            metrics::describe_counter!(*name, *help);
        } else if name.ends_with("_seconds") && !name.contains("oldest") && !name.contains("lag")
            || name.ends_with("_events")
        {
            metrics::describe_histogram!(*name, *help);
        } else {
            metrics::describe_gauge!(*name, *help);
        }
    }
}

/// The `cause` labels of [`WATCH_READS`] (`events::watch` reads for these).
pub const WATCH_READ_CAUSES: [&str; 6] = [
    "first",
    "announced",
    "resubscribed",
    "fallback",
    "more_history",
    "retry",
];

/// What a label-free metric starts at, and the label sets known before
/// any traffic (the causes of a watch read): present from the first
/// scrape, so `rate()` and alerts on an absent series work on an idle
/// server. Metrics labelled by tenant appear with their first tenant.
pub fn start_at_zero() {
    counter!(LEASES_RETURNED).absolute(0);
    for cause in WATCH_READ_CAUSES {
        counter!(WATCH_READS, "cause" => cause).absolute(0);
    }
    for name in [
        WATCHED_RUNS,
        OUTBOX_WAITING,
        OUTBOX_OLDEST,
        TIMERS_DUE,
        TIMER_LAG,
    ] {
        gauge!(name).set(0.0);
    }
    // a histogram is listed once registered, with a count of zero
    let _ = histogram!(EVENT_TX_SECONDS);
    let _ = histogram!(EVENT_TX_EVENTS);
}

/// Whether a namespace, workflow or queue label carries its value (the
/// default) or [`ALL_TENANTS`] (`--metrics-tenant-labels false`).
static TENANT_LABELS: AtomicBool = AtomicBool::new(true);

/// What every namespace, workflow and queue label reads when tenant
/// labels are off: each metric then sums over all tenants.
pub const ALL_TENANTS: &str = "_all";

/// Turns the namespace, workflow and queue label values on or off (on
/// by default): `/metrics` needs no token, so a shared cluster may keep
/// its tenants' names out of it.
pub fn set_tenant_labels(on: bool) {
    TENANT_LABELS.store(on, Ordering::Relaxed);
}

/// The values seen so far of one label kind.
struct Seen(OnceLock<Mutex<HashSet<String>>>);

static NAMESPACES: Seen = Seen(OnceLock::new());
static WORKFLOWS: Seen = Seen(OnceLock::new());
static QUEUES: Seen = Seen(OnceLock::new());

impl Seen {
    /// `value` if it is one of the first [`MAX_LABEL_VALUES`], else
    /// `_other`; [`ALL_TENANTS`] when tenant labels are off.
    fn bounded(&self, value: &str) -> String {
        if !TENANT_LABELS.load(Ordering::Relaxed) {
            return ALL_TENANTS.to_owned();
        }
        let mut seen = self
            .0
            .get_or_init(|| Mutex::new(HashSet::new()))
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if seen.contains(value) {
            return value.to_owned();
        }
        if seen.len() >= MAX_LABEL_VALUES {
            return "_other".to_owned();
        }
        seen.insert(value.to_owned());
        value.to_owned()
    }
}

fn workflow_labels(namespace: &str, workflow: &str) -> [(&'static str, String); 2] {
    [
        ("namespace", NAMESPACES.bounded(namespace)),
        ("workflow", WORKFLOWS.bounded(workflow)),
    ]
}

fn queue_labels(namespace: &str, queue: &str) -> [(&'static str, String); 2] {
    [
        ("namespace", NAMESPACES.bounded(namespace)),
        ("queue", QUEUES.bounded(queue)),
    ]
}

pub(crate) fn run_started(namespace: &str, workflow: &str) {
    if !enabled() {
        return;
    }
    counter!(RUNS_STARTED, &workflow_labels(namespace, workflow)).increment(1);
}

pub(crate) fn run_ended(namespace: &str, workflow: &str, status: &str) {
    if !enabled() {
        return;
    }
    let [ns, wf] = workflow_labels(namespace, workflow);
    counter!(
        RUNS_ENDED,
        &[ns, wf, ("status", status.to_ascii_lowercase())]
    )
    .increment(1);
}

pub(crate) fn tasks_rate_limited(namespace: &str, queue: &str, count: u64) {
    if !enabled() || count == 0 {
        return;
    }
    counter!(TASKS_RATE_LIMITED, &queue_labels(namespace, queue)).increment(count);
}

pub(crate) fn tasks_dispatched(namespace: &str, queue: &str, count: u64) {
    if !enabled() {
        return;
    }
    counter!(TASKS_DISPATCHED, &queue_labels(namespace, queue)).increment(count);
}

pub(crate) fn task_leased(namespace: &str, queue: &str, dispatched_at: Option<DateTime<Utc>>) {
    if !enabled() {
        return;
    }
    let labels = queue_labels(namespace, queue);
    counter!(TASKS_LEASED, &labels).increment(1);
    if let Some(since) = dispatched_at {
        let waited = (Utc::now() - since).num_microseconds().unwrap_or(0).max(0);
        histogram!(DISPATCH_LATENCY, &labels).record(waited as f64 / 1e6);
    }
}

/// A report applied; `outcome` is `completed` or `failed`.
pub(crate) fn task_reported(namespace: &str, queue: &str, outcome: &str) {
    if !enabled() {
        return;
    }
    let [ns, q] = queue_labels(namespace, queue);
    counter!(
        TASKS_REPORTED,
        &[ns, q, ("outcome", outcome.to_ascii_lowercase())]
    )
    .increment(1);
}

/// How many runs this server follows for WatchRun streams.
pub(crate) fn watched_runs(count: usize) {
    if !enabled() {
        return;
    }
    gauge!(WATCHED_RUNS).set(count as f64);
}

/// One read of a run followed for WatchRun streams, and why.
pub(crate) fn watch_read(cause: &'static str) {
    if !enabled() {
        return;
    }
    counter!(WATCH_READS, "cause" => cause).increment(1);
}

pub(crate) fn lease_expired(namespace: &str, queue: &str) {
    if !enabled() {
        return;
    }
    counter!(LEASES_EXPIRED, &queue_labels(namespace, queue)).increment(1);
}

pub(crate) fn worker_lost(namespace: &str, queue: &str) {
    if !enabled() {
        return;
    }
    counter!(WORKERS_LOST, &queue_labels(namespace, queue)).increment(1);
}

pub(crate) fn leases_returned(count: u64) {
    if !enabled() {
        return;
    }
    counter!(LEASES_RETURNED).increment(count);
}

pub(crate) fn event_transaction(took: Duration, events: usize) {
    if !enabled() {
        return;
    }
    histogram!(EVENT_TX_SECONDS).record(took.as_secs_f64());
    histogram!(EVENT_TX_EVENTS).record(events as f64);
}

/// What a recovery loop did, e.g. (`timers`, `fired`).
pub(crate) fn recovery(loop_name: &'static str, action: &'static str, count: u64) {
    if !enabled() {
        return;
    }
    if count > 0 {
        counter!(RECOVERY_ACTIONS, "loop" => loop_name, "action" => action).increment(count);
    }
}

/// Fires of schedules by outcome: `started`, `skipped` (by the overlap
/// policy), `buffered`, `failed` (no run could start), `missed` (older than
/// the catch-up window).
pub(crate) fn schedule_fires(namespace: &str, outcome: &'static str, count: u64) {
    if !enabled() || count == 0 {
        return;
    }
    counter!(
        SCHEDULE_FIRES,
        &[
            ("namespace", NAMESPACES.bounded(namespace)),
            ("outcome", outcome.to_owned())
        ]
    )
    .increment(count);
}

/// A bulk operation that ended, by kind and final status (both from a
/// fixed set).
pub(crate) fn bulk_operation_ended(kind: &str, status: &str) {
    if !enabled() {
        return;
    }
    counter!(BULK_OPERATIONS, "kind" => kind.to_lowercase(), "status" => status.to_lowercase())
        .increment(1);
}

/// One run a bulk operation went through, by kind and outcome.
pub(crate) fn bulk_run(kind: &str, outcome: &'static str) {
    if !enabled() {
        return;
    }
    counter!(BULK_RUNS, "kind" => kind.to_lowercase(), "outcome" => outcome).increment(1);
}

/// A Redis operation that failed, e.g. `publish`, `read`, `groups`.
pub(crate) fn redis_error(operation: &'static str) {
    if !enabled() {
        return;
    }
    counter!(REDIS_ERRORS, "operation" => operation).increment(1);
}

/// Calls refused (or tasks held back) by a namespace's quota, by the
/// quota's name (`Quota::name`).
pub fn quota_throttled(namespace: &str, quota: &'static str, count: u64) {
    if !enabled() || count == 0 {
        return;
    }
    counter!(
        QUOTA_THROTTLED,
        &[
            ("namespace", NAMESPACES.bounded(namespace)),
            ("quota", quota.to_owned())
        ]
    )
    .increment(count);
}

/// A request refused by the CPU pool (decision 0036).
pub(crate) fn cpu_check_refused(namespace: &str) {
    if !enabled() {
        return;
    }
    counter!(
        CPU_CHECKS_REFUSED,
        &[("namespace", NAMESPACES.bounded(namespace))]
    )
    .increment(1);
}

/// The backlog gauges, from one look at the tables.
pub fn backlog(outbox_rows: i64, outbox_oldest: f64, timers_due: i64, timer_lag: f64) {
    if !enabled() {
        return;
    }
    gauge!(OUTBOX_WAITING).set(outbox_rows as f64);
    gauge!(OUTBOX_OLDEST).set(outbox_oldest);
    gauge!(TIMERS_DUE).set(timers_due as f64);
    gauge!(TIMER_LAG).set(timer_lag);
}

/// Connections of a pool (`requests` or `background`).
pub fn pool(name: &'static str, size: u32, idle: usize) {
    if !enabled() {
        return;
    }
    let idle = idle as f64;
    gauge!(DB_POOL_CONNECTIONS, "pool" => name, "state" => "in_use").set(f64::from(size) - idle);
    gauge!(DB_POOL_CONNECTIONS, "pool" => name, "state" => "idle").set(idle);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_past_the_bound_are_other() {
        let seen = Seen(OnceLock::new());
        for i in 0..MAX_LABEL_VALUES {
            assert_eq!(seen.bounded(&format!("q{i}")), format!("q{i}"));
        }
        assert_eq!(seen.bounded("one-more"), "_other");
        assert_eq!(
            seen.bounded("q7"),
            "q7",
            "values seen before keep their name"
        );
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        for (name, help) in METRICS {
            assert!(name.starts_with("composer_"), "{name}");
            assert!(
                name.ends_with("_total")
                    || name.ends_with("_seconds")
                    || name.ends_with("_events")
                    || name.ends_with("_rows")
                    || name.ends_with("_due")
                    || name.ends_with("_connections")
                    || name.ends_with("_runs"),
                "{name}: a unit or _total"
            );
            assert!(!help.is_empty());
        }
    }

    #[test]
    fn the_grafana_dashboard_and_operations_guide_use_only_these_names() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
        for file in ["deploy/grafana/composer.json", "docs/operations.md"] {
            let text = std::fs::read_to_string(format!("{root}{file}")).expect(file);
            let mut rest = text.as_str();
            while let Some(at) = rest.find("composer_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                rest = &rest[at + name.len().max(1)..];
                if name == "composer_" {
                    continue;
                }
                let base = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(&name);
                let known = METRICS.iter().any(|(m, _)| *m == base)
                    || base.starts_with("composer_coordinator");
                assert!(known, "{file} names {name}, which is not a metric");
            }
        }
    }
}
