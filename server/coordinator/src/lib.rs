//! The coordinator: applies each event in one Postgres transaction (lock →
//! decide → persist → commit) and moves dispatch through Redis Streams.

pub mod broker;

pub use broker::{Broker, BrokerError};

use composer_store::Store;

/// The backends every server needs: Postgres (the truth) and Redis (dispatch).
#[derive(Debug, Clone)]
pub struct Backends {
    /// Postgres.
    pub store: Store,
    /// Redis.
    pub broker: Broker,
}

/// Why a readiness check failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadinessError {
    /// Postgres did not answer.
    #[error("postgres: {0}")]
    Postgres(#[from] composer_store::StoreError),
    /// Redis did not answer.
    #[error("redis: {0}")]
    Redis(#[from] BrokerError),
}

impl Backends {
    /// Checks that Postgres and Redis both answer now.
    pub async fn check_ready(&self) -> Result<(), ReadinessError> {
        self.store.ping().await?;
        self.broker.ping().await?;
        Ok(())
    }
}
