//! Wires the services onto one port that speaks gRPC (HTTP/2) and grpc-web
//! (HTTP/1.1 or HTTP/2), with health and reflection beside them, and serves
//! the browser dashboard's files to every other GET.

use std::{sync::Arc, time::Duration};

use composer_coordinator::{
    Backends, Coordinator, dispatch::poll_hub::PollHub, events::watch::RunChanges,
};
use composer_proto::v1::{
    blob_service_server::BlobServiceServer, queue_service_server::QueueServiceServer,
    run_service_server::RunServiceServer, schedule_service_server::ScheduleServiceServer,
    secret_service_server::SecretServiceServer, server_service_server::ServerServiceServer,
    worker_service_server::WorkerServiceServer, workflow_service_server::WorkflowServiceServer,
};
use http::{HeaderName, HeaderValue, Method};
use tokio::{net::TcpListener, sync::watch};
use tonic::transport::{Server, server::TcpIncoming};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::{
    auth::{AuthLayer, AuthMode, Authenticator},
    dashboard::{DashboardFiles, DashboardLayer},
    health::HealthMonitor,
    services::{
        blob::BlobApi, queue::QueueApi, run::RunApi, schedule::ScheduleApi, secret::SecretApi,
        server_info::PayloadLimits, server_info::ServerInfoService, worker::WorkerApi,
        workflow::WorkflowApi,
    },
};

/// What the gRPC layer needs to know beyond the backends.
#[derive(Clone)]
pub struct GrpcConfig {
    /// Browser origins allowed to call over grpc-web (CORS). Empty: none.
    pub cors_allowed_origins: Vec<String>,
    /// How long the server keeps answering, NOT_SERVING, after a shutdown
    /// signal, so load balancers can take it out of rotation first.
    pub drain_delay: Duration,
    /// How often the health service re-checks Postgres and Redis.
    pub health_check_interval: Duration,
    /// How callers are authenticated.
    pub auth: AuthMode,
    /// The largest request message the server decodes
    /// (`--max-message-bytes`): a larger payload goes through BlobService.
    pub max_message_bytes: usize,
    /// How long a call (the long poll aside) may take before it is
    /// UNAVAILABLE (`--db-timeout`).
    pub call_timeout: Duration,
    /// Set while this server should get traffic (for `/readyz`).
    pub readiness: crate::health::Readiness,
    /// Where the browser dashboard's files come from.
    pub dashboard: DashboardFiles,
}

/// The application state behind the services.
#[derive(Clone)]
pub struct Services {
    /// Applies events to runs.
    pub coordinator: Coordinator,
    /// Hands dispatched tasks to waiting polls.
    pub hub: Arc<PollHub>,
    /// Run-change notifications for WatchRun.
    pub changes: RunChanges,
}

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The reflection service could not load the descriptors.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// An origin in the CORS list is not a valid header value.
    #[error("invalid CORS origin {0:?}")]
    InvalidOrigin(String),
    /// The HTTP server failed.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves every service on `listener` until `shutdown` turns true; then
