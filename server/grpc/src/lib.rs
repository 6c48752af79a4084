//! Composer's gRPC surface: the services of `composer.v1`, health, reflection
//! and grpc-web, all on one port.

mod answer_written;
pub mod auth;
mod caller;
pub mod convert;
pub mod dashboard;
mod deadline;
mod health;
mod held_body;
pub mod quota;
pub mod recorded;
pub mod request_metrics;
mod server;
mod services;
mod status;
pub mod transport_status;
mod watch_body;

pub use health::{HealthMonitor, Readiness};
pub use server::{GrpcConfig, ServeError, Services, serve};
