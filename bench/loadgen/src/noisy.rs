//! B8: noisy neighbours (issue 34). Two namespaces share one server, each
//! calling with tokens of its own. The victim runs B2's open loop (10
//! three-step runs a second) idle, then while the aggressor, one load at a
//! time, floods StartRun past its quota, holds idle WatchRun streams,
//! creates schedules of the costliest cron specs, runs a poisoned task
//! against crash-looping workers, and fills a queue of its own. The
//! victim's p99 under each load is compared with its idle p99 (target:
//! within 2×), and each load's own figures say what the server did with it.

use std::{
    collections::HashMap,
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use composer_grpc::auth::{NewToken, SigningKey, mint};
use composer_proto::v1::{
    CancelRunRequest, CreateScheduleRequest, GetRunRequest, PollTasksRequest, RunStatus,
    ScheduleAction, ScheduleSpec, WatchRunRequest, run_service_client::RunServiceClient,
    schedule_service_client::ScheduleServiceClient, worker_service_client::WorkerServiceClient,
};
use serde_json::json;
use tokio::{
    sync::{Semaphore, oneshot, watch},
    task::JoinSet,
};
use tonic::{Code, Status};

use crate::{
    benches::{
        Ctx, Dist, Latency, OpenLoop, Started, Until, dist, ms, register_as, start_request,
        stop_all,
    },
    procs::{self, Server, ServerAuth, TICKS_PER_SECOND},
    worker::{Authed, Bearer, channel},
};

/// The namespace whose latency is measured.
pub const VICTIM: &str = "victim";
/// The namespace that makes the noise.
pub const AGGRESSOR: &str = "aggressor";

/// `composer serve`'s flag naming the per-namespace quotas file (decision
/// 0038). B8 passes it only when `composer serve --help` lists it; a server
/// without it runs the aggressor unbounded, and the flood's throttled count
/// (0) says so.
pub const QUOTAS_FILE_FLAG: &str = "--quotas-file";
/// The aggressor's writing calls per second: far below what its flood
/// sends, so the flood runs past its quota. The victim keeps the defaults.
pub const AGGRESSOR_WRITES_PER_SECOND: u32 = 100;
/// The tasks the aggressor's runs may arm a second: ten per writing call,
/// so the backlog fills at this pace, not at what one StartRun of a
/// thousand-item MAP per 5 ms would arm.
pub const AGGRESSOR_TASKS_PER_SECOND: u32 = 1_000;
/// `--lease-receipt-timeout` of B8's server (the default is 5 s): each
/// delivery of the poisoned task lasts this long before the server takes it
/// back, so its runs end within the quick profile's phase. The victim's
/// worker does not confirm receipt, so it is untouched.
pub const RECEIPT_TIMEOUT: &str = "1s";

/// Concurrent StartRun loops of the flood, over this many connections.
const FLOOD_CLIENTS: usize = 16;
const FLOOD_CONNECTIONS: usize = 4;
/// Waiting runs the WatchRun streams are spread over.
const WATCHED_RUNS: usize = 10;
/// Streams per HTTP/2 connection: under the server's limit of concurrent
/// streams per connection (hyper's 200), so none waits in the client.
const STREAMS_PER_CONNECTION: usize = 100;
/// WatchRun calls being opened at once.
const OPENS_IN_FLIGHT: usize = 200;
/// Concurrent CreateSchedule loops.
const CRON_CLIENTS: usize = 4;
/// The costliest cron specs: two that never match (a 31st of months
/// without one, a 30th of February), which the server must search to
/// refuse, and one that fires only on leap days.
pub const COSTLY_CRONS: [&str; 3] = ["*/1 */1 */1 31 2,4,6,9,11 *", "0 0 30 2 *", "0 0 29 2 *"];
/// Poisoned runs at once. Their node retries after 100 ms (not the default
/// 1 s, 2 s): what is measured is the deliveries, not the backoff.
pub const POISONED_RUNS: usize = 4;
/// The poisoned node's `max_attempts`: the bound is at most
/// 2 × this many deliveries per run.
pub const POISON_MAX_ATTEMPTS: u32 = 3;
/// Crash-looping workers on the poisoned queue.
const CRASH_LOOPS: usize = 2;
/// How soon a supervisor starts a crashed worker again (systemd's
/// `RestartSec` default).
const RESTART_DELAY: Duration = Duration::from_millis(100);
/// Tasks one backlog run adds: a MAP of this many elements.
const BACKLOG_ITEMS_PER_RUN: usize = 1_000;
/// Concurrent StartRun loops filling the backlog.
const BACKLOG_CLIENTS: usize = 4;
/// Threads of the aggressor's own runtime (see [`aside`]).
const AGGRESSOR_THREADS: usize = 1;
/// Between loads: until the server uses less than this many cores ...
const QUIET_CORES: f64 = 0.2;
/// ... for half a second, or this long at most (and no longer than a
/// window).
const QUIET_LIMIT: Duration = Duration::from_secs(10);
/// After a window, the most the victim's last runs are waited for.
const SETTLE: Duration = Duration::from_secs(10);

const FLOOD_WORKFLOW: &str = "noisy_flood";
const WAITING_WORKFLOW: &str = "noisy_waiting";
const POISON_WORKFLOW: &str = "noisy_poison";
const POISON_QUEUE: &str = "noisy_poison";
const BACKLOG_WORKFLOW: &str = "noisy_backlog";
const BACKLOG_QUEUE: &str = "noisy_backlog";

/// The aggressor's workflows.
fn aggressor_workflows() -> [String; 4] {
    [
        // ends by itself: the flood's runs need no worker
        format!("name: {FLOOD_WORKFLOW}\nnodes:\n  - {{ id: done, type: WAIT, duration: 0s }}\n"),
        format!(
            "name: {WAITING_WORKFLOW}\nnodes:\n  - {{ id: hold, type: WAIT_FOR_EVENT, event: never_sent }}\n"
        ),
        format!(
            "name: {POISON_WORKFLOW}\nnodes:\n  - {{ id: crash, type: TASK, queue: {POISON_QUEUE}, \
             task: crash, retry: {{ max_attempts: {POISON_MAX_ATTEMPTS}, initial_interval: 100ms }} }}\n"
        ),
        format!(
            "name: {BACKLOG_WORKFLOW}\nnodes:\n  - {{ id: fill, type: MAP, items: input.items, \
             concurrency: {BACKLOG_ITEMS_PER_RUN}, queue: {BACKLOG_QUEUE}, task: t, input: {{ i: \"${{item}}\" }} }}\n"
        ),
    ]
}

/// One of the aggressor's loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// StartRun from many loops as fast as they go, past the write quota.
    Flood,
    /// Idle WatchRun streams on the aggressor's waiting runs.
    Watch,
    /// CreateSchedule of the costliest cron specs.
    Cron,
    /// A task whose every delivery kills its worker, and a supervisor
    /// starting the worker again.
    Poison,
    /// A queue of its own filled with tasks nobody works.
    Backlog,
}

