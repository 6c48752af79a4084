//! `WorkerService`: the lease protocol. Reports and heartbeats are fenced by
//! `(task_id, attempt, lease_token)`; a stale one is FAILED_PRECONDITION
//! with ErrorInfo reason LEASE_LOST and changes nothing.

use std::{collections::HashMap, sync::Arc, time::Duration};

use composer_coordinator::{
    Coordinator, Reporter, TaskReport,
    dispatch::answer_sent,
    dispatch::poll_hub::{PollHub, PollRequest},
    http::codes::SECRET_UNAVAILABLE,
};
use composer_proto::v1::{
    CompleteTaskRequest, CompleteTaskResponse, FailTaskRequest, FailTaskResponse, HeartbeatRequest,
    HeartbeatResponse, PollTasksRequest, PollTasksResponse, Task,
    worker_service_server::WorkerService,
};
use composer_store::tasks::{LeasedTask, TaskScope};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::{
    answer_written::hold_until_written,
    auth::Role,
    caller::Caller,
    caller::caller,
    convert::{from_json, timestamp, to_json},
    status::{
        MAX_KEY_BYTES, MAX_TEXT_BYTES, check_name, check_text, from_coordinator, invalid_field,
    },
};

const DEFAULT_WAIT: Duration = Duration::from_secs(20);
const MAX_WAIT: Duration = Duration::from_secs(60);
const MAX_TASKS: i32 = 100;
/// Queues one poll may name.
const MAX_QUEUES: usize = 64;

/// The WorkerService implementation.
#[derive(Clone)]
pub(crate) struct WorkerApi {
    pub(crate) coordinator: Coordinator,
    pub(crate) hub: Arc<PollHub>,
    /// Flips to true when the server drains: waiting polls answer at once.
    pub(crate) draining: watch::Receiver<bool>,
}

/// Whether a task's queue is a code runner's (`code.<language>`): only
/// those are handed the secrets their node declares.
fn is_code_queue(queue: &str) -> bool {
    queue.starts_with("code.")
}

fn task_message(task: LeasedTask, secrets: HashMap<String, String>) -> Task {
    Task {
        secrets,
        task_id: task.id.to_string(),
        attempt: task.attempt,
        lease_token: task.lease_token.to_string(),
        lease_expire_time: Some(timestamp(task.lease_expires_at)),
        lease_duration: Some(prost_types::Duration {
            seconds: task.heartbeat_timeout_ms / 1000,
            nanos: i32::try_from((task.heartbeat_timeout_ms % 1000) * 1_000_000).unwrap_or(0),
        }),
        run_id: task.run_id.to_string(),
        node_id: task.node_key,
        workflow_name: task.workflow_name,
        workflow_version: task.workflow_version,
        queue: task.queue,
        task_name: task.task_name,
        input: Some(from_json(&task.input)),
        attempt_deadline: task.attempt_deadline.map(timestamp),
        namespace: task.namespace,
        trace_context: task
            .traceparent
            .map(|parent| [("traceparent".to_owned(), parent)].into())
            .unwrap_or_default(),
    }
}

/// The tasks a worker's calls may touch: its namespace, and the queues its
/// token lists (every public queue for an admin or `*`). Queues starting
/// with `_` are the server's and outside every scope.
fn scope_of(caller: &Caller) -> TaskScope {
    let listed = caller
        .queues
        .as_ref()
        .filter(|queues| !caller.has(Role::Admin) && !queues.contains("*"));
    TaskScope {
        namespace: caller.namespace.clone(),
        queues: listed.map(|queues| {
            queues
                .iter()
                .filter(|q| composer_coordinator::names::check_name(q).is_ok())
                .cloned()
                .collect()
        }),
    }
}

fn lease_fields(task_id: &str, lease_token: &str, attempt: i32) -> Result<(), Status> {
    check_text("task_id", task_id, MAX_KEY_BYTES)?;
    check_text("lease_token", lease_token, MAX_KEY_BYTES)?;
    if task_id.is_empty() {
        return Err(invalid_field("task_id", "must not be empty"));
    }
    if lease_token.is_empty() {
        return Err(invalid_field("lease_token", "must not be empty"));
    }
    if attempt < 1 {
        return Err(invalid_field("attempt", "must be at least 1"));
    }
    Ok(())
}

fn wait_of(wait: Option<prost_types::Duration>) -> Result<Duration, Status> {
    let Some(wait) = wait else {
        return Ok(DEFAULT_WAIT);
    };
    if wait.seconds < 0 || wait.nanos < 0 {
        return Err(invalid_field("wait", "must not be negative"));
    }
    let wait = Duration::new(wait.seconds.unsigned_abs(), wait.nanos.unsigned_abs());
    Ok(wait.min(MAX_WAIT))
}

impl WorkerApi {
    /// The secrets a CODE task hands its snippet (none for other tasks);
    /// None when they cannot be read: the attempt is failed with
    /// SECRET_UNAVAILABLE (retryable) and not handed out, so no snippet
    /// runs without what it declared.
    async fn secrets_of(
        &self,
        caller: &Caller,
        task: &LeasedTask,
    ) -> Option<HashMap<String, String>> {
        let names = composer_coordinator::secrets::values::declared_names(&task.input);
        if names.is_empty() || !is_code_queue(&task.queue) {
            return Some(HashMap::new());
        }
        match self
            .coordinator
            .secret_values(&task.namespace, &names)
            .await
        {
            Ok(values) => Some(values.into_map()),
            Err(error) => {
                let report = TaskReport::Failed {
                    code: SECRET_UNAVAILABLE.to_owned(),
                    message: error.to_string(),
                    retryable: true,
                    details: None,
                };
                let failed = self
                    .coordinator
                    .report(
                        &scope_of(caller),
                        &task.id.to_string(),
                        task.attempt,
                        &task.lease_token.to_string(),
                        report,
                        Reporter {
                            actor: "server",
                            traceparent: None,
                            answer_sent: None,
                        },
                    )
                    .await;
                if let Err(error) = failed {
                    tracing::warn!(task_id = %task.id, %error, "a code task's secrets were unavailable; its failure was not applied");
                }
                None
            }
        }
    }
}

