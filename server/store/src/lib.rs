//! The Postgres repository: the one place where SQL lives. Postgres is the
//! truth of every run; everything else (Redis, caches) can be rebuilt from it.

pub mod events;
pub mod runs;
pub mod tasks;
pub mod timers;
pub mod workflows;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

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
    /// Any other database failure.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// How to connect to Postgres.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `postgres://user:password@host:port/database`.
    pub database_url: String,
    /// Size of the connection pool.
    pub max_connections: u32,
    /// How long to wait for a first connection before giving up.
    pub connect_timeout: Duration,
}

/// A handle on the database: a connection pool. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
}

impl Store {
    /// Connects to Postgres and checks that it answers.
    pub async fn connect(config: &StoreConfig) -> Result<Self, StoreError> {
        let pool = Self::pool_options(config)
            .connect_with(Self::connect_options(config)?)
            .await
            .map_err(|e| StoreError::Unreachable(e.to_string()))?;
        Ok(Self { pool })
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
            .acquire_timeout(config.connect_timeout)
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
        Ok(options
            .application_name("composer")
            .options([("plan_cache_mode", "force_generic_plan")]))
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
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))
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
