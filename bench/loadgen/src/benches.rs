//! The floor (pgbench) and B1..B5.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use composer_proto::v1::{
    GetRunRequest, RegisterWorkflowRequest, RunStatus, StartRunRequest,
    run_service_client::RunServiceClient, workflow_service_client::WorkflowServiceClient,
};
use serde_json::Value as Json;
use sqlx::{PgPool, Row, postgres::PgPoolOptions};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Command,
    sync::{Semaphore, watch},
};
use tonic::transport::Channel;

use crate::{
    procs::{self, Backends, Server, TICKS_PER_SECOND},
    worker::{
        Authed, Bearer, FastWorker, Hook, WorkerConfig, WorkerEvent, channel, incompressible_text,
    },
};

/// Lengths and sizes of one benchmark profile.
#[derive(Debug, Clone)]
pub struct Profile {
    /// `quick` or `full`.
    pub name: &'static str,
    /// pgbench duration per script.
    pub floor_secs: u64,
    /// B1/B5 warm-up.
    pub warm_secs: u64,
    /// B1/B5 measured window (Rust worker).
    pub measure_secs: u64,
    /// B1 measured window (Python worker).
    pub sdk_secs: u64,
    /// B2 duration at ~10 runs/s.
    pub latency_secs: u64,
    /// B3: runs of each case; the median counts.
    pub fan_tries: usize,
    /// B3 sizes (the larger is capped at the 10,000-node definition limit
    /// for FORK/JOIN).
    pub fan_sizes: [usize; 2],
    /// B3: elements of the wide MAP, run once on a server of its own so
    /// that its peak RSS is the MAP's (0: none).
    pub wide_map: usize,
    /// B4 runs.
    pub timer_runs: usize,
    /// Servers for B5 (measured back to back, so machine noise hits all alike).
    pub scale_servers: Vec<usize>,
    /// B5: rounds of the server counts, each round starting with the next
    /// count; each row measures `measure_secs / scale_rounds`.
    pub scale_rounds: usize,
    /// B5: runs in flight over all servers, the same for every count, and
    /// deep enough that one server is saturated (it runs no faster with
    /// twice as many): so B5 compares capacity, not how thinly one load
    /// can be split.
    pub scale_in_flight: usize,
    /// perf sampling during a B1 load (0: none).
    pub perf_secs: u64,
    /// perf sampling during every B5 row (0: none; only `--perf-b5-secs`).
    pub scale_perf_secs: u64,
    /// B5: the CPU each server may use, in cores, as if on a machine of its
    /// own (a cgroup quota); 0: no budgeted series (docs/decisions/0031).
    pub scale_server_cores: f64,
    /// Runs in flight in the closed loops.
    pub in_flight: usize,
    /// B6: runs in the database.
    pub list_runs: usize,
    /// B6: of these, the oldest written with a B1 run's tasks, node states
    /// and history (as many as the disk holds: about 5 KB each, against
    /// 0.8 KB for a run's row alone).
    pub list_history_runs: usize,
    /// B6: calls measured per case.
    pub list_calls: usize,
    /// Observability cost: B1 window per variant, and rounds of the three.
    pub observe_secs: u64,
    pub observe_rounds: usize,
    /// B1 with payloads: the sizes (bytes of run input and of task output)
    /// and the window per size.
    pub payload_sizes: Vec<usize>,
    pub payload_secs: u64,
    /// B7: steps of the sequential workflow.
    pub chain_steps: usize,
    /// B8: the victim's window idle and under each aggressor, seconds (at
    /// 10 runs/s).
    pub noisy_secs: u64,
    /// B8: the longest an aggressor's phase may last, seconds (a poisoned
    /// run that never ends, a backlog filling slowly).
    pub noisy_limit_secs: u64,
    /// B8: WatchRun streams the aggressor holds.
    pub noisy_watch_streams: usize,
    /// B8: tasks the aggressor leaves waiting in its own queue.
    pub noisy_backlog_tasks: usize,
    /// Bulk: failed runs the operation retries.
    pub bulk_runs: usize,
}

impl Profile {
    /// `make bench-quick`: under 3 minutes.
    pub fn quick() -> Self {
        Self {
            name: "quick",
            floor_secs: 8,
            warm_secs: 3,
            measure_secs: 10,
            sdk_secs: 8,
            latency_secs: 8,
            // 1,000 and 10,000 take minutes while MAP scales badly (see
            // BENCHMARKS.md); the full profile runs them
            fan_sizes: [300, 3_000],
            fan_tries: 3,
            wide_map: 20_000,
            timer_runs: 2_000,
            scale_servers: vec![1, 2, 3],
            scale_rounds: 1,
            scale_in_flight: 1_200,
            perf_secs: 0,
            scale_perf_secs: 0,
            scale_server_cores: 0.25,
            in_flight: 200,
            list_runs: 100_000,
            list_history_runs: 100_000,
            list_calls: 30,
            observe_secs: 8,
            observe_rounds: 2,
            payload_sizes: vec![100_000],
            payload_secs: 6,
            chain_steps: 1_000,
            noisy_secs: 5,
            noisy_limit_secs: 20,
            noisy_watch_streams: 1_000,
            noisy_backlog_tasks: 10_000,
            bulk_runs: 10_000,
        }
    }

    /// `make test`'s run over the debug build: every row in small windows
    /// and sizes, to show that each benchmark still runs end to end in
    /// about three minutes; its figures are never quoted.
    pub fn check() -> Self {
        Self {
            name: "check",
            floor_secs: 3,
            warm_secs: 1,
            measure_secs: 3,
            sdk_secs: 3,
            latency_secs: 3,
            fan_sizes: [100, 300],
            fan_tries: 1,
            wide_map: 1_000,
            timer_runs: 300,
            scale_servers: vec![1, 2],
            scale_rounds: 1,
            scale_in_flight: 300,
            perf_secs: 0,
            scale_perf_secs: 0,
            scale_server_cores: 0.25,
            in_flight: 100,
            list_runs: 5_000,
            list_history_runs: 5_000,
            list_calls: 10,
            observe_secs: 3,
            observe_rounds: 1,
            payload_sizes: vec![100_000],
            payload_secs: 3,
            chain_steps: 200,
            noisy_secs: 3,
            // a poisoned run fails after its third lost lease, about 12 s
            // in: a shorter limit ends the phase with the runs still
            // RUNNING, and the row says nothing about them
            noisy_limit_secs: 20,
            noisy_watch_streams: 200,
            noisy_backlog_tasks: 1_000,
            bulk_runs: 1_000,
        }
    }

    /// `make bench`: about 15 minutes.
    pub fn full() -> Self {
        Self {
            name: "full",
            floor_secs: 60,
            warm_secs: 10,
            measure_secs: 60,
            sdk_secs: 40,
            latency_secs: 60,
            fan_sizes: [1_000, 10_000],
            fan_tries: 3,
            wide_map: 100_000,
            timer_runs: 10_000,
            scale_servers: vec![1, 2, 3],
            scale_rounds: 3,
            scale_in_flight: 1_200,
            perf_secs: 15,
            scale_perf_secs: 0,
            scale_server_cores: 0.25,
            in_flight: 200,
            list_runs: 10_000_000,
            list_history_runs: 2_000_000,
            list_calls: 200,
            observe_secs: 30,
            observe_rounds: 3,
            payload_sizes: vec![1_000, 10_000, 100_000, 1_000_000],
            payload_secs: 20,
            chain_steps: 10_000,
            noisy_secs: 30,
            noisy_limit_secs: 120,
            noisy_watch_streams: 5_000,
            noisy_backlog_tasks: 100_000,
            bulk_runs: 10_000,
        }
    }
}

