//! The `composer` binary's library half: configuration, wiring and the local
//! services that `composer dev` and the test harness start. Wiring only: the
//! behaviour lives in the layer crates.

pub mod admin;
pub mod auth;
pub mod blob_store;
pub mod config;
pub mod dev;
pub mod local_services;
pub mod logging;
pub mod metrics_server;
pub mod quotas;
pub mod serve;
pub mod traces;
pub mod workflow_test;
