//! B6: the dashboard's reads, B1 and retention on a large history.
//!
//! B1 runs first on the empty tables (its runs are the template below).
//! Then the profile's runs (10,000,000 in the full profile) are written
//! straight into the tables by `INSERT ... SELECT generate_series`, in
//! chunks: rows shaped like a real run's (the record copied from one,
//! input, output or error, labels, an idempotency key, creation times over
//! 30 days), and the oldest of them (as many as the disk holds) with the
//! tasks, node states and history of a completed B1 run. ListRuns' first
//! page, its searches and CountRuns are called one at a time from a client
//! on loopback (the call latency is the server's time plus one loopback
//! round trip); B1 runs again on the full tables; and the server's own
//! retention pass deletes the oldest day.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use composer_proto::v1::{
    CountRunsRequest, ListRunsRequest, RunStatus, run_service_client::RunServiceClient,
};
use tonic::transport::Channel;

use crate::{
    benches::{
        Ctx, Dist, Load, Throughput, WorkerKind, checkpoint, dist, ms, register, start_request,
        stop_all, throughput_on,
    },
    worker::channel,
};

/// One measured call shape.
#[derive(Debug, Clone)]
pub struct ReadCase {
    /// What was called.
    pub label: String,
    /// Latency, ms.
    pub latency: Dist,
    /// Runs returned (ListRuns) or counted (CountRuns) by one call.
    pub rows: i64,
    /// CountRuns stopped counting at its limit: `rows` is a floor.
    pub more: bool,
}

/// B6's results.
#[derive(Debug, Clone)]
pub struct Listing {
    /// Runs in the database.
    pub runs: i64,
    /// Of these, runs written with a B1 run's tasks, node states and history.
    pub history_runs: i64,
    /// Seconds the inserts (and VACUUM ANALYZE, CHECKPOINT) took.
    pub load_secs: f64,
    /// Each call shape.
    pub cases: Vec<ReadCase>,
    /// B1 on the empty tables, and on the full ones, with the same server.
    pub b1_empty: Throughput,
    pub b1_full: Throughput,
    /// Disk bytes per run: its `runs` row with the table's indexes, and a
    /// run's tasks, node states and history with theirs.
    pub run_bytes: f64,
    pub history_bytes: f64,
    /// The retention pass over the oldest day: runs deleted, and seconds.
    pub retention_runs: u64,
    pub retention_secs: f64,
}

const WORKFLOW: &str =
    "name: bench_list\nnodes:\n  - { id: wait, type: WAIT_FOR_EVENT, event: never }\n";

/// Writes runs `$3..=$4` shaped like the real run `$1`'s, created `$6`
/// seconds apart back from `$5`. Status by `n % 10`: 7 COMPLETED, 1
/// FAILED, 1 RUNNING, 1 CANCELLED.
const FILL_RUNS: &str = "\
INSERT INTO runs (id, namespace, workflow_name, workflow_version, status, input, output, \
                  error, labels, idempotency_key, record, created_at, updated_at, ended_at)
SELECT gen_random_uuid(), t.namespace, t.workflow_name, 1 + n % 2,
       (ARRAY['COMPLETED','COMPLETED','COMPLETED','COMPLETED','COMPLETED','COMPLETED',
              'COMPLETED','FAILED','RUNNING','CANCELLED'])[1 + n % 10],
       jsonb_build_object('order', 'A-' || n, 'sku', 'BOOK-' || n % 97, 'quantity', 1 + n % 5),
       CASE WHEN n % 10 < 7 THEN jsonb_build_object('shipment',
            jsonb_build_object('tracking', 'TRK-A-' || n, 'sku', 'BOOK-' || n % 97)) END,
       CASE WHEN n % 10 = 7 THEN jsonb_build_object('code', 'TASK_FAILED',
            'message', 'card declined', 'node', 'charge') END,
       jsonb_build_object('team', (ARRAY['red','green','blue'])[1 + n % 3]),
       'order-' || n, t.record,
       $5::timestamptz - make_interval(secs => n * $6),
       $5::timestamptz - make_interval(secs => n * $6 - 5),
       CASE WHEN n % 10 <> 8 THEN $5::timestamptz - make_interval(secs => n * $6 - 5) END
FROM generate_series($3::bigint, $4::bigint) AS n, runs t
WHERE t.id = $1";

