//! `WorkflowService`: registered definitions. Every RPC answers UNIMPLEMENTED
//! until the workflow-language issue lands (the generated default stubs).

use composer_proto::v1::workflow_service_server::WorkflowService;

/// The WorkflowService implementation.
#[derive(Debug, Clone, Default)]
pub(crate) struct WorkflowApi;

impl WorkflowService for WorkflowApi {}
