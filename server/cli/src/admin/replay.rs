//! `composer workflow replay`: a recorded run driven through a new
//! definition by the engine in this binary, online (the run fetched from a
//! server) or offline (a file `composer run history RUN_ID -o json` wrote).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use clap::Args;
use composer_engine::{
    CompiledWorkflow,
    replay::{NodeMapping, ReplayError, ReplayReport, Verdict, replay},
};
use composer_proto::v1::{
    CheckScope, CheckWorkflowVersionRequest, CheckWorkflowVersionResponse, CountRunsRequest,
    GetRunHistoryRequest, GetRunRequest, GetWorkflowRequest, HistoryEvent, ListRunsRequest,
    ReplayVerdict, Run, RunReplay, RunStatus, WorkflowVersion,
};
use serde_json::{Value as Json, json};

use super::{
    AdminError, ClientArgs, Format,
    connect::Api,
    output::{Table, from_json, print_text, to_json},
    read_source,
};

/// Options of `workflow replay`.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// The run to replay, fetched from the server.
    #[arg(required_unless_present = "history", conflicts_with = "history")]
    pub run_id: Option<String>,
    /// Replay offline from this file, as `composer run history RUN_ID -o
    /// json` writes it (`-` for standard input).
    #[arg(long, value_name = "HISTORY.json")]
    pub history: Option<PathBuf>,
    /// The new definition (YAML or JSON; `-` for standard input).
    #[arg(
        long,
        value_name = "NEW.yaml",
        required_unless_present = "version",
        conflicts_with = "version"
    )]
    pub file: Option<PathBuf>,
    /// A registered version of the run's workflow instead of a file.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub version: Option<i32>,
    /// A node renamed in the new definition, `OLD=NEW` (repeat for more).
    #[arg(long = "map", value_name = "OLD=NEW")]
    pub map: Vec<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// A run as recorded: what `run history -o json` writes and replay reads.
pub struct RunRecord {
    pub run: Run,
    pub workflow: WorkflowVersion,
    pub events: Vec<HistoryEvent>,
}

/// Runs `workflow replay`.
pub async fn replay_command(args: ReplayArgs) -> Result<(), AdminError> {
    let mapping = NodeMapping::parse(args.map.iter().map(String::as_str))
        .map_err(|e| AdminError::Usage(format!("--map {e}")))?;
    let mut api = None;
    let record = match (&args.history, &args.run_id) {
        (Some(path), _) => read_record(path)?,
        (None, Some(run_id)) => {
            let connected = api.insert(Api::connect(&args.client.connect).await?);
            fetch_record(connected, run_id, &mut Definitions::default()).await?
        }
        (None, None) => return Err(AdminError::Usage("name a run or --history".into())),
    };
    let new_source = match (&args.file, args.version) {
        (Some(path), _) => read_source(path)?,
        (None, Some(version)) => {
            let connected = match api.as_mut() {
                Some(api) => api,
                None => api.insert(Api::connect(&args.client.connect).await?),
            };
            fetch_workflow(connected, &record.run.workflow_name, version)
                .await?
                .source
        }
        (None, None) => return Err(AdminError::Usage("give --file or --version".into())),
    };
    let report = replay_record(&record, &new_source, &mapping)?;
    print_report(&record, &report, args.client.output)?;
    match report.verdict {
        Verdict::Incompatible => Err(AdminError::Incompatible(format!(
            "run {} is incompatible with the new definition",
            record.run.run_id
        ))),
        Verdict::Identical | Verdict::Compatible => Ok(()),
    }
}

/// Replays `record` against `new_source`.
pub fn replay_record(
    record: &RunRecord,
    new_source: &str,
    mapping: &NodeMapping,
) -> Result<ReplayReport, AdminError> {
    let old = CompiledWorkflow::from_text(&record.workflow.source).map_err(|e| {
        AdminError::Unreplayable(format!(
            "the run's own definition ({} v{}) does not compile here: {e}",
            record.workflow.name, record.workflow.version
        ))
    })?;
    let new = CompiledWorkflow::from_text(new_source).map_err(|errors| {
        AdminError::Invalid(
            errors
                .0
                .iter()
                .map(|e| (e.path.clone(), e.message.clone()))
                .collect(),
        )
    })?;
    let recorded = composer_grpc::recorded::recorded_run(&record.run, &record.events)
        .map_err(|e| AdminError::Unreplayable(e.to_string()))?;
    replay(&old, &new, &recorded, mapping).map_err(|e: ReplayError| {
        AdminError::Unreplayable(format!("run {}: {e}", record.run.run_id))
    })
}

