//! The integration tests of `store`, one binary: each module was a test
//! binary of its own, and linking the whole server once instead of once per
//! file is most of what a test build costs.

mod count_plan;
mod fresh;
mod history;
mod lease_plan;
mod migrations;
mod pool;
