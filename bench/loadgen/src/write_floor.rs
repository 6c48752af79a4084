//! The floor that the server's own write pattern cannot beat: pgbench
//! doing the row writes of B1's runs, grouped as B1's transactions were.
//!
//! The runs are B1's: one of its completed runs is copied into the floor's
//! database as a template (its run row, task rows, node rows and history,
//! each history row tagged with the transaction that wrote it), so every
//! row has the widths B1's rows have. A round of the script takes a block
//! of runs through what B1 does to them: it starts a block (runs, first
//! nodes, history and first tasks, in start groups of B1's median size),
//! leases the tasks due (in lease batches of B1's median size, committed
//! without a flush as the server commits them), and applies one event to
//! each run of the blocks due, all in one transaction of B1's median event
//! group: each run locked, its task finished, its row, nodes and history
//! written and its next task armed (or the run ended), with the server's
//! statements' shapes. Earlier blocks are `LAG` rounds behind, so the rows
//! an event needs were committed by another client long before.
//!
//! What the floor writes per task, by relation and record type, is
//! reported beside B1's (pg_waldump over each window), so the claim "the
//! same writes" is checked on every run, not assumed.

use anyhow::{Context, Result, bail};
use serde_json::Value as Json;
use sqlx::{PgPool, Row, postgres::PgPoolOptions};

use crate::{
    benches::{Ctx, Throughput, fresh_database, keep_wal, pgbench, run_pgbench, wal_of_window},
    procs::{self, TICKS_PER_SECOND},
    wal::{TransactionShapes, WalBreakdown},
};

/// pgbench clients.
const CLIENTS: u32 = 16;

/// Rounds between a block's stages: more than the clients, so a block's
/// rows were committed before the next stage reaches them.
const LAG: u64 = 2 * CLIENTS as u64;

/// The warm-up's length: its rounds (hundreds a second) pass `LAG ×
/// tasks per run` many times.
const WARM_SECS: u64 = 3;

/// The floor of B1's own writes.
#[derive(Debug, Clone)]
pub struct WriteFloor {
    /// Tasks per second at the floor.
    pub tasks_per_s: f64,
    /// pgbench clients.
    pub clients: u32,
    /// Tasks a round completes: runs per block × tasks per run.
    pub tasks_per_round: u64,
    /// The groups used: runs per start statement, events per event
    /// transaction, tasks per lease statement.
    pub groups: Groups,
    /// B1's transaction shapes they came from.
    pub shapes: TransactionShapes,
    /// WAL bytes per task in the floor's window.
    pub wal_bytes_per_task: f64,
    /// Postgres CPU seconds per 1,000 tasks.
    pub pg_cpu: f64,
    /// The floor's WAL per task, broken down as B1's is.
    pub wal: Option<WalBreakdown>,
}

/// How a round groups its writes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Groups {
    /// Runs a start statement inserts.
    pub starts: u64,
    /// Runs per block: each stage's events in a round.
    pub runs_per_block: u64,
    /// Runs start in the event transaction (else in start groups).
    pub start_in_event: bool,
    /// Where a task is leased: B1's commonest place.
    pub lease: LeaseAt,
}

/// Where the floor leases a task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LeaseAt {
    /// Written LEASED by the statement that arms it (decision 0051).
    Arm,
    /// By an update in the transaction that armed it.
    AfterArm,
    /// In lease batches of this many, each its own transaction, before
    /// its event.
    Apart(u64),
}

impl Groups {
    /// B1's medians over `tasks_per_run` stages: a round's event
    /// transaction holds one event per run of each stage's block (and
    /// starts the next block where B1 started runs in its event groups).
    pub fn from_shapes(shapes: &TransactionShapes, tasks_per_run: u64) -> Self {
        let size = |median: f64| (median.round() as u64).max(1);
        let start_in_event = shapes.starts_in_events >= 0.5;
        let stages = tasks_per_run + u64::from(start_in_event);
        let places = shapes.leases_at;
        let lease = if places.apart >= places.at_arm.max(places.after_arm) {
            LeaseAt::Apart(size(shapes.leases.median))
        } else if places.after_arm >= places.at_arm {
            LeaseAt::AfterArm
        } else {
            LeaseAt::Arm
        };
        Self {
            starts: size(shapes.starts.median),
            runs_per_block: (size(shapes.events.median) as f64 / stages as f64)
                .round()
                .max(1.0) as u64,
            start_in_event,
            lease,
        }
    }
}

