//! `grpc.health.v1`: SERVING while Postgres and Redis answer, NOT_SERVING
//! when either does not, and NOT_SERVING for good once draining starts, so
//! load balancers stop sending work before the server goes away.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use composer_coordinator::Backends;
use tonic_health::{ServingStatus, server::HealthReporter};

/// The services whose health is reported besides the overall `""` entry.
const SERVICE_NAMES: &[&str] = &[
    "composer.v1.WorkflowService",
    "composer.v1.RunService",
    "composer.v1.WorkerService",
    "composer.v1.ServerService",
];

/// Whether this server should get traffic now: what the health service
/// says, shared with the HTTP `/readyz` of the metrics port.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// True while Postgres and Redis answer and the server is not draining.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Keeps the health service's answer in step with the backends.
#[derive(Clone)]
pub struct HealthMonitor {
    reporter: HealthReporter,
    draining: Arc<AtomicBool>,
    readiness: Readiness,
}

impl HealthMonitor {
    pub(crate) fn new(reporter: HealthReporter, readiness: Readiness) -> Self {
        Self {
            reporter,
            draining: Arc::new(AtomicBool::new(false)),
            readiness,
        }
    }

    async fn set_all(&self, status: ServingStatus) {
        self.readiness
            .0
            .store(status == ServingStatus::Serving, Ordering::SeqCst);
        self.reporter.set_service_status("", status).await;
        for name in SERVICE_NAMES {
            self.reporter.set_service_status(*name, status).await;
        }
    }

    /// Checks the backends now and reports the result, unless draining.
    pub async fn refresh(&self, backends: &Backends) {
        let result = backends.check_ready().await;
        if self.draining.load(Ordering::SeqCst) {
            return;
        }
        match result {
            Ok(()) => self.set_all(ServingStatus::Serving).await,
            Err(error) => {
                tracing::warn!(%error, "backend not ready");
                self.set_all(ServingStatus::NotServing).await;
            }
        }
    }

    /// Checks the backends every `interval` until draining starts.
    pub async fn run(self, backends: Backends, interval: Duration) {
        while !self.draining.load(Ordering::SeqCst) {
            self.refresh(&backends).await;
            tokio::time::sleep(interval).await;
        }
    }

    /// Reports NOT_SERVING from now on.
    pub async fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.set_all(ServingStatus::NotServing).await;
    }
}
