//! Test support shared by the crates' integration tests. Tests run against
//! the real Postgres and Redis that the harness (`scripts/with-services.sh`,
//! used by `make test`) starts and names in `COMPOSER_TEST_DATABASE_URL` and
//! `COMPOSER_TEST_REDIS_URL`; every test gets a database of its own.

pub mod blob_place;
pub mod client;
pub mod moto;
pub mod redis_cluster;
pub mod worker;

use std::{
    path::Path,
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use sqlx::{Connection, PgConnection};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::watch,
};

const DATABASE_VAR: &str = "COMPOSER_TEST_DATABASE_URL";
const REDIS_VAR: &str = "COMPOSER_TEST_REDIS_URL";

fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run the tests through `make test` or \
             `scripts/with-services.sh cargo test`, which start Postgres and Redis"
        )
    })
}

/// Creates an empty database on the harness's Postgres and returns its URL.
pub async fn fresh_database() -> String {
    let admin_url = required_env(DATABASE_VAR);
    let name = format!("test_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&admin_url)
        .await
        .expect("connect to the harness Postgres");
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&mut admin)
        .await
        .expect("create a test database");
    let _ = admin.close().await;
    replace_path(&admin_url, &name)
}

/// A Redis URL on a database index of its own (the harness's Redis has 256),
/// so tests running at the same time do not see each other's streams.
pub fn fresh_redis_url() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = required_env(REDIS_VAR);
    let offset = std::process::id() % 128;
    let index = 1 + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % 255;
    replace_path(&base, &index.to_string())
}

fn replace_path(url: &str, path: &str) -> String {
    let without_query = url.split('?').next().unwrap_or(url);
    let authority_end = without_query
        .find("://")
        .map(|scheme| {
            without_query[scheme + 3..]
                .find('/')
                .map_or(without_query.len(), |p| scheme + 3 + p)
        })
        .unwrap_or(without_query.len());
    format!("{}/{path}", &without_query[..authority_end])
}

/// Where the harness wants test blobs kept: a folder of its own that it
/// removes when the tests end (`scripts/with-services.sh`).
pub const BLOB_ROOT_VAR: &str = "COMPOSER_TEST_BLOB_ROOT";

/// A temporary folder for the blobs of the database `database_url` names:
/// servers restarted on one database find their blobs again. Under the
/// harness's [`BLOB_ROOT_VAR`] when it names one, so that no run of the
/// tests leaves its blobs behind.
pub fn blob_folder(database_url: &str) -> String {
    let database = database_url
        .split('?')
        .next()
        .and_then(|url| url.rsplit('/').next())
        .unwrap_or("default");
    std::env::var_os(BLOB_ROOT_VAR)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("composer-test-blobs"))
        .join(database)
        .to_string_lossy()
        .into_owned()
}

/// The real `composer serve` as a child process on an ephemeral port.
pub struct ServerProcess {
    child: Child,
    /// `127.0.0.1:<port>` the server listens on.
    pub addr: String,
    stderr: Arc<Mutex<Vec<String>>>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl ServerProcess {
    /// Starts `binary serve` with a fresh database and Redis index, plus
    /// `extra_args`, and waits until it logs the address it listens on.
    pub async fn start(binary: &Path, extra_args: &[&str]) -> Self {
        let database_url = fresh_database().await;
        let redis_url = fresh_redis_url();
        Self::start_with(binary, &database_url, &redis_url, extra_args).await
    }

    /// Starts `binary serve` against the given backends.
    pub async fn start_with(
        binary: &Path,
        database_url: &str,
        redis_url: &str,
        extra_args: &[&str],
    ) -> Self {
        Self::start_on(binary, "127.0.0.1:0", database_url, redis_url, extra_args).await
    }

    /// Starts `binary serve` on `listen` against the given backends.
    pub async fn start_on(
        binary: &Path,
        listen: &str,
        database_url: &str,
        redis_url: &str,
        extra_args: &[&str],
    ) -> Self {
        // tests run without tokens unless they configure a key themselves
        let insecure = !extra_args.iter().any(|a| a.starts_with("--auth-"));
        // blobs in a temporary folder of the database's, unless the test names one
        let blob_store = (!extra_args.iter().any(|a| a.starts_with("--blob-store")))
            .then(|| blob_folder(database_url));
        let mut child = Command::new(binary)
            .arg("serve")
            .args(["--listen", listen, "--log-format", "json"])
            .args(["--database-url", database_url, "--redis-url", redis_url])
            .args(insecure.then_some("--insecure"))
            .args(
                blob_store
                    .iter()
                    .flat_map(|folder| ["--blob-store", folder.as_str()]),
            )
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn composer serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (addr_tx, mut addr_rx) = watch::channel(None::<String>);
        let collected = Arc::clone(&lines);
        let reader = tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Some(addr) = listening_addr(&line) {
                    let _ = addr_tx.send(Some(addr));
                }
                collected.lock().expect("stderr lines").push(line);
            }
        });
        let waited = tokio::time::timeout(
            Duration::from_secs(60),
            addr_rx.wait_for(|addr| addr.is_some()),
        )
        .await;
        let addr = match waited {
            Ok(Ok(addr)) => addr.clone().expect("address present"),
            _ => panic!(
                "composer serve did not start; stderr:\n{}",
                lines.lock().expect("stderr lines").join("\n")
            ),
        };
        Self {
            child,
            addr,
            stderr: lines,
            reader: Some(reader),
        }
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .expect("server still running")
    }

    /// Sends a signal to the server.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)
            .expect("signal the server");
    }

    /// Waits for the process to exit, at most `timeout`, then for its last
    /// stderr lines to be collected.
    pub async fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)?;
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        Some(status)
    }

    /// Every line the server wrote to stderr so far.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lock().expect("stderr lines").clone()
    }
}

fn listening_addr(line: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    if value.get("message")?.as_str()? != "listening" {
        return None;
    }
    Some(value.get("addr")?.as_str()?.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_path_swaps_the_database_and_drops_the_query() {
        assert_eq!(
            replace_path("postgres://u@127.0.0.1:5/composer?sslmode=disable", "x"),
            "postgres://u@127.0.0.1:5/x"
        );
        assert_eq!(
            replace_path("redis://127.0.0.1:6/0", "7"),
            "redis://127.0.0.1:6/7"
        );
        assert_eq!(
            replace_path("redis://127.0.0.1:6", "7"),
            "redis://127.0.0.1:6/7"
        );
    }
}