/// Everything the benchmarks share.
pub struct Ctx {
    /// `target/release/composer`.
    pub composer: PathBuf,
    /// Postgres and Redis.
    pub backends: Backends,
    /// The `postgres` database (its queries do not count as `composer` transactions).
    pub admin: PgPool,
    /// The `composer` database.
    pub db: PgPool,
    /// Lengths.
    pub profile: Profile,
    /// Where artifacts go (`target/bench`).
    pub out_dir: PathBuf,
    /// The SDK workers that can run here (Python, Go, TypeScript).
    pub sdk_workers: Vec<SdkWorker>,
    /// The repository root.
    pub repo: PathBuf,
}

impl Ctx {
    /// Connects the pools.
    pub async fn new(
        composer: PathBuf,
        backends: Backends,
        profile: Profile,
        out_dir: PathBuf,
        sdk_workers: Vec<SdkWorker>,
        repo: PathBuf,
    ) -> Result<Self> {
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .connect(&backends.admin_url())
            .await?;
        let db = PgPoolOptions::new()
            .max_connections(2)
            .connect(&backends.database_url)
            .await?;
        Ok(Self {
            composer,
            backends,
            admin,
            db,
            profile,
            out_dir,
            sdk_workers,
            repo,
        })
    }

    pub(crate) async fn start_servers(&self, count: usize) -> Result<Vec<Server>> {
        self.start_servers_with(count, &[]).await
    }

    /// [`start_servers`](Ctx::start_servers) with more flags for `serve`.
    pub(crate) async fn start_servers_with(
        &self,
        count: usize,
        extra: &[String],
    ) -> Result<Vec<Server>> {
        self.start_budgeted_servers(count, extra, None).await
    }

    /// Servers each held to `cores` of CPU (a cgroup quota) when given.
    pub(crate) async fn start_budgeted_servers(
        &self,
        count: usize,
        extra: &[String],
        cores: Option<f64>,
    ) -> Result<Vec<Server>> {
        let mut servers = Vec::new();
        for _ in 0..count {
            let mut server = Server::start_with(&self.composer, &self.backends, extra).await?;
            if let Some(cores) = cores {
                server.limit_cpu(cores)?;
            }
            servers.push(server);
        }
        Ok(servers)
    }

    /// Brings the cluster's write-ahead log to how it is in service: a
    /// fresh cluster creates and zero-fills each 16 MB segment the first
    /// time it needs one, and a commit waiting for that (`WALInitSync`)
    /// stalls for tens of milliseconds, which a cluster that has run a while
    /// never does: it renames (recycles) old segments. Writes about
    /// `megabytes` of WAL in the `postgres` database, then checkpoints, so
    /// that many segments are there to recycle.
    pub(crate) async fn warm_wal(&self, megabytes: u64) -> Result<()> {
        sqlx::query("DROP TABLE IF EXISTS bench_wal_warmup")
            .execute(&self.admin)
            .await?;
        // rows of about 1 KB: each writes about that much WAL
        sqlx::query("CREATE TABLE bench_wal_warmup (id bigint, pad text)")
            .execute(&self.admin)
            .await?;
        let rows = i64::try_from(megabytes * 1000).unwrap_or(i64::MAX);
        sqlx::query(
            "INSERT INTO bench_wal_warmup SELECT g, repeat('w', 900) FROM generate_series(1, $1) g",
        )
        .bind(rows)
        .execute(&self.admin)
        .await?;
        sqlx::query("DROP TABLE bench_wal_warmup")
            .execute(&self.admin)
            .await?;
        sqlx::query("CHECKPOINT").execute(&self.admin).await?;
        Ok(())
    }

    /// Empties the run tables (servers stopped), so each benchmark starts
    /// from the same place.
    pub(crate) async fn reset(&self) -> Result<()> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass('runs') IS NOT NULL")
            .fetch_one(&self.db)
            .await?;
        if exists {
            sqlx::query(
                "TRUNCATE runs, run_nodes, tasks, timers, event_waits, pending_events, \
                 run_inbox, outbox, run_events, idempotency_keys, run_trees, bulk_operations",
            )
            .execute(&self.db)
            .await?;
        }
        let blobs: bool = sqlx::query_scalar("SELECT to_regclass('blobs') IS NOT NULL")
            .fetch_one(&self.db)
            .await?;
        if blobs {
            sqlx::query("TRUNCATE blob_refs, blobs")
                .execute(&self.db)
                .await?;
        }
        procs::next_blob_folder();
        Ok(())
    }
}

pub(crate) async fn stop_all(servers: Vec<Server>) {
    for server in servers {
        for line in server.complaints().iter().take(5) {
            eprintln!("bench: server said: {line}");
        }
        server.stop().await;
    }
}

// ---------------------------------------------------------------- floor

/// pgbench results.
#[derive(Debug, Clone)]
pub struct Floor {
    /// The event transaction as 8 round trips (BEGIN, 6 statements, COMMIT).
    pub multi_tps: f64,
    /// The same writes as one statement (a CTE).
    pub cte_tps: f64,
    /// pgbench clients.
    pub clients: u32,
}

const FLOOR_RUNS: u32 = 10_000;

/// pgbench, or what to install.
pub(crate) fn pgbench() -> Result<PathBuf> {
    pgbench_path().context(
        "pgbench not found (apt-get install -y postgresql-contrib; scripts/setup.sh does it)",
    )
}

fn pgbench_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("pgbench").is_file() {
                return Some(dir.join("pgbench"));
            }
        }
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let p = e.path().join("bin/pgbench");
            p.is_file().then_some((v, p))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// What one event transaction of a three-step run writes, with the engine's
/// own tables and indexes (the migrations applied to a database `floor`).
pub async fn floor(ctx: &Ctx) -> Result<Floor> {
    let pgbench = pgbench()?;
    let url = fresh_database(ctx, "floor").await?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await?;
    for sql in [
        format!(
            "INSERT INTO runs (id, namespace, workflow_name, workflow_version, status, input, record) \
             SELECT md5(i::text)::uuid, 'default', 'floor', 1, 'RUNNING', '{{}}', '{RECORD}' \
             FROM generate_series(1, {FLOOR_RUNS}) i"
        ),
        format!(
            "INSERT INTO tasks (id, namespace, run_id, node_key, workflow_name, workflow_version, queue, \
               task_name, status, attempt, input, heartbeat_timeout_ms, lease_token) \
             SELECT md5('t' || i)::uuid, 'default', md5(i::text)::uuid, 'a', 'floor', 1, 'bench', \
               'step1', 'LEASED', 1, '{{}}', 30000, gen_random_uuid() \
             FROM generate_series(1, {FLOOR_RUNS}) i"
        ),
        "CREATE SEQUENCE floor_seq".to_owned(),
        "VACUUM ANALYZE".to_owned(),
    ] {
        sqlx::query(&sql).execute(&pool).await?;
    }
    pool.close().await;
    let dir = ctx.out_dir.join("floor");
    std::fs::create_dir_all(&dir)?;
    let multi = dir.join("event-8-round-trips.sql");
    let cte = dir.join("event-1-statement.sql");
    std::fs::write(&multi, floor_script_multi())?;
    std::fs::write(&cte, floor_script_cte())?;
    let clients = 16;
    let multi_tps = run_pgbench(&pgbench, &multi, &url, clients, ctx.profile.floor_secs).await?;
    let cte_tps = run_pgbench(&pgbench, &cte, &url, clients, ctx.profile.floor_secs).await?;
    let _ = sqlx::query("DROP DATABASE IF EXISTS floor WITH (FORCE)")
        .execute(&ctx.admin)
        .await;
    Ok(Floor {
        multi_tps,
        cte_tps,
        clients,
    })
}

