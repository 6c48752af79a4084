//! `RunService`: run control.

use std::{collections::HashMap, pin::Pin, sync::Arc};

use bytes::Bytes;
use composer_coordinator::events::bulk::BulkKind;
use composer_coordinator::{
    Coordinator, CoordinatorError, EventTarget, RunView, StartRun,
    events::watch::{
        HISTORY_PAGE, RunChanges, RunSnapshot, RunWatch, SendPermit, Watched, history_bytes,
    },
};
use composer_proto::v1::{
    BulkCancelRunsRequest, BulkCancelRunsResponse, BulkPauseRunsRequest, BulkPauseRunsResponse,
    BulkResumeRunsRequest, BulkResumeRunsResponse, BulkRetryRunsRequest, BulkRetryRunsResponse,
    CancelBulkOperationRequest, CancelBulkOperationResponse, CancelRunRequest, CancelRunResponse,
    CountRunsRequest, CountRunsResponse, Failure, GetBulkOperationRequest,
    GetBulkOperationResponse, GetRunHistoryRequest, GetRunHistoryResponse, GetRunRequest,
    GetRunResponse, HistoryEvent, ListBulkOperationsRequest, ListBulkOperationsResponse,
    ListRunsRequest, ListRunsResponse, MigrateRunsRequest, MigrateRunsResponse, NodeState,
    NodeStatus, PauseRunRequest, PauseRunResponse, ResumeRunRequest, ResumeRunResponse,
    RetryRunRequest, RetryRunResponse, Run, RunStatus, RunStatusCount, SendEventRequest,
    SendEventResponse, StartRunRequest, StartRunResponse, WatchRunRequest, WatchRunResponse,
    run_service_server::RunService, send_event_request::Target,
};
use composer_store::runs::{HistoryRow, NodeRow, RunFilter, RunRow};
use serde_json::{Value as Json, json};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use uuid::Uuid;

use super::bulk::{self, BulkFields};
use super::run_fields::{
    FilterFields, check_label_keys, clipped, run_filter, run_status, status_filter,
};
use crate::{
    caller::caller,
    convert::{from_json, from_json_opt, keyset_page, page_size, page_token, timestamp, to_json},
    status::{
        MAX_KEY_BYTES, MAX_TEXT_BYTES, all_field_problems, check_name, check_text,
        from_coordinator, invalid_field,
    },
    watch_body::{Frames, WatchSlot, grpc_frame},
};

/// The RunService implementation.
#[derive(Clone)]
pub(crate) struct RunApi {
    pub(crate) coordinator: Coordinator,
    pub(crate) changes: RunChanges,
    /// Flips to true when the server drains: open watches end at once.
    pub(crate) draining: tokio::sync::watch::Receiver<bool>,
}

fn node_status(text: &str) -> NodeStatus {
    match text {
        "PENDING" | "RETRY_SCHEDULED" => NodeStatus::Scheduled,
        "RUNNING" => NodeStatus::Running,
        "WAITING" => NodeStatus::Waiting,
        "COMPLETED" => NodeStatus::Completed,
        "FAILED" => NodeStatus::Failed,
        "SKIPPED" => NodeStatus::Skipped,
        "CANCELLED" => NodeStatus::Cancelled,
        _ => NodeStatus::Unspecified,
    }
}

/// A stored error as a Failure; `node_id` is the node's own key, or for a
/// run the node the error records.
fn failure(error: Option<&Json>, node_id: &str) -> Option<Failure> {
    let error = error?;
    let node_id = match error["node"].as_str() {
        Some(node) if node_id.is_empty() => node,
        _ => node_id,
    };
    Some(Failure {
        code: error["code"].as_str().unwrap_or_default().to_owned(),
        message: error["message"].as_str().unwrap_or_default().to_owned(),
        node_id: node_id.to_owned(),
        details: error.get("details").map(from_json),
    })
}

