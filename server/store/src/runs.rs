//! Runs, their node states and their history.

use chrono::{DateTime, Utc};
use serde_json::Value as Json;
use sqlx::{
    Arguments, PgConnection, PgPool, Postgres, Row,
    postgres::{PgArguments, PgRow},
};
use uuid::Uuid;

pub use crate::history_rows::{HistoryRow, HistoryWrite};
use crate::{
    StoreError,
    history_rows::{self, HistoryColumns},
};

/// A run as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    /// The run's id.
    pub id: Uuid,
    /// Its namespace.
    pub namespace: String,
    /// The workflow it runs.
    pub workflow_name: String,
    /// The version it is pinned to.
    pub workflow_version: i32,
    /// RUNNING, COMPENSATING, COMPLETED, FAILED or CANCELLED.
    pub status: String,
    /// The input.
    pub input: Json,
    /// The output once completed.
    pub output: Option<Json>,
    /// The error once failed or cancelled.
    pub error: Option<Json>,
    /// Labels, a JSON object of strings.
    pub labels: Json,
    /// The idempotency key given at start.
    pub idempotency_key: Option<String>,
    /// The parent run, for child runs.
    pub parent_run_id: Option<Uuid>,
    /// The parent's node, for child runs.
    pub parent_node: Option<String>,
    /// The parent node's attempt that started this child.
    pub parent_attempt: Option<i32>,
    /// The engine's run record.
    pub record: Json,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
    /// Ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// The W3C traceparent its spans hang under; None unless traces are on.
    pub traceparent: Option<String>,
    /// Dispatch priority, 1 (lowest) to 5 (highest).
    pub priority: i16,
    /// Its workflow's concurrency key for its input, if it declares one.
    pub concurrency_key: Option<String>,
    /// Holds a slot of that key now (QUEUED and ended runs do not).
    pub concurrency_holds: bool,
}

const RUN_COLUMNS: &str = "id, namespace, workflow_name, workflow_version, status, input, output, \
     error, labels, idempotency_key, parent_run_id, parent_node, parent_attempt, record, \
     created_at, updated_at, ended_at, traceparent, priority, concurrency_key, concurrency_holds";

fn run_from_row(row: &PgRow) -> Result<RunRow, sqlx::Error> {
    Ok(RunRow {
        id: row.try_get("id")?,
        namespace: row.try_get("namespace")?,
        workflow_name: row.try_get("workflow_name")?,
        workflow_version: row.try_get("workflow_version")?,
        status: row.try_get("status")?,
        input: row.try_get("input")?,
        output: row.try_get("output")?,
        error: row.try_get("error")?,
        labels: row.try_get("labels")?,
        idempotency_key: row.try_get("idempotency_key")?,
        parent_run_id: row.try_get("parent_run_id")?,
        parent_node: row.try_get("parent_node")?,
        parent_attempt: row.try_get("parent_attempt")?,
        record: row.try_get("record")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        ended_at: row.try_get("ended_at")?,
        traceparent: row.try_get("traceparent")?,
        priority: row.try_get("priority")?,
        concurrency_key: row.try_get("concurrency_key")?,
        concurrency_holds: row.try_get("concurrency_holds")?,
    })
}

/// A run to create.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    /// The run's id.
    pub id: Uuid,
    /// Its namespace.
    pub namespace: &'a str,
    /// The workflow.
    pub workflow_name: &'a str,
    /// The version.
    pub workflow_version: i32,
    /// Initial status.
    pub status: &'a str,
    /// The input.
    pub input: &'a Json,
    /// Labels (a JSON object).
    pub labels: &'a Json,
    /// Optional idempotency key.
    pub idempotency_key: Option<&'a str>,
    /// Parent run, for child runs.
    pub parent_run_id: Option<Uuid>,
    /// Parent node, for child runs.
    pub parent_node: Option<&'a str>,
    /// The parent node's attempt, for child runs.
    pub parent_attempt: Option<i32>,
    /// The engine's initial run record.
    pub record: &'a Json,
    /// The W3C traceparent its spans hang under, if traces are on.
    pub traceparent: Option<&'a str>,
    /// Dispatch priority, 1 to 5.
    pub priority: i16,
    /// Its admission under a concurrency key, if its workflow declares one.
    pub concurrency: Option<Admission<'a>>,
}

/// How a run with a concurrency key was admitted.
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    pub key: &'a str,
    /// Arrival order among the key's runs.
    pub seq: i64,
    /// When it arrived: the run's created_at.
    pub arrived_at: DateTime<Utc>,
    /// The `max` its version declares.
    pub max: i32,
    /// It took a slot.
    pub holds: bool,
}

/// Inserts a run and locks it (the inserting transaction holds the row).
/// Returns when it was created, or None, inserting nothing, when the
/// idempotency key is taken or (with `only_if_latest`) when the workflow has
/// a version newer than the run's: a caller that picked "the latest" from a
/// cache learns here, in the same statement, that its cache is stale.
pub async fn insert_run(
    conn: &mut PgConnection,
    run: &NewRun<'_>,
    only_if_latest: bool,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    // insert_run: a new run; an idempotency key already used in the namespace
    // (or a newer version, when asked) inserts nothing
    let created = sqlx::query_scalar(
        "INSERT INTO runs (id, namespace, workflow_name, workflow_version, status, input, labels, \
           idempotency_key, parent_run_id, parent_node, parent_attempt, record, traceparent, \
           priority, concurrency_key, concurrency_seq, concurrency_max, concurrency_holds, \
           created_at, updated_at) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $14, $15, \
           $16, $17, $18, COALESCE($19, false), COALESCE($20, now()), COALESCE($20, now()) \
         WHERE NOT ($13 AND EXISTS (SELECT 1 FROM workflow_definitions \
           WHERE namespace = $2 AND name = $3 AND version > $4)) \
         ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
         RETURNING created_at",
    )
    .bind(run.id)
    .bind(run.namespace)
    .bind(run.workflow_name)
    .bind(run.workflow_version)
    .bind(run.status)
    .bind(run.input)
    .bind(run.labels)
    .bind(run.idempotency_key)
    .bind(run.parent_run_id)
    .bind(run.parent_node)
    .bind(run.parent_attempt)
    .bind(run.record)
    .bind(only_if_latest)
    .bind(run.traceparent)
    .bind(run.priority)
    .bind(run.concurrency.map(|a| a.key))
    .bind(run.concurrency.map(|a| a.seq))
    .bind(run.concurrency.map(|a| a.max))
    .bind(run.concurrency.map(|a| a.holds))
    .bind(run.concurrency.map(|a| a.arrived_at))
    .fetch_optional(conn)
    .await?;
    Ok(created)
}

/// The id of the run an idempotency key names.
pub async fn run_id_by_idempotency_key(
    conn: &mut PgConnection,
    namespace: &str,
    key: &str,
) -> Result<Option<Uuid>, StoreError> {
    // run_by_idempotency_key: served by runs_idempotency_key
    Ok(
        sqlx::query_scalar("SELECT id FROM runs WHERE namespace = $1 AND idempotency_key = $2")
            .bind(namespace)
            .bind(key)
            .fetch_optional(conn)
            .await?,
    )
}

/// Locks a run's row for the rest of the transaction and returns it. Every
/// event on a run starts here, so a run's events are applied one at a time.
/// `namespace` None: any namespace (internal callers that hold a run id).
pub async fn lock_run(
    conn: &mut PgConnection,
    namespace: Option<&str>,
    run_id: Uuid,
) -> Result<Option<RunRow>, StoreError> {
    // lock_run: the row lock that serialises the run's events
    let row = sqlx::query(&format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE id = $1 AND ($2::text IS NULL OR namespace = $2) \
         FOR UPDATE"
    ))
    .bind(run_id)
    .bind(namespace)
    .fetch_optional(conn)
    .await?;
    Ok(row.as_ref().map(run_from_row).transpose()?)
}

/// A due timer taken for firing, with its locked run.
#[derive(Debug, Clone)]
pub struct TakenTimer {
    /// The run, locked.
    pub run: RunRow,
    /// The timer's key.
    pub key: String,
    /// The engine's timer id.
    pub timer: Json,
}