/// A database `name` made anew, with the engine's migrations applied; its
/// URL.
pub(crate) async fn fresh_database(ctx: &Ctx, name: &str) -> Result<String> {
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&ctx.admin)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&ctx.admin)
        .await?;
    let url = ctx.backends.url_of(name);
    let status = Command::new(&ctx.composer)
        .args(["migrate", "--database-url", &url, "--redis-url"])
        .arg(&ctx.backends.redis_url)
        .args(["--log", "warn"])
        .stdout(Stdio::null())
        .status()
        .await?;
    if !status.success() {
        bail!("composer migrate on the {name} database failed");
    }
    Ok(url)
}

/// A run record of the size the engine writes for a three-step run.
const RECORD: &str = r#"{"run_id": "0192b8a4-6b0e-7c1a-9d7e-3f4a5b6c7d8e", "workflow": "bench_linear", "version": 1, "input": {}, "status": "RUNNING", "started_at": 1764440000000, "active": 1, "compensable": [], "failed": [], "compensated": false}"#;

fn floor_script_multi() -> String {
    format!(
        "\\set r random(1, {FLOOR_RUNS})\n\
BEGIN;\n\
SELECT id, status, record, history_seq FROM runs WHERE id = md5(:r::text)::uuid FOR UPDATE;\n\
INSERT INTO run_events (run_id, seq, namespace, event_type, node_key, attempt, actor, details) VALUES (md5(:r::text)::uuid, nextval('floor_seq'), 'default', 'task_completed', 'a', 1, 'worker-bench', '{{\"output\": {{}}}}');\n\
UPDATE tasks SET status = 'COMPLETED', outcome = 'COMPLETED', lease_expires_at = NULL, updated_at = now() WHERE id = md5('t' || :r::text)::uuid;\n\
INSERT INTO tasks (id, namespace, run_id, node_key, workflow_name, workflow_version, queue, task_name, status, attempt, input, heartbeat_timeout_ms, dispatched_at) VALUES (md5('n' || nextval('floor_seq'))::uuid, 'default', md5(:r::text)::uuid, 'n' || currval('floor_seq'), 'floor', 1, 'bench', 'step2', 'DISPATCHED', 1, '{{}}', 30000, now());\n\
INSERT INTO outbox (namespace, queue, task_id, attempt, shard_key) VALUES ('default', 'bench', md5('n' || currval('floor_seq'))::uuid, 1, md5(:r::text)::uuid);\n\
UPDATE runs SET status = 'RUNNING', record = '{RECORD}', history_seq = history_seq + 1, updated_at = now() WHERE id = md5(:r::text)::uuid;\n\
END;\n"
    )
}

fn floor_script_cte() -> String {
    format!(
        "\\set r random(1, {FLOOR_RUNS})\n\
WITH run AS (SELECT id FROM runs WHERE id = md5(:r::text)::uuid FOR UPDATE), \
h AS (INSERT INTO run_events (run_id, seq, namespace, event_type, node_key, attempt, actor, details) SELECT id, nextval('floor_seq'), 'default', 'task_completed', 'a', 1, 'worker-bench', '{{\"output\": {{}}}}' FROM run), \
done AS (UPDATE tasks SET status = 'COMPLETED', outcome = 'COMPLETED', lease_expires_at = NULL, updated_at = now() WHERE id = md5('t' || :r::text)::uuid), \
armed AS (INSERT INTO tasks (id, namespace, run_id, node_key, workflow_name, workflow_version, queue, task_name, status, attempt, input, heartbeat_timeout_ms, dispatched_at) SELECT gen_random_uuid(), 'default', id, 'n' || nextval('floor_seq'), 'floor', 1, 'bench', 'step2', 'DISPATCHED', 1, '{{}}', 30000, now() FROM run RETURNING id, run_id), \
queued AS (INSERT INTO outbox (namespace, queue, task_id, attempt, shard_key) SELECT 'default', 'bench', id, 1, run_id FROM armed) \
UPDATE runs SET status = 'RUNNING', record = '{RECORD}', history_seq = history_seq + 1, updated_at = now() WHERE id = (SELECT id FROM run);\n"
    )
}

pub(crate) async fn run_pgbench(
    pgbench: &Path,
    script: &Path,
    url: &str,
    clients: u32,
    secs: u64,
) -> Result<f64> {
    let output = Command::new(pgbench)
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &clients.to_string(),
            "-j",
            "2",
        ])
        .args(["-T", &secs.to_string(), "-f"])
        .arg(script)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .await?;
    let text = String::from_utf8_lossy(&output.stdout);
    let tps = text
        .lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.trim_start_matches("tps = ").split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok());
    match tps {
        Some(tps) => Ok(tps),
        None => bail!(
            "pgbench gave no tps:\n{text}\n{}",
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

// ---------------------------------------------------------------- helpers

pub(crate) async fn register(url: &str, source: &str) -> Result<()> {
    register_as(url, &Bearer::none(), source).await
}

/// [`register`] with `bearer`'s token.
pub(crate) async fn register_as(url: &str, bearer: &Bearer, source: &str) -> Result<()> {
    let mut client = WorkflowServiceClient::with_interceptor(channel(url).await?, bearer.clone())
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    client
        .register_workflow(RegisterWorkflowRequest {
            source: source.to_owned(),
        })
        .await
        .with_context(|| format!("register {}", source.lines().next().unwrap_or_default()))?;
    Ok(())
}

pub(crate) fn start_request(workflow: &str, input: Json) -> StartRunRequest {
    StartRunRequest {
        workflow_name: workflow.to_owned(),
        version: 0,
        input: Some(composer_grpc::convert::from_json(&input)),
        idempotency_key: String::new(),
        labels: HashMap::default(),
        priority: 0,
    }
}

pub(crate) fn linear_workflow(name: &str, queue: &str) -> String {
    format!(
        "name: {name}\nnodes:\n\
  - {{ id: a, type: TASK, queue: {queue}, task: step1 }}\n\
  - {{ id: b, type: TASK, queue: {queue}, task: step2 }}\n\
  - {{ id: c, type: TASK, queue: {queue}, task: step3 }}\n\
edges:\n  - {{ from: a, to: b }}\n  - {{ from: b, to: c }}\n"
    )
}

/// Percentiles of a sample, in ms.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dist {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Sample size.
    pub n: usize,
}

pub(crate) fn dist(mut values: Vec<f64>) -> Dist {
    if values.is_empty() {
        return Dist::default();
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() as f64 - 1.0) * q).round() as usize];
    Dist {
        p50: at(0.5),
        p99: at(0.99),
        max: values[values.len() - 1],
        n: values.len(),
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

// ---------------------------------------------------------------- B1 / B5

/// Which worker serves B1.
#[derive(Debug, Clone)]
pub enum WorkerKind {
    /// [`FastWorker`], in this process.
    Rust,
    /// An SDK's worker program (`bench/python_worker.py`,
    /// `bench/go_worker`, `bench/ts_worker`): run with `HOST:PORT QUEUE
    /// SLOTS`, it prints its completed-task count every 50 ms.
    Sdk(SdkWorker),
}

/// An SDK's B1 worker program.
#[derive(Debug, Clone)]
pub struct SdkWorker {
    /// `Python SDK`, `Go SDK`, `TypeScript SDK`.
    pub name: String,
    /// The program and its first arguments; address, queue and slots follow.
    pub command: Vec<String>,
}

/// One B1/B5 row.
#[derive(Debug, Clone, Default)]
pub struct Throughput {
    /// What ran.
    pub label: String,
    /// Servers.
    pub servers: usize,
    /// Completed runs per second.
    pub runs_per_s: f64,
    /// Completed tasks per second.
    pub tasks_per_s: f64,
    /// Postgres commits per task (database `composer`).
    pub commits_per_task: f64,
    /// Postgres rollbacks per task.
    pub rollbacks_per_task: f64,
    /// Transactions that wrote (got a transaction id) per task.
    pub writes_per_task: f64,
    /// WAL bytes Postgres wrote per task (what a replica must receive).
    pub wal_bytes_per_task: f64,
    /// Server CPU seconds per 1,000 tasks (all servers).
    pub server_cpu: f64,
    /// Postgres CPU seconds per 1,000 tasks (all its processes).
    pub pg_cpu: f64,
    /// Redis CPU seconds per 1,000 tasks.
    pub redis_cpu: f64,
    /// Load generator + worker CPU seconds per 1,000 tasks.
    pub client_cpu: f64,
    /// Peak RSS of the largest server, MiB.
    pub peak_rss_mib: f64,
    /// Statements per task (pg_stat_statements: calls, incl. BEGIN/COMMIT).
    pub statements_per_task: Option<f64>,
    /// The costliest statements: (text, calls per task, exec ms per task).
    pub top_statements: Vec<(String, f64, f64)>,
    /// perf output (comm breakdown and server symbols), if sampled.
    pub perf: Option<String>,
    /// Where the window's WAL went, if broken down.
    pub wal: Option<crate::wal::WalBreakdown>,
    /// StartRun or report errors.
    pub errors: u64,
}

#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    commits: i64,
    rollbacks: i64,
    server: u64,
    pg: u64,
    redis: u64,
    client: u64,
    tasks: u64,
    runs: u64,
    next_xid: i64,
    wal_bytes: i64,
    /// The WAL's insert position, as Postgres prints it.
    lsn: String,
}

