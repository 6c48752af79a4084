//! The bulk operations of `RunService`: checks and messages. The handlers
//! in `run.rs` call these, then the coordinator once.

use composer_coordinator::{
    Coordinator, CoordinatorError,
    events::{
        bulk::{BulkKind, BulkRequest},
        migrate::Migration,
    },
};
use composer_proto::v1::{
    BulkOperation, BulkOperationFailure, BulkOperationKind, BulkOperationStatus,
    MigrateRunsRequest, RunFilter as ApiFilter,
};
use composer_store::{bulk::BulkOperationRow, runs::RunFilter};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};
use uuid::Uuid;

use crate::{
    caller::Caller,
    convert::timestamp,
    status::{
        MAX_KEY_BYTES, MAX_TEXT_BYTES, check_name, check_text, from_coordinator, invalid_field,
    },
};

use super::run_fields::{FilterFields, api_status, run_filter, status_filter};

/// A MigrateRuns request's target, checked against the workflow its
/// filter names: `filter.workflow_name` is required, `target_version` must
/// be registered, and every rename must land on a node of the target
/// (and leave one the target does not have).
pub(crate) async fn migration(
    coordinator: &Coordinator,
    namespace: &str,
    request: &MigrateRunsRequest,
) -> Result<Migration, Status> {
    let name = request
        .filter
        .as_ref()
        .map(|f| f.workflow_name.as_str())
        .unwrap_or_default();
    if name.is_empty() {
        return Err(invalid_field(
            "filter.workflow_name",
            "names the workflow whose runs move; required",
        ));
    }
    check_name("filter.workflow_name", name)?;
    if request.target_version <= 0 {
        return Err(invalid_field("target_version", "must be positive"));
    }
    let mapping = crate::recorded::node_mapping(&request.node_mapping)?;
    let target = match coordinator
        .workflows()
        .get(
            coordinator.store(),
            namespace,
            name,
            Some(request.target_version),
        )
        .await
    {
        Ok(target) => target,
        Err(CoordinatorError::WorkflowNotFound { .. }) => {
            return Err(invalid_field(
                "target_version",
                format!(
                    "the filter's workflow has no version {}",
                    request.target_version
                ),
            ));
        }
        Err(error) => return Err(from_coordinator(error)),
    };
    for (from, to) in mapping.pairs() {
        if !target.compiled.contains(to) {
            return Err(invalid_field(
                "node_mapping",
                format!(
                    "{from}={to}: version {} has no node {to}",
                    request.target_version
                ),
            ));
        }
        if target.compiled.contains(from) {
            return Err(invalid_field(
                "node_mapping",
                format!(
                    "{from}={to}: version {} still has a node {from}; a renamed node is gone",
                    request.target_version
                ),
            ));
        }
    }
    Ok(Migration {
        target_version: request.target_version,
        mapping,
    })
}

/// What every Bulk* request carries.
pub(crate) struct BulkFields<'a> {
    pub(crate) filter: Option<&'a ApiFilter>,
    pub(crate) all: bool,
    pub(crate) reason: &'a str,
    pub(crate) request_id: &'a str,
    /// MIGRATE only, checked by [`migration`].
    pub(crate) migration: Option<Migration>,
}

/// Checks a Bulk* request as ListRuns checks its filter (field paths under
/// `filter.`) and starts the operation.
pub(crate) async fn start(
    coordinator: &Coordinator,
    caller: Caller,
    kind: BulkKind,
    fields: BulkFields<'_>,
) -> Result<(BulkOperation, bool), Status> {
    let filter = store_filter(fields.filter)?;
    check_text("reason", fields.reason, MAX_TEXT_BYTES)?;
    check_text("request_id", fields.request_id, MAX_KEY_BYTES)?;
    if filter == RunFilter::default() && !fields.all {
        return Err(Status::failed_precondition(
            "the filter is empty: it would act on every run of the namespace; set `all` to mean \
             that",
        ));
    }
    let (op, created) = coordinator
        .start_bulk_operation(BulkRequest {
            namespace: caller.namespace,
            kind,
            filter,
            reason: fields.reason.to_owned(),
            migration: fields.migration,
            request_id: Some(fields.request_id.to_owned()).filter(|r| !r.is_empty()),
            actor: caller.subject,
        })
        .await
        .map_err(from_coordinator)?;
    Ok((operation_message(op), created))
}

/// The API filter as the store's, each problem named under `filter.`.
fn store_filter(filter: Option<&ApiFilter>) -> Result<RunFilter, Status> {
    let Some(filter) = filter else {
        return Ok(RunFilter::default());
    };
    let fields = FilterFields {
        workflow_name: &filter.workflow_name,
        workflow_version: filter.workflow_version,
        labels: &filter.labels,
        create_time_after: filter.create_time_after.as_ref(),
        create_time_before: filter.create_time_before.as_ref(),
        parent_run_id: &filter.parent_run_id,
        search: &filter.search,
    };
    let statuses = status_filter(&filter.statuses).map_err(|s| under("filter", s))?;
    Ok(RunFilter {
        statuses: statuses.into_iter().map(str::to_owned).collect(),
        ..run_filter(fields).map_err(|s| under("filter", s))?
    })
}

