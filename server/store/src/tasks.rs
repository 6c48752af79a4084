//! Tasks, their leases, and the outbox that dispatches them.
//!
//! Fencing: every change of a leased task says `WHERE id = $1 AND attempt =
//! $2 AND lease_token = $3`; zero rows means the lease is not the caller's.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde_json::Value as Json;
use sqlx::{PgConnection, PgExecutor, PgPool, Row, postgres::PgRow};
use uuid::Uuid;

use crate::StoreError;

/// Whose tasks a caller may touch: one namespace, and in it either every
/// queue that is not the server's own (`queues: None`) or the listed ones.
/// Every statement a worker's call runs is filtered by it, so a lease
/// token or task id learnt by any means reaches nothing outside it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskScope {
    /// The caller's namespace.
    pub namespace: String,
    /// The queues it may touch; `None`: any queue not starting with `_`.
    pub queues: Option<Vec<String>>,
}

impl TaskScope {
    /// True when a task of `namespace` on `queue` is inside the scope.
    pub fn covers(&self, namespace: &str, queue: &str) -> bool {
        namespace == self.namespace
            && match &self.queues {
                None => !queue.starts_with('_'),
                Some(queues) => queues.iter().any(|q| q == queue),
            }
    }
}

/// The SQL condition of [`TaskScope::covers`] over a `tasks` row, with the
/// namespace as `$ns` and the queue list (NULL: any public queue) as `$qs`.
pub(crate) fn scope_condition(ns: u8, qs: u8) -> String {
    format!(
        "namespace = ${ns} AND CASE WHEN ${qs}::text[] IS NULL THEN left(queue, 1) <> '_' \
         ELSE queue = ANY(${qs}::text[]) END"
    )
}

/// Task statuses as stored.
pub mod status {
    /// Armed, an outbox row written, waiting for a worker to lease it.
    pub const DISPATCHED: &str = "DISPATCHED";
    /// A worker holds the lease.
    pub const LEASED: &str = "LEASED";
    /// The attempt completed.
    pub const COMPLETED: &str = "COMPLETED";
    /// The attempt failed.
    pub const FAILED: &str = "FAILED";
    /// The lease expired before a report.
    pub const EXPIRED: &str = "EXPIRED";
    /// The run was cancelled (or the node no longer needs the task).
    pub const CANCELLED: &str = "CANCELLED";
    /// Armed while its run is paused: no outbox row, not leasable; resume
    /// makes it DISPATCHED.
    pub const HELD: &str = "HELD";
    /// Armed with a concurrency key whose slots are all taken: no outbox
    /// row, not leasable; the transaction that frees a slot of the key
    /// makes the oldest such task DISPATCHED (HELD if its run is paused).
    pub const WAITING_SLOT: &str = "WAITING_SLOT";
}

/// The concurrency slot a task's attempt asks for: at most `max` tasks of
/// (namespace, workflow, `node`) per `key` value hold one at a time.
#[derive(Debug, Clone, Copy)]
pub struct TaskSlotArm<'a> {
    /// The TASK node's id.
    pub node: &'a str,
    /// The key's value.
    pub key: &'a str,
    /// The node's `max`.
    pub max: i32,
}

/// A task attempt to arm: inserted, or the existing row of the same
/// `(run_id, node_key)` re-armed for the new attempt.
#[derive(Debug, Clone)]
pub struct TaskArm<'a> {
    /// The id to use if the task is new.
    pub new_id: Uuid,
    /// Namespace.
    pub namespace: &'a str,
    /// Run.
    pub run_id: Uuid,
    /// Node key.
    pub node_key: &'a str,
    /// Workflow.
    pub workflow_name: &'a str,
    /// Version.
    pub workflow_version: i32,
    /// Queue.
    pub queue: &'a str,
    /// Task name.
    pub task_name: &'a str,
    /// Attempt, from 1.
    pub attempt: i32,
    /// Rendered input.
    pub input: &'a Json,
    /// Lease length.
    pub heartbeat_timeout_ms: i64,
    /// Attempt timeout.
    pub attempt_timeout_ms: Option<i64>,
    /// The W3C traceparent of the span that armed it, if traces are on.
    pub traceparent: Option<&'a str>,
    /// The value of the node's `rate_limit_key`, if any.
    pub rate_limit_key: Option<&'a str>,
    /// The node's concurrency slot, if it has a `concurrency` key.
    pub concurrency: Option<TaskSlotArm<'a>>,
    /// Leased as it is armed, to a poll waiting in the committing server
    /// (the direct hand-off, decision 0051): one row write instead of an
    /// insert and a lease. Only a shared group write honours it, and only
    /// for a task without a slot whose run is not paused; elsewhere the
    /// task is armed DISPATCHED.
    pub lease_to: Option<ArmLease<'a>>,
}

/// The lease an armed task is written with: as [`lease_tasks`] would
/// lease it to `owner`.
#[derive(Debug, Clone, Copy)]
pub struct ArmLease<'a> {
    /// The poll's worker, recorded as the lease owner.
    pub owner: &'a str,
    /// The lease's first length when the worker confirms receipt.
    pub receipt_ms: Option<i64>,
}

