//! The processes a benchmark runs: Postgres and Redis (through `composer dev
//! --no-server`, so their settings are exactly the dev settings), servers
//! (`composer serve`), and what `/proc` says about their CPU and memory.

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use sqlx::{Connection, PgConnection};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ; 100 on Linux).
pub const TICKS_PER_SECOND: f64 = 100.0;

/// Postgres and Redis started by `composer dev --no-server`.
pub struct Backends {
    dev: Child,
    composer: PathBuf,
    root: PathBuf,
    env_file: PathBuf,
    /// `postgres://composer@127.0.0.1:<port>/composer`.
    pub database_url: String,
    /// `redis://127.0.0.1:<port>/0`.
    pub redis_url: String,
    /// True when pg_stat_statements is loaded.
    pub statements: bool,
}

impl Backends {
    /// Starts Postgres and Redis with the dev settings, then restarts them
    /// once with `pg_stat_statements` preloaded (the only setting added: it
    /// counts statements per task; `ALTER SYSTEM` in the kept data folder).
    pub async fn start(composer: &Path) -> Result<Self> {
        let root = std::env::temp_dir().join(format!("composer-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root)?;
        let env_file = root.with_extension("env");
        let mut backends = Self {
            dev: spawn_dev(composer, &root, &env_file)?,
            composer: composer.to_path_buf(),
            root: root.clone(),
            env_file,
            database_url: String::new(),
            redis_url: String::new(),
            statements: false,
        };
        backends.wait_env().await?;
        let preload = async {
            let mut conn = PgConnection::connect(&backends.admin_url()).await?;
            sqlx::query("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
                .execute(&mut conn)
                .await?;
            conn.close().await?;
            anyhow::Ok(())
        };
        if let Err(error) = preload.await {
            eprintln!("bench: pg_stat_statements not enabled ({error}); statement counts left out");
            return Ok(backends);
        }
        stop_child(&mut backends.dev, Duration::from_secs(20)).await;
        backends.dev = spawn_dev(&backends.composer, &backends.root, &backends.env_file)?;
        backends.wait_env().await?;
        // in `postgres`: the view reads every database's counters
        let mut conn = PgConnection::connect(&backends.admin_url()).await?;
        match sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&mut conn)
            .await
        {
            Ok(_) => backends.statements = true,
            Err(error) => {
                eprintln!(
                    "bench: pg_stat_statements not enabled ({error}); statement counts left out"
                );
            }
        }
        conn.close().await?;
        Ok(backends)
    }

    async fn wait_env(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&self.env_file)
                && text.contains("COMPOSER_REDIS_URL=")
            {
                for line in text.lines() {
                    if let Some(url) = line.strip_prefix("COMPOSER_DATABASE_URL=") {
                        self.database_url = url.to_owned();
                    }
                    if let Some(url) = line.strip_prefix("COMPOSER_REDIS_URL=") {
                        self.redis_url = url.to_owned();
                    }
                }
                let _ = std::fs::remove_file(&self.env_file);
                return Ok(());
            }
            if let Some(status) = self.dev.try_wait()? {
                bail!("composer dev --no-server exited early: {status}");
            }
            if started.elapsed() > Duration::from_secs(90) {
                bail!("Postgres and Redis did not start within 90 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The same Postgres, database `postgres` (queries here do not count in
    /// the `composer` database's transaction counters).
    pub fn admin_url(&self) -> String {
        self.url_of("postgres")
    }

    /// The same Postgres, another database.
    pub fn url_of(&self, database: &str) -> String {
        let base = self.database_url.rsplit_once('/').map_or("", |(b, _)| b);
        format!("{base}/{database}")
    }

    /// The postmaster's pid (first line of `postmaster.pid`).
    pub fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.root.join("postgres/postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// The redis-server's pid (its command line names its port).
    pub fn redis_pid(&self) -> Option<i32> {
        let port = self
            .redis_url
            .rsplit(':')
            .next()?
            .split('/')
            .next()?
            .to_owned();
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("redis-server") && cmdline.contains(&format!(":{port}")) {
                return Some(pid);
            }
        }
        None
    }

    /// Stops Postgres and Redis (SIGTERM to `composer dev`) and removes the folder.
    pub async fn stop(mut self) {
        stop_child(&mut self.dev, Duration::from_secs(30)).await;
        let _ = std::fs::remove_dir_all(&self.root);
        let _ = std::fs::remove_dir_all(blob_folders());
        let _ = std::fs::remove_file(&self.env_file);
    }
}

fn spawn_dev(composer: &Path, root: &Path, env_file: &Path) -> Result<Child> {
    let _ = std::fs::remove_file(env_file);
    Command::new(composer)
        .args(["dev", "--no-server", "--data"])
        .arg(root)
        .arg("--env-file")
        .arg(env_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("spawn {} dev --no-server", composer.display()))
}

async fn stop_child(child: &mut Child, timeout: Duration) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    if tokio::time::timeout(timeout, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// How a server authenticates its callers.
pub enum ServerAuth {
    /// No tokens (`COMPOSER_INSECURE`): every call acts as the default
    /// namespace's admin. Every benchmark but B8.
    Insecure,
    /// Tokens signed with this HS256 secret (`COMPOSER_AUTH_SECRET`), so
    /// callers act in their token's namespace (B8's tenants).
    Secret(String),
}

/// One `composer serve` process.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Its pid.
    pub pid: i32,
    lines: Arc<Mutex<VecDeque<String>>>,
    budget: Option<CpuBudget>,
}

impl Server {
    /// Starts `composer serve` on a free port, with `extra` flags, and
    /// waits until it listens. No tokens: every call acts as the default
    /// namespace's admin.
    pub async fn start_with(
        composer: &Path,
        backends: &Backends,
        extra: &[String],
    ) -> Result<Self> {
        Self::start_authenticated(composer, backends, extra, &ServerAuth::Insecure).await
    }

    /// [`start_with`](Server::start_with), authenticating callers as `auth` says.
    pub async fn start_authenticated(
        composer: &Path,
        backends: &Backends,
        extra: &[String],
        auth: &ServerAuth,
    ) -> Result<Self> {
        let mut command = Command::new(composer);
        // blobs in this run's own folder (older servers ignore the variable)
        command.env("COMPOSER_BLOB_STORE", blob_folder());
        match auth {
            // servers before auth ignore the variable
            ServerAuth::Insecure => command.env("COMPOSER_INSECURE", "true"),
            // in the environment, not on the command line `ps` shows
            ServerAuth::Secret(secret) => command
                .env_remove("COMPOSER_INSECURE")
                .env("COMPOSER_AUTH_SECRET", secret),
        };
        let mut child = command
            .arg("serve")
            .args([
                "--listen",
                "127.0.0.1:0",
                "--log-format",
                "json",
                "--log",
                "info",
            ])
            .args(["--drain-delay", "0s", "--shutdown-timeout", "10s"])
            .args(["--database-url", &backends.database_url])
            .args(["--redis-url", &backends.redis_url])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {} serve", composer.display()))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .context("server pid")?;
        let stderr = child.stderr.take().context("server stderr")?;
        let lines = Arc::new(Mutex::new(VecDeque::new()));
        let (addr_tx, mut addr_rx) = tokio::sync::watch::channel(None::<String>);
        let collected = Arc::clone(&lines);
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Some(addr) = listening_addr(&line) {
                    let _ = addr_tx.send(Some(addr));
                }
                let mut kept = collected.lock().unwrap_or_else(|p| p.into_inner());
                kept.push_back(line);
                if kept.len() > 200 {
                    kept.pop_front();
                }
            }
        });
        let waited =
            tokio::time::timeout(Duration::from_secs(60), addr_rx.wait_for(|a| a.is_some())).await;
        let addr = match waited {
            Ok(Ok(addr)) => addr.clone().unwrap_or_default(),
            _ => bail!(
                "composer serve did not start; stderr:\n{}",
                lines
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
        };
        Ok(Self {
            child,
            url: format!("http://{addr}"),
            pid,
            lines,
            budget: None,
        })
    }

    /// Holds the server to `cores` of CPU from now on, as a machine of its
    /// own with that many cores would (docs/decisions/0031).
    pub fn limit_cpu(&mut self, cores: f64) -> Result<()> {
        self.budget = Some(CpuBudget::new(self.pid, cores)?);
        Ok(())
    }

    /// Warnings and errors the server logged (the last 200 lines kept).
    pub fn complaints(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|l| l.contains("\"WARN\"") || l.contains("\"ERROR\""))
            .cloned()
            .collect()
    }

    /// SIGTERM, then SIGKILL after 15 s.
    pub async fn stop(mut self) {
        stop_child(&mut self.child, Duration::from_secs(15)).await;
        // its cgroup can go only once nothing is left in it
        drop(self.budget.take());
    }
}

/// A cgroup with a CPU quota holding one process (cgroup v1's `cpu`
/// controller, or v2's `cpu.max`); removed on drop.
struct CpuBudget {
    dir: PathBuf,
}

/// The quota's period: CFS's default.
const CPU_PERIOD_US: u64 = 100_000;

/// True when this process may make CPU budgets (root, with a cgroup cpu
/// controller): probed by making one that holds nothing.
pub fn cpu_budgets_work() -> bool {
    CpuBudget::create(&format!("composer-bench-probe-{}", std::process::id()), 1.0).is_ok()
}

impl CpuBudget {
    fn new(pid: i32, cores: f64) -> Result<Self> {
        let budget = Self::create(
            &format!("composer-bench-{}-{pid}", std::process::id()),
            cores,
        )?;
        budget.write("cgroup.procs", &pid.to_string())?;
        Ok(budget)
    }