/// What B8 measured.
#[derive(Debug, Clone)]
pub struct Noisy {
    /// The victim with no aggressor: a window before the loads and one
    /// before the backlog (which stays), as one sample.
    pub idle: Latency,
    /// Server CPU, cores, in the idle windows.
    pub idle_cores: f64,
    /// Each load in turn.
    pub phases: Vec<Phase>,
    /// The quotas file the server ran with; None: the server has no
    /// [`QUOTAS_FILE_FLAG`].
    pub quotas: Option<String>,
}

/// The victim under one load, and the load's own figures.
#[derive(Debug, Clone)]
pub struct Phase {
    /// The load, in words.
    pub label: String,
    /// The victim's latencies.
    pub victim: Latency,
    /// The victim's window, seconds.
    pub secs: f64,
    /// Server CPU in the window, cores.
    pub server_cores: f64,
    /// The load generator's CPU in the window (victim and aggressor), cores.
    pub client_cores: f64,
    /// The load's own figures.
    pub figures: Figures,
}

impl Phase {
    /// The victim's p99 over its idle p99, for report → next task leased
    /// and for StartRun → first task leased; None without samples.
    pub fn ratios(&self, idle: &Latency) -> (Option<f64>, Option<f64>) {
        (
            ratio(&self.victim.dispatch, &idle.dispatch),
            ratio(&self.victim.start_to_lease, &idle.start_to_lease),
        )
    }
}

fn ratio(under: &Dist, idle: &Dist) -> Option<f64> {
    (under.n > 0 && idle.n > 0 && idle.p99 > 0.0).then(|| under.p99 / idle.p99)
}

/// How the answers to a load's calls went.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// OK.
    pub accepted: u64,
    /// RESOURCE_EXHAUSTED: over a quota.
    pub throttled: u64,
    /// INVALID_ARGUMENT.
    pub invalid: u64,
    /// Anything else.
    pub other: u64,
}

impl Counts {
    /// Every call answered.
    pub fn calls(&self) -> u64 {
        self.accepted + self.throttled + self.invalid + self.other
    }
}

/// A load's own figures.
#[derive(Debug, Clone)]
pub enum Figures {
    Flood {
        calls: Counts,
        secs: f64,
    },
    Watch {
        /// Streams asked for.
        asked: usize,
        /// Streams that got their first snapshot.
        held: u64,
        /// Refused over a quota.
        refused: u64,
        /// Other failures to open.
        failed: u64,
        /// Held streams the server ended before the aggressor let go.
        dropped: u64,
        /// Messages after the first, over all streams (nothing changed).
        updates: u64,
        /// Seconds to get every stream answered.
        open_secs: f64,
    },
    Cron {
        calls: Counts,
        /// How long each CreateSchedule took, ms.
        latency: Dist,
    },
    Poison {
        runs: Vec<PoisonedRun>,
        /// Workers started (each delivery killed one).
        workers: u64,
    },
    Backlog {
        /// Tasks asked for.
        asked: usize,
        /// StartRun answers (each OK one adds [`BACKLOG_ITEMS_PER_RUN`] tasks).
        calls: Counts,
        /// Seconds to start them all.
        fill_secs: f64,
        /// Tasks waiting in the aggressor's queue at the end of the window.
        depth: i64,
    },
}

/// One poisoned run.
#[derive(Debug, Clone)]
pub struct PoisonedRun {
    /// Times its task reached a worker.
    pub deliveries: usize,
    /// The highest attempt number delivered.
    pub last_attempt: i32,
    /// Its status when the phase ended (`FAILED`, or `RUNNING` when it never ends).
    pub status: String,
    /// The failure's code, if it failed.
    pub code: String,
    /// Seconds from its start to its end, if it ended.
    pub secs: Option<f64>,
}

impl Figures {
    /// The poisoned runs all FAILED after at most 2 × max_attempts
    /// deliveries; None for other loads.
    pub fn poison_contained(&self) -> Option<bool> {
        let Figures::Poison { runs, .. } = self else {
            return None;
        };
        let bound = 2 * POISON_MAX_ATTEMPTS as usize;
        Some(
            !runs.is_empty()
                && runs
                    .iter()
                    .all(|r| r.status == "FAILED" && r.deliveries <= bound),
        )
    }
}

