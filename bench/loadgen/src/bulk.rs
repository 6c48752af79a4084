//! What a bulk retry costs live dispatch (issue 17): 10,000 failed runs,
//! B2's "report → next task leased" measured while BulkRetryRuns works
//! through them, against idle windows before and after it, on one server.

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
    BulkOperation, BulkOperationStatus, BulkRetryRunsRequest, GetBulkOperationRequest, RunFilter,
    run_service_client::RunServiceClient,
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

/// The result.
#[derive(Debug, Clone)]
pub struct BulkCost {
    /// Runs retried.
    pub runs: usize,
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

pub async fn bulk_cost(ctx: &Ctx) -> Result<BulkCost> {
    ctx.reset().await?;
    let servers = ctx.start_servers(1).await?;
    let result = bulk_cost_on(ctx, &servers[0]).await;
    stop_all(servers).await;
    result
}

async fn bulk_cost_on(ctx: &Ctx, server: &Server) -> Result<BulkCost> {
    register(&server.url, FAIL_FAST).await?;
    let client = RunServiceClient::new(channel(&server.url).await?);
    let began = Instant::now();
    create_failed_runs(&client, ctx.profile.bulk_runs).await?;
    let create_secs = began.elapsed().as_secs_f64();

    let open_loop = OpenLoop::start(&server.url, &Bearer::none()).await?;
    // each idle window: at least 15 s of B2's 10 runs/s
    let idle_runs = ctx.profile.latency_secs.max(15) * 10;
    // the runs started last still have their steps to go
    let settle = Duration::from_secs(10);

    eprintln!("bench: bulk: B2 idle");
    let idle_before = open_loop.drive(Until::Runs(idle_runs)).await;
    open_loop.settle(&idle_before, settle).await;

    eprintln!(
        "bench: bulk: B2 during BulkRetryRuns of {} runs",
        ctx.profile.bulk_runs
    );
    let stop = Arc::new(AtomicBool::new(false));
    let operation = async {
        let op_began = Instant::now();
        let operation = retry_all_and_wait(&client).await;
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
    Ok(BulkCost {
        runs: ctx.profile.bulk_runs,
        idle,
        during,
        op_secs,
        operation,
        create_secs,
    })
}

/// 32 callers at a time, each starting its share in turn.
async fn create_failed_runs(client: &RunServiceClient<Channel>, runs: usize) -> Result<()> {
    const CALLERS: usize = 32;
    let labels = HashMap::from([("batch".to_owned(), "outage".to_owned())]);
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let mut client = client.clone();
        let request = composer_proto::v1::StartRunRequest {
            labels: labels.clone(),
            ..start_request("bench_fail_fast", serde_json::json!({}))
        };
        let share = runs / CALLERS + usize::from(caller < runs % CALLERS);
        callers.spawn(async move {
            for _ in 0..share {
                client
                    .start_run(request.clone())
                    .await
                    .context("start a failed run")?;
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(done) = callers.join_next().await {
        done.context("a caller")??;
    }
    Ok(())
}

async fn retry_all_and_wait(client: &RunServiceClient<Channel>) -> Result<BulkOperation> {
    let mut client = client.clone();
    let op = client
        .bulk_retry_runs(BulkRetryRunsRequest {
            filter: Some(RunFilter {
                labels: HashMap::from([("batch".to_owned(), "outage".to_owned())]),
                ..RunFilter::default()
            }),
            ..BulkRetryRunsRequest::default()
        })
        .await
        .context("BulkRetryRuns")?
        .into_inner()
        .operation
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