fn node_message(row: NodeRow, types: &HashMap<String, String>) -> NodeState {
    let node_id = row.key.clone();
    // a MAP element `m[3]` has its MAP's type
    let node_type = types
        .get(node_id.split('[').next().unwrap_or_default())
        .cloned()
        .unwrap_or_default();
    NodeState {
        status: node_status(&row.status) as i32,
        attempt: row.state["attempt"]
            .as_i64()
            .and_then(|a| i32::try_from(a).ok())
            .unwrap_or(0),
        output: row.state.get("output").map(from_json),
        error: failure(row.state.get("error"), &node_id),
        start_time: row.started_at.map(timestamp),
        end_time: row.ended_at.map(timestamp),
        input: row.task.as_ref().map(|task| from_json(&task.input)),
        worker_id: row
            .task
            .as_ref()
            .and_then(|task| task.worker_id.clone())
            .unwrap_or_default(),
        lease_expire_time: row
            .task
            .as_ref()
            .and_then(|task| task.lease_expires_at)
            .map(timestamp),
        node_type,
        node_id,
    }
}

fn run_message(run: RunRow, nodes: Vec<NodeRow>, types: &HashMap<String, String>) -> Run {
    let labels = run
        .labels
        .as_object()
        .map(|map| {
            map.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    Run {
        run_id: run.id.to_string(),
        namespace: run.namespace,
        workflow_name: run.workflow_name,
        workflow_version: run.workflow_version,
        status: run_status(&run.status) as i32,
        input: Some(from_json(&run.input)),
        output: from_json_opt(run.output.as_ref()),
        error: failure(run.error.as_ref(), ""),
        labels,
        idempotency_key: run.idempotency_key.unwrap_or_default(),
        parent_run_id: run
            .parent_run_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        parent_node_id: run.parent_node.unwrap_or_default(),
        create_time: Some(timestamp(run.created_at)),
        update_time: Some(timestamp(run.updated_at)),
        end_time: run.ended_at.map(timestamp),
        nodes: nodes.into_iter().map(|n| node_message(n, types)).collect(),
        priority: i32::from(run.priority),
        concurrency_key: run.concurrency_key.clone().unwrap_or_default(),
    }
}

fn view_message(view: RunView) -> Run {
    run_message(view.run, view.nodes, &view.node_types)
}

fn history_message(row: HistoryRow) -> HistoryEvent {
    HistoryEvent {
        sequence: row.seq,
        event_time: Some(timestamp(row.created_at)),
        event_type: row.event_type,
        node_id: row.node_key.unwrap_or_default(),
        attempt: row.attempt.unwrap_or_default(),
        actor: row.actor,
        details: Some(from_json(&row.details)),
    }
}

fn require_run_id(run_id: &str) -> Result<(), Status> {
    if run_id.is_empty() {
        return Err(invalid_field("run_id", "must not be empty"));
    }
    check_text("run_id", run_id, MAX_KEY_BYTES)
}

/// A run id the caller sent: INVALID_ARGUMENT when empty or too long,
/// NOT_FOUND when it is not an id (as for an id that names no run).
pub(crate) fn parse_run_id(run_id: &str) -> Result<Uuid, Status> {
    require_run_id(run_id)?;
    Uuid::parse_str(run_id)
        .map_err(|_| Status::not_found(format!("run {} not found", clipped(run_id))))
}

pub(crate) fn runs_cursor(
    token: &str,
) -> Result<Option<(chrono::DateTime<chrono::Utc>, Uuid)>, Status> {
    check_text("page_token", token, MAX_KEY_BYTES)?;
    page_token(token, |token| {
        let (micros, id) = token.split_once('_')?;
        let time = chrono::DateTime::from_timestamp_micros(micros.parse().ok()?)?;
        Some((time, Uuid::parse_str(id).ok()?))
    })
}

/// Stored statuses and their counts as the API's: PENDING counts as
/// RUNNING, in the order of RunStatus, statuses without runs left out.
fn status_counts(rows: Vec<(String, i64)>) -> Vec<RunStatusCount> {
    let mut counts = std::collections::BTreeMap::<i32, i64>::new();
    for (text, count) in rows {
        let status = run_status(&text);
        if status != RunStatus::Unspecified && count > 0 {
            *counts.entry(status as i32).or_default() += count;
        }
    }
    counts
        .into_iter()
        .map(|(status, count)| RunStatusCount { status, count })
        .collect()
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchRunResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RunService for RunApi {
    async fn start_run(
        &self,
        request: Request<StartRunRequest>,
    ) -> Result<Response<StartRunResponse>, Status> {
        let caller = caller(&request)?;
        let traceparent = crate::caller::traceparent(&request);
        let request = request.into_inner();
        let priority = start_priority(request.priority);
        let input = to_json(request.input, "input");
        let version = match request.version {
            v if v < 0 => Err(invalid_field(
                "version",
                "must be 0 (latest) or a version number",
            )),
            _ => Ok(()),
        };
        // every bad field in one answer
        all_field_problems([
            check_name("workflow_name", &request.workflow_name),
            check_label_keys(&request.labels),
            check_text("idempotency_key", &request.idempotency_key, MAX_KEY_BYTES),
            version,
            priority.as_ref().map(|_| ()).map_err(Clone::clone),
            input.as_ref().map(|_| ()).map_err(Clone::clone),
        ])?;
        let (priority, input) = (priority?, input?);
        let (run, created) = self
            .coordinator
            .start_run(StartRun {
                namespace: caller.namespace,
                workflow_name: request.workflow_name,
                version: (request.version > 0).then_some(request.version),
                input,
                idempotency_key: Some(request.idempotency_key).filter(|k| !k.is_empty()),
                labels: json!(request.labels),
                actor: caller.subject,
                traceparent,
                priority,
            })
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(StartRunResponse {
            run: Some(run_message(run, Vec::new(), &HashMap::new())),
            created,
        }))
    }

    async fn get_run(
        &self,
        request: Request<GetRunRequest>,
    ) -> Result<Response<GetRunResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let run_id = request.run_id;
        require_run_id(&run_id)?;
        let view = self
            .coordinator
            .get_run(Some(&caller.namespace), &run_id, !request.skip_nodes)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(GetRunResponse {
            run: Some(view_message(view)),
        }))
    }

    async fn list_runs(
        &self,
        request: Request<ListRunsRequest>,
    ) -> Result<Response<ListRunsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let limit = page_size(request.page_size)?;
        let statuses = status_filter(&request.statuses)?;
        let filter = RunFilter {
            statuses: statuses.into_iter().map(str::to_owned).collect(),
            ..run_filter(FilterFields::from(&request))?
        };
        let cursor = runs_cursor(&request.page_token)?;
        let rows = self
            .coordinator
            .list_runs(&caller.namespace, &filter, cursor, limit + 1)
            .await
            .map_err(from_coordinator)?;
        let (page, next_page_token) = keyset_page(rows, limit, |last| {
            format!("{}_{}", last.created_at.timestamp_micros(), last.id)
        });
        Ok(Response::new(ListRunsResponse {
            runs: page
                .into_iter()
                .map(|run| run_message(run, Vec::new(), &HashMap::new()))
                .collect(),
            next_page_token,
        }))
    }

    async fn count_runs(
        &self,
        request: Request<CountRunsRequest>,
    ) -> Result<Response<CountRunsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let filter = run_filter(FilterFields::from(&request))?;
        let counted = self
            .coordinator
            .count_runs(&caller.namespace, &filter)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(CountRunsResponse {
            counts: status_counts(counted.by_status),
            more: counted.more,
        }))
    }

    async fn cancel_run(
        &self,
        request: Request<CancelRunRequest>,
    ) -> Result<Response<CancelRunResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        require_run_id(&request.run_id)?;
        check_text("reason", &request.reason, MAX_TEXT_BYTES)?;
        let reason = if request.reason.is_empty() {
            "cancelled".to_owned()
        } else {
            request.reason
        };
        let run = self
            .coordinator
            .cancel_run(
                Some(&caller.namespace),
                &request.run_id,
                &reason,
                &caller.subject,
            )
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(CancelRunResponse {
            run: Some(run_message(run, Vec::new(), &HashMap::new())),
        }))
    }

    async fn retry_run(
        &self,
        request: Request<RetryRunRequest>,
    ) -> Result<Response<RetryRunResponse>, Status> {
        let caller = caller(&request)?;
        let run_id = request.into_inner().run_id;
        require_run_id(&run_id)?;
        let run = self
            .coordinator
            .retry_run(Some(&caller.namespace), &run_id, &caller.subject)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(RetryRunResponse {
            run: Some(run_message(run, Vec::new(), &HashMap::new())),
        }))
    }

    async fn pause_run(
        &self,
        request: Request<PauseRunRequest>,
    ) -> Result<Response<PauseRunResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let run_id = parse_run_id(&request.run_id)?;
        check_text("reason", &request.reason, MAX_TEXT_BYTES)?;
        let (run, _) = self
            .coordinator
            .pause_run(
                Some(&caller.namespace),
                run_id,
                &request.reason,
                &caller.subject,
            )
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(PauseRunResponse {
            run: Some(run_message(run, Vec::new(), &HashMap::new())),
        }))
    }

    async fn resume_run(
        &self,
        request: Request<ResumeRunRequest>,
    ) -> Result<Response<ResumeRunResponse>, Status> {
        let caller = caller(&request)?;
        let run_id = parse_run_id(&request.into_inner().run_id)?;
        let (run, _) = self
            .coordinator
            .resume_run(Some(&caller.namespace), run_id, &caller.subject)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(ResumeRunResponse {
            run: Some(run_message(run, Vec::new(), &HashMap::new())),
        }))
    }

    async fn bulk_cancel_runs(
        &self,
        request: Request<BulkCancelRunsRequest>,
    ) -> Result<Response<BulkCancelRunsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let fields = BulkFields {
            filter: request.filter.as_ref(),
            all: request.all,
            reason: &request.reason,
            request_id: &request.request_id,
            migration: None,
        };
        let (operation, created) =
            bulk::start(&self.coordinator, caller, BulkKind::Cancel, fields).await?;
        Ok(Response::new(BulkCancelRunsResponse {
            operation: Some(operation),
            created,
        }))
    }

    async fn bulk_retry_runs(
        &self,
        request: Request<BulkRetryRunsRequest>,
    ) -> Result<Response<BulkRetryRunsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let fields = BulkFields {
            filter: request.filter.as_ref(),
            all: request.all,
            reason: "",
            request_id: &request.request_id,
            migration: None,
        };
        let (operation, created) =
            bulk::start(&self.coordinator, caller, BulkKind::Retry, fields).await?;
        Ok(Response::new(BulkRetryRunsResponse {
            operation: Some(operation),
            created,
        }))
    }

    async fn bulk_pause_runs(
        &self,
        request: Request<BulkPauseRunsRequest>,
    ) -> Result<Response<BulkPauseRunsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let fields = BulkFields {
            filter: request.filter.as_ref(),
            all: request.all,
            reason: &request.reason,
            request_id: &request.request_id,
            migration: None,
        };
        let (operation, created) =
            bulk::start(&self.coordinator, caller, BulkKind::Pause, fields).await?;
        Ok(Response::new(BulkPauseRunsResponse {
            operation: Some(operation),
            created,
        }))
    }

    async fn bulk_resume_runs(
        &self,
        request: Request<BulkResumeRunsRequest>,
    ) -> Result<Response<BulkResumeRunsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let fields = BulkFields {
            filter: request.filter.as_ref(),
            all: request.all,
            reason: "",
            request_id: &request.request_id,
            migration: None,
        };
        let (operation, created) =
            bulk::start(&self.coordinator, caller, BulkKind::Resume, fields).await?;
        Ok(Response::new(BulkResumeRunsResponse {
            operation: Some(operation),
            created,
        }))
    }

    async fn migrate_runs(
        &self,
        request: Request<MigrateRunsRequest>,
    ) -> Result<Response<MigrateRunsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let migration = bulk::migration(&self.coordinator, &caller.namespace, &request).await?;
        // only runs in flight move: without statuses, the walk need not
        // lock every ended run of the workflow to skip it
        let mut filter = request.filter.clone().unwrap_or_default();
        if filter.statuses.is_empty() {
            filter.statuses = vec![RunStatus::Running as i32, RunStatus::Paused as i32];
        }
        let fields = BulkFields {
            filter: Some(&filter),
            all: false,
            reason: "",
            request_id: &request.request_id,
            migration: Some(migration),
        };
        let (operation, created) =
            bulk::start(&self.coordinator, caller, BulkKind::Migrate, fields).await?;
        Ok(Response::new(MigrateRunsResponse {
            operation: Some(operation),
            created,
        }))
    }

    async fn get_bulk_operation(
        &self,
        request: Request<GetBulkOperationRequest>,
    ) -> Result<Response<GetBulkOperationResponse>, Status> {
        let caller = caller(&request)?;
        let id = bulk::parse_operation_id(&request.into_inner().operation_id)?;
        let op = self
            .coordinator
            .get_bulk_operation(&caller.namespace, id)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(GetBulkOperationResponse {
            operation: Some(bulk::operation_message(op)),
        }))
    }

    async fn list_bulk_operations(
        &self,
        request: Request<ListBulkOperationsRequest>,
    ) -> Result<Response<ListBulkOperationsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let limit = page_size(request.page_size)?;
        let cursor = runs_cursor(&request.page_token)?;
        let rows = self
            .coordinator
            .list_bulk_operations(&caller.namespace, cursor, limit + 1)
            .await
            .map_err(from_coordinator)?;
        let more = rows.len() as i64 > limit;
        let operations: Vec<_> = rows
            .into_iter()
            .take(limit as usize)
            .map(bulk::operation_message)
            .collect();
        let next_page_token = bulk::next_token(more, operations.last());
        Ok(Response::new(ListBulkOperationsResponse {
            operations,
            next_page_token,
        }))
    }

    async fn cancel_bulk_operation(
        &self,
        request: Request<CancelBulkOperationRequest>,
    ) -> Result<Response<CancelBulkOperationResponse>, Status> {
        let caller = caller(&request)?;
        let id = bulk::parse_operation_id(&request.into_inner().operation_id)?;
        let op = self
            .coordinator
            .cancel_bulk_operation(&caller.namespace, id)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(CancelBulkOperationResponse {
            operation: Some(bulk::operation_message(op)),
        }))
    }

    async fn send_event(
        &self,
        request: Request<SendEventRequest>,
    ) -> Result<Response<SendEventResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        check_name("event_name", &request.event_name)?;
        check_text("request_id", &request.request_id, MAX_KEY_BYTES)?;
        let target = match request.target {
            Some(Target::RunId(id)) => {
                require_run_id(&id)?;
                EventTarget::Run(
                    Uuid::parse_str(&id)
                        .map_err(|_| Status::not_found(format!("run {id} not found")))?,
                )
            }
            Some(Target::CorrelationKey(key)) if !key.is_empty() => {
                check_text("correlation_key", &key, MAX_KEY_BYTES)?;
                EventTarget::Correlation(key)
            }
            _ => return Err(invalid_field("target", "set run_id or correlation_key")),
        };
        let payload = to_json(request.payload, "payload")?;
        let request_id = Some(request.request_id.as_str()).filter(|r| !r.is_empty());
        let result = self
            .coordinator
            .send_event(
                &caller.namespace,
                target,
                &request.event_name,
                payload,
                request_id,
                &caller.subject,
            )
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(SendEventResponse {
            delivered_run_ids: result.delivered.iter().map(Uuid::to_string).collect(),
            stored: result.stored,
        }))
    }

    async fn get_run_history(
        &self,
        request: Request<GetRunHistoryRequest>,
    ) -> Result<Response<GetRunHistoryResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        require_run_id(&request.run_id)?;
        let limit = page_size(request.page_size)?;
        let after: i64 = page_token(&request.page_token, |token| token.parse().ok())?.unwrap_or(0);
        let rows = self
            .coordinator
            .history(Some(&caller.namespace), &request.run_id, after, limit + 1)
            .await
            .map_err(from_coordinator)?;
        let (page, next_page_token) = keyset_page(rows, limit, |last| last.seq.to_string());
        Ok(Response::new(GetRunHistoryResponse {
            events: page.into_iter().map(history_message).collect(),
            next_page_token,
        }))
    }

    async fn watch_run(
        &self,
        request: Request<WatchRunRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let caller = caller(&request)?;
        let run_id = request.into_inner().run_id;
        require_run_id(&run_id)?;
        // the run must exist in the caller's namespace before the stream opens
        let run = self
            .coordinator
            .get_run(Some(&caller.namespace), &run_id, false)
            .await
            .map_err(from_coordinator)?
            .run;
        let follower = Follower {
            watch: self.changes.watch(&self.coordinator, &run),
            coordinator: self.coordinator.clone(),
            namespace: caller.namespace,
            run_id,
            sent_seq: 0,
            behind: false,
            ended: false,
            in_flight: None,
            draining: self.draining.clone(),
        };
        // the innermost layer sends the frames as they are (decision 0035)
        let slot = WatchSlot::new(follower.into_frames());
        let mut response = Response::new(slot.messages());
        response.extensions_mut().insert(slot);
        Ok(response)
    }
}