/// B8 on its own server (tokens, the quotas file when the server takes one).
pub async fn noisy(ctx: &Ctx) -> Result<Noisy> {
    ctx.reset().await?;
    ctx.warm_wal(warm_wal_megabytes(ctx.profile.noisy_backlog_tasks))
        .await?;
    let secret = fresh_secret();
    let mut extra = vec![
        "--lease-receipt-timeout".to_owned(),
        RECEIPT_TIMEOUT.to_owned(),
    ];
    let quotas = if serve_takes(&ctx.composer, QUOTAS_FILE_FLAG).await {
        let text = quotas_file();
        let path = ctx.out_dir.join("b8-quotas.yaml");
        std::fs::write(&path, &text).with_context(|| format!("write {}", path.display()))?;
        extra.push(QUOTAS_FILE_FLAG.to_owned());
        extra.push(path.display().to_string());
        Some(text)
    } else {
        eprintln!("bench: B8: the server has no {QUOTAS_FILE_FLAG}; the aggressor runs unbounded");
        None
    };
    let server = Server::start_authenticated(
        &ctx.composer,
        &ctx.backends,
        &extra,
        &ServerAuth::Secret(secret.clone()),
    )
    .await?;
    let result = noisy_on(ctx, &server, &secret, quotas).await;
    stop_all(vec![server]).await;
    result
}

/// WAL written and checkpointed before B8, so that its segments are
/// recycled as in a cluster in service (see `Ctx::warm_wal`): about twice
/// what the backlog phase writes (some 4 KB a task), at least 64 MB.
fn warm_wal_megabytes(backlog_tasks: usize) -> u64 {
    let backlog = u64::try_from(backlog_tasks).unwrap_or(u64::MAX) * 4 / 1024;
    (backlog * 2).max(64)
}

/// The aggressor's quotas; every other namespace keeps the defaults.
fn quotas_file() -> String {
    format!(
        "namespaces:\n  {AGGRESSOR}:\n    writes_per_second: {AGGRESSOR_WRITES_PER_SECOND}\n    \
         tasks_per_second: {AGGRESSOR_TASKS_PER_SECOND}\n"
    )
}

/// Whether `composer serve --help` lists `flag`.
async fn serve_takes(composer: &std::path::Path, flag: &str) -> bool {
    let help = tokio::process::Command::new(composer)
        .args(["serve", "--help"])
        .output()
        .await;
    help.is_ok_and(|out| lists_flag(&String::from_utf8_lossy(&out.stdout), flag))
}

/// Whether a `--help` text names `flag` (whole: `--quotas-file-x` is not
/// `--quotas-file`).
fn lists_flag(help: &str, flag: &str) -> bool {
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '<')
        .any(|word| word == flag)
}

/// A signing secret of this run only.
fn fresh_secret() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("b8-{nanos:032x}{:08x}", std::process::id())
}

/// A token of `namespace` for `roles`, valid for a day.
fn token(secret: &str, namespace: &str, subject: &str, roles: &[&str]) -> Result<Bearer> {
    Bearer::token(&signed(secret, namespace, subject, roles)?)
}

/// The signed JWT of [`token`].
fn signed(secret: &str, namespace: &str, subject: &str, roles: &[&str]) -> Result<String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let claims = NewToken {
        sub: subject.to_owned(),
        ns: namespace.to_owned(),
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        queues: None,
        iat: now,
        nbf: now,
        exp: now + 86_400,
        iss: None,
        aud: None,
    };
    Ok(mint(&claims, SigningKey::Secret(secret.as_bytes()), None)?)
}

/// The aggressor's address and tokens: one per role, as separate programs
/// of one tenant would hold.
#[derive(Clone)]
struct Tenant {
    url: String,
    operator: Bearer,
    reader: Bearer,
    worker: Bearer,
}

/// Sizes of the loads.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    watch_streams: usize,
    backlog_tasks: usize,
}

async fn noisy_on(
    ctx: &Ctx,
    server: &Server,
    secret: &str,
    quotas: Option<String>,
) -> Result<Noisy> {
    let victim = token(secret, VICTIM, "victim-service", &["operator", "worker"])?;
    let tenant = Tenant {
        url: server.url.clone(),
        operator: token(secret, AGGRESSOR, "aggressor-operator", &["operator"])?,
        reader: token(secret, AGGRESSOR, "aggressor-dashboard", &["reader"])?,
        worker: token(secret, AGGRESSOR, "aggressor-worker", &["worker"])?,
    };
    for source in aggressor_workflows() {
        register_as(&server.url, &tenant.operator, &source).await?;
    }
    let open_loop = OpenLoop::start(&server.url, &victim).await?;
    let bench = Bench {
        ctx,
        server,
        open_loop: &open_loop,
        tenant,
        sizes: Sizes {
            watch_streams: ctx.profile.noisy_watch_streams,
            backlog_tasks: ctx.profile.noisy_backlog_tasks,
        },
        window: Duration::from_secs(ctx.profile.noisy_secs),
        limit: Duration::from_secs(ctx.profile.noisy_limit_secs.max(ctx.profile.noisy_secs)),
    };
    let result = bench.run(quotas).await;
    open_loop.stop().await;
    result
}

struct Bench<'a> {
    ctx: &'a Ctx,
    server: &'a Server,
    open_loop: &'a OpenLoop,
    tenant: Tenant,
    sizes: Sizes,
    /// The victim's window under each load (at least).
    window: Duration,
    /// The most a phase lasts.
    limit: Duration,
}

