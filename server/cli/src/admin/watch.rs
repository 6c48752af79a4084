//! Following a run to its end over WatchRun (`run watch`, `run start
//! --wait`): in a terminal a table of the run's nodes redrawn in place on
//! each change; otherwise one line per change, so a log or a script can read
//! it; with `-o json` one WatchRunResponse per line.

use std::{collections::HashMap, io::IsTerminal, time::Duration};

use composer_proto::v1::{NodeState, Run, RunStatus, WatchRunRequest, WatchRunResponse};
use tonic::{Code, Status};

use super::{
    AdminError, Api, Format,
    output::{Table, failure, node_status, print_json_line, print_text, run_status, time, value},
};

/// Times in a row the watch may be cut, with no snapshot between, before
/// giving up (about 15 s of back-off: a server restarting behind its address).
const MAX_REOPENS: u32 = 10;

/// True once the run has its final status.
pub fn has_ended(run: &Run) -> bool {
    matches!(
        RunStatus::try_from(run.status),
        Ok(RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled)
    )
}

/// Calls `on_snapshot` with every snapshot of the run until it ends, and
/// returns the last one. A watch cut before the end (the stream closed, or
/// UNAVAILABLE while a server restarts) is opened again: it starts with the
/// current snapshot, so nothing is missed.
pub async fn follow(
    api: &mut Api,
    run_id: &str,
    mut on_snapshot: impl FnMut(&WatchRunResponse) -> Result<(), AdminError>,
) -> Result<Run, AdminError> {
    let mut reopens = 0;
    loop {
        let cut = match watch_once(api, run_id, &mut on_snapshot).await {
            Ok(Watched::Ended(run)) => return Ok(*run),
            Ok(Watched::Cut { progressed }) => (progressed, None),
            Err(AdminError::Rpc(status)) if is_transport_failure(&status) => (false, Some(status)),
            Err(error) => return Err(error),
        };
        reopens = if cut.0 { 1 } else { reopens + 1 };
        if reopens > MAX_REOPENS {
            return Err(AdminError::from(cut.1.map_or_else(
                || Status::unavailable("the server keeps closing the watch before the run ends"),
                |status| *status,
            )));
        }
        tokio::time::sleep(Duration::from_millis(250 * u64::from(reopens.min(8)))).await;
    }
}

/// UNAVAILABLE, or a status made here from a broken connection (a server
/// killed mid-stream is `UNKNOWN: h2 protocol error`), not one a server sent.
fn is_transport_failure(status: &Status) -> bool {
    status.code() == Code::Unavailable || std::error::Error::source(status).is_some()
}

/// How one WatchRun call ended.
enum Watched {
    /// The run reached its final status.
    Ended(Box<Run>),
    /// The stream closed first; `progressed` if it brought any snapshot.
    Cut { progressed: bool },
}

async fn watch_once(
    api: &mut Api,
    run_id: &str,
    on_snapshot: &mut impl FnMut(&WatchRunResponse) -> Result<(), AdminError>,
) -> Result<Watched, AdminError> {
    let mut stream = api
        .runs
        .watch_run(WatchRunRequest {
            run_id: run_id.to_owned(),
        })
        .await?
        .into_inner();
    let mut progressed = false;
    while let Some(snapshot) = stream.message().await? {
        progressed = true;
        on_snapshot(&snapshot)?;
        if let Some(run) = snapshot.run.filter(has_ended) {
            return Ok(Watched::Ended(Box::new(run)));
        }
    }
    Ok(Watched::Cut { progressed })
}

/// The error a script sees for a run that ended without completing.
pub fn outcome(run: &Run) -> Result<(), AdminError> {
    match RunStatus::try_from(run.status) {
        Ok(RunStatus::Failed | RunStatus::Cancelled) => Err(AdminError::RunNotCompleted {
            run_id: run.run_id.clone(),
            status: run_status(run.status),
            reason: run.error.as_ref().map(|f| failure(Some(f))),
        }),
        _ => Ok(()),
    }
}

