//! What a bulk operation costs live dispatch: B2's "report → next task
//! leased" measured while it works through 10,000 runs, against idle
//! windows before and after it, on one server. Two operations: a
//! BulkRetryRuns of failed runs (issue 17) and a MigrateRuns of runs
//! waiting in a task to a version that appends a node (issue 37), where
//! each run is replayed under its lock before it moves.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use composer_proto::v1::{
    BulkOperation, BulkOperationStatus, BulkRetryRunsRequest, GetBulkOperationRequest,
    MigrateRunsRequest, RunFilter, run_service_client::RunServiceClient,
};
use tonic::transport::Channel;

use crate::{
    benches::{Ctx, Dist, OpenLoop, Until, register, start_request, stop_all},
    procs::Server,
    worker::{Bearer, channel},
};

/// Fails at its start (the task's input reads a field that is not there):
/// a failed run for one StartRun, and a retry that fails again at once.
const FAIL_FAST: &str = r#"
name: bench_fail_fast
nodes:
  - { id: broken, type: TASK, queue: nobody, task: t, input: "${input.missing.field}" }
"#;

/// Runs waiting in a task nobody serves; v2 appends a node after it, so
/// every run is compatible and moves.
const WAITING_V1: &str = r#"
name: bench_migrate
nodes:
  - { id: wait, type: TASK, queue: nobody, task: t, input: { order: "${input.order}" } }
"#;

const WAITING_V2: &str = r#"
name: bench_migrate
nodes:
  - { id: wait, type: TASK, queue: nobody, task: t, input: { order: "${input.order}" } }
  - { id: after, type: TASK, queue: nobody, task: t2 }
edges:
  - { from: wait, to: after }
"#;

/// Which bulk operation is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkBench {
    /// BulkRetryRuns over failed runs.
    Retry,
    /// MigrateRuns over runs in flight.
    Migrate,
}

/// How many runs a migration moved, counted in Postgres after it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Moved {
    /// `run_migrated` history entries.
    pub entries: i64,
    /// Runs with one.
    pub runs: i64,
    /// Runs now on the target version.
    pub on_target: i64,
}

/// The result.
#[derive(Debug, Clone)]
pub struct BulkCost {
    /// Which operation.
    pub bench: BulkBench,
    /// Runs acted on.
    pub runs: usize,
    /// MIGRATE: what moved, from the database.
    pub moved: Option<Moved>,
    /// B2 report → next lease, ms, before the operation.
    pub idle: Dist,
    /// The same while it ran.
    pub during: Dist,
    /// Start → SUCCEEDED, seconds.
    pub op_secs: f64,
    /// The operation at its end.
    pub operation: BulkOperation,
    /// Seconds to create the failed runs.
    pub create_secs: f64,
}

impl BulkCost {
    /// p99 during / p99 idle.
    pub fn p99_ratio(&self) -> f64 {
        if self.idle.p99 > 0.0 {
            self.during.p99 / self.idle.p99
        } else {
            0.0
        }
    }
}

pub async fn bulk_cost(ctx: &Ctx, bench: BulkBench) -> Result<BulkCost> {
    ctx.reset().await?;
    let servers = ctx.start_servers(1).await?;
    let result = bulk_cost_on(ctx, &servers[0], bench).await;
    stop_all(servers).await;
    result
}