/// B1 (one server) or B5 (several): a closed loop of three-step runs, on
/// servers started with `extra` flags.
pub async fn throughput(
    ctx: &Ctx,
    label: &str,
    server_count: usize,
    kind: WorkerKind,
    measure_secs: u64,
    perf_secs: u64,
    extra: &[String],
) -> Result<Throughput> {
    let load = Load::plain(ctx, kind, measure_secs, perf_secs);
    throughput_of(ctx, label, server_count, load, extra).await
}

/// B1: one server, the Rust worker, the profile's window and perf
/// sampling, and where its WAL bytes go.
pub async fn b1(ctx: &Ctx) -> Result<Throughput> {
    let load = Load {
        wal_breakdown: true,
        ..Load::plain(
            ctx,
            WorkerKind::Rust,
            ctx.profile.measure_secs,
            ctx.profile.perf_secs,
        )
    };
    throughput_of(ctx, "B1 Rust worker", 1, load, &[]).await
}

/// What a B1 row runs: the worker, the measured window, perf sampling, and
/// the size of each run's input and each task's output (0: empty objects),
/// and the runs in flight (over all servers).
pub struct Load {
    pub kind: WorkerKind,
    pub measure_secs: u64,
    pub perf_secs: u64,
    pub payload_bytes: usize,
    /// Over this many bytes of JSON the worker uploads its output and
    /// reports a reference, and it downloads the references in its input,
    /// as the SDKs do (0: it reports inline and never downloads).
    pub offload_bytes: usize,
    pub in_flight: usize,
    /// Each server's CPU budget in cores (B5); None: unbounded.
    pub server_cores: Option<f64>,
    /// Break the window's WAL down by record type and relation.
    pub wal_breakdown: bool,
}

impl Load {
    /// `kind` over `measure_secs` (perf over `perf_secs`): empty payloads,
    /// the profile's runs in flight, no CPU budget, no WAL breakdown.
    pub fn plain(ctx: &Ctx, kind: WorkerKind, measure_secs: u64, perf_secs: u64) -> Self {
        Self {
            kind,
            measure_secs,
            perf_secs,
            payload_bytes: 0,
            offload_bytes: 0,
            in_flight: ctx.profile.in_flight,
            server_cores: None,
            wal_breakdown: false,
        }
    }
}

/// Numbers each run's payload apart from every other's in this process.
static RUN_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// [`throughput`] of any [`Load`].
pub async fn throughput_of(
    ctx: &Ctx,
    label: &str,
    server_count: usize,
    load: Load,
    extra: &[String],
) -> Result<Throughput> {
    ctx.reset().await?;
    let servers = ctx
        .start_budgeted_servers(server_count, extra, load.server_cores)
        .await?;
    let result = throughput_on(ctx, label, &servers, load).await;
    let peak = servers
        .iter()
        .map(|s| procs::peak_rss_mib(s.pid))
        .fold(0.0, f64::max);
    stop_all(servers).await;
    let mut row = result?;
    row.peak_rss_mib = peak;
    Ok(row)
}

/// Writes out what the phases before wrote (pgbench's floor, B6's fill),
/// so that a checkpoint of their pages does not fall in the next window:
/// each window measures its own writes only.
pub(crate) async fn checkpoint(ctx: &Ctx) -> Result<()> {
    sqlx::raw_sql("CHECKPOINT")
        .execute(&ctx.admin)
        .await
        .context("CHECKPOINT")?;
    Ok(())
}