/// Arms a task for an attempt and writes its outbox row, in one statement.
/// Returns the outbox message (the task id is stable across attempts), so
/// the committing server can publish it at once. `held` (the run is
/// paused): the task is HELD, with no outbox row, and None is returned.
/// A task with a concurrency slot that finds its key full is made
/// WAITING_SLOT by the `tasks_take_slot` trigger (migration 0013), and
/// gets no outbox row either.
pub async fn arm_task(
    conn: &mut PgConnection,
    task: &TaskArm<'_>,
    held: bool,
) -> Result<Option<OutboxMessage>, StoreError> {
    // arm_task: upsert the task as DISPATCHED for this attempt (clearing any
    // lease) and enqueue it; the task id survives re-arming
    let row = sqlx::query(
        "WITH armed AS ( \
           INSERT INTO tasks (id, namespace, run_id, node_key, workflow_name, workflow_version, \
             queue, task_name, status, attempt, input, heartbeat_timeout_ms, attempt_timeout_ms, \
             dispatched_at, traceparent, priority, rate_limit_key, concurrency_node, \
             concurrency_key, concurrency_max) \
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, \
             CASE WHEN $13 THEN 'HELD' ELSE 'DISPATCHED' END, $9, $10, $11, $12, now(), $14, \
             (SELECT priority FROM runs WHERE id = $3), $15, $16, $17, $18) \
           ON CONFLICT (run_id, node_key) DO UPDATE SET queue = EXCLUDED.queue, \
             task_name = EXCLUDED.task_name, status = EXCLUDED.status, attempt = EXCLUDED.attempt, \
             input = EXCLUDED.input, heartbeat_timeout_ms = EXCLUDED.heartbeat_timeout_ms, \
             attempt_timeout_ms = EXCLUDED.attempt_timeout_ms, lease_token = NULL, \
             lease_owner = NULL, lease_expires_at = NULL, attempt_deadline = NULL, \
             outcome = NULL, handbacks = 0, dispatched_at = now(), updated_at = now(), \
             traceparent = EXCLUDED.traceparent, priority = EXCLUDED.priority, \
             rate_limit_key = EXCLUDED.rate_limit_key, \
             concurrency_node = EXCLUDED.concurrency_node, \
             concurrency_key = EXCLUDED.concurrency_key, \
             concurrency_max = EXCLUDED.concurrency_max, \
             concurrency_seq = EXCLUDED.concurrency_seq \
           RETURNING id, namespace, queue, attempt, run_id, priority, status), \
         queued AS ( \
           INSERT INTO outbox (namespace, queue, task_id, attempt, shard_key, priority) \
           SELECT namespace, queue, id, attempt, run_id, priority FROM armed \
           WHERE status = 'DISPATCHED' \
           RETURNING *) \
         SELECT id AS outbox_id, namespace, queue, task_id, attempt, shard_key, priority \
         FROM queued",
    )
    .bind(task.new_id)
    .bind(task.namespace)
    .bind(task.run_id)
    .bind(task.node_key)
    .bind(task.workflow_name)
    .bind(task.workflow_version)
    .bind(task.queue)
    .bind(task.task_name)
    .bind(task.attempt)
    .bind(task.input)
    .bind(task.heartbeat_timeout_ms)
    .bind(task.attempt_timeout_ms)
    .bind(held)
    .bind(task.traceparent)
    .bind(task.rate_limit_key)
    .bind(task.concurrency.map(|c| c.node))
    .bind(task.concurrency.map(|c| c.key))
    .bind(task.concurrency.map(|c| c.max))
    .fetch_optional(conn)
    .await?;
    Ok(row.as_ref().map(outbox_from_row).transpose()?)
}

pub(crate) fn outbox_from_row(row: &PgRow) -> Result<OutboxMessage, sqlx::Error> {
    Ok(OutboxMessage {
        outbox_id: row.try_get("outbox_id")?,
        namespace: row.try_get("namespace")?,
        queue: row.try_get("queue")?,
        task_id: row.try_get("task_id")?,
        attempt: row.try_get("attempt")?,
        shard_key: row.try_get("shard_key")?,
        priority: row.try_get("priority")?,
    })
}

/// Cancels the live tasks of one node (and of its MAP elements).
pub async fn cancel_node_tasks(
    conn: &mut PgConnection,
    run_id: Uuid,
    node_key: &str,
) -> Result<u64, StoreError> {
    // cancel_node_tasks: DISPATCHED, HELD, LEASED or WAITING_SLOT tasks of
    // the node or its elements
    Ok(sqlx::query(
        "UPDATE tasks SET status = 'CANCELLED', updated_at = now() \
         WHERE run_id = $1 AND (node_key = $2 OR node_key LIKE $2 || '[%') \
           AND status IN ('DISPATCHED', 'LEASED', 'HELD', 'WAITING_SLOT')",
    )
    .bind(run_id)
    .bind(node_key)
    .execute(conn)
    .await?
    .rows_affected())
}

/// Cancels every live task of a run.
pub async fn cancel_all_tasks(conn: &mut PgConnection, run_id: Uuid) -> Result<u64, StoreError> {
    // cancel_all_tasks: DISPATCHED, HELD, LEASED or WAITING_SLOT tasks of the run
    Ok(sqlx::query(
        "UPDATE tasks SET status = 'CANCELLED', updated_at = now() \
         WHERE run_id = $1 AND status IN ('DISPATCHED', 'LEASED', 'HELD', 'WAITING_SLOT')",
    )
    .bind(run_id)
    .execute(conn)
    .await?
    .rows_affected())
}

