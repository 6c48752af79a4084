//! The operator's HTTP port (`--metrics-listen`): Prometheus text at
//! `/metrics`, liveness at `/healthz`, readiness at `/readyz`. Off by
//! default; without it no recorder is installed and counting costs nothing.

use std::{net::SocketAddr, time::Duration};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use composer_grpc::Readiness;
use composer_store::Store;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::{net::TcpListener, sync::watch};

/// Histogram buckets for durations, in seconds: 1 ms to 30 s.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Buckets for events per transaction.
const EVENTS_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
/// How often the backlog and pool gauges are refreshed.
const GAUGE_INTERVAL: Duration = Duration::from_secs(5);

/// Why the metrics port could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be bound.
    #[error("COMPOSER_METRICS_LISTEN (--metrics-listen) {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A recorder was already installed in this process.
    #[error("metrics recorder: {0}")]
    Recorder(String),
}

#[derive(Clone)]
struct Port {
    handle: PrometheusHandle,
    readiness: Readiness,
}

/// Installs the Prometheus recorder, binds `addr` and serves the port until
/// the process exits; refreshes the gauges of `pools` (name, store) until
/// `stop`. Returns the bound address.
pub async fn start(
    addr: SocketAddr,
    readiness: Readiness,
    pools: Vec<(&'static str, Store)>,
    stop: watch::Receiver<bool>,
) -> Result<SocketAddr, MetricsError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), SECONDS_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Suffix("_events".to_owned()), EVENTS_BUCKETS)
        })
        .map_err(|e| MetricsError::Recorder(e.to_string()))?
        .install_recorder()
        .map_err(|e| MetricsError::Recorder(e.to_string()))?;
    composer_coordinator::observe::metrics::describe_all();
    composer_coordinator::observe::metrics::start_at_zero();
    composer_coordinator::observe::metrics::enable();
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Listen { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    let app = Router::new()
        .route("/metrics", get(render))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .layer(axum::middleware::map_response(secure))
        .with_state(Port {
            handle: handle.clone(),
            readiness,
        });
    // up until the process exits: through the drain, /readyz says 503
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::warn!(%error, "metrics port stopped");
        }
    });
    tokio::spawn(refresh_gauges(handle, pools, stop));
    tracing::info!(addr = %bound, "metrics at /metrics, /healthz, /readyz");
    Ok(bound)
}

/// Every answer of the port, a 404 included, carries the headers the
/// gRPC port's answers do (`nosniff`, the CSP): SECURITY.md.
async fn secure(mut response: axum::response::Response) -> axum::response::Response {
    composer_grpc::dashboard::add_security_headers(response.headers_mut());
    response
}

async fn render(State(port): State<Port>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        port.handle.render(),
    )
}

async fn ready(State(port): State<Port>) -> impl IntoResponse {
    if port.readiness.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: Postgres or Redis does not answer, or the server is draining\n",
        )
    }
}

async fn refresh_gauges(
    handle: PrometheusHandle,
    pools: Vec<(&'static str, Store)>,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        if let Some((_, store)) = pools.first() {
            match store.backlog().await {
                Ok(b) => composer_coordinator::observe::metrics::backlog(
                    b.outbox_rows,
                    b.outbox_oldest_secs,
                    b.timers_due,
                    b.timer_lag_secs,
                ),
                Err(error) => tracing::debug!(%error, "backlog gauges"),
            }
        }
        for (name, store) in &pools {
            composer_coordinator::observe::metrics::pool(
                name,
                store.pool().size(),
                store.pool().num_idle(),
            );
        }
        handle.run_upkeep();
        tokio::select! {
            () = tokio::time::sleep(GAUGE_INTERVAL) => {},
            _ = stop.changed() => {},
        }
    }
}
