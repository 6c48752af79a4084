//! B7: one run of a long sequential workflow (N TASK steps in a line), so
//! the cost of an event can be compared at its start and at its end: history
//! and node rows pile up behind the run, and no step may get dearer for it.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use composer_proto::v1::run_service_client::RunServiceClient;

use crate::{
    benches::{Ctx, register, stop_all},
    procs::{self, Server, TICKS_PER_SECOND},
    worker::{FastWorker, Hook, WorkerConfig, WorkerEvent, channel},
};

/// B7 results.
#[derive(Debug, Clone)]
pub struct Chain {
    /// Steps in the line.
    pub steps: usize,
    /// Start → run completed, seconds.
    pub secs: f64,
    /// The early window (steps `from..to`) and the late one.
    pub early: Window,
    pub late: Window,
}

/// Cost per step over a window of steps.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// First step of the window.
    pub from: usize,
    /// One past its last step.
    pub to: usize,
    /// Wall-clock ms per step (one step at a time, so its latency).
    pub wall_ms: f64,
    /// Server + Postgres CPU ms per step.
    pub cpu_ms: f64,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    steps: u64,
    cpu_ticks: u64,
}

fn chain_workflow(name: &str, steps: usize) -> String {
    let mut text = format!("name: {name}\nnodes:\n");
    for i in 0..steps {
        text.push_str(&format!(
            "  - {{ id: s{i}, type: TASK, queue: bench_chain, task: step }}\n"
        ));
    }
    text.push_str("edges:\n");
    for i in 1..steps {
        text.push_str(&format!("  - {{ from: s{}, to: s{i} }}\n", i - 1));
    }
    text
}

/// B7: the profile's chain length, one run, one server.
pub async fn chain(ctx: &Ctx) -> Result<Chain> {
    ctx.reset().await?;
    let servers = ctx.start_servers(1).await?;
    let result = chain_on(ctx, &servers[0]).await;
    stop_all(servers).await;
    result
}

async fn chain_on(ctx: &Ctx, server: &Server) -> Result<Chain> {
    let steps = ctx.profile.chain_steps;
    let name = format!("bench_chain_{steps}");
    register(&server.url, &chain_workflow(&name, steps)).await?;
    let done = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&done);
    let hook: Hook = Arc::new(move |event| {
        if let WorkerEvent::Reported { .. } = event {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    let worker = FastWorker::start(
        std::slice::from_ref(&server.url),
        &WorkerConfig {
            queue: "bench_chain".to_owned(),
            pollers_per_server: 1,
            connections_per_server: 1,
            slots: 4,
            max_per_poll: 1,
            output_bytes: 0,
            offload_bytes: 0,
        },
        Some(hook),
    )
    .await?;
    let pg_pid = ctx.backends.postmaster_pid().unwrap_or(0);
    let server_pid = server.pid;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let samples = Arc::clone(&samples);
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            loop {
                let sample = Sample {
                    at: Instant::now(),
                    steps: done.load(Ordering::Relaxed),
                    cpu_ticks: procs::cpu_ticks(server_pid) + procs::tree_ticks(pg_pid),
                };
                if let Ok(mut all) = samples.lock() {
                    all.push(sample);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let mut client = RunServiceClient::new(channel(&server.url).await?);
    let began = Instant::now();
    let outcome = crate::benches::run_until_done(
        &mut client,
        &name,
        serde_json::json!({}),
        Duration::from_secs(60 + steps as u64 / 50),
    )
    .await;
    let secs = began.elapsed().as_secs_f64();
    // the run completes in the last report's transaction, before the
    // worker hears back: let the count and one more sample catch up
    let settle = Instant::now() + Duration::from_secs(5);
    while done.load(Ordering::Relaxed) < steps as u64 && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    sampler.abort();
    worker.stop().await;
    outcome?;
    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let tenth = (steps / 10).max(1);
    let early_from = (steps / 100).max(1);
    let early = window(&samples, early_from, early_from + tenth)?;
    let late = window(&samples, steps - tenth, steps)?;
    Ok(Chain {
        steps,
        secs,
        early,
        late,
    })
}

/// The cost per step between the first samples that had reached `from` and
/// `to` steps.
fn window(samples: &[Sample], from: usize, to: usize) -> Result<Window> {
    let reached = |n: usize| samples.iter().find(|s| s.steps >= n as u64);
    let (Some(a), Some(b)) = (reached(from), reached(to)) else {
        bail!("the chain never reached step {to}");
    };
    let steps = (b.steps - a.steps).max(1) as f64;
    Ok(Window {
        from,
        to,
        wall_ms: (b.at - a.at).as_secs_f64() * 1000.0 / steps,
        cpu_ms: (b.cpu_ticks - a.cpu_ticks) as f64 / TICKS_PER_SECOND * 1000.0 / steps,
    })
}
