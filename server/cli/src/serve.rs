//! `composer serve`: connect, migrate, serve until a signal, drain, exit.

use std::{future::Future, net::SocketAddr};

use composer_coordinator::{Backends, Broker, BrokerError};
use composer_grpc::{GrpcConfig, ServeError};
use composer_store::{Store, StoreConfig, StoreError};
use tokio::{net::TcpListener, sync::watch};

use crate::config::{BackendArgs, ServerArgs};

/// Why the server could not start or stop cleanly. Each names the setting
/// to look at, so the one line printed is enough to fix it.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Postgres URL invalid or Postgres unreachable.
    #[error("COMPOSER_DATABASE_URL (--database-url): {0}")]
    Database(StoreError),
    /// Redis URL invalid or Redis unreachable.
    #[error("COMPOSER_REDIS_URL (--redis-url): {0}")]
    Redis(BrokerError),
    /// The migrations did not apply.
    #[error("applying migrations: {0}")]
    Migrate(StoreError),
    /// The listen address could not be bound.
    #[error("COMPOSER_LISTEN (--listen) {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving: {0}")]
    Serve(#[from] ServeError),
    /// Draining took longer than the shutdown timeout.
    #[error("did not stop within COMPOSER_SHUTDOWN_TIMEOUT (--shutdown-timeout) {0:?}")]
    ShutdownTimeout(std::time::Duration),
}

/// Connects to Postgres and applies the migrations.
pub async fn migrate(backend: &BackendArgs, server: &ServerArgs) -> Result<Store, StartError> {
    let store = Store::connect(&StoreConfig {
        database_url: backend.database_url.clone(),
        max_connections: server.database_max_connections,
        connect_timeout: server.connect_timeout,
    })
    .await
    .map_err(StartError::Database)?;
    store.migrate().await.map_err(StartError::Migrate)?;
    Ok(store)
}

/// Connects to Postgres and Redis, and applies the migrations.
pub async fn connect_backends(
    backend: &BackendArgs,
    server: &ServerArgs,
) -> Result<Backends, StartError> {
    let store = migrate(backend, server).await?;
    let broker = Broker::connect(&backend.redis_url, server.connect_timeout)
        .await
        .map_err(StartError::Redis)?;
    Ok(Backends { store, broker })
}

/// Binds the listen address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen { addr, source })
}

/// Serves on `listener` until `shutdown` resolves, then drains and stops,
/// giving up after the shutdown timeout.
pub async fn run(
    server: &ServerArgs,
    backends: Backends,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let config = GrpcConfig {
        cors_allowed_origins: server.cors_origins.clone(),
        drain_delay: server.drain_delay,
        health_check_interval: server.health_interval,
    };
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let mut deadline_rx = stop_tx.subscribe();
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "listening");
    }
    let serving = composer_grpc::serve(config, backends.clone(), listener, stopped);
    let timeout = server.shutdown_timeout + server.drain_delay;
    let deadline = async move {
        let _ = deadline_rx.wait_for(|stop| *stop).await;
        tokio::time::sleep(timeout).await;
    };
    tokio::select! {
        result = serving => result?,
        () = deadline => return Err(StartError::ShutdownTimeout(timeout)),
    }
    backends.store.close().await;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves at the first SIGTERM or SIGINT. A second one exits the process at
/// once, for an operator who does not want to wait for the drain.
pub async fn shutdown_signal() {
    wait_for_signal().await;
    tracing::info!("shutdown requested; a second signal exits at once");
    tokio::spawn(async {
        wait_for_signal().await;
        tracing::warn!("second signal: exiting now");
        std::process::exit(130);
    });
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut terminate) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}