async fn bulk_cost_on(ctx: &Ctx, server: &Server, bench: BulkBench) -> Result<BulkCost> {
    let (workflow, source) = match bench {
        BulkBench::Retry => ("bench_fail_fast", FAIL_FAST),
        BulkBench::Migrate => ("bench_migrate", WAITING_V1),
    };
    register(&server.url, source).await?;
    let client = RunServiceClient::new(channel(&server.url).await?);
    let began = Instant::now();
    create_runs(&client, workflow, ctx.profile.bulk_runs).await?;
    let create_secs = began.elapsed().as_secs_f64();
    if bench == BulkBench::Migrate {
        register(&server.url, WAITING_V2).await?;
    }

    let open_loop = OpenLoop::start(&server.url, &Bearer::none()).await?;
    // each idle window: at least 15 s of B2's 10 runs/s
    let idle_runs = ctx.profile.latency_secs.max(15) * 10;
    // the runs started last still have their steps to go
    let settle = Duration::from_secs(10);

    eprintln!("bench: bulk: B2 idle");
    let idle_before = open_loop.drive(Until::Runs(idle_runs)).await;
    open_loop.settle(&idle_before, settle).await;

    eprintln!(
        "bench: bulk: B2 during {bench:?} of {} runs",
        ctx.profile.bulk_runs
    );
    let stop = Arc::new(AtomicBool::new(false));
    let operation = async {
        let op_began = Instant::now();
        let operation = start_and_wait(&client, bench).await;
        stop.store(true, Ordering::Relaxed);
        (operation, op_began.elapsed().as_secs_f64())
    };
    let (during, (operation, op_secs)) = tokio::join!(
        open_loop.drive(Until::Stopped(Arc::clone(&stop))),
        operation
    );
    open_loop.settle(&during, settle).await;
    let operation = operation?;

    // idle again after it: a machine whose noise drifts during the run
    // weighs on both sides of the ratio alike
    eprintln!("bench: bulk: B2 idle after");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_after = open_loop.drive(Until::Runs(idle_runs)).await;
    open_loop.settle(&idle_after, settle).await;
    let idle = open_loop.latency(&idle_before.and(idle_after)).dispatch;
    let during = open_loop.latency(&during).dispatch;
    open_loop.stop().await;
    let moved = match bench {
        BulkBench::Retry => None,
        BulkBench::Migrate => Some(moved(ctx).await?),
    };
    Ok(BulkCost {
        bench,
        moved,
        runs: ctx.profile.bulk_runs,
        idle,
        during,
        op_secs,
        operation,
        create_secs,
    })
}

/// What the migration left in Postgres: its history entries, the runs
/// that have one, the runs on version 2.
async fn moved(ctx: &Ctx) -> Result<Moved> {
    let (entries, runs): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT run_id) FROM run_events_each WHERE event_type = 'run_migrated'",
    )
    .fetch_one(&ctx.db)
    .await
    .context("count run_migrated")?;
    let on_target: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM runs WHERE workflow_name = 'bench_migrate' AND workflow_version = 2",
    )
    .fetch_one(&ctx.db)
    .await
    .context("count moved runs")?;
    Ok(Moved {
        entries,
        runs,
        on_target,
    })
}

/// 32 callers at a time, each starting its share of `workflow`'s runs in turn.
async fn create_runs(
    client: &RunServiceClient<Channel>,
    workflow: &'static str,
    runs: usize,
) -> Result<()> {
    const CALLERS: usize = 32;
    let labels = HashMap::from([("batch".to_owned(), "outage".to_owned())]);
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let mut client = client.clone();
        let request = composer_proto::v1::StartRunRequest {
            labels: labels.clone(),
            ..start_request(workflow, serde_json::json!({ "order": caller }))
        };
        let share = runs / CALLERS + usize::from(caller < runs % CALLERS);
        callers.spawn(async move {
            for _ in 0..share {
                client
                    .start_run(request.clone())
                    .await
                    .context("start a run")?;
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(done) = callers.join_next().await {
        done.context("a caller")??;
    }
    Ok(())
}

/// Starts the operation over the runs labelled `batch: outage` and waits
/// for its end.
async fn start_and_wait(
    client: &RunServiceClient<Channel>,
    bench: BulkBench,
) -> Result<BulkOperation> {
    let mut client = client.clone();
    let filter = RunFilter {
        labels: HashMap::from([("batch".to_owned(), "outage".to_owned())]),
        ..RunFilter::default()
    };
    let op = match bench {
        BulkBench::Retry => {
            client
                .bulk_retry_runs(BulkRetryRunsRequest {
                    filter: Some(filter),
                    ..BulkRetryRunsRequest::default()
                })
                .await
                .context("BulkRetryRuns")?
                .into_inner()
                .operation
        }
        BulkBench::Migrate => {
            client
                .migrate_runs(MigrateRunsRequest {
                    filter: Some(RunFilter {
                        workflow_name: "bench_migrate".to_owned(),
                        ..filter
                    }),
                    target_version: 2,
                    ..MigrateRunsRequest::default()
                })
                .await
                .context("MigrateRuns")?
                .into_inner()
                .operation
        }
    }
    .context("no operation")?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = client
            .get_bulk_operation(GetBulkOperationRequest {
                operation_id: op.operation_id.clone(),
            })
            .await
            .context("GetBulkOperation")?
            .into_inner()
            .operation
            .context("no operation")?;
        if !matches!(
            now.status(),
            BulkOperationStatus::Pending | BulkOperationStatus::Running
        ) {
            return Ok(now);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the operation did not end in 600 s"
        );
    }
}