/// Definitions already fetched, by name and version: a check of many runs
/// fetches each version once.
#[derive(Debug, Default)]
pub struct Definitions(HashMap<(String, i32), WorkflowVersion>);

impl Definitions {
    async fn get(
        &mut self,
        api: &mut Api,
        name: &str,
        version: i32,
    ) -> Result<WorkflowVersion, AdminError> {
        let key = (name.to_owned(), version);
        if let Some(known) = self.0.get(&key) {
            return Ok(known.clone());
        }
        let fetched = fetch_workflow(api, name, version).await?;
        self.0.insert(key, fetched.clone());
        Ok(fetched)
    }
}

/// The run and the definition it runs on, from the server.
pub async fn fetch_context(
    api: &mut Api,
    run_id: &str,
    definitions: &mut Definitions,
) -> Result<(Run, WorkflowVersion), AdminError> {
    let run = api
        .runs
        .get_run(GetRunRequest {
            run_id: run_id.to_owned(),
            skip_nodes: false,
        })
        .await?
        .into_inner()
        .run
        .unwrap_or_default();
    let workflow = definitions
        .get(api, &run.workflow_name, run.workflow_version)
        .await?;
    Ok((run, workflow))
}

/// The run, its whole history and its definition, from the server.
pub async fn fetch_record(
    api: &mut Api,
    run_id: &str,
    definitions: &mut Definitions,
) -> Result<RunRecord, AdminError> {
    let (run, workflow) = fetch_context(api, run_id, definitions).await?;
    let mut events = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = api
            .runs
            .get_run_history(GetRunHistoryRequest {
                run_id: run_id.to_owned(),
                page_size: 1000,
                page_token,
            })
            .await?
            .into_inner();
        events.extend(page.events);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok(RunRecord {
        run,
        workflow,
        events,
    })
}

async fn fetch_workflow(
    api: &mut Api,
    name: &str,
    version: i32,
) -> Result<WorkflowVersion, AdminError> {
    Ok(api
        .workflows
        .get_workflow(GetWorkflowRequest {
            name: name.to_owned(),
            version,
        })
        .await?
        .into_inner()
        .workflow
        .unwrap_or_default())
}

/// What `run history -o json` prints: the history page(s) with the run and
/// its definition beside them, so the file replays offline.
pub fn record_json(history: Json, run: &Run, workflow: &WorkflowVersion) -> Json {
    let mut json = history;
    if let Some(object) = json.as_object_mut() {
        object.insert("run".into(), to_json(run));
        object.insert("workflow".into(), to_json(workflow));
    }
    json
}

fn read_record(path: &Path) -> Result<RunRecord, AdminError> {
    let text = read_source(path)?;
    let bad = |what: String| {
        AdminError::Unreplayable(format!(
            "{}: {what} (write it with `composer run history RUN_ID -o json`)",
            path.display()
        ))
    };
    let json: Json = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let part = |name: &str| json.get(name).ok_or_else(|| bad(format!("no {name:?}")));
    let run: Run = from_json(part("run")?).map_err(|e| bad(format!("run: {e}")))?;
    let workflow: WorkflowVersion =
        from_json(part("workflow")?).map_err(|e| bad(format!("workflow: {e}")))?;
    let events = part("events")?
        .as_array()
        .ok_or_else(|| bad("events is not a list".into()))?
        .iter()
        .map(from_json::<HistoryEvent>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("events: {e}")))?;
    if json
        .get("next_page_token")
        .and_then(Json::as_str)
        .is_some_and(|t| !t.is_empty())
    {
        return Err(bad(
            "the history is cut short (next_page_token is set): write it with a --limit above its length"
                .into(),
        ));
    }
    Ok(RunRecord {
        run,
        workflow,
        events,
    })
}