/// B1's row writes at pgbench's pace, in a database `floor_writes` of its
/// own, from a completed run of B1's (in the `composer` database, so run
/// this right after B1, before the next row empties it).
pub async fn write_floor(ctx: &Ctx, b1: &Throughput) -> Result<WriteFloor> {
    let shapes = b1
        .wal
        .as_ref()
        .map(|w| w.shapes)
        .context("B1's WAL was not broken down: no transaction shapes to copy")?;
    if shapes.events.transactions == 0 {
        bail!("B1's window had no event transaction");
    }
    let template = Template::read(&ctx.db).await?;
    let tasks_per_run = template.tasks_per_run;
    let groups = Groups::from_shapes(&shapes, tasks_per_run);
    let pgbench = pgbench()?;
    let url = fresh_database(ctx, "floor_writes").await?;
    let db = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await?;
    template.copy_into(&db).await?;
    // what-if: a schema change tried on the floor before it is made
    // (e.g. an index or a constraint dropped), statements split at `;`
    if let Ok(sql) = std::env::var("BENCH_FLOOR_SQL") {
        for statement in sql.split(';').filter(|s| !s.trim().is_empty()) {
            sqlx::query(statement).execute(&db).await?;
        }
    }
    let script = ctx.out_dir.join("floor").join("b1-row-writes.sql");
    std::fs::create_dir_all(script.parent().context("no folder")?)?;
    std::fs::write(&script, round_script(groups, tasks_per_run))?;

    // a warm-up fills the pipeline: a measured round finds every block
    // it reaches
    run_pgbench(&pgbench, &script, &url, CLIENTS, WARM_SECS).await?;
    keep_wal(&ctx.admin, "16GB").await?;
    let pg_pid = ctx.backends.postmaster_pid().unwrap_or(0);
    let before = window_mark(&db).await?;
    let pg_before = procs::tree_ticks(pg_pid);
    let started = std::time::Instant::now();
    run_pgbench(&pgbench, &script, &url, CLIENTS, ctx.profile.floor_secs).await?;
    let secs = started.elapsed().as_secs_f64();
    let pg_ticks = procs::tree_ticks(pg_pid).saturating_sub(pg_before);
    let after = window_mark(&db).await?;
    let rounds = (after.rounds - before.rounds) as f64;
    let tasks = rounds * (groups.runs_per_block * tasks_per_run) as f64;
    if tasks == 0.0 {
        bail!("the floor's pgbench finished no round");
    }
    let wal = wal_of_window(ctx, &db, (&before.lsn, &after.lsn), tasks).await;
    keep_wal(&ctx.admin, "0").await?;
    let wal = match wal {
        Ok(wal) => Some(wal),
        Err(error) => {
            eprintln!("bench: floor of B1's writes: WAL not broken down: {error:#}");
            None
        }
    };
    db.close().await;
    let _ = sqlx::query("DROP DATABASE IF EXISTS floor_writes WITH (FORCE)")
        .execute(&ctx.admin)
        .await;
    Ok(WriteFloor {
        // pgbench's own window leaves out its connections; this one is
        // the rounds over the wall time they took
        tasks_per_s: tasks / secs,
        clients: CLIENTS,
        tasks_per_round: groups.runs_per_block * tasks_per_run,
        groups,
        shapes,
        wal_bytes_per_task: (after.wal_bytes - before.wal_bytes) as f64 / tasks,
        pg_cpu: pg_ticks as f64 / TICKS_PER_SECOND / tasks * 1000.0,
        wal,
    })
}

