//! `composer run bulk-cancel|bulk-retry|bulk-pause|bulk-resume|migrate`
//! and `composer operation get|list|cancel`: bulk operations on runs,
//! started by a `run list` filter and followed until they end.

use std::{collections::HashMap, time::Duration};

use clap::{Args, Subcommand};
use composer_proto::v1::{
    BulkCancelRunsRequest, BulkOperation, BulkOperationKind, BulkOperationStatus,
    BulkPauseRunsRequest, BulkResumeRunsRequest, BulkRetryRunsRequest, CancelBulkOperationRequest,
    GetBulkOperationRequest, ListBulkOperationsRequest, ListBulkOperationsResponse,
    MigrateRunsRequest, RunFilter, RunStatus,
};

use super::{
    AdminError, Api, ClientArgs, Format,
    output::{Table, fields, labels, print_json, print_text, run_status, time},
    parse_label,
    status::StatusFilter,
    workflow::{PageArgs, more, page_size},
};

/// How often `--wait` asks for the operation.
const WAIT_POLL: Duration = Duration::from_secs(1);

/// The filter and options of `run bulk-*`.
#[derive(Debug, Clone, Args)]
pub struct BulkArgs {
    /// Only runs of this workflow.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub workflow: String,
    /// Only runs of this version of --workflow.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    pub version: i32,
    /// Only runs in this status; repeatable (any of them).
    #[arg(long = "status", value_enum)]
    pub statuses: Vec<StatusFilter>,
    /// Only runs carrying this label `key=value`; repeatable (all of them).
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Only child runs of this run.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub parent: String,
    /// Only runs created within this long before now, e.g. `90s`, `15m`, `24h`.
    #[arg(long, value_parser = crate::config::parse_duration)]
    pub since: Option<Duration>,
    /// Act on every run of the namespace (required when no filter is given).
    #[arg(long)]
    pub all: bool,
    /// Start at most one operation per id: a repeat prints the first one.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub request_id: String,
    /// Print progress until the operation ends; exit 1 unless it SUCCEEDED.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `run bulk-cancel` and `run bulk-pause`: a filter and a reason.
#[derive(Debug, Clone, Args)]
pub struct BulkWithReasonArgs {
    /// Why, recorded in each run's history.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub reason: String,
    #[command(flatten)]
    pub bulk: BulkArgs,
}

/// `run migrate`: the runs of one workflow moved to another version.
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    /// The version to move the runs to.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub to_version: i32,
    /// A node renamed in the target version, `OLD=NEW` (repeat for more).
    #[arg(long = "map", value_name = "OLD=NEW")]
    pub map: Vec<String>,
    #[command(flatten)]
    pub bulk: BulkArgs,
}

/// The operation commands.
#[derive(Debug, Clone, Subcommand)]
pub enum OperationCommand {
    /// Show a bulk operation's progress and counts.
    Get(OperationIdArgs),
    /// List the namespace's bulk operations, newest first.
    List(OperationListArgs),
    /// Stop a bulk operation after the run it is on.
    Cancel(OperationIdArgs),
}