impl Bench<'_> {
    async fn run(&self, quotas: Option<String>) -> Result<Noisy> {
        eprintln!("bench: B8 victim idle");
        let (before, before_cores) = self.idle().await;
        let mut phases = Vec::new();
        for load in [Load::Flood, Load::Watch, Load::Cron, Load::Poison] {
            phases.push(self.phase(load).await?);
            self.quiesce().await;
        }
        // the backlog stays: the second idle window comes before it
        eprintln!("bench: B8 victim idle again");
        let (after, after_cores) = self.idle().await;
        phases.push(self.phase(Load::Backlog).await?);
        Ok(Noisy {
            idle: self.open_loop.latency(&before.and(after)),
            idle_cores: (before_cores + after_cores) / 2.0,
            phases,
            quotas,
        })
    }

    async fn idle(&self) -> (Started, f64) {
        let cpu = CpuWindow::open(self.server.pid);
        let started = self
            .open_loop
            .drive(Until::Runs(self.window.as_secs() * 10))
            .await;
        self.open_loop.settle(&started, SETTLE).await;
        (started, cpu.close().0)
    }

    fn label(&self, load: Load) -> String {
        match load {
            Load::Flood => format!("StartRun flood ({FLOOD_CLIENTS} loops)"),
            Load::Watch => format!("{} idle WatchRun streams", self.sizes.watch_streams),
            Load::Cron => format!("costly cron specs ({CRON_CLIENTS} loops)"),
            Load::Poison => format!("{POISONED_RUNS} poisoned runs, crash-looping workers"),
            Load::Backlog => format!("a backlog of {} tasks", self.sizes.backlog_tasks),
        }
    }

    /// The victim's window under `load`: the load sets itself up (opens
    /// its streams), then the victim runs for the window, and on until the
    /// load is done (the poisoned runs ended, the backlog filled), within
    /// the limit; then the load stops and reports.
    async fn phase(&self, load: Load) -> Result<Phase> {
        let label = self.label(load);
        eprintln!("bench: B8 victim under {label}");
        let (stop_tx, stop_rx) = watch::channel(false);
        let signals = Signals {
            stop: stop_rx,
            ready: Arc::default(),
            done: Arc::default(),
        };
        let mut figures = aside(aggress(
            load,
            self.tenant.clone(),
            self.sizes,
            signals.clone(),
        ));
        let ready = async {
            while !signals.ready.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            () = ready => {}
            early = &mut figures => {
                let error = match early {
                    Ok(Err(error)) => error,
                    Ok(Ok(_)) => anyhow::anyhow!("it ended before it was ready"),
                    Err(_) => anyhow::anyhow!("its thread ended"),
                };
                return Err(error.context(format!("B8 {label}")));
            }
            () = tokio::time::sleep(self.limit) => {
                let _ = stop_tx.send(true);
                let _ = tokio::time::timeout(self.limit, figures).await;
                bail!("B8 {label}: not set up within {:?}", self.limit);
            }
        }
        let cpu = CpuWindow::open(self.server.pid);
        let began = Instant::now();
        let enough = Arc::new(AtomicBool::new(false));
        let timer = async {
            tokio::time::sleep(self.window).await;
            while !signals.done.load(Ordering::Relaxed) && began.elapsed() < self.limit {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            enough.store(true, Ordering::Relaxed);
        };
        let (started, ()) = tokio::join!(
            self.open_loop.drive(Until::Stopped(Arc::clone(&enough))),
            timer
        );
        // the victim's last runs finish under the load too
        self.open_loop.settle(&started, SETTLE).await;
        let secs = began.elapsed().as_secs_f64();
        let (server_cores, client_cores) = cpu.close();
        let depth = if load == Load::Backlog {
            self.backlog_depth().await?
        } else {
            0
        };
        let _ = stop_tx.send(true);
        let mut figures = tokio::time::timeout(self.limit, figures)
            .await
            .with_context(|| format!("B8 {label}: did not stop within {:?}", self.limit))?
            .with_context(|| format!("B8 {label}: its thread ended"))?
            .with_context(|| format!("B8 {label}"))?;
        if let Figures::Backlog { depth: d, .. } = &mut figures {
            *d = depth;
        }
        Ok(Phase {
            label,
            victim: self.open_loop.latency(&started),
            secs,
            server_cores,
            client_cores,
            figures,
        })
    }

    /// Tasks waiting in the aggressor's backlog queue.
    async fn backlog_depth(&self) -> Result<i64> {
        sqlx::query_scalar(
            "SELECT count(*) FROM tasks WHERE namespace = $1 AND queue = $2 AND status = 'DISPATCHED'",
        )
        .bind(AGGRESSOR)
        .bind(BACKLOG_QUEUE)
        .fetch_one(&self.ctx.db)
        .await
        .context("count the backlog")
    }

    /// Waits until the server is near idle again: what a load leaves
    /// behind (the flood's runs' timers, streams closing) must not count
    /// against the next.
    async fn quiesce(&self) {
        let until = Instant::now() + QUIET_LIMIT.min(self.window);
        while Instant::now() < until {
            let cpu = CpuWindow::open(self.server.pid);
            tokio::time::sleep(Duration::from_millis(500)).await;
            if cpu.close().0 < QUIET_CORES {
                return;
            }
        }
    }
}

/// CPU used over a window, by the server and by this process.
struct CpuWindow {
    pid: i32,
    began: Instant,
    server: u64,
    client: u64,
}