/// Where the floor's window starts or ends.
struct Mark {
    rounds: i64,
    wal_bytes: i64,
    lsn: String,
}

async fn window_mark(db: &PgPool) -> Result<Mark> {
    let row = sqlx::query(
        "SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM floor_round), \
           pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, pg_current_wal_lsn()::text",
    )
    .fetch_one(db)
    .await?;
    Ok(Mark {
        rounds: row.try_get(0)?,
        wal_bytes: row.try_get(1)?,
        lsn: row.try_get(2)?,
    })
}

/// One completed B1 run, as rows (JSON), its history tagged by stage: the
/// transactions that wrote it, in order (0: the start).
struct Template {
    run: Json,
    tasks: Json,
    nodes: Json,
    events: Json,
    tasks_per_run: u64,
    /// The transactions that wrote its history.
    stages: u64,
}

impl Template {
    /// The newest completed B1 run whose every event had a transaction of
    /// its own (one in a group with an earlier event of its run does not).
    async fn read(db: &PgPool) -> Result<Self> {
        let candidates: Vec<String> = sqlx::query_scalar(
            "SELECT id::text FROM runs WHERE workflow_name = 'bench_linear' AND status = 'COMPLETED' \
             ORDER BY ended_at DESC LIMIT 50",
        )
        .fetch_all(db)
        .await?;
        for run_id in candidates {
            let template = Self::of_run(db, run_id).await?;
            if template.stages == template.tasks_per_run + 1 {
                return Ok(template);
            }
        }
        bail!("no completed B1 run with one transaction per event to copy")
    }

    async fn of_run(db: &PgPool, run_id: String) -> Result<Self> {
        let row = sqlx::query(
            "SELECT (SELECT to_jsonb(r) FROM runs r WHERE id = $1::uuid), \
               (SELECT jsonb_agg(to_jsonb(t) ORDER BY t.dispatched_at) FROM tasks t \
                  WHERE run_id = $1::uuid), \
               (SELECT jsonb_agg(to_jsonb(n)) FROM run_nodes n WHERE run_id = $1::uuid), \
               (SELECT jsonb_agg(to_jsonb(e) ORDER BY e.seq) \
                  FROM (SELECT h.*, dense_rank() OVER (ORDER BY h.first_seq) - 1 AS stage \
                        FROM (SELECT x.*, min(x.seq) OVER (PARTITION BY x.writer) AS first_seq \
                              FROM (SELECT run_events.*, run_events.xmin::text AS writer \
                                    FROM run_events WHERE run_id = $1::uuid) x) h) e), \
               (SELECT count(DISTINCT xmin::text) FROM run_events WHERE run_id = $1::uuid)",
        )
        .bind(&run_id)
        .fetch_one(db)
        .await?;
        let tasks: Option<Json> = row.try_get(1)?;
        let tasks = tasks.with_context(|| format!("B1's run {run_id} has no task rows"))?;
        let tasks_per_run = tasks.as_array().map_or(0, Vec::len) as u64;
        let stages: i64 = row.try_get(4)?;
        Ok(Self {
            run: row.try_get(0)?,
            tasks,
            nodes: row.try_get(2)?,
            events: row.try_get(3)?,
            tasks_per_run,
            stages: stages as u64,
        })
    }