/// A task handed to a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct LeasedTask {
    /// Task id.
    pub id: Uuid,
    /// Namespace.
    pub namespace: String,
    /// Run.
    pub run_id: Uuid,
    /// Node key.
    pub node_key: String,
    /// Workflow.
    pub workflow_name: String,
    /// Version.
    pub workflow_version: i32,
    /// Queue.
    pub queue: String,
    /// Task name.
    pub task_name: String,
    /// Attempt.
    pub attempt: i32,
    /// Input.
    pub input: Json,
    /// Fencing token.
    pub lease_token: Uuid,
    /// Lease deadline.
    pub lease_expires_at: DateTime<Utc>,
    /// Lease length.
    pub heartbeat_timeout_ms: i64,
    /// Attempt deadline.
    pub attempt_deadline: Option<DateTime<Utc>>,
    /// When it was made due (or offered again): the start of its wait.
    pub dispatched_at: Option<DateTime<Utc>>,
    /// The W3C traceparent its lease span hangs under (the lease span's own
    /// once the poll hub has opened it); None unless traces are on.
    pub traceparent: Option<String>,
}

pub(crate) fn leased_from_row(row: &PgRow) -> Result<LeasedTask, sqlx::Error> {
    Ok(LeasedTask {
        id: row.try_get("id")?,
        namespace: row.try_get("namespace")?,
        run_id: row.try_get("run_id")?,
        node_key: row.try_get("node_key")?,
        workflow_name: row.try_get("workflow_name")?,
        workflow_version: row.try_get("workflow_version")?,
        queue: row.try_get("queue")?,
        task_name: row.try_get("task_name")?,
        attempt: row.try_get("attempt")?,
        input: row.try_get("input")?,
        lease_token: row.try_get("lease_token")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        heartbeat_timeout_ms: row.try_get("heartbeat_timeout_ms")?,
        attempt_deadline: row.try_get("attempt_deadline")?,
        dispatched_at: row.try_get("dispatched_at")?,
        traceparent: row.try_get("traceparent")?,
    })
}

/// Candidates up to which a lease joins them by a filter: at most this
/// many squared comparisons.
const FEW_CANDIDATES: usize = 32;

/// A few candidates: the primary key finds them (`id = ANY` keeps the plan
/// on an index whatever the statistics say, even of an empty table), and
/// the cached plan joins them to their attempts by a filter, which costs
/// candidates² comparisons. The status test sits in COALESCE, as in
/// [`LEASE_BY_PROBE`], so that the primary key is the only index the plan
/// can read: a generic plan made while the statistics still counted a few
/// thousand tasks read `tasks_dispatched_by_queue` instead, every task
/// dispatched to the queue for each lease (9,000 rows, 2.3 ms, in a MAP of
/// 100,000 at 10,000 in flight; decision 0055).
const LEASE_BY_KEYS: &str = "t.id = ANY($1::uuid[]) AND t.id = c.id AND t.attempt = c.attempt \
     AND COALESCE(t.status = 'DISPATCHED', false)";

/// Many candidates: one primary-key probe each, in a plan made for this
/// list. The filter join of [`LEASE_BY_KEYS`] compared a million pairs for
/// a poll of 1,000 (181 ms, decision 0029), and a cached plan of this form
/// made while `tasks` was empty scanned the whole table per lease. The
/// status test sits in COALESCE so that the plan cannot read
/// `tasks_dispatched_by_queue`, whose bitmap scans visit every task dispatched since
/// the last vacuum.
const LEASE_BY_PROBE: &str = "t.id = c.id AND t.attempt = c.attempt \
     AND COALESCE(t.status = 'DISPATCHED', false)";

/// Makes the statement's own transaction commit without waiting for its
/// WAL flush (decision 0033): a lease is on the path from a report to the
/// next task, and a lease lost in a Postgres crash is recovery's ordinary
/// case. Its token was random and never stored, so every call of the
/// worker that holds it is refused, and the task, still DISPATCHED, is
/// sent again after `--lost-dispatch-grace`. Any later synchronous commit
/// (the report of the lease) flushes the lease's WAL with its own. As a
/// one-time filter it is set before the first row is updated.
const COMMIT_WITHOUT_FLUSH: &str = "(SELECT set_config('synchronous_commit', 'off', true)) = 'off'";