fn print_report(
    record: &RunRecord,
    report: &ReplayReport,
    format: Format,
) -> Result<(), AdminError> {
    if format == Format::Json {
        let mut json = serde_json::to_value(report).unwrap_or(Json::Null);
        if let Some(object) = json.as_object_mut() {
            object.insert("run_id".into(), json!(record.run.run_id));
            object.insert("workflow".into(), json!(record.workflow.name));
            object.insert("recorded_version".into(), json!(record.workflow.version));
        }
        let text = serde_json::to_string_pretty(&json).unwrap_or_default();
        return print_text(&format!("{text}\n"));
    }
    let mut text = format!(
        "run {} ({} v{}): {} ({} events replayed)\n",
        record.run.run_id,
        record.workflow.name,
        record.workflow.version,
        report.verdict.as_str(),
        report.events
    );
    if let Some(divergence) = &report.divergence {
        let mut table = Table::new(&["RULE", "NODE", "HISTORY", "DIVERGENCE"]);
        table.row(vec![
            serde_json::to_value(divergence.rule)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            divergence.node.clone().unwrap_or_default(),
            divergence
                .sequence
                .map(|s| s.to_string())
                .unwrap_or_default(),
            divergence.message.clone(),
        ]);
        text.push_str(&table.render());
    }
    if !report.differences.is_empty() {
        let mut table = Table::new(&["DIFFERENCE", "NODE", "DETAIL"]);
        for difference in &report.differences {
            table.row(vec![
                serde_json::to_value(difference.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                difference.node.clone(),
                difference.message.clone(),
            ]);
        }
        text.push_str(&table.render());
    }
    print_text(&text)
}

/// Runs in flight up to which `workflow check` replays in this process;
/// past it the server replays them (CheckWorkflowVersion), a page a call.
pub const LOCAL_CHECK_MAX: i64 = 300;

/// Runs listed by `workflow check`'s table (JSON lists every one).
const LISTED_RUNS: usize = 10;

/// Options of `workflow check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The workflow whose runs are replayed (every version).
    pub name: String,
    /// The new definition (YAML or JSON; `-` for standard input).
    #[arg(
        long,
        value_name = "NEW.yaml",
        required_unless_present = "version",
        conflicts_with = "version"
    )]
    pub file: Option<PathBuf>,
    /// A registered version of the workflow instead of a file.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub version: Option<i32>,
    /// A node renamed in the new definition, `OLD=NEW` (repeat for more).
    #[arg(long = "map", value_name = "OLD=NEW")]
    pub map: Vec<String>,
    /// Also replay the N most recent completed runs.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub completed: u32,
    /// Replay on the server (CheckWorkflowVersion) however few the runs.
    #[arg(long)]
    pub on_server: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Verdicts counted over some runs, with every run that is not identical.
#[derive(Debug, Default)]
struct Tally {
    checked: u64,
    identical: u64,
    compatible: u64,
    incompatible: u64,
    unreplayable: u64,
    runs: Vec<RunReplay>,
}

impl Tally {
    fn add(&mut self, replay: RunReplay) {
        self.checked += 1;
        match replay.verdict() {
            ReplayVerdict::Identical => self.identical += 1,
            ReplayVerdict::Compatible => self.compatible += 1,
            ReplayVerdict::Incompatible => self.incompatible += 1,
            ReplayVerdict::Unreplayable | ReplayVerdict::Unspecified => self.unreplayable += 1,
        }
        if replay.verdict() != ReplayVerdict::Identical {
            self.runs.push(replay);
        }
    }

    fn add_page(&mut self, page: CheckWorkflowVersionResponse) {
        self.checked += u64::try_from(page.checked).unwrap_or(0);
        self.identical += u64::try_from(page.identical).unwrap_or(0);
        self.compatible += u64::try_from(page.compatible).unwrap_or(0);
        self.incompatible += u64::try_from(page.incompatible).unwrap_or(0);
        self.unreplayable += u64::try_from(page.unreplayable).unwrap_or(0);
        self.runs.extend(page.runs);
    }

    fn json(&self) -> Json {
        json!({
            "checked": self.checked,
            "identical": self.identical,
            "compatible": self.compatible,
            "incompatible": self.incompatible,
            "unreplayable": self.unreplayable,
        })
    }
}

/// Where `workflow check` replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    Here,
    OnServer,
}