pub(crate) async fn throughput_on(
    ctx: &Ctx,
    label: &str,
    servers: &[Server],
    load: Load,
) -> Result<Throughput> {
    let Load {
        kind,
        measure_secs,
        perf_secs,
        payload_bytes,
        offload_bytes: load_offload_bytes,
        in_flight,
        server_cores: _,
        wal_breakdown,
    } = load;
    checkpoint(ctx).await?;
    // converted once: a run's request copies the payload only to send it
    let input = composer_grpc::convert::from_json(&if payload_bytes == 0 {
        serde_json::json!({})
    } else {
        serde_json::json!({ "blob": incompressible_text(payload_bytes) })
    });
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    // each worker kind its own workflow and queue: a run left from another
    // row never reaches this row's worker
    let (workflow, queue) = match &kind {
        WorkerKind::Rust => ("bench_linear".to_owned(), "bench".to_owned()),
        WorkerKind::Sdk(sdk) => {
            let slug: String = sdk
                .name
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .collect::<String>()
                .to_ascii_lowercase();
            (format!("bench_linear_{slug}"), format!("bench_{slug}"))
        }
    };
    let (workflow, queue) = (workflow.as_str(), queue.as_str());
    register(&urls[0], &linear_workflow(workflow, queue)).await?;
    // large payloads: fewer runs in flight, so the machine's memory and
    // not the loop's depth bounds what is measured
    let in_flight = in_flight.min((20 << 20) / payload_bytes.max(1)).max(20);
    // a run has one task out at a time: slots for all of them
    let slots = in_flight.max(512);
    let in_flight = Arc::new(Semaphore::new(in_flight));
    let runs_done = Arc::new(AtomicU64::new(0));
    let tasks_done = Arc::new(AtomicU64::new(0));
    let mut rust_worker = None;
    let mut sdk_child = None;
    match &kind {
        WorkerKind::Rust => {
            let permits = Arc::clone(&in_flight);
            let done = Arc::clone(&runs_done);
            let hook: Hook = Arc::new(move |event| {
                if let WorkerEvent::Reported { task_name, .. } = event
                    && task_name == "step3"
                {
                    done.fetch_add(1, Ordering::Relaxed);
                    permits.add_permits(1);
                }
            });
            let worker = FastWorker::start(
                &urls,
                &WorkerConfig {
                    queue: queue.to_owned(),
                    pollers_per_server: 4,
                    connections_per_server: 2,
                    slots,
                    // a poll's answer carries every task's input
                    max_per_poll: ((2 << 20) / payload_bytes.max(1)).clamp(1, 100),
                    output_bytes: payload_bytes,
                    offload_bytes: load_offload_bytes,
                },
                Some(hook),
            )
            .await?;
            rust_worker = Some(worker);
        }
        WorkerKind::Sdk(sdk) => {
            let address = urls[0].trim_start_matches("http://").to_owned();
            let (program, first_args) = sdk.command.split_first().context("empty command")?;
            let mut child = Command::new(program)
                .args(first_args)
                // the Rust worker's slots: an SDK worker with fewer would
                // be measured against its own slot count, not its speed
                .args([address.as_str(), queue, &slots.to_string()])
                .current_dir(&ctx.repo)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("start the {} worker", sdk.name))?;
            let stdout = child.stdout.take().context("worker stdout")?;
            let permits = Arc::clone(&in_flight);
            let runs = Arc::clone(&runs_done);
            let tasks = Arc::clone(&tasks_done);
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let Ok(completed) = line.trim().parse::<u64>() else {
                        continue;
                    };
                    tasks.store(completed, Ordering::Relaxed);
                    let whole = completed / 3;
                    let before = runs.swap(whole, Ordering::Relaxed);
                    if whole > before {
                        permits.add_permits(usize::try_from(whole - before).unwrap_or(0));
                    }
                }
            });
            sdk_child = Some(child);
        }
    }

    // the closed loop: a run starts whenever one ends
    let (stop_tx, stop_rx) = watch::channel(false);
    let started = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut starters = Vec::new();
    for url in urls.iter().cycle().take(4 * urls.len()) {
        let client = RunServiceClient::new(channel(url).await?);
        let permits = Arc::clone(&in_flight);
        let started = Arc::clone(&started);
        let errors = Arc::clone(&errors);
        let mut stop = stop_rx.clone();
        let workflow = workflow.to_owned();
        let input = input.clone();
        starters.push(tokio::spawn(async move {
            loop {
                let permit = tokio::select! {
                    p = permits.acquire() => match p { Ok(p) => p, Err(_) => return },
                    _ = stop.changed() => return,
                };
                permit.forget();
                let mut client = client.clone();
                let mut input = input.clone();
                if payload_bytes > 0
                    && let Some(prost_types::value::Kind::StructValue(fields)) = &mut input.kind
                {
                    // each run's bytes its own: no blob is shared by content
                    let run = RUN_SEQUENCE.fetch_add(1, Ordering::Relaxed);
                    fields.fields.insert(
                        "run".to_owned(),
                        composer_grpc::convert::from_json(&serde_json::json!(run)),
                    );
                }
                let request = StartRunRequest {
                    input: Some(input),
                    ..start_request(&workflow, serde_json::json!(null))
                };
                let started = Arc::clone(&started);
                let errors = Arc::clone(&errors);
                let permits = Arc::clone(&permits);
                tokio::spawn(async move {
                    match client.start_run(request).await {
                        Ok(_) => {
                            started.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            permits.add_permits(1);
                        }
                    }
                });
            }
        }));
    }

    let sdk_pid = sdk_child
        .as_ref()
        .and_then(|c| c.id())
        .and_then(|p| i32::try_from(p).ok());
    let tasks_now = || match &rust_worker {
        Some(w) => w.stats.completed.load(Ordering::Relaxed),
        None => tasks_done.load(Ordering::Relaxed),
    };
    let pg_pid = ctx.backends.postmaster_pid().unwrap_or(0);
    let redis_pid = ctx.backends.redis_pid().unwrap_or(0);
    let self_pid = i32::try_from(std::process::id()).unwrap_or(0);
    let sample = || async {
        // the next transaction id (consumes none): its delta counts the
        // transactions that wrote, exactly and at once (pg_stat_database
        // counters are flushed by each backend at most once a second)
        let row = sqlx::query(
            "SELECT xact_commit, xact_rollback, \
               pg_snapshot_xmax(pg_current_snapshot())::text::bigint, \
             pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, \
             pg_current_wal_lsn()::text \
             FROM pg_stat_database WHERE datname = 'composer'",
        )
        .fetch_one(&ctx.admin)
        .await?;
        anyhow::Ok(Sample {
            at: Instant::now(),
            commits: row.try_get(0)?,
            rollbacks: row.try_get(1)?,
            next_xid: row.try_get(2)?,
            wal_bytes: row.try_get(3)?,
            lsn: row.try_get(4)?,
            server: servers.iter().map(|s| procs::cpu_ticks(s.pid)).sum(),
            pg: procs::tree_ticks(pg_pid),
            redis: procs::cpu_ticks(redis_pid),
            client: procs::cpu_ticks(self_pid) + sdk_pid.map_or(0, procs::tree_ticks),
            tasks: tasks_now(),
            runs: runs_done.load(Ordering::Relaxed),
        })
    };

    tokio::time::sleep(Duration::from_secs(ctx.profile.warm_secs)).await;
    if tasks_now() == 0 {
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    analyze_run_tables(ctx).await?;
    if wal_breakdown {
        // the window's segments stay for pg_waldump, checkpoints or not
        keep_wal(&ctx.admin, "16GB").await?;
    }
    if ctx.backends.statements {
        let _ = sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(&ctx.admin)
            .await;
    }
    let s0 = sample().await?;
    tokio::time::sleep(Duration::from_secs(measure_secs)).await;
    let s1 = sample().await?;
    let statements = if ctx.backends.statements {
        match read_statements(&ctx.admin).await {
            Ok(statements) => Some(statements),
            Err(error) => {
                eprintln!("bench: pg_stat_statements not read: {error:#}");
                None
            }
        }
    } else {
        None
    };
    let perf = if perf_secs > 0 {
        profile_with_perf(ctx, label, servers, perf_secs).await
    } else {
        None
    };

    let _ = stop_tx.send(true);
    for starter in starters {
        let _ = starter.await;
    }
    let drain_until = Instant::now() + Duration::from_secs(15);
    while runs_done.load(Ordering::Relaxed) < started.load(Ordering::Relaxed)
        && Instant::now() < drain_until
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut report_errors = 0;
    if let Some(worker) = rust_worker {
        report_errors = worker.stats.report_errors.load(Ordering::Relaxed);
        worker.stop().await;
    }
    if let Some(mut child) = sdk_child {
        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }

    let secs = (s1.at - s0.at).as_secs_f64();
    let tasks = (s1.tasks - s0.tasks) as f64;
    if tasks == 0.0 {
        bail!("{label}: no task completed in the measured window");
    }
    let wal = if wal_breakdown {
        let broken = wal_of_window(ctx, &ctx.db, (&s0.lsn, &s1.lsn), tasks).await;
        keep_wal(&ctx.admin, "0").await?;
        match broken {
            Ok(wal) => Some(wal),
            Err(error) => {
                eprintln!("bench: {label}: WAL not broken down: {error:#}");
                None
            }
        }
    } else {
        None
    };
    let per_1k = |ticks: u64| ticks as f64 / TICKS_PER_SECOND / tasks * 1000.0;
    let mut row = Throughput {
        label: label.to_owned(),
        servers: servers.len(),
        runs_per_s: (s1.runs - s0.runs) as f64 / secs,
        tasks_per_s: tasks / secs,
        commits_per_task: (s1.commits - s0.commits) as f64 / tasks,
        rollbacks_per_task: (s1.rollbacks - s0.rollbacks) as f64 / tasks,
        writes_per_task: (s1.next_xid - s0.next_xid) as f64 / tasks,
        wal_bytes_per_task: (s1.wal_bytes - s0.wal_bytes) as f64 / tasks,
        server_cpu: per_1k(s1.server - s0.server),
        pg_cpu: per_1k(s1.pg.saturating_sub(s0.pg)),
        redis_cpu: per_1k(s1.redis - s0.redis),
        client_cpu: per_1k(s1.client - s0.client),
        errors: errors.load(Ordering::Relaxed) + report_errors,
        perf,
        wal,
        ..Throughput::default()
    };
    if let Some(statements) = statements {
        row.statements_per_task = Some(statements.iter().map(|s| s.1).sum::<f64>() / tasks);
        row.top_statements = statements
            .into_iter()
            .take(25)
            .map(|(q, calls, time)| (q, calls / tasks, time / tasks))
            .collect();
    }
    Ok(row)
}