/// [`FILL_RUNS`], and for each run written the tasks, node states and
/// history of the completed run `$2`: every column copied but those
/// [`copy_of`] gives the new run's keys and times.
fn fill_with_history(columns: &Columns) -> String {
    format!(
        "WITH r AS ({FILL_RUNS} RETURNING id, created_at, coalesce(ended_at, created_at) AS ended_at), \
         tasks_written AS ({}), nodes_written AS ({}) {}",
        copy_of(
            "tasks",
            &columns.tasks,
            &[
                ("id", "gen_random_uuid()"),
                ("run_id", "r.id"),
                ("created_at", "r.created_at"),
                ("dispatched_at", "r.created_at"),
                ("updated_at", "r.ended_at"),
            ],
        ),
        copy_of(
            "run_nodes",
            &columns.nodes,
            &[
                ("run_id", "r.id"),
                ("started_at", "r.created_at"),
                ("ended_at", "r.ended_at"),
                ("updated_at", "r.ended_at"),
            ],
        ),
        copy_of(
            "run_events",
            &columns.events,
            &[
                ("run_id", "r.id"),
                ("created_at", "r.created_at + (t.created_at - s.created_at)"),
            ],
        )
        .replace(
            "WHERE t.run_id = $2",
            "CROSS JOIN (SELECT created_at FROM runs WHERE id = $2) s WHERE t.run_id = $2",
        ),
    )
}

/// `INSERT INTO table (columns) SELECT ...` copying the rows of run `$2`
/// (as `t`) once for each new run `r`, with `overrides` for some columns.
fn copy_of(table: &str, columns: &[String], overrides: &[(&str, &str)]) -> String {
    let values: Vec<String> = columns
        .iter()
        .map(|column| {
            overrides
                .iter()
                .find(|(name, _)| name == column)
                .map_or_else(|| format!("t.{column}"), |(_, value)| (*value).to_owned())
        })
        .collect();
    format!(
        "INSERT INTO {table} ({}) SELECT {} FROM r CROSS JOIN {table} t WHERE t.run_id = $2",
        columns.join(", "),
        values.join(", ")
    )
}

/// The columns of the tables a run's history is copied into, as the
/// migrations made them.
struct Columns {
    tasks: Vec<String>,
    nodes: Vec<String>,
    events: Vec<String>,
}

impl Columns {
    async fn read(ctx: &Ctx) -> Result<Self> {
        let of = |table: &'static str| async move {
            sqlx::query_scalar::<_, String>(
                "SELECT column_name::text FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = $1 \
                 ORDER BY ordinal_position",
            )
            .bind(table)
            .fetch_all(&ctx.db)
            .await
            .with_context(|| format!("the columns of {table}"))
        };
        Ok(Self {
            tasks: of("tasks").await?,
            nodes: of("run_nodes").await?,
            events: of("run_events").await?,
        })
    }
}

/// Runs written per statement: a chunk is one transaction.
const CHUNK: usize = 500_000;

/// The span of creation times, as the dashboard's "last 30 days".
const SPAN_SECS: f64 = 30.0 * 86_400.0;

/// B6 on a fresh database.
pub async fn listing(ctx: &Ctx) -> Result<Listing> {
    ctx.reset().await?;
    let servers = ctx.start_servers(1).await?;
    let result = listing_on(ctx, &servers).await;
    stop_all(servers).await;
    result
}