/// Runs `workflow check`.
pub async fn check_command(args: CheckArgs) -> Result<(), AdminError> {
    let mapping = NodeMapping::parse(args.map.iter().map(String::as_str))
        .map_err(|e| AdminError::Usage(format!("--map {e}")))?;
    let source = args.file.as_deref().map(read_source).transpose()?;
    let mut api = Api::connect(&args.client.connect).await?;
    let in_flight = count_in_flight(&mut api, &args.name).await?;
    let place = if args.on_server
        || in_flight > LOCAL_CHECK_MAX
        || i64::from(args.completed) > LOCAL_CHECK_MAX
    {
        Where::OnServer
    } else {
        Where::Here
    };
    let target = Target {
        name: &args.name,
        source: source.as_deref(),
        version: args.version,
        mapping: &mapping,
        pairs: args
            .map
            .iter()
            .filter_map(|pair| pair.split_once('='))
            .map(|(a, b)| (a.trim().to_owned(), b.trim().to_owned()))
            .collect(),
    };
    let flight = check_scope(&mut api, &target, place, CheckScope::InFlight, None).await?;
    let completed = match args.completed {
        0 => None,
        n => Some(
            check_scope(
                &mut api,
                &target,
                place,
                CheckScope::Completed,
                Some(u64::from(n)),
            )
            .await?,
        ),
    };
    print_check(&args, place, &flight, completed.as_ref())?;
    if flight.incompatible > 0 {
        return Err(AdminError::Incompatible(format!(
            "{} of {} runs in flight are incompatible with the new definition",
            flight.incompatible, flight.checked
        )));
    }
    if flight.unreplayable > 0 {
        return Err(AdminError::Unreplayable(format!(
            "{} of {} runs in flight could not be replayed",
            flight.unreplayable, flight.checked
        )));
    }
    Ok(())
}

/// The new definition as the command names it.
struct Target<'a> {
    name: &'a str,
    source: Option<&'a str>,
    version: Option<i32>,
    mapping: &'a NodeMapping,
    pairs: std::collections::HashMap<String, String>,
}

async fn count_in_flight(api: &mut Api, name: &str) -> Result<i64, AdminError> {
    let counts = api
        .runs
        .count_runs(CountRunsRequest {
            workflow_name: name.to_owned(),
            ..CountRunsRequest::default()
        })
        .await?
        .into_inner()
        .counts;
    Ok(counts
        .iter()
        .filter(|c| in_flight_statuses().contains(&c.status()))
        .map(|c| c.count)
        .sum())
}

fn in_flight_statuses() -> [RunStatus; 3] {
    [
        RunStatus::Running,
        RunStatus::Compensating,
        RunStatus::Paused,
    ]
}

async fn check_scope(
    api: &mut Api,
    target: &Target<'_>,
    place: Where,
    scope: CheckScope,
    most: Option<u64>,
) -> Result<Tally, AdminError> {
    match place {
        Where::OnServer => check_on_server(api, target, scope, most).await,
        Where::Here => check_here(api, target, scope, most).await,
    }
}

async fn check_on_server(
    api: &mut Api,
    target: &Target<'_>,
    scope: CheckScope,
    most: Option<u64>,
) -> Result<Tally, AdminError> {
    let mut tally = Tally::default();
    let mut page_token = String::new();
    loop {
        let left = most.map_or(200, |m| m.saturating_sub(tally.checked).min(200));
        if left == 0 {
            return Ok(tally);
        }
        let page = api
            .workflows
            .check_workflow_version(CheckWorkflowVersionRequest {
                name: target.name.to_owned(),
                source: target.source.unwrap_or_default().to_owned(),
                version: target.version.unwrap_or(0),
                node_mapping: target.pairs.clone(),
                scope: scope as i32,
                page_size: i32::try_from(left).unwrap_or(200),
                page_token,
            })
            .await?
            .into_inner();
        page_token = page.next_page_token.clone();
        tally.add_page(page);
        if page_token.is_empty() {
            return Ok(tally);
        }
    }
}

