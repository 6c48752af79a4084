//! What the server tells about its own work: metrics and traces.

pub mod metrics;
pub mod traces;