/// How [`lock_runs_taking_timers`] meets a run another transaction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLocking {
    /// Skip it: a background pass moves on and comes back.
    SkipBusy,
    /// Wait for it: a continuation of work that was just committed.
    Wait,
}

/// Takes due timers for firing, in one statement: locks the runs (in id
/// order; a busy one skipped or waited for, as `locking` says), then deletes those runs' timers among
/// `due` that are still there and due. The deletes re-check the newest
/// version of each timer row, so a change committed just before the lock is
/// seen. Returns each taken timer with its run (a run with two timers comes
/// twice).
pub async fn lock_runs_taking_timers(
    conn: &mut PgConnection,
    due: &[(Uuid, String)],
    locking: RunLocking,
) -> Result<Vec<TakenTimer>, StoreError> {
    let skip = match locking {
        RunLocking::SkipBusy => "SKIP LOCKED",
        RunLocking::Wait => "",
    };
    let run_ids: Vec<Uuid> = due.iter().map(|d| d.0).collect();
    let keys: Vec<&str> = due.iter().map(|d| d.1.as_str()).collect();
    // lock_runs_taking_timers: the run locks first (the delete reads `locked`)
    let rows = sqlx::query(&format!(
        "WITH wanted AS (SELECT * FROM UNNEST($1::uuid[], $2::text[]) AS w(run_id, timer_key)), \
         locked AS ( \
           SELECT {RUN_COLUMNS} FROM runs WHERE id IN (SELECT run_id FROM wanted) \
           ORDER BY id FOR UPDATE {skip}), \
         taken AS ( \
           DELETE FROM timers t USING wanted w \
           WHERE t.run_id = w.run_id AND t.timer_key = w.timer_key AND t.fire_at <= now() \
             AND NOT t.held AND t.run_id IN (SELECT id FROM locked) \
           RETURNING t.run_id, t.timer_key, t.timer) \
         SELECT locked.*, taken.timer_key AS taken_key, taken.timer AS taken_timer \
         FROM locked JOIN taken ON taken.run_id = locked.id ORDER BY locked.id"
    ))
    .bind(&run_ids)
    .bind(&keys)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(TakenTimer {
                run: run_from_row(row)?,
                key: row.try_get("taken_key")?,
                timer: row.try_get("taken_timer")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// Node states of several runs at once: `(run_id, node_key, state)` for the
/// pairs that have a row.
pub async fn load_nodes_of_runs(
    conn: &mut PgConnection,
    wanted: &[(Uuid, String)],
) -> Result<Vec<(Uuid, String, Json)>, StoreError> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let run_ids: Vec<Uuid> = wanted.iter().map(|w| w.0).collect();
    let keys: Vec<&str> = wanted.iter().map(|w| w.1.as_str()).collect();
    // load_nodes_of_runs: primary key lookups
    let rows = sqlx::query(
        "SELECT w.run_id, n.node_key, n.state \
         FROM UNNEST($1::uuid[], $2::text[]) AS w(run_id, node_key) \
         CROSS JOIN LATERAL (SELECT n.node_key, n.state FROM run_nodes n \
           WHERE n.run_id = w.run_id AND n.node_key = w.node_key LIMIT 1) n",
    )
    .bind(&run_ids)
    .bind(&keys)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get("run_id")?,
                row.try_get("node_key")?,
                row.try_get("state")?,
            ))
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// Reads a run without locking it.
pub async fn get_run(
    pool: &PgPool,
    namespace: Option<&str>,
    run_id: Uuid,
) -> Result<Option<RunRow>, StoreError> {
    // get_run: one run by primary key, in its namespace
    let row = sqlx::query(&format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE id = $1 AND ($2::text IS NULL OR namespace = $2)"
    ))
    .bind(run_id)
    .bind(namespace)
    .fetch_optional(pool)
    .await?;
    Ok(row.as_ref().map(run_from_row).transpose()?)
}

/// What an event changed on the run row.
#[derive(Debug, Clone)]
pub struct RunUpdate<'a> {
    /// New status.
    pub status: &'a str,
    /// New engine record.
    pub record: &'a Json,
    /// Output, once completed.
    pub output: Option<&'a Json>,
    /// Error, once failed or cancelled.
    pub error: Option<&'a Json>,
    /// True when the run just reached a final status.
    pub ended: bool,
}

/// Two select-list columns, `node_keys` (text[]) and `node_states`
/// (jsonb[]), in the same order: the node rows of run `run` among `keys`
/// (SQL parameters). Each key is looked up through the primary key; with a
/// generic plan, `node_key = ANY(keys)` instead filtered every node row of
/// the run (30 ms per call on a 10,000-branch run). Each key is its own
/// LATERAL probe, as in [`lock_runs_fence_and_load`].
pub(crate) fn node_rows_columns(run: &str, keys: &str) -> String {
    let rows = format!(
        "FROM UNNEST({keys}::text[]) AS k(key) \
         CROSS JOIN LATERAL (SELECT n.node_key, n.state FROM run_nodes n \
           WHERE n.run_id = {run} AND n.node_key = k.key LIMIT 1) n ORDER BY n.node_key"
    );
    format!(
        "ARRAY(SELECT n.node_key {rows}) AS node_keys, ARRAY(SELECT n.state {rows}) AS node_states"
    )
}

/// [`crate::tasks::finish_task`] and [`load_nodes`] in one round trip: records
/// the report's outcome (fenced by the lease) and returns the states of the
/// run's nodes `keys` (those without a row are absent). Call under the run's
/// lock; the statement's snapshot is taken after that lock was granted.
pub async fn finish_task_and_load(
    conn: &mut PgConnection,
    finish: (Uuid, i32, Uuid, &str),
    run_id: Uuid,
    keys: &[String],
) -> Result<
    (
        crate::tasks::ReportCheck,
        Option<String>,
        Vec<(String, Json)>,
    ),
    StoreError,
> {
    let (task_id, attempt, lease_token, outcome) = finish;
    // finish_task_and_load: LEASED -> outcome for the caller's lease only;
    // `repeat` reads the row as it was before this statement's update
    let row = sqlx::query(&format!(
        "WITH finished AS ( \
           UPDATE tasks SET status = $4, outcome = $4, lease_expires_at = NULL, updated_at = now() \
           WHERE id = $1 AND attempt = $2 AND lease_token = $3 AND status = 'LEASED' \
           RETURNING lease_owner) \
         SELECT EXISTS (SELECT 1 FROM finished) AS applied, \
           (SELECT lease_owner FROM finished) AS holder, \
           (SELECT outcome = $4 FROM tasks WHERE id = $1 AND attempt = $2 AND lease_token = $3) \
             AS repeat, \
           {}",
        node_rows_columns("$5", "$6")
    ))
    .bind(task_id)
    .bind(attempt)
    .bind(lease_token)
    .bind(outcome)
    .bind(run_id)
    .bind(keys)
    .fetch_one(conn)
    .await?;
    let applied: bool = row.try_get("applied")?;
    let repeat: Option<bool> = row.try_get("repeat")?;
    let check = match (applied, repeat) {
        (true, _) => crate::tasks::ReportCheck::Applied,
        (false, Some(true)) => crate::tasks::ReportCheck::Repeat,
        (false, _) => crate::tasks::ReportCheck::Stale,
    };
    let holder: Option<String> = row.try_get("holder")?;
    let node_keys: Vec<String> = row.try_get("node_keys")?;
    let states: Vec<Json> = row.try_get("node_states")?;
    Ok((check, holder, node_keys.into_iter().zip(states).collect()))
}