async fn check_here(
    api: &mut Api,
    target: &Target<'_>,
    scope: CheckScope,
    most: Option<u64>,
) -> Result<Tally, AdminError> {
    let source = match (target.source, target.version) {
        (Some(source), _) => source.to_owned(),
        (None, Some(version)) => fetch_workflow(api, target.name, version).await?.source,
        (None, None) => return Err(AdminError::Usage("give --file or --version".into())),
    };
    let statuses: Vec<i32> = match scope {
        CheckScope::Completed => vec![RunStatus::Completed as i32],
        _ => in_flight_statuses().iter().map(|s| *s as i32).collect(),
    };
    let mut tally = Tally::default();
    let mut definitions = Definitions::default();
    let mut page_token = String::new();
    loop {
        let page = api
            .runs
            .list_runs(ListRunsRequest {
                workflow_name: target.name.to_owned(),
                statuses: statuses.clone(),
                page_size: 100,
                page_token,
                ..ListRunsRequest::default()
            })
            .await?
            .into_inner();
        for run in page.runs {
            if most.is_some_and(|m| tally.checked >= m) {
                return Ok(tally);
            }
            let record = fetch_record(api, &run.run_id, &mut definitions).await?;
            let outcome = match replay_record(&record, &source, target.mapping) {
                Ok(report) => Ok(report),
                Err(AdminError::Unreplayable(reason)) => Err(reason),
                Err(other) => return Err(other),
            };
            tally.add(composer_grpc::recorded::replay_message(
                &record.run.run_id,
                record.run.workflow_version,
                record.run.status,
                &outcome,
            ));
        }
        page_token = page.next_page_token;
        if page_token.is_empty() {
            return Ok(tally);
        }
    }
}

fn print_check(
    args: &CheckArgs,
    place: Where,
    flight: &Tally,
    completed: Option<&Tally>,
) -> Result<(), AdminError> {
    let replayed_by = match place {
        Where::Here => "here",
        Where::OnServer => "server",
    };
    if args.client.output == Format::Json {
        let runs: Vec<Json> = flight
            .runs
            .iter()
            .chain(completed.iter().flat_map(|t| t.runs.iter()))
            .map(to_json)
            .collect();
        let json = json!({
            "workflow": args.name,
            "replayed_by": replayed_by,
            "in_flight": flight.json(),
            "completed": completed.map(Tally::json),
            "runs": runs,
        });
        let text = serde_json::to_string_pretty(&json).unwrap_or_default();
        return print_text(&format!("{text}\n"));
    }
    let mut counts = Table::new(&[
        "RUNS",
        "CHECKED",
        "IDENTICAL",
        "COMPATIBLE",
        "INCOMPATIBLE",
        "UNREPLAYABLE",
    ]);
    let mut row = |label: &str, t: &Tally| {
        counts.row(vec![
            label.to_owned(),
            t.checked.to_string(),
            t.identical.to_string(),
            t.compatible.to_string(),
            t.incompatible.to_string(),
            t.unreplayable.to_string(),
        ]);
    };
    row("in flight", flight);
    if let Some(completed) = completed {
        row("completed", completed);
    }
    let mut text = format!(
        "{}: replayed ({replayed_by})\n{}",
        args.name,
        counts.render()
    );
    let mut listed: Vec<&RunReplay> = flight
        .runs
        .iter()
        .chain(completed.iter().flat_map(|t| t.runs.iter()))
        .collect();
    // incompatible and unreplayable first: what stops a deploy
    listed.sort_by_key(|r| match r.verdict() {
        ReplayVerdict::Incompatible => 0,
        ReplayVerdict::Unreplayable => 1,
        _ => 2,
    });
    if !listed.is_empty() {
        let mut runs = Table::new(&["RUN", "VERSION", "VERDICT", "RULE", "NODE", "DETAIL"]);
        for replay in listed.iter().take(LISTED_RUNS) {
            let (rule, node, detail) = match (&replay.divergence, replay.differences.first()) {
                (Some(d), _) => (d.rule.clone(), d.node_id.clone(), d.message.clone()),
                (None, Some(d)) => (d.kind.clone(), d.node_id.clone(), d.message.clone()),
                (None, None) => (
                    String::new(),
                    String::new(),
                    replay.unreplayable_reason.clone(),
                ),
            };
            runs.row(vec![
                replay.run_id.clone(),
                replay.workflow_version.to_string(),
                verdict_name(replay.verdict()).to_owned(),
                rule,
                node,
                detail,
            ]);
        }
        text.push_str(&runs.render());
        if listed.len() > LISTED_RUNS {
            text.push_str(&format!(
                "... and {} more (-o json lists every one)\n",
                listed.len() - LISTED_RUNS
            ));
        }
    }
    print_text(&text)
}

fn verdict_name(verdict: ReplayVerdict) -> &'static str {
    match verdict {
        ReplayVerdict::Identical => "identical",
        ReplayVerdict::Compatible => "compatible",
        ReplayVerdict::Incompatible => "incompatible",
        ReplayVerdict::Unreplayable => "unreplayable",
        ReplayVerdict::Unspecified => "",
    }
}