    /// The template tables (`t_run`, `t_tasks` with their step from 1,
    /// `t_nodes` with their task's step, `t_events` with their stage and
    /// their first event's offset in it) and the round counter.
    async fn copy_into(&self, db: &PgPool) -> Result<()> {
        // a utility statement takes no parameters: the tables are made
        // empty, then filled
        for sql in [
            "CREATE TABLE t_run AS SELECT * FROM runs WITH NO DATA",
            "CREATE TABLE t_tasks AS SELECT 0::bigint AS step, * FROM tasks WITH NO DATA",
            "CREATE TABLE t_nodes AS SELECT 0::bigint AS step, * FROM run_nodes WITH NO DATA",
            "CREATE TABLE t_events AS SELECT 0 AS stage, 0::bigint AS ord, * FROM run_events \
             WITH NO DATA",
        ] {
            sqlx::query(sql).execute(db).await?;
        }
        sqlx::query("INSERT INTO t_run SELECT * FROM jsonb_populate_record(NULL::runs, $1)")
            .bind(&self.run)
            .execute(db)
            .await?;
        sqlx::query(
            "INSERT INTO t_tasks SELECT row_number() OVER (), * \
             FROM jsonb_populate_recordset(NULL::tasks, $1)",
        )
        .bind(&self.tasks)
        .execute(db)
        .await?;
        sqlx::query(
            "INSERT INTO t_nodes SELECT t.step, n.* \
             FROM jsonb_populate_recordset(NULL::run_nodes, $1) n \
             JOIN t_tasks t ON t.node_key = n.node_key",
        )
        .bind(&self.nodes)
        .execute(db)
        .await?;
        sqlx::query(
            "INSERT INTO t_events SELECT (j->>'stage')::int, \
               (j->>'seq')::bigint + 1 \
                 - min((j->>'seq')::bigint) OVER (PARTITION BY j->>'stage'), \
               (jsonb_populate_record(NULL::run_events, j)).* \
             FROM jsonb_array_elements($1) j",
        )
        .bind(&self.events)
        .execute(db)
        .await?;
        for sql in [
            "CREATE TABLE t_stages AS \
             SELECT stage, sum(1 + coalesce(jsonb_array_length(more), 0))::bigint AS events \
             FROM t_events GROUP BY stage",
            "CREATE SEQUENCE floor_round",
            "SELECT composer_ensure_history_partitions(1)",
            "VACUUM ANALYZE",
        ] {
            sqlx::query(sql).execute(db).await?;
        }
        Ok(())
    }
}

/// A run's id: a time-ordered UUID as the server's are (a fresh run's
/// index entries land at the right edge), from its number `i`.
fn run_id(i: &str) -> String {
    format!("('a' || lpad(to_hex({i}), 31, '0'))::uuid")
}

/// The id of step `step`'s task of the run `run` (a uuid expression).
fn task_id(run: &str, step: &str) -> String {
    format!("overlay(({run})::text PLACING ({step})::text FROM 1 FOR 1)::uuid")
}

/// One round of the floor: block `:b` starts, then the events of the
/// blocks `LAG`, `2 × LAG`, ... rounds older, each task leased where B1
/// leased most.
pub fn round_script(groups: Groups, tasks_per_run: u64) -> String {
    let n = groups.runs_per_block;
    let at_arm = groups.lease == LeaseAt::Arm;
    let after_arm = groups.lease == LeaseAt::AfterArm;
    // the first tasks of runs `first..=last` of block `:b`
    let started = |first: u64, last: u64| {
        format!("SELECT 1 AS step, i FROM generate_series(:b * {n} + {first}, :b * {n} + {last}) i")
    };
    let mut script = String::from("SELECT nextval('floor_round') AS b \\gset\n");
    if !groups.start_in_event {
        for first in (0..n).step_by(groups.starts as usize) {
            let last = (first + groups.starts).min(n) - 1;
            if after_arm {
                script.push_str("BEGIN;\n");
            }
            script.push_str(&start_statement(n, first, last, at_arm));
            if after_arm {
                script.push_str(&lease_statement(&started(first, last), Commit::WithEvent));
                script.push_str("COMMIT;\n");
            }
        }
    }
    // the tasks due this round: step k of the block k × LAG rounds back
    let due = format!(
        "SELECT s.k AS step, i FROM generate_series(1, {tasks_per_run}) s(k) \
         CROSS JOIN LATERAL generate_series((:b - s.k * {LAG}) * {n}, \
           (:b - s.k * {LAG}) * {n} + {} ) i",
        n - 1
    );
    if let LeaseAt::Apart(batch) = groups.lease {
        let count = n * tasks_per_run;
        for first in (0..count).step_by(batch as usize) {
            let tasks = format!(
                "SELECT * FROM ({due}) d ORDER BY step, i OFFSET {first} LIMIT {}",
                batch.min(count - first)
            );
            script.push_str(&lease_statement(&tasks, Commit::WithoutFlush));
        }
    }
    script.push_str("BEGIN;\n");
    script.push_str(&finish_statement(&due));
    script.push_str(&event_statement(&due, tasks_per_run, at_arm));
    if groups.start_in_event {
        script.push_str(&start_statement(n, 0, n - 1, at_arm));
        if after_arm {
            script.push_str(&lease_statement(&started(0, n - 1), Commit::WithEvent));
        }
    }
    if after_arm {
        let armed =
            format!("SELECT step + 1 AS step, i FROM ({due}) d WHERE step < {tasks_per_run}");
        script.push_str(&lease_statement(&armed, Commit::WithEvent));
    }
    script.push_str("COMMIT;\n");
    script
}

