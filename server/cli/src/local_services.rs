//! A private PostgreSQL and Redis for `composer dev` and the test harness:
//! started from the binaries on this machine, in a folder of their own, on
//! free loopback ports, and stopped (the folder removed) when done.

use std::{
    fs,
    net::TcpListener,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::{Pid, Uid, User, chown},
};
use sqlx::{Connection, PgConnection};
use tokio::process::{Child, Command};

/// How long a service may take to answer after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the local services could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LocalServicesError {
    /// A program is not installed.
    #[error("{program} not found on PATH{also}; install it with: {install}")]
    MissingBinary {
        /// The program looked for.
        program: &'static str,
        /// Where else it was looked for.
        also: &'static str,
        /// The command that installs it.
        install: &'static str,
    },
    /// A program ran but failed.
    #[error("{program} failed: {detail}")]
    Failed {
        /// The program.
        program: &'static str,
        /// What went wrong (its output, or the log to read).
        detail: String,
    },
    /// The data folder could not be prepared.
    #[error("data folder {path}: {source}")]
    Folder {
        /// The folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Options for [`LocalServices::start`].
#[derive(Debug, Clone, Default)]
pub struct LocalServicesOptions {
    /// Keep the data here (reused if it exists) instead of a temporary folder.
    pub data_dir: Option<PathBuf>,
}

/// A running private Postgres and Redis.
#[derive(Debug)]
pub struct LocalServices {
    root: PathBuf,
    keep_root: bool,
    postgres: Child,
    redis: Child,
    /// URL of the `composer` database.
    pub database_url: String,
    /// URL of database 0 of the Redis server.
    pub redis_url: String,
    /// Postgres port on 127.0.0.1.
    pub postgres_port: u16,
    /// Redis port on 127.0.0.1.
    pub redis_port: u16,
}

impl LocalServices {
    /// Starts Postgres and Redis and waits until both answer.
    pub async fn start(options: LocalServicesOptions) -> Result<Self, LocalServicesError> {
        let pg_bin = find_postgres_bin()?;
        let redis_bin = find_on_path("redis-server").ok_or(LocalServicesError::MissingBinary {
            program: "redis-server",
            also: "",
            install: "apt-get install -y redis-server",
        })?;
        let (root, keep_root) = prepare_root(options.data_dir)?;

        let postgres_port = free_port()?;
        let redis_port = free_port()?;
        let postgres = start_postgres(&pg_bin, &root, postgres_port).await;
        let postgres = match postgres {
            Ok(child) => child,
            Err(error) => {
                cleanup_root(&root, keep_root);
                return Err(error);
            }
        };
        let redis = match start_redis(&redis_bin, &root, redis_port) {
            Ok(child) => child,
            Err(error) => {
                stop_child(postgres, Signal::SIGINT).await;
                cleanup_root(&root, keep_root);
                return Err(error);
            }
        };
        let services = Self {
            database_url: format!("postgres://composer@127.0.0.1:{postgres_port}/composer"),
            redis_url: format!("redis://127.0.0.1:{redis_port}/0"),
            root,
            keep_root,
            postgres,
            redis,
            postgres_port,
            redis_port,
        };
        if let Err(error) = services.wait_ready().await {
            services.stop().await;
            return Err(error);
        }
        Ok(services)
    }

    /// A way to kill both servers at once and remove the folder (unless
    /// kept), for an exit that cannot wait for [`LocalServices::stop`].
    pub fn killer(&self) -> impl FnOnce() + Send + 'static {
        let pids: Vec<i32> = [self.postgres.id(), self.redis.id()]
            .into_iter()
            .flatten()
            .filter_map(|pid| i32::try_from(pid).ok())
            .collect();
        let (root, keep) = (self.root.clone(), self.keep_root);
        move || {
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(200));
            cleanup_root(&root, keep);
        }
    }

    /// The Postgres server's process id (fault tests stop and continue it
    /// and its backends).
    pub fn postgres_pid(&self) -> Option<i32> {
        self.postgres.id().and_then(|pid| i32::try_from(pid).ok())
    }

    /// The folder holding the data and the logs.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// True when the folder is kept after stop.
    pub fn keeps_data(&self) -> bool {
        self.keep_root
    }

    async fn wait_ready(&self) -> Result<(), LocalServicesError> {
        let admin_url = format!(
            "postgres://composer@127.0.0.1:{}/postgres",
            self.postgres_port
        );
        let mut admin = wait_for_postgres(&admin_url, &self.root).await?;
        create_database_if_missing(&mut admin, "composer").await?;
        let _ = admin.close().await;
        wait_for_redis(self.redis_port, &self.root).await
    }

    /// Stops both servers (fast shutdown) and removes the folder unless kept.
    pub async fn stop(self) {
        stop_child(self.redis, Signal::SIGTERM).await;
        stop_child(self.postgres, Signal::SIGINT).await;
        cleanup_root(&self.root, self.keep_root);
    }
}

