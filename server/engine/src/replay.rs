//! Replay: a recorded run driven through another definition.
//!
//! The engine is a pure function of (definition, events), and a run's
//! history records what each event made it do. [`replay`] rebuilds the
//! events: it plays the run's own definition alongside the history and,
//! at each recorded entry that begins an event's work, tries the events
//! that could have caused it (a report, a timer, an event, a cancel, a
//! retry) until the recorded definition reproduces exactly the entries
//! that were recorded. The same event then goes to the new definition, and
//! what it decides is compared with what the run did.
//!
//! The verdicts (`docs/versions.md`):
//!
//! - **identical**: the new definition decides everything the run recorded
//!   the same way, and no node the run has not reached differs;
//! - **compatible**: the same nodes start in the same order with the same
//!   queue, task and type, but a node the run has not reached changed, a
//!   node was renamed through the mapping, or a rendered input of a node
//!   that already started would differ;
//! - **incompatible**: the first divergence, named: a node the run started
//!   that the new definition would not start (or starts as another type,
//!   queue, task or child workflow), a SWITCH that takes another branch, a
//!   node the run is waiting in that no longer exists, a node the new
//!   definition starts where the run did something else, a run that would
//!   end otherwise, or an input the new definition can no longer render from
//!   the outputs the run recorded.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

pub use crate::mapping::NodeMapping;

use crate::blob::BlobValues;
use crate::compile::{CompiledWorkflow, Kind, MapElement};
use crate::decide::{decide_from, render_node_input};
use crate::definition::NodeType;
use crate::history::HistoryEventType as H;
use crate::state::{
    Action, ChildStatus, DecideError, Decision, ErrorInfo, Event, NodeKey, NodeState, NodeStatus,
    RunRecord, RunState, TimerId, Timestamp,
};

/// One entry of a run's recorded history.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedEntry {
    /// Its position in the history, to name it in a verdict.
    pub sequence: u64,
    pub kind: H,
    pub node: Option<NodeKey>,
    pub attempt: Option<u32>,
    pub details: Json,
    pub at: Timestamp,
}

/// Why a stored or given history entry is not one replay can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("history entry {sequence}: unknown event type {event_type:?}")]
    UnknownEventType { sequence: i64, event_type: String },
    #[error("history entry {sequence}: {problem}")]
    Malformed { sequence: i64, problem: String },
}

impl RecordedEntry {
    /// An entry from its stored fields: the event type's name, the node key
    /// as text (None or empty: none), the attempt (None or 0: none), and
    /// its time in milliseconds since the epoch.
    pub fn parse(
        sequence: i64,
        event_type: &str,
        node: Option<&str>,
        attempt: Option<i32>,
        details: Json,
        at_millis: i64,
    ) -> Result<RecordedEntry, EntryError> {
        let malformed = |problem: String| EntryError::Malformed { sequence, problem };
        let kind = H::parse(event_type).ok_or_else(|| EntryError::UnknownEventType {
            sequence,
            event_type: event_type.to_owned(),
        })?;
        let node = match node {
            None | Some("") => None,
            Some(key) => Some(key.parse::<NodeKey>().map_err(malformed)?),
        };
        let attempt = match attempt {
            None | Some(0) => None,
            Some(n) => Some(u32::try_from(n).map_err(|_| malformed(format!("attempt {n}")))?),
        };
        Ok(RecordedEntry {
            sequence: u64::try_from(sequence).unwrap_or_default(),
            kind,
            node,
            attempt,
            details,
            at: Timestamp(at_millis),
        })
    }
}

/// What replay reads of a run: its input, the outputs its nodes recorded
/// (reports, events and child runs hand them in; history does not repeat
/// them), and its history, oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordedRun {
    pub input: Json,
    pub outputs: BTreeMap<NodeKey, Json>,
    pub history: Vec<RecordedEntry>,
    /// The values of the blobs its input and outputs refer to, by digest,
    /// for expressions that look inside them (the caller reads them; the
    /// engine never does).
    pub blobs: BlobValues,
}

/// What the new definition would do with the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Identical,
    Compatible,
    Incompatible,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Identical => "identical",
            Verdict::Compatible => "compatible",
            Verdict::Incompatible => "incompatible",
        }
    }
}

/// Which rule an incompatible replay broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceRule {
    /// The run started a node the new definition would not start there.
    NodeNotStarted,
    /// The node starts as another type, queue, task, child workflow or event.
    NodeChanged,
    /// A SWITCH the run passed would take another branch.
    BranchChanged,
    /// The run is waiting in a node the new definition does not have.
    WaitingNodeRemoved,
    /// The new definition starts a node where the run did something else.
    UnexpectedStart,
    /// The run would end otherwise (or not end where it did).
    RunEndDiffers,
    /// A node the run has not reached could not render its input from the
    /// outputs the run recorded.
    OutputUnreadable,
    /// The new definition decides something else than the run recorded.
    HistoryDiffers,
    /// The new definition cannot decide an event the run saw.
    DecisionFailed,
}

