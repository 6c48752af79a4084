//! What the state machine reads and writes: the run record, node states,
//! events in, actions out.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// Milliseconds since the Unix epoch. The engine never reads a clock: `now`
/// comes with every call.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn plus_ms(self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)))
    }
}

/// A node of a run: a node id, or `id[index]` for one element of a MAP.
/// Written and parsed as that text (`charge`, `resize[17]`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeKey {
    pub node: String,
    pub index: Option<u32>,
}

impl NodeKey {
    pub fn node(id: impl Into<String>) -> NodeKey {
        NodeKey {
            node: id.into(),
            index: None,
        }
    }

    pub fn element(id: impl Into<String>, index: u32) -> NodeKey {
        NodeKey {
            node: id.into(),
            index: Some(index),
        }
    }

    /// The MAP node of an element key; itself otherwise.
    pub fn parent(&self) -> NodeKey {
        NodeKey::node(self.node.clone())
    }

    /// The row holding the rendered inputs of the MAP `id`'s elements
    /// `chunk * MAP_ARM_SLICE ..` until they start (`id#inputs[chunk]`): no
    /// node id has a `#`, so the key is never a node's or an element's.
    ///
    /// [`MAP_ARM_SLICE`]: crate::MAP_ARM_SLICE
    pub fn map_inputs(id: &str, chunk: u32) -> NodeKey {
        NodeKey::element(format!("{id}{MAP_INPUTS_SUFFIX}"), chunk)
    }

    /// Whether this key names a MAP's row of pending inputs, not a node.
    pub fn is_map_inputs(&self) -> bool {
        self.node.ends_with(MAP_INPUTS_SUFFIX)
    }

    /// The node id this key belongs to: a MAP's for its rows of inputs.
    pub fn node_id(&self) -> &str {
        self.node
            .strip_suffix(MAP_INPUTS_SUFFIX)
            .unwrap_or(&self.node)
    }
}

/// What a MAP's id becomes in the keys of its rows of pending inputs.
const MAP_INPUTS_SUFFIX: &str = "#inputs";

impl fmt::Display for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            None => f.write_str(&self.node),
            Some(i) => write!(f, "{}[{i}]", self.node),
        }
    }
}

impl FromStr for NodeKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_suffix(']').and_then(|r| r.split_once('[')) {
            Some((node, index)) => index
                .parse()
                .map(|i| NodeKey::element(node, i))
                .map_err(|_| format!("invalid node key '{s}': the index must be a number")),
            None if s.contains('[') || s.contains(']') => Err(format!("invalid node key '{s}'")),
            None => Ok(NodeKey::node(s)),
        }
    }
}

impl TryFrom<String> for NodeKey {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<NodeKey> for String {
    fn from(k: NodeKey) -> String {
        k.to_string()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunStatus {
    /// Created, `RunStarted` not yet applied.
    Pending,
    Running,
    /// Failing or cancelled, compensations running; the final status follows.
    Compensating,
    Completed,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NodeStatus {
    /// Some incoming edges resolved, not started.
    Pending,
    /// A task or child run attempt is out.
    Running,
    /// A durable timer or an external event.
    Waiting,
    /// Between attempts, a retry timer set.
    RetryScheduled,
    Completed,
    Failed,
    Skipped,
}

impl NodeStatus {
    /// Counts in the run's active counter.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            NodeStatus::Running | NodeStatus::Waiting | NodeStatus::RetryScheduled
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Pending => "PENDING",
            NodeStatus::Running => "RUNNING",
            NodeStatus::Waiting => "WAITING",
            NodeStatus::RetryScheduled => "RETRY_SCHEDULED",
            NodeStatus::Completed => "COMPLETED",
            NodeStatus::Failed => "FAILED",
            NodeStatus::Skipped => "SKIPPED",
        }
    }
}

/// `{code, message}` of a failure, with the details a worker reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    pub code: String,
    pub message: String,
    /// Structured details from the worker (a traceback, a response body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Json>,
    /// On a run's error: the node (key) whose failure ended the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl ErrorInfo {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> ErrorInfo {
        ErrorInfo {
            code: code.into(),
            message: message.into(),
            details: None,
            node: None,
        }
    }

    /// The same failure, said to have happened at `node`.
    pub fn at_node(mut self, node: String) -> ErrorInfo {
        self.node = Some(node);
        self
    }