    /// An empty cgroup `name` with a quota of `cores`.
    fn create(name: &str, cores: f64) -> Result<Self> {
        anyhow::ensure!(cores > 0.0, "a CPU budget must be above zero cores");
        // at least 1 ms a period, the kernel's least quota
        let quota = ((cores * CPU_PERIOD_US as f64) as u64).max(1_000);
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let v2 = Path::new("/sys/fs/cgroup");
        if v1.join("cpu.cfs_quota_us").exists() {
            let budget = Self { dir: v1.join(name) };
            std::fs::create_dir_all(&budget.dir)?;
            budget.write("cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
            budget.write("cpu.cfs_quota_us", &quota.to_string())?;
            return Ok(budget);
        }
        anyhow::ensure!(
            v2.join("cgroup.controllers").exists(),
            "no cgroup cpu controller under /sys/fs/cgroup"
        );
        // the root must hand the cpu controller to its children
        let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+cpu");
        let budget = Self { dir: v2.join(name) };
        std::fs::create_dir_all(&budget.dir)?;
        budget.write("cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?;
        Ok(budget)
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        std::fs::write(self.dir.join(file), value)
            .with_context(|| format!("write {value} to {}", self.dir.join(file).display()))
    }
}

impl Drop for CpuBudget {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn listening_addr(line: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = value.get("fields").unwrap_or(&value);
    let message = fields
        .get("message")
        .or_else(|| value.get("message"))?
        .as_str()?;
    if message != "listening" {
        return None;
    }
    Some(
        fields
            .get("addr")
            .or_else(|| value.get("addr"))?
            .as_str()?
            .to_owned(),
    )
}

fn stat_fields(pid: i32) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    // fields from 3 (state) on; state is not a number
    Some(
        rest.split_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0))
            .collect(),
    )
}

/// utime + stime of a process, in ticks.
pub fn cpu_ticks(pid: i32) -> u64 {
    stat_fields(pid).map_or(0, |f| f[11] + f[12])
}

/// CPU of a process and all its children, dead (reaped) or alive, in ticks.
pub fn tree_ticks(root: i32) -> u64 {
    let Some(fields) = stat_fields(root) else {
        return 0;
    };
    let mut total = fields[11] + fields[12] + fields[13] + fields[14];
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if let Some(f) = stat_fields(pid)
                && i32::try_from(f[1]).ok() == Some(root)
            {
                total += f[11] + f[12];
            }
        }
    }
    total
}

/// Peak resident set (VmHWM) of a process, in MiB.
pub fn peak_rss_mib(pid: i32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// This machine: `nproc`, memory, CPU model.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    format!("nproc {cpus}, {mem_gib:.0} GiB memory, {model}")
}

/// The folder of every blob folder of this benchmark, removed when it ends.
pub fn blob_folders() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("composer-bench-blobs-{}", std::process::id()))
}

/// Bumped by each reset: the next row's servers start on a folder of their own.
static BLOB_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Where the servers of the current row keep their blobs.
pub fn blob_folder() -> std::path::PathBuf {
    let generation = BLOB_GENERATION.load(std::sync::atomic::Ordering::Relaxed);
    blob_folders().join(generation.to_string())
}

/// Gives the next row's servers a new blob folder, leaving the last one's
/// files where they are until the benchmark ends. Deleted just before a row,
/// they would slow it: ext4 does not reuse an inode freed within the last
/// 60 to 300 s, so every file the row creates would first skip past each of
/// the thousands just freed.
pub fn next_blob_folder() {
    BLOB_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}
