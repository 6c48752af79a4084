//! The run fields that several services check alike: labels, run
//! statuses as stored and as the API says them, and the filters ListRuns,
//! CountRuns and the bulk operations share.

use std::collections::HashMap;

use composer_proto::v1::{CountRunsRequest, ListRunsRequest, RunStatus};
use composer_store::runs::RunFilter;
use serde_json::json;
use tonic::Status;
use uuid::Uuid;

use crate::{
    convert::from_timestamp,
    status::{MAX_KEY_BYTES, check_name, check_text, invalid_field},
};

/// A stored run status as the API's.
pub(crate) fn api_status(text: &str) -> RunStatus {
    run_status(text)
}

pub(crate) fn run_status(text: &str) -> RunStatus {
    match text {
        "PENDING" | "RUNNING" => RunStatus::Running,
        "COMPENSATING" => RunStatus::Compensating,
        "COMPLETED" => RunStatus::Completed,
        "FAILED" => RunStatus::Failed,
        "CANCELLED" => RunStatus::Cancelled,
        "PAUSED" => RunStatus::Paused,
        "QUEUED" => RunStatus::Queued,
        _ => RunStatus::Unspecified,
    }
}

fn status_text(status: RunStatus) -> Option<&'static str> {
    match status {
        RunStatus::Running => Some("RUNNING"),
        RunStatus::Compensating => Some("COMPENSATING"),
        RunStatus::Completed => Some("COMPLETED"),
        RunStatus::Failed => Some("FAILED"),
        RunStatus::Cancelled => Some("CANCELLED"),
        RunStatus::Paused => Some("PAUSED"),
        RunStatus::Queued => Some("QUEUED"),
        RunStatus::Unspecified => None,
    }
}

/// Labels a run may carry.
pub(crate) const MAX_LABELS: usize = 64;

/// At most [`MAX_LABELS`]; keys follow the name rule and values are short
/// text; the field path names the key.
pub(crate) fn check_label_keys(labels: &HashMap<String, String>) -> Result<(), Status> {
    if labels.len() > MAX_LABELS {
        return Err(invalid_field(
            "labels",
            format!("{} labels; at most {MAX_LABELS} are allowed", labels.len()),
        ));
    }
    let mut keys: Vec<(&String, &String)> = labels.iter().collect();
    keys.sort();
    for (key, value) in keys {
        let field = format!("labels[{}]", clipped(key));
        composer_coordinator::names::check_name(key)
            .map_err(|problem| invalid_field(&field, problem.to_string()))?;
        check_text(&field, value, MAX_KEY_BYTES)?;
    }
    Ok(())
}

/// At most a few dozen characters of what a caller sent, quoted, for a
/// message or a field path.
pub(crate) fn clipped(text: &str) -> String {
    const MAX: usize = 40;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{:?}...", &text[..end]),
        None => format!("{text:?}"),
    }
}

/// The statuses a ListRuns asks for, as stored; each names its index.
pub(crate) fn status_filter(numbers: &[i32]) -> Result<Vec<&'static str>, Status> {
    numbers
        .iter()
        .enumerate()
        .map(|(i, &number)| {
            let field = format!("statuses[{i}]");
            let status = RunStatus::try_from(number)
                .map_err(|_| invalid_field(&field, format!("{number} is not a RunStatus")))?;
            status_text(status)
                .ok_or_else(|| invalid_field(&field, "RUN_STATUS_UNSPECIFIED matches nothing"))
        })
        .collect()
}

/// The filters ListRuns and CountRuns share, as the caller sent them.
pub(crate) struct FilterFields<'a> {
    pub(crate) workflow_name: &'a str,
    pub(crate) workflow_version: i32,
    pub(crate) labels: &'a HashMap<String, String>,
    pub(crate) create_time_after: Option<&'a prost_types::Timestamp>,
    pub(crate) create_time_before: Option<&'a prost_types::Timestamp>,
    pub(crate) parent_run_id: &'a str,
    pub(crate) search: &'a str,
}

impl<'a> From<&'a ListRunsRequest> for FilterFields<'a> {
    fn from(request: &'a ListRunsRequest) -> Self {
        Self {
            workflow_name: &request.workflow_name,
            workflow_version: request.workflow_version,
            labels: &request.labels,
            create_time_after: request.create_time_after.as_ref(),
            create_time_before: request.create_time_before.as_ref(),
            parent_run_id: &request.parent_run_id,
            search: &request.search,
        }
    }
}

impl<'a> From<&'a CountRunsRequest> for FilterFields<'a> {
    fn from(request: &'a CountRunsRequest) -> Self {
        Self {
            workflow_name: &request.workflow_name,
            workflow_version: request.workflow_version,
            labels: &request.labels,
            create_time_after: request.create_time_after.as_ref(),
            create_time_before: request.create_time_before.as_ref(),
            parent_run_id: &request.parent_run_id,
            search: &request.search,
        }
    }
}

/// Checks the shared filters (INVALID_ARGUMENT naming the field) and turns
/// them into the store's filter, with no status filter.
pub(crate) fn run_filter(fields: FilterFields<'_>) -> Result<RunFilter, Status> {
    if !fields.workflow_name.is_empty() {
        check_name("workflow_name", fields.workflow_name)?;
    }
    let workflow_version = match fields.workflow_version {
        0 => None,
        n if n < 0 => {
            return Err(invalid_field(
                "workflow_version",
                "must be 0 (any) or a version number",
            ));
        }
        _ if fields.workflow_name.is_empty() => {
            return Err(invalid_field(
                "workflow_version",
                "needs workflow_name: a version belongs to one workflow",
            ));
        }
        n => Some(n),
    };
    check_label_keys(fields.labels)?;
    check_text("search", fields.search, MAX_KEY_BYTES)?;
    let parent_run_id = match fields.parent_run_id {
        "" => None,
        id => {
            Some(Uuid::parse_str(id).map_err(|_| invalid_field("parent_run_id", "not a run id"))?)
        }
    };
    let time = |t: Option<&prost_types::Timestamp>, field| t.map(|t| from_timestamp(t, field));
    Ok(RunFilter {
        workflow_name: Some(fields.workflow_name.to_owned()).filter(|n| !n.is_empty()),
        workflow_version,
        statuses: Vec::new(),
        labels: (!fields.labels.is_empty()).then(|| json!(fields.labels)),
        created_after: time(fields.create_time_after, "create_time_after").transpose()?,
        created_before: time(fields.create_time_before, "create_time_before").transpose()?,
        parent_run_id,
        search: Some(fields.search.to_owned()).filter(|s| !s.is_empty()),
    })
}