/// The lease statement with its candidate condition: [`LEASE_BY_KEYS`] or
/// [`LEASE_BY_PROBE`]; `commit_condition` is [`COMMIT_WITHOUT_FLUSH`] for a
/// lease in a transaction of its own, `true` for one inside an event's.
fn lease_statement(candidate_condition: &str, commit_condition: &str) -> String {
    format!(
        "UPDATE tasks t SET status = 'LEASED', lease_token = gen_random_uuid(), \
           lease_owner = $3, \
           lease_expires_at = now() + make_interval(secs => \
             LEAST(t.heartbeat_timeout_ms, COALESCE($6, t.heartbeat_timeout_ms)) / 1000.0), \
           lease_confirmed = CASE WHEN $6::bigint IS NULL THEN NULL ELSE false END, \
           attempt_deadline = CASE WHEN t.attempt_timeout_ms IS NULL THEN NULL \
             ELSE now() + make_interval(secs => t.attempt_timeout_ms / 1000.0) END, \
           updated_at = now() \
         FROM UNNEST($1::uuid[], $2::int[]) AS c(id, attempt) \
         WHERE {candidate_condition} AND t.namespace = $4 AND t.queue = $5 \
           AND {commit_condition} \
         RETURNING t.id, t.namespace, t.run_id, t.node_key, t.workflow_name, t.workflow_version, \
           t.queue, t.task_name, t.attempt, t.input, t.lease_token, t.lease_expires_at, \
           t.heartbeat_timeout_ms, t.attempt_deadline, t.dispatched_at, t.traceparent"
    )
}

/// A statement over candidates in its two forms, each built once (a poll
/// runs it on the hot path).
struct CandidateStatement {
    few: LazyLock<String>,
    many: LazyLock<String>,
}

impl CandidateStatement {
    /// The form for `count` candidates, and whether it is kept prepared:
    /// many candidates are planned for their list each time (see
    /// [`LEASE_BY_PROBE`]).
    fn for_count(&self, count: usize) -> (&str, bool) {
        if count > FEW_CANDIDATES {
            (&self.many, false)
        } else {
            (&self.few, true)
        }
    }
}

static LEASE: CandidateStatement = CandidateStatement {
    few: LazyLock::new(|| lease_statement(LEASE_BY_KEYS, COMMIT_WITHOUT_FLUSH)),
    many: LazyLock::new(|| lease_statement(LEASE_BY_PROBE, COMMIT_WITHOUT_FLUSH)),
};

/// The lease inside an event's transaction: that commit keeps its flush.
static LEASE_IN_EVENT: CandidateStatement = CandidateStatement {
    few: LazyLock::new(|| lease_statement(LEASE_BY_KEYS, "true")),
    many: LazyLock::new(|| lease_statement(LEASE_BY_PROBE, "true")),
};

/// Leases the given `(task_id, attempt)` pairs to `owner`, each only if it
/// is still DISPATCHED at that attempt (a duplicate or stale message loses
/// here) and belongs to `namespace` and `queue` (what a stream message says
/// is never trusted), in one statement. Returns what was leased. Its
/// transaction commits without a flush (decision 0033): run it
/// on a pool, or in a transaction that writes nothing else.
pub async fn lease_tasks(
    executor: impl PgExecutor<'_>,
    candidates: &[(Uuid, i32)],
    owner: &str,
    namespace: &str,
    queue: &str,
    receipt: Option<std::time::Duration>,
) -> Result<Vec<LeasedTask>, StoreError> {
    lease_with(
        &LEASE, executor, candidates, owner, namespace, queue, receipt,
    )
    .await
}

/// [`lease_tasks`] inside the transaction of the event that armed the
/// tasks, which then commits with its flush as every event does: the
/// direct hand-off to a poll waiting in this server (decision 0034).
pub async fn lease_armed_tasks(
    conn: &mut PgConnection,
    candidates: &[(Uuid, i32)],
    owner: &str,
    namespace: &str,
    queue: &str,
    receipt: Option<std::time::Duration>,
) -> Result<Vec<LeasedTask>, StoreError> {
    lease_with(
        &LEASE_IN_EVENT,
        conn,
        candidates,
        owner,
        namespace,
        queue,
        receipt,
    )
    .await
}

/// The lease statement as a poll of `candidates` tasks runs it: what the
/// plan tests explain.
pub fn lease_sql(candidates: usize) -> &'static str {
    LEASE.for_count(candidates).0
}

async fn lease_with(
    statement: &CandidateStatement,
    executor: impl PgExecutor<'_>,
    candidates: &[(Uuid, i32)],
    owner: &str,
    namespace: &str,
    queue: &str,
    receipt: Option<std::time::Duration>,
) -> Result<Vec<LeasedTask>, StoreError> {
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    // a worker that confirms receipt holds the lease for the receipt time
    // (or less) until its first heartbeat
    let receipt_ms = receipt.map(|r| i64::try_from(r.as_millis()).unwrap_or(i64::MAX));
    let (ids, attempts): (Vec<Uuid>, Vec<i32>) = candidates.iter().copied().unzip();
    // lease_tasks: conditional DISPATCHED -> LEASED with a fresh fencing token
    let (sql, prepared) = statement.for_count(candidates.len());
    let rows = sqlx::query(sql)
        .persistent(prepared)
        .bind(&ids)
        .bind(&attempts)
        .bind(owner)
        .bind(namespace)
        .bind(queue)
        .bind(receipt_ms)
        .fetch_all(executor)
        .await?;
    rows.iter()
        .map(leased_from_row)
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// The statement of [`dispatched_with_keys`] with its candidate condition,
/// chosen as the lease's is.
fn dispatched_statement(candidate_condition: &str) -> String {
    format!(
        "SELECT t.id, t.attempt, t.rate_limit_key \
         FROM tasks t, UNNEST($1::uuid[], $2::int[]) AS c(id, attempt) \
         WHERE {candidate_condition} AND t.namespace = $3 AND t.queue = $4"
    )
}

static DISPATCHED: CandidateStatement = CandidateStatement {
    few: LazyLock::new(|| dispatched_statement(LEASE_BY_KEYS)),
    many: LazyLock::new(|| dispatched_statement(LEASE_BY_PROBE)),
};

/// Of the given `(task_id, attempt)` pairs, those still DISPATCHED at that
/// attempt in `namespace` and `queue`, each with its rate-limit key: what a
/// rate-limited queue's hand-out takes tokens for, so a stale or duplicate
/// message costs no token.
pub async fn dispatched_with_keys(
    pool: &PgPool,
    candidates: &[(Uuid, i32)],
    namespace: &str,
    queue: &str,
) -> Result<Vec<(Uuid, i32, Option<String>)>, StoreError> {
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, attempts): (Vec<Uuid>, Vec<i32>) = candidates.iter().copied().unzip();
    // dispatched_with_keys: the lease's two candidate forms, unleased
    let (sql, prepared) = DISPATCHED.for_count(candidates.len());
    let rows: Vec<(Uuid, i32, Option<String>)> = sqlx::query_as(sql)
        .persistent(prepared)
        .bind(&ids)
        .bind(&attempts)
        .bind(namespace)
        .bind(queue)
        .fetch_all(pool)
        .await?;
    Ok(rows)
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// The lease now runs until this time.
    Extended(DateTime<Utc>),
    /// The lease is the caller's but the task was cancelled; why, when its
    /// run was cancelled with a reason.
    Cancelled(Option<String>),
    /// The lease is not the caller's (expired, reassigned, unknown).
    Lost,
}