/// `run watch`: prints the run as it changes; its outcome is the exit code.
pub async fn watch(api: &mut Api, run_id: &str, format: Format) -> Result<(), AdminError> {
    let mut view = View::new(format);
    let run = follow(api, run_id, |snapshot| view.show(snapshot)).await?;
    // what the run produced is what its watcher waited for
    let output = value(run.output.as_ref());
    if matches!(format, Format::Table) && !output.is_empty() && output != "null" {
        print_text(&format!("output: {output}\n"))?;
    }
    outcome(&run)
}

/// What has been shown so far.
struct View {
    format: Format,
    terminal: bool,
    /// Lines drawn by the last redraw (terminal).
    drawn: usize,
    /// The run status and each node's (status, attempt) last printed (lines).
    run_status: i32,
    nodes: HashMap<String, (i32, i32)>,
}

impl View {
    fn new(format: Format) -> Self {
        Self {
            format,
            terminal: std::io::stdout().is_terminal(),
            drawn: 0,
            run_status: 0,
            nodes: HashMap::new(),
        }
    }

    fn show(&mut self, snapshot: &WatchRunResponse) -> Result<(), AdminError> {
        let Some(run) = &snapshot.run else {
            return Ok(());
        };
        match (self.format, self.terminal) {
            (Format::Json, _) => print_json_line(snapshot),
            (Format::Table, true) => self.redraw(run),
            (Format::Table, false) => self.print_changes(run),
        }
    }

    /// Moves the cursor back over the last drawing and draws the run again.
    fn redraw(&mut self, run: &Run) -> Result<(), AdminError> {
        let text = format!("{}\n{}", headline(run), node_table(&run.nodes));
        let rewind = match self.drawn {
            0 => String::new(),
            lines => format!("\x1b[{lines}A\x1b[J"),
        };
        self.drawn = text.lines().count();
        print_text(&format!("{rewind}{text}"))
    }

    /// Prints one line per node whose status or attempt changed, and one
    /// when the run's status changes.
    fn print_changes(&mut self, run: &Run) -> Result<(), AdminError> {
        let mut text = String::new();
        for node in &run.nodes {
            let now = (node.status, node.attempt);
            if self.nodes.insert(node.node_id.clone(), now) != Some(now) {
                text.push_str(&change_line(node));
            }
        }
        if run.status != self.run_status {
            self.run_status = run.status;
            text.push_str(&format!("{}\n", headline(run)));
        }
        print_text(&text)
    }
}

fn headline(run: &Run) -> String {
    let error = failure(run.error.as_ref());
    let mut line = format!(
        "run {} {} v{} {}",
        run.run_id,
        run.workflow_name,
        run.workflow_version,
        run_status(run.status)
    );
    if !error.is_empty() {
        line.push_str(&format!(" ({error})"));
    }
    line
}

fn change_line(node: &NodeState) -> String {
    let error = failure(node.error.as_ref());
    format!(
        "node {} {} {} attempt {}{}\n",
        node.node_id,
        node.node_type,
        node_status(node.status),
        node.attempt,
        if error.is_empty() {
            String::new()
        } else {
            format!(" ({error})")
        }
    )
}

/// The nodes of a run as a table (`run get`, `run watch`).
pub fn node_table(nodes: &[NodeState]) -> String {
    let mut table = Table::new(&[
        "NODE", "TYPE", "STATUS", "ATTEMPT", "STARTED", "ENDED", "ERROR",
    ]);
    for node in nodes {
        table.row(vec![
            node.node_id.clone(),
            node.node_type.clone(),
            node_status(node.status).to_owned(),
            node.attempt.to_string(),
            time(node.start_time.as_ref()),
            time(node.end_time.as_ref()),
            super::output::shorten(&failure(node.error.as_ref()), 60),
        ]);
    }
    table.render()
}