/// Loads the states of the given nodes; keys without a row are absent.
pub async fn load_nodes(
    conn: &mut PgConnection,
    run_id: Uuid,
    keys: &[String],
) -> Result<Vec<(String, Json)>, StoreError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    // load_nodes: only the node rows an event touches (primary key lookups)
    let rows = sqlx::query(
        "SELECT n.node_key, n.state FROM UNNEST($2::text[]) AS k(key) \
         CROSS JOIN LATERAL (SELECT n.node_key, n.state FROM run_nodes n \
           WHERE n.run_id = $1 AND n.node_key = k.key LIMIT 1) n",
    )
    .bind(run_id)
    .bind(keys)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| Ok((row.try_get("node_key")?, row.try_get("state")?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// A node state to write.
#[derive(Debug, Clone)]
pub struct NodeWrite {
    /// The node key.
    pub key: String,
    /// Its status.
    pub status: String,
    /// The engine's node state.
    pub state: Json,
    /// True when the node is now in a final status.
    pub ended: bool,
}

/// Every node state of a run (GetRun, WatchRun), ordered by first start.
pub async fn list_nodes(
    executor: impl sqlx::PgExecutor<'_>,
    run_id: Uuid,
) -> Result<Vec<NodeRow>, StoreError> {
    // list_nodes: all node rows of one run (primary key prefix), with the
    // task of each TASK-like node (the tasks' unique (run_id, node_key))
    let rows = sqlx::query(
        "SELECT n.node_key, n.status, n.state, n.started_at, n.ended_at, \
           t.input AS task_input, t.lease_owner, t.lease_expires_at \
         FROM run_nodes n LEFT JOIN tasks t ON t.run_id = n.run_id AND t.node_key = n.node_key \
         WHERE n.run_id = $1 ORDER BY n.started_at, n.node_key",
    )
    .bind(run_id)
    .fetch_all(executor)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(NodeRow {
                key: row.try_get("node_key")?,
                status: row.try_get("status")?,
                state: row.try_get("state")?,
                started_at: row.try_get("started_at")?,
                ended_at: row.try_get("ended_at")?,
                task: row
                    .try_get::<Option<Json>, _>("task_input")?
                    .map(|input| -> Result<TaskView, sqlx::Error> {
                        Ok(TaskView {
                            input,
                            worker_id: row.try_get("lease_owner")?,
                            lease_expires_at: row.try_get("lease_expires_at")?,
                        })
                    })
                    .transpose()?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// A node state as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRow {
    /// The node key.
    pub key: String,
    /// Its status.
    pub status: String,
    /// The engine's node state.
    pub state: Json,
    /// When it first started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// Its task, for a node run by a worker (TASK, HTTP, CODE).
    pub task: Option<TaskView>,
}

/// What a node's task shows: its rendered input and its latest lease.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView {
    /// The input the worker gets (the node's templates rendered).
    pub input: Json,
    /// The worker that holds or last held its lease.
    pub worker_id: Option<String>,
    /// When the current lease ends (none when not leased).
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// Appends history entries with the run's next sequence numbers. Runs under
/// the run lock, so sequence numbers are gap-free and ordered.
pub async fn append_history(
    conn: &mut PgConnection,
    run_id: Uuid,
    namespace: &str,
    entries: &[HistoryWrite],
) -> Result<(), StoreError> {
    if entries.is_empty() {
        return Ok(());
    }
    let count = i64::try_from(entries.len()).unwrap_or(i64::MAX);
    let h = HistoryColumns::of(entries);
    // append_history: reserve `count` sequence numbers on the run row and
    // insert the entries with them, in one statement
    let query = sqlx::query(
        "WITH reserved AS ( \
           UPDATE runs SET history_seq = history_seq + $3 WHERE id = $1 \
           RETURNING history_seq - $3 AS base) \
         INSERT INTO run_events (run_id, seq, namespace, event_type, node_key, attempt, actor, details, \
           more, created_at) \
         SELECT $1, reserved.base + t.ord, $2, t.ty, t.node, t.attempt, t.actor, t.details, t.more, \
           clock_timestamp() \
           FROM reserved, UNNEST($4::bigint[], $5::text[], $6::text[], $7::int[], $8::text[], \
             $9::jsonb[], $10::jsonb[]) AS t(ord, ty, node, attempt, actor, details, more)",
    )
    .bind(run_id)
    .bind(namespace)
    .bind(count);
    h.bind(query).execute(conn).await?;
    Ok(())
}

/// History entries of a run after `after_seq`, oldest first, at most `limit`.
pub async fn history_page(
    executor: impl sqlx::PgExecutor<'_>,
    run_id: Uuid,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<HistoryRow>, StoreError> {
    // a row holds up to EVENTS_PER_ROW events numbered on from its seq: the
    // one holding `after_seq + 1` starts at most that many back, and every
    // row read holds at least one event
    let back = i64::try_from(history_rows::EVENTS_PER_ROW - 1).unwrap_or(0);
    // history_page: keyset page by (run_id, seq), every partition's primary key
    let rows = sqlx::query(
        "SELECT seq, created_at, event_type, node_key, attempt, actor, details, more \
         FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(run_id)
    .bind(after_seq.saturating_sub(back))
    .bind(limit.saturating_add(back))
    .fetch_all(executor)
    .await?;
    let limit = usize::try_from(limit).unwrap_or(0);
    let mut events = Vec::with_capacity(limit.min(rows.len()));
    for row in &rows {
        let first = HistoryRow {
            seq: row.try_get("seq")?,
            created_at: row.try_get("created_at")?,
            event_type: row.try_get("event_type")?,
            node_key: row.try_get("node_key")?,
            attempt: row.try_get("attempt")?,
            actor: row.try_get("actor")?,
            details: row.try_get("details")?,
        };
        let more: Option<Json> = row.try_get("more")?;
        for event in history_rows::events_of(first, more)? {
            if events.len() == limit {
                return Ok(events);
            }
            if event.seq > after_seq {
                events.push(event);
            }
        }
    }
    Ok(events)
}

/// Filters of ListRuns, CountRuns and bulk operations (stored with the
/// operation as JSON).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RunFilter {
    /// Only this workflow.
    pub workflow_name: Option<String>,
    /// Only this version of the workflow.
    pub workflow_version: Option<i32>,
    /// Only these statuses (empty: any).
    pub statuses: Vec<String>,
    /// Only runs carrying these labels (a JSON object; empty object: any).
    pub labels: Option<Json>,
    /// Created at or after.
    pub created_after: Option<DateTime<Utc>>,
    /// Created before.
    pub created_before: Option<DateTime<Utc>>,
    /// Only children of this run.
    pub parent_run_id: Option<Uuid>,
    /// Only the run with this id, and runs whose idempotency key starts
    /// with this text (taken literally: `%` and `_` match themselves).
    pub search: Option<String>,
}

/// A WHERE clause being built: its conditions and their parameters, added
/// together so a placeholder's number always matches its value.
pub(crate) struct Conditions {
    texts: Vec<String>,
    pub(crate) arguments: PgArguments,
}

impl Conditions {
    fn new() -> Self {
        Self {
            texts: Vec::new(),
            arguments: PgArguments::default(),
        }
    }

    /// Adds `value` as the next parameter and returns its placeholder.
    pub(crate) fn bind<'q, T>(&mut self, value: T) -> Result<String, StoreError>
    where
        T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>,
    {
        self.arguments
            .add(value)
            .map_err(|e| StoreError::Database(sqlx::Error::Encode(e)))?;
        Ok(format!("${}", self.arguments.len()))
    }

    pub(crate) fn and(&mut self, text: String) {
        self.texts.push(text);
    }

    pub(crate) fn sql(&self) -> String {
        self.texts.join(" AND ")
    }
}

/// The predicate of runs_by_labels, which holds only runs with labels
/// (decision 0050): a search by labels states it, as a literal, so that
/// the planner can use the index.
pub const LABELLED: &str = "labels <> '{}'::jsonb";

/// Whether `value` is `{}`.
fn is_empty_object(value: &Json) -> bool {
    value.as_object().is_some_and(serde_json::Map::is_empty)
}

/// The conditions of `filter` in `namespace`, for list_runs, count_runs
/// and the walk of a bulk operation alike. Only the filters given are in the text, so each combination has a
/// generic plan of its own (the server runs on generic plans, see
/// Store::connect); runs_by_workflow / runs_by_status / runs_by_created /
/// runs_by_labels serve them.
pub(crate) fn filter_conditions(
    namespace: &str,
    filter: &RunFilter,
) -> Result<Conditions, StoreError> {
    let mut c = Conditions::new();
    let p = c.bind(namespace.to_owned())?;
    c.and(format!("namespace = {p}"));
    if let Some(name) = &filter.workflow_name {
        let p = c.bind(name.clone())?;
        c.and(format!("workflow_name = {p}"));
    }
    if let Some(version) = filter.workflow_version {
        let p = c.bind(version)?;
        c.and(format!("workflow_version = {p}"));
    }
    if !filter.statuses.is_empty() {
        let p = c.bind(filter.statuses.clone())?;
        c.and(format!("status = ANY({p}::text[])"));
    }
    // no label asked for: every run matches, with labels or without
    if let Some(labels) = filter.labels.as_ref().filter(|l| !is_empty_object(l)) {
        let p = c.bind(labels.clone())?;
        c.and(format!("labels @> {p}::jsonb AND {LABELLED}"));
    }
    if let Some(after) = filter.created_after {
        let p = c.bind(after)?;
        c.and(format!("created_at >= {p}"));
    }
    if let Some(before) = filter.created_before {
        let p = c.bind(before)?;
        c.and(format!("created_at < {p}"));
    }
    if let Some(parent) = filter.parent_run_id {
        let p = c.bind(parent)?;
        c.and(format!("parent_run_id = {p}"));
    }
    if let Some(search) = &filter.search {
        search_condition(&mut c, search)?;
    }
    Ok(c)
}

/// The run whose id `search` is, or runs whose idempotency key starts with
/// it: the keys from the text up to its successor in byte order, a range
/// runs_idempotency_key (C collation, migration 0023) reads directly.
/// Whether that range holds ten runs or ten million depends on the text,
/// which a generic plan cannot see: the statement is planned with its
/// values (see [`fetch_filtered`]).
fn search_condition(c: &mut Conditions, search: &str) -> Result<(), StoreError> {
    let from = c.bind(search.to_owned())?;
    let mut by_key = format!("idempotency_key COLLATE \"C\" >= {from}");
    if let Some(to) = successor(search) {
        let to = c.bind(to)?;
        by_key.push_str(&format!(" AND idempotency_key COLLATE \"C\" < {to}"));
    }
    match Uuid::parse_str(search) {
        Ok(id) => {
            let p = c.bind(id)?;
            c.and(format!("(id = {p} OR ({by_key}))"));
        }
        Err(_) => c.and(by_key),
    }
    Ok(())
}

/// The least text greater than every text that starts with `prefix`, in
/// byte (code point) order: its last character that has a next one, moved
/// to that next one, and what follows it dropped. None when there is no
/// such text (every character is the last code point).
fn successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        // char::from_u32 skips nothing: the surrogates have no char
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// The rows of `sql`, whose conditions are `c`, planned with the values
/// bound (see [`plan_by_values`]).
pub(crate) async fn fetch_filtered(
    pool: &PgPool,
    sql: &str,
    c: Conditions,
) -> Result<Vec<sqlx::postgres::PgRow>, StoreError> {
    let mut tx = pool.begin().await?;
    plan_by_values(&mut tx).await?;
    let rows = sqlx::query_with(sql, c.arguments)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(rows)
}

/// Plans the rest of the caller's transaction with the values bound. The
/// server's sessions use generic plans (Store::connect), right for key
/// lookups; a filter of runs is not one. How many runs a workflow, a label,
/// a time range or a key prefix holds decides between walking an index
/// newest first and collecting the few matches, and a generic plan cannot
/// see it: at 10,000,000 runs it walked every run for a search matching
/// none (3 s) where the plan for the value reads one index page (decision
/// 0052). Planning a listing costs a fraction of a millisecond. A scan is
/// allowed again here (the sessions rule it out, decision 0055): counting
/// the runs of a label held by a third of ten million runs, it stops at the
/// count's limit, where the label's index collects every match first (172
/// against 496 ms p99 in B6). Such a scan starts at the table's first page:
/// a synchronized scan starts where the last one stopped, so each count
/// read pages the one before had not, from the disk once the table
/// outgrew the page cache (decision 0063).
pub(crate) async fn plan_by_values(conn: &mut PgConnection) -> Result<(), StoreError> {
    sqlx::query(
        "SELECT set_config('plan_cache_mode', 'force_custom_plan', true), \
           set_config('enable_seqscan', 'on', true), \
           set_config('synchronize_seqscans', 'off', true)",
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Runs matching `filter`, newest first, strictly after the keyset cursor
/// `(created_at, id)` when given; at most `limit`.
pub async fn list_runs(
    pool: &PgPool,
    namespace: &str,
    filter: &RunFilter,
    cursor: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<RunRow>, StoreError> {
    let (sql, c) = list_runs_statement(namespace, filter, cursor, limit)?;
    let rows = fetch_filtered(pool, &sql, c).await?;
    rows.iter()
        .map(run_from_row)
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// The plan Postgres makes for [`list_runs`] of these arguments, one line
/// per row of EXPLAIN: for an operator asking why a listing is slow, and
/// for the tests that pin which index a search reads.
pub async fn list_runs_plan(
    pool: &PgPool,
    namespace: &str,
    filter: &RunFilter,
    limit: i64,
) -> Result<Vec<String>, StoreError> {
    let (sql, c) = list_runs_statement(namespace, filter, None, limit)?;
    let rows = fetch_filtered(pool, &format!("EXPLAIN {sql}"), c).await?;
    rows.iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

fn list_runs_statement(
    namespace: &str,
    filter: &RunFilter,
    cursor: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<(String, Conditions), StoreError> {
    // list_runs: keyset page newest first over the filter's conditions.
    let mut c = filter_conditions(namespace, filter)?;
    if let Some((time, id)) = cursor {
        let (t, i) = (c.bind(time)?, c.bind(id)?);
        c.and(format!("(created_at, id) < ({t}, {i})"));
    }
    let limit = c.bind(limit)?;
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE {} ORDER BY created_at DESC, id DESC LIMIT {limit}",
        c.sql()
    );
    Ok((sql, c))
}

/// How many runs match a filter, by stored status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunCounts {
    /// Matching runs per stored status (statuses with none absent).
    pub by_status: Vec<(String, i64)>,
    /// Whether counting stopped at the limit: each count is then a floor,
    /// and a status absent may still have matching runs.
    pub more: bool,
}

/// How many runs match `filter`, by stored status, counting up to `limit`
/// matching runs and no further: an exact count reads every matching run,
/// 1.3 s of both cores at ten million (decision 0052), while this stops
/// after `limit` of them.
pub async fn count_runs(
    pool: &PgPool,
    namespace: &str,
    filter: &RunFilter,
    limit: i64,
) -> Result<RunCounts, StoreError> {
    let mut c = filter_conditions(namespace, filter)?;
    let conditions = c.sql();
    // one more than the limit, to tell "exactly limit" from "more"
    let read = c.bind(limit.saturating_add(1))?;
    // count_runs: whichever index (or scan) the filter's values favour,
    // stopped after the limit
    let sql = format!(
        "SELECT status, count(*) FROM \
           (SELECT status FROM runs WHERE {conditions} LIMIT {read}) AS m \
         GROUP BY status ORDER BY status"
    );
    let rows = fetch_filtered(pool, &sql, c).await?;
    let by_status = rows
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<Vec<(String, i64)>, sqlx::Error>>()?;
    let seen: i64 = by_status.iter().map(|(_, n)| n).sum();
    if seen <= limit {
        return Ok(RunCounts {
            by_status,
            more: false,
        });
    }
    // the one run past the limit only told that there are more
    let mut by_status = by_status;
    if let Some((_, n)) = by_status.iter_mut().max_by_key(|(_, n)| *n) {
        *n -= 1;
    }
    by_status.retain(|(_, n)| *n > 0);
    Ok(RunCounts {
        by_status,
        more: true,
    })
}

/// Where a run sits in its tree: how many parent runs it has (counted up
/// to `limit`) and the id of the root run (None past `limit`).
pub async fn ancestry(
    conn: &mut PgConnection,
    run_id: Uuid,
    limit: i32,
) -> Result<(i32, Option<Uuid>), StoreError> {
    // ancestry: one primary-key probe per level, never more than `limit`
    let row: (Option<i32>, Option<Uuid>) = sqlx::query_as(
        "WITH RECURSIVE chain(id, parent, depth) AS ( \
           SELECT id, parent_run_id, 0 FROM runs WHERE id = $1 \
           UNION ALL \
           SELECT r.id, r.parent_run_id, c.depth + 1 FROM runs r JOIN chain c ON r.id = c.parent \
           WHERE c.depth < $2) \
         SELECT max(depth), (array_agg(id) FILTER (WHERE parent IS NULL))[1] FROM chain",
    )
    .bind(run_id)
    .bind(limit)
    .fetch_one(conn)
    .await?;
    Ok((row.0.unwrap_or(0), row.1))
}

/// Counts one more run in the tree of `root`; false (and nothing counted)
/// when the tree already holds `max` runs.
pub async fn count_run_in_tree(
    conn: &mut PgConnection,
    root: Uuid,
    max: i32,
) -> Result<bool, StoreError> {
    // count_run_in_tree: the root's row is created with the root and its
    // first child; a full tree updates nothing and returns no row
    let counted: Option<i32> = sqlx::query_scalar(
        "INSERT INTO run_trees AS t (root_run_id, runs) VALUES ($1, 2) \
         ON CONFLICT (root_run_id) DO UPDATE SET runs = t.runs + 1 WHERE t.runs < $2 \
         RETURNING runs",
    )
    .bind(root)
    .bind(max)
    .fetch_optional(conn)
    .await?;
    Ok(counted.is_some())
}

/// Ids of the children of a run that have not ended.
pub async fn active_children(
    conn: &mut PgConnection,
    run_id: Uuid,
    parent_node: Option<&str>,
) -> Result<Vec<Uuid>, StoreError> {
    // active_children: served by runs_by_parent
    Ok(sqlx::query_scalar(
        "SELECT id FROM runs WHERE parent_run_id = $1 AND ended_at IS NULL \
           AND ($2::text IS NULL OR parent_node = $2 OR parent_node LIKE $2 || '[%')",
    )
    .bind(run_id)
    .bind(parent_node)
    .fetch_all(conn)
    .await?)
}

/// Node keys that were running, waiting or between attempts (what a failed
/// run left interrupted, for RetryRun).
pub async fn interrupted_nodes(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Vec<String>, StoreError> {
    // interrupted_nodes: the run's node rows still in an active status
    Ok(sqlx::query_scalar(
        "SELECT node_key FROM run_nodes WHERE run_id = $1 \
           AND status IN ('RUNNING', 'WAITING', 'RETRY_SCHEDULED')",
    )
    .bind(run_id)
    .fetch_all(conn)
    .await?)
}

/// Deletes up to `limit` runs that ended before `cutoff`, with everything
/// that hangs off them (node states, tasks, timers, waits, events, inbox)
/// and their history rows. Returns how many runs went.
pub async fn delete_finished_runs(
    pool: &PgPool,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<u64, StoreError> {
    // delete_finished_runs: served by runs_ended. History, task and node
    // rows have no foreign key to their run (decision 0054): they go by
    // name; the rest go by their key's cascade. A run's rows are never
    // written without its lock, which SKIP LOCKED leaves to their writer.
    let deleted = sqlx::query(
        "WITH old AS ( \
           SELECT id FROM runs WHERE ended_at < $1 ORDER BY ended_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
         history AS (DELETE FROM run_events e USING old WHERE e.run_id = old.id), \
         nodes AS (DELETE FROM run_nodes n USING old WHERE n.run_id = old.id), \
         tasks AS (DELETE FROM tasks t USING old WHERE t.run_id = old.id), \
         blobs AS (DELETE FROM blob_refs WHERE owner = ANY(ARRAY(SELECT id FROM old))) \
         DELETE FROM runs r USING old WHERE r.id = old.id",
    )
    .bind(cutoff)
    .bind(limit)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(deleted)
}

/// Drops the history partitions that end before `cutoff`, then analyses the
/// partitioned parent (autovacuum never does, and plans go bad without it).
pub async fn drop_old_history(pool: &PgPool, cutoff: DateTime<Utc>) -> Result<i32, StoreError> {
    // drop_old_history: whole partitions, no row-by-row deletes
    let dropped: i32 = sqlx::query_scalar("SELECT composer_drop_history_partitions($1)")
        .bind(cutoff)
        .fetch_one(pool)
        .await?;
    sqlx::query("ANALYZE run_events").execute(pool).await?;
    Ok(dropped)
}

/// Everything one event transaction writes at its end, for [`write_event`].
#[derive(Debug, Clone)]
pub struct EventWrite<'a> {
    /// The run (its row is locked by the caller).
    pub run_id: Uuid,
    /// Its namespace.
    pub namespace: &'a str,
    /// The run row's new values.
    pub run: RunUpdate<'a>,
    /// The node states the event touched.
    pub nodes: &'a [NodeWrite],
    /// History entries to append.
    pub history: &'a [HistoryWrite],
    /// Task attempts to arm (at most one per node key).
    pub tasks: &'a [crate::tasks::TaskArm<'a>],
    /// Timers to schedule or move (ignored when the run just ended).
    pub timers: &'a [crate::timers::TimerWrite],
    /// Keys of timers to remove (ignored when the run just ended).
    pub cancelled_timers: &'a [String],
    /// The run is paused: tasks are armed HELD (no outbox row) and timers
    /// held, until it resumes.
    pub held: bool,
    /// The committing server publishes the armed tasks itself: the task
    /// rows are their own outbox and no outbox row is written (decision
    /// 0024). False (no publisher): outbox rows, for the enqueuer.
    pub published_by_caller: bool,
}

/// A run to create with its first event's write (see [`write_event`]).
#[derive(Debug, Clone)]
pub struct RunInsert<'a> {
    /// The workflow.
    pub workflow_name: &'a str,
    /// The version.
    pub workflow_version: i32,
    /// The input.
    pub input: &'a Json,
    /// Labels (a JSON object).
    pub labels: &'a Json,
    /// Optional idempotency key.
    pub idempotency_key: Option<&'a str>,
    /// Insert nothing if the workflow has a newer version than this one.
    pub only_if_latest: bool,
    /// The W3C traceparent its spans hang under, if traces are on.
    pub traceparent: Option<&'a str>,
    /// Dispatch priority, 1 to 5.
    pub priority: i16,
}

/// What [`write_event`] wrote.
#[derive(Debug, Clone)]
pub struct EventWritten {
    /// When the run was created.
    pub created_at: DateTime<Utc>,
    /// The outbox messages of the armed tasks.
    pub outbox: Vec<crate::tasks::OutboxMessage>,
    /// The armed tasks leased as they were armed (`TaskArm::lease_to`):
    /// no message, they go to their poll.
    pub leased: Vec<crate::tasks::LeasedTask>,
}

/// The parts of the write statement; each is a data-modifying CTE, so it
/// runs exactly once whether or not the final SELECT reads it.
const UPDATE_RUN: &str = "run_row AS ( \
       UPDATE runs SET status = $2, record = $3, output = COALESCE($4, output), \
         error = COALESCE($5, error), updated_at = now(), \
         ended_at = CASE WHEN $6 THEN now() ELSE ended_at END, \
         history_seq = history_seq + $7 \
       WHERE id = $1 RETURNING history_seq - $7 AS base, created_at, priority)";

/// A new run's row, written with its first event ($20-$27); nothing when
/// the idempotency key is taken or (`$25`) a newer version exists, and then
/// every other part writes nothing either (they read `run_row`).
const INSERT_RUN: &str = "run_row AS ( \
       INSERT INTO runs (id, namespace, workflow_name, workflow_version, status, input, labels, \
         idempotency_key, record, output, error, ended_at, history_seq, traceparent, priority) \
       SELECT $1, $8, $20, $21, $2, $22, $23, $24, $3, $4, $5, CASE WHEN $6 THEN now() END, $7, \
         $26, $27 \
       WHERE NOT ($25 AND EXISTS (SELECT 1 FROM workflow_definitions \
         WHERE namespace = $8 AND name = $20 AND version > $21)) \
       ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
       RETURNING 0::bigint AS base, created_at, priority)";

/// Node rows and history ($13-$19: a history row's first event's offset,
/// its columns and `more`), after `run_row`. A history entry's time is when
/// its statement ran (`clock_timestamp()`), not when its transaction began
/// (`now()`): a group transaction may begin well before an item's event,
/// and a run that waited on another's lock would otherwise be dated
/// before what it waited for. Node rows are updated or inserted by plain
/// statements, as in a group's write (decision 0050).
const WRITE_ROWS: &str = "nodes AS ( \
       SELECT n.* FROM UNNEST($9::text[], $10::text[], $11::jsonb[], $12::bool[]) \
           AS n(k, s, st, e) \
         WHERE EXISTS (SELECT 1 FROM run_row)), \
     node_updated AS ( \
       UPDATE run_nodes SET status = n.s, state = n.st, updated_at = now(), \
         ended_at = CASE WHEN n.e THEN now() END \
         FROM nodes n WHERE run_nodes.run_id = $1 AND run_nodes.node_key = n.k \
       RETURNING run_nodes.node_key), \
     node_rows AS ( \
       INSERT INTO run_nodes (run_id, node_key, status, state, started_at, ended_at) \
       SELECT $1, n.k, n.s, n.st, now(), CASE WHEN n.e THEN now() END FROM nodes n \
         WHERE NOT EXISTS (SELECT 1 FROM node_updated u WHERE u.node_key = n.k)), \
     history AS ( \
       INSERT INTO run_events (run_id, seq, namespace, event_type, node_key, attempt, actor, \
         details, more, created_at) \
       SELECT $1, run_row.base + h.ord, $8, h.ty, h.node, h.attempt, h.actor, h.details, h.more, \
         clock_timestamp() \
         FROM run_row, UNNEST($13::bigint[], $14::text[], $15::text[], $16::int[], $17::text[], \
           $18::jsonb[], $19::jsonb[]) AS h(ord, ty, node, attempt, actor, details, more))";

/// Arms tasks and queues them; parameters from `$n`. `held` (the run is
/// paused): the tasks are HELD and get no outbox row. A task whose
/// concurrency key is full is WAITING_SLOT (the `tasks_take_slot` trigger
/// on INSERT, whose decision a re-armed row takes through EXCLUDED) and
/// gets none either. `outbox`: DISPATCHED tasks get an outbox row;
/// without it the task rows are their own outbox (decision 0024) and
/// `queued` reads them from `armed`.
fn write_tasks(n: usize, held: bool, outbox: bool) -> String {
    let p = |i: usize| format!("${}", n + i);
    let status = if held { "'HELD'" } else { "'DISPATCHED'" };
    format!(
        "armed AS ( \
           INSERT INTO tasks (id, namespace, run_id, node_key, workflow_name, workflow_version, \
             queue, task_name, status, attempt, input, heartbeat_timeout_ms, attempt_timeout_ms, \
             dispatched_at, traceparent, priority, rate_limit_key, concurrency_node, \
             concurrency_key, concurrency_max) \
           SELECT a.id, $8, $1, a.node, {wf}, {ver}, a.queue, a.task_name, {status}, \
             a.attempt, a.input, a.heartbeat, a.timeout, now(), {trace}::text, \
             (SELECT priority FROM run_row), a.rate_key, a.slot_node, a.slot_key, a.slot_max \
             FROM UNNEST({ids}::uuid[], {nodes}::text[], {queues}::text[], {names}::text[], \
               {attempts}::int[], {inputs}::jsonb[], {beats}::bigint[], {timeouts}::bigint[], \
               {keys}::text[], {slot_nodes}::text[], {slot_keys}::text[], {slot_maxes}::int[]) \
               AS a(id, node, queue, task_name, attempt, input, heartbeat, timeout, rate_key, \
                 slot_node, slot_key, slot_max) \
             WHERE EXISTS (SELECT 1 FROM run_row) \
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
         {queued}",
        queued = if outbox {
            QUEUE_IN_OUTBOX
        } else {
            QUEUE_IN_TASKS
        },
        ids = p(0),
        nodes = p(1),
        queues = p(2),
        names = p(3),
        attempts = p(4),
        inputs = p(5),
        beats = p(6),
        timeouts = p(7),
        wf = p(8),
        ver = p(9),
        trace = p(10),
        keys = p(11),
        slot_nodes = p(12),
        slot_keys = p(13),
        slot_maxes = p(14),
    )
}

/// The armed DISPATCHED tasks' messages, as outbox rows.
const QUEUE_IN_OUTBOX: &str = "queued AS ( \
       INSERT INTO outbox (namespace, queue, task_id, attempt, shard_key, priority) \
       SELECT namespace, queue, id, attempt, run_id, priority FROM armed \
       WHERE status = 'DISPATCHED' \
       RETURNING id, namespace, queue, task_id, attempt, shard_key, priority)";

/// The armed DISPATCHED tasks' messages, read from the task rows: no row
/// is written for them (decision 0024).
const QUEUE_IN_TASKS: &str = "queued AS ( \
       SELECT NULL::bigint AS id, namespace, queue, id AS task_id, attempt, \
         run_id AS shard_key, priority FROM armed WHERE status = 'DISPATCHED')";

/// Schedules (or moves) timers; parameters from `$n`. `held`: the run is
/// paused, the timers wait for its resume.
fn write_timers(n: usize, held: bool) -> String {
    format!(
        "scheduled AS ( \
           INSERT INTO timers (run_id, timer_key, namespace, timer, fire_at, held) \
           SELECT $1, k, $8, t, f, {held} \
             FROM UNNEST(${}::text[], ${}::jsonb[], ${}::timestamptz[]) \
             AS x(k, t, f) WHERE EXISTS (SELECT 1 FROM run_row) \
           ON CONFLICT (run_id, timer_key) DO UPDATE SET timer = EXCLUDED.timer, \
             fire_at = EXCLUDED.fire_at, held = EXCLUDED.held)",
        n,
        n + 1,
        n + 2
    )
}

/// Removes timers by key; parameter `$n`.
fn delete_timers(n: usize) -> String {
    format!(
        "unscheduled AS (DELETE FROM timers WHERE run_id = $1 AND timer_key = ANY(${n}::text[]))"
    )
}

/// What only a live run needs goes when it ends.
const END_RUN: &str = "ended_timers AS (DELETE FROM timers WHERE run_id = $1), \
     ended_tasks AS ( \
       UPDATE tasks SET status = 'CANCELLED', updated_at = now() \
       WHERE run_id = $1 AND status IN ('DISPATCHED', 'LEASED', 'HELD', 'WAITING_SLOT')), \
     ended_waits AS (DELETE FROM event_waits WHERE run_id = $1), \
     ended_events AS (DELETE FROM pending_events WHERE run_id = $1)";

/// Writes the end of an event in ONE statement: the run row (status, record,
/// history sequence), the touched node states, the history entries and, as
/// needed, the armed tasks with their outbox rows, the timers, and (when the
/// run just ended) the removal of its timers, live tasks, waits and pending
/// events. Returns the outbox messages for the committing server to publish.
///
/// One statement instead of one per table is what makes an event cost a few
/// round trips (BENCHMARKS.md); only the parts an event needs are in it, so
/// an event touches no more tables than it writes. The parts touch disjoint
/// rows: the caller writes tasks armed in a run that ends within the same
/// transaction before this statement, and a run that ends schedules nothing.
///
/// With `insert`, the statement creates the run instead of updating it (a
/// StartRun whose first event writes only rows: one round trip, no
/// transaction around it) and returns None, writing nothing, when the run
/// was not inserted.
pub async fn write_event(
    conn: &mut PgConnection,
    write: &EventWrite<'_>,
    insert: Option<&RunInsert<'_>>,
) -> Result<Option<EventWritten>, StoreError> {
    let history = write.history;
    let count = i64::try_from(history.len()).unwrap_or(i64::MAX);
    let h = HistoryColumns::of(history);
    let nodes = write.nodes;
    let tasks = write.tasks;
    let ended = write.run.ended;
    let timers = if ended { &[][..] } else { write.timers };
    let cancelled = if ended {
        &[][..]
    } else {
        write.cancelled_timers
    };
    let mut parts = vec![
        if insert.is_some() {
            INSERT_RUN
        } else {
            UPDATE_RUN
        }
        .to_owned(),
        WRITE_ROWS.to_owned(),
    ];
    let mut next = if insert.is_some() { 28 } else { 20 };
    if !tasks.is_empty() {
        parts.push(write_tasks(next, write.held, !write.published_by_caller));
        next += 15;
    }
    if !timers.is_empty() {
        parts.push(write_timers(next, write.held));
        next += 3;
    }
    if !cancelled.is_empty() {
        parts.push(delete_timers(next));
    }
    if ended && insert.is_none() {
        parts.push(END_RUN.to_owned());
    }
    // one row per outbox message, or one without: none when no run_row
    let result = if tasks.is_empty() {
        "SELECT run_row.created_at, NULL::bigint AS outbox_id, NULL::text AS namespace, \
           NULL::text AS queue, NULL::uuid AS task_id, NULL::int AS attempt, \
           NULL::uuid AS shard_key, NULL::smallint AS priority FROM run_row"
    } else {
        "SELECT run_row.created_at, q.id AS outbox_id, q.namespace, q.queue, q.task_id, \
           q.attempt, q.shard_key, q.priority FROM run_row LEFT JOIN queued q ON true"
    };
    let sql = format!("WITH {} {result}", parts.join(", "));
    // write_event: the whole write side of an event, under the run lock
    let mut query = sqlx::query(&sql)
        .bind(write.run_id)
        .bind(write.run.status)
        .bind(write.run.record)
        .bind(write.run.output)
        .bind(write.run.error)
        .bind(ended)
        .bind(count)
        .bind(write.namespace)
        .bind(nodes.iter().map(|n| n.key.as_str()).collect::<Vec<_>>())
        .bind(nodes.iter().map(|n| n.status.as_str()).collect::<Vec<_>>())
        .bind(nodes.iter().map(|n| &n.state).collect::<Vec<_>>())
        .bind(nodes.iter().map(|n| n.ended).collect::<Vec<_>>());
    query = h.bind(query);
    if let Some(run) = insert {
        query = query
            .bind(run.workflow_name)
            .bind(run.workflow_version)
            .bind(run.input)
            .bind(run.labels)
            .bind(run.idempotency_key)
            .bind(run.only_if_latest)
            .bind(run.traceparent)
            .bind(run.priority);
    }
    if let Some(first) = tasks.first() {
        query = query
            .bind(tasks.iter().map(|t| t.new_id).collect::<Vec<_>>())
            .bind(tasks.iter().map(|t| t.node_key).collect::<Vec<_>>())
            .bind(tasks.iter().map(|t| t.queue).collect::<Vec<_>>())
            .bind(tasks.iter().map(|t| t.task_name).collect::<Vec<_>>())
            .bind(tasks.iter().map(|t| t.attempt).collect::<Vec<_>>())
            .bind(tasks.iter().map(|t| t.input).collect::<Vec<_>>())
            .bind(
                tasks
                    .iter()
                    .map(|t| t.heartbeat_timeout_ms)
                    .collect::<Vec<_>>(),
            )
            .bind(
                tasks
                    .iter()
                    .map(|t| t.attempt_timeout_ms)
                    .collect::<Vec<_>>(),
            )
            .bind(first.workflow_name)
            .bind(first.workflow_version)
            .bind(first.traceparent)
            .bind(tasks.iter().map(|t| t.rate_limit_key).collect::<Vec<_>>())
            .bind(
                tasks
                    .iter()
                    .map(|t| t.concurrency.map(|c| c.node))
                    .collect::<Vec<_>>(),
            )
            .bind(
                tasks
                    .iter()
                    .map(|t| t.concurrency.map(|c| c.key))
                    .collect::<Vec<_>>(),
            )
            .bind(
                tasks
                    .iter()
                    .map(|t| t.concurrency.map(|c| c.max))
                    .collect::<Vec<_>>(),
            );
    }
    if !timers.is_empty() {
        query = query
            .bind(timers.iter().map(|t| t.key.as_str()).collect::<Vec<_>>())
            .bind(timers.iter().map(|t| &t.timer).collect::<Vec<_>>())
            .bind(timers.iter().map(|t| t.fire_at).collect::<Vec<_>>());
    }
    if !cancelled.is_empty() {
        query = query.bind(cancelled);
    }
    let rows = query.fetch_all(conn).await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let created_at: DateTime<Utc> = first.try_get("created_at")?;
    let mut outbox = Vec::with_capacity(rows.len());
    for row in &rows {
        if row.try_get::<Option<Uuid>, _>("task_id")?.is_some() {
            outbox.push(crate::tasks::outbox_from_row(row)?);
        }
    }
    Ok(Some(EventWritten {
        created_at,
        outbox,
        leased: Vec::new(),
    }))
}

/// A report's lease and the outcome it records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportLease<'a> {
    /// The task.
    pub task_id: Uuid,
    /// The attempt.
    pub attempt: i32,
    /// The fencing token.
    pub lease_token: Uuid,
    /// COMPLETED or FAILED.
    pub outcome: &'a str,
}

/// What [`lock_runs_fence_and_load`] found for one run.
#[derive(Debug, Clone)]
pub struct FencedReports {
    /// The locked run.
    pub run: RunRow,
    /// Per lease, in order: true when it held and the task now has its
    /// outcome.
    pub applied: Vec<bool>,
    /// Per lease: the worker that held it, when it applied.
    pub holders: Vec<Option<String>>,
    /// Per lease: the same outcome was already recorded for it (as read by
    /// the statement's snapshot: trust it only if `consistent`).
    pub repeat: Vec<bool>,
    /// No event of the run committed between the statement's snapshot and
    /// its lock: `repeat` and `nodes` are current.
    pub consistent: bool,
    /// The node rows asked for that exist (when `consistent`).
    pub nodes: Vec<(String, Json)>,
}

/// One run's part of [`lock_runs_fence_and_load`]: the run, its
/// namespace, the leases its reports end, and the node rows its events need.
#[derive(Debug, Clone, Copy)]
pub struct RunReports<'a> {
    /// The run.
    pub run_id: Uuid,
    /// Its namespace: a run of another namespace is not found.
    pub namespace: &'a str,
    /// The leases the reports end; distinct tasks.
    pub leases: &'a [ReportLease<'a>],
    /// The node rows to read.
    pub keys: &'a [String],
}

/// Reports of several runs in ONE statement, for the server that leased
/// the tasks (it knows their runs, workflows and nodes, so which node rows
/// the events need): lock the runs in id order, record each outcome fenced
/// by its lease, and read each run's node rows. One statement for a group
/// of runs rather than one per run: the per-statement cost (executor
/// start, a round trip) was most of what locking a run cost.
///
/// Each fence is an UPDATE of a run already locked, which re-checks the
/// newest version of the task row whatever the snapshot. The reads use the
/// snapshot taken before the locks; for a run they are current only if no
/// event of it committed in between, which its row's version (`xmin`)
/// before and after the lock tells (`consistent`). Returns one answer per
/// request, in order; None: no such run in that namespace. Lock the runs of
/// a transaction through one call, or in id order across calls.
pub async fn lock_runs_fence_and_load(
    conn: &mut PgConnection,
    requests: &[RunReports<'_>],
) -> Result<Vec<Option<FencedReports>>, StoreError> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let mut lease_runs = Vec::new();
    let mut key_runs = Vec::new();
    let mut keys: Vec<&str> = Vec::new();
    let mut leases: Vec<&ReportLease<'_>> = Vec::new();
    for request in requests {
        lease_runs.extend(request.leases.iter().map(|_| request.run_id));
        leases.extend(request.leases);
        key_runs.extend(request.keys.iter().map(|_| request.run_id));
        keys.extend(request.keys.iter().map(String::as_str));
    }
    // lock_runs_fence_and_load: the run locks first, in id order (each
    // fence waits on its run's through `locked`). Tasks and node rows are
    // found by their keys only: a run of 10,000 branches has 10,000 of
    // each, so no plan may reach them through the run id. Hence the task's
    // run is compared with IS NOT DISTINCT FROM (which no index serves, so
    // the primary key does), and the node rows are read in a CTE of their
    // own, driven by the (run, key) pairs asked for: each pair a LATERAL
    // probe with a LIMIT, which is never flattened into a join. As a join,
    // a generic plan made while `run_nodes` looked small (emptied, or not
    // analyzed yet) was a hash join over a sequential scan, and it stayed
    // as the table grew: each event of a 10,000-step run read every node
    // row (BENCHMARKS.md, B7, 2026-12-03). Each run's answers are
    // aggregated once, by joins, not read by a scan of every lease for
    // each run: a group of 48 runs with one report each made that 48 × 48
    // rows visited four times over (decision 0062).
    let rows = sqlx::query(&format!(
        "WITH wanted AS (SELECT * FROM UNNEST($1::uuid[], $2::text[]) AS w(id, namespace)), \
         locked AS ( \
           SELECT {RUN_COLUMNS}, xmin::text AS locked_version FROM runs \
           WHERE id = ANY($1::uuid[]) AND (id, namespace) IN (SELECT id, namespace FROM wanted) \
           ORDER BY id FOR UPDATE), \
         lease AS ( \
           SELECT * FROM UNNEST($3::uuid[], $4::uuid[], $5::int[], $6::uuid[], $7::text[]) \
             WITH ORDINALITY AS l(run_id, id, attempt, token, outcome, ord)), \
         finished AS ( \
           UPDATE tasks t SET status = l.outcome, outcome = l.outcome, lease_expires_at = NULL, \
             updated_at = now() \
           FROM lease l \
           WHERE t.id = ANY($4::uuid[]) AND t.id = l.id AND t.attempt = l.attempt \
             AND t.lease_token = l.token AND t.status = 'LEASED' \
             AND t.run_id IS NOT DISTINCT FROM l.run_id \
             AND EXISTS (SELECT 1 FROM locked WHERE locked.id = l.run_id) \
           RETURNING t.id, t.lease_owner), \
         answers AS MATERIALIZED ( \
           SELECT l.run_id, \
             array_agg(f.id IS NOT NULL ORDER BY l.ord) AS applied, \
             array_agg(f.lease_owner ORDER BY l.ord) AS holders, \
             array_agg(CASE WHEN f.id IS NULL THEN COALESCE((SELECT t.outcome = l.outcome \
                 FROM tasks t WHERE t.id = l.id AND t.attempt = l.attempt \
                   AND t.lease_token = l.token), false) ELSE false END \
               ORDER BY l.ord) AS repeat \
           FROM lease l LEFT JOIN finished f ON f.id = l.id \
           GROUP BY l.run_id), \
         nodes AS MATERIALIZED ( \
           SELECT k.run_id, array_agg(n.node_key ORDER BY n.node_key) AS node_keys, \
             array_agg(n.state ORDER BY n.node_key) AS node_states \
           FROM UNNEST($8::uuid[], $9::text[]) AS k(run_id, key) \
           CROSS JOIN LATERAL (SELECT n.node_key, n.state FROM run_nodes n \
             WHERE n.run_id = k.run_id AND n.node_key = k.key LIMIT 1) n \
           GROUP BY k.run_id) \
         SELECT locked.*, \
           (SELECT xmin::text FROM runs r WHERE r.id = locked.id) AS seen_version, \
           COALESCE(a.applied, '{{}}') AS applied, COALESCE(a.holders, '{{}}') AS holders, \
           COALESCE(a.repeat, '{{}}') AS repeat, COALESCE(nodes.node_keys, '{{}}') AS node_keys, \
           COALESCE(nodes.node_states, '{{}}') AS node_states \
         FROM locked LEFT JOIN answers a ON a.run_id = locked.id \
           LEFT JOIN nodes ON nodes.run_id = locked.id"
    ))
    .bind(requests.iter().map(|r| r.run_id).collect::<Vec<_>>())
    .bind(requests.iter().map(|r| r.namespace).collect::<Vec<_>>())
    .bind(lease_runs)
    .bind(leases.iter().map(|l| l.task_id).collect::<Vec<_>>())
    .bind(leases.iter().map(|l| l.attempt).collect::<Vec<_>>())
    .bind(leases.iter().map(|l| l.lease_token).collect::<Vec<_>>())
    .bind(leases.iter().map(|l| l.outcome).collect::<Vec<_>>())
    .bind(key_runs)
    .bind(keys)
    .fetch_all(conn)
    .await?;
    let mut found = std::collections::HashMap::with_capacity(rows.len());
    for row in &rows {
        let fenced = fenced_from_row(row)?;
        found.insert(fenced.run.id, fenced);
    }
    Ok(requests.iter().map(|r| found.remove(&r.run_id)).collect())
}

fn fenced_from_row(row: &PgRow) -> Result<FencedReports, StoreError> {
    let locked: String = row.try_get("locked_version")?;
    let seen: Option<String> = row.try_get("seen_version")?;
    let node_keys: Vec<String> = row.try_get("node_keys")?;
    let states: Vec<Json> = row.try_get("node_states")?;
    Ok(FencedReports {
        run: run_from_row(row)?,
        applied: row.try_get("applied")?,
        holders: row.try_get("holders")?,
        repeat: row.try_get("repeat")?,
        consistent: seen.as_deref() == Some(locked.as_str()),
        nodes: node_keys.into_iter().zip(states).collect(),
    })
}

/// Locks the run a task belongs to, as [`lock_run`] does, and returns it with
/// the task's node key and queue. None: no such task in `namespace`.
pub async fn lock_run_of_task(
    conn: &mut PgConnection,
    scope: &crate::tasks::TaskScope,
    task_id: Uuid,
) -> Result<Option<(RunRow, String, String)>, StoreError> {
    // lock_run_of_task: the task's run and node never change, so reading
    // them without a lock is safe; the run row lock serialises the event.
    // Only a task inside the caller's scope is found.
    let row = sqlx::query(&format!(
        "WITH task AS ( \
           SELECT run_id, node_key, queue FROM tasks WHERE id = $1 AND {}) \
         SELECT {RUN_COLUMNS}, (SELECT node_key FROM task) AS task_node_key, \
           (SELECT queue FROM task) AS task_queue FROM runs \
         WHERE id = (SELECT run_id FROM task) FOR UPDATE",
        crate::tasks::scope_condition(2, 3)
    ))
    .bind(task_id)
    .bind(&scope.namespace)
    .bind(scope.queues.as_deref())
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let node_key: String = row.try_get("task_node_key")?;
    let queue: String = row.try_get("task_queue")?;
    Ok(Some((run_from_row(&row)?, node_key, queue)))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::successor;

    proptest! {
        /// The search's range holds exactly the texts with the prefix:
        /// String's order is byte order, the order of COLLATE "C".
        #[test]
        fn a_text_is_in_the_range_of_a_prefix_exactly_when_it_starts_with_it(
            prefix in "\\PC{0,6}|[a\u{10FFFF}]{1,3}",
            rest in "\\PC{0,4}|\u{10FFFF}{1,2}",
            other in "\\PC{0,8}",
        ) {
            for text in [format!("{prefix}{rest}"), other] {
                let above = successor(&prefix).is_none_or(|to| text < to);
                prop_assert_eq!(text.starts_with(&prefix), text >= prefix && above, "{:?}", text);
            }
        }
    }

    #[test]
    fn the_successor_moves_the_last_character_that_has_a_next_one() {
        assert_eq!(successor("order-4"), Some("order-5".to_owned()));
        assert_eq!(successor("a\u{10FFFF}"), Some("b".to_owned()));
        assert_eq!(successor("\u{D7FF}"), Some("\u{E000}".to_owned()));
        assert_eq!(successor("\u{10FFFF}"), None);
    }
}