/// Extends a lease by its length: one small update of a non-indexed column
/// (a HOT update), fenced by `(id, attempt, lease_token)`.
pub async fn heartbeat(
    pool: &PgPool,
    scope: &TaskScope,
    task_id: Uuid,
    attempt: i32,
    lease_token: Uuid,
) -> Result<HeartbeatOutcome, StoreError> {
    // heartbeat: extend the caller's lease, and only the caller's
    let extended: Option<DateTime<Utc>> = sqlx::query_scalar(&format!(
        "UPDATE tasks SET lease_expires_at = now() + make_interval(secs => heartbeat_timeout_ms / 1000.0), \
           lease_confirmed = CASE WHEN lease_confirmed IS NULL THEN NULL ELSE true END \
         WHERE id = $1 AND attempt = $2 AND lease_token = $3 AND status = 'LEASED' AND {} \
         RETURNING lease_expires_at",
        scope_condition(4, 5)
    ))
    .bind(task_id)
    .bind(attempt)
    .bind(lease_token)
    .bind(&scope.namespace)
    .bind(scope.queues.as_deref())
    .fetch_optional(pool)
    .await?;
    if let Some(until) = extended {
        return Ok(HeartbeatOutcome::Extended(until));
    }
    // heartbeat_refused: was the caller's lease cancelled rather than lost,
    // and if its run was cancelled, why?
    let cancelled: Option<(bool, Option<String>)> = sqlx::query_as(&format!(
        "SELECT status = 'CANCELLED', \
           (SELECT r.error->>'message' FROM runs r \
             WHERE r.id = tasks.run_id AND r.status = 'CANCELLED') \
         FROM tasks \
         WHERE id = $1 AND attempt = $2 AND lease_token = $3 AND {}",
        scope_condition(4, 5)
    ))
    .bind(task_id)
    .bind(attempt)
    .bind(lease_token)
    .bind(&scope.namespace)
    .bind(scope.queues.as_deref())
    .fetch_optional(pool)
    .await?;
    Ok(match cancelled {
        Some((true, reason)) => HeartbeatOutcome::Cancelled(reason),
        _ => HeartbeatOutcome::Lost,
    })
}

/// Which run and node a task belongs to (no lock: the caller then locks the
/// run and re-checks the task under that lock).
pub async fn task_owner(
    pool: &PgPool,
    scope: &TaskScope,
    task_id: Uuid,
) -> Result<Option<(Uuid, String)>, StoreError> {
    // task_owner: primary key lookup, inside the caller's scope
    let row = sqlx::query(&format!(
        "SELECT run_id, node_key FROM tasks WHERE id = $1 AND {}",
        scope_condition(2, 3)
    ))
    .bind(task_id)
    .bind(&scope.namespace)
    .bind(scope.queues.as_deref())
    .fetch_optional(pool)
    .await?;
    row.map(|row| Ok((row.try_get("run_id")?, row.try_get("node_key")?)))
        .transpose()
        .map_err(|e: sqlx::Error| StoreError::from(e))
}

/// What a report found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportCheck {
    /// The lease was the caller's: the task now has its outcome.
    Applied,
    /// The same report was applied before: change nothing, answer OK.
    Repeat,
    /// The lease is not the caller's: change nothing, refuse.
    Stale,
}

/// A lease past its deadline.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpiredLease {
    /// Task.
    pub task_id: Uuid,
    /// Namespace.
    pub namespace: String,
    /// Queue.
    pub queue: String,
    /// Run.
    pub run_id: Uuid,
    /// Node key.
    pub node_key: String,
    /// Attempt.
    pub attempt: i32,
}

