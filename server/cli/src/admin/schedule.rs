//! `composer schedule create|get|list|update|pause|resume|delete|trigger`.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use composer_grpc::convert::from_json;
use composer_proto::v1::{
    CreateScheduleRequest, DeleteScheduleRequest, GetScheduleRequest, ListSchedulesRequest,
    ListSchedulesResponse, OverlapPolicy, PauseScheduleRequest, ResumeScheduleRequest, Schedule,
    ScheduleAction, ScheduleFire, ScheduleFireOutcome, ScheduleSpec, TriggerScheduleRequest,
    UpdateScheduleRequest,
};

use super::{
    AdminError, Api, ClientArgs, Format,
    output::{Table, fields, labels, print_json, print_text, shorten, time, value},
    parse_label, read_json,
    workflow::{PageArgs, more, page_size},
};

/// The schedule commands.
#[derive(Debug, Clone, Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule that starts runs of a workflow on a cron or an interval.
    Create(CreateArgs),
    /// Show a schedule: its spec, recent fires, next fire times and counters.
    Get(ScheduleIdArgs),
    /// List the namespace's schedules by id.
    List(ListArgs),
    /// Replace a schedule's spec, action and policies (its counters stay).
    Update(UpdateArgs),
    /// Stop a schedule's fires until `resume`.
    Pause(NoteArgs),
    /// Let a paused schedule fire again, from its next fire time after now.
    Resume(NoteArgs),
    /// Delete a schedule; the runs it started stay.
    Delete(ScheduleIdArgs),
    /// Fire a schedule now (paused or not), under its overlap policy.
    Trigger(ScheduleIdArgs),
}

/// What a fire does while the previous run still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OverlapArg {
    /// Start nothing.
    Skip,
    /// Keep one fire; start it when the previous run ends.
    BufferOne,
    /// Start anyway.
    AllowAll,
    /// Cancel the previous run, then start.
    CancelPrevious,
}

impl From<OverlapArg> for OverlapPolicy {
    fn from(overlap: OverlapArg) -> Self {
        match overlap {
            OverlapArg::Skip => OverlapPolicy::Skip,
            OverlapArg::BufferOne => OverlapPolicy::BufferOne,
            OverlapArg::AllowAll => OverlapPolicy::AllowAll,
            OverlapArg::CancelPrevious => OverlapPolicy::CancelPrevious,
        }
    }
}

/// A schedule's definition, as `create` and `update` take it.
#[derive(Debug, Clone, Args)]
pub struct DefinitionArgs {
    /// The schedule's id (the name rule).
    pub schedule_id: String,
    /// The workflow a fire starts.
    #[arg(long)]
    pub workflow: String,
    /// The workflow version; the latest at each fire when left out.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    pub version: i32,
    /// A cron expression: 5 fields, or 6 with seconds first.
    #[arg(long, required_unless_present = "every", conflicts_with = "every")]
    pub cron: Option<String>,
    /// The IANA time zone of --cron, e.g. `Europe/Berlin`; UTC when left out.
    #[arg(long, default_value = "", hide_default_value = true, requires = "cron")]
    pub time_zone: String,
    /// A fixed interval instead of --cron, e.g. `30s`, `15m`, `24h` (whole seconds, at least 1 s).
    #[arg(long, value_parser = crate::config::parse_duration)]
    pub every: Option<std::time::Duration>,
    /// The runs' input, as JSON.
    #[arg(long, conflicts_with = "input_file")]
    pub input: Option<String>,
    /// A file holding the runs' input as JSON, or `-` for standard input.
    #[arg(long)]
    pub input_file: Option<PathBuf>,
    /// A label `key=value` of the runs; repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// What a fire does while the previous run still runs.
    #[arg(long, value_enum, default_value_t = OverlapArg::Skip)]
    pub overlap: OverlapArg,
    /// How late a missed fire may still start after downtime, e.g. `5m`; 60 s when left out.
    #[arg(long, value_parser = crate::config::parse_duration)]
    pub catch_up_window: Option<std::time::Duration>,
    /// The most a fire's start is delayed, e.g. `30s`; none when left out.
    #[arg(long, value_parser = crate::config::parse_duration)]
    pub jitter: Option<std::time::Duration>,
}

/// Options of `schedule create`.
#[derive(Debug, Clone, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub definition: DefinitionArgs,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
    /// A note (why it is paused).
    #[arg(long, default_value = "", hide_default_value = true)]
    pub note: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `schedule update`.