/// One WatchRun stream. It waits on its run's snapshot, read once for
/// every stream of the run on this server (decision 0035). While it is in
/// step (it sent everything before the snapshot) it sends the snapshot's
/// one shared encoding. Out of step (it joined after the snapshot's
/// events, or skipped snapshots) it builds a message of its own, reading
/// from Postgres the history the snapshot does not carry. It makes a
/// message only when the connection asks for one, so a slow client skips
/// to the latest snapshot instead of queueing each.
struct Follower {
    watch: RunWatch,
    coordinator: Coordinator,
    namespace: String,
    run_id: String,
    /// The sequence number of the last history event sent.
    sent_seq: i64,
    /// The last message carried a full page of history: more may wait.
    behind: bool,
    /// The snapshot with a final status, or an error, went out.
    ended: bool,
    /// The last message's share of the server's send budget, held until
    /// the connection asks for the next one.
    in_flight: Option<SendPermit>,
    /// Flips to true when the server drains.
    draining: tokio::sync::watch::Receiver<bool>,
}

impl Follower {
    fn into_frames(self) -> Frames {
        Box::pin(futures::stream::unfold(self, |mut follower| async move {
            let frame = follower.next_frame().await?;
            Some((frame, follower))
        }))
    }

    /// The next message as a gRPC frame, None once the stream is over.
    async fn next_frame(&mut self) -> Option<Result<Bytes, Status>> {
        // asked again: the connection took the last message
        self.in_flight = None;
        if self.ended {
            return None;
        }
        let frame = self.build_frame().await;
        if frame.is_err() {
            self.ended = true;
        }
        Some(frame)
    }