#[tonic::async_trait]
impl WorkerService for WorkerApi {
    async fn poll_tasks(
        &self,
        request: Request<PollTasksRequest>,
    ) -> Result<Response<PollTasksResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        if request.worker_id.is_empty() {
            return Err(invalid_field("worker_id", "must not be empty"));
        }
        check_text("worker_id", &request.worker_id, MAX_KEY_BYTES)?;
        if request.queues.is_empty() {
            return Err(invalid_field("queues", "name at least one queue"));
        }
        if request.queues.len() > MAX_QUEUES {
            return Err(invalid_field(
                "queues",
                format!("at most {MAX_QUEUES} queues per poll"),
            ));
        }
        for (i, queue) in request.queues.iter().enumerate() {
            check_name(&format!("queues[{i}]"), queue)?;
        }
        if request.max_tasks < 0 || request.max_tasks > MAX_TASKS {
            return Err(invalid_field(
                "max_tasks",
                format!("must be 0 (one) to {MAX_TASKS}"),
            ));
        }
        if let Some(queue) = request.queues.iter().find(|q| !caller.may_poll(q)) {
            return Err(Status::permission_denied(format!(
                "the token does not list queue {queue:?}"
            )));
        }
        let max = usize::try_from(request.max_tasks.max(1)).unwrap_or(1);
        let wait = wait_of(request.wait)?;
        let mut draining = self.draining.clone();
        if *draining.borrow() {
            return Ok(Response::new(PollTasksResponse { tasks: Vec::new() }));
        }
        let hub = Arc::clone(&self.hub);
        let poll = hub.poll(
            &caller.namespace,
            &request.queues,
            PollRequest {
                worker_id: &request.worker_id,
                max,
                wait,
                confirm_receipt: request.confirm_receipt,
            },
        );
        let tasks = tokio::select! {
            tasks = poll => tasks.map_err(|e| Status::resource_exhausted(e.to_string()))?,
            _ = draining.wait_for(|d| *d) => Vec::new(),
        };
        self.coordinator.remember_leases(&tasks);
        let mut handed = Vec::with_capacity(tasks.len());
        for task in tasks {
            if let Some(secrets) = self.secrets_of(&caller, &task).await {
                handed.push(task_message(task, secrets));
            }
        }
        Ok(Response::new(PollTasksResponse { tasks: handed }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        lease_fields(&request.task_id, &request.lease_token, request.attempt)?;
        let answer = self
            .coordinator
            .heartbeat(
                &scope_of(&caller),
                &request.task_id,
                request.attempt,
                &request.lease_token,
            )
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(HeartbeatResponse {
            lease_expire_time: answer.lease_expires_at.map(timestamp),
            cancel_requested: answer.cancel_requested,
            cancel_reason: answer.cancel_reason,
        }))
    }

    async fn complete_task(
        &self,
        request: Request<CompleteTaskRequest>,
    ) -> Result<Response<CompleteTaskResponse>, Status> {
        let caller = caller(&request)?;
        let traceparent = crate::caller::traceparent(&request);
        let request = request.into_inner();
        lease_fields(&request.task_id, &request.lease_token, request.attempt)?;
        let output = to_json(request.output, "output")?;
        let (in_flight, sent) = answer_sent::signal();
        self.coordinator
            .report(
                &scope_of(&caller),
                &request.task_id,
                request.attempt,
                &request.lease_token,
                TaskReport::Completed { output },
                Reporter {
                    actor: &format!("worker:{}", caller.subject),
                    traceparent: traceparent.as_deref(),
                    answer_sent: Some(sent),
                },
            )
            .await
            .map_err(from_coordinator)?;
        Ok(hold_until_written(
            Response::new(CompleteTaskResponse {}),
            in_flight,
        ))
    }

    async fn fail_task(
        &self,
        request: Request<FailTaskRequest>,
    ) -> Result<Response<FailTaskResponse>, Status> {
        let caller = caller(&request)?;
        let traceparent = crate::caller::traceparent(&request);
        let request = request.into_inner();
        lease_fields(&request.task_id, &request.lease_token, request.attempt)?;
        if request.error_code.is_empty() {
            return Err(invalid_field("error_code", "must not be empty"));
        }
        check_text("error_code", &request.error_code, MAX_KEY_BYTES)?;
        check_text("message", &request.message, MAX_TEXT_BYTES)?;
        let (in_flight, sent) = answer_sent::signal();
        self.coordinator
            .report(
                &scope_of(&caller),
                &request.task_id,
                request.attempt,
                &request.lease_token,
                TaskReport::Failed {
                    code: request.error_code,
                    message: request.message,
                    retryable: request.retryable,
                    details: request
                        .details
                        .map(|d| to_json(Some(d), "details"))
                        .transpose()?,
                },
                Reporter {
                    actor: &format!("worker:{}", caller.subject),
                    traceparent: traceparent.as_deref(),
                    answer_sent: Some(sent),
                },
            )
            .await
            .map_err(from_coordinator)?;
        Ok(hold_until_written(
            Response::new(FailTaskResponse {}),
            in_flight,
        ))
    }
}