async fn listing_on(ctx: &Ctx, servers: &[crate::procs::Server]) -> Result<Listing> {
    let url = &servers[0].url;
    let b1 = || Load {
        wal_breakdown: true,
        ..Load::plain(ctx, WorkerKind::Rust, ctx.profile.measure_secs, 0)
    };
    let b1_empty = throughput_on(ctx, "B6: B1 on the empty tables", servers, b1()).await?;
    register(url, WORKFLOW).await?;
    let mut client = RunServiceClient::new(channel(url).await?);
    let template = client
        .start_run(start_request("bench_list", serde_json::json!({})))
        .await
        .context("start the template run")?
        .into_inner()
        .run
        .context("run")?
        .run_id;
    let template = sqlx::types::Uuid::parse_str(&template)?;
    let completed: sqlx::types::Uuid = sqlx::query_scalar(
        "SELECT id FROM runs WHERE status = 'COMPLETED' AND workflow_name = 'bench_linear' \
         ORDER BY ended_at DESC LIMIT 1",
    )
    .fetch_one(&ctx.db)
    .await
    .context("a completed B1 run")?;
    let began = Instant::now();
    let (count, history_runs) = (ctx.profile.list_runs, ctx.profile.list_history_runs);
    fill(ctx, template, completed, count, history_runs).await?;
    // the steady state autovacuum reaches on tables this size; then the
    // fill's dirty pages written out, as they are long before a real table
    // grows this large: without it the checkpointer and the kernel wrote
    // gigabytes of the fill under the measurements that follow
    sqlx::raw_sql("VACUUM ANALYZE runs, tasks, run_nodes, run_events")
        .execute(&ctx.db)
        .await?;
    checkpoint(ctx).await?;
    let load_secs = began.elapsed().as_secs_f64();
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(&ctx.db)
        .await?;
    let (run_bytes, history_bytes) = disk_per_run(ctx, runs, history_runs).await?;
    let calls = ctx.profile.list_calls;
    let mut cases = Vec::new();
    for (label, request) in list_cases(&template.to_string()) {
        cases.push(measure_list(&mut client, label, request, calls).await?);
    }
    for (label, request) in count_cases() {
        cases.push(measure_count(&mut client, label, request, calls).await?);
    }
    let b1_full = throughput_on(ctx, "B6: B1 on the full tables", servers, b1()).await?;
    let (retention_runs, retention_secs) = retention_of_a_day(ctx).await?;
    Ok(Listing {
        runs,
        history_runs: i64::try_from(history_runs)?,
        load_secs,
        cases,
        b1_empty,
        b1_full,
        run_bytes,
        history_bytes,
        retention_runs,
        retention_secs,
    })
}

/// Writes `count` runs in chunks, the oldest `history_runs` of them with
/// the tasks, node states and history of `completed`.
async fn fill(
    ctx: &Ctx,
    template: sqlx::types::Uuid,
    completed: sqlx::types::Uuid,
    count: usize,
    history_runs: usize,
) -> Result<()> {
    let fill = Fill {
        template,
        completed,
        base: chrono::Utc::now(),
        step: SPAN_SECS / count.max(1) as f64,
        count,
    };
    // n counts back in time: the oldest runs are the last numbers
    let first_with_history = count - history_runs.min(count) + 1;
    fill.write(ctx, FILL_RUNS, 1, first_with_history - 1)
        .await?;
    let with_history = fill_with_history(&Columns::read(ctx).await?);
    fill.write(ctx, &with_history, first_with_history, count)
        .await
}

/// What every chunk of [`fill`] binds: the runs copied, where time starts
/// and how far apart runs are created.
struct Fill {
    template: sqlx::types::Uuid,
    completed: sqlx::types::Uuid,
    base: chrono::DateTime<chrono::Utc>,
    step: f64,
    count: usize,
}

impl Fill {
    /// Runs `first..=last` by `sql`, one transaction per [`CHUNK`].
    async fn write(&self, ctx: &Ctx, sql: &str, first: usize, last: usize) -> Result<()> {
        for from in (first..=last).step_by(CHUNK) {
            let to = (from + CHUNK - 1).min(last);
            sqlx::query(sql)
                .bind(self.template)
                .bind(self.completed)
                .bind(i64::try_from(from)?)
                .bind(i64::try_from(to)?)
                .bind(self.base)
                .bind(self.step)
                .execute(&ctx.db)
                .await
                .with_context(|| format!("fill runs {from}..={to}"))?;
            eprintln!("bench: B6 wrote runs {from}..={to} of {}", self.count);
        }
        Ok(())
    }
}

/// Disk bytes (heap, TOAST and indexes) per run: of `runs`, and of the
/// tasks, node states and history of the runs written with them.
async fn disk_per_run(ctx: &Ctx, runs: i64, history_runs: usize) -> Result<(f64, f64)> {
    // B1's own runs have tasks and history too
    let (run_bytes, history_bytes, b1_runs): (i64, i64, i64) = sqlx::query_as(
        "SELECT pg_total_relation_size('runs'), \
                pg_total_relation_size('tasks') + pg_total_relation_size('run_nodes') + \
                (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0)::bigint \
                   FROM pg_inherits WHERE inhparent = 'run_events'::regclass), \
                (SELECT count(*) FROM runs WHERE workflow_name = 'bench_linear')",
    )
    .fetch_one(&ctx.db)
    .await?;
    let with_history = i64::try_from(history_runs)? + b1_runs;
    Ok((
        run_bytes as f64 / runs.max(1) as f64,
        history_bytes as f64 / with_history.max(1) as f64,
    ))
}

