//! The write side of several runs' events in ONE statement: what a group
//! commit's report batches write (decision 0026). Each run's part is what
//! [`write_event`] writes for it alone; the statement only saves the
//! per-statement cost (a round trip, executor start-up and shut-down) of
//! every run after the first.

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
};

use chrono::{DateTime, Utc};
use serde_json::Value as Json;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use crate::{
    StoreError,
    history_rows::{HistoryColumns, rows_of},
    runs::{EventWrite, EventWritten, RunInsert, write_event},
    tasks::{leased_from_row, outbox_from_row},
};

/// The runs' new values (`$1`–`$7`), one row per run.
const RUN_VALUES: &str = "r AS ( \
       SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::jsonb[], \
         $6::bool[], $7::bigint[]) WITH ORDINALITY \
         AS r(id, status, record, output, error, ended, count, ord))";

/// The runs' rows, updated. `runs.id = ANY($1)` keeps the plan on the
/// primary key (the same for every run of any size).
const UPDATE_RUNS: &str = "run_row AS ( \
       UPDATE runs SET status = r.status, record = r.record, \
         output = COALESCE(r.output, runs.output), error = COALESCE(r.error, runs.error), \
         updated_at = now(), ended_at = CASE WHEN r.ended THEN now() ELSE runs.ended_at END, \
         history_seq = runs.history_seq + r.count \
       FROM r WHERE runs.id = ANY($1::uuid[]) AND runs.id = r.id \
       RETURNING runs.id, runs.history_seq - r.count AS base, runs.created_at, runs.priority)";

/// New runs' rows (`$22`–`$30`, in the order of `$1`), as StartRun writes
/// them: none where the idempotency key is taken (by a committed run or an
/// earlier row of this statement) or, when asked, a newer version exists.
/// Runs without a key are inserted by a plain statement: `ON CONFLICT`
/// made each insert a speculative one, with a confirmation record, though
/// a run without a key conflicts with none (decision 0060). Made once.
static INSERT_RUN_ROWS: std::sync::LazyLock<String> = std::sync::LazyLock::new(insert_run_rows);

/// The text of [`INSERT_RUN_ROWS`].
fn insert_run_rows() -> String {
    let insert = |keyed: bool| {
        let (which, conflict) = if keyed {
            (
                "IS NOT NULL",
                "ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL \
                 DO NOTHING",
            )
        } else {
            ("IS NULL", "")
        };
        format!(
            "INSERT INTO runs (id, namespace, workflow_name, workflow_version, status, input, \
               labels, idempotency_key, record, output, error, ended_at, history_seq, \
               traceparent, priority) \
             SELECT r.id, f.ns, f.wf, f.ver, r.status, f.input, f.labels, f.key, r.record, \
               r.output, r.error, CASE WHEN r.ended THEN now() END, r.count, f.trace, f.priority \
               FROM r JOIN fresh f ON f.ord = r.ord \
               WHERE f.key {which} AND NOT (f.only_if_latest AND EXISTS (SELECT 1 \
                 FROM workflow_definitions d \
                 WHERE d.namespace = f.ns AND d.name = f.wf AND d.version > f.ver)) \
               ORDER BY r.ord \
             {conflict} RETURNING id, 0::bigint AS base, created_at, priority"
        )
    };
    format!(
        "fresh AS ( \
           SELECT * FROM UNNEST($22::text[], $23::text[], $24::int[], $25::jsonb[], \
             $26::jsonb[], $27::text[], $28::bool[], $29::text[], $30::smallint[]) \
             WITH ORDINALITY AS f(ns, wf, ver, input, labels, key, only_if_latest, trace, \
               priority, ord)), \
         keyed_runs AS ({}), \
         plain_runs AS ({}), \
         run_row AS (SELECT * FROM keyed_runs UNION ALL SELECT * FROM plain_runs)",
        insert(true),
        insert(false)
    )
}

