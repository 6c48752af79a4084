//! `composer serve`: connect, migrate, serve until a signal, drain, exit.

use std::{future::Future, net::SocketAddr, sync::Arc};

use composer_coordinator::secrets::KeyRing;
use composer_coordinator::{
    Backends, Broker, BrokerError, Coordinator, CoordinatorConfig,
    dispatch::redis_conn::RedisTarget,
    dispatch::{
        poll_hub::PollHub,
        streams::{self, DispatchConfig, Publisher},
    },
    events::bulk::BulkConfig,
    events::watch::{ChangeFeed, RunChanges},
    http::worker::{HttpWorkerConfig, run_http_worker},
    http::{HttpExecutor, HttpExecutorConfig},
    time::recovery::RecoveryConfig,
    time::schedules::SchedulerConfig,
};
use composer_grpc::{GrpcConfig, ServeError, Services, dashboard::DashboardFiles};
use composer_store::{Store, StoreConfig, StoreError};
use tokio::{net::TcpListener, sync::watch, task::JoinSet};

use crate::config::{BackendArgs, ServerArgs};

/// The least statement timeout of the recovery loops' pool.
const BACKGROUND_QUERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

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
    /// The poll hub could not be built.
    #[error("COMPOSER_REDIS_URL (--redis-url): {0}")]
    Hub(composer_coordinator::CoordinatorError),
    /// Authentication is not configured or its keys are unusable.
    #[error(transparent)]
    Auth(crate::auth::AuthSetupError),
    /// The HTTP client could not be built.
    #[error("http worker: {0}")]
    Http(String),
    /// The metrics port could not start.
    #[error(transparent)]
    Metrics(#[from] crate::metrics_server::MetricsError),
    /// Draining took longer than the shutdown timeout.
    #[error("did not stop within COMPOSER_SHUTDOWN_TIMEOUT (--shutdown-timeout) {0:?}")]
    ShutdownTimeout(std::time::Duration),
    /// The quotas file could not be read or is invalid.
    #[error("COMPOSER_QUOTAS_FILE (--quotas-file) {0}")]
    Quotas(String),
    /// The blob store could not be opened.
    #[error("COMPOSER_BLOB_STORE (--blob-store) {0}")]
    BlobStore(String),
    /// A secrets key file could not be read or is not a key.
    #[error("COMPOSER_SECRETS_KEY_FILE (--secrets-key-file) {0}")]
    SecretsKey(#[from] composer_coordinator::secrets::KeyError),
}

/// Connects to Postgres and applies the migrations.
pub async fn migrate(backend: &BackendArgs, server: &ServerArgs) -> Result<Store, StartError> {
    let store = Store::connect(&StoreConfig {
        database_url: backend.database_url.clone(),
        max_connections: server.database_max_connections,
        connect_timeout: server.connect_timeout,
        query_timeout: server.db_timeout,
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
    // a malformed Redis URL is reported before anything connects
    RedisTarget::parse(&backend.redis_url).map_err(StartError::Redis)?;
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
/// giving up after the shutdown timeout. Starts this server's share of the
/// background work: the outbox enqueuer, the recovery loops, the run-change
/// listener.
pub async fn run(
    server: &ServerArgs,
    backend: &BackendArgs,
    backends: Backends,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let auth = crate::auth::auth_mode(&server.auth).map_err(StartError::Auth)?;
    if matches!(auth, composer_grpc::auth::AuthMode::Insecure) {
        tracing::warn!(
            "running with --insecure: every caller is an admin of the default namespace"
        );
    }
    let config = GrpcConfig {
        cors_allowed_origins: server.cors_origins.clone(),
        drain_delay: server.drain_delay,
        health_check_interval: server.health_interval,
        auth,
        max_message_bytes: server.max_message_bytes,
        call_timeout: server.db_timeout,
        readiness: composer_grpc::Readiness::default(),
        dashboard: match &server.dashboard_dir {
            Some(dir) => DashboardFiles::Directory(dir.clone()),
            None => DashboardFiles::for_this_build(),
        },
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut deadline_rx = stop_tx.subscribe();
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let (services, background, loops) = start_background(server, backend, &backends, &stop_rx)?;
    let hub = std::sync::Arc::clone(&services.hub);
    composer_coordinator::observe::metrics::set_tenant_labels(server.metrics_tenant_labels);
    if let Some(addr) = server.metrics_listen {
        let pools = vec![
            ("requests", backends.store.clone()),
            ("background", background),
        ];
        crate::metrics_server::start(addr, config.readiness.clone(), pools, stop_rx.clone())
            .await?;
    }
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "listening");
    }
    let serving = composer_grpc::serve(config, backends.clone(), services, listener, stop_rx);
    let timeout = server.shutdown_timeout + server.drain_delay;
    let deadline = async move {
        let _ = deadline_rx.wait_for(|stop| *stop).await;
        tokio::time::sleep(timeout).await;
    };
    tokio::select! {
        result = serving => result?,
        () = deadline => return Err(StartError::ShutdownTimeout(timeout)),
    }
    wind_down(loops, &hub).await;
    backends.store.close().await;
    tracing::info!("stopped");
    Ok(())
}

/// The CPU pool's settings: `--cpu-pool-threads 0` is one per core.
fn cpu_pool_config(server: &ServerArgs) -> composer_coordinator::limits::cpu_pool::CpuPoolConfig {
    let default = composer_coordinator::limits::cpu_pool::CpuPoolConfig::default();
    composer_coordinator::limits::cpu_pool::CpuPoolConfig {
        threads: match server.cpu_pool_threads {
            0 => default.threads,
            threads => threads,
        },
        queue_per_namespace: usize::from(server.cpu_pool_queue),
        nice: i32::from(server.cpu_pool_nice),
        // refused while the call still has time to say so, and a check
        // that got its thread has most of the call's time to run
        max_wait: server.db_timeout / 4,
    }
}

fn start_background(
    server: &ServerArgs,
    backend: &BackendArgs,
    backends: &Backends,
    stop: &watch::Receiver<bool>,
) -> Result<(Services, Store, JoinSet<()>), StartError> {
    let store = backends.store.clone();
    let (publisher, deleter) =
        Publisher::new(store.clone(), &backend.redis_url, server.stream_shards)
            .map_err(StartError::Hub)?;
    tokio::spawn(deleter);
    let (feed, announcer) = ChangeFeed::new(&backend.redis_url).map_err(|e| {
        StartError::Hub(composer_coordinator::CoordinatorError::Redis(format!(
            "url: {e}"
        )))
    })?;
    tokio::spawn(announcer);
    let quotas = crate::quotas::start(server.quotas_file.as_deref(), stop.clone())
        .map_err(StartError::Quotas)?;
    let dispatch_config = DispatchConfig {
        shards: server.stream_shards,
        lease_timeout: server.db_timeout,
        reader_idle: server.queue_idle,
        receipt_timeout: server.lease_receipt_timeout,
        quotas: Arc::clone(&quotas),
        ..DispatchConfig::default()
    };
    let hub = PollHub::new(store.clone(), &backend.redis_url, dispatch_config.clone())
        .map_err(StartError::Hub)?;
    let mut coordinator = Coordinator::new(
        store.clone(),
        CoordinatorConfig {
            max_payload_bytes: server.max_payload_bytes,
            payload_offload_bytes: server.payload_offload_bytes,
            max_expression_blob_bytes: server.max_expression_blob_bytes,
            max_runs_per_tree: server.max_runs_per_tree,
            group_commit_window: server.group_commit_window,
            group_commit_max: usize::from(server.group_commit_max),
            group_commit_in_flight: usize::from(server.group_commit_in_flight),
            quotas,
            cpu_pool: cpu_pool_config(server),
            ..CoordinatorConfig::default()
        },
    )
    .with_publisher(publisher)
    .with_changes(feed)
    .with_secret_keys(KeyRing::from_files(&server.secrets_key_files)?)
    .with_payloads(
        crate::blob_store::open(server, &backend.database_url).map_err(StartError::BlobStore)?,
    );
    if server.hand_off {
        coordinator = coordinator.with_hand_off(Arc::clone(&hub));
    }
    let recovery = RecoveryConfig {
        lost_dispatch_grace: server.lost_dispatch_grace,
        retention: server.retention,
        ..RecoveryConfig::default()
    };
    let changes = RunChanges::new();
    // the loops that end when told to stop: awaited before the process
    // closes its pools, so none of them logs a closed pool or a stopped
    // Redis on the way out
    let mut loops = JoinSet::new();
    loops.spawn(streams::run_enqueuer(
        store.clone(),
        backend.redis_url.clone(),
        dispatch_config,
        stop.clone(),
    ));
    // the recovery loops run on a pool of their own: a flood of requests
    // must not keep due timers and expired leases waiting for a connection
    let background = Store::connect_lazy(&StoreConfig {
        database_url: backend.database_url.clone(),
        max_connections: server.database_background_connections,
        connect_timeout: server.connect_timeout,
        // no caller waits on these loops, and a retention batch on a large
        // database may take longer than a request should
        query_timeout: server.db_timeout.max(BACKGROUND_QUERY_TIMEOUT),
    })
    .map_err(StartError::Database)?;
    let recovering = coordinator.on_store(background.clone());
    loops.spawn(
        recovering
            .clone()
            .run_timer_loop(recovery.clone(), stop.clone()),
    );
    loops.spawn(
        recovering
            .clone()
            .run_lease_loop(recovery.clone(), stop.clone()),
    );
    loops.spawn(
        recovering
            .clone()
            .run_scheduler_loop(SchedulerConfig::default(), stop.clone()),
    );
    loops.spawn(recovering.clone().run_bulk_loop(
        BulkConfig {
            batch_size: server.bulk_batch_size,
            batch_pause: server.bulk_batch_pause,
            lease: server.bulk_lease,
            ..BulkConfig::default()
        },
        stop.clone(),
    ));
    loops.spawn(recovering.run_reconcile_loop(recovery, Arc::clone(&hub), stop.clone()));
    loops.spawn(changes.clone().run(backend.redis_url.clone(), stop.clone()));
    let executor = HttpExecutor::new(HttpExecutorConfig {
        allow_private_networks: server.http_allow_private,
        allow_loopback: server.http_allow_loopback,
        ..HttpExecutorConfig::default()
    })
    .map_err(|e| StartError::Http(e.to_string()))?;
    loops.spawn(run_http_worker(
        coordinator.clone(),
        Arc::clone(&hub),
        Arc::new(executor),
        HttpWorkerConfig {
            concurrency: server.http_concurrency,
            namespace_refresh: std::time::Duration::from_secs(5),
        },
        stop.clone(),
    ));
    Ok((
        Services {
            coordinator,
            hub,
            changes,
        },
        background,
        loops,
    ))
}

/// How long the loops get, once told to stop, to finish what they are
/// doing (a batch of timers, an HTTP call) before they are cut short.
const LOOPS_WIND_DOWN: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits for the loops and the poll hub's reader to end after the stop, at
/// most [`LOOPS_WIND_DOWN`].
async fn wind_down(mut loops: JoinSet<()>, hub: &PollHub) {
    let all_ended = async {
        hub.stop().await;
        while loops.join_next().await.is_some() {}
    };
    if tokio::time::timeout(LOOPS_WIND_DOWN, all_ended)
        .await
        .is_err()
    {
        loops.abort_all();
    }
}

/// Resolves at the first SIGTERM or SIGINT. A second one exits the process at
/// once, for an operator who does not want to wait for the drain.
pub async fn shutdown_signal() {
    shutdown_signal_then(|| {}).await;
}

/// Like [`shutdown_signal`], running `before_exit` when a second signal
/// cuts the drain short (`composer dev` kills its Postgres and Redis there).
pub async fn shutdown_signal_then(before_exit: impl FnOnce() + Send + 'static) {
    wait_for_signal().await;
    tracing::info!("shutdown requested; a second signal exits at once");
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::warn!("second signal: exiting now");
        before_exit();
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