#[derive(Debug, Clone, Args)]
pub struct UpdateArgs {
    #[command(flatten)]
    pub definition: DefinitionArgs,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// A command about one schedule.
#[derive(Debug, Clone, Args)]
pub struct ScheduleIdArgs {
    /// The schedule's id.
    pub schedule_id: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `schedule pause` and `schedule resume`.
#[derive(Debug, Clone, Args)]
pub struct NoteArgs {
    /// The schedule's id.
    pub schedule_id: String,
    /// Why.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub note: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `schedule list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub page: PageArgs,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Runs one schedule command.
pub async fn run(command: ScheduleCommand) -> Result<(), AdminError> {
    match command {
        ScheduleCommand::Create(args) => create(args).await,
        ScheduleCommand::Get(args) => get(args).await,
        ScheduleCommand::List(args) => list(args).await,
        ScheduleCommand::Update(args) => update(args).await,
        ScheduleCommand::Pause(args) => pause(args, true).await,
        ScheduleCommand::Resume(args) => pause(args, false).await,
        ScheduleCommand::Delete(args) => delete(args).await,
        ScheduleCommand::Trigger(args) => trigger(args).await,
    }
}

fn duration(duration: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}

/// The spec, action and policies of the flags.
struct Definition {
    spec: ScheduleSpec,
    action: ScheduleAction,
    overlap: OverlapPolicy,
    catch_up_window: Option<prost_types::Duration>,
    jitter: Option<prost_types::Duration>,
}

fn definition(args: DefinitionArgs) -> Result<Definition, AdminError> {
    let input = read_json("input", args.input.as_deref(), args.input_file.as_deref())?;
    Ok(Definition {
        spec: ScheduleSpec {
            cron: args.cron.unwrap_or_default(),
            time_zone: args.time_zone,
            interval: args.every.map(duration),
        },
        action: ScheduleAction {
            workflow_name: args.workflow,
            version: args.version,
            input: input.as_ref().map(from_json),
            labels: args.labels.into_iter().collect(),
        },
        overlap: args.overlap.into(),
        catch_up_window: args.catch_up_window.map(duration),
        jitter: args.jitter.map(duration),
    })
}

async fn create(args: CreateArgs) -> Result<(), AdminError> {
    let id = args.definition.schedule_id.clone();
    let definition = definition(args.definition)?;
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .schedules
        .create_schedule(CreateScheduleRequest {
            schedule_id: id,
            spec: Some(definition.spec),
            action: Some(definition.action),
            overlap_policy: definition.overlap as i32,
            catch_up_window: definition.catch_up_window,
            jitter: definition.jitter,
            paused: args.paused,
            note: args.note,
        })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&changed_line("created", response.schedule.as_ref())),
    }
}

async fn update(args: UpdateArgs) -> Result<(), AdminError> {
    let id = args.definition.schedule_id.clone();
    let definition = definition(args.definition)?;
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .schedules
        .update_schedule(UpdateScheduleRequest {
            schedule_id: id,
            spec: Some(definition.spec),
            action: Some(definition.action),
            overlap_policy: definition.overlap as i32,
            catch_up_window: definition.catch_up_window,
            jitter: definition.jitter,
        })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&changed_line("updated", response.schedule.as_ref())),
    }
}

/// `schedule nightly created: next fire 2026-12-01 02:30:00`.
fn changed_line(what: &str, schedule: Option<&Schedule>) -> String {
    let schedule = schedule.cloned().unwrap_or_default();
    let next = schedule
        .next_fire_times
        .first()
        .map(|t| format!("next fire {}", time(Some(t))))
        .unwrap_or_else(|| {
            if schedule.paused {
                "paused".to_owned()
            } else {
                "no next fire".to_owned()
            }
        });
    if next == what {
        // `schedule nightly paused`, not `paused: paused`
        return format!("schedule {} {what}\n", schedule.schedule_id);
    }
    format!("schedule {} {what}: {next}\n", schedule.schedule_id)
}

async fn get(args: ScheduleIdArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .schedules
        .get_schedule(GetScheduleRequest {
            schedule_id: args.schedule_id,
        })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&describe(&response.schedule.unwrap_or_default())),
    }
}

fn spec_text(spec: Option<&ScheduleSpec>) -> String {
    let Some(spec) = spec else {
        return String::new();
    };
    match &spec.interval {
        Some(interval) => format!("every {}s", interval.seconds),
        None => format!("cron {:?} in {}", spec.cron, spec.time_zone),
    }
}

fn overlap_text(overlap: i32) -> &'static str {
    OverlapPolicy::try_from(overlap)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("OVERLAP_POLICY_")
}

fn outcome_text(outcome: i32) -> &'static str {
    ScheduleFireOutcome::try_from(outcome)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("SCHEDULE_FIRE_OUTCOME_")
}