/// Node rows (`$8`–`$12`) and history rows (`$13`–`$21`: a row's run, its
/// namespace, its first event's offset in its run's write, its columns and
/// `more`). Every part joins `run_row`, so a run whose row is gone (or was not inserted) writes
/// nothing, as alone. A node's row is updated where it exists and inserted
/// where not, by plain statements: the run's lock keeps every other writer
/// of its nodes out, and `ON CONFLICT DO UPDATE` wrote a row lock and an
/// insert's confirmation to the WAL besides (decision 0050).
const NODES_HISTORY: &str = "nodes AS ( \
       SELECT n.* FROM UNNEST($8::uuid[], $9::text[], $10::text[], $11::jsonb[], $12::bool[]) \
           AS n(run_id, k, s, st, e) \
         WHERE n.run_id IN (SELECT id FROM run_row)), \
     node_updated AS ( \
       UPDATE run_nodes SET status = n.s, state = n.st, updated_at = now(), \
         ended_at = CASE WHEN n.e THEN now() END \
         FROM nodes n WHERE run_nodes.run_id = n.run_id AND run_nodes.node_key = n.k \
       RETURNING run_nodes.run_id, run_nodes.node_key), \
     node_rows AS ( \
       INSERT INTO run_nodes (run_id, node_key, status, state, started_at, ended_at) \
       SELECT n.run_id, n.k, n.s, n.st, now(), CASE WHEN n.e THEN now() END FROM nodes n \
         WHERE NOT EXISTS (SELECT 1 FROM node_updated u \
           WHERE u.run_id = n.run_id AND u.node_key = n.k)), \
     history AS ( \
       INSERT INTO run_events (run_id, seq, namespace, event_type, node_key, attempt, actor, \
         details, more, created_at) \
       SELECT h.run_id, run_row.base + h.ord, h.ns, h.ty, h.node, h.attempt, h.actor, \
         h.details, h.more, clock_timestamp() \
         FROM UNNEST($13::uuid[], $14::text[], $15::bigint[], $16::text[], $17::text[], \
           $18::int[], $19::text[], $20::jsonb[], $21::jsonb[]) \
           AS h(run_id, ns, ord, ty, node, attempt, actor, details, more) \
         JOIN run_row ON run_row.id = h.run_id)";