    async fn build_frame(&mut self) -> Result<Bytes, Status> {
        let snapshot = self.next_snapshot().await?;
        if !self.behind && self.sent_seq == snapshot.after_seq {
            let frame = shared_frame(&snapshot)?;
            self.sent(&snapshot, &snapshot.events);
            return Ok(frame);
        }
        let read;
        let events = match self.shared_events(&snapshot) {
            Some(shared) => shared,
            None => {
                read = self.read_events().await?;
                &read[..]
            }
        };
        let bytes = snapshot.view_bytes + history_bytes(events);
        self.in_flight = Some(self.watch.admit(bytes).await);
        let frame = grpc_frame(&WatchRunResponse {
            run: Some(snapshot_message(&snapshot.view)),
            events: events.iter().cloned().map(history_message).collect(),
        })?;
        self.sent(&snapshot, events);
        Ok(Bytes::from(frame))
    }

    /// Notes that `snapshot` went out with `events`.
    fn sent(&mut self, snapshot: &RunSnapshot, events: &[HistoryRow]) {
        self.behind = i64::try_from(events.len()).unwrap_or(i64::MAX) >= HISTORY_PAGE;
        if let Some(last) = events.last() {
            self.sent_seq = last.seq;
        }
        self.ended = snapshot.has_ended();
    }