/// Unconfirmed leases of one attempt that go back to DISPATCHED without
/// spending it: the first is a lost poll answer (decision 0012); a second
/// means the worker took the task and died before its first heartbeat, so
/// that lease expires and spends the attempt like any other (decision 0039).
pub const FREE_HANDBACKS: i16 = 1;

/// Why a lease ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEnd {
    /// The worker confirmed receipt (or never asked to) and then went quiet.
    Silent,
    /// The worker never confirmed receipt, again: every delivery of this
    /// attempt was lost with its worker. `deliveries` counts them.
    WorkerLost {
        /// Leases of this attempt, the free hand-backs included.
        deliveries: u32,
    },
}

/// Leased tasks whose lease ran out, oldest expiry first: a range scan of
/// the partial index `tasks_lease_expiry` that stops at now(), so it reads
/// the leases that ran out since the last scan, not every leased task
/// (migration 0015).
pub async fn expired_leases<'e>(
    db: impl PgExecutor<'e>,
    limit: i64,
) -> Result<Vec<ExpiredLease>, StoreError> {
    // expired_leases: candidates only; each is re-checked under its run lock.
    // An unconfirmed lease is one only once its attempt's free hand-backs
    // are spent (`return_unconfirmed_leases` takes the others first).
    let rows = sqlx::query(
        "SELECT id, namespace, queue, run_id, node_key, attempt FROM tasks \
         WHERE status = 'LEASED' AND lease_expires_at < now() \
           AND (lease_confirmed IS DISTINCT FROM false OR handbacks >= $2) \
         ORDER BY lease_expires_at LIMIT $1",
    )
    .bind(limit)
    .bind(FREE_HANDBACKS)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(ExpiredLease {
                task_id: row.try_get("id")?,
                namespace: row.try_get("namespace")?,
                queue: row.try_get("queue")?,
                run_id: row.try_get("run_id")?,
                node_key: row.try_get("node_key")?,
                attempt: row.try_get("attempt")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// Marks a lease expired if it still is; under the run lock. Returns the
/// worker that held it and why it ended; None: a heartbeat or report got
/// there first, or the lease is a free hand-back's to return.
pub async fn expire_lease(
    conn: &mut PgConnection,
    task_id: Uuid,
    attempt: i32,
) -> Result<Option<(String, LeaseEnd)>, StoreError> {
    // expire_lease: LEASED and past its deadline -> EXPIRED; an unconfirmed
    // lease only once its attempt's free hand-backs are spent
    let row = sqlx::query(
        "UPDATE tasks SET status = 'EXPIRED', updated_at = now() \
         WHERE id = $1 AND attempt = $2 AND status = 'LEASED' AND lease_expires_at < now() \
           AND (lease_confirmed IS DISTINCT FROM false OR handbacks >= $3) \
         RETURNING lease_owner, lease_confirmed = false AS unconfirmed, handbacks",
    )
    .bind(task_id)
    .bind(attempt)
    .bind(FREE_HANDBACKS)
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let holder: Option<String> = row.try_get("lease_owner")?;
    let unconfirmed: Option<bool> = row.try_get("unconfirmed")?;
    let handbacks: i16 = row.try_get("handbacks")?;
    let end = if unconfirmed == Some(true) {
        LeaseEnd::WorkerLost {
            deliveries: u32::try_from(handbacks).unwrap_or_default() + 1,
        }
    } else {
        LeaseEnd::Silent
    };
    Ok(Some((holder.unwrap_or_default(), end)))
}

/// Writes fresh outbox rows for tasks of the `served` queues (namespace,
/// queue) dispatched longer than `grace_ms` ago and never leased (a lost
/// or never-sent message), same attempt, at most `limit` in all. Queues
/// nobody polls are left alone: their messages wait in their streams, and
/// republishing them would only grow those streams (decision 0040).
pub async fn republish_lost_dispatches(
    pool: &PgPool,
    grace_ms: i64,
    limit: i64,
    served: &[(String, String)],
) -> Result<u64, StoreError> {
    if served.is_empty() {
        return Ok(0);
    }
    let (namespaces, queues): (Vec<&str>, Vec<&str>) = served
        .iter()
        .map(|(namespace, queue)| (namespace.as_str(), queue.as_str()))
        .unzip();
    // republish_lost_dispatches: partial index tasks_dispatched_by_queue,
    // one probe per served queue; the dispatched_at bump keeps other
    // servers from republishing it again now
    Ok(sqlx::query(
        "WITH lost AS ( \
           SELECT l.id FROM UNNEST($3::text[], $4::text[]) AS q(namespace, queue) \
           CROSS JOIN LATERAL ( \
             SELECT t.id FROM tasks t WHERE t.status = 'DISPATCHED' \
               AND t.namespace = q.namespace AND t.queue = q.queue \
               AND t.dispatched_at < now() - make_interval(secs => $1 / 1000.0) \
             ORDER BY t.dispatched_at LIMIT $2 FOR UPDATE SKIP LOCKED) l \
           LIMIT $2), \
         bumped AS ( \
           UPDATE tasks t SET dispatched_at = now() FROM lost WHERE t.id = lost.id \
           RETURNING t.namespace, t.queue, t.id, t.attempt, t.run_id, t.priority) \
         INSERT INTO outbox (namespace, queue, task_id, attempt, shard_key, priority) \
         SELECT namespace, queue, id, attempt, run_id, priority FROM bumped",
    )
    .bind(grace_ms as f64)
    .bind(limit)
    .bind(&namespaces)
    .bind(&queues)
    .execute(pool)
    .await?
    .rows_affected())
}

/// A task to send to its stream.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    /// Its outbox row; None when the task row is its own outbox (the
    /// committing server sends it, decision 0024).
    pub outbox_id: Option<i64>,
    /// Namespace.
    pub namespace: String,
    /// Queue.
    pub queue: String,
    /// Task.
    pub task_id: Uuid,
    /// Attempt.
    pub attempt: i32,
    /// What picks the stream shard (the run id).
    pub shard_key: Uuid,
    /// The task's dispatch priority, 1 to 5: what picks its stream.
    pub priority: i16,
}

/// Takes up to `limit` outbox rows at least `min_age_ms` old, deleting them
/// in the caller's transaction: commit after the messages are in Redis,
/// roll back if not. (Fresh rows are the committing server's to publish;
/// this is the path for the ones it could not.) `= ANY(ARRAY(...))` runs
/// the locking subquery once (a plain `IN (subquery)` may run it per row).
pub async fn take_outbox(
    conn: &mut PgConnection,
    limit: i64,
    min_age_ms: i64,
) -> Result<Vec<OutboxMessage>, StoreError> {
    // take_outbox: a batch other servers skip, deleted on commit
    let rows = sqlx::query(
        "DELETE FROM outbox WHERE id = ANY(ARRAY( \
           SELECT id FROM outbox WHERE created_at < now() - make_interval(secs => $2 / 1000.0) \
           ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)) \
         RETURNING id AS outbox_id, namespace, queue, task_id, attempt, shard_key, priority",
    )
    .bind(limit)
    .bind(min_age_ms as f64)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(outbox_from_row)
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// Writes outbox rows for messages the committing server could not send
/// (Redis refused them or was not reached), so any server's enqueuer
/// sends them once Redis takes them again; the commit notifies it.
pub async fn queue_unsent(pool: &PgPool, messages: &[OutboxMessage]) -> Result<u64, StoreError> {
    if messages.is_empty() {
        return Ok(0);
    }
    let mut tx = pool.begin().await?;
    // queue_unsent: one multi-row insert; a task leased or re-armed since
    // gets a message that loses its lease update, as any duplicate does
    let written = sqlx::query(
        "INSERT INTO outbox (namespace, queue, task_id, attempt, shard_key, priority) \
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::uuid[], $4::int[], $5::uuid[], \
           $6::smallint[])",
    )
    .bind(
        messages
            .iter()
            .map(|m| m.namespace.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        messages
            .iter()
            .map(|m| m.queue.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(messages.iter().map(|m| m.task_id).collect::<Vec<_>>())
    .bind(messages.iter().map(|m| m.attempt).collect::<Vec<_>>())
    .bind(messages.iter().map(|m| m.shard_key).collect::<Vec<_>>())
    .bind(messages.iter().map(|m| m.priority).collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    notify_outbox(&mut tx).await?;
    tx.commit().await?;
    Ok(written)
}

/// Deletes outbox rows the committing server already published. Losing this
/// delete in a crash only sends a message twice (a duplicate loses the
/// lease update), so it does not wait for its commit to reach disk.
pub async fn delete_published(pool: &PgPool, ids: &[i64]) -> Result<u64, StoreError> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut tx = pool.begin().await?;
    // delete_published: primary key deletes, asynchronous commit
    sqlx::query("SET LOCAL synchronous_commit = off")
        .execute(&mut *tx)
        .await?;
    let deleted = sqlx::query("DELETE FROM outbox WHERE id = ANY($1)")
        .bind(ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    Ok(deleted)
}

/// Hands leased tasks back (their poll went away before it got them): back to
/// DISPATCHED at the same attempt, with a fresh outbox row. Fenced by token.
pub async fn release_leases(pool: &PgPool, leases: &[(Uuid, Uuid)]) -> Result<u64, StoreError> {
    if leases.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = leases.iter().map(|l| l.0).collect();
    let tokens: Vec<Uuid> = leases.iter().map(|l| l.1).collect();
    // release_leases: LEASED -> DISPATCHED for these exact leases, re-enqueued
    // (HELD, not enqueued, when the run is paused)
    Ok(sqlx::query(
        "WITH paused AS (SELECT id FROM runs WHERE status = 'PAUSED' \
           AND id IN (SELECT run_id FROM tasks WHERE id = ANY($1::uuid[])) FOR SHARE), \
         released AS ( \
           UPDATE tasks t SET status = CASE WHEN t.run_id IN (SELECT id FROM paused) \
               THEN 'HELD' ELSE 'DISPATCHED' END, \
             lease_token = NULL, lease_owner = NULL, \
             lease_expires_at = NULL, lease_confirmed = NULL, attempt_deadline = NULL, \
             dispatched_at = now(), updated_at = now() \
           FROM UNNEST($1::uuid[], $2::uuid[]) AS l(id, token) \
           WHERE t.id = ANY($1::uuid[]) AND t.id = l.id AND t.lease_token = l.token \
             AND t.status = 'LEASED' \
           RETURNING t.namespace, t.queue, t.id, t.attempt, t.run_id, t.priority, t.status) \
         INSERT INTO outbox (namespace, queue, task_id, attempt, shard_key, priority) \
         SELECT namespace, queue, id, attempt, run_id, priority FROM released \
         WHERE status = 'DISPATCHED'",
    )
    .bind(&ids)
    .bind(&tokens)
    .execute(pool)
    .await?
    .rows_affected())
}

/// Leases whose worker asked to confirm receipt and never did, past their
/// short expiry: the answer to the poll was lost. Each goes back to
/// DISPATCHED with the same attempt (no attempt is spent, the run is not
/// touched) and is re-enqueued, up to [`FREE_HANDBACKS`] times per attempt;
/// past that the lease is [`expired_leases`]' to spend. Returns how many.
pub async fn return_unconfirmed_leases<'e>(
    db: impl PgExecutor<'e>,
    limit: i64,
) -> Result<u64, StoreError> {
    // return_unconfirmed_leases: LEASED, never confirmed, expired, with a free
    // hand-back left -> DISPATCHED (HELD, not enqueued, when the run is
    // paused), the hand-back counted; in expiry order, as `expired_leases`
    // is and for its reason
    Ok(sqlx::query(
        "WITH stranded AS (SELECT id, run_id FROM tasks WHERE status = 'LEASED' \
             AND lease_confirmed = false AND lease_expires_at < now() AND handbacks < $2 \
           ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED), \
         paused AS (SELECT id FROM runs WHERE status = 'PAUSED' \
           AND id IN (SELECT run_id FROM stranded) FOR SHARE), \
         returned AS ( \
           UPDATE tasks t SET status = CASE WHEN t.run_id IN (SELECT id FROM paused) \
               THEN 'HELD' ELSE 'DISPATCHED' END, \
             lease_token = NULL, lease_owner = NULL, \
             lease_expires_at = NULL, lease_confirmed = NULL, attempt_deadline = NULL, \
             handbacks = t.handbacks + 1, dispatched_at = now(), updated_at = now() \
           WHERE t.id IN (SELECT id FROM stranded) \
             AND t.status = 'LEASED' AND t.lease_confirmed = false \
           RETURNING t.namespace, t.queue, t.id, t.attempt, t.run_id, t.priority, t.status) \
         INSERT INTO outbox (namespace, queue, task_id, attempt, shard_key, priority) \
         SELECT namespace, queue, id, attempt, run_id, priority FROM returned \
         WHERE status = 'DISPATCHED'",
    )
    .bind(limit)
    .bind(FREE_HANDBACKS)
    .execute(db)
    .await?
    .rows_affected())
}

/// Whether this lease already reported `outcome` (a repeat report, answered
/// OK without a change). Under the run lock.
pub async fn reported_before(
    conn: &mut PgConnection,
    lease: (Uuid, i32, Uuid),
    outcome: &str,
) -> Result<bool, StoreError> {
    let (task_id, attempt, lease_token) = lease;
    // reported_before: the lease's recorded outcome
    let repeat: Option<bool> = sqlx::query_scalar(
        "SELECT outcome = $4 FROM tasks WHERE id = $1 AND attempt = $2 AND lease_token = $3",
    )
    .bind(task_id)
    .bind(attempt)
    .bind(lease_token)
    .bind(outcome)
    .fetch_optional(conn)
    .await?;
    Ok(repeat == Some(true))
}

/// Hands free task slots to tasks left waiting with a slot free: a waiter
/// the freeing transaction had to skip (its row or its run's was locked
/// right then), or one whose freeing transaction rolled back. Looks at up
/// to `limit` keys with a task waiting longer than `min_wait_ms`, each in
/// its own statement (one slot lock at a time). Returns how many tasks got
/// a slot.
pub async fn promote_stranded_waiters(
    pool: &PgPool,
    min_wait_ms: i64,
    limit: i64,
) -> Result<i64, StoreError> {
    // stranded_slot_keys: partial index tasks_slot_waiting
    let keys: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT DISTINCT namespace, workflow_name, concurrency_node, concurrency_key FROM tasks \
         WHERE status = 'WAITING_SLOT' \
           AND dispatched_at < now() - make_interval(secs => $1 / 1000.0) \
         LIMIT $2",
    )
    .bind(min_wait_ms as f64)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let mut promoted = 0;
    for (namespace, workflow, node, key) in keys {
        // promote_waiters: the key's slot lock, then its oldest waiters
        let n: i32 = sqlx::query_scalar("SELECT task_slots_promote($1, $2, $3, $4)")
            .bind(&namespace)
            .bind(&workflow)
            .bind(&node)
            .bind(&key)
            .fetch_one(pool)
            .await?;
        promoted += i64::from(n);
    }
    Ok(promoted)
}

/// Channel NOTIFYed when outbox rows were written, to wake the enqueuers
/// (only by a server that does not publish its own tasks).
pub const OUTBOX_CHANNEL: &str = "composer_outbox";

/// Tells the outbox enqueuers, on commit, that the outbox has rows.
pub async fn notify_outbox(conn: &mut PgConnection) -> Result<(), StoreError> {
    // notify_outbox: delivered at commit, dropped on rollback
    sqlx::query("SELECT pg_notify('composer_outbox', '')")
        .execute(conn)
        .await?;
    Ok(())
}