fn seconds_text(duration: Option<&prost_types::Duration>) -> String {
    let Some(duration) = duration else {
        return String::new();
    };
    let ms = duration.seconds * 1000 + i64::from(duration.nanos / 1_000_000);
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// A schedule's fields, its next fire times, then its recent fires.
fn describe(schedule: &Schedule) -> String {
    let action = schedule.action.clone().unwrap_or_default();
    let version = match action.version {
        0 => "latest".to_owned(),
        n => format!("v{n}"),
    };
    let mut pairs = vec![
        ("schedule", schedule.schedule_id.clone()),
        ("namespace", schedule.namespace.clone()),
        ("spec", spec_text(schedule.spec.as_ref())),
        ("workflow", format!("{} {version}", action.workflow_name)),
        ("input", value(action.input.as_ref())),
        ("labels", labels(&action.labels)),
        ("overlap", overlap_text(schedule.overlap_policy).to_owned()),
        (
            "catch-up window",
            seconds_text(schedule.catch_up_window.as_ref()),
        ),
        ("jitter", seconds_text(schedule.jitter.as_ref())),
        ("paused", schedule.paused.to_string()),
        ("note", schedule.note.clone()),
        (
            "fired",
            format!(
                "{} (skipped {}, missed {})",
                schedule.fired_count, schedule.skipped_count, schedule.missed_count
            ),
        ),
        ("buffered", time(schedule.buffered_fire_time.as_ref())),
        ("last error", schedule.last_error.clone()),
        (
            "next fires",
            schedule
                .next_fire_times
                .iter()
                .take(3)
                .map(|t| time(Some(t)))
                .collect::<Vec<_>>()
                .join(", "),
        ),
    ];
    pairs.retain(|(_, v)| !v.is_empty());
    if schedule.recent_fires.is_empty() {
        return fields(&pairs);
    }
    format!("{}\n{}", fields(&pairs), fire_table(&schedule.recent_fires))
}

fn fire_table(fires: &[ScheduleFire]) -> String {
    let mut table = Table::new(&["FIRE TIME", "OUTCOME", "RUN"]);
    for fire in fires {
        table.row(vec![
            time(fire.fire_time.as_ref()),
            outcome_text(fire.outcome).to_owned(),
            fire.run_id.clone(),
        ]);
    }
    table.render()
}

async fn list(args: ListArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let mut all = ListSchedulesResponse {
        next_page_token: args.page.page_token,
        ..Default::default()
    };
    let limit = args.page.limit as usize;
    loop {
        let page = api
            .schedules
            .list_schedules(ListSchedulesRequest {
                page_size: page_size(limit - all.schedules.len()),
                page_token: all.next_page_token.clone(),
            })
            .await?
            .into_inner();
        all.schedules.extend(page.schedules);
        all.next_page_token = page.next_page_token;
        if all.next_page_token.is_empty() || all.schedules.len() >= limit {
            break;
        }
    }
    if args.client.output == Format::Json {
        return print_json(&all);
    }
    let mut table = Table::new(&[
        "SCHEDULE",
        "SPEC",
        "WORKFLOW",
        "OVERLAP",
        "STATE",
        "NEXT FIRE",
        "FIRED",
    ]);
    for schedule in &all.schedules {
        table.row(vec![
            schedule.schedule_id.clone(),
            shorten(&spec_text(schedule.spec.as_ref()), 40),
            schedule
                .action
                .as_ref()
                .map(|a| a.workflow_name.clone())
                .unwrap_or_default(),
            overlap_text(schedule.overlap_policy).to_owned(),
            if schedule.paused { "PAUSED" } else { "ACTIVE" }.to_owned(),
            time(schedule.next_fire_times.first()),
            schedule.fired_count.to_string(),
        ]);
    }
    print_text(&table.render())?;
    more(&all.next_page_token)
}

async fn pause(args: NoteArgs, paused: bool) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    if paused {
        let response = api
            .schedules
            .pause_schedule(PauseScheduleRequest {
                schedule_id: args.schedule_id,
                note: args.note,
            })
            .await?
            .into_inner();
        match args.client.output {
            Format::Json => print_json(&response),
            Format::Table => print_text(&changed_line("paused", response.schedule.as_ref())),
        }
    } else {
        let response = api
            .schedules
            .resume_schedule(ResumeScheduleRequest {
                schedule_id: args.schedule_id,
                note: args.note,
            })
            .await?
            .into_inner();
        match args.client.output {
            Format::Json => print_json(&response),
            Format::Table => print_text(&changed_line("resumed", response.schedule.as_ref())),
        }
    }
}

async fn delete(args: ScheduleIdArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .schedules
        .delete_schedule(DeleteScheduleRequest {
            schedule_id: args.schedule_id.clone(),
        })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&format!("schedule {} deleted\n", args.schedule_id)),
    }
}

async fn trigger(args: ScheduleIdArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .schedules
        .trigger_schedule(TriggerScheduleRequest {
            schedule_id: args.schedule_id.clone(),
        })
        .await?
        .into_inner();
    if args.client.output == Format::Json {
        return print_json(&response);
    }
    let fire = response.fire.unwrap_or_default();
    let what = match ScheduleFireOutcome::try_from(fire.outcome).unwrap_or_default() {
        ScheduleFireOutcome::Started => format!("started run {}", fire.run_id),
        ScheduleFireOutcome::Skipped => "skipped: the previous run still runs (SKIP)".to_owned(),
        ScheduleFireOutcome::Buffered => {
            "buffered: starts when the previous run ends (BUFFER_ONE)".to_owned()
        }
        _ => "started no run: see `last error` in `composer schedule get`".to_owned(),
    };
    print_text(&format!(
        "schedule {} fired at {}: {what}\n",
        args.schedule_id,
        time(fire.fire_time.as_ref())
    ))
}