/// Runs `first..=last` of block `:b` started, as StartRun's group writes
/// them (group_write.rs, `insert_runs`): B1's runs have no idempotency key,
/// so a plain insert.
fn start_statement(n: u64, first: u64, last: u64, leased: bool) -> String {
    let id = run_id("g.i");
    let task = task_id("run_row.id", "1");
    format!(
        "WITH g AS (SELECT i FROM generate_series(:b * {n} + {first}, :b * {n} + {last}) i), \
         run_row AS ( \
           INSERT INTO runs (id, namespace, workflow_name, workflow_version, status, input, \
             labels, idempotency_key, record, output, error, ended_at, history_seq, traceparent, \
             priority) \
           SELECT {id}, t.namespace, t.workflow_name, t.workflow_version, 'RUNNING', t.input, \
             t.labels, NULL, t.record, NULL, NULL, NULL, s.events, t.traceparent, t.priority \
           FROM g CROSS JOIN t_run t JOIN t_stages s ON s.stage = 0 \
           RETURNING id, 0::bigint AS base, priority), \
         {nodes} \
         {history} \
         {armed} \
         SELECT count(*) FROM armed;\n",
        history = history_rows("0"),
        nodes = node_writes(
            "SELECT run_row.id AS run_id, n.node_key AS k, 'RUNNING' AS s, \
             n.state AS st, false AS e FROM run_row JOIN t_nodes n ON n.step = 1"
        ),
        armed = arm_tasks(&task, "FROM run_row JOIN t_tasks t ON t.step = 1", leased),
    )
}

/// The history rows of stage `stage` of each run of `run_row`, numbered
/// on from its `base`, as group_write.rs appends them.
fn history_rows(stage: &str) -> String {
    format!(
        "history AS ( \
           INSERT INTO run_events (run_id, seq, namespace, event_type, node_key, attempt, actor, \
             details, more, created_at) \
           SELECT run_row.id, run_row.base + e.ord, e.namespace, e.event_type, e.node_key, \
             e.attempt, e.actor, e.details, e.more, clock_timestamp() \
           FROM run_row JOIN t_events e ON e.stage = {stage}),"
    )
}

/// Node rows updated where they exist, inserted where not (`nodes`: run_id,
/// k, s, st, e), as group_write.rs writes them.
fn node_writes(nodes: &str) -> String {
    format!(
        "nodes AS ({nodes}), \
         node_updated AS ( \
           UPDATE run_nodes SET status = n.s, state = n.st, updated_at = now(), \
             ended_at = CASE WHEN n.e THEN now() END \
           FROM nodes n WHERE run_nodes.run_id = n.run_id AND run_nodes.node_key = n.k \
           RETURNING run_nodes.run_id, run_nodes.node_key), \
         node_rows AS ( \
           INSERT INTO run_nodes (run_id, node_key, status, state, started_at, ended_at) \
           SELECT n.run_id, n.k, n.s, n.st, now(), CASE WHEN n.e THEN now() END FROM nodes n \
           WHERE NOT EXISTS (SELECT 1 FROM node_updated u \
             WHERE u.run_id = n.run_id AND u.node_key = n.k)),"
    )
}

