//! ReplayRun and CheckWorkflowVersion (`WorkflowService`): the request
//! read and bounded, the verdicts as messages.

use composer_coordinator::{
    Coordinator,
    versions::{Check, CheckScope, NewDefinition, RunVerdict},
};
use composer_proto::v1::{
    CheckScope as ProtoScope, CheckWorkflowVersionRequest, CheckWorkflowVersionResponse,
    ReplayRunRequest, ReplayRunResponse, ReplayVerdict, RunReplay, replay_run_request::Recorded,
};
use tonic::Status;

use crate::{
    caller::Caller,
    recorded::{node_mapping, replay_message},
    services::{
        run::{parse_run_id, runs_cursor},
        run_fields::run_status,
    },
    status::{
        MAX_KEY_BYTES, check_name, check_source, check_text, from_coordinator, invalid_field,
    },
};

/// Runs one CheckWorkflowVersion call replays: default and ceiling.
const DEFAULT_CHECK_PAGE: i64 = 200;
const MAX_CHECK_PAGE: i64 = 500;
/// History entries a ReplayRun may carry.
const MAX_GIVEN_ENTRIES: usize = 100_000;

/// The new definition: `source` text or a registered `version`.
fn new_definition(source: String, version: i32) -> Result<NewDefinition, Status> {
    if !source.trim().is_empty() {
        check_source(&source)?;
        return Ok(NewDefinition::Source(source));
    }
    match version {
        v if v > 0 => Ok(NewDefinition::Version(v)),
        0 => Err(invalid_field(
            "source",
            "give the new definition's text, or a registered version",
        )),
        _ => Err(invalid_field("version", "must be positive")),
    }
}

/// ReplayRun.
pub(crate) async fn replay_run(
    coordinator: &Coordinator,
    caller: &Caller,
    request: ReplayRunRequest,
) -> Result<ReplayRunResponse, Status> {
    let new = new_definition(request.source, request.version)?;
    let mapping = node_mapping(&request.node_mapping)?;
    let replay = match request.recorded {
        Some(Recorded::RunId(run_id)) => {
            let run_id = parse_run_id(&run_id)?;
            let verdict = coordinator
                .replay_run(&caller.namespace, run_id, &new, &mapping)
                .await
                .map_err(from_coordinator)?;
            run_replay(&verdict)
        }
        Some(Recorded::History(history)) => {
            if history.events.len() > MAX_GIVEN_ENTRIES {
                return Err(invalid_field(
                    "history.events",
                    format!(
                        "holds {} entries, over the limit of {MAX_GIVEN_ENTRIES}",
                        history.events.len()
                    ),
                ));
            }
            let run = history.run.unwrap_or_default();
            let workflow = history.workflow.unwrap_or_default();
            if workflow.source.trim().is_empty() {
                return Err(invalid_field(
                    "history.workflow.source",
                    "the definition the run ran on is needed",
                ));
            }
            let recorded = crate::recorded::recorded_run(&run, &history.events)
                .map_err(|e| invalid_field("history", e.to_string()))?;
            let outcome = coordinator
                .replay_recorded(
                    &caller.namespace,
                    &workflow.source,
                    recorded,
                    &new,
                    &mapping,
                )
                .await
                .map_err(from_coordinator)?;
            replay_message(&run.run_id, workflow.version, run.status, &outcome)
        }
        None => return Err(invalid_field("run_id", "name a run, or give its history")),
    };
    Ok(ReplayRunResponse {
        replay: Some(replay),
    })
}

/// CheckWorkflowVersion.
pub(crate) async fn check_workflow_version(
    coordinator: &Coordinator,
    caller: &Caller,
    request: CheckWorkflowVersionRequest,
) -> Result<CheckWorkflowVersionResponse, Status> {
    check_name("name", &request.name)?;
    let new = new_definition(request.source, request.version)?;
    let mapping = node_mapping(&request.node_mapping)?;
    let scope = match ProtoScope::try_from(request.scope) {
        Ok(ProtoScope::Unspecified | ProtoScope::InFlight) => CheckScope::InFlight,
        Ok(ProtoScope::Completed) => CheckScope::Completed,
        Err(_) => return Err(invalid_field("scope", "unknown scope")),
    };
    let limit = match request.page_size {
        0 => DEFAULT_CHECK_PAGE,
        n if n < 0 => return Err(invalid_field("page_size", "must not be negative")),
        n => i64::from(n).min(MAX_CHECK_PAGE),
    };
    check_text("page_token", &request.page_token, MAX_KEY_BYTES)?;
    let cursor = runs_cursor(&request.page_token)?;
    let (verdicts, next) = coordinator
        .check_workflow_version(
            &caller.namespace,
            Check {
                name: &request.name,
                new: &new,
                mapping: &mapping,
                scope,
            },
            cursor,
            limit,
        )
        .await
        .map_err(from_coordinator)?;
    let mut response = CheckWorkflowVersionResponse {
        checked: i32::try_from(verdicts.len()).unwrap_or(i32::MAX),
        next_page_token: next
            .map(|(time, id)| format!("{}_{id}", time.timestamp_micros()))
            .unwrap_or_default(),
        ..CheckWorkflowVersionResponse::default()
    };
    for verdict in &verdicts {
        let replay = run_replay(verdict);
        match replay.verdict() {
            ReplayVerdict::Identical => response.identical += 1,
            ReplayVerdict::Compatible => response.compatible += 1,
            ReplayVerdict::Incompatible => response.incompatible += 1,
            ReplayVerdict::Unreplayable | ReplayVerdict::Unspecified => {
                response.unreplayable += 1;
            }
        }
        if replay.verdict() != ReplayVerdict::Identical {
            response.runs.push(replay);
        }
    }
    Ok(response)
}

fn run_replay(verdict: &RunVerdict) -> RunReplay {
    replay_message(
        &verdict.run.id.to_string(),
        verdict.run.workflow_version,
        run_status(&verdict.run.status) as i32,
        &verdict.outcome,
    )
}