    /// The snapshot to send next: while history is left to send the latest
    /// one at once, otherwise the next one to come.
    async fn next_snapshot(&mut self) -> Result<Arc<RunSnapshot>, Status> {
        let state = if self.behind {
            self.watch.current()
        } else {
            let (watch, draining) = (&mut self.watch, &mut self.draining);
            tokio::select! {
                state = watch.next() => state,
                _ = async { draining.wait_for(|d| *d).await.is_ok() } => {
                    // a watch must not hold a stopping server open: the
                    // client reconnects to another server and resumes
                    return Err(Status::unavailable(
                        "the server is shutting down; watch again",
                    ));
                }
            }
        };
        match state {
            Some(Watched::Snapshot(snapshot)) => Ok(snapshot),
            Some(Watched::Gone) => Err(from_coordinator(CoordinatorError::RunNotFound(
                self.run_id.clone(),
            ))),
            None => Err(Status::unavailable(
                "the server stopped following the run; watch again",
            )),
        }
    }

    /// The history events after the last one sent, when the shared
    /// snapshot reaches back that far.
    fn shared_events<'a>(&self, snapshot: &'a RunSnapshot) -> Option<&'a [HistoryRow]> {
        if self.behind {
            return None;
        }
        snapshot.events_after(self.sent_seq)
    }

    /// The history events after the last one sent, read for this stream.
    async fn read_events(&self) -> Result<Vec<HistoryRow>, Status> {
        self.coordinator
            .history(
                Some(&self.namespace),
                &self.run_id,
                self.sent_seq,
                HISTORY_PAGE,
            )
            .await
            .map_err(from_coordinator)
    }
}

