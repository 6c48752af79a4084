//! The integration tests of `coordinator`, one binary: each module was a test
//! binary of its own, and linking the whole server once instead of once per
//! file is most of what a test build costs.

#[allow(dead_code)]
mod common;

mod blobs;
mod group_commit;
mod hand_off;
mod http_executor;
mod labels;
mod large_history;
mod lease_scans;
mod lease_tasks;
mod records;
mod retention;
mod task_outbox;
mod timer_batches;
mod watch_feed;
mod wide_map;
