//! The Redis side of dispatch. Redis only carries messages; Postgres stays
//! the truth, so anything lost here is found again by recovery.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::dispatch::redis_conn::{BrokerError, RedisClient, RedisConnection, RedisTarget};

/// A shared, self-reconnecting connection to Redis. Cheap to clone.
#[derive(Clone)]
pub struct Broker {
    connection: BrokerConnection,
}

#[derive(Clone)]
enum BrokerConnection {
    Single(ConnectionManager),
    /// A cluster connection finds nodes that come back by itself.
    Cluster(RedisConnection),
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").finish_non_exhaustive()
    }
}

impl Broker {
    /// Connects to Redis (or a Redis Cluster: see [`RedisTarget::parse`])
    /// and checks that it answers PING.
    pub async fn connect(url: &str, timeout: Duration) -> Result<Self, BrokerError> {
        let connection = match RedisTarget::parse(url)? {
            RedisTarget::Single(url) => {
                BrokerConnection::Single(connect_single(&url, timeout).await?)
            }
            cluster @ RedisTarget::Cluster(_) => BrokerConnection::Cluster(
                RedisClient::for_target(&cluster)?
                    .connect()
                    .await
                    .map_err(|e| BrokerError::Unreachable(e.to_string()))?,
            ),
        };
        let broker = Self { connection };
        broker.ping().await?;
        Ok(broker)
    }

    /// Checks that Redis answers PING now.
    pub async fn ping(&self) -> Result<(), BrokerError> {
        let ping = redis::cmd("PING");
        let answer = match self.connection.clone() {
            BrokerConnection::Single(mut connection) => {
                ping.query_async::<String>(&mut connection).await
            }
            BrokerConnection::Cluster(mut connection) => {
                ping.query_async::<String>(&mut connection).await
            }
        };
        answer
            .map(|_| ())
            .map_err(|e| BrokerError::Unreachable(e.to_string()))
    }
}

/// A self-reconnecting connection to one Redis.
async fn connect_single(url: &str, timeout: Duration) -> Result<ConnectionManager, BrokerError> {
    let client = redis::Client::open(url).map_err(|e| BrokerError::InvalidUrl(e.to_string()))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(2);
    ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| BrokerError::Unreachable(e.to_string()))
}