    /// The same failure carrying `details` (absent when null).
    pub fn with_details(mut self, details: Option<Json>) -> ErrorInfo {
        self.details = details.filter(|d| !d.is_null());
        self
    }
}

/// Progress of a MAP node, kept in the MAP's own state so that one element's
/// completion touches two rows, not the whole map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapProgress {
    pub total: u32,
    /// Next element index to start.
    pub next: u32,
    pub in_flight: u32,
    pub done: u32,
    /// Slices armed after the first ([`TimerKind::MapArm`] fired): a
    /// slice's timer names its number, so firing one twice arms it once.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub slices: u32,
    /// The elements not started at once wait in rows of inputs
    /// ([`NodeKey::map_inputs`]), and an element's row is written when it
    /// starts. False for a MAP started before those rows existed: all its
    /// element rows were written at its start, with their inputs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chunked: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The state of one node key (a row of `run_nodes`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeState {
    pub status: NodeStatus,
    /// Current attempt, 0 before the first. Keeps counting across a
    /// RetryRequested, so a report for an older attempt is always stale.
    pub attempt: u32,
    /// The attempt that began the current try (retry limits count from it).
    pub first_attempt: u32,
    /// Incoming edges that arrived (JOIN counters; first arrival elsewhere).
    /// Zero counters are left out of the stored row (decision 0061).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub arrived: u32,
    /// Incoming edges skipped (dead-path elimination).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped: u32,
    /// Rendered input of the current try (tasks, child runs, MAP elements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Json>,
    /// Output once completed. JOIN and MAP outputs are assembled from their
    /// branches when read, so they are not copied here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<MapProgress>,
}

impl NodeState {
    pub fn pending() -> NodeState {
        NodeState {
            status: NodeStatus::Pending,
            attempt: 0,
            first_attempt: 0,
            arrived: 0,
            skipped: 0,
            input: None,
            output: None,
            error: None,
            map: None,
        }
    }
}

/// How a run ends once its compensations are done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    Failed(ErrorInfo),
    Cancelled(String),
}

/// Compensations in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compensation {
    /// Completed nodes whose compensation is still to run, next first.
    pub remaining: Vec<String>,
    /// The completed node whose compensation runs now.
    pub current: Option<String>,
    pub ending: Ending,
}

/// The run row: small, loaded with every event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub workflow: String,
    pub version: u32,
    /// Shared, so that copying the record per event does not copy the input.
    /// Stored apart from the record (absent there: null until put back).
    #[serde(default)]
    pub input: Arc<Json>,
    pub status: RunStatus,
    pub started_at: Option<Timestamp>,
    /// Node keys running, waiting or between attempts (a MAP counts once).
    pub active: u32,
    /// Completed nodes that carry `compensate`, in completion order. Empty
    /// lists are left out of the stored record (decision 0061).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compensable: Vec<String>,
    /// Node keys whose failure failed the run (RetryRequested resumes them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<NodeKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<Compensation>,
    /// Compensations ran: the run's completed work was undone, so it cannot
    /// be resumed with RetryRequested.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compensated: bool,
}

/// What `decide` sees: the run record plus the node states that were loaded.
/// `nodes[k] = None` means loaded and not existing yet; a key absent from the
/// map was not loaded, and `decide` asks for it with
/// [`DecideError::NeedNodes`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub run: RunRecord,
    pub nodes: BTreeMap<NodeKey, Option<NodeState>>,
    /// The values of the blobs loaded for expressions to read (never
    /// stored: asked for with [`DecideError::NeedBlobs`]).
    #[serde(skip)]
    pub blobs: crate::blob::BlobValues,
}

impl RunState {
    /// A run that has not started: apply `Event::RunStarted` next.
    pub fn new(
        run_id: impl Into<String>,
        workflow: impl Into<String>,
        version: u32,
        input: Json,
    ) -> RunState {
        RunState {
            run: RunRecord {
                run_id: run_id.into(),
                workflow: workflow.into(),
                version,
                input: Arc::new(input),
                status: RunStatus::Pending,
                started_at: None,
                active: 0,
                compensable: Vec::new(),
                failed: Vec::new(),
                error: None,
                output: None,
                compensation: None,
                compensated: false,
            },
            nodes: BTreeMap::new(),
            blobs: crate::blob::BlobValues::new(),
        }
    }

