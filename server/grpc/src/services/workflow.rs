//! `WorkflowService`: registered definitions.

use composer_coordinator::Coordinator;
use composer_proto::v1::{
    CheckWorkflowVersionRequest, CheckWorkflowVersionResponse, GetWorkflowRequest,
    GetWorkflowResponse, ListWorkflowVersionsRequest, ListWorkflowVersionsResponse,
    ListWorkflowsRequest, ListWorkflowsResponse, RegisterWorkflowRequest, RegisterWorkflowResponse,
    ReplayRunRequest, ReplayRunResponse, ValidateWorkflowRequest, ValidateWorkflowResponse,
    ValidationProblem, WorkflowSummary, WorkflowVersion, workflow_service_server::WorkflowService,
};
use composer_store::workflows::WorkflowRow;
use tonic::{Request, Response, Status};

use crate::{
    caller::caller,
    convert::{from_json, keyset_page, page_size, page_token, timestamp},
    status::{MAX_KEY_BYTES, check_source, check_text, from_coordinator, invalid_field},
};

/// The WorkflowService implementation.
#[derive(Clone)]
pub(crate) struct WorkflowApi {
    pub(crate) coordinator: Coordinator,
}

fn version_message(row: WorkflowRow, with_source: bool) -> WorkflowVersion {
    WorkflowVersion {
        namespace: row.namespace,
        name: row.name,
        version: row.version,
        description: row.description,
        source: if with_source {
            row.source
        } else {
            String::new()
        },
        definition: with_source.then(|| from_json(&row.definition)),
        content_hash: row.content_hash,
        create_time: Some(timestamp(row.created_at)),
    }
}

fn check_name(name: &str) -> Result<(), Status> {
    crate::status::check_name("name", name)
}

#[tonic::async_trait]
impl WorkflowService for WorkflowApi {
    async fn register_workflow(
        &self,
        request: Request<RegisterWorkflowRequest>,
    ) -> Result<Response<RegisterWorkflowResponse>, Status> {
        let caller = caller(&request)?;
        let source = request.into_inner().source;
        check_source(&source)?;
        let (row, created) = self
            .coordinator
            .workflows()
            .register(self.coordinator.store(), &caller.namespace, &source)
            .await
            .map_err(from_coordinator)?;
        tracing::info!(name = %row.name, version = row.version, created, "workflow registered");
        Ok(Response::new(RegisterWorkflowResponse {
            workflow: Some(version_message(row, true)),
            created,
        }))
    }

    async fn validate_workflow(
        &self,
        request: Request<ValidateWorkflowRequest>,
    ) -> Result<Response<ValidateWorkflowResponse>, Status> {
        let caller = caller(&request)?;
        let source = request.into_inner().source;
        check_source(&source)?;
        let checked = self
            .coordinator
            .workflows()
            .validate(&caller.namespace, &source)
            .await
            .map_err(from_coordinator)?;
        let problems = match checked {
            Ok(_) => Vec::new(),
            Err(problems) => problems
                .into_iter()
                .map(|p| ValidationProblem {
                    path: p.field,
                    message: p.description,
                })
                .collect(),
        };
        Ok(Response::new(ValidateWorkflowResponse {
            valid: problems.is_empty(),
            problems,
        }))
    }

    async fn get_workflow(
        &self,
        request: Request<GetWorkflowRequest>,
    ) -> Result<Response<GetWorkflowResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        check_name(&request.name)?;
        if request.version < 0 {
            return Err(invalid_field(
                "version",
                "must be 0 (latest) or a version number",
            ));
        }
        let version = (request.version > 0).then_some(request.version);
        let row = self
            .coordinator
            .workflow_version(&caller.namespace, &request.name, version)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(GetWorkflowResponse {
            workflow: Some(version_message(row, true)),
        }))
    }

    async fn list_workflows(
        &self,
        request: Request<ListWorkflowsRequest>,
    ) -> Result<Response<ListWorkflowsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let limit = page_size(request.page_size)?;
        if request.name_prefix.len() > composer_coordinator::names::MAX_NAME_LEN {
            return Err(invalid_field(
                "name_prefix",
                format!(
                    "is longer than a name can be ({} bytes)",
                    composer_coordinator::names::MAX_NAME_LEN
                ),
            ));
        }
        check_text("name_prefix", &request.name_prefix, MAX_KEY_BYTES)?;
        check_text("page_token", &request.page_token, MAX_KEY_BYTES)?;
        let rows = self
            .coordinator
            .list_workflows(
                &caller.namespace,
                &request.name_prefix,
                &request.page_token,
                limit + 1,
            )
            .await
            .map_err(from_coordinator)?;
        let (page, next_page_token) = keyset_page(rows, limit, |last| last.name.clone());
        Ok(Response::new(ListWorkflowsResponse {
            workflows: page
                .into_iter()
                .map(|row| WorkflowSummary {
                    namespace: row.namespace,
                    name: row.name,
                    latest_version: row.version,
                    description: row.description,
                    update_time: Some(timestamp(row.created_at)),
                })
                .collect(),
            next_page_token,
        }))
    }

    async fn list_workflow_versions(
        &self,
        request: Request<ListWorkflowVersionsRequest>,
    ) -> Result<Response<ListWorkflowVersionsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        check_name(&request.name)?;
        let limit = page_size(request.page_size)?;
        let before =
            page_token(&request.page_token, |token| token.parse::<i32>().ok())?.unwrap_or(i32::MAX);
        let rows = self
            .coordinator
            .list_workflow_versions(&caller.namespace, &request.name, before, limit + 1)
            .await
            .map_err(from_coordinator)?;
        if rows.is_empty() && request.page_token.is_empty() {
            return Err(Status::not_found(format!(
                "workflow {:?} not found",
                request.name
            )));
        }
        let (page, next_page_token) = keyset_page(rows, limit, |last| last.version.to_string());
        Ok(Response::new(ListWorkflowVersionsResponse {
            versions: page
                .into_iter()
                .map(|row| version_message(row, false))
                .collect(),
            next_page_token,
        }))
    }

    async fn replay_run(
        &self,
        request: Request<ReplayRunRequest>,
    ) -> Result<Response<ReplayRunResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        crate::services::replay::replay_run(&self.coordinator, &caller, request)
            .await
            .map(Response::new)
    }

    async fn check_workflow_version(
        &self,
        request: Request<CheckWorkflowVersionRequest>,
    ) -> Result<Response<CheckWorkflowVersionResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        crate::services::replay::check_workflow_version(&self.coordinator, &caller, request)
            .await
            .map(Response::new)
    }
}
