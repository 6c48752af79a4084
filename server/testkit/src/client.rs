//! A thin client over the run and workflow services, for tests.

use std::time::Duration;

use composer_proto::v1::{
    GetRunHistoryRequest, GetRunRequest, HistoryEvent, RegisterWorkflowRequest, Run, RunStatus,
    StartRunRequest, run_service_client::RunServiceClient,
    workflow_service_client::WorkflowServiceClient,
};
use serde_json::Value as Json;
use tonic::transport::Channel;

use crate::worker::{json_of, value_of};

/// Workflow and run calls against one server.
#[derive(Clone)]
pub struct TestClient {
    /// Run service.
    pub runs: RunServiceClient<Channel>,
    /// Workflow service.
    pub workflows: WorkflowServiceClient<Channel>,
}

impl TestClient {
    /// Connects to `url`.
    pub async fn connect(url: &str) -> Self {
        let channel = Channel::from_shared(url.to_owned())
            .expect("url")
            .connect()
            .await
            .expect("connect the test client");
        Self {
            runs: RunServiceClient::new(channel.clone()),
            workflows: WorkflowServiceClient::new(channel),
        }
    }

    /// Registers a definition; panics on refusal.
    pub async fn register(&mut self, source: &str) -> i32 {
        self.workflows
            .register_workflow(RegisterWorkflowRequest {
                source: source.to_owned(),
            })
            .await
            .expect("register the workflow")
            .into_inner()
            .workflow
            .expect("workflow")
            .version
    }

    /// Starts a run; returns its id.
    pub async fn start(&mut self, workflow: &str, input: Json) -> String {
        self.start_with_key(workflow, input, "").await.0
    }

    /// Starts a run with an idempotency key; returns (run id, created).
    pub async fn start_with_key(
        &mut self,
        workflow: &str,
        input: Json,
        key: &str,
    ) -> (String, bool) {
        let response = self
            .runs
            .start_run(StartRunRequest {
                workflow_name: workflow.to_owned(),
                version: 0,
                input: Some(value_of(&input)),
                idempotency_key: key.to_owned(),
                labels: Default::default(),
                priority: 0,
            })
            .await
            .expect("start the run")
            .into_inner();
        (response.run.expect("run").run_id, response.created)
    }

    /// The run now.
    pub async fn get(&mut self, run_id: &str) -> Run {
        self.runs
            .get_run(GetRunRequest {
                run_id: run_id.to_owned(),
                skip_nodes: false,
            })
            .await
            .expect("get the run")
            .into_inner()
            .run
            .expect("run")
    }

    /// Waits until the run ends (or `timeout`, then panics with its state).
    pub async fn wait_done(&mut self, run_id: &str, timeout: Duration) -> Run {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let run = self.get(run_id).await;
            let status = run.status();
            if matches!(
                status,
                RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
            ) {
                return run;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("run {run_id} still {status:?} after {timeout:?}: {run:#?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The whole history of a run.
    pub async fn history(&mut self, run_id: &str) -> Vec<HistoryEvent> {
        let mut events = Vec::new();
        let mut token = String::new();
        loop {
            let page = self
                .runs
                .get_run_history(GetRunHistoryRequest {
                    run_id: run_id.to_owned(),
                    page_size: 1000,
                    page_token: token,
                })
                .await
                .expect("history")
                .into_inner();
            events.extend(page.events);
            if page.next_page_token.is_empty() {
                return events;
            }
            token = page.next_page_token;
        }
    }
}

/// The output of a run as JSON.
pub fn output_of(run: &Run) -> Json {
    run.output.clone().map(json_of).unwrap_or(Json::Null)
}