impl DivergenceRule {
    /// The rule's name as docs/versions.md spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            DivergenceRule::NodeNotStarted => "node_not_started",
            DivergenceRule::NodeChanged => "node_changed",
            DivergenceRule::BranchChanged => "branch_changed",
            DivergenceRule::WaitingNodeRemoved => "waiting_node_removed",
            DivergenceRule::UnexpectedStart => "unexpected_start",
            DivergenceRule::RunEndDiffers => "run_end_differs",
            DivergenceRule::OutputUnreadable => "output_unreadable",
            DivergenceRule::HistoryDiffers => "history_differs",
            DivergenceRule::DecisionFailed => "decision_failed",
        }
    }
}

/// The first place the new definition parts from the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    pub rule: DivergenceRule,
    /// The node (recorded id) it concerns, if one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The recorded history entry where it shows, if one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    pub message: String,
}

/// Why a compatible replay is not identical.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DifferenceKind {
    /// A node that started would be given another input.
    InputDiffers,
    /// A node the run has not reached is new.
    NodeAdded,
    /// A node the run never reached is gone.
    NodeRemoved,
    /// A node the run has not reached changed (or its edges did).
    NodeChanged,
    /// A node of the run goes on under another id.
    NodeRenamed,
}

/// One difference that does not stop the run from going on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    pub kind: DifferenceKind,
    pub node: String,
    pub message: String,
}

/// The result of a replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub divergence: Option<Divergence>,
    pub differences: Vec<Difference>,
    /// Events rebuilt from the history and replayed.
    pub events: usize,
}

/// Why a history could not be replayed at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    #[error("the history does not begin with run_started")]
    NoStart,
    #[error(
        "history entry {sequence} ({what}) is not what the run's own definition decides \
         ({decided}): the history is incomplete or was recorded by another engine"
    )]
    NotReproducible {
        sequence: u64,
        what: String,
        decided: String,
    },
    #[error("the run's own definition cannot decide history entry {sequence}: {error}")]
    RecordedDefinitionFails { sequence: u64, error: String },
    #[error(
        "history entry {sequence}: an expression reads inside blobs the replay was not given: {}",
        digests.join(", ")
    )]
    BlobsNotGiven { sequence: u64, digests: Vec<String> },
}