fn prepare_root(data_dir: Option<PathBuf>) -> Result<(PathBuf, bool), LocalServicesError> {
    let (root, keep) = match data_dir {
        Some(dir) => (dir, true),
        None => {
            let dir = tempfile::Builder::new()
                .prefix("composer-dev-")
                .tempdir()
                .map_err(|source| LocalServicesError::Folder {
                    path: std::env::temp_dir(),
                    source,
                })?;
            (dir.keep(), false)
        }
    };
    fs::create_dir_all(&root).map_err(|source| LocalServicesError::Folder {
        path: root.clone(),
        source,
    })?;
    let root = root
        .canonicalize()
        .map_err(|source| LocalServicesError::Folder {
            path: root.clone(),
            source,
        })?;
    Ok((root, keep))
}

fn cleanup_root(root: &Path, keep: bool) {
    if !keep {
        let _ = fs::remove_dir_all(root);
    }
}

/// Picks a port the OS says is free on loopback now.
fn free_port() -> Result<u16, LocalServicesError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| LocalServicesError::Failed {
        program: "bind",
        detail: e.to_string(),
    })?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|e| LocalServicesError::Failed {
            program: "bind",
            detail: e.to_string(),
        })
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// The folder holding `initdb` and `postgres`: PATH first, then the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian does not put them on PATH).
fn find_postgres_bin() -> Result<PathBuf, LocalServicesError> {
    if let (Some(initdb), Some(_)) = (find_on_path("initdb"), find_on_path("postgres"))
        && let Some(dir) = initdb.parent()
    {
        return Ok(dir.to_path_buf());
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or(LocalServicesError::MissingBinary {
            program: "initdb",
            also: " or in /usr/lib/postgresql/*/bin",
            install: "apt-get install -y postgresql",
        })
}

/// Postgres refuses to run as root: when we are root, its processes run as
/// the `postgres` system user (created by Debian's package) and own the data.
fn postgres_user() -> Result<Option<User>, LocalServicesError> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    let user = User::from_name("postgres")
        .ok()
        .flatten()
        .ok_or(LocalServicesError::Failed {
            program: "postgres",
            detail: "running as root needs the `postgres` system user; install it with: apt-get install -y postgresql".to_owned(),
        })?;
    Ok(Some(user))
}