/// Tasks armed as the server arms them, an update of the rows that exist
/// (none here) and an insert of the others: `id` for each row of `from`,
/// which joins `run_row` and a template task `t`; DISPATCHED, or `leased`
/// as group_write.rs leases a task to a waiting poll as it arms it.
fn arm_tasks(id: &str, from: &str, leased: bool) -> String {
    let (status, lease) = if leased {
        (
            "'LEASED'",
            "gen_random_uuid(), w.lease_owner, \
             now() + make_interval(secs => a.heartbeat_timeout_ms / 1000.0), w.lease_confirmed, \
             NULL::timestamptz",
        )
    } else {
        (
            "'DISPATCHED'",
            "NULL::uuid, NULL::text, NULL::timestamptz, NULL::boolean, NULL::timestamptz",
        )
    };
    format!(
        "a AS (SELECT {id} AS id, run_row.id AS run_id, run_row.priority, t.namespace, \
           t.node_key, t.workflow_name, t.workflow_version, t.queue, t.task_name, t.input, \
           t.heartbeat_timeout_ms, t.attempt_timeout_ms, t.traceparent, t.rate_limit_key \
           {from}), \
         rearmed AS ( \
           UPDATE tasks SET status = {status}, attempt = 1, dispatched_at = now(), \
             updated_at = now() \
           FROM a WHERE tasks.run_id = a.run_id AND tasks.node_key = a.node_key \
           RETURNING tasks.run_id, tasks.node_key), \
         armed AS ( \
           INSERT INTO tasks (id, namespace, run_id, node_key, workflow_name, workflow_version, \
             queue, task_name, status, attempt, input, heartbeat_timeout_ms, attempt_timeout_ms, \
             dispatched_at, traceparent, priority, rate_limit_key, lease_token, lease_owner, \
             lease_expires_at, lease_confirmed, attempt_deadline) \
           SELECT a.id, a.namespace, a.run_id, a.node_key, a.workflow_name, a.workflow_version, \
             a.queue, a.task_name, {status}, 1, a.input, a.heartbeat_timeout_ms, \
             a.attempt_timeout_ms, now(), a.traceparent, a.priority, a.rate_limit_key, {lease} \
           FROM a CROSS JOIN (SELECT lease_owner, lease_confirmed FROM t_tasks LIMIT 1) w \
           WHERE NOT EXISTS (SELECT 1 FROM rearmed r \
             WHERE r.run_id = a.run_id AND r.node_key = a.node_key) \
           RETURNING id, namespace, queue, attempt, run_id, priority, status, lease_token, \
             lease_expires_at)"
    )
}

/// How a lease commits: in a transaction of its own without a flush, or
/// in the transaction that armed its tasks, which flushes (tasks.rs).
#[derive(Clone, Copy)]
enum Commit {
    WithoutFlush,
    WithEvent,
}

/// The tasks of `tasks` (step, run number i) leased, as tasks.rs leases
/// them.
fn lease_statement(tasks: &str, commit: Commit) -> String {
    let run = run_id("d.i");
    let task = task_id(&run, "d.step");
    let commit = match commit {
        Commit::WithoutFlush => "(SELECT set_config('synchronous_commit', 'off', true)) = 'off'",
        Commit::WithEvent => "true",
    };
    format!(
        "UPDATE tasks t SET status = 'LEASED', lease_token = gen_random_uuid(), \
           lease_owner = w.lease_owner, \
           lease_expires_at = now() + make_interval(secs => t.heartbeat_timeout_ms / 1000.0), \
           lease_confirmed = w.lease_confirmed, attempt_deadline = NULL, updated_at = now() \
         FROM (SELECT lease_owner, lease_confirmed FROM t_tasks LIMIT 1) w \
         WHERE t.id = ANY(ARRAY(SELECT {task} FROM ({tasks}) d)) \
           AND t.status = 'DISPATCHED' AND {commit} \
         RETURNING t.id, t.input, t.lease_token;\n"
    )
}