/// An INVALID_ARGUMENT status with its field paths moved under `prefix`.
fn under(prefix: &str, status: Status) -> Status {
    if status.code() != Code::InvalidArgument {
        return status;
    }
    let Some(bad) = status.get_details_bad_request() else {
        return status;
    };
    let violations: Vec<FieldViolation> = bad
        .field_violations
        .iter()
        .map(|v| FieldViolation::new(format!("{prefix}.{}", v.field), v.description.clone()))
        .collect();
    Status::with_error_details(
        Code::InvalidArgument,
        format!("{prefix}.{}", status.message()),
        ErrorDetails::with_bad_request(violations),
    )
}

/// An operation id the caller sent: INVALID_ARGUMENT when empty or too
/// long, NOT_FOUND when it is not an id.
pub(crate) fn parse_operation_id(id: &str) -> Result<Uuid, Status> {
    if id.is_empty() {
        return Err(invalid_field("operation_id", "must not be empty"));
    }
    check_text("operation_id", id, MAX_KEY_BYTES)?;
    Uuid::parse_str(id).map_err(|_| Status::not_found(format!("bulk operation {id:?} not found")))
}

fn kind_message(kind: &str) -> BulkOperationKind {
    match BulkKind::parse(kind) {
        Some(BulkKind::Cancel) => BulkOperationKind::Cancel,
        Some(BulkKind::Retry) => BulkOperationKind::Retry,
        Some(BulkKind::Pause) => BulkOperationKind::Pause,
        Some(BulkKind::Resume) => BulkOperationKind::Resume,
        Some(BulkKind::Migrate) => BulkOperationKind::Migrate,
        None => BulkOperationKind::Unspecified,
    }
}

fn status_message(status: &str) -> BulkOperationStatus {
    match status {
        "PENDING" => BulkOperationStatus::Pending,
        "RUNNING" => BulkOperationStatus::Running,
        "SUCCEEDED" => BulkOperationStatus::Succeeded,
        "CANCELLED" => BulkOperationStatus::Cancelled,
        "FAILED" => BulkOperationStatus::Failed,
        _ => BulkOperationStatus::Unspecified,
    }
}

fn filter_message(filter: RunFilter) -> ApiFilter {
    let labels = filter
        .labels
        .as_ref()
        .and_then(|l| l.as_object())
        .map(|map| {
            map.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    ApiFilter {
        workflow_name: filter.workflow_name.unwrap_or_default(),
        workflow_version: filter.workflow_version.unwrap_or_default(),
        statuses: filter
            .statuses
            .iter()
            .map(|s| api_status(s) as i32)
            .collect(),
        labels,
        create_time_after: filter.created_after.map(timestamp),
        create_time_before: filter.created_before.map(timestamp),
        parent_run_id: filter
            .parent_run_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        search: filter.search.unwrap_or_default(),
    }
}

/// The stored operation as the API's.
pub(crate) fn operation_message(op: BulkOperationRow) -> BulkOperation {
    let failures = op
        .failures
        .as_array()
        .map(|list| {
            list.iter()
                .map(|f| BulkOperationFailure {
                    run_id: f["run_id"].as_str().unwrap_or_default().to_owned(),
                    message: f["message"].as_str().unwrap_or_default().to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    let migration = Migration::from_params(&op.params);
    BulkOperation {
        target_version: migration.as_ref().map_or(0, |m| m.target_version),
        node_mapping: migration
            .map(|m| {
                m.mapping
                    .pairs()
                    .map(|(from, to)| (from.to_owned(), to.to_owned()))
                    .collect()
            })
            .unwrap_or_default(),
        operation_id: op.id.to_string(),
        namespace: op.namespace,
        kind: kind_message(&op.kind) as i32,
        status: status_message(&op.status) as i32,
        filter: Some(filter_message(op.filter)),
        reason: op.reason,
        matched: op.matched,
        succeeded: op.succeeded,
        skipped: op.skipped,
        failed: op.failed,
        failures,
        created_by: op.created_by,
        create_time: Some(timestamp(op.created_at)),
        update_time: Some(timestamp(op.updated_at)),
        end_time: op.ended_at.map(timestamp),
        error: op.error.unwrap_or_default(),
    }
}

/// The next page's token: the last entry's keyset position.
pub(crate) fn next_token(more: bool, last: Option<&BulkOperation>) -> String {
    match (more, last) {
        (true, Some(op)) => {
            let micros = op
                .create_time
                .as_ref()
                .map_or(0, |t| t.seconds * 1_000_000 + i64::from(t.nanos / 1000));
            format!("{micros}_{}", op.operation_id)
        }
        _ => String::new(),
    }
}
