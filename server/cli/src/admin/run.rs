//! `composer run start|get|list|watch|history|cancel|retry|pause|resume|send-event`
//! (and the `bulk-*` commands of `bulk.rs`).

use std::{collections::HashMap, path::PathBuf};

use clap::{Args, Subcommand};
use composer_grpc::convert::from_json;
use composer_proto::v1::{
    CancelRunRequest, GetRunHistoryRequest, GetRunHistoryResponse, GetRunRequest, GetRunResponse,
    ListRunsRequest, ListRunsResponse, PauseRunRequest, ResumeRunRequest, RetryRunRequest, Run,
    RunStatus, SendEventRequest, StartRunRequest, send_event_request::Target,
};

use super::{
    AdminError, Api, ClientArgs, Format,
    bulk::{self, BulkAction, BulkArgs, BulkWithReasonArgs, MigrateArgs},
    output::{
        Table, failure, fields, labels, print_json, print_text, run_status, shorten, time, to_json,
        value,
    },
    parse_label, read_json,
    status::StatusFilter,
    watch::{self, follow, node_table, outcome},
    workflow::{PageArgs, more, page_size},
};

/// The run commands.
#[derive(Debug, Clone, Subcommand)]
pub enum RunCommand {
    /// Start a run of a workflow; with --wait, wait for its end.
    Start(StartArgs),
    /// Show a run with its nodes.
    Get(RunIdArgs),
    /// List runs, newest first.
    List(ListArgs),
    /// Show a run's nodes as they change until the run ends.
    Watch(RunIdArgs),
    /// Show a run's history, oldest first.
    History(HistoryArgs),
    /// Cancel a run (its compensations run first).
    Cancel(CancelArgs),
    /// Resume a FAILED run from its failed nodes.
    Retry(RunIdArgs),
    /// Pause a run: it dispatches nothing and fires no timer until resumed.
    Pause(PauseArgs),
    /// Resume a paused run.
    Resume(RunIdArgs),
    /// Send an event to a run, or to every run waiting on a correlation key.
    SendEvent(SendEventArgs),
    /// Cancel every run a filter matches, as a bulk operation.
    BulkCancel(BulkWithReasonArgs),
    /// Retry every FAILED run a filter matches, as a bulk operation.
    BulkRetry(BulkArgs),
    /// Pause every live run a filter matches, as a bulk operation.
    BulkPause(BulkWithReasonArgs),
    /// Resume every paused run a filter matches, as a bulk operation.
    BulkResume(BulkArgs),
    /// Move the runs in flight of a workflow to another version of it, as a
    /// bulk operation: each run is replayed against the target first and
    /// moved only if compatible (docs/versions.md).
    Migrate(MigrateArgs),
}

