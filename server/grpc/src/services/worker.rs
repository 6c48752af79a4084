//! `WorkerService`: the lease protocol. Every RPC answers UNIMPLEMENTED until
//! the durable-execution issue lands (the generated default stubs).

use composer_proto::v1::worker_service_server::WorkerService;

/// The WorkerService implementation.
#[derive(Debug, Clone, Default)]
pub(crate) struct WorkerApi;

impl WorkerService for WorkerApi {}
