//! One module per `composer.v1` service.

pub(crate) mod blob;
pub(crate) mod bulk;
pub(crate) mod queue;
pub(crate) mod replay;
pub(crate) mod run;
pub(crate) mod run_fields;
pub(crate) mod schedule;
pub(crate) mod secret;
pub(crate) mod server_info;
pub(crate) mod worker;
pub(crate) mod workflow;
