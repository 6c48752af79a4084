//! Server configuration: every setting is a flag and a `COMPOSER_*`
//! environment variable, named after each other, so an error can name both.

use std::{net::SocketAddr, time::Duration};

use clap::{Args, ValueEnum};

/// How logs are written to standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (for machines and log pipelines).
    Json,
    /// Human-readable lines.
    Text,
}

/// Settings of a serving process (`composer serve`).
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Address to listen on for gRPC and grpc-web (port 0: any free port).
    #[arg(long, env = "COMPOSER_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,

    /// Size of the Postgres connection pool.
    #[arg(long, env = "COMPOSER_DATABASE_MAX_CONNECTIONS", default_value_t = 20)]
    pub database_max_connections: u32,

    /// Size of the second pool, kept for the recovery loops (due timers,
    /// expired leases, lost dispatches) so requests cannot starve them.
    #[arg(
        long,
        env = "COMPOSER_DATABASE_BACKGROUND_CONNECTIONS",
        default_value_t = 8
    )]
    pub database_background_connections: u32,

    /// How long to wait for Postgres and Redis at start, e.g. `10s`.
    #[arg(long, env = "COMPOSER_CONNECT_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub connect_timeout: Duration,

    /// After start, the longest a call waits on Postgres (a pooled
    /// connection, a statement, the whole call) before it is UNAVAILABLE.
    #[arg(long, env = "COMPOSER_DB_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub db_timeout: Duration,

    /// Browser origins allowed to call over grpc-web, comma-separated. The
    /// dashboard served on this port calls from this server's own origin
    /// (e.g. `https://composer.example.com`): list it here.
    #[arg(long, env = "COMPOSER_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// Serve the browser dashboard from this folder (read at each request)
    /// instead of the files built into the binary: for dashboard
    /// development (`dashboard/dist` after `npm run build`) and tests.
    /// Without it, a release binary serves the dashboard it embedded and a
    /// debug binary reads the repository's `dashboard/dist`.
    #[arg(long, env = "COMPOSER_DASHBOARD_DIR")]
    pub dashboard_dir: Option<std::path::PathBuf>,

    /// After SIGTERM, keep answering (health NOT_SERVING) this long, e.g. `1s`.
    #[arg(long, env = "COMPOSER_DRAIN_DELAY", default_value = "1s", value_parser = parse_duration)]
    pub drain_delay: Duration,

    /// After SIGTERM, exit anyway once this much time has passed, e.g. `30s`.
    #[arg(long, env = "COMPOSER_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,

    /// How often health re-checks Postgres and Redis, e.g. `5s`.
    #[arg(long, env = "COMPOSER_HEALTH_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub health_interval: Duration,

    /// Largest input, output or event payload, in bytes of JSON, inline or
    /// in the blob store.
    #[arg(long, env = "COMPOSER_MAX_PAYLOAD_BYTES", default_value_t = 1024 * 1024 * 1024)]
    pub max_payload_bytes: usize,

    /// Largest request message decoded: a larger payload must come through
    /// BlobService (the SDKs do so by themselves).
    #[arg(long, env = "COMPOSER_MAX_MESSAGE_BYTES", default_value_t = 4 * 1024 * 1024,
          value_parser = parse_message_bytes)]
    pub max_message_bytes: usize,

    /// Where large payloads are kept (docs/payloads.md): a folder, or an
    /// `s3://bucket/prefix` (`gs://`, `az://`) URL configured by the
    /// provider's environment variables and `--blob-store-option`. Unset: a
    /// folder per database under `$XDG_DATA_HOME/composer/blobs` (or
    /// `~/.local/share/composer/blobs`).
    #[arg(long, env = "COMPOSER_BLOB_STORE")]
    pub blob_store: Option<String>,

    /// A setting of the blob store, `key=value` (object_store's names:
    /// `aws_endpoint`, `aws_region`, `aws_allow_http`, ...); repeat for more.
    #[arg(long = "blob-store-option", env = "COMPOSER_BLOB_STORE_OPTIONS", value_delimiter = ',',
          value_parser = parse_key_value)]
    pub blob_store_options: Vec<(String, String)>,

    /// How long the presigned URLs BlobService gives work, in seconds, when
    /// the blob store signs them (S3, GCS, Azure; a folder does not): SDKs
    /// then move large payloads straight to and from the store. 0: none is
    /// given, every byte goes through the server.
    #[arg(long, env = "COMPOSER_BLOB_URL_SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(0..=7 * 24 * 3600))]
    pub blob_url_secs: u64,

    /// A value whose JSON is longer than this many bytes goes to the blob
    /// store and runs carry a reference to it; 0: every value stays inline.
    #[arg(long, env = "COMPOSER_PAYLOAD_OFFLOAD_BYTES", default_value_t = 64 * 1024)]
    pub payload_offload_bytes: usize,

    /// The most of a blob an expression reads (a larger one reads as null).
    #[arg(long, env = "COMPOSER_MAX_EXPRESSION_BLOB_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_expression_blob_bytes: u64,

    /// Most runs one root run's tree may hold (sub-workflows and MAPs of
    /// workflows, at every level); past it the node starting a child fails.
    #[arg(long, env = "COMPOSER_MAX_RUNS_PER_TREE", default_value_t = 100_000,
          value_parser = clap::value_parser!(i32).range(2..))]
    pub max_runs_per_tree: i32,

    /// Serve Prometheus metrics at /metrics, and /healthz and /readyz, on
    /// this address (off when unset), e.g. `127.0.0.1:9090`.
    #[arg(long, env = "COMPOSER_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,

    /// Label metrics with the namespaces, workflows and queues they count;
    /// `false`: those labels all read `_all`, so /metrics names no tenant
    /// (it needs no token: SECURITY.md).
    #[arg(long, env = "COMPOSER_METRICS_TENANT_LABELS", default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics_tenant_labels: bool,

    /// Export traces over OTLP/HTTP to this collector (its base URL, as
    /// OTEL_EXPORTER_OTLP_ENDPOINT: `/v1/traces` is appended), e.g.
    /// `http://otel-collector:4318`. Off when unset: no span is made.
    #[arg(long, env = "COMPOSER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// The share of runs whose traces are kept (0 to 1), unless the caller's
    /// traceparent already decided.
    #[arg(long, env = "COMPOSER_OTLP_SAMPLE_RATIO", default_value_t = 1.0, value_parser = parse_ratio)]
    pub otlp_sample_ratio: f64,

    /// How long a lease lasts until the worker's first heartbeat, for
    /// workers that confirm receipt (the SDKs): a poll answer that never
    /// arrives offers the task again this soon, e.g. `5s`.
    #[arg(long, env = "COMPOSER_LEASE_RECEIPT_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub lease_receipt_timeout: Duration,

    /// A queue no poll has waited on for this long is forgotten by the
    /// server, and its Redis streams deleted if empty, e.g. `60s`.
    #[arg(long, env = "COMPOSER_QUEUE_IDLE", default_value = "60s", value_parser = parse_duration)]
    pub queue_idle: Duration,

    /// Streams per queue in Redis (a run's tasks go to one of them).
    #[arg(long, env = "COMPOSER_STREAM_SHARDS", default_value_t = 4)]
    pub stream_shards: u32,

    /// A task dispatched but not leased after this long is republished, e.g. `15s`.
    #[arg(long, env = "COMPOSER_LOST_DISPATCH_GRACE", default_value = "15s", value_parser = parse_duration)]
    pub lost_dispatch_grace: Duration,

    /// How long StartRuns and worker reports that arrive while another
    /// group is being applied gather into one transaction, e.g. `1ms`;
    /// `0` applies each in its own (docs/decisions/0023-group-commit.md).
    #[arg(long, env = "COMPOSER_GROUP_COMMIT_WINDOW", default_value = "1ms", value_parser = parse_duration)]
    pub group_commit_window: Duration,

    /// Most StartRuns and runs' report batches in one group transaction.
    #[arg(long, env = "COMPOSER_GROUP_COMMIT_MAX", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub group_commit_max: u16,

    /// Group transactions one server applies at once.
    #[arg(long, env = "COMPOSER_GROUP_COMMIT_IN_FLIGHT", default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=16))]
    pub group_commit_in_flight: u8,

    /// Lease a report's next task to a poll waiting in this server on its
    /// queue, in the report's own transaction, instead of sending it
    /// through Redis (docs/decisions/0034-direct-hand-off.md); `false`
    /// sends every task through Redis.
    #[arg(long, env = "COMPOSER_HAND_OFF", default_value_t = true, action = clap::ArgAction::Set)]
    pub hand_off: bool,

    /// Runs a bulk operation reads per page; each run is still its own
    /// transaction (docs/decisions/0019-bulk-operations.md).
    #[arg(long, env = "COMPOSER_BULK_BATCH_SIZE", default_value_t = 20, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub bulk_batch_size: i64,

    /// The pause of a bulk operation between pages, so live traffic keeps
    /// its latency, e.g. `50ms`.
    #[arg(long, env = "COMPOSER_BULK_BATCH_PAUSE", default_value = "100ms", value_parser = parse_duration)]
    pub bulk_batch_pause: Duration,

    /// How long a server's claim on a bulk operation lasts without progress
    /// before another server takes it over, e.g. `10s`.
    #[arg(long, env = "COMPOSER_BULK_LEASE", default_value = "10s", value_parser = parse_duration)]
    pub bulk_lease: Duration,

    /// Finished runs and their history are deleted after this long, e.g. `720h` (30 days).
    #[arg(long, env = "COMPOSER_RETENTION", default_value = "720h", value_parser = parse_duration)]
    pub retention: Duration,

    /// Let HTTP nodes call private networks (10/8, 172.16/12, 192.168/16, ...).
    #[arg(long, env = "COMPOSER_HTTP_ALLOW_PRIVATE")]
    pub http_allow_private: bool,

    /// Let HTTP nodes call loopback addresses (127/8, ::1).
    #[arg(long, env = "COMPOSER_HTTP_ALLOW_LOOPBACK")]
    pub http_allow_loopback: bool,

    /// HTTP node requests in flight at once in this server.
    #[arg(long, env = "COMPOSER_HTTP_CONCURRENCY", default_value_t = 64)]
    pub http_concurrency: usize,

    /// CPU-heavy checks of requests (compiling a definition, searching a
    /// cron spec, an input schema with regular expressions) run at once on
    /// their own threads, one namespace on at most half of them; 0: one per
    /// core (docs/decisions/0036-cpu-work-off-the-request-threads.md).
    #[arg(long, env = "COMPOSER_CPU_POOL_THREADS", default_value_t = 0)]
    pub cpu_pool_threads: usize,

    /// Such checks one namespace may have waiting (all namespaces: eight
    /// times this); past it a request is RESOURCE_EXHAUSTED.
    #[arg(long, env = "COMPOSER_CPU_POOL_QUEUE", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub cpu_pool_queue: u16,

    /// The nice value of those threads (0 to 19): higher, and a busy
    /// machine serves calls first and runs such checks with what is left.
    #[arg(long, env = "COMPOSER_CPU_POOL_NICE", default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=19))]
    pub cpu_pool_nice: u8,

    /// A YAML file of per-namespace quotas: `defaults` and
    /// `namespaces.<name>`, each a map of quota names to values
    /// (docs/operations.md, Quotas). Read again on SIGHUP and whenever it
    /// changes; unset: the built-in defaults for every namespace.
    #[arg(long, env = "COMPOSER_QUOTAS_FILE")]
    pub quotas_file: Option<std::path::PathBuf>,

    /// A file holding a key-encryption key of the secret store (64
    /// hexadecimal digits; `composer secret new-key` makes one). Repeat (or
    /// separate with commas) to give several: the first wraps new data keys
    /// and `rewrap` moves every namespace to it, all of them unwrap. Unset:
    /// the server serves everything but secrets (docs/secrets.md).
    #[arg(
        long = "secrets-key-file",
        env = "COMPOSER_SECRETS_KEY_FILE",
        value_delimiter = ','
    )]
    pub secrets_key_files: Vec<std::path::PathBuf>,

    #[command(flatten)]
    pub auth: AuthArgs,

    /// Log format on standard error.
    #[arg(long, env = "COMPOSER_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,

    /// Log filter, in `tracing` env-filter syntax.
    #[arg(long, env = "COMPOSER_LOG", default_value = "info")]
    pub log: String,
}

