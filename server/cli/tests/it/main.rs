//! The integration tests of `cli`, one binary: each module was a test
//! binary of its own, and linking the whole server once instead of once per
//! file is most of what a test build costs.

mod common;

mod admin_cli;
mod alone;
mod auth;
mod blob_urls;
mod cleanup;
mod concurrency;
mod dashboard;
mod dev;
mod faults;
mod flow_control;
mod migrate;
mod operations;
mod payloads;
mod rate_limits;
mod redis_cluster;
mod replay;
mod run_filters;
mod runs;
mod schedules;
mod secrets;
mod security;
mod serve;
mod traces;
mod workflow_cli;
mod workflows;