fn as_user(command: &mut Command, user: &Option<User>) {
    if let Some(user) = user {
        command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
}

fn give_to(path: &Path, user: &Option<User>) -> Result<(), LocalServicesError> {
    let Some(user) = user else { return Ok(()) };
    chown(path, Some(user.uid), Some(user.gid)).map_err(|e| LocalServicesError::Folder {
        path: path.to_path_buf(),
        source: std::io::Error::from(e),
    })
}

async fn start_postgres(bin: &Path, root: &Path, port: u16) -> Result<Child, LocalServicesError> {
    let user = postgres_user()?;
    let data = root.join("postgres");
    let folder_error = |source| LocalServicesError::Folder {
        path: data.clone(),
        source,
    };
    give_to(root, &user)?;
    if !data.join("PG_VERSION").is_file() {
        fs::create_dir_all(&data).map_err(folder_error)?;
        give_to(&data, &user)?;
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args(["-D"])
            .arg(&data)
            .args(["-U", "composer", "-A", "trust", "-E", "UTF8"])
            .args(["--locale=C", "--no-sync"])
            .stdin(Stdio::null());
        as_user(&mut initdb, &user);
        let output = initdb
            .output()
            .await
            .map_err(|e| LocalServicesError::Failed {
                program: "initdb",
                detail: e.to_string(),
            })?;
        if !output.status.success() {
            return Err(LocalServicesError::Failed {
                program: "initdb",
                detail: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
    }
    let log_path = root.join("postgres.log");
    let log = fs::File::create(&log_path).map_err(folder_error)?;
    give_to(&log_path, &user)?;
    let log_err = log.try_clone().map_err(folder_error)?;
    let mut postgres = Command::new(bin.join("postgres"));
    postgres
        .arg("-D")
        .arg(&data)
        .args(["-p", &port.to_string()])
        .args(["-c", "listen_addresses=127.0.0.1"])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", data.display()))
        .args(["-c", "max_connections=300"])
        .args(["-c", "shared_buffers=256MB"])
        .args(["-c", "synchronous_commit=on"])
        // the settings docs/operations.md gives for production: a page's
        // first change after a checkpoint writes the whole page to the WAL,
        // and on a large history inserts land on old pages (decision 0053)
        .args(["-c", "wal_compression=lz4"])
        .args(["-c", "max_wal_size=4GB"])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        // own process group: a terminal's Ctrl-C reaches composer only,
        // which then stops the services in order
        .process_group(0)
        .kill_on_drop(true);
    as_user(&mut postgres, &user);
    postgres.spawn().map_err(|e| LocalServicesError::Failed {
        program: "postgres",
        detail: e.to_string(),
    })
}

fn start_redis(bin: &Path, root: &Path, port: u16) -> Result<Child, LocalServicesError> {
    let dir = root.join("redis");
    fs::create_dir_all(&dir).map_err(|source| LocalServicesError::Folder {
        path: dir.clone(),
        source,
    })?;
    Command::new(bin)
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(&dir)
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--databases", "256"])
        .arg("--logfile")
        .arg(root.join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| LocalServicesError::Failed {
            program: "redis-server",
            detail: e.to_string(),
        })
}

async fn wait_for_postgres(url: &str, root: &Path) -> Result<PgConnection, LocalServicesError> {
    let started = Instant::now();
    loop {
        match PgConnection::connect(url).await {
            Ok(connection) => return Ok(connection),
            Err(_) if started.elapsed() < START_TIMEOUT => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => {
                return Err(LocalServicesError::Failed {
                    program: "postgres",
                    detail: format!(
                        "did not answer within {START_TIMEOUT:?} ({error}); see {}",
                        root.join("postgres.log").display()
                    ),
                });
            }
        }
    }
}

async fn create_database_if_missing(
    admin: &mut PgConnection,
    name: &str,
) -> Result<(), LocalServicesError> {
    let failed = |e: sqlx::Error| LocalServicesError::Failed {
        program: "postgres",
        detail: e.to_string(),
    };
    // database_exists: true when `name` is already there (a kept --data folder)
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut *admin)
            .await
            .map_err(failed)?;
    if !exists {
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut *admin)
            .await
            .map_err(failed)?;
    }
    Ok(())
}

async fn wait_for_redis(port: u16, root: &Path) -> Result<(), LocalServicesError> {
    let started = Instant::now();
    loop {
        if redis_answers(port).await {
            return Ok(());
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(LocalServicesError::Failed {
                program: "redis-server",
                detail: format!(
                    "did not answer within {START_TIMEOUT:?}; see {}",
                    root.join("redis.log").display()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends an inline PING and expects `+PONG`.
async fn redis_answers(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    if stream.write_all(b"PING\r\n").await.is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).await.is_ok() && &reply == b"+PONG\r\n"
}

/// Asks a child to stop with `signal`, then kills it if it has not within 10 s.
async fn stop_child(mut child: Child, signal: Signal) {
    if let Some(pid) = child.id()
        && let Ok(pid) = i32::try_from(pid)
    {
        let _ = kill(Pid::from_raw(pid), signal);
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}
