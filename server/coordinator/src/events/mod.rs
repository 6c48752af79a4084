//! Every change to a run, each in one Postgres transaction (alone or in a
//! group commit): starts, events, worker reports, pause, bulk operations,
//! concurrency keys, and the feed that announces each change.

pub(crate) mod apply;
pub mod bulk;
pub(crate) mod bulk_step;
pub(crate) mod concurrency;
pub(crate) mod group;
pub mod migrate;
pub mod pause;
pub(crate) mod reports;
pub(crate) mod runs;
pub mod watch;
