//! The Postgres repository: the one place where SQL lives. Postgres is the
//! truth of every run; everything else (Redis, caches) can be rebuilt from it.

pub mod blobs;
pub mod bulk;
pub mod concurrency;
pub mod events;
pub mod group_write;
pub mod history_rows;
pub mod migrate;
pub mod pause;
pub mod rate_limits;
pub mod runs;
pub mod schedules;
pub mod secrets;
pub mod tasks;
pub mod timers;
pub mod workflows;

use std::time::Duration;

use sqlx::{
    Connection,
    postgres::{PgConnectOptions, PgPool, PgPoolOptions},
};

/// The migrations in `migrations/`, embedded at compile time and applied by
/// the server at start (forward-only, each once).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// Errors of the store, by meaning rather than by driver text.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL could not be parsed.
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    /// Postgres did not answer.
    #[error("cannot reach Postgres: {0}")]
    Unreachable(String),
    /// A migration failed to apply.
    #[error("migration failed: {0}")]
    Migration(String),
    /// A statement did not end within its time (the `query_timeout`).
    #[error("the database did not answer in time")]
    TimedOut,
    /// Any other database failure.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A history row could not be read back into events.
    #[error(transparent)]
    History(#[from] history_rows::RowError),
}

impl StoreError {
    /// True when the database was too slow rather than wrong: no pooled
    /// connection in time, or a statement cancelled by `statement_timeout`.
    pub fn is_timeout(&self) -> bool {
        match self {
            Self::TimedOut | Self::Database(sqlx::Error::PoolTimedOut) => true,
            Self::Database(sqlx::Error::Database(db)) => db.code().as_deref() == Some("57014"),
            _ => false,
        }
    }

    /// Whether a foreign key refused the statement (a row it needs is
    /// gone, or one it deletes is still referred to).
    pub fn is_foreign_key_violation(&self) -> bool {
        matches!(self, Self::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23503"))
    }
}

/// A pooled connection idle for longer than this is pinged before it is
/// handed out (see [`Store::pool_options`]).
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// How to connect to Postgres.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `postgres://user:password@host:port/database`.
    pub database_url: String,
    /// Size of the connection pool.
    pub max_connections: u32,
    /// How long to wait for a first connection before giving up.
    pub connect_timeout: Duration,
    /// After start, the longest any one statement runs and any one caller
    /// waits for a pooled connection: a stopped or frozen database becomes
    /// an error in bounded time instead of a hang.
    pub query_timeout: Duration,
}

/// A handle on the database: a connection pool. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
}

impl Store {
    /// Connects to Postgres and checks that it answers.
    pub async fn connect(config: &StoreConfig) -> Result<Self, StoreError> {
        let store = Self::connect_lazy(config)?;
        let deadline = tokio::time::Instant::now() + config.connect_timeout;
        loop {
            match store.pool.acquire().await {
                Ok(_) => return Ok(store),
                Err(error) if tokio::time::Instant::now() >= deadline => {
                    return Err(StoreError::Unreachable(error.to_string()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// A pool that connects when first used (a second pool of a server
    /// whose first one already proved the database answers).
    pub fn connect_lazy(config: &StoreConfig) -> Result<Self, StoreError> {
        let pool = Self::pool_options(config).connect_lazy_with(Self::connect_options(config)?);
        Ok(Self { pool })
    }

    fn pool_options(config: &StoreConfig) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(config.query_timeout)
            // sqlx pings every connection it hands out, a round trip before
            // each event and lease. It pings each one it takes back too, so
            // a connection idle for less than a second answered a second
            // ago; only one idle for longer may have been dropped since (a
            // restart, a failover, a proxy's idle timeout), so only that
            // one is pinged, and replaced if it does not answer.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for < PING_IF_IDLE_FOR {
                        return Ok(true);
                    }
                    Ok(conn.ping().await.is_ok())
                })
            })
    }

