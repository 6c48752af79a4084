//! Getting armed tasks to workers: Redis and its streams, the poll hub
//! that leases them, direct hand-off, and queue rate limits.

pub mod answer_sent;
pub mod broker;
pub(crate) mod hand_off;
pub mod poll_hub;
pub mod rate_limit;
pub mod redis_conn;
pub mod streams;