/// Sets `wal_keep_size` (superuser `admin`) and reloads the configuration.
pub(crate) async fn keep_wal(admin: &PgPool, size: &str) -> Result<()> {
    sqlx::query(&format!("ALTER SYSTEM SET wal_keep_size = '{size}'"))
        .execute(admin)
        .await
        .context("set wal_keep_size")?;
    sqlx::query("SELECT pg_reload_conf()")
        .execute(admin)
        .await
        .context("reload the configuration")?;
    Ok(())
}

/// The window's WAL by record type and relation, read with the server's
/// own `pg_waldump` (beside its `postgres`).
pub(crate) async fn wal_of_window(
    ctx: &Ctx,
    db: &PgPool,
    lsns: (&str, &str),
    tasks: f64,
) -> Result<crate::wal::WalBreakdown> {
    let pid = ctx.backends.postmaster_pid().context("no postmaster pid")?;
    let postgres =
        std::fs::read_link(format!("/proc/{pid}/exe")).context("the postmaster's binary")?;
    let waldump = postgres.with_file_name("pg_waldump");
    let data_dir: String = sqlx::query_scalar("SHOW data_directory")
        .fetch_one(&ctx.admin)
        .await?;
    crate::wal::breakdown(db, &waldump, std::path::Path::new(&data_dir), lsns, tasks).await
}

/// Statistics that match the tables before the measured window, as
/// autovacuum keeps them in a running system. Each row starts from emptied
/// tables, and a connection's cached generic plan made in its first second
/// (a seq scan and hash join of a table of a few hundred rows) would
/// otherwise stay for the whole row: autovacuum looks once a minute. ANALYZE
/// invalidates those plans, so each connection plans again at its next
/// call (2026-12-02: 3,446 seq scans reading 51.6 M task rows in four
/// three-server B5 rows without it).
async fn analyze_run_tables(ctx: &Ctx) -> Result<()> {
    sqlx::query("ANALYZE runs, run_nodes, tasks")
        .execute(&ctx.db)
        .await
        .context("analyze the run tables after the warm-up")?;
    // the blob tables, where this server has them
    let _ = sqlx::query("ANALYZE blobs, blob_refs")
        .execute(&ctx.db)
        .await;
    Ok(())
}

async fn read_statements(admin: &PgPool) -> Result<Vec<(String, f64, f64)>> {
    let rows = sqlx::query(
        "SELECT s.query, s.calls::float8, s.total_exec_time FROM pg_stat_statements s \
         JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = 'composer' \
         ORDER BY s.total_exec_time DESC",
    )
    .fetch_all(admin)
    .await?;
    rows.iter()
        .map(|r| {
            let query: String = r.try_get(0)?;
            let text = query.split_whitespace().collect::<Vec<_>>().join(" ");
            Ok((text, r.try_get(1)?, r.try_get(2)?))
        })
        .collect()
}