/// Armed tasks (16 parameters from `$n`), DISPATCHED, or LEASED where a
/// lease owner is given (decision 0051: one row write where the hand-off
/// wrote two, with the lease [`crate::tasks::lease_tasks`] would give);
/// only writes without a concurrency slot or a pause come here, so no
/// trigger changes their status. Their messages are `queued`:
/// [`queue_in_tasks`] or [`QUEUE_IN_OUTBOX`]. A node's task row is
/// updated where it exists (a retry, a loop) and inserted where not, by
/// plain statements as node rows are: the run's lock keeps every other
/// armer of its tasks out, and `ON CONFLICT DO UPDATE` made each insert a
/// speculative one, with a confirmation record besides (decision 0060).
fn arm_tasks(n: usize) -> String {
    let [
        ids,
        runs,
        namespaces,
        nodes,
        queues,
        names,
        attempts,
        inputs,
        beats,
        timeouts,
        workflows,
        versions,
        traces,
        rate_keys,
        owners,
        receipts,
    ] = std::array::from_fn(|i| format!("${}", n + i));
    format!(
        "arms AS ( \
       SELECT a.*, run_row.priority, \
         CASE WHEN a.owner IS NULL THEN 'DISPATCHED' ELSE 'LEASED' END AS status, \
         CASE WHEN a.owner IS NOT NULL THEN gen_random_uuid() END AS lease_token, \
         CASE WHEN a.owner IS NOT NULL THEN now() + make_interval(secs => \
           LEAST(a.heartbeat, COALESCE(a.receipt, a.heartbeat)) / 1000.0) END AS expires, \
         CASE WHEN a.owner IS NOT NULL AND a.receipt IS NOT NULL THEN false END AS confirmed, \
         CASE WHEN a.owner IS NOT NULL AND a.timeout IS NOT NULL \
           THEN now() + make_interval(secs => a.timeout / 1000.0) END AS deadline \
         FROM UNNEST({ids}::uuid[], {runs}::uuid[], {namespaces}::text[], {nodes}::text[], \
           {queues}::text[], {names}::text[], {attempts}::int[], {inputs}::jsonb[], \
           {beats}::bigint[], {timeouts}::bigint[], {workflows}::text[], {versions}::int[], \
           {traces}::text[], {rate_keys}::text[], {owners}::text[], {receipts}::bigint[]) \
           AS a(id, run_id, ns, node, queue, task_name, attempt, input, heartbeat, timeout, wf, \
             ver, trace, rate_key, owner, receipt) \
         JOIN run_row ON run_row.id = a.run_id), \
     rearmed AS ( \
       UPDATE tasks SET queue = a.queue, task_name = a.task_name, status = a.status, \
         attempt = a.attempt, input = a.input, heartbeat_timeout_ms = a.heartbeat, \
         attempt_timeout_ms = a.timeout, lease_token = a.lease_token, lease_owner = a.owner, \
         lease_expires_at = a.expires, lease_confirmed = a.confirmed, \
         attempt_deadline = a.deadline, outcome = NULL, handbacks = 0, dispatched_at = now(), \
         updated_at = now(), traceparent = a.trace, priority = a.priority, \
         rate_limit_key = a.rate_key, concurrency_node = NULL, concurrency_key = NULL, \
         concurrency_max = NULL, concurrency_seq = NULL \
         FROM arms a WHERE tasks.run_id = a.run_id AND tasks.node_key = a.node \
       RETURNING {ARMED_COLUMNS}), \
     first_armed AS ( \
       INSERT INTO tasks (id, namespace, run_id, node_key, workflow_name, workflow_version, \
         queue, task_name, status, attempt, input, heartbeat_timeout_ms, attempt_timeout_ms, \
         dispatched_at, traceparent, priority, rate_limit_key, lease_token, lease_owner, \
         lease_expires_at, lease_confirmed, attempt_deadline) \
       SELECT a.id, a.ns, a.run_id, a.node, a.wf, a.ver, a.queue, a.task_name, a.status, \
         a.attempt, a.input, a.heartbeat, a.timeout, now(), a.trace, a.priority, a.rate_key, \
         a.lease_token, a.owner, a.expires, a.confirmed, a.deadline \
         FROM arms a \
         WHERE NOT EXISTS (SELECT 1 FROM rearmed r \
           WHERE r.run_id = a.run_id AND r.node_key = a.node) \
       RETURNING {ARMED_COLUMNS}), \
     armed AS (SELECT * FROM rearmed UNION ALL SELECT * FROM first_armed)"
    )
}

/// What the armed tasks' messages are made of, from their rows.
const ARMED_COLUMNS: &str = "tasks.id, tasks.namespace, tasks.queue, tasks.attempt, \
     tasks.run_id, tasks.priority, tasks.status = 'LEASED' AS leased, tasks.node_key, \
     tasks.workflow_name, tasks.workflow_version, tasks.task_name, \
     CASE WHEN tasks.status = 'LEASED' THEN tasks.input END AS input, \
     tasks.heartbeat_timeout_ms, tasks.lease_token, tasks.lease_expires_at, \
     tasks.attempt_deadline, tasks.dispatched_at, tasks.traceparent";

/// What a task leased as it was armed is sent with (NULL for the others).
const LEASED_COLUMNS: &str = "leased, node_key, workflow_name, workflow_version, task_name, \
     input, heartbeat_timeout_ms, lease_token, lease_expires_at, attempt_deadline, \
     dispatched_at, traceparent";

/// The armed tasks' messages read from their rows, which are their own
/// outbox (decision 0024): the caller publishes them, and sends the leased
/// ones to their poll.
fn queue_in_tasks() -> String {
    format!(
        "queued AS ( \
       SELECT NULL::bigint AS id, namespace, queue, id AS task_id, attempt, \
         run_id AS shard_key, priority, {LEASED_COLUMNS} FROM armed)"
    )
}

/// The armed tasks' messages as outbox rows, for the enqueuer (no
/// publisher here, so none is leased as it is armed).
const QUEUE_IN_OUTBOX: &str = "queued AS ( \
       INSERT INTO outbox (namespace, queue, task_id, attempt, shard_key, priority) \
       SELECT namespace, queue, id, attempt, run_id, priority FROM armed \
       RETURNING id, namespace, queue, task_id, attempt, shard_key, priority, false AS leased, \
         NULL::text AS node_key, NULL::text AS workflow_name, NULL::int AS workflow_version, \
         NULL::text AS task_name, NULL::jsonb AS input, NULL::bigint AS heartbeat_timeout_ms, \
         NULL::uuid AS lease_token, NULL::timestamptz AS lease_expires_at, \
         NULL::timestamptz AS attempt_deadline, NULL::timestamptz AS dispatched_at, \
         NULL::text AS traceparent)";