/// The due runs locked in id order and their tasks finished, as
/// runs.rs's `lock_runs_fence_and_load` does.
fn finish_statement(due: &str) -> String {
    let run = run_id("d.i");
    let task = task_id(&run, "d.step");
    format!(
        "WITH d AS (SELECT {run} AS run_id, {task} AS task_id FROM ({due}) d), \
         locked AS (SELECT id FROM runs WHERE id = ANY(ARRAY(SELECT run_id FROM d)) \
           ORDER BY id FOR UPDATE), \
         finished AS ( \
           UPDATE tasks t SET status = 'COMPLETED', outcome = 'COMPLETED', \
             lease_expires_at = NULL, updated_at = now() \
           FROM d WHERE t.id = ANY(ARRAY(SELECT task_id FROM d)) AND t.id = d.task_id \
             AND t.status = 'LEASED' AND EXISTS (SELECT 1 FROM locked WHERE locked.id = d.run_id) \
           RETURNING t.id) \
         SELECT (SELECT count(*) FROM locked), (SELECT count(*) FROM finished);\n"
    )
}

/// Each due run's event: its row, its nodes (the finished one's and the
/// next one's), its history, its next task, or its end, as group_write.rs's
/// `write_events` writes a group.
fn event_statement(due: &str, tasks_per_run: u64, leased: bool) -> String {
    let run = run_id("d.i");
    let next_task = task_id("run_row.id", "run_row.step + 1");
    format!(
        "WITH d AS (SELECT {run} AS run_id, d.step, d.step = {tasks_per_run} AS ended \
           FROM ({due}) d), \
         run_row AS ( \
           UPDATE runs SET status = CASE WHEN d.ended THEN t.status ELSE 'RUNNING' END, \
             record = t.record, \
             output = COALESCE(CASE WHEN d.ended THEN t.output END, runs.output), \
             error = runs.error, updated_at = now(), \
             ended_at = CASE WHEN d.ended THEN now() ELSE runs.ended_at END, \
             history_seq = runs.history_seq + s.events \
           FROM d CROSS JOIN t_run t JOIN t_stages s ON true \
           WHERE runs.id = ANY(ARRAY(SELECT run_id FROM d)) AND runs.id = d.run_id \
             AND s.stage = d.step \
           RETURNING runs.id, runs.history_seq - s.events AS base, runs.priority, d.step, \
             d.ended), \
         {nodes} \
         {history} \
         {armed}, \
         ended AS (SELECT id FROM run_row WHERE ended), \
         ended_timers AS (DELETE FROM timers WHERE run_id = ANY(ARRAY(SELECT id FROM ended))), \
         ended_tasks AS ( \
           UPDATE tasks SET status = 'CANCELLED', updated_at = now() \
           WHERE run_id = ANY(ARRAY(SELECT id FROM ended)) \
             AND status IN ('DISPATCHED', 'LEASED', 'HELD', 'WAITING_SLOT')), \
         ended_waits AS (DELETE FROM event_waits WHERE run_id = ANY(ARRAY(SELECT id FROM ended))), \
         ended_events AS ( \
           DELETE FROM pending_events WHERE run_id = ANY(ARRAY(SELECT id FROM ended))) \
         SELECT count(*) FROM armed;\n",
        history = history_rows("run_row.step"),
        nodes = node_writes(
            "SELECT run_row.id AS run_id, n.node_key AS k, \
               CASE WHEN n.step = run_row.step THEN n.status ELSE 'RUNNING' END AS s, \
               n.state AS st, n.step = run_row.step AS e \
             FROM run_row JOIN t_nodes n ON n.step IN (run_row.step, run_row.step + 1)"
        ),
        armed = arm_tasks(
            &next_task,
            "FROM run_row JOIN t_tasks t ON t.step = run_row.step + 1",
            leased,
        ),
    )
}