    fn connect_options(config: &StoreConfig) -> Result<PgConnectOptions, StoreError> {
        let options: PgConnectOptions = config
            .database_url
            .parse()
            .map_err(|e: sqlx::Error| StoreError::InvalidUrl(e.to_string()))?;
        // Every statement of ours is a key lookup, or (ListRuns) built with
        // only the filters given, so its generic plan is the right one. With
        // array parameters the default `auto` mode judges each custom plan
        // cheaper and plans again at every execution: under load that was a
        // fifth of Postgres' time (BENCHMARKS.md, decision 0009).
        //
        // A generic plan is made at a statement's first execution on each
        // connection and kept until the table's statistics change, at most
        // about once a minute: made while `tasks` held a few hundred rows,
        // it scanned the table, and kept scanning it for every lease and
        // event as a MAP of 100,000 filled it (23 million rows read in a
        // 30-second B3, decision 0055). No statement of ours wants a scan
        // where an index serves it, so none is planned while one does.
        let statement_timeout = format!("{}ms", config.query_timeout.as_millis().max(1));
        Ok(options.application_name("composer").options([
            ("plan_cache_mode", "force_generic_plan"),
            ("enable_seqscan", "off"),
            ("statement_timeout", statement_timeout.as_str()),
        ]))
    }

    /// Wraps an existing pool (tests).
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The underlying pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies every migration not applied yet. Running it again is a no-op.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        // a migration (an index on a large table) may take longer than any
        // request's statement should
        sqlx::query("SET statement_timeout = 0")
            .execute(&mut *conn)
            .await?;
        let migrated = MIGRATOR
            .run(&mut *conn)
            .await
            .map_err(|e| StoreError::Migration(e.to_string()));
        sqlx::query("RESET statement_timeout")
            .execute(&mut *conn)
            .await?;
        migrated
    }

    /// Checks that Postgres answers a trivial query.
    pub async fn ping(&self) -> Result<(), StoreError> {
        // ping: proves a pooled connection can run a statement now
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Starts a transaction.
    pub async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    /// Creates the history partitions for today and the next `days` days.
    pub async fn ensure_history_partitions(&self, days: i32) -> Result<i32, StoreError> {
        // ensure_history_partitions: idempotent, safe from many servers
        Ok(
            sqlx::query_scalar("SELECT composer_ensure_history_partitions($1)")
                .bind(days)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Closes the pool, waiting for connections in use to be returned.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// How much is waiting: for the metrics gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Backlog {
    /// Outbox rows not yet sent to Redis.
    pub outbox_rows: i64,
    /// Seconds since the oldest of them was written (0 when none).
    pub outbox_oldest_secs: f64,
    /// Timers past their time, counted up to 100,000.
    pub timers_due: i64,
    /// Seconds the most overdue timer is late (0 when none).
    pub timer_lag_secs: f64,
}

impl Store {
    /// The backlog now, in one statement (index range scans, bounded).
    pub async fn backlog(&self) -> Result<Backlog, StoreError> {
        // backlog: served by the outbox primary key and timers_due
        let row: (i64, f64, i64, f64) = sqlx::query_as(
            "SELECT \
               (SELECT count(*) FROM (SELECT 1 FROM outbox LIMIT 100000) o), \
               COALESCE(EXTRACT(EPOCH FROM now() - (SELECT min(created_at) FROM outbox))::float8, 0), \
               (SELECT count(*) FROM (SELECT 1 FROM timers WHERE fire_at <= now() LIMIT 100000) t), \
               COALESCE(EXTRACT(EPOCH FROM now() - (SELECT min(fire_at) FROM timers \
                 WHERE fire_at <= now()))::float8, 0)",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Backlog {
            outbox_rows: row.0,
            outbox_oldest_secs: row.1.max(0.0),
            timers_due: row.2,
            timer_lag_secs: row.3.max(0.0),
        })
    }
}