/// reports NOT_SERVING, answers waiting polls at once, keeps answering for
/// the drain delay, and stops gracefully.
pub async fn serve(
    config: GrpcConfig,
    backends: Backends,
    services: Services,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ServeError> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let monitor = HealthMonitor::new(reporter, config.readiness.clone());
    monitor.refresh(&backends).await;
    tokio::spawn(
        monitor
            .clone()
            .run(backends.clone(), config.health_check_interval),
    );

    let reflection_v1 = reflection_builder().build_v1()?;
    let reflection_v1alpha = reflection_builder().build_v1alpha()?;
    let cors = cors_layer(&config.cors_allowed_origins)?;

    let draining = monitor.clone();
    let drain_delay = config.drain_delay;
    let mut stop_signal = shutdown.clone();
    let stop = async move {
        let _ = stop_signal.wait_for(|stop| *stop).await;
        tracing::info!(?drain_delay, "draining");
        draining.start_draining().await;
        tokio::time::sleep(drain_delay).await;
    };

    let mut features = vec![
        "grpc-web".to_owned(),
        "reflection".to_owned(),
        "health".to_owned(),
        "http-nodes".to_owned(),
        "schedules".to_owned(),
    ];
    if matches!(config.auth, AuthMode::Tokens { .. }) {
        features.push("auth".to_owned());
    }
    let max_message = config.max_message_bytes;
    let payload_limits = {
        let coordinator = services.coordinator.config();
        PayloadLimits {
            offload_bytes: if services.coordinator.keeps_blobs() {
                coordinator.payload_offload_bytes
            } else {
                0
            },
            max_payload_bytes: coordinator.max_payload_bytes,
            max_message_bytes: max_message,
            blob_urls: services.coordinator.gives_blob_urls(),
        }
    };
    if services.coordinator.keeps_blobs() {
        features.push("blobs".to_owned());
    }
    if services.coordinator.gives_blob_urls() {
        features.push("blob-urls".to_owned());
    }
    // no Nagle: a small reply must not wait for the peer's delayed ACK (40 ms)
    let incoming = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(Duration::from_secs(60)));
    Server::builder()
        .accept_http1(true)
        // outermost: the dashboard's files need no token and no CORS, and
        // every gRPC or grpc-web request passes it untouched
        .layer(DashboardLayer::new(config.dashboard.clone()))
        .layer(crate::request_metrics::RequestMetricsLayer::new())
        .layer(tower::util::option_layer(cors))
        .layer(tonic_web::GrpcWebLayer::new())
        .layer(AuthLayer::new(Arc::new(Authenticator::new(
            config.auth.clone(),
            config.cors_allowed_origins.clone(),
        ))))
        // right after auth, where the caller's namespace is known, before
        // anything decodes the request (decision 0038)
        .layer(crate::quota::QuotaLayer::new(
            crate::quota::QuotaEnforcer::new(Arc::clone(services.coordinator.quotas())),
        ))
        .layer(crate::transport_status::TransportStatusLayer)
        .layer(crate::deadline::CallDeadlineLayer::new(config.call_timeout))
        // innermost: it holds a report's answer signal in the very body
        // the connection writes
        .layer(tower::util::MapResponseLayer::new(
            crate::answer_written::hold_in_body,
        ))
        // WatchRun's messages go out as encoded, often shared by all the
        // streams of a run, not copied into a buffer per stream (0035)
        .layer(tower::util::MapResponseLayer::new(
            crate::watch_body::send_watch_body,
        ))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(ServerServiceServer::new(ServerInfoService {
            features,
            payload_limits,
        }))
        .add_service(BlobServiceServer::new(BlobApi {
            coordinator: services.coordinator.clone(),
        }))
        .add_service(
            WorkflowServiceServer::new(WorkflowApi {
                coordinator: services.coordinator.clone(),
            })
            .max_decoding_message_size(max_message),
        )
        .add_service(
            RunServiceServer::new(RunApi {
                coordinator: services.coordinator.clone(),
                changes: services.changes.clone(),
                draining: shutdown.clone(),
            })
            .max_decoding_message_size(max_message),
        )
        .add_service(
            ScheduleServiceServer::new(ScheduleApi {
                coordinator: services.coordinator.clone(),
            })
            .max_decoding_message_size(max_message),
        )
        .add_service(
            QueueServiceServer::new(QueueApi {
                coordinator: services.coordinator.clone(),
            })
            .max_decoding_message_size(max_message),
        )
        .add_service(
            SecretServiceServer::new(SecretApi {
                coordinator: services.coordinator.clone(),
            })
            .max_decoding_message_size(max_message),
        )
        .add_service(
            WorkerServiceServer::new(WorkerApi {
                coordinator: services.coordinator,
                hub: services.hub,
                draining: shutdown,
            })
            .max_decoding_message_size(max_message),
        )
        .serve_with_incoming_shutdown(incoming, stop)
        .await?;
    tracing::info!("stopped serving");
    Ok(())
}

fn reflection_builder() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(composer_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // google.rpc.BadRequest, ErrorInfo, ...: what grpcurl needs to decode
        // the details of an error
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
}

/// CORS for grpc-web from browsers: only the configured origins, only what
/// grpc-web needs. No origins configured: no CORS at all (same-origin only).
fn cors_layer(origins: &[String]) -> Result<Option<CorsLayer>, ServeError> {
    if origins.is_empty() {
        return Ok(None);
    }
    let origins = origins
        .iter()
        .map(|origin| {
            HeaderValue::from_str(origin).map_err(|_| ServeError::InvalidOrigin(origin.clone()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let request_headers = [
        "authorization",
        "content-type",
        "x-grpc-web",
        "x-user-agent",
        "grpc-timeout",
    ];
    let exposed_headers = ["grpc-status", "grpc-message", "grpc-status-details-bin"];
    Ok(Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([Method::POST, Method::OPTIONS])
            .allow_headers(request_headers.map(HeaderName::from_static))
            .expose_headers(exposed_headers.map(HeaderName::from_static))
            .max_age(Duration::from_secs(3600)),
    ))
}
