//! The Redis side of dispatch. Redis only carries messages; Postgres stays
//! the truth, so anything lost here is found again by recovery.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Errors talking to Redis.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The Redis URL could not be parsed.
    #[error("invalid Redis URL: {0}")]
    InvalidUrl(String),
    /// Redis did not answer.
    #[error("cannot reach Redis: {0}")]
    Unreachable(String),
}

/// A shared, self-reconnecting connection to Redis. Cheap to clone.
#[derive(Clone)]
pub struct Broker {
    connection: ConnectionManager,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").finish_non_exhaustive()
    }
}

impl Broker {
    /// Connects to Redis and checks that it answers PING.
    pub async fn connect(url: &str, timeout: Duration) -> Result<Self, BrokerError> {
        let client =
            redis::Client::open(url).map_err(|e| BrokerError::InvalidUrl(e.to_string()))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2);
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| BrokerError::Unreachable(e.to_string()))?;
        let broker = Self { connection };
        broker.ping().await?;
        Ok(broker)
    }

    /// Checks that Redis answers PING now.
    pub async fn ping(&self) -> Result<(), BrokerError> {
        let mut connection = self.connection.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
            .map(|_| ())
            .map_err(|e| BrokerError::Unreachable(e.to_string()))
    }
}
