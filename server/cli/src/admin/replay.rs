//! `composer workflow replay`: a recorded run driven through a new
//! definition by the engine in this binary, online (the run fetched from a
//! server) or offline (a file `composer run history RUN_ID -o json` wrote).

use std::path::{Path, PathBuf};

use clap::Args;
use composer_engine::{
    CompiledWorkflow,
    replay::{NodeMapping, ReplayError, ReplayReport, Verdict, replay},
};
use composer_proto::v1::{
    GetRunHistoryRequest, GetRunRequest, GetWorkflowRequest, HistoryEvent, Run, WorkflowVersion,
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
            fetch_record(connected, run_id).await?
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

/// The run and the definition it runs on, from the server.
pub async fn fetch_context(
    api: &mut Api,
    run_id: &str,
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
    let workflow = fetch_workflow(api, &run.workflow_name, run.workflow_version).await?;
    Ok((run, workflow))
}

/// The run, its whole history and its definition, from the server.
pub async fn fetch_record(api: &mut Api, run_id: &str) -> Result<RunRecord, AdminError> {
    let (run, workflow) = fetch_context(api, run_id).await?;
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