async fn profile_with_perf(
    ctx: &Ctx,
    label: &str,
    servers: &[Server],
    secs: u64,
) -> Option<String> {
    let data = ctx.out_dir.join(format!(
        "perf-{}.data",
        label.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
    ));
    let recorded = Command::new("perf")
        .args(["record", "-a", "-g", "-F", "499", "-o"])
        .arg(&data)
        .args(["--", "sleep", &secs.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .ok()?;
    if !recorded.success() {
        return None;
    }
    let report = |extra: Vec<String>| {
        let data = data.clone();
        async move {
            let output = Command::new("perf")
                .args([
                    "report",
                    "--stdio",
                    "--no-children",
                    "-g",
                    "none",
                    "--percent-limit",
                    "0.7",
                    "-i",
                ])
                .arg(&data)
                .args(extra)
                .stderr(Stdio::null())
                .output()
                .await
                .ok()?;
            let text = String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .map(|l| l.trim_end().trim_end_matches(['-', ' ']))
                .take(30)
                .collect::<Vec<_>>()
                .join("\n");
            Some(text)
        }
    };
    let by_process = report(vec!["--sort".into(), "comm,dso".into()]).await?;
    let pids = servers
        .iter()
        .map(|s| s.pid.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let server = report(vec![
        "--pid".into(),
        pids,
        "--sort".into(),
        "dso,symbol".into(),
        "--percentage".into(),
        "relative".into(),
    ])
    .await?;
    let pg = report(vec![
        "--comm".into(),
        "postgres".into(),
        "--sort".into(),
        "symbol".into(),
        "--percentage".into(),
        "relative".into(),
    ])
    .await
    .unwrap_or_default();
    let text = format!(
        "== perf: whole machine by process and object ({secs} s, 499 Hz, all CPUs)\n{by_process}\n\
         == perf: the server alone (relative %), by object and symbol\n{server}\n== perf: Postgres alone (relative %), by symbol\n{pg}\n"
    );
    let _ = std::fs::write(data.with_extension("txt"), &text);
    Some(text)
}

// ---------------------------------------------------------------- B2

/// B2 results.
#[derive(Debug, Clone, Default)]
pub struct Latency {
    /// StartRun sent → first task leased.
    pub start_to_lease: Dist,
    /// Report sent → next task leased.
    pub dispatch: Dist,
    /// StartRun sent → last report answered (the run completes in it).
    pub whole_run: Dist,
    /// Runs started per second.
    pub rate: f64,
}

#[derive(Debug, Default)]
struct RunTimes {
    start_sent: Option<Instant>,
    leases: BTreeMap<String, Instant>,
    reports: BTreeMap<String, (Instant, Instant)>,
}

/// B2: ~10 runs/s, open loop.
pub async fn latency(ctx: &Ctx) -> Result<Latency> {
    ctx.reset().await?;
    let servers = ctx.start_servers(1).await?;
    let result = latency_on(ctx, &servers[0]).await;
    stop_all(servers).await;
    result
}

async fn latency_on(ctx: &Ctx, server: &Server) -> Result<Latency> {
    let open_loop = OpenLoop::start(&server.url, &Bearer::none()).await?;
    let started = open_loop
        .drive(Until::Runs(ctx.profile.latency_secs * 10))
        .await;
    open_loop.settle(&started, Duration::from_secs(10)).await;
    let latency = open_loop.latency(&started);
    open_loop.stop().await;
    Ok(latency)
}

/// B2's open loop, also run as the victim of other loads (the bulk retry,
/// B8): three-step runs of [`OPEN_LOOP_WORKFLOW`], started one every
/// [`OPEN_LOOP_TICK`] whatever the server answers, and a worker on their
/// queue that notes when each task reaches it and each report is answered.
pub(crate) struct OpenLoop {
    client: RunServiceClient<Authed>,
    worker: FastWorker,
    times: Arc<Mutex<HashMap<String, RunTimes>>>,
}

/// The open loop's workflow and its queue.
pub(crate) const OPEN_LOOP_WORKFLOW: &str = "bench_latency";
const OPEN_LOOP_QUEUE: &str = "bench_lat";
/// The open loop's pace: 10 runs/s.
const OPEN_LOOP_TICK: Duration = Duration::from_millis(100);

/// How long an open loop starts runs.
pub(crate) enum Until {
    /// This many runs, one a tick.
    Runs(u64),
    /// Until the flag is set.
    Stopped(Arc<AtomicBool>),
}

/// The runs one stretch of an open loop started.
#[derive(Debug, Clone, Default)]
pub(crate) struct Started {
    /// Their ids (runs whose StartRun failed are not here).
    pub runs: HashSet<String>,
    /// Runs sent per second.
    pub rate: f64,
}

impl Started {
    /// Both stretches as one sample.
    pub(crate) fn and(mut self, other: Started) -> Started {
        self.rate = (self.rate + other.rate) / 2.0;
        self.runs.extend(other.runs);
        self
    }
}

impl OpenLoop {
    /// Registers the workflow as `bearer`, starts the worker with the same
    /// token and lets its pollers reach the server.
    pub(crate) async fn start(url: &str, bearer: &Bearer) -> Result<Self> {
        register_as(
            url,
            bearer,
            &linear_workflow(OPEN_LOOP_WORKFLOW, OPEN_LOOP_QUEUE),
        )
        .await?;
        let times: Arc<Mutex<HashMap<String, RunTimes>>> = Arc::default();
        let recorder = Arc::clone(&times);
        let hook: Hook = Arc::new(move |event| {
            let mut times = recorder.lock().unwrap_or_else(|p| p.into_inner());
            match event {
                WorkerEvent::Leased { run_id, node, at } => {
                    times.entry(run_id).or_default().leases.insert(node, at);
                }
                WorkerEvent::Reported {
                    run_id,
                    task_name,
                    sent,
                    done,
                } => {
                    times
                        .entry(run_id)
                        .or_default()
                        .reports
                        .insert(task_name, (sent, done));
                }
            }
        });
        let worker = FastWorker::start_as(
            &[url.to_owned()],
            &WorkerConfig {
                queue: OPEN_LOOP_QUEUE.to_owned(),
                pollers_per_server: 4,
                connections_per_server: 1,
                slots: 64,
                max_per_poll: 8,
                output_bytes: 0,
                offload_bytes: 0,
            },
            Some(hook),
            bearer,
        )
        .await?;
        let client = RunServiceClient::with_interceptor(channel(url).await?, bearer.clone());
        // let the pollers reach the server and its stream reader start
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok(Self {
            client,
            worker,
            times,
        })
    }

    /// Starts a run every tick, without waiting for the answers, `until`
    /// says stop; returns once every StartRun has been answered.
    pub(crate) async fn drive(&self, until: Until) -> Started {
        let began = Instant::now();
        let runs: Arc<Mutex<HashSet<String>>> = Arc::default();
        let mut ticker = tokio::time::interval(OPEN_LOOP_TICK);
        let mut pending = Vec::new();
        let mut sent: u64 = 0;
        loop {
            let enough = match &until {
                Until::Runs(limit) => sent >= *limit,
                Until::Stopped(flag) => flag.load(Ordering::Relaxed),
            };
            if enough {
                break;
            }
            ticker.tick().await;
            sent += 1;
            let mut client = self.client.clone();
            let times = Arc::clone(&self.times);
            let runs = Arc::clone(&runs);
            pending.push(tokio::spawn(async move {
                let sent = Instant::now();
                if let Ok(response) = client
                    .start_run(start_request(OPEN_LOOP_WORKFLOW, serde_json::json!({})))
                    .await
                    && let Some(run) = response.into_inner().run
                {
                    let mut times = times.lock().unwrap_or_else(|p| p.into_inner());
                    times.entry(run.run_id.clone()).or_default().start_sent = Some(sent);
                    runs.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(run.run_id);
                }
            }));
        }
        let rate = sent as f64 / began.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
        for p in pending {
            let _ = p.await;
        }
        let runs = std::mem::take(&mut *runs.lock().unwrap_or_else(|p| p.into_inner()));
        Started { runs, rate }
    }

    /// Waits, at most `limit`, until every run of `started` has had its last
    /// report answered: the runs started last still have steps to go.
    pub(crate) async fn settle(&self, started: &Started, limit: Duration) {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            let done = {
                let times = self.times.lock().unwrap_or_else(|p| p.into_inner());
                started
                    .runs
                    .iter()
                    .filter(|run| {
                        times
                            .get(*run)
                            .is_some_and(|t| t.reports.contains_key("step3"))
                    })
                    .count()
            };
            if done >= started.runs.len() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The latencies of the runs of `started`.
    pub(crate) fn latency(&self, started: &Started) -> Latency {
        let times = self.times.lock().unwrap_or_else(|p| p.into_inner());
        let (mut first, mut dispatch, mut whole) = (Vec::new(), Vec::new(), Vec::new());
        for t in started.runs.iter().filter_map(|run| times.get(run)) {
            let Some(start) = t.start_sent else { continue };
            if let Some(lease) = t.leases.get("a") {
                first.push(ms(lease.saturating_duration_since(start)));
            }
            for (report, next) in [("step1", "b"), ("step2", "c")] {
                if let (Some((sent, _)), Some(lease)) = (t.reports.get(report), t.leases.get(next))
                {
                    dispatch.push(ms(lease.saturating_duration_since(*sent)));
                }
            }
            if let Some((_, done)) = t.reports.get("step3") {
                whole.push(ms(done.saturating_duration_since(start)));
            }
        }
        Latency {
            start_to_lease: dist(first),
            dispatch: dist(dispatch),
            whole_run: dist(whole),
            rate: started.rate,
        }
    }

    /// Stops the worker.
    pub(crate) async fn stop(self) {
        self.worker.stop().await;
    }
}

// ---------------------------------------------------------------- B3

/// One B3 case.
#[derive(Debug, Clone)]
pub struct FanOut {
    /// FORK/JOIN or MAP.
    pub shape: &'static str,
    /// Branches.
    pub branches: usize,
    /// Start → run completed, seconds: the median of `tries`.
    pub secs: f64,
    /// Every try's seconds, in the order they ran.
    pub tries: Vec<f64>,
    /// The server's peak RSS, MiB, where it ran this case alone.
    pub peak_rss_mib: Option<f64>,
}

/// The shape of B3's wide MAP, apart from the MAPs whose time ratio counts.
pub const WIDE_MAP: &str = "wide MAP";

/// The middle value (the mean of the two middle ones for an even count).
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn fork_join_workflow(name: &str, branches: usize) -> String {
    let mut text = format!("name: {name}\nnodes:\n  - {{ id: f, type: FORK }}\n");
    for i in 0..branches {
        text.push_str(&format!(
            "  - {{ id: t{i}, type: TASK, queue: bench_fan, task: noop }}\n"
        ));
    }
    text.push_str("  - { id: j, type: JOIN }\nedges:\n");
    for i in 0..branches {
        text.push_str(&format!(
            "  - {{ from: f, to: t{i} }}\n  - {{ from: t{i}, to: j }}\n"
        ));
    }
    text
}

fn map_workflow(name: &str) -> String {
    format!(
        "name: {name}\nnodes:\n  - {{ id: m, type: MAP, items: input.items, concurrency: 10000, \
         queue: bench_fan, task: noop, input: {{ i: \"${{item}}\" }} }}\n"
    )
}

/// B3: FORK/JOIN and MAP of the profile's two sizes, then the wide MAP.
pub async fn fan_out(ctx: &Ctx) -> Result<Vec<FanOut>> {
    ctx.reset().await?;
    let servers = ctx.start_servers(1).await?;
    let result = fan_out_on(ctx, &servers[0]).await;
    stop_all(servers).await;
    let mut results = result?;
    if ctx.profile.wide_map > 0 {
        // a server older than 100,000-wide MAPs fails this one run; the
        // other cases still count
        match wide_map(ctx).await {
            Ok(wide) => results.push(wide),
            Err(error) => eprintln!("B3 wide MAP: {error:#}"),
        }
    }
    Ok(results)
}

/// The no-op worker of B3's runs, on `server`.
async fn fan_worker(server: &Server) -> Result<FastWorker> {
    FastWorker::start(
        std::slice::from_ref(&server.url),
        &WorkerConfig {
            queue: "bench_fan".to_owned(),
            pollers_per_server: 4,
            connections_per_server: 2,
            slots: 1000,
            max_per_poll: 100,
            output_bytes: 0,
            offload_bytes: 0,
        },
        None,
    )
    .await
}

async fn fan_client(server: &Server) -> Result<RunServiceClient<Channel>> {
    Ok(RunServiceClient::new(channel(&server.url).await?)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20))
}

/// One MAP of the profile's wide size on a fresh server: its time, and the
/// server's peak RSS.
async fn wide_map(ctx: &Ctx) -> Result<FanOut> {
    ctx.reset().await?;
    let servers = ctx.start_servers(1).await?;
    let server = &servers[0];
    let result = async {
        let worker = fan_worker(server).await?;
        register(&server.url, &map_workflow("bench_map")).await?;
        let size = ctx.profile.wide_map;
        let items: Vec<Json> = (0..size).map(|i| Json::from(i as u64)).collect();
        let secs = run_to_end(
            &mut fan_client(server).await?,
            "bench_map",
            serde_json::json!({ "items": items }),
            size,
        )
        .await;
        worker.stop().await;
        secs
    }
    .await;
    let peak = procs::peak_rss_mib(server.pid);
    stop_all(servers).await;
    let secs = result?;
    Ok(FanOut {
        shape: WIDE_MAP,
        branches: ctx.profile.wide_map,
        secs,
        tries: vec![secs],
        peak_rss_mib: Some(peak),
    })
}

async fn fan_out_on(ctx: &Ctx, server: &Server) -> Result<Vec<FanOut>> {
    let worker = fan_worker(server).await?;
    register(&server.url, &map_workflow("bench_map")).await?;
    let mut client = fan_client(server).await?;
    let mut results = Vec::new();
    for &size in &ctx.profile.fan_sizes {
        // a definition holds at most 10,000 nodes: FORK + branches + JOIN
        let branches = size.min(9_998);
        let name = format!("bench_fork_{branches}");
        register(&server.url, &fork_join_workflow(&name, branches)).await?;
        let items: Vec<Json> = (0..size).map(|i| Json::from(i as u64)).collect();
        let map_input = serde_json::json!({ "items": items });
        // a single run of a fraction of a second is at the mercy of one
        // hiccup of the machine: each case runs a few times, the shapes
        // taking turns, and its median counts
        let (mut fork_tries, mut map_tries) = (Vec::new(), Vec::new());
        for _ in 0..ctx.profile.fan_tries.max(1) {
            fork_tries.push(run_to_end(&mut client, &name, serde_json::json!({}), size).await?);
            map_tries.push(run_to_end(&mut client, "bench_map", map_input.clone(), size).await?);
        }
        results.push(FanOut {
            shape: "FORK/JOIN",
            branches,
            secs: median(&fork_tries),
            tries: fork_tries,
            peak_rss_mib: None,
        });
        results.push(FanOut {
            shape: "MAP",
            branches: size,
            secs: median(&map_tries),
            tries: map_tries,
            peak_rss_mib: None,
        });
    }
    worker.stop().await;
    Ok(results)
}

async fn run_to_end(
    client: &mut RunServiceClient<Channel>,
    workflow: &str,
    input: Json,
    size: usize,
) -> Result<f64> {
    let limit = Duration::from_secs(60 + size as u64 / 20);
    run_until_done(client, workflow, input, limit).await
}

/// Starts one run and waits (polling its status every 10 ms) until it
/// completes: the seconds that took. A run that fails, is cancelled or is
/// not done within `limit` is an error.
pub(crate) async fn run_until_done(
    client: &mut RunServiceClient<Channel>,
    workflow: &str,
    input: Json,
    limit: Duration,
) -> Result<f64> {
    let began = Instant::now();
    let run = client
        .start_run(start_request(workflow, input))
        .await?
        .into_inner()
        .run
        .context("run")?;
    loop {
        let now = client
            .get_run(GetRunRequest {
                run_id: run.run_id.clone(),
                // the status only: a wide run's node states would make each
                // poll cost as much as the run is wide
                skip_nodes: true,
            })
            .await?
            .into_inner()
            .run
            .context("run")?;
        match now.status() {
            RunStatus::Completed => return Ok(began.elapsed().as_secs_f64()),
            RunStatus::Failed | RunStatus::Cancelled => {
                bail!("{workflow}: run ended {:?}", now.status())
            }
            _ => {}
        }
        if began.elapsed() > limit {
            bail!("{workflow}: not done after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------- B4

/// B4 results.
#[derive(Debug, Clone, Default)]
pub struct Timers {
    /// Runs.
    pub runs: usize,
    /// Seconds to start them all.
    pub start_secs: f64,
    /// Lag between due and fired, ms.
    pub lag: Dist,
    /// Runs that completed.
    pub completed: i64,
}

/// B4: runs each in a 2 s WAIT.
pub async fn timers(ctx: &Ctx) -> Result<Timers> {
    ctx.reset().await?;
    let servers = ctx.start_servers(1).await?;
    let result = timers_on(ctx, &servers[0]).await;
    stop_all(servers).await;
    result
}

async fn timers_on(ctx: &Ctx, server: &Server) -> Result<Timers> {
    register(
        &server.url,
        "name: bench_wait\nnodes:\n  - { id: w, type: WAIT, duration: 2s }\n",
    )
    .await?;
    let runs = ctx.profile.timer_runs;
    let next = Arc::new(AtomicU64::new(0));
    let began = Instant::now();
    let mut starters = Vec::new();
    for _ in 0..16 {
        let mut client = RunServiceClient::new(channel(&server.url).await?);
        let next = Arc::clone(&next);
        starters.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < runs as u64 {
                let _ = client
                    .start_run(start_request("bench_wait", serde_json::json!({})))
                    .await;
            }
        }));
    }
    for s in starters {
        let _ = s.await;
    }
    let start_secs = began.elapsed().as_secs_f64();
    let limit = Instant::now() + Duration::from_secs(2 + 30 + runs as u64 / 50);
    let mut completed = 0;
    while Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(500)).await;
        completed = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM runs WHERE workflow_name = 'bench_wait' AND status = 'COMPLETED'",
        )
        .fetch_one(&ctx.db)
        .await?;
        if completed as usize >= runs {
            break;
        }
    }
    // due = the WAIT's start + 2 s; fired = the transaction that applied it
    let lags: Vec<f64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM (e.created_at - n.started_at)) * 1000 - 2000)::float8 \
         FROM run_events_each e JOIN run_nodes n ON n.run_id = e.run_id AND n.node_key = e.node_key \
         WHERE e.event_type = 'wait_elapsed'",
    )
    .fetch_all(&ctx.db)
    .await?;
    Ok(Timers {
        runs,
        start_secs,
        lag: dist(lags),
        completed,
    })
}