/// Timers to schedule or move, of runs that did not end; from `$n`.
fn schedule_timers(n: usize) -> String {
    format!(
        "scheduled AS ( \
           INSERT INTO timers (run_id, timer_key, namespace, timer, fire_at, held) \
           SELECT x.run_id, x.k, x.ns, x.t, x.f, false \
             FROM UNNEST(${}::uuid[], ${}::text[], ${}::text[], ${}::jsonb[], \
               ${}::timestamptz[]) AS x(run_id, k, ns, t, f) \
             JOIN run_row ON run_row.id = x.run_id \
           ON CONFLICT (run_id, timer_key) DO UPDATE SET timer = EXCLUDED.timer, \
             fire_at = EXCLUDED.fire_at, held = EXCLUDED.held)",
        n,
        n + 1,
        n + 2,
        n + 3,
        n + 4
    )
}

/// Timers to remove by (run, key), of runs that did not end; from `$n`.
fn unschedule_timers(n: usize) -> String {
    format!(
        "unscheduled AS ( \
           DELETE FROM timers WHERE run_id = ANY(${n}::uuid[]) \
             AND (run_id, timer_key) IN (SELECT * FROM UNNEST(${n}::uuid[], ${}::text[])))",
        n + 1
    )
}

/// What only a live run needs goes when it ends: runs `$n`.
fn end_runs(n: usize) -> String {
    format!(
        "ended_timers AS (DELETE FROM timers WHERE run_id = ANY(${n}::uuid[])), \
         ended_tasks AS ( \
           UPDATE tasks SET status = 'CANCELLED', updated_at = now() \
           WHERE run_id = ANY(${n}::uuid[]) \
             AND status IN ('DISPATCHED', 'LEASED', 'HELD', 'WAITING_SLOT')), \
         ended_waits AS (DELETE FROM event_waits WHERE run_id = ANY(${n}::uuid[])), \
         ended_events AS (DELETE FROM pending_events WHERE run_id = ANY(${n}::uuid[]))"
    )
}

/// True when `write` can share the statement: its tasks are plain
/// DISPATCHED rows (no pause, no concurrency slot, whose triggers lock
/// slot rows in a set order), published as the statement's are.
fn shareable(write: &EventWrite<'_>, published_by_caller: bool) -> bool {
    write.published_by_caller == published_by_caller
        && !write.held
        && write.tasks.iter().all(|task| task.concurrency.is_none())
}

/// What [`write_events`] or [`insert_runs`] wrote.
#[derive(Debug)]
pub struct EventsWritten {
    /// One answer per write, in order; None: its run's row is gone (or was
    /// not inserted).
    pub per_write: Vec<Option<EventWritten>>,
    /// The writes that shared one statement (0 or at least 2).
    pub shared: usize,
}