impl CpuWindow {
    fn open(pid: i32) -> Self {
        Self {
            pid,
            began: Instant::now(),
            server: procs::cpu_ticks(pid),
            client: own_ticks(),
        }
    }

    /// Cores used by the server and by this process since [`open`](Self::open).
    fn close(self) -> (f64, f64) {
        let secs = self.began.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
        let cores = |ticks: u64| ticks as f64 / TICKS_PER_SECOND / secs;
        (
            cores(procs::cpu_ticks(self.pid).saturating_sub(self.server)),
            cores(own_ticks().saturating_sub(self.client)),
        )
    }
}

fn own_ticks() -> u64 {
    procs::cpu_ticks(i32::try_from(std::process::id()).unwrap_or(0))
}

/// Runs `work` on a runtime of its own, on a thread of its own: the
/// aggressor's client work (thousands of streams, loops that never wait)
/// must not delay the victim's tasks, whose timestamps are the measure.
fn aside<T: Send + 'static>(
    work: impl Future<Output = Result<T>> + Send + 'static,
) -> oneshot::Receiver<Result<T>> {
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("b8-aggressor".to_owned())
        .spawn(move || {
            let result = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(AGGRESSOR_THREADS)
                .enable_all()
                .build()
            {
                Ok(runtime) => {
                    let result = runtime.block_on(work);
                    runtime.shutdown_timeout(Duration::from_secs(2));
                    result
                }
                Err(error) => Err(error.into()),
            };
            let _ = tx.send(result);
        });
    if let Err(error) = spawned {
        eprintln!("bench: B8: the aggressor's thread did not start: {error}");
    }
    rx
}

/// What a load and its phase tell each other (across runtimes).
#[derive(Clone)]
struct Signals {
    /// The phase is over: stop, clean up and report.
    stop: watch::Receiver<bool>,
    /// Set up: the victim's window may begin.
    ready: Arc<AtomicBool>,
    /// Nothing more to wait for (the poisoned runs ended, the backlog is full).
    done: Arc<AtomicBool>,
}

impl Signals {
    /// True once the phase says stop, or is gone (it failed): a load must
    /// never outlive its phase.
    fn stopping(&self) -> bool {
        *self.stop.borrow() || self.stop.has_changed().is_err()
    }

    async fn stopped(&self) {
        let mut stop = self.stop.clone();
        let _ = stop.wait_for(|stop| *stop).await;
    }

    fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    fn set_done(&self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// Counts answers by their code.
#[derive(Debug, Default)]
struct Tally {
    accepted: AtomicU64,
    throttled: AtomicU64,
    invalid: AtomicU64,
    other: AtomicU64,
    first_other: Mutex<Option<String>>,
}

impl Tally {
    fn note<T>(&self, answer: &Result<T, Status>) {
        let counter = match answer {
            Ok(_) => &self.accepted,
            Err(status) if status.code() == Code::ResourceExhausted => &self.throttled,
            Err(status) if status.code() == Code::InvalidArgument => &self.invalid,
            Err(status) => {
                let mut first = self.first_other.lock().unwrap_or_else(|p| p.into_inner());
                first.get_or_insert_with(|| format!("{:?}: {}", status.code(), status.message()));
                &self.other
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts; the first unexpected answer goes to stderr.
    fn counts(&self, what: &str) -> Counts {
        if let Some(first) = &*self.first_other.lock().unwrap_or_else(|p| p.into_inner()) {
            eprintln!("bench: B8 {what}: first unexpected answer: {first}");
        }
        Counts {
            accepted: self.accepted.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
            invalid: self.invalid.load(Ordering::Relaxed),
            other: self.other.load(Ordering::Relaxed),
        }
    }
}

async fn aggress(load: Load, tenant: Tenant, sizes: Sizes, signals: Signals) -> Result<Figures> {
    match load {
        Load::Flood => flood(&tenant, &signals).await,
        Load::Watch => watch_streams(&tenant, sizes.watch_streams, &signals).await,
        Load::Cron => cron_storm(&tenant, &signals).await,
        Load::Poison => poison(&tenant, &signals).await,
        Load::Backlog => backlog(&tenant, sizes.backlog_tasks, &signals).await,
    }
}

async fn run_client(url: &str, bearer: &Bearer) -> Result<RunServiceClient<Authed>> {
    Ok(
        RunServiceClient::with_interceptor(channel(url).await?, bearer.clone())
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20),
    )
}

/// (a) StartRun from [`FLOOD_CLIENTS`] loops, each sending its next call
/// as soon as the last is answered, whatever the answer.
async fn flood(tenant: &Tenant, signals: &Signals) -> Result<Figures> {
    let mut clients = Vec::new();
    for _ in 0..FLOOD_CONNECTIONS {
        clients.push(run_client(&tenant.url, &tenant.operator).await?);
    }
    let tally = Arc::new(Tally::default());
    signals.set_ready();
    signals.set_done();
    let began = Instant::now();
    let mut loops = JoinSet::new();
    for i in 0..FLOOD_CLIENTS {
        let mut client = clients[i % clients.len()].clone();
        let tally = Arc::clone(&tally);
        let signals = signals.clone();
        loops.spawn(async move {
            while !signals.stopping() {
                let answer = client
                    .start_run(start_request(FLOOD_WORKFLOW, json!({})))
                    .await;
                tally.note(&answer);
            }
        });
    }
    while loops.join_next().await.is_some() {}
    Ok(Figures::Flood {
        calls: tally.counts("flood"),
        secs: began.elapsed().as_secs_f64(),
    })
}

/// Counters of the WatchRun streams.
#[derive(Debug, Default)]
struct StreamCounts {
    answered: AtomicUsize,
    held: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    updates: AtomicU64,
}

/// (b) WatchRun streams on the aggressor's waiting runs, one reader
/// token, held open (nothing changes) until the phase ends.
async fn watch_streams(tenant: &Tenant, streams: usize, signals: &Signals) -> Result<Figures> {
    let mut operator = run_client(&tenant.url, &tenant.operator).await?;
    let mut runs = Vec::new();
    for _ in 0..WATCHED_RUNS {
        let run = operator
            .start_run(start_request(WAITING_WORKFLOW, json!({})))
            .await
            .context("start a waiting run")?
            .into_inner()
            .run
            .context("no run")?;
        runs.push(run.run_id);
    }
    let mut readers = Vec::new();
    for _ in 0..streams.div_ceil(STREAMS_PER_CONNECTION).max(1) {
        readers.push(run_client(&tenant.url, &tenant.reader).await?);
    }
    let counts = Arc::new(StreamCounts::default());
    let opening = Arc::new(Semaphore::new(OPENS_IN_FLIGHT));
    let began = Instant::now();
    let mut holders = JoinSet::new();
    for i in 0..streams {
        let client = readers[i % readers.len()].clone();
        let run_id = runs[i % runs.len()].clone();
        let counts = Arc::clone(&counts);
        let opening = Arc::clone(&opening);
        let signals = signals.clone();
        holders.spawn(hold_stream(client, run_id, counts, opening, signals));
    }
    while counts.answered.load(Ordering::Relaxed) < streams && !signals.stopping() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let open_secs = began.elapsed().as_secs_f64();
    signals.set_ready();
    signals.set_done();
    signals.stopped().await;
    while holders.join_next().await.is_some() {}
    for run_id in runs {
        let _ = operator
            .cancel_run(CancelRunRequest {
                run_id,
                reason: "B8 is done watching".to_owned(),
            })
            .await;
    }
    Ok(Figures::Watch {
        asked: streams,
        held: counts.held.load(Ordering::Relaxed),
        refused: counts.refused.load(Ordering::Relaxed),
        failed: counts.failed.load(Ordering::Relaxed),
        dropped: counts.dropped.load(Ordering::Relaxed),
        updates: counts.updates.load(Ordering::Relaxed),
        open_secs,
    })
}

/// Opens one stream, waits for its first snapshot, and holds it until the
/// phase ends, counting what else arrives.
async fn hold_stream(
    mut client: RunServiceClient<Authed>,
    run_id: String,
    counts: Arc<StreamCounts>,
    opening: Arc<Semaphore>,
    signals: Signals,
) {
    let Ok(permit) = opening.acquire_owned().await else {
        return;
    };
    let opened = async {
        let mut stream = client
            .watch_run(WatchRunRequest { run_id })
            .await?
            .into_inner();
        let first = stream.message().await?;
        Ok::<_, Status>((stream, first))
    }
    .await;
    counts.answered.fetch_add(1, Ordering::Relaxed);
    drop(permit);
    let mut stream = match opened {
        Ok((stream, Some(_))) => stream,
        Ok((_, None)) => {
            counts.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(status) if status.code() == Code::ResourceExhausted => {
            counts.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(_) => {
            counts.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    counts.held.fetch_add(1, Ordering::Relaxed);
    loop {
        tokio::select! {
            () = signals.stopped() => return,
            message = stream.message() => match message {
                Ok(Some(_)) => {
                    counts.updates.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    counts.dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            },
        }
    }
}

/// (c) CreateSchedule from [`CRON_CLIENTS`] loops, taking turns through
/// [`COSTLY_CRONS`].
async fn cron_storm(tenant: &Tenant, signals: &Signals) -> Result<Figures> {
    let client = ScheduleServiceClient::with_interceptor(
        channel(&tenant.url).await?,
        tenant.operator.clone(),
    );
    let tally = Arc::new(Tally::default());
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let next = Arc::new(AtomicU64::new(0));
    signals.set_ready();
    signals.set_done();
    let mut loops = JoinSet::new();
    for _ in 0..CRON_CLIENTS {
        let mut client = client.clone();
        let (tally, latencies, next) = (
            Arc::clone(&tally),
            Arc::clone(&latencies),
            Arc::clone(&next),
        );
        let signals = signals.clone();
        loops.spawn(async move {
            while !signals.stopping() {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let cron = COSTLY_CRONS[(i % COSTLY_CRONS.len() as u64) as usize];
                let sent = Instant::now();
                let answer = client.create_schedule(costly_schedule(i, cron)).await;
                latencies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(ms(sent.elapsed()));
                tally.note(&answer);
            }
        });
    }
    while loops.join_next().await.is_some() {}
    let latency = dist(std::mem::take(
        &mut *latencies.lock().unwrap_or_else(|p| p.into_inner()),
    ));
    Ok(Figures::Cron {
        calls: tally.counts("cron"),
        latency,
    })
}

fn costly_schedule(i: u64, cron: &str) -> CreateScheduleRequest {
    CreateScheduleRequest {
        schedule_id: format!("costly-{i}"),
        spec: Some(ScheduleSpec {
            cron: cron.to_owned(),
            ..ScheduleSpec::default()
        }),
        action: Some(ScheduleAction {
            workflow_name: FLOOD_WORKFLOW.to_owned(),
            input: Some(composer_grpc::convert::from_json(&json!({}))),
            ..ScheduleAction::default()
        }),
        ..CreateScheduleRequest::default()
    }
}

/// Deliveries of the poisoned runs' tasks: the attempt numbers, by run.
type Deliveries = Arc<Mutex<HashMap<String, Vec<i32>>>>;

/// (d) [`POISONED_RUNS`] runs of a task that kills every worker it
/// reaches, against [`CRASH_LOOPS`] supervisors restarting their worker;
/// done when every run has ended.
async fn poison(tenant: &Tenant, signals: &Signals) -> Result<Figures> {
    let mut operator = run_client(&tenant.url, &tenant.operator).await?;
    let began = Instant::now();
    let mut runs = Vec::new();
    for _ in 0..POISONED_RUNS {
        let run = operator
            .start_run(start_request(POISON_WORKFLOW, json!({})))
            .await
            .context("start a poisoned run")?
            .into_inner()
            .run
            .context("no run")?;
        runs.push(run.run_id);
    }
    let deliveries: Deliveries = Arc::default();
    let workers = Arc::new(AtomicU64::new(0));
    signals.set_ready();
    let mut loops = JoinSet::new();
    for index in 0..CRASH_LOOPS {
        loops.spawn(crash_loop(
            tenant.url.clone(),
            tenant.worker.clone(),
            index,
            Arc::clone(&deliveries),
            Arc::clone(&workers),
            signals.clone(),
        ));
    }
    let mut ended: HashMap<String, (RunStatus, String, f64)> = HashMap::new();
    while !signals.stopping() {
        let waiting: Vec<String> = runs
            .iter()
            .filter(|r| !ended.contains_key(*r))
            .cloned()
            .collect();
        for run_id in waiting {
            let Ok(Some(run)) = operator
                .get_run(GetRunRequest {
                    run_id: run_id.clone(),
                    skip_nodes: true,
                })
                .await
                .map(|r| r.into_inner().run)
            else {
                continue;
            };
            let status = run.status();
            if matches!(
                status,
                RunStatus::Failed | RunStatus::Completed | RunStatus::Cancelled
            ) {
                let code = run.error.map(|e| e.code).unwrap_or_default();
                ended.insert(run_id, (status, code, began.elapsed().as_secs_f64()));
            }
        }
        if ended.len() == runs.len() {
            signals.set_done();
        }
        tokio::select! {
            () = signals.stopped() => {}
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
    while loops.join_next().await.is_some() {}
    let deliveries = std::mem::take(&mut *deliveries.lock().unwrap_or_else(|p| p.into_inner()));
    let mut figures = Vec::new();
    for run_id in runs {
        let delivered = deliveries.get(&run_id).cloned().unwrap_or_default();
        let (status, code, secs) = match ended.get(&run_id) {
            Some((status, code, secs)) => (*status, code.clone(), Some(*secs)),
            None => {
                // it never ended: say so, and take it away from the next load
                let _ = operator
                    .cancel_run(CancelRunRequest {
                        run_id: run_id.clone(),
                        reason: "B8's poisoned run did not end".to_owned(),
                    })
                    .await;
                (RunStatus::Running, String::new(), None)
            }
        };
        figures.push(PoisonedRun {
            deliveries: delivered.len(),
            last_attempt: delivered.iter().copied().max().unwrap_or(0),
            status: status
                .as_str_name()
                .trim_start_matches("RUN_STATUS_")
                .to_owned(),
            code,
            secs,
        });
    }
    Ok(Figures::Poison {
        runs: figures,
        workers: workers.load(Ordering::Relaxed),
    })
}

/// A supervisor and its worker: the worker polls the poisoned queue,
/// confirming receipt as the SDKs do; a task kills it at once (no
/// heartbeat, no report, its connection gone), and the supervisor starts
/// a new one after [`RESTART_DELAY`].
async fn crash_loop(
    url: String,
    bearer: Bearer,
    index: usize,
    deliveries: Deliveries,
    workers: Arc<AtomicU64>,
    signals: Signals,
) {
    let mut incarnation = 0_u64;
    while !signals.stopping() {
        incarnation += 1;
        workers.fetch_add(1, Ordering::Relaxed);
        if let Ok(channel) = channel(&url).await {
            // a process of its own: a connection of its own, gone with it
            let mut client = WorkerServiceClient::with_interceptor(channel, bearer.clone());
            let worker_id = format!("crash-loop-{index}-{incarnation}");
            loop {
                let poll = client.poll_tasks(PollTasksRequest {
                    worker_id: worker_id.clone(),
                    queues: vec![POISON_QUEUE.to_owned()],
                    max_tasks: 1,
                    wait: Some(prost_types::Duration {
                        seconds: 2,
                        nanos: 0,
                    }),
                    confirm_receipt: true,
                });
                let polled = tokio::select! {
                    polled = poll => polled,
                    () = signals.stopped() => return,
                };
                let Ok(answer) = polled else { break };
                let tasks = answer.into_inner().tasks;
                if tasks.is_empty() {
                    continue;
                }
                {
                    let mut delivered = deliveries.lock().unwrap_or_else(|p| p.into_inner());
                    for task in tasks {
                        delivered.entry(task.run_id).or_default().push(task.attempt);
                    }
                }
                // the handler took the process down with it
                break;
            }
        }
        tokio::select! {
            () = signals.stopped() => return,
            () = tokio::time::sleep(RESTART_DELAY) => {}
        }
    }
}

/// (e) MAP runs of [`BACKLOG_ITEMS_PER_RUN`] tasks on a queue nobody
/// works, from [`BACKLOG_CLIENTS`] loops, until `tasks` are waiting: a
/// throttled StartRun is sent again, so the fill goes as fast as the
/// quota allows. Done when they are all started.
async fn backlog(tenant: &Tenant, tasks: usize, signals: &Signals) -> Result<Figures> {
    let client = run_client(&tenant.url, &tenant.operator).await?;
    let items: Vec<usize> = (0..BACKLOG_ITEMS_PER_RUN).collect();
    let input = json!({ "items": items });
    let runs = tasks.div_ceil(BACKLOG_ITEMS_PER_RUN);
    let next = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Tally::default());
    signals.set_ready();
    let began = Instant::now();
    let mut loops = JoinSet::new();
    for _ in 0..BACKLOG_CLIENTS {
        let mut client = client.clone();
        let (next, tally, input) = (Arc::clone(&next), Arc::clone(&tally), input.clone());
        let signals = signals.clone();
        loops.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < runs {
                loop {
                    if signals.stopping() {
                        return;
                    }
                    let answer = client
                        .start_run(start_request(BACKLOG_WORKFLOW, input.clone()))
                        .await;
                    tally.note(&answer);
                    match answer {
                        Err(status) if status.code() == Code::ResourceExhausted => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        _ => break,
                    }
                }
            }
        });
    }
    while loops.join_next().await.is_some() {}
    let fill_secs = began.elapsed().as_secs_f64();
    signals.set_done();
    signals.stopped().await;
    Ok(Figures::Backlog {
        asked: runs * BACKLOG_ITEMS_PER_RUN,
        calls: tally.counts("backlog"),
        fill_secs,
        depth: 0,
    })
}

#[cfg(test)]
mod tests {
    use composer_grpc::auth::{AuthMode, Authenticator, VerificationKey};
    use tonic::codegen::http::HeaderMap;

    use super::*;

    /// The caller a server with `secret` sees for `token` calling `rpc`.
    fn caller_of(secret: &str, token: &str, rpc: &str) -> Result<String, Code> {
        let key = VerificationKey::hs256(secret.as_bytes()).expect("a long enough secret");
        let server = Authenticator::new(
            AuthMode::Tokens {
                keys: vec![key],
                issuer: None,
                audience: None,
                leeway_secs: 30,
            },
            Vec::new(),
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
        match server.authorize(&format!("/composer.v1.{rpc}"), &headers) {
            Ok(Some(caller)) => Ok(caller.namespace),
            Ok(None) => Ok(String::new()),
            Err(status) => Err(status.code()),
        }
    }

    #[test]
    fn each_tenant_acts_in_its_own_namespace_with_only_its_roles() {
        let secret = fresh_secret();
        let victim = signed(&secret, VICTIM, "victim-service", &["operator", "worker"]).unwrap();
        let reader = signed(&secret, AGGRESSOR, "aggressor-dashboard", &["reader"]).unwrap();
        assert_eq!(
            caller_of(&secret, &victim, "RunService/StartRun"),
            Ok(VICTIM.to_owned())
        );
        assert_eq!(
            caller_of(&secret, &victim, "WorkerService/PollTasks"),
            Ok(VICTIM.to_owned())
        );
        assert_eq!(
            caller_of(&secret, &reader, "RunService/WatchRun"),
            Ok(AGGRESSOR.to_owned())
        );
        assert_eq!(
            caller_of(&secret, &reader, "RunService/StartRun"),
            Err(Code::PermissionDenied)
        );
        assert_eq!(
            caller_of(&fresh_secret(), &victim, "RunService/StartRun"),
            Err(Code::Unauthenticated),
            "another run's secret signs nothing this server takes"
        );
    }

    #[test]
    fn a_flag_counts_as_listed_only_when_named_whole() {
        let help = "      --quotas-file <QUOTAS_FILE>\n          Quotas per namespace\n";
        assert!(lists_flag(help, "--quotas-file"));
        assert!(!lists_flag(help, "--quotas"));
        assert!(!lists_flag("      --quotas-file-x <X>\n", "--quotas-file"));
    }

    fn poisoned(deliveries: usize, status: &str) -> PoisonedRun {
        PoisonedRun {
            deliveries,
            last_attempt: 3,
            status: status.to_owned(),
            code: String::new(),
            secs: None,
        }
    }

    #[test]
    fn poison_is_contained_only_when_every_run_failed_within_two_deliveries_an_attempt() {
        let contained =
            |runs: Vec<PoisonedRun>| Figures::Poison { runs, workers: 0 }.poison_contained();
        assert_eq!(
            contained(vec![poisoned(6, "FAILED"), poisoned(4, "FAILED")]),
            Some(true)
        );
        assert_eq!(
            contained(vec![poisoned(6, "FAILED"), poisoned(7, "FAILED")]),
            Some(false)
        );
        assert_eq!(
            contained(vec![poisoned(6, "FAILED"), poisoned(24, "RUNNING")]),
            Some(false)
        );
        assert_eq!(contained(Vec::new()), Some(false), "no run, no evidence");
        let flood = Figures::Flood {
            calls: Counts::default(),
            secs: 1.0,
        };
        assert_eq!(flood.poison_contained(), None);
    }

    #[test]
    fn a_ratio_needs_samples_on_both_sides() {
        let sample = |p99: f64, n: usize| Dist {
            p50: p99 / 2.0,
            p99,
            max: p99,
            n,
        };
        assert_eq!(ratio(&sample(6.0, 100), &sample(3.0, 100)), Some(2.0));
        assert_eq!(ratio(&sample(6.0, 0), &sample(3.0, 100)), None);
        assert_eq!(ratio(&sample(6.0, 100), &sample(0.0, 0)), None);
    }
}