/// Options of `run start`.
#[derive(Debug, Clone, Args)]
pub struct StartArgs {
    /// The workflow's name.
    pub workflow: String,
    /// The workflow version; the latest when left out.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    pub version: i32,
    /// The run's input, as JSON.
    #[arg(long, conflicts_with = "input_file")]
    pub input: Option<String>,
    /// A file holding the run's input as JSON, or `-` for standard input.
    #[arg(long)]
    pub input_file: Option<PathBuf>,
    /// Start at most one run per key: a repeated start returns the first run.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub idempotency_key: String,
    /// A label `key=value`, for filtering in `run list`; repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Dispatch priority, 1 (lowest) to 5 (highest); the default is 3.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    pub priority: i32,
    /// Wait for the run to end and print it; exit 1 if it FAILED or was CANCELLED.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// A command about one run.
#[derive(Debug, Clone, Args)]
pub struct RunIdArgs {
    /// The run's id.
    pub run_id: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `run list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Only runs of this workflow.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub workflow: String,
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
    pub since: Option<std::time::Duration>,
    #[command(flatten)]
    pub page: PageArgs,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `run history`.
#[derive(Debug, Clone, Args)]
pub struct HistoryArgs {
    /// The run's id.
    pub run_id: String,
    #[command(flatten)]
    pub page: PageArgs,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `run cancel`.
#[derive(Debug, Clone, Args)]
pub struct CancelArgs {
    /// The run's id.
    pub run_id: String,
    /// Why, recorded in the history and in the run's error.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub reason: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `run pause`.
#[derive(Debug, Clone, Args)]
pub struct PauseArgs {
    /// The run's id.
    pub run_id: String,
    /// Why, recorded in the history.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub reason: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `run send-event`.
#[derive(Debug, Clone, Args)]
pub struct SendEventArgs {
    /// The event's name (a WAIT_FOR_EVENT node's `event`).
    pub event: String,
    /// The run to send it to.
    #[arg(
        required_unless_present = "correlation_key",
        conflicts_with = "correlation_key"
    )]
    pub run_id: Option<String>,
    /// Send to every run waiting on this correlation key instead.
    #[arg(long)]
    pub correlation_key: Option<String>,
    /// The payload, as JSON (the waiting node's output).
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    /// A file holding the payload as JSON, or `-` for standard input.
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// Deliver at most once per id: a repeated send delivers nothing new.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub request_id: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Runs one run command.
pub async fn run(command: RunCommand) -> Result<(), AdminError> {
    match command {
        RunCommand::Start(args) => start(args).await,
        RunCommand::Get(args) => get(args).await,
        RunCommand::List(args) => list(args).await,
        RunCommand::Watch(args) => {
            let mut api = Api::connect(&args.client.connect).await?;
            watch::watch(&mut api, &args.run_id, args.client.output).await
        }
        RunCommand::History(args) => history(args).await,
        RunCommand::Cancel(args) => cancel(args).await,
        RunCommand::Retry(args) => retry(args).await,
        RunCommand::Pause(args) => pause(args).await,
        RunCommand::Resume(args) => resume(args).await,
        RunCommand::SendEvent(args) => send_event(args).await,
        RunCommand::BulkCancel(args) => {
            bulk::start(BulkAction::Cancel, args.bulk, args.reason).await
        }
        RunCommand::BulkRetry(args) => bulk::start(BulkAction::Retry, args, String::new()).await,
        RunCommand::BulkPause(args) => bulk::start(BulkAction::Pause, args.bulk, args.reason).await,
        RunCommand::BulkResume(args) => bulk::start(BulkAction::Resume, args, String::new()).await,
        RunCommand::Migrate(args) => {
            let action = BulkAction::migrate(&args)?;
            bulk::start(action, args.bulk, String::new()).await
        }
    }
}

async fn start(args: StartArgs) -> Result<(), AdminError> {
    let input = read_json("input", args.input.as_deref(), args.input_file.as_deref())?;
    let mut api = Api::connect(&args.client.connect).await?;
    let mut response = api
        .runs
        .start_run(StartRunRequest {
            workflow_name: args.workflow,
            version: args.version,
            input: input.as_ref().map(from_json),
            idempotency_key: args.idempotency_key,
            labels: args.labels.into_iter().collect(),
            priority: args.priority,
        })
        .await?
        .into_inner();
    let run = response.run.take().unwrap_or_default();
    if !args.wait {
        response.run = Some(run);
        return match args.client.output {
            Format::Json => print_json(&response),
            Format::Table => print_text(&started_line(response.run.as_ref(), response.created)),
        };
    }
    if args.client.output == Format::Table {
        eprint!("{}", started_line(Some(&run), response.created));
    }
    let ended = follow(&mut api, &run.run_id, |_| Ok(())).await?;
    response.run = Some(ended);
    match args.client.output {
        Format::Json => print_json(&response)?,
        Format::Table => print_text(&describe_run(response.run.as_ref().unwrap_or(&run)))?,
    }
    outcome(response.run.as_ref().unwrap_or(&run))
}

fn started_line(run: Option<&Run>, created: bool) -> String {
    let run = run.cloned().unwrap_or_default();
    let what = if created {
        "started"
    } else {
        "already started (same idempotency key)"
    };
    format!(
        "run {} {what}: {} v{}\n",
        run.run_id, run.workflow_name, run.workflow_version
    )
}

async fn get(args: RunIdArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .runs
        .get_run(GetRunRequest {
            run_id: args.run_id,
            skip_nodes: false,
        })
        .await?
        .into_inner();
    print_run(&response, args.client.output)
}

fn print_run(response: &GetRunResponse, format: Format) -> Result<(), AdminError> {
    match format {
        Format::Json => print_json(response),
        Format::Table => print_text(&describe_run(&response.run.clone().unwrap_or_default())),
    }
}

/// A run's fields, then its nodes.
fn describe_run(run: &Run) -> String {
    let mut pairs = vec![
        ("run", run.run_id.clone()),
        (
            "workflow",
            format!("{} v{}", run.workflow_name, run.workflow_version),
        ),
        ("namespace", run.namespace.clone()),
        ("status", run_status(run.status).to_owned()),
        ("created", time(run.create_time.as_ref())),
        ("ended", time(run.end_time.as_ref())),
        ("labels", labels(&run.labels)),
        ("idempotency key", run.idempotency_key.clone()),
        ("parent", parent(run)),
        ("input", value(run.input.as_ref())),
        ("output", value(run.output.as_ref())),
        ("error", failure(run.error.as_ref())),
    ];
    pairs.retain(|(_, v)| !v.is_empty());
    if run.nodes.is_empty() {
        return fields(&pairs);
    }
    format!("{}\n{}", fields(&pairs), node_table(&run.nodes))
}

fn parent(run: &Run) -> String {
    if run.parent_run_id.is_empty() {
        return String::new();
    }
    format!("{} (node {})", run.parent_run_id, run.parent_node_id)
}

async fn list(args: ListArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let filter = ListRunsRequest {
        workflow_name: args.workflow,
        statuses: args
            .statuses
            .into_iter()
            .map(|s| RunStatus::from(s) as i32)
            .collect(),
        labels: args.labels.into_iter().collect::<HashMap<_, _>>(),
        parent_run_id: args.parent,
        create_time_after: args.since.map(ago),
        ..Default::default()
    };
    let mut all = ListRunsResponse {
        next_page_token: args.page.page_token,
        ..Default::default()
    };
    let limit = args.page.limit as usize;
    loop {
        let page = api
            .runs
            .list_runs(ListRunsRequest {
                page_size: page_size(limit - all.runs.len()),
                page_token: all.next_page_token.clone(),
                ..filter.clone()
            })
            .await?
            .into_inner();
        all.runs.extend(page.runs);
        all.next_page_token = page.next_page_token;
        if all.next_page_token.is_empty() || all.runs.len() >= limit {
            break;
        }
    }
    if args.client.output == Format::Json {
        return print_json(&all);
    }
    let mut table = Table::new(&["RUN", "WORKFLOW", "STATUS", "CREATED", "ENDED", "LABELS"]);
    for run in &all.runs {
        table.row(vec![
            run.run_id.clone(),
            format!("{} v{}", run.workflow_name, run.workflow_version),
            run_status(run.status).to_owned(),
            time(run.create_time.as_ref()),
            time(run.end_time.as_ref()),
            shorten(&labels(&run.labels), 60),
        ]);
    }
    print_text(&table.render())?;
    more(&all.next_page_token)
}

/// The time `duration` before now.
fn ago(duration: std::time::Duration) -> prost_types::Timestamp {
    let then = std::time::SystemTime::now()
        .checked_sub(duration)
        .unwrap_or(std::time::UNIX_EPOCH);
    prost_types::Timestamp::from(then)
}

async fn history(args: HistoryArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let mut all = GetRunHistoryResponse {
        next_page_token: args.page.page_token,
        ..Default::default()
    };
    let limit = args.page.limit as usize;
    loop {
        let page = api
            .runs
            .get_run_history(GetRunHistoryRequest {
                run_id: args.run_id.clone(),
                page_size: page_size(limit - all.events.len()),
                page_token: all.next_page_token.clone(),
            })
            .await?
            .into_inner();
        all.events.extend(page.events);
        all.next_page_token = page.next_page_token;
        if all.next_page_token.is_empty() || all.events.len() >= limit {
            break;
        }
    }
    if args.client.output == Format::Json {
        // the run and its definition beside the history: the file replays
        // offline (`workflow replay --history`)
        let record = super::replay::fetch_context(
            &mut api,
            &args.run_id,
            &mut super::replay::Definitions::default(),
        )
        .await?;
        let json = super::replay::record_json(to_json(&all), &record.0, &record.1);
        let text = serde_json::to_string_pretty(&json).unwrap_or_default();
        return print_text(&format!("{text}\n"));
    }
    let mut table = Table::new(&[
        "SEQ", "TIME", "EVENT", "NODE", "ATTEMPT", "ACTOR", "DETAILS",
    ]);
    for event in &all.events {
        table.row(vec![
            event.sequence.to_string(),
            time(event.event_time.as_ref()),
            event.event_type.clone(),
            event.node_id.clone(),
            if event.attempt == 0 {
                String::new()
            } else {
                event.attempt.to_string()
            },
            event.actor.clone(),
            shorten(&value(event.details.as_ref()), 80),
        ]);
    }
    print_text(&table.render())?;
    more(&all.next_page_token)
}

async fn cancel(args: CancelArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .runs
        .cancel_run(CancelRunRequest {
            run_id: args.run_id,
            reason: args.reason,
        })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&status_line(response.run.as_ref())),
    }
}

async fn retry(args: RunIdArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .runs
        .retry_run(RetryRunRequest {
            run_id: args.run_id,
        })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&status_line(response.run.as_ref())),
    }
}

async fn pause(args: PauseArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .runs
        .pause_run(PauseRunRequest {
            run_id: args.run_id,
            reason: args.reason,
        })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&status_line(response.run.as_ref())),
    }
}

async fn resume(args: RunIdArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .runs
        .resume_run(ResumeRunRequest {
            run_id: args.run_id,
        })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&status_line(response.run.as_ref())),
    }
}

fn status_line(run: Option<&Run>) -> String {
    let run = run.cloned().unwrap_or_default();
    format!("run {} {}\n", run.run_id, run_status(run.status))
}

async fn send_event(args: SendEventArgs) -> Result<(), AdminError> {
    let payload = read_json(
        "payload",
        args.payload.as_deref(),
        args.payload_file.as_deref(),
    )?;
    let target = match (args.run_id, args.correlation_key) {
        (_, Some(key)) => Target::CorrelationKey(key),
        (Some(run_id), None) => Target::RunId(run_id),
        (None, None) => {
            return Err(AdminError::Usage(
                "give a run id or --correlation-key".into(),
            ));
        }
    };
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .runs
        .send_event(SendEventRequest {
            target: Some(target),
            event_name: args.event,
            payload: payload.as_ref().map(from_json),
            request_id: args.request_id,
        })
        .await?
        .into_inner();
    if args.client.output == Format::Json {
        return print_json(&response);
    }
    let mut text = String::new();
    for run_id in &response.delivered_run_ids {
        text.push_str(&format!("delivered to run {run_id}\n"));
    }
    if response.stored {
        text.push_str("stored until a run waits for it\n");
    }
    if text.is_empty() {
        text.push_str("delivered to no run\n");
    }
    print_text(&text)
}