    /// Applies a decision's change.
    pub fn apply(&mut self, change: &StateChange) {
        if let Some(run) = &change.run {
            self.run = run.clone();
        }
        for (k, s) in &change.nodes {
            self.nodes.insert(k.clone(), Some(s.clone()));
        }
    }

    /// Records loaded node states (`None`: the key does not exist yet).
    pub fn load(&mut self, key: NodeKey, state: Option<NodeState>) {
        self.nodes.insert(key, state);
    }

    /// The state of `key` if loaded and existing.
    pub fn node(&self, key: &NodeKey) -> Option<&NodeState> {
        self.nodes.get(key).and_then(Option::as_ref)
    }
}

/// What one decision changes: the new run record if it changed, and the node
/// states to upsert (only those touched).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StateChange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<(NodeKey, NodeState)>,
}

impl StateChange {
    pub fn is_empty(&self) -> bool {
        self.run.is_none() && self.nodes.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TimerKind {
    /// A WAIT node's timer.
    Wait,
    /// The back-off before the next attempt.
    Retry,
    /// A WAIT_FOR_EVENT node's timeout.
    EventTimeout,
    /// One attempt's `timeout`.
    AttemptTimeout,
    /// The whole run's `timeout`.
    RunTimeout,
    /// A wide MAP's next elements to arm: one transaction arms at most
    /// [`crate::decide::MAP_ARM_SLICE`] of them, and this timer, due at
    /// once, arms the next slice in a transaction of its own.
    MapArm,
}

/// A timer of a run; unique per run, so the store can key timer rows by it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TimerId {
    pub kind: TimerKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeKey>,
    /// Retry: the attempt the timer starts; AttemptTimeout: the attempt it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

impl TimerId {
    pub fn run_timeout() -> TimerId {
        TimerId {
            kind: TimerKind::RunTimeout,
            node: None,
            attempt: None,
        }
    }

    pub fn node(kind: TimerKind, node: NodeKey, attempt: Option<u32>) -> TimerId {
        TimerId {
            kind,
            node: Some(node),
            attempt,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ChildStatus {
    Completed,
    Failed,
    Cancelled,
}

/// Something that happened to a run. Events about an attempt name
/// `(node, attempt)`; the store maps that to its task id. `seed` feeds retry
/// jitter, so the decision stays a pure function of its inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Event {
    RunStarted,
    TaskCompleted {
        node: NodeKey,
        attempt: u32,
        output: Json,
    },
    TaskFailed {
        node: NodeKey,
        attempt: u32,
        code: String,
        message: String,
        retryable: bool,
        /// What the worker reported beside the code, kept on the node's error.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        details: Option<Json>,
        #[serde(default)]
        seed: u64,
    },
    LeaseExpired {
        node: NodeKey,
        attempt: u32,
        /// Set when the worker never confirmed receipt of any of the
        /// attempt's deliveries: how many there were. The attempt fails
        /// with WORKER_LOST rather than LEASE_EXPIRED.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lost_deliveries: Option<u32>,
        #[serde(default)]
        seed: u64,
    },
    TimerFired {
        timer: TimerId,
        #[serde(default)]
        seed: u64,
    },
    EventReceived {
        name: String,
        payload: Json,
        /// The waiting node, when the coordinator matched it (AwaitEvent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<NodeKey>,
    },
    CancelRequested {
        reason: String,
    },
    /// Resume a failed run from its failed nodes. `interrupted` lists the
    /// node keys that were running or waiting when it failed (their tasks,
    /// timers and children were cancelled); they start again too.
    RetryRequested {
        #[serde(default)]
        interrupted: Vec<NodeKey>,
    },
    ChildRunFinished {
        node: NodeKey,
        attempt: u32,
        status: ChildStatus,
        #[serde(default)]
        output: Json,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ErrorInfo>,
        #[serde(default)]
        seed: u64,
    },
}

impl Event {
    /// The node key the event is about, if any.
    pub fn node(&self) -> Option<&NodeKey> {
        match self {
            Event::TaskCompleted { node, .. }
            | Event::TaskFailed { node, .. }
            | Event::LeaseExpired { node, .. }
            | Event::ChildRunFinished { node, .. } => Some(node),
            Event::TimerFired { timer, .. } => timer.node.as_ref(),
            Event::EventReceived { node, .. } => node.as_ref(),
            _ => None,
        }
    }
}

/// A task's concurrency slot: at most `max` tasks of its node and workflow
/// hold a slot per `key` value at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotKey {
    pub key: String,
    pub max: u32,
}

/// What the coordinator must do, in order, in the event's transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Action {
    /// Create (or re-arm, for attempt > 1) the task row and dispatch it: an
    /// outbox row.
    CreateTask {
        node: NodeKey,
        attempt: u32,
        queue: String,
        task_name: String,
        input: Json,
        heartbeat_timeout_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// The value of the TASK node's `rate_limit_key`, if it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rate_limit_key: Option<String>,
        /// The slot the TASK node's `concurrency` asks for, if it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        concurrency: Option<SlotKey>,
    },
    ScheduleTimer {
        timer: TimerId,
        fire_at: Timestamp,
    },
    CancelTimer {
        timer: TimerId,
    },
    /// Cancel the node's task (for a MAP: every element's task and child run).
    CancelTask {
        node: NodeKey,
    },
    /// Every task of the run.
    CancelAllTasks,
    /// Every timer of the run.
    CancelAllTimers,
    /// Wait for the event `name` (to the run, or to `correlation` if set);
    /// if one is pending, feed it back as `EventReceived` now.
    AwaitEvent {
        node: NodeKey,
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        correlation: Option<Json>,
    },
    StartChildRun {
        node: NodeKey,
        attempt: u32,
        workflow: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        version: Option<u32>,
        input: Json,
    },
    CancelChildRun {
        node: NodeKey,
    },
    CancelAllChildRuns,
    CompleteRun {
        output: Json,
    },
    FailRun {
        error: ErrorInfo,
    },
    CancelRun {
        reason: String,
    },
    AppendHistory {
        kind: crate::history::HistoryEventType,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<NodeKey>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
        detail: Json,
    },
}

impl Action {
    /// The node key the action names, if any.
    pub fn node(&self) -> Option<&NodeKey> {
        match self {
            Action::CreateTask { node, .. }
            | Action::CancelTask { node }
            | Action::AwaitEvent { node, .. }
            | Action::StartChildRun { node, .. }
            | Action::CancelChildRun { node } => Some(node),
            Action::ScheduleTimer { timer, .. } | Action::CancelTimer { timer } => {
                timer.node.as_ref()
            }
            Action::AppendHistory { node, .. } => node.as_ref(),
            _ => None,
        }
    }
}

/// The result of one event.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Decision {
    pub change: StateChange,
    pub actions: Vec<Action>,
}

impl Decision {
    /// Whether an `EventReceived` was consumed by a waiting node. If not, the
    /// coordinator keeps the event pending for a wait that starts later.
    pub fn event_consumed(&self) -> bool {
        self.actions
            .iter()
            .any(|a| matches!(a, Action::AppendHistory { kind, .. } if *kind == crate::history::HistoryEventType::EventReceived))
    }
}

/// Why `decide` could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// Load these node states (`None` for those that do not exist) and call
    /// again with the same event.
    #[error("node states not loaded: {0:?}")]
    NeedNodes(Vec<NodeKey>),
    /// An expression looks inside these blobs (SHA-256, hex): put their
    /// values in [`RunState::blobs`] and call again with the same event.
    #[error("blobs not loaded: {0:?}")]
    NeedBlobs(Vec<String>),
    /// The state contradicts the definition (e.g. a run record from another
    /// version).
    #[error("inconsistent run state: {0}")]
    Inconsistent(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cel_knows_every_node_status() {
        use NodeStatus::*;
        let all = [
            Pending,
            Running,
            Waiting,
            RetryScheduled,
            Completed,
            Failed,
            Skipped,
        ];
        let names: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, crate::cel::NODE_STATUSES.to_vec());
        for s in all {
            assert_eq!(
                serde_json::to_value(s).ok(),
                Some(serde_json::Value::from(s.as_str()))
            );
        }
    }

    #[test]
    fn node_keys_round_trip_as_text() {
        assert_eq!("charge".parse::<NodeKey>(), Ok(NodeKey::node("charge")));
        assert_eq!(
            "resize[17]".parse::<NodeKey>(),
            Ok(NodeKey::element("resize", 17))
        );
        assert_eq!(NodeKey::element("m", 3).to_string(), "m[3]");
        assert!("m[x]".parse::<NodeKey>().is_err());
        assert!("m]".parse::<NodeKey>().is_err());
        let json = serde_json::to_string(&NodeKey::element("m", 3)).unwrap_or_default();
        assert_eq!(json, "\"m[3]\"");
    }
}