/// The snapshot with all its events, as the one frame every stream in step
/// sends: encoded by the first of them, then shared.
fn shared_frame(snapshot: &RunSnapshot) -> Result<Bytes, Status> {
    if let Some(encoded) = snapshot.message.get() {
        return Ok(Bytes::from_owner(Arc::clone(encoded)));
    }
    let frame = grpc_frame(&WatchRunResponse {
        run: Some(snapshot_message(&snapshot.view)),
        events: snapshot
            .events
            .iter()
            .cloned()
            .map(history_message)
            .collect(),
    })?;
    let encoded = snapshot.message.get_or_init(move || Arc::from(frame));
    Ok(Bytes::from_owner(Arc::clone(encoded)))
}

/// A shared snapshot's run as the API's.
fn snapshot_message(view: &RunView) -> Run {
    run_message(view.run.clone(), view.nodes.clone(), &view.node_types)
}

/// A StartRun's priority: 0 is the default.
fn start_priority(priority: i32) -> Result<i16, Status> {
    match priority {
        0 => Ok(composer_coordinator::dispatch::streams::DEFAULT_PRIORITY),
        p if (1..=5).contains(&p) => Ok(i16::try_from(p).unwrap_or_default()),
        p => Err(invalid_field(
            "priority",
            format!("{p} is not a priority: 0 (the default, 3) or 1 (lowest) to 5 (highest)"),
        )),
    }
}