/// Where the backends are (`composer serve`, `composer migrate`).
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// Postgres URL, e.g. `postgres://user:password@127.0.0.1:5432/composer`.
    #[arg(long, env = "COMPOSER_DATABASE_URL")]
    pub database_url: String,

    /// Redis URL, e.g. `redis://127.0.0.1:6379/0`; a Redis Cluster as
    /// `redis+cluster://host:port,host:port` or comma-separated `redis://`
    /// URLs of some of its nodes.
    #[arg(long, env = "COMPOSER_REDIS_URL")]
    pub redis_url: String,
}

/// Parses `500ms`, `10s`, `5m`, `2h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like 500ms, 10s, 5m or 2h"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("`{text}` has an unknown unit (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("`{text}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_every_unit_and_refuse_garbage() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[derive(clap::Parser)]
    struct Server {
        #[command(flatten)]
        args: ServerArgs,
    }

    fn hand_off(args: &[&str]) -> bool {
        use clap::Parser;
        Server::parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .args
            .hand_off
    }

    #[test]
    fn the_direct_hand_off_is_on_unless_turned_off() {
        assert!(hand_off(&[]));
        assert!(hand_off(&["--hand-off", "true"]));
        assert!(!hand_off(&["--hand-off", "false"]));
    }
}

/// How callers are authenticated (`composer serve` refuses to start with
/// none of these unless `--insecure` is given).
#[derive(Debug, Clone, Default, Args)]
pub struct AuthArgs {
    /// Run without authentication: every call acts as an admin of the
    /// `default` namespace. For local experiments only.
    #[arg(long, env = "COMPOSER_INSECURE")]
    pub insecure: bool,