/// A command about one operation.
#[derive(Debug, Clone, Args)]
pub struct OperationIdArgs {
    /// The operation's id.
    pub operation_id: String,
    /// Print progress until the operation ends; exit 1 unless it SUCCEEDED.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `operation list`.
#[derive(Debug, Clone, Args)]
pub struct OperationListArgs {
    #[command(flatten)]
    pub page: PageArgs,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// What a `run bulk-*` command asks for.
#[derive(Debug, Clone)]
pub enum BulkAction {
    /// bulk-cancel.
    Cancel,
    /// bulk-retry.
    Retry,
    /// bulk-pause.
    Pause,
    /// bulk-resume.
    Resume,
    /// migrate: to this version, with these renames.
    Migrate {
        to_version: i32,
        node_mapping: HashMap<String, String>,
    },
}

impl BulkAction {
    /// `run migrate`'s action; a usage error for a malformed `--map`.
    pub fn migrate(args: &MigrateArgs) -> Result<BulkAction, AdminError> {
        let mapping =
            composer_engine::replay::NodeMapping::parse(args.map.iter().map(String::as_str))
                .map_err(|e| AdminError::Usage(format!("--map {e}")))?;
        Ok(BulkAction::Migrate {
            to_version: args.to_version,
            node_mapping: mapping
                .pairs()
                .map(|(from, to)| (from.to_owned(), to.to_owned()))
                .collect(),
        })
    }
}

fn filter(args: &BulkArgs) -> RunFilter {
    RunFilter {
        workflow_name: args.workflow.clone(),
        workflow_version: args.version,
        statuses: args
            .statuses
            .iter()
            .map(|s| RunStatus::from(*s) as i32)
            .collect(),
        labels: args.labels.iter().cloned().collect::<HashMap<_, _>>(),
        create_time_after: args.since.map(ago),
        create_time_before: None,
        parent_run_id: args.parent.clone(),
        search: String::new(),
    }
}

/// The time `duration` before now.
fn ago(duration: Duration) -> prost_types::Timestamp {
    let then = std::time::SystemTime::now()
        .checked_sub(duration)
        .unwrap_or(std::time::UNIX_EPOCH);
    prost_types::Timestamp::from(then)
}

/// Starts a bulk operation, then prints it (or follows it with --wait).
pub async fn start(action: BulkAction, args: BulkArgs, reason: String) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let filter = Some(filter(&args));
    let (all, request_id) = (args.all, args.request_id.clone());
    let (operation, created) = match action {
        BulkAction::Cancel => {
            let r = api
                .runs
                .bulk_cancel_runs(BulkCancelRunsRequest {
                    filter,
                    all,
                    reason,
                    request_id,
                })
                .await?
                .into_inner();
            (r.operation, r.created)
        }
        BulkAction::Retry => {
            let r = api
                .runs
                .bulk_retry_runs(BulkRetryRunsRequest {
                    filter,
                    all,
                    request_id,
                })
                .await?
                .into_inner();
            (r.operation, r.created)
        }
        BulkAction::Pause => {
            let r = api
                .runs
                .bulk_pause_runs(BulkPauseRunsRequest {
                    filter,
                    all,
                    reason,
                    request_id,
                })
                .await?
                .into_inner();
            (r.operation, r.created)
        }
        BulkAction::Resume => {
            let r = api
                .runs
                .bulk_resume_runs(BulkResumeRunsRequest {
                    filter,
                    all,
                    request_id,
                })
                .await?
                .into_inner();
            (r.operation, r.created)
        }
        BulkAction::Migrate {
            to_version,
            node_mapping,
        } => {
            let r = api
                .runs
                .migrate_runs(MigrateRunsRequest {
                    filter,
                    target_version: to_version,
                    node_mapping,
                    request_id,
                })
                .await?
                .into_inner();
            (r.operation, r.created)
        }
    };
    let operation = operation.unwrap_or_default();
    if args.client.output == Format::Table {
        let what = if created {
            "started"
        } else {
            "already started (same request id)"
        };
        eprintln!(
            "operation {} {what}: {} matched",
            operation.operation_id, operation.matched
        );
    }
    finish(&mut api, operation, args.wait, args.client.output).await
}

/// Runs one operation command.
pub async fn run(command: OperationCommand) -> Result<(), AdminError> {
    match command {
        OperationCommand::Get(args) => {
            let mut api = Api::connect(&args.client.connect).await?;
            let operation = get(&mut api, &args.operation_id).await?;
            finish(&mut api, operation, args.wait, args.client.output).await
        }
        OperationCommand::List(args) => list(args).await,
        OperationCommand::Cancel(args) => {
            let mut api = Api::connect(&args.client.connect).await?;
            let operation = api
                .runs
                .cancel_bulk_operation(CancelBulkOperationRequest {
                    operation_id: args.operation_id,
                })
                .await?
                .into_inner()
                .operation
                .unwrap_or_default();
            finish(&mut api, operation, args.wait, args.client.output).await
        }
    }
}

async fn get(api: &mut Api, id: &str) -> Result<BulkOperation, AdminError> {
    Ok(api
        .runs
        .get_bulk_operation(GetBulkOperationRequest {
            operation_id: id.to_owned(),
        })
        .await?
        .into_inner()
        .operation
        .unwrap_or_default())
}

fn has_ended(operation: &BulkOperation) -> bool {
    !matches!(
        operation.status(),
        BulkOperationStatus::Pending | BulkOperationStatus::Running
    )
}

/// Prints the operation; with `wait`, a progress line on standard error
/// each second until it ends, then the operation and its outcome.
async fn finish(
    api: &mut Api,
    mut operation: BulkOperation,
    wait: bool,
    format: Format,
) -> Result<(), AdminError> {
    if wait {
        while !has_ended(&operation) {
            eprintln!("{}", progress(&operation));
            tokio::time::sleep(WAIT_POLL).await;
            operation = get(api, &operation.operation_id).await?;
        }
    }
    match format {
        Format::Json => print_json(&operation)?,
        Format::Table => print_text(&describe(&operation))?,
    }
    if !wait || operation.status() == BulkOperationStatus::Succeeded {
        return Ok(());
    }
    Err(AdminError::OperationNotSucceeded {
        operation_id: operation.operation_id.clone(),
        status: status_name(operation.status),
    })
}

fn progress(operation: &BulkOperation) -> String {
    let done = operation.succeeded + operation.skipped + operation.failed;
    format!(
        "{} {done}/{} (succeeded {}, skipped {}, failed {})",
        status_name(operation.status),
        operation.matched,
        operation.succeeded,
        operation.skipped,
        operation.failed
    )
}

fn status_name(status: i32) -> &'static str {
    match BulkOperationStatus::try_from(status) {
        Ok(BulkOperationStatus::Pending) => "PENDING",
        Ok(BulkOperationStatus::Running) => "RUNNING",
        Ok(BulkOperationStatus::Succeeded) => "SUCCEEDED",
        Ok(BulkOperationStatus::Cancelled) => "CANCELLED",
        Ok(BulkOperationStatus::Failed) => "FAILED",
        _ => "UNSPECIFIED",
    }
}

