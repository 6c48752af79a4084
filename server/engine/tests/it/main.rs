//! The integration tests of `engine`, one binary: each module was a test
//! binary of its own, and linking the whole server once instead of once per
//! file is most of what a test build costs.

mod common;

mod examples;
mod fuzz;
mod history_types;
mod invalid_definitions;
mod properties;
mod protocol;
mod replay;
mod rules;
