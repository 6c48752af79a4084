//! `RunService`: run control. Every RPC answers UNIMPLEMENTED until the
//! durable-execution issue lands (the generated default stubs).

use composer_proto::v1::run_service_server::RunService;

/// The RunService implementation.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunApi;

impl RunService for RunApi {}
