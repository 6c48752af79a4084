//! What a bulk retry costs live dispatch (issue 17): 10,000 failed runs,
//! B2's "report → next task leased" measured while BulkRetryRuns works
//! through them, against idle windows before and after it, on one server.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
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
    benches::{Ctx, Dist, dist, linear_workflow, ms, register, start_request, stop_all},
    procs::Server,
    worker::{FastWorker, Hook, WorkerConfig, WorkerEvent, channel},
};

/// Failed runs the operation retries.
pub const FAILED_RUNS: usize = 10_000;

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

#[derive(Default)]
struct Times {
    leases: HashMap<(String, String), Instant>,
    reports: HashMap<(String, String), Instant>,
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
    register(&server.url, &linear_workflow("bench_latency", "bench_lat")).await?;
    let client = RunServiceClient::new(channel(&server.url).await?);
    let began = Instant::now();
    create_failed_runs(&client).await?;
    let create_secs = began.elapsed().as_secs_f64();

    let times: Arc<Mutex<Times>> = Arc::default();
    let recorder = Arc::clone(&times);
    let hook: Hook = Arc::new(move |event| {
        let mut times = recorder.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            WorkerEvent::Leased { run_id, node, at } => {
                times.leases.insert((run_id, node), at);
            }
            WorkerEvent::Reported {
                run_id,
                task_name,
                sent,
                ..
            } => {
                times.reports.insert((run_id, task_name), sent);
            }
        }
    });
    let worker = FastWorker::start(
        std::slice::from_ref(&server.url),
        &WorkerConfig {
            queue: "bench_lat".to_owned(),
            pollers_per_server: 4,
            connections_per_server: 1,
            slots: 64,
            max_per_poll: 8,
            output_bytes: 0,
        },
        Some(hook),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    eprintln!("bench: bulk: B2 idle");
    let idle_window = Duration::from_secs(ctx.profile.latency_secs.max(15));
    let idle_runs = drive_b2(
        client.clone(),
        Arc::new(AtomicBool::new(false)),
        Some(idle_window),
    )
    .await;

    eprintln!("bench: bulk: B2 during BulkRetryRuns of {FAILED_RUNS} runs");
    let stop = Arc::new(AtomicBool::new(false));
    let driver = tokio::spawn(drive_b2(client.clone(), Arc::clone(&stop), None));
    let op_began = Instant::now();
    let operation = retry_all_and_wait(&client).await;
    let op_secs = op_began.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let during_runs = driver.await.context("B2 driver")?;
    let operation = operation?;

    // idle again after it: a machine whose noise drifts during the run
    // weighs on both sides of the ratio alike
    eprintln!("bench: bulk: B2 idle after");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_after = drive_b2(
        client.clone(),
        Arc::new(AtomicBool::new(false)),
        Some(idle_window),
    )
    .await;
    // let the last runs finish
    tokio::time::sleep(Duration::from_secs(2)).await;
    worker.stop().await;

    let times = times.lock().unwrap_or_else(|p| p.into_inner());
    let idle_runs: HashSet<String> = idle_runs.union(&idle_after).cloned().collect();
    Ok(BulkCost {
        runs: FAILED_RUNS,
        idle: dist(dispatch_samples(&times, &idle_runs)),
        during: dist(dispatch_samples(&times, &during_runs)),
        op_secs,
        operation,
        create_secs,
    })
}

/// 32 callers at a time, each starting its share in turn.
async fn create_failed_runs(client: &RunServiceClient<Channel>) -> Result<()> {
    const CALLERS: usize = 32;
    let labels = HashMap::from([("batch".to_owned(), "outage".to_owned())]);
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let mut client = client.clone();
        let request = composer_proto::v1::StartRunRequest {
            labels: labels.clone(),
            ..start_request("bench_fail_fast", serde_json::json!({}))
        };
        let share = FAILED_RUNS / CALLERS + usize::from(caller < FAILED_RUNS % CALLERS);
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

/// B2's open loop, a run every 100 ms, for `window` or until `stop`;
/// returns the runs it started.
async fn drive_b2(
    client: RunServiceClient<Channel>,
    stop: Arc<AtomicBool>,
    window: Option<Duration>,
) -> HashSet<String> {
    let began = Instant::now();
    let started: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    let mut pending = Vec::new();
    while !stop.load(Ordering::Relaxed) && window.is_none_or(|w| began.elapsed() < w) {
        ticker.tick().await;
        let mut client = client.clone();
        let started = Arc::clone(&started);
        pending.push(tokio::spawn(async move {
            if let Ok(response) = client
                .start_run(start_request("bench_latency", serde_json::json!({})))
                .await
                && let Some(run) = response.into_inner().run
            {
                started
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(run.run_id);
            }
        }));
    }
    for p in pending {
        let _ = p.await;
    }
    // the runs started last still have their steps to go
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = started.lock().unwrap_or_else(|p| p.into_inner());
    started.clone()
}

/// Report of step N → lease of step N+1, for the given runs.
fn dispatch_samples(times: &Times, runs: &HashSet<String>) -> Vec<f64> {
    let mut samples = Vec::new();
    for run in runs {
        for (report, next) in [("step1", "b"), ("step2", "c")] {
            let sent = times.reports.get(&(run.clone(), report.to_owned()));
            let lease = times.leases.get(&(run.clone(), next.to_owned()));
            if let (Some(sent), Some(lease)) = (sent, lease) {
                samples.push(ms(lease.saturating_duration_since(*sent)));
            }
        }
    }
    samples
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
