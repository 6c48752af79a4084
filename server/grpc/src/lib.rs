//! Composer's gRPC surface: the services of `composer.v1`, health, reflection
//! and grpc-web, all on one port.

mod health;
mod server;
mod services;

pub use health::HealthMonitor;
pub use server::{GrpcConfig, ServeError, serve};