    /// HS256 shared secret (at least 32 bytes) that tokens are signed with.
    #[arg(long, env = "COMPOSER_AUTH_SECRET", hide_env_values = true)]
    pub auth_secret: Option<String>,

    /// RS256 or EdDSA public key (PEM) that tokens are signed for; repeatable.
    #[arg(long, env = "COMPOSER_AUTH_PUBLIC_KEY", value_delimiter = ',')]
    pub auth_public_key: Vec<std::path::PathBuf>,

    /// A JWKS file of public keys (each with `kid` and `alg`).
    #[arg(long, env = "COMPOSER_AUTH_JWKS")]
    pub auth_jwks: Option<std::path::PathBuf>,

    /// Required `iss` claim.
    #[arg(long, env = "COMPOSER_AUTH_ISSUER")]
    pub auth_issuer: Option<String>,

    /// Required `aud` claim.
    #[arg(long, env = "COMPOSER_AUTH_AUDIENCE")]
    pub auth_audience: Option<String>,

    /// Clock leeway for `exp` and `nbf`, e.g. `30s`.
    #[arg(long, env = "COMPOSER_AUTH_LEEWAY", default_value = "30s", value_parser = parse_duration)]
    pub auth_leeway: Duration,
}

/// `--max-message-bytes`: at least 64 KiB, so every other request fits.
fn parse_message_bytes(text: &str) -> Result<usize, String> {
    let bytes: usize = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    if bytes < 65_536 {
        return Err(format!("{bytes} is under 65536"));
    }
    Ok(bytes)
}

/// `key=value`, as `--blob-store-option` takes it.
fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_ascii_lowercase(), value.to_owned()))
        }
        _ => Err(format!("{text:?} is not key=value")),
    }
}

fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(format!("{text:?} is not a ratio from 0 to 1")),
    }
}