fn kind_name(kind: i32) -> &'static str {
    match BulkOperationKind::try_from(kind) {
        Ok(BulkOperationKind::Cancel) => "cancel",
        Ok(BulkOperationKind::Retry) => "retry",
        Ok(BulkOperationKind::Pause) => "pause",
        Ok(BulkOperationKind::Resume) => "resume",
        Ok(BulkOperationKind::Migrate) => "migrate",
        _ => "unspecified",
    }
}

/// The filter as `run list` flags would give it.
fn describe_filter(filter: Option<&RunFilter>) -> String {
    let Some(f) = filter else {
        return String::new();
    };
    let mut parts = Vec::new();
    if !f.workflow_name.is_empty() {
        parts.push(format!("workflow={}", f.workflow_name));
    }
    if f.workflow_version > 0 {
        parts.push(format!("version={}", f.workflow_version));
    }
    for status in &f.statuses {
        parts.push(format!("status={}", run_status(*status)));
    }
    if !f.labels.is_empty() {
        parts.push(labels(&f.labels));
    }
    if !f.parent_run_id.is_empty() {
        parts.push(format!("parent={}", f.parent_run_id));
    }
    if f.create_time_after.is_some() {
        parts.push(format!("since={}", time(f.create_time_after.as_ref())));
    }
    if parts.is_empty() {
        return "(all runs)".to_owned();
    }
    parts.join(" ")
}

/// A migration's target version and renames; empty for other kinds.
fn describe_target(operation: &BulkOperation) -> String {
    if operation.target_version == 0 {
        return String::new();
    }
    let mut renames: Vec<String> = operation
        .node_mapping
        .iter()
        .map(|(from, to)| format!("{from}={to}"))
        .collect();
    renames.sort();
    if renames.is_empty() {
        return operation.target_version.to_string();
    }
    format!(
        "{} (renamed {})",
        operation.target_version,
        renames.join(" ")
    )
}

fn describe(operation: &BulkOperation) -> String {
    let mut pairs = vec![
        ("operation", operation.operation_id.clone()),
        ("kind", kind_name(operation.kind).to_owned()),
        ("status", status_name(operation.status).to_owned()),
        ("filter", describe_filter(operation.filter.as_ref())),
        ("reason", operation.reason.clone()),
        ("to version", describe_target(operation)),
        ("matched", operation.matched.to_string()),
        ("succeeded", operation.succeeded.to_string()),
        ("skipped", operation.skipped.to_string()),
        ("failed", operation.failed.to_string()),
        ("created by", operation.created_by.clone()),
        ("created", time(operation.create_time.as_ref())),
        ("ended", time(operation.end_time.as_ref())),
        ("error", operation.error.clone()),
    ];
    pairs.retain(|(_, v)| !v.is_empty());
    let mut text = fields(&pairs);
    if !operation.failures.is_empty() {
        let mut table = Table::new(&["FAILED RUN", "WHY"]);
        for failure in &operation.failures {
            table.row(vec![failure.run_id.clone(), failure.message.clone()]);
        }
        text.push('\n');
        text.push_str(&table.render());
    }
    text
}

async fn list(args: OperationListArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let mut all = ListBulkOperationsResponse {
        next_page_token: args.page.page_token,
        ..Default::default()
    };
    let limit = args.page.limit as usize;
    loop {
        let page = api
            .runs
            .list_bulk_operations(ListBulkOperationsRequest {
                page_size: page_size(limit - all.operations.len()),
                page_token: all.next_page_token.clone(),
            })
            .await?
            .into_inner();
        all.operations.extend(page.operations);
        all.next_page_token = page.next_page_token;
        if all.next_page_token.is_empty() || all.operations.len() >= limit {
            break;
        }
    }
    if args.client.output == Format::Json {
        return print_json(&all);
    }
    let mut table = Table::new(&[
        "OPERATION",
        "KIND",
        "STATUS",
        "MATCHED",
        "SUCCEEDED",
        "SKIPPED",
        "FAILED",
        "CREATED",
    ]);
    for op in &all.operations {
        table.row(vec![
            op.operation_id.clone(),
            kind_name(op.kind).to_owned(),
            status_name(op.status).to_owned(),
            op.matched.to_string(),
            op.succeeded.to_string(),
            op.skipped.to_string(),
            op.failed.to_string(),
            time(op.create_time.as_ref()),
        ]);
    }
    print_text(&table.render())?;
    more(&all.next_page_token)
}