/// `recorded` with every entry naming its nodes as they are called now: a
/// `run_migrated` entry's `details.node_mapping` (old id to new id) renames
/// the nodes of the entries before it.
fn with_current_ids(recorded: &RecordedRun) -> RecordedRun {
    let mut recorded = recorded.clone();
    for at in 0..recorded.history.len() {
        if recorded.history[at].kind != H::RunMigrated {
            continue;
        }
        let pairs: Vec<(String, String)> = recorded.history[at]
            .details
            .get("node_mapping")
            .and_then(Json::as_object)
            .map(|map| {
                map.iter()
                    .filter_map(|(from, to)| Some((from.clone(), to.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let mapping = NodeMapping::from_pairs(pairs);
        for entry in &mut recorded.history[..at] {
            if let Some(node) = &entry.node {
                entry.node = Some(mapping.key(node));
            }
        }
    }
    recorded
}

/// Entries the server writes itself, beside the engine's: not decided by a
/// definition, so not replayed.
fn written_by_server(kind: H) -> bool {
    matches!(
        kind,
        H::TaskLeased
            | H::CancelRequestedBy
            | H::RetryRequestedBy
            | H::RunPaused
            | H::RunResumed
            | H::RunMigrated
            | H::EventStored
    )
}

/// Replays `recorded`, a run of `old`, against `new`.
pub fn replay(
    old: &CompiledWorkflow,
    new: &CompiledWorkflow,
    recorded: &RecordedRun,
    mapping: &NodeMapping,
) -> Result<ReplayReport, ReplayError> {
    let migrated;
    let recorded = if recorded.history.iter().any(|e| e.kind == H::RunMigrated) {
        migrated = with_current_ids(recorded);
        &migrated
    } else {
        recorded
    };
    let history = &recorded.history;
    let first = history.iter().position(|e| !written_by_server(e.kind));
    if first.is_none_or(|i| history[i].kind != H::RunStarted) {
        return Err(ReplayError::NoStart);
    }
    let mut replay = Replay {
        old: Track::new(old, &recorded.input, &recorded.blobs),
        new: Track::new(new, &recorded.input, &recorded.blobs),
        mapping,
        recorded,
        differences: Vec::new(),
        events: 0,
    };
    let divergence = replay.run()?;
    let divergence = match divergence {
        Some(found) => Some(found),
        None => replay.end_state(),
    };
    if divergence.is_none() {
        replay.not_reached();
    }
    let differences = replay.differences;
    let verdict = match (&divergence, differences.is_empty()) {
        (Some(_), _) => Verdict::Incompatible,
        (None, false) => Verdict::Compatible,
        (None, true) => Verdict::Identical,
    };
    Ok(ReplayReport {
        verdict,
        divergence,
        differences,
        events: replay.events,
    })
}

/// One definition played through the run's events.
struct Track<'w> {
    wf: &'w CompiledWorkflow,
    run: RunRecord,
    store: BTreeMap<NodeKey, NodeState>,
    timers: BTreeMap<TimerId, Timestamp>,
    blobs: &'w BlobValues,
}

impl<'w> Track<'w> {
    fn new(wf: &'w CompiledWorkflow, input: &Json, blobs: &'w BlobValues) -> Track<'w> {
        Track {
            wf,
            run: RunState::new("replay", wf.name(), 0, input.clone()).run,
            store: BTreeMap::new(),
            timers: BTreeMap::new(),
            blobs,
        }
    }

    fn decide(&self, event: &Event, now: Timestamp) -> Result<Decision, DecideError> {
        let mut state = RunState {
            run: self.run.clone(),
            nodes: BTreeMap::new(),
            blobs: self.blobs.clone(),
        };
        decide_from(self.wf, &mut state, &self.store, event, now).map(|(d, _)| d)
    }

    fn apply(&mut self, event: &Event, decision: &Decision) {
        if let Event::TimerFired { timer, .. } = event {
            self.timers.remove(timer);
        }
        if let Some(run) = &decision.change.run {
            self.run = run.clone();
        }
        for (key, state) in &decision.change.nodes {
            self.store.insert(key.clone(), state.clone());
        }
        for action in &decision.actions {
            match action {
                Action::ScheduleTimer { timer, fire_at } => {
                    self.timers.insert(timer.clone(), *fire_at);
                }
                Action::CancelTimer { timer } => {
                    self.timers.remove(timer);
                }
                Action::CancelAllTimers => self.timers.clear(),
                _ => {}
            }
        }
    }

    /// Pending timers, soonest first.
    fn timers_due(&self) -> Vec<TimerId> {
        let mut due: Vec<_> = self.timers.iter().collect();
        due.sort_by_key(|(timer, at)| (**at, (*timer).clone()));
        due.into_iter().map(|(timer, _)| timer.clone()).collect()
    }

    fn active(&self) -> Vec<NodeKey> {
        self.store
            .iter()
            .filter(|(_, s)| s.status.is_active())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether the run got to `id`: started it, or decided to skip it.
    fn started(&self, id: &str) -> bool {
        self.store
            .iter()
            .any(|(k, s)| k.node == id && s.status != NodeStatus::Pending)
    }

    fn completed(&self, id: &str) -> bool {
        self.store
            .get(&NodeKey::node(id))
            .is_some_and(|s| s.status == NodeStatus::Completed)
    }

    /// Whether `key` ran a task or a child run, and which.
    fn runs_as(&self, key: &NodeKey) -> Runs {
        let Some(node) = self.wf.node(&key.node) else {
            return Runs::Other;
        };
        match (&node.kind, key.index) {
            (Kind::Task { .. } | Kind::Http { .. } | Kind::Code { .. }, _) => Runs::Task,
            (Kind::SubWorkflow { .. }, _) => Runs::Child,
            (Kind::Map { element, .. }, Some(_)) => match element {
                MapElement::Task { .. } => Runs::Task,
                MapElement::Workflow { .. } => Runs::Child,
            },
            _ => Runs::Other,
        }
    }

    fn state_with_every_node(&self) -> RunState {
        RunState {
            run: self.run.clone(),
            nodes: self
                .store
                .iter()
                .map(|(k, s)| (k.clone(), Some(s.clone())))
                .collect(),
            blobs: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runs {
    Task,
    Child,
    Other,
}

/// The report that completes `key`'s attempt with `output`, if it runs a
/// task or a child run.
fn completion(runs: Runs, key: &NodeKey, attempt: u32, output: Json) -> Option<Event> {
    match runs {
        Runs::Task => Some(Event::TaskCompleted {
            node: key.clone(),
            attempt,
            output,
        }),
        Runs::Child => Some(Event::ChildRunFinished {
            node: key.clone(),
            attempt,
            status: ChildStatus::Completed,
            output,
            error: None,
            seed: 0,
        }),
        Runs::Other => None,
    }
}

/// A history entry a decision produced, as compared.
#[derive(Debug, Clone, PartialEq)]
struct Produced {
    kind: H,
    node: Option<NodeKey>,
    attempt: Option<u32>,
    /// `node_started`'s type; `attempt_failed`'s and `node_failed`'s code.
    mark: Option<String>,
}

impl Produced {
    fn describe(&self) -> String {
        let mut text = self.kind.as_str().to_owned();
        if let Some(node) = &self.node {
            text.push_str(&format!(" {node}"));
        }
        if let Some(attempt) = self.attempt {
            text.push_str(&format!(" attempt {attempt}"));
        }
        if let Some(mark) = &self.mark {
            text.push_str(&format!(" ({mark})"));
        }
        text
    }
}

fn mark_of(kind: H, details: &Json) -> Option<String> {
    let field = match kind {
        H::NodeStarted => "type",
        H::AttemptFailed | H::NodeFailed => "code",
        _ => return None,
    };
    details.get(field).and_then(Json::as_str).map(str::to_owned)
}

fn produced(decision: &Decision) -> Vec<Produced> {
    decision
        .actions
        .iter()
        .filter_map(|action| match action {
            Action::AppendHistory {
                kind,
                node,
                attempt,
                detail,
            } => Some(Produced {
                kind: *kind,
                node: node.clone(),
                attempt: *attempt,
                mark: mark_of(*kind, detail),
            }),
            _ => None,
        })
        .collect()
}

fn as_produced(entry: &RecordedEntry) -> Produced {
    Produced {
        kind: entry.kind,
        node: entry.node.clone(),
        attempt: entry.attempt,
        mark: mark_of(entry.kind, &entry.details),
    }
}

/// What a node is asked to do when it starts: its task, child run or event.
#[derive(Debug, Clone, PartialEq)]
struct Work {
    node: NodeKey,
    what: String,
    input: Option<Json>,
}

fn work_of(decision: &Decision) -> Vec<Work> {
    decision
        .actions
        .iter()
        .filter_map(|action| match action {
            Action::CreateTask {
                node,
                queue,
                task_name,
                input,
                ..
            } => Some(Work {
                node: node.clone(),
                what: format!("task {task_name:?} on queue {queue:?}"),
                input: Some(input.clone()),
            }),
            Action::StartChildRun {
                node,
                workflow,
                version,
                input,
                ..
            } => Some(Work {
                node: node.clone(),
                what: match version {
                    Some(v) => format!("child workflow {workflow:?} version {v}"),
                    None => format!("child workflow {workflow:?}"),
                },
                input: Some(input.clone()),
            }),
            Action::AwaitEvent { node, name, .. } => Some(Work {
                node: node.clone(),
                what: format!("event {name:?}"),
                input: None,
            }),
            _ => None,
        })
        .collect()
}

struct Replay<'a, 'w> {
    old: Track<'w>,
    new: Track<'w>,
    mapping: &'a NodeMapping,
    recorded: &'a RecordedRun,
    differences: Vec<Difference>,
    events: usize,
}

impl Replay<'_, '_> {
    /// Walks the history; the first divergence, if any.
    fn run(&mut self) -> Result<Option<Divergence>, ReplayError> {
        let history = &self.recorded.history;
        let mut cursor = 0;
        loop {
            while history
                .get(cursor)
                .is_some_and(|e| written_by_server(e.kind) || e.kind == H::EventIgnored)
            {
                // the server's own notes, and reports that changed nothing
                cursor += 1;
            }
            let Some(entry) = history.get(cursor) else {
                break;
            };
            let (event, decision, next, at) = match self.rebuild(cursor) {
                Ok((event, decision, next)) => (event, decision, next, entry.at),
                // an event that writes no entry came first: a retry's next
                // attempt, a MAP element's report
                Err(error) => match self.silent_event(entry.at, true) {
                    Some((event, decision, at)) => (event, decision, cursor, at),
                    None => return Err(error),
                },
            };
            if let Some(found) = self.step(&event, &decision, entry, at) {
                return Ok(Some(found));
            }
            cursor = next;
        }
        // MAP elements that reported after the last entry
        let last = history.last().cloned();
        while let Some(entry) = &last
            && let Some((event, decision, at)) = self.silent_event(entry.at, false)
        {
            if let Some(found) = self.step(&event, &decision, entry, at) {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    fn step(
        &mut self,
        event: &Event,
        decision: &Decision,
        entry: &RecordedEntry,
        at: Timestamp,
    ) -> Option<Divergence> {
        self.events += 1;
        let found = self.compare(event, decision, entry, at);
        self.old.apply(event, decision);
        found
    }

    /// An event that writes no history entry: a MAP element's report (whose
    /// output the run recorded) or, with `timers`, the soonest timer whose
    /// firing writes none.
    fn silent_event(&self, now: Timestamp, timers: bool) -> Option<(Event, Decision, Timestamp)> {
        let mut candidates: Vec<(Event, Timestamp)> = self
            .element_reports()
            .into_iter()
            .map(|event| (event, now))
            .collect();
        if timers {
            for timer in self.old.timers_due() {
                if let Some(at) = self.old.timers.get(&timer).copied() {
                    candidates.push((Event::TimerFired { timer, seed: 0 }, at));
                }
            }
        }
        candidates.into_iter().find_map(|(event, at)| {
            let decision = self.old.decide(&event, at).ok()?;
            // a report that changes nothing would be tried forever; a
            // timer is at least taken off the pending ones
            let changes = !decision.change.is_empty() || matches!(event, Event::TimerFired { .. });
            (produced(&decision).is_empty() && changes).then_some((event, decision, at))
        })
    }

    /// The event that began at `cursor`: the first candidate for which the
    /// recorded definition reproduces the recorded entries.
    fn rebuild(&self, cursor: usize) -> Result<(Event, Decision, usize), ReplayError> {
        let history = &self.recorded.history;
        let entry = &history[cursor];
        let mut last_error = None;
        let mut decided = None;
        let mut missing: Vec<String> = Vec::new();
        for event in self.candidates(entry) {
            match self.old.decide(&event, entry.at) {
                Ok(decision) => {
                    let made = produced(&decision);
                    if let Some(next) = matched(history, cursor, &made) {
                        return Ok((event, decision, next));
                    }
                    decided.get_or_insert_with(|| {
                        let said: Vec<String> = made.iter().map(Produced::describe).collect();
                        format!("{event:?} decides {}", said.join(", "))
                    });
                }
                Err(DecideError::NeedBlobs(digests)) => missing.extend(digests),
                Err(error) => last_error = Some(error.to_string()),
            }
        }
        // a candidate could not be tried without a blob: that, not the
        // history, is what is missing
        if !missing.is_empty() {
            missing.sort();
            missing.dedup();
            return Err(ReplayError::BlobsNotGiven {
                sequence: entry.sequence,
                digests: missing,
            });
        }
        if let Some(error) = last_error
            && entry.kind == H::RunStarted
        {
            return Err(ReplayError::RecordedDefinitionFails {
                sequence: entry.sequence,
                error,
            });
        }
        Err(ReplayError::NotReproducible {
            sequence: entry.sequence,
            what: as_produced(entry).describe(),
            decided: decided.unwrap_or_else(|| "no event fits".to_owned()),
        })
    }

    /// Events that could have written `entry` first, likeliest first;
    /// every pending timer comes last.
    fn candidates(&self, entry: &RecordedEntry) -> Vec<Event> {
        let mut events = Vec::new();
        let node = entry.node.clone();
        let attempt = entry.attempt.unwrap_or(0);
        let output = || {
            entry
                .details
                .get("output")
                .cloned()
                .or_else(|| {
                    node.as_ref()
                        .and_then(|k| self.recorded.outputs.get(k).cloned())
                })
                .unwrap_or(Json::Null)
        };
        let text = |field: &str| {
            entry
                .details
                .get(field)
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let runs = node.as_ref().map_or(Runs::Other, |k| self.old.runs_as(k));
        match (entry.kind, &node) {
            (H::RunStarted, _) => events.push(Event::RunStarted),
            (H::NodeCompleted | H::CompensationCompleted, Some(key)) => {
                events.extend(completion(runs, key, attempt, output()));
            }
            (H::AttemptFailed | H::CompensationFailed, Some(key)) => {
                let error = ErrorInfo::new(text("code"), text("message"));
                match runs {
                    Runs::Task => events.push(Event::TaskFailed {
                        node: key.clone(),
                        attempt,
                        code: error.code.clone(),
                        message: error.message.clone(),
                        retryable: entry
                            .details
                            .get("retryable")
                            .and_then(Json::as_bool)
                            .unwrap_or(true),
                        details: None,
                        seed: 0,
                    }),
                    Runs::Child => {
                        for status in [ChildStatus::Failed, ChildStatus::Cancelled] {
                            events.push(Event::ChildRunFinished {
                                node: key.clone(),
                                attempt,
                                status,
                                output: Json::Null,
                                error: Some(error.clone()),
                                seed: 0,
                            });
                        }
                    }
                    Runs::Other => {}
                }
            }
            (H::LeaseExpired, Some(key)) => {
                let lost = entry
                    .details
                    .get("worker_lost")
                    .and_then(Json::as_bool)
                    .unwrap_or(false);
                let deliveries = entry
                    .details
                    .get("deliveries")
                    .and_then(Json::as_u64)
                    .and_then(|d| u32::try_from(d).ok())
                    .unwrap_or(1);
                events.push(Event::LeaseExpired {
                    node: key.clone(),
                    attempt,
                    lost_deliveries: lost.then_some(deliveries),
                    seed: 0,
                });
            }
            (H::EventReceived, Some(key)) => events.push(Event::EventReceived {
                name: text("name"),
                payload: output(),
                node: Some(key.clone()),
            }),
            (H::CancelRequested, _) => events.push(Event::CancelRequested {
                reason: text("reason"),
            }),
            (H::RunRetried, _) => events.push(Event::RetryRequested {
                interrupted: self.old.active(),
            }),
            _ => {}
        }
        events.extend(self.element_reports());
        events.extend(
            self.old
                .timers_due()
                .into_iter()
                .map(|timer| Event::TimerFired { timer, seed: 0 }),
        );
        events
    }

    /// Reports of running MAP elements whose outputs the run recorded:
    /// an element's report writes no entry unless it ends its MAP.
    fn element_reports(&self) -> Vec<Event> {
        let mut events = Vec::new();
        for (key, state) in &self.old.store {
            if key.index.is_none() || state.status != NodeStatus::Running {
                continue;
            }
            let Some(output) = self.recorded.outputs.get(key) else {
                continue;
            };
            events.extend(completion(
                self.old.runs_as(key),
                key,
                state.attempt,
                output.clone(),
            ));
        }
        events
    }

    fn mapped(&self, event: &Event) -> Event {
        let mut event = event.clone();
        let key = match &mut event {
            Event::TaskCompleted { node, .. }
            | Event::TaskFailed { node, .. }
            | Event::LeaseExpired { node, .. }
            | Event::ChildRunFinished { node, .. } => Some(node),
            Event::TimerFired { timer, .. } => timer.node.as_mut(),
            Event::EventReceived { node, .. } => node.as_mut(),
            Event::RunStarted | Event::CancelRequested { .. } => None,
            Event::RetryRequested { interrupted } => {
                for key in interrupted.iter_mut() {
                    *key = self.mapping.key(key);
                }
                None
            }
        };
        if let Some(key) = key {
            *key = self.mapping.key(key);
        }
        event
    }

    /// Feeds `event` to the new definition and compares what it decides with
    /// what the run's definition decided (`recorded`).
    fn compare(
        &mut self,
        event: &Event,
        recorded: &Decision,
        entry: &RecordedEntry,
        at: Timestamp,
    ) -> Option<Divergence> {
        let event = self.mapped(event);
        let decision = match self.new.decide(&event, at) {
            Ok(decision) => decision,
            Err(error) => {
                return Some(Divergence {
                    rule: DivergenceRule::DecisionFailed,
                    node: entry.node.as_ref().map(ToString::to_string),
                    sequence: Some(entry.sequence),
                    message: format!(
                        "the new definition cannot decide {}: {error}",
                        as_produced(entry).describe()
                    ),
                });
            }
        };
        let was: Vec<Produced> = produced(recorded)
            .into_iter()
            .map(|mut p| {
                p.node = p.node.map(|k| self.mapping.key(&k));
                p
            })
            .collect();
        let now = produced(&decision);
        if let Some(found) = self.first_difference(&was, &now, entry) {
            return Some(found);
        }
        let found = self.compare_work(recorded, &decision, entry);
        self.new.apply(&event, &decision);
        found
    }

    fn first_difference(
        &self,
        was: &[Produced],
        now: &[Produced],
        entry: &RecordedEntry,
    ) -> Option<Divergence> {
        let at = (0..was.len().max(now.len())).find(|&i| was.get(i) != now.get(i))?;
        let (recorded, new) = (was.get(at), now.get(at));
        let said = |p: Option<&Produced>| p.map_or("nothing".to_owned(), Produced::describe);
        let divergence = |rule, node: Option<&NodeKey>, message: String| Divergence {
            rule,
            node: node.map(|k| self.mapping.old_id(&k.node).to_owned()),
            sequence: Some(entry.sequence),
            message,
        };
        if let Some(r) = recorded
            && let Some(key) = &r.node
            && matches!(r.kind, H::NodeStarted | H::NodeSkipped)
        {
            if let Some(n) = new
                && n.kind == r.kind
                && n.node == r.node
                && n.mark != r.mark
            {
                return Some(divergence(
                    DivergenceRule::NodeChanged,
                    Some(key),
                    format!(
                        "{} is a {} in the run and a {} in the new definition",
                        key,
                        r.mark.as_deref().unwrap_or("?"),
                        n.mark.as_deref().unwrap_or("?")
                    ),
                ));
            }
            if !self.new.wf.contains(&key.node) {
                let active = self
                    .old
                    .active()
                    .iter()
                    .any(|k| self.mapping.key(k).node == key.node)
                    || r.kind == H::NodeStarted;
                let rule = if active && self.recorded_is_waiting_in(key) {
                    DivergenceRule::WaitingNodeRemoved
                } else {
                    DivergenceRule::NodeNotStarted
                };
                return Some(divergence(
                    rule,
                    Some(key),
                    format!(
                        "the run {} {key}; the new definition has no node {}",
                        if r.kind == H::NodeStarted {
                            "started"
                        } else {
                            "skipped"
                        },
                        key.node
                    ),
                ));
            }
            if let Some(switch) = self.switch_before(&key.node) {
                return Some(divergence(
                    DivergenceRule::BranchChanged,
                    Some(&NodeKey::node(switch.clone())),
                    format!(
                        "SWITCH {switch} takes another branch: the run recorded {}, the new definition {}",
                        r.describe(),
                        said(new)
                    ),
                ));
            }
            if r.kind == H::NodeStarted {
                return Some(divergence(
                    DivergenceRule::NodeNotStarted,
                    Some(key),
                    format!(
                        "the run started {key}; the new definition does not ({} instead)",
                        said(new)
                    ),
                ));
            }
        }
        if let Some(n) = new
            && n.kind == H::NodeStarted
        {
            return Some(divergence(
                DivergenceRule::UnexpectedStart,
                n.node.as_ref(),
                format!(
                    "the new definition starts {} where the run recorded {}",
                    said(new),
                    said(recorded)
                ),
            ));
        }
        let ends = [H::RunCompleted, H::RunFailed, H::RunCancelled];
        if recorded.is_some_and(|r| ends.contains(&r.kind))
            || new.is_some_and(|n| ends.contains(&n.kind))
        {
            return Some(divergence(
                DivergenceRule::RunEndDiffers,
                None,
                format!(
                    "the run recorded {}; the new definition decides {}",
                    said(recorded),
                    said(new)
                ),
            ));
        }
        Some(divergence(
            DivergenceRule::HistoryDiffers,
            recorded.and_then(|r| r.node.as_ref()),
            format!(
                "the run recorded {}; the new definition decides {}",
                said(recorded),
                said(new)
            ),
        ))
    }

    /// Whether the run, at the end of its history, still waits in `key`
    /// (mapped id) or one of its elements.
    fn recorded_is_waiting_in(&self, key: &NodeKey) -> bool {
        let last_active: BTreeSet<String> = self
            .recorded
            .history
            .iter()
            .filter(|e| e.kind == H::NodeStarted)
            .filter_map(|e| e.node.as_ref())
            .map(|k| self.mapping.key(k).node)
            .collect();
        last_active.contains(&key.node) && self.old_is_active_at_end(&key.node)
    }

    /// Whether the run's last recorded state leaves `mapped_id` running:
    /// started and never completed, failed or skipped after.
    fn old_is_active_at_end(&self, mapped_id: &str) -> bool {
        let mut active = false;
        for entry in &self.recorded.history {
            let Some(key) = &entry.node else { continue };
            if self.mapping.key(key).node != mapped_id {
                continue;
            }
            match entry.kind {
                H::NodeStarted => active = true,
                H::NodeCompleted | H::NodeFailed | H::NodeSkipped => active = false,
                _ => {}
            }
        }
        active
    }

    /// The SWITCH right before `id` in the recorded definition, if one.
    fn switch_before(&self, id: &str) -> Option<String> {
        let old_id = self.mapping.old_id(id);
        self.old
            .wf
            .predecessors(old_id)
            .into_iter()
            .find(|p| {
                self.old
                    .wf
                    .node(p)
                    .is_some_and(|n| n.node_type == NodeType::Switch)
            })
            .map(|p| self.mapping.id(p).to_owned())
    }

    /// Same entries: now what each started node is asked to do.
    fn compare_work(
        &mut self,
        recorded: &Decision,
        new: &Decision,
        entry: &RecordedEntry,
    ) -> Option<Divergence> {
        let now = work_of(new);
        for was in work_of(recorded) {
            let key = self.mapping.key(&was.node);
            let Some(then) = now.iter().find(|w| w.node == key) else {
                return Some(Divergence {
                    rule: DivergenceRule::NodeChanged,
                    node: Some(was.node.node.clone()),
                    sequence: Some(entry.sequence),
                    message: format!(
                        "{} ran {}; the new definition gives it nothing to do",
                        was.node, was.what
                    ),
                });
            };
            if then.what != was.what {
                return Some(Divergence {
                    rule: DivergenceRule::NodeChanged,
                    node: Some(was.node.node.clone()),
                    sequence: Some(entry.sequence),
                    message: format!(
                        "{} ran {}; the new definition runs {}",
                        was.node, was.what, then.what
                    ),
                });
            }
            if then.input != was.input {
                self.differences.push(Difference {
                    kind: DifferenceKind::InputDiffers,
                    node: was.node.to_string(),
                    message: format!(
                        "{} was given {}; the new definition would give {}",
                        was.node,
                        short(was.input.as_ref()),
                        short(then.input.as_ref())
                    ),
                });
            }
        }
        None
    }

    /// After the history: every node the run is in is there in the new
    /// definition, and what the new definition reads of recorded outputs
    /// it can still read.
    fn end_state(&self) -> Option<Divergence> {
        for key in self.old.active() {
            let mapped = self.mapping.key(&key);
            if !self.new.wf.contains(&mapped.node) {
                return Some(Divergence {
                    rule: DivergenceRule::WaitingNodeRemoved,
                    node: Some(key.node.clone()),
                    sequence: None,
                    message: format!(
                        "the run is in {key}; the new definition has no node {}",
                        mapped.node
                    ),
                });
            }
        }
        self.unreadable_output()
    }

    /// A node the run has not reached whose every read node has an output
    /// must render its input; an error the recorded definition would not
    /// have is a divergence.
    fn unreadable_output(&self) -> Option<Divergence> {
        let state = self.new.state_with_every_node();
        let old_state = self.old.state_with_every_node();
        for node in &self.new.wf.nodes {
            if node.is_compensation || self.new.started(&node.id) {
                continue;
            }
            let reads_only_done = node
                .refs
                .iter()
                .all(|&r| self.new.completed(&self.new.wf.nodes[r].id));
            if !reads_only_done {
                continue;
            }
            let Err(error) = render_node_input(self.new.wf, &state, &node.id) else {
                continue;
            };
            let old_id = self.mapping.old_id(&node.id);
            let failed_before = self.old.wf.contains(old_id)
                && render_node_input(self.old.wf, &old_state, old_id).is_err();
            if failed_before {
                continue;
            }
            return Some(Divergence {
                rule: DivergenceRule::OutputUnreadable,
                node: Some(node.id.clone()),
                sequence: None,
                message: format!(
                    "{} could not render its input from what the run recorded: {error}",
                    node.id
                ),
            });
        }
        None
    }

    /// Differences in nodes the run has not reached, and renames used.
    fn not_reached(&mut self) {
        for (from, to) in self.mapping.pairs() {
            if self.old.started(from) {
                self.differences.push(Difference {
                    kind: DifferenceKind::NodeRenamed,
                    node: from.to_owned(),
                    message: format!("{from} goes on as {to}"),
                });
            }
        }
        let old_def = self.old.wf.definition();
        let new_def = self.new.wf.definition();
        for node in &new_def.nodes {
            if self.new.started(&node.id) {
                continue;
            }
            let old_id = self.mapping.old_id(&node.id);
            let Some(before) = old_def.nodes.iter().find(|n| n.id == old_id) else {
                self.differences.push(Difference {
                    kind: DifferenceKind::NodeAdded,
                    node: node.id.clone(),
                    message: format!("{} is new; the run has not reached it", node.id),
                });
                continue;
            };
            if !self.same_node(before, node) {
                self.differences.push(Difference {
                    kind: DifferenceKind::NodeChanged,
                    node: node.id.clone(),
                    message: format!("{} changed; the run has not reached it", node.id),
                });
            }
        }
        let mapped_from: BTreeSet<&str> = self.mapping.pairs().map(|(from, _)| from).collect();
        for node in &old_def.nodes {
            if new_def.nodes.iter().any(|n| n.id == node.id) || mapped_from.contains(&*node.id) {
                continue;
            }
            if !self.old.started(&node.id) {
                self.differences.push(Difference {
                    kind: DifferenceKind::NodeRemoved,
                    node: node.id.clone(),
                    message: format!("{} is gone; the run never reached it", node.id),
                });
            }
        }
    }

    /// The same node, with the same edges, whatever its id.
    fn same_node(&self, old: &crate::definition::Node, new: &crate::definition::Node) -> bool {
        let body = |node: &crate::definition::Node| {
            let mut value = serde_json::to_value(node).unwrap_or(Json::Null);
            if let Some(object) = value.as_object_mut() {
                object.remove("id");
            }
            value
        };
        // edges to a node only one side has are that node's addition or
        // removal, not a change of this one
        let both = |new_id: &str| {
            self.new.wf.contains(new_id) && self.old.wf.contains(self.mapping.old_id(new_id))
        };
        let edges = |wf: &CompiledWorkflow, id: &str, rename: &dyn Fn(&str) -> String| {
            let definition = wf.definition();
            let mut list: Vec<Json> = definition
                .edges
                .iter()
                .filter(|e| e.from == id || e.to == id)
                .filter(|e| both(&rename(&e.from)) && both(&rename(&e.to)))
                .map(|e| {
                    let mut value = serde_json::to_value(e).unwrap_or(Json::Null);
                    if let Some(object) = value.as_object_mut() {
                        object.insert("from".into(), Json::String(rename(&e.from)));
                        object.insert("to".into(), Json::String(rename(&e.to)));
                    }
                    value
                })
                .collect();
            list.sort_by_key(|v| v.to_string());
            list
        };
        let to_new = |id: &str| self.mapping.id(id).to_owned();
        let same = |id: &str| id.to_owned();
        body(old) == body(new)
            && edges(self.old.wf, &old.id, &to_new) == edges(self.new.wf, &new.id, &same)
    }
}

/// Where the recorded entries from `cursor` on hold `made` (the server's
/// own entries between them skipped): the cursor after them.
fn matched(history: &[RecordedEntry], cursor: usize, made: &[Produced]) -> Option<usize> {
    if made.is_empty() {
        return None;
    }
    let mut at = cursor;
    for want in made {
        while history.get(at).is_some_and(|e| written_by_server(e.kind)) {
            at += 1;
        }
        let entry = history.get(at)?;
        if as_produced(entry) != *want {
            return None;
        }
        at += 1;
    }
    Some(at)
}

fn short(value: Option<&Json>) -> String {
    let text = value.map_or("nothing".to_owned(), Json::to_string);
    if text.chars().count() <= 60 {
        return text;
    }
    let cut: String = text.chars().take(57).collect();
    format!("{cut}...")
}