/// The server's retention pass (its batch size, its statements) with a
/// retention of 29 days: the oldest of the 30 days written goes.
async fn retention_of_a_day(ctx: &Ctx) -> Result<(u64, f64)> {
    let coordinator = composer_coordinator::Coordinator::new(
        composer_store::Store::from_pool(ctx.db.clone()),
        composer_coordinator::CoordinatorConfig::default(),
    );
    let batch = composer_coordinator::time::recovery::RecoveryConfig::default().batch;
    let began = Instant::now();
    let (runs, _) = coordinator
        .apply_retention(Duration::from_secs(29 * 86_400), batch)
        .await
        .context("retention")?;
    Ok((runs, began.elapsed().as_secs_f64()))
}

fn list_cases(run_id: &str) -> Vec<(&'static str, ListRunsRequest)> {
    let base = ListRunsRequest::default();
    vec![
        ("ListRuns first page (100), no filter", base.clone()),
        (
            "ListRuns first page, status FAILED",
            ListRunsRequest {
                statuses: vec![RunStatus::Failed as i32],
                ..base.clone()
            },
        ),
        (
            "ListRuns first page, workflow + version 2",
            ListRunsRequest {
                workflow_name: "bench_list".to_owned(),
                workflow_version: 2,
                ..base.clone()
            },
        ),
        (
            "ListRuns first page, label team=red",
            ListRunsRequest {
                labels: [("team".to_owned(), "red".to_owned())].into(),
                ..base.clone()
            },
        ),
        (
            "ListRuns search key prefix `order-4242`",
            ListRunsRequest {
                search: "order-4242".to_owned(),
                ..base.clone()
            },
        ),
        (
            "ListRuns search by run id",
            ListRunsRequest {
                search: run_id.to_owned(),
                ..base.clone()
            },
        ),
        (
            "ListRuns search matching nothing",
            ListRunsRequest {
                search: "no-such-key".to_owned(),
                ..base
            },
        ),
    ]
}

fn count_cases() -> Vec<(&'static str, CountRunsRequest)> {
    vec![
        ("CountRuns, no filter", CountRunsRequest::default()),
        (
            "CountRuns, workflow + version 2",
            CountRunsRequest {
                workflow_name: "bench_list".to_owned(),
                workflow_version: 2,
                ..Default::default()
            },
        ),
        (
            "CountRuns, label team=red",
            CountRunsRequest {
                labels: [("team".to_owned(), "red".to_owned())].into(),
                ..Default::default()
            },
        ),
        (
            "CountRuns, last 24 h",
            CountRunsRequest {
                create_time_after: Some(prost_types::Timestamp {
                    seconds: chrono::Utc::now().timestamp() - 86_400,
                    nanos: 0,
                }),
                ..Default::default()
            },
        ),
    ]
}

const WARM_UP: usize = 3;

async fn measure_list(
    client: &mut RunServiceClient<Channel>,
    label: &str,
    request: ListRunsRequest,
    calls: usize,
) -> Result<ReadCase> {
    let mut times = Vec::with_capacity(calls);
    let mut rows = 0;
    for i in 0..WARM_UP + calls {
        let sent = Instant::now();
        let page = client
            .list_runs(request.clone())
            .await
            .with_context(|| label.to_owned())?
            .into_inner();
        if i >= WARM_UP {
            times.push(ms(sent.elapsed()));
        }
        rows = page.runs.len() as i64;
    }
    Ok(ReadCase {
        label: label.to_owned(),
        latency: dist(times),
        rows,
        more: false,
    })
}

async fn measure_count(
    client: &mut RunServiceClient<Channel>,
    label: &str,
    request: CountRunsRequest,
    calls: usize,
) -> Result<ReadCase> {
    let mut times = Vec::with_capacity(calls);
    let (mut rows, mut more) = (0, false);
    for i in 0..WARM_UP + calls {
        let sent = Instant::now();
        let counted = client
            .count_runs(request.clone())
            .await
            .with_context(|| label.to_owned())?
            .into_inner();
        if i >= WARM_UP {
            times.push(ms(sent.elapsed()));
        }
        rows = counted.counts.iter().map(|c| c.count).sum();
        more = counted.more;
    }
    Ok(ReadCase {
        label: label.to_owned(),
        latency: dist(times),
        rows,
        more,
    })
}