/// Writes the events of several locked runs, each as [`write_event`] would
/// (without an insert), in as few statements as it can: one for every
/// write that can share it, one each for the others (a paused run, a
/// task with a concurrency slot, a second write of the same run, which
/// follows the first).
pub async fn write_events(
    conn: &mut PgConnection,
    writes: &[EventWrite<'_>],
) -> Result<EventsWritten, StoreError> {
    write_grouped(conn, writes, None).await
}

/// Inserts new runs with their first events' writes, each as
/// [`write_event`] with its `RunInsert` would, in as few statements as
/// [`write_events`]. The runs' idempotency keys are taken in the order
/// given; a key taken by an earlier run of the same call leaves a later
/// one uninserted (None), as a committed run's would.
pub async fn insert_runs(
    conn: &mut PgConnection,
    writes: &[EventWrite<'_>],
    inserts: &[RunInsert<'_>],
) -> Result<EventsWritten, StoreError> {
    if writes.len() != inserts.len() {
        return Err(StoreError::Database(sqlx::Error::Protocol(
            "insert_runs: one RunInsert per write".to_owned(),
        )));
    }
    write_grouped(conn, writes, Some(inserts)).await
}

async fn write_grouped(
    conn: &mut PgConnection,
    writes: &[EventWrite<'_>],
    inserts: Option<&[RunInsert<'_>]>,
) -> Result<EventsWritten, StoreError> {
    let mut answers: Vec<Option<Option<EventWritten>>> = writes.iter().map(|_| None).collect();
    let mut runs = HashSet::with_capacity(writes.len());
    let mut shared = Vec::with_capacity(writes.len());
    let mut alone = Vec::new();
    let published_by_caller = writes.first().is_some_and(|w| w.published_by_caller);
    for (index, write) in writes.iter().enumerate() {
        if runs.insert(write.run_id) && shareable(write, published_by_caller) {
            shared.push(index);
        } else {
            alone.push(index);
        }
    }
    if let [only] = shared[..] {
        // one run: its own statement's shape (and plan) is the cheaper
        alone.push(only);
        shared.clear();
    }
    if !shared.is_empty() {
        let together: Vec<&EventWrite<'_>> = shared.iter().map(|&i| &writes[i]).collect();
        let fresh: Option<Vec<&RunInsert<'_>>> =
            inserts.map(|inserts| shared.iter().map(|&i| &inserts[i]).collect());
        let mut written =
            write_shared(conn, &together, fresh.as_deref(), published_by_caller).await?;
        for &index in &shared {
            answers[index] = Some(written.remove(&writes[index].run_id));
        }
    }
    // in their order: a run's second write follows its first
    alone.sort_unstable();
    for index in alone {
        let insert = inserts.map(|inserts| &inserts[index]);
        answers[index] = Some(write_event(conn, &writes[index], insert).await?);
    }
    Ok(EventsWritten {
        per_write: answers.into_iter().map(Option::flatten).collect(),
        shared: shared.len(),
    })
}

/// The columns of the shared statement, one array per parameter.
#[derive(Default)]
struct Columns<'a> {
    run_ids: Vec<Uuid>,
    statuses: Vec<&'a str>,
    records: Vec<&'a Json>,
    outputs: Vec<Option<&'a Json>>,
    errors: Vec<Option<&'a Json>>,
    ended: Vec<bool>,
    counts: Vec<i64>,
    node_runs: Vec<Uuid>,
    node_keys: Vec<&'a str>,
    node_statuses: Vec<&'a str>,
    node_states: Vec<&'a Json>,
    node_ended: Vec<bool>,
    history_runs: Vec<Uuid>,
    history_namespaces: Vec<&'a str>,
    history: HistoryColumns<'a>,
    task_ids: Vec<Uuid>,
    task_runs: Vec<Uuid>,
    task_namespaces: Vec<&'a str>,
    task_nodes: Vec<&'a str>,
    task_queues: Vec<&'a str>,
    task_names: Vec<&'a str>,
    task_attempts: Vec<i32>,
    task_inputs: Vec<&'a Json>,
    task_heartbeats: Vec<i64>,
    task_timeouts: Vec<Option<i64>>,
    task_workflows: Vec<&'a str>,
    task_versions: Vec<i32>,
    task_traces: Vec<Option<&'a str>>,
    task_rate_keys: Vec<Option<&'a str>>,
    task_lease_owners: Vec<Option<&'a str>>,
    task_lease_receipts: Vec<Option<i64>>,
    timer_runs: Vec<Uuid>,
    timer_keys: Vec<&'a str>,
    timer_namespaces: Vec<&'a str>,
    timer_values: Vec<&'a Json>,
    timer_fire_at: Vec<DateTime<Utc>>,
    unscheduled_runs: Vec<Uuid>,
    unscheduled_keys: Vec<&'a str>,
    ended_runs: Vec<Uuid>,
}

impl<'a> Columns<'a> {
    fn add(&mut self, write: &'a EventWrite<'a>) {
        let run_id = write.run_id;
        let ended = write.run.ended;
        self.run_ids.push(run_id);
        self.statuses.push(write.run.status);
        self.records.push(write.run.record);
        self.outputs.push(write.run.output);
        self.errors.push(write.run.error);
        self.ended.push(ended);
        self.counts
            .push(i64::try_from(write.history.len()).unwrap_or(i64::MAX));
        for node in write.nodes {
            self.node_runs.push(run_id);
            self.node_keys.push(&node.key);
            self.node_statuses.push(&node.status);
            self.node_states.push(&node.state);
            self.node_ended.push(node.ended);
        }
        for row in rows_of(write.history) {
            self.history_runs.push(run_id);
            self.history_namespaces.push(write.namespace);
            self.history.push(row);
        }
        for task in write.tasks {
            self.task_ids.push(task.new_id);
            self.task_runs.push(run_id);
            self.task_namespaces.push(write.namespace);
            self.task_nodes.push(task.node_key);
            self.task_queues.push(task.queue);
            self.task_names.push(task.task_name);
            self.task_attempts.push(task.attempt);
            self.task_inputs.push(task.input);
            self.task_heartbeats.push(task.heartbeat_timeout_ms);
            self.task_timeouts.push(task.attempt_timeout_ms);
            self.task_workflows.push(task.workflow_name);
            self.task_versions.push(task.workflow_version);
            self.task_traces.push(task.traceparent);
            self.task_rate_keys.push(task.rate_limit_key);
            // leased as armed only where its message would be the caller's
            // to send, and no slot or pause decides its status
            let lease = task
                .lease_to
                .filter(|_| write.published_by_caller && !write.held && task.concurrency.is_none());
            self.task_lease_owners.push(lease.map(|l| l.owner));
            self.task_lease_receipts
                .push(lease.and_then(|l| l.receipt_ms));
        }
        if ended {
            // a run that ends schedules nothing, and loses every timer
            self.ended_runs.push(run_id);
            return;
        }
        for timer in write.timers {
            self.timer_runs.push(run_id);
            self.timer_keys.push(&timer.key);
            self.timer_namespaces.push(write.namespace);
            self.timer_values.push(&timer.timer);
            self.timer_fire_at.push(timer.fire_at);
        }
        for key in write.cancelled_timers {
            self.unscheduled_runs.push(run_id);
            self.unscheduled_keys.push(key);
        }
    }
}

/// The shared statement (inserting the runs with `inserts`, else
/// updating them); its answers by run.
async fn write_shared(
    conn: &mut PgConnection,
    writes: &[&EventWrite<'_>],
    inserts: Option<&[&RunInsert<'_>]>,
    published_by_caller: bool,
) -> Result<HashMap<Uuid, EventWritten>, StoreError> {
    let mut columns = Columns::default();
    for write in writes {
        columns.add(write);
    }
    // the constant parts borrowed, not copied, into the statement's text
    let mut parts: Vec<Cow<'static, str>> = vec![RUN_VALUES.into()];
    let mut next = 22;
    match inserts {
        Some(_) => {
            parts.push(INSERT_RUN_ROWS.as_str().into());
            next += 9;
        }
        None => parts.push(UPDATE_RUNS.into()),
    }
    parts.push(NODES_HISTORY.into());
    let has_tasks = !columns.task_ids.is_empty();
    if has_tasks {
        parts.push(arm_tasks(next).into());
        parts.push(if published_by_caller {
            queue_in_tasks().into()
        } else {
            QUEUE_IN_OUTBOX.into()
        });
        next += 16;
    }
    if !columns.timer_runs.is_empty() {
        parts.push(schedule_timers(next).into());
        next += 5;
    }
    if !columns.unscheduled_runs.is_empty() {
        parts.push(unschedule_timers(next).into());
        next += 2;
    }
    // a new run has nothing live to end
    if inserts.is_none() && !columns.ended_runs.is_empty() {
        parts.push(end_runs(next).into());
    }
    // one row per run and message, or one per run without any
    let result = if has_tasks {
        "SELECT run_row.id AS run_id, run_row.created_at, q.id AS outbox_id, q.namespace, \
           q.queue, q.task_id, q.task_id AS id, q.attempt, q.shard_key, q.priority, q.leased, \
           q.node_key, \
           q.workflow_name, q.workflow_version, q.task_name, q.input, q.heartbeat_timeout_ms, \
           q.lease_token, q.lease_expires_at, q.attempt_deadline, q.dispatched_at, \
           q.traceparent \
         FROM run_row LEFT JOIN queued q ON q.shard_key = run_row.id"
    } else {
        "SELECT run_row.id AS run_id, run_row.created_at, NULL::bigint AS outbox_id, \
           NULL::text AS namespace, NULL::text AS queue, NULL::uuid AS task_id, \
           NULL::int AS attempt, NULL::uuid AS shard_key, NULL::smallint AS priority \
         FROM run_row"
    };
    let sql = format!("WITH {} {result}", parts.join(", "));
    // write_events: the write side of a group's runs, under their locks
    let mut query = sqlx::query(&sql)
        .bind(&columns.run_ids)
        .bind(&columns.statuses)
        .bind(&columns.records)
        .bind(&columns.outputs)
        .bind(&columns.errors)
        .bind(&columns.ended)
        .bind(&columns.counts)
        .bind(&columns.node_runs)
        .bind(&columns.node_keys)
        .bind(&columns.node_statuses)
        .bind(&columns.node_states)
        .bind(&columns.node_ended)
        .bind(&columns.history_runs)
        .bind(&columns.history_namespaces);
    query = columns.history.bind(query);
    if let Some(inserts) = inserts {
        query = query
            .bind(writes.iter().map(|w| w.namespace).collect::<Vec<_>>())
            .bind(inserts.iter().map(|i| i.workflow_name).collect::<Vec<_>>())
            .bind(
                inserts
                    .iter()
                    .map(|i| i.workflow_version)
                    .collect::<Vec<_>>(),
            )
            .bind(inserts.iter().map(|i| i.input).collect::<Vec<_>>())
            .bind(inserts.iter().map(|i| i.labels).collect::<Vec<_>>())
            .bind(
                inserts
                    .iter()
                    .map(|i| i.idempotency_key)
                    .collect::<Vec<_>>(),
            )
            .bind(inserts.iter().map(|i| i.only_if_latest).collect::<Vec<_>>())
            .bind(inserts.iter().map(|i| i.traceparent).collect::<Vec<_>>())
            .bind(inserts.iter().map(|i| i.priority).collect::<Vec<_>>());
    }
    if has_tasks {
        query = query
            .bind(&columns.task_ids)
            .bind(&columns.task_runs)
            .bind(&columns.task_namespaces)
            .bind(&columns.task_nodes)
            .bind(&columns.task_queues)
            .bind(&columns.task_names)
            .bind(&columns.task_attempts)
            .bind(&columns.task_inputs)
            .bind(&columns.task_heartbeats)
            .bind(&columns.task_timeouts)
            .bind(&columns.task_workflows)
            .bind(&columns.task_versions)
            .bind(&columns.task_traces)
            .bind(&columns.task_rate_keys)
            .bind(&columns.task_lease_owners)
            .bind(&columns.task_lease_receipts);
    }
    if !columns.timer_runs.is_empty() {
        query = query
            .bind(&columns.timer_runs)
            .bind(&columns.timer_keys)
            .bind(&columns.timer_namespaces)
            .bind(&columns.timer_values)
            .bind(&columns.timer_fire_at);
    }
    if !columns.unscheduled_runs.is_empty() {
        query = query
            .bind(&columns.unscheduled_runs)
            .bind(&columns.unscheduled_keys);
    }
    if inserts.is_none() && !columns.ended_runs.is_empty() {
        query = query.bind(&columns.ended_runs);
    }
    let rows = query.fetch_all(conn).await?;
    let mut written: HashMap<Uuid, EventWritten> = HashMap::with_capacity(writes.len());
    for row in &rows {
        let run_id: Uuid = row.try_get("run_id")?;
        let created_at: DateTime<Utc> = row.try_get("created_at")?;
        let entry = written.entry(run_id).or_insert_with(|| EventWritten {
            created_at,
            outbox: Vec::new(),
            leased: Vec::new(),
        });
        if row.try_get::<Option<Uuid>, _>("task_id")?.is_none() {
            continue;
        }
        if row.try_get::<Option<bool>, _>("leased")? == Some(true) {
            entry.leased.push(leased_from_row(row)?);
        } else {
            entry.outbox.push(outbox_from_row(row)?);
        }
    }
    Ok(written)
}
