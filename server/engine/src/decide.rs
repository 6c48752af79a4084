//! The state machine: `decide(workflow, state, event, now) -> Decision`.
//!
//! Pure: the same inputs give the same decision. The cost of one event is
//! bounded by the node states it touches: JOIN and MAP keep counters in their
//! own state, the run's completion is read from its active counter, and
//! cancellation is run-scoped (`CancelAll*`), so nothing scans the run.

use crate::history::HistoryEventType as H;
use std::collections::{BTreeMap, HashSet, VecDeque};

use serde_json::{Value as Json, json};

use crate::blob;
use crate::cel::{Env, NodeField, Val, Whole};
use crate::compile::{CompiledWorkflow, HTTP_QUEUE, Kind, MAX_CONCURRENCY_KEY_BYTES, MapElement};
use crate::definition::NodeType;
use crate::duration::{format_duration, parse_timestamp};
use crate::state::{
    Action, ChildStatus, Compensation, DecideError, Decision, Ending, ErrorInfo, Event,
    MapProgress, NodeKey, NodeState, NodeStatus, RunState, RunStatus, SlotKey, StateChange,
    TimerId, TimerKind, Timestamp,
};

/// Error codes the engine itself produces.
pub mod codes {
    pub const TIMEOUT: &str = "TIMEOUT";
    pub const LEASE_EXPIRED: &str = "LEASE_EXPIRED";
    /// Every delivery of the attempt was lost with its worker before the
    /// worker confirmed receipt: the task keeps killing its workers, or no
    /// worker can take it.
    pub const WORKER_LOST: &str = "WORKER_LOST";
    pub const RUN_TIMEOUT: &str = "RUN_TIMEOUT";
    pub const INPUT_ERROR: &str = "INPUT_ERROR";
    pub const OUTPUT_ERROR: &str = "OUTPUT_ERROR";
    pub const CHILD_FAILED: &str = "CHILD_FAILED";
    pub const CHILD_CANCELLED: &str = "CHILD_CANCELLED";
    /// The run was cancelled; the message is the reason given.
    pub const CANCELLED: &str = "CANCELLED";
    /// A child run would be deeper than the server allows. Never retried,
    /// at any level: a retry would only start the same too-deep tree again.
    pub const SUB_WORKFLOW_TOO_DEEP: &str = "SUB_WORKFLOW_TOO_DEEP";
    /// The run's tree already holds `--max-runs-per-tree` runs; not retried.
    pub const RUN_TREE_TOO_LARGE: &str = "RUN_TREE_TOO_LARGE";
}

/// Decides what `event` does to the run. On `Err(NeedNodes(keys))`, load
/// those node states into `state` and call again.
pub fn decide(
    wf: &CompiledWorkflow,
    state: &RunState,
    event: &Event,
    now: Timestamp,
) -> Result<Decision, DecideError> {
    let mut ctx = Ctx {
        wf,
        state,
        now,
        run: state.run.clone(),
        touched: BTreeMap::new(),
        actions: Vec::new(),
        work: VecDeque::new(),
        missing_blobs: Default::default(),
        input_holds_blobs: Default::default(),
    };
    let handled = ctx.handle(event);
    let missing = ctx.missing_blobs.take();
    match handled {
        Err(DecideError::NeedNodes(keys)) => Err(DecideError::NeedNodes(keys)),
        // what was decided read a null in a blob's stead: decide again
        // with the blob
        _ if !missing.is_empty() => Err(DecideError::NeedBlobs(missing)),
        Err(error) => Err(error),
        Ok(()) => Ok(ctx.finish()),
    }
}

/// Decides `event` as a coordinator would: node states are read from
/// `stored` (what [`prefetch`] names first, then whatever [`decide`] asks
/// for) into `state`. Returns the decision and how many extra load rounds
/// it took.
pub fn decide_from(
    wf: &CompiledWorkflow,
    state: &mut RunState,
    stored: &BTreeMap<NodeKey, NodeState>,
    event: &Event,
    now: Timestamp,
) -> Result<(Decision, usize), DecideError> {
    for key in prefetch(wf, state, event) {
        let found = stored.get(&key).cloned();
        state.load(key, found);
    }
    for round in 0..10_000 {
        match decide(wf, state, event, now) {
            Ok(decision) => return Ok((decision, round)),
            Err(DecideError::NeedNodes(keys)) => {
                let before = state.nodes.len();
                for key in keys {
                    let found = stored.get(&key).cloned();
                    state.load(key, found);
                }
                if state.nodes.len() == before {
                    return Err(DecideError::Inconsistent(
                        "NeedNodes asked for loaded keys".into(),
                    ));
                }
            }
            Err(error) => return Err(error),
        }
    }
    Err(DecideError::Inconsistent("too many load rounds".into()))
}

/// The input node `id` would be given if it started now, rendered against
/// `state` (which must hold the nodes it reads). A MAP's elements and
/// nodes that take no input answer `Ok(None)`.
pub fn render_node_input(
    wf: &CompiledWorkflow,
    state: &RunState,
    id: &str,
) -> Result<Option<Json>, String> {
    let Some(idx) = wf.node_index(id) else {
        return Ok(None);
    };
    if wf.nodes[idx].input.is_none() {
        return Ok(None);
    }
    let ctx = Ctx {
        wf,
        state,
        now: Timestamp(0),
        run: state.run.clone(),
        touched: BTreeMap::new(),
        actions: Vec::new(),
        work: VecDeque::new(),
        missing_blobs: Default::default(),
        input_holds_blobs: Default::default(),
    };
    ctx.render_input(idx, None).map(Some)
}

/// Node keys an event will likely touch, not yet in `state`: load them
/// before calling [`decide`] so that one call usually suffices.
pub fn prefetch(wf: &CompiledWorkflow, state: &RunState, event: &Event) -> Vec<NodeKey> {
    let mut p = Prefetch {
        wf,
        state,
        keys: Vec::new(),
        seen: HashSet::new(),
    };
    let failure = matches!(
        event,
        Event::TaskFailed { .. }
            | Event::LeaseExpired { .. }
            | Event::CancelRequested { .. }
            | Event::ChildRunFinished { .. }
            | Event::TimerFired { .. }
    );
    match event {
        Event::RunStarted => {
            p.node_and_refs(wf.start);
            p.successors(wf.start, 3);
        }
        Event::RetryRequested { interrupted } => {
            for k in state.run.failed.iter().chain(interrupted) {
                p.add(k.clone());
                p.add(k.parent());
            }
        }
        Event::EventReceived {
            name, node: None, ..
        } => {
            for (i, n) in wf.nodes.iter().enumerate() {
                if matches!(&n.kind, Kind::WaitForEvent { event, .. } if event == name) {
                    p.add(NodeKey::node(n.id.clone()));
                    p.successors(i, 3);
                }
            }
        }
        _ => {}
    }
    if let Some(key) = event.node() {
        p.add(key.clone());
        if key.index.is_some() {
            p.add(key.parent());
        }
        if let Some(idx) = wf.node_index(&key.node) {
            p.successors(idx, 3);
        }
    }
    // A failure or a cancellation may start the compensations.
    if failure {
        for id in state.run.compensable.iter().rev() {
            if let Some(comp) = wf.node(id).and_then(|n| n.compensate) {
                p.node_and_refs(comp);
            }
        }
    }
    // The next compensation starts after this one's report.
    if let Some(Compensation { remaining, .. }) = &state.run.compensation
        && let Some(comp) = remaining
            .first()
            .and_then(|id| wf.node(id))
            .and_then(|n| n.compensate)
    {
        p.node_and_refs(comp);
    }
    // The event may end the run: the output reads these.
    if state.run.active <= 1 {
        for &r in &wf.output_refs {
            p.add(p.key(r));
        }
    }
    p.keys
}

impl RunState {
    /// Node keys `event` will likely touch that are not loaded yet; see
    /// [`prefetch`].
    pub fn prefetch(&self, wf: &CompiledWorkflow, event: &Event) -> Vec<NodeKey> {
        prefetch(wf, self, event)
    }
}

struct Prefetch<'a> {
    wf: &'a CompiledWorkflow,
    state: &'a RunState,
    keys: Vec<NodeKey>,
    /// `keys` as a set: a FORK's successors are thousands of keys.
    seen: HashSet<NodeKey>,
}

impl Prefetch<'_> {
    fn add(&mut self, k: NodeKey) {
        if !self.state.nodes.contains_key(&k) && self.seen.insert(k.clone()) {
            self.keys.push(k);
        }
    }

    fn key(&self, idx: usize) -> NodeKey {
        NodeKey::node(self.wf.nodes[idx].id.clone())
    }

    fn node_and_refs(&mut self, idx: usize) {
        self.add(self.key(idx));
        for &r in &self.wf.nodes[idx].refs {
            self.add(self.key(r));
        }
    }

    /// Successors and what their start reads; through SWITCH and FORK (which
    /// complete as they start) up to `depth` levels. Not through a JOIN: it
    /// fires on one event of many, and its successors need not be loaded for
    /// the others.
    fn successors(&mut self, idx: usize, depth: u32) {
        let wf = self.wf;
        for &e in &wf.nodes[idx].out_edges {
            let edge = &wf.edges[e];
            for &r in &edge.refs {
                self.add(self.key(r));
            }
            self.node_and_refs(edge.to);
            let instant = matches!(wf.nodes[edge.to].kind, Kind::Switch | Kind::Fork);
            if instant && depth > 1 {
                self.successors(edge.to, depth - 1);
            }
        }
    }
}

/// The most elements of a MAP one transaction arms: a wider MAP arms the
/// rest in slices of this many, each in a transaction of its own (a
/// [`TimerKind::MapArm`] due at once), so starting a MAP of ten thousand
/// never writes ten thousand tasks in one commit that every other commit
/// then waits behind.
pub const MAP_ARM_SLICE: u32 = 250;

/// Node types whose attempts are worker tasks (MAP: its task elements).
const TASK_TYPES: [NodeType; 4] = [
    NodeType::Task,
    NodeType::Http,
    NodeType::Code,
    NodeType::Map,
];

enum Work {
    Arrive { to: usize, from: usize },
    Skip { to: usize },
}

struct Ctx<'a> {
    wf: &'a CompiledWorkflow,
    state: &'a RunState,
    now: Timestamp,
    run: crate::state::RunRecord,
    touched: BTreeMap<NodeKey, NodeState>,
    actions: Vec<Action>,
    work: VecDeque<Work>,
    /// Blobs an expression looked inside and `state.blobs` lacks.
    missing_blobs: std::cell::RefCell<Vec<String>>,
    /// Whether the run's input holds references (learnt once).
    input_holds_blobs: std::cell::OnceCell<bool>,
}

type R<T = ()> = Result<T, DecideError>;

struct EvalEnv<'c, 'a> {
    ctx: &'c Ctx<'a>,
    item: Option<&'c Json>,
    index: Option<u32>,
}

impl Env for EvalEnv<'_, '_> {
    fn input(&self) -> Val {
        Val::from_json(&self.ctx.resolved(&self.ctx.run.input))
    }

    fn input_json(&self) -> Option<&Json> {
        // with references in it, selections go through `input()`
        let holds = *self
            .ctx
            .input_holds_blobs
            .get_or_init(|| blob::holds_references(&self.ctx.run.input));
        (!holds).then_some(&*self.ctx.run.input)
    }

    fn stored(&self, whole: Whole<'_>) -> Option<Json> {
        let value = match whole {
            Whole::Input => Json::clone(&self.ctx.run.input),
            Whole::NodeOutput(id) => {
                let st = self.ctx.peek(&NodeKey::node(id))?;
                if st.status != NodeStatus::Completed {
                    return None;
                }
                self.ctx.output_of(id, st)
            }
        };
        blob::holds_references(&value).then_some(value)
    }

    fn run(&self) -> Val {
        let mut m = BTreeMap::new();
        m.insert("id".into(), Val::Str(self.ctx.run.run_id.clone()));
        m.insert("workflow".into(), Val::Str(self.ctx.run.workflow.clone()));
        m.insert("version".into(), Val::Int(i64::from(self.ctx.run.version)));
        m.insert(
            "started_at".into(),
            Val::Timestamp(self.ctx.run.started_at.unwrap_or(self.ctx.now).0),
        );
        Val::Map(m)
    }

    fn item(&self) -> Val {
        self.item
            .map_or(Val::Null, |item| Val::from_json(&self.ctx.resolved(item)))
    }

    fn index(&self) -> Val {
        self.index.map_or(Val::Null, |i| Val::Int(i64::from(i)))
    }

    fn node(&self, id: &str, field: NodeField) -> Val {
        let key = NodeKey::node(id);
        let st = self.ctx.peek(&key);
        match field {
            NodeField::Status => Val::Str(st.map_or("PENDING", |s| s.status.as_str()).to_owned()),
            NodeField::Error => st.and_then(|s| s.error.as_ref()).map_or(Val::Null, |e| {
                Val::from_json(&json!({"code": e.code, "message": e.message}))
            }),
            NodeField::Output => match st {
                Some(s) if s.status == NodeStatus::Completed => {
                    Val::from_json(&self.ctx.resolved(&self.ctx.output_of(id, s)))
                }
                _ => Val::Null,
            },
        }
    }
}

fn ignored(reason: &str) -> Json {
    json!({ "reason": reason })
}

impl<'a> Ctx<'a> {
    // ------------------------------------------------------------ state access

    /// `value` as an expression reads it: references replaced by the
    /// blobs' values (those not loaded are noted, and read as null).
    fn resolved<'v>(&self, value: &'v Json) -> std::borrow::Cow<'v, Json> {
        if !blob::holds_references(value) {
            return std::borrow::Cow::Borrowed(value);
        }
        let mut missing = self.missing_blobs.borrow_mut();
        std::borrow::Cow::Owned(blob::substitute(value, &self.state.blobs, &mut missing))
    }

    /// A loaded state (touched first), `None` if not loaded or not existing.
    fn peek(&self, key: &NodeKey) -> Option<&NodeState> {
        self.touched
            .get(key)
            .or_else(|| self.state.nodes.get(key).and_then(Option::as_ref))
    }

    fn is_loaded(&self, key: &NodeKey) -> bool {
        self.touched.contains_key(key) || self.state.nodes.contains_key(key)
    }

    /// The state of `key`; asks for it (and what it leads to) if not loaded.
    fn load(&self, key: &NodeKey) -> R<Option<NodeState>> {
        if let Some(s) = self.touched.get(key) {
            return Ok(Some(s.clone()));
        }
        match self.state.nodes.get(key) {
            Some(s) => Ok(s.clone()),
            None => {
                let mut keys = vec![key.clone()];
                if let Some(idx) = self.wf.node_index(&key.node) {
                    for &e in &self.wf.nodes[idx].out_edges {
                        let k = NodeKey::node(self.wf.nodes[self.wf.edges[e].to].id.clone());
                        if !self.is_loaded(&k) && !keys.contains(&k) {
                            keys.push(k);
                        }
                    }
                }
                Err(DecideError::NeedNodes(keys))
            }
        }
    }

    fn put(&mut self, key: NodeKey, st: NodeState) {
        self.touched.insert(key, st);
    }

    fn key(&self, idx: usize) -> NodeKey {
        NodeKey::node(self.wf.nodes[idx].id.clone())
    }

    /// Makes sure every node in `refs`, and for JOIN/MAP outputs their
    /// branches, is loaded: one `NeedNodes` with all that is missing.
    fn ensure_loaded(&self, refs: &[usize]) -> R {
        let mut missing = Vec::new();
        for &r in refs {
            let key = self.key(r);
            if !self.is_loaded(&key) {
                missing.push(key);
                continue;
            }
            let Some(st) = self.peek(&key) else { continue };
            if st.status != NodeStatus::Completed {
                continue;
            }
            match self.wf.nodes[r].node_type {
                NodeType::Join => {
                    for &e in &self.wf.nodes[r].in_edges {
                        let k = self.key(self.wf.edges[e].from);
                        if !self.is_loaded(&k) {
                            missing.push(k);
                        }
                    }
                }
                NodeType::Map => {
                    let total = st.map.as_ref().map_or(0, |m| m.total);
                    for i in 0..total {
                        let k = NodeKey::element(self.wf.nodes[r].id.clone(), i);
                        if !self.is_loaded(&k) {
                            missing.push(k);
                        }
                    }
                }
                _ => {}
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(DecideError::NeedNodes(missing))
        }
    }

    /// A completed node's output; JOIN and MAP outputs are assembled from
    /// their branches (loaded by `ensure_loaded`).
    fn output_of(&self, id: &str, st: &NodeState) -> Json {
        let Some(node) = self.wf.node(id) else {
            return Json::Null;
        };
        match node.node_type {
            NodeType::Join => {
                let mut m = serde_json::Map::new();
                for &e in &node.in_edges {
                    let from = &self.wf.nodes[self.wf.edges[e].from].id;
                    if let Some(s) = self.peek(&NodeKey::node(from.clone()))
                        && s.status == NodeStatus::Completed
                    {
                        m.insert(from.clone(), self.output_of(from, s));
                    }
                }
                Json::Object(m)
            }
            NodeType::Map => {
                let total = st.map.as_ref().map_or(0, |m| m.total);
                Json::Array(
                    (0..total)
                        .map(|i| {
                            self.peek(&NodeKey::element(id, i))
                                .and_then(|s| s.output.clone())
                                .unwrap_or(Json::Null)
                        })
                        .collect(),
                )
            }
            _ => st.output.clone().unwrap_or(Json::Null),
        }
    }

    fn history(&mut self, kind: H, node: Option<&NodeKey>, attempt: Option<u32>, detail: Json) {
        self.actions.push(Action::AppendHistory {
            kind,
            node: node.cloned(),
            attempt,
            detail,
        });
    }

    fn ignore(&mut self, node: Option<&NodeKey>, attempt: Option<u32>, reason: &str) {
        self.history(H::EventIgnored, node, attempt, ignored(reason));
    }

    fn finish(self) -> Decision {
        let run = (self.run != self.state.run).then_some(self.run);
        let nodes = self
            .touched
            .into_iter()
            .filter(|(k, s)| self.state.nodes.get(k).and_then(Option::as_ref) != Some(s))
            .collect();
        Decision {
            change: StateChange { run, nodes },
            actions: self.actions,
        }
    }

    // ------------------------------------------------------------ events

    fn handle(&mut self, event: &Event) -> R {
        match event {
            Event::RunStarted => self.run_started()?,
            Event::TaskCompleted {
                node,
                attempt,
                output,
            } => {
                if let Some((idx, st)) = self.current_attempt(node, *attempt, &TASK_TYPES, false)? {
                    self.attempt_succeeded(node, idx, st, output.clone())?;
                }
            }
            Event::TaskFailed {
                node,
                attempt,
                code,
                message,
                retryable,
                details,
                seed,
            } => {
                if let Some((idx, st)) = self.current_attempt(node, *attempt, &TASK_TYPES, false)? {
                    self.attempt_failed(
                        node,
                        idx,
                        st,
                        ErrorInfo::new(code.clone(), message.clone()).with_details(details.clone()),
                        *retryable,
                        *seed,
                    )?;
                }
            }
            Event::LeaseExpired {
                node,
                attempt,
                lost_deliveries,
                seed,
            } => {
                if let Some((idx, st)) = self.current_attempt(node, *attempt, &TASK_TYPES, false)? {
                    let (details, error) = lease_end(*attempt, *lost_deliveries);
                    self.history(H::LeaseExpired, Some(node), Some(*attempt), details);
                    self.attempt_failed(node, idx, st, error, true, *seed)?;
                }
            }
            Event::ChildRunFinished {
                node,
                attempt,
                status,
                output,
                error,
                seed,
            } => {
                if let Some((idx, st)) = self.current_attempt(
                    node,
                    *attempt,
                    &[NodeType::SubWorkflow, NodeType::Map],
                    true,
                )? {
                    match status {
                        ChildStatus::Completed => {
                            self.attempt_succeeded(node, idx, st, output.clone())?
                        }
                        ChildStatus::Failed => {
                            let e = error.clone().unwrap_or_else(|| {
                                ErrorInfo::new(codes::CHILD_FAILED, "the child run failed")
                            });
                            let retryable = e.code != codes::SUB_WORKFLOW_TOO_DEEP
                                && e.code != codes::RUN_TREE_TOO_LARGE;
                            self.attempt_failed(node, idx, st, e, retryable, *seed)?
                        }
                        ChildStatus::Cancelled => {
                            let e = ErrorInfo::new(
                                codes::CHILD_CANCELLED,
                                "the child run was cancelled",
                            );
                            self.attempt_failed(node, idx, st, e, false, *seed)?
                        }
                    }
                }
            }
            Event::TimerFired { timer, seed } => self.timer_fired(timer, *seed)?,
            Event::EventReceived {
                name,
                payload,
                node,
            } => self.event_received(name, payload, node.as_ref())?,
            Event::CancelRequested { reason } => match self.run.status {
                RunStatus::Pending | RunStatus::Running => {
                    self.history(H::CancelRequested, None, None, json!({ "reason": reason }));
                    self.end_run(Ending::Cancelled(reason.clone()))?;
                }
                _ => self.ignore(None, None, "the run is not running"),
            },
            Event::RetryRequested { interrupted } => self.retry_run(interrupted)?,
        }
        self.drain()?;
        self.check_completion()
    }

    /// Whether the event names the current attempt of a running node key; if
    /// not, it is recorded as ignored and nothing changes.
    fn current_attempt(
        &mut self,
        key: &NodeKey,
        attempt: u32,
        types: &[NodeType],
        child: bool,
    ) -> R<Option<(usize, NodeState)>> {
        let Some(idx) = self.wf.node_index(&key.node) else {
            self.ignore(Some(key), Some(attempt), "unknown node");
            return Ok(None);
        };
        let node = &self.wf.nodes[idx];
        let kind_ok = types.contains(&node.node_type)
            && match (&node.kind, key.index) {
                (Kind::Map { element, .. }, Some(_)) => {
                    matches!(element, MapElement::Workflow { .. }) == child
                }
                (Kind::Map { .. }, None) => false,
                (_, Some(_)) => false,
                _ => true,
            };
        if !kind_ok {
            self.ignore(
                Some(key),
                Some(attempt),
                "the event does not apply to this node type",
            );
            return Ok(None);
        }
        let compensating = self.run.status == RunStatus::Compensating;
        if compensating {
            let current = self.current_compensation();
            if current.as_ref() != Some(key) {
                self.ignore(Some(key), Some(attempt), "the run is compensating");
                return Ok(None);
            }
        } else if self.run.status != RunStatus::Running {
            self.ignore(Some(key), Some(attempt), "the run is not running");
            return Ok(None);
        }
        let Some(st) = self.load(key)? else {
            self.ignore(Some(key), Some(attempt), "no such attempt");
            return Ok(None);
        };
        if attempt != st.attempt {
            self.ignore(
                Some(key),
                Some(attempt),
                &format!("stale attempt (current attempt is {})", st.attempt),
            );
            return Ok(None);
        }
        if st.status != NodeStatus::Running {
            let reason = if matches!(st.status, NodeStatus::Completed | NodeStatus::Failed) {
                "duplicate: attempt already finished"
            } else {
                "the attempt is not running"
            };
            self.ignore(Some(key), Some(attempt), reason);
            return Ok(None);
        }
        if key.index.is_some() && !compensating {
            let parent = self.load(&key.parent())?;
            if parent.map(|p| p.status) != Some(NodeStatus::Running) {
                self.ignore(Some(key), Some(attempt), "the MAP is no longer running");
                return Ok(None);
            }
        }
        Ok(Some((idx, st)))
    }

    fn current_compensation(&self) -> Option<NodeKey> {
        let c = self.run.compensation.as_ref()?.current.as_ref()?;
        let comp = self.wf.node(c)?.compensate?;
        Some(self.key(comp))
    }

    fn run_started(&mut self) -> R {
        if self.run.status != RunStatus::Pending {
            self.ignore(None, None, "duplicate: the run already started");
            return Ok(());
        }
        self.run.status = RunStatus::Running;
        self.run.started_at = Some(self.now);
        self.history(
            H::RunStarted,
            None,
            None,
            json!({ "input": self.run.input }),
        );
        if let Some(ms) = self.wf.run_timeout_ms {
            self.actions.push(Action::ScheduleTimer {
                timer: TimerId::run_timeout(),
                fire_at: self.now.plus_ms(ms),
            });
        }
        let start = self.wf.start;
        let key = self.key(start);
        let mut st = self.load(&key)?.unwrap_or_else(NodeState::pending);
        st.arrived += 1;
        self.start_node(start, st)
    }

    fn timer_fired(&mut self, timer: &TimerId, seed: u64) -> R {
        if timer.kind == TimerKind::RunTimeout {
            if self.run.status != RunStatus::Running {
                self.ignore(None, None, "the run is not running");
                return Ok(());
            }
            let limit = self
                .wf
                .run_timeout_ms
                .map(|ms| format_duration(ms as i64))
                .unwrap_or_default();
            return self.end_run(Ending::Failed(ErrorInfo::new(
                codes::RUN_TIMEOUT,
                format!("the run exceeded its timeout of {limit}"),
            )));
        }
        let Some(key) = &timer.node else {
            self.ignore(None, timer.attempt, "timer without a node");
            return Ok(());
        };
        match timer.kind {
            TimerKind::AttemptTimeout => {
                let attempt = timer.attempt.unwrap_or(0);
                let types = [
                    NodeType::Task,
                    NodeType::Http,
                    NodeType::Code,
                    NodeType::Map,
                    NodeType::SubWorkflow,
                ];
                let child = self.wf.node(&key.node).is_some_and(|n| {
                    n.node_type == NodeType::SubWorkflow
                        || matches!(
                            &n.kind,
                            Kind::Map {
                                element: MapElement::Workflow { .. },
                                ..
                            }
                        )
                });
                if let Some((idx, st)) = self.current_attempt(key, attempt, &types, child)? {
                    let ms = self.wf.nodes[idx].timeout_ms.unwrap_or(0) as i64;
                    if child {
                        self.actions
                            .push(Action::CancelChildRun { node: key.clone() });
                    } else {
                        self.actions.push(Action::CancelTask { node: key.clone() });
                    }
                    let error = ErrorInfo::new(
                        codes::TIMEOUT,
                        format!(
                            "attempt {attempt} exceeded its timeout of {}",
                            format_duration(ms)
                        ),
                    );
                    self.attempt_failed(key, idx, st, error, true, seed)?;
                }
            }
            TimerKind::Retry => {
                let attempt = timer.attempt.unwrap_or(0);
                let Some(idx) = self.wf.node_index(&key.node) else {
                    self.ignore(Some(key), Some(attempt), "unknown node");
                    return Ok(());
                };
                let running = match self.run.status {
                    RunStatus::Running => true,
                    RunStatus::Compensating => self.current_compensation().as_ref() == Some(key),
                    _ => false,
                };
                let mut st = if running { self.load(key)? } else { None };
                if st.is_some() && key.index.is_some() && self.run.status == RunStatus::Running {
                    let parent = self.load(&key.parent())?;
                    if parent.map(|p| p.status) != Some(NodeStatus::Running) {
                        st = None;
                    }
                }
                match st {
                    Some(st)
                        if st.status == NodeStatus::RetryScheduled && st.attempt + 1 == attempt =>
                    {
                        self.dispatch(key, idx, st, attempt)?;
                    }
                    _ => self.ignore(Some(key), Some(attempt), "no retry is due for this attempt"),
                }
            }
            TimerKind::Wait | TimerKind::EventTimeout => {
                let Some(idx) = self.wf.node_index(&key.node) else {
                    self.ignore(Some(key), None, "unknown node");
                    return Ok(());
                };
                let want = if timer.kind == TimerKind::Wait {
                    NodeType::Wait
                } else {
                    NodeType::WaitForEvent
                };
                let st = if self.run.status == RunStatus::Running
                    && self.wf.nodes[idx].node_type == want
                {
                    self.load(key)?
                } else {
                    None
                };
                match st {
                    Some(st) if st.status == NodeStatus::Waiting => {
                        if timer.kind == TimerKind::Wait {
                            self.history(H::WaitElapsed, Some(key), None, json!({}));
                            self.complete_node(idx, st, Some(json!({ "fired_at": self.now.0 })))?;
                        } else {
                            let ms = self.wf.nodes[idx].timeout_ms.unwrap_or(0) as i64;
                            let error = ErrorInfo::new(
                                codes::TIMEOUT,
                                format!("no event within {}", format_duration(ms)),
                            );
                            self.node_failed(idx, key, st, error)?;
                        }
                    }
                    _ => self.ignore(Some(key), None, "the node is not waiting"),
                }
            }
            TimerKind::MapArm => self.arm_map_slice(key, timer.attempt.unwrap_or(0))?,
            TimerKind::RunTimeout => {}
        }
        Ok(())
    }

    /// Schedules the MAP `key`'s slice number `slice`, due at once.
    fn arm_next_slice_soon(&mut self, key: &NodeKey, slice: u32) {
        self.actions.push(Action::ScheduleTimer {
            timer: TimerId::node(TimerKind::MapArm, key.clone(), Some(slice)),
            fire_at: self.now,
        });
    }

    /// Arms the MAP `key`'s slice number `slice`: its next elements, at
    /// most [`MAP_ARM_SLICE`] and up to its concurrency, and schedules the
    /// slice after if one is due. A slice armed already, or a MAP no longer
    /// running (failed, cancelled), arms nothing: the timer only continued
    /// the MAP's start.
    fn arm_map_slice(&mut self, key: &NodeKey, slice: u32) -> R {
        let Some(idx) = self.wf.node_index(&key.node) else {
            return Ok(());
        };
        let Kind::Map { concurrency, .. } = &self.wf.nodes[idx].kind else {
            return Ok(());
        };
        let concurrency = *concurrency;
        if self.run.status != RunStatus::Running {
            return Ok(());
        }
        let Some(mut st) = self.load(key)? else {
            return Ok(());
        };
        let Some(mut progress) = st.map.clone() else {
            return Ok(());
        };
        if st.status != NodeStatus::Running || progress.slices + 1 != slice {
            return Ok(());
        }
        self.arm_elements(key, idx, &mut progress, concurrency)?;
        progress.slices = slice;
        if progress.next < progress.total && progress.in_flight < concurrency {
            self.arm_next_slice_soon(key, slice + 1);
        }
        st.map = Some(progress);
        self.put(key.clone(), st);
        Ok(())
    }

    /// Keeps the rendered inputs of the MAP `id`'s elements from `from` on,
    /// which start later, in rows of [`MAP_ARM_SLICE`] (the element `i`'s
    /// in row `i / MAP_ARM_SLICE`): a MAP of 100,000 writes 400 rows at its
    /// start, not 100,000, and each slice writes the elements it starts.
    fn write_pending_inputs(&mut self, id: &str, from: u32, rest: Vec<Json>) {
        let total = from + rest.len() as u32;
        let mut rest = rest.into_iter();
        for chunk in from / MAP_ARM_SLICE..total.div_ceil(MAP_ARM_SLICE) {
            let start = chunk * MAP_ARM_SLICE;
            let end = (start + MAP_ARM_SLICE).min(total);
            // the places of elements started at once stay null
            let started = from.max(start) - start;
            let mut inputs = vec![Json::Null; started as usize];
            inputs.extend(rest.by_ref().take((end - start - started) as usize));
            let mut row = NodeState::pending();
            row.input = Some(Json::Array(inputs));
            self.put(NodeKey::map_inputs(id, chunk), row);
        }
    }

    /// The rendered input of the MAP `id`'s element `i`, from its row of
    /// inputs (loaded by the caller).
    fn pending_input(&self, id: &str, i: u32) -> R<Json> {
        let chunk = NodeKey::map_inputs(id, i / MAP_ARM_SLICE);
        self.peek(&chunk)
            .and_then(|row| row.input.as_ref())
            .and_then(|inputs| inputs.get((i % MAP_ARM_SLICE) as usize))
            .cloned()
            .ok_or_else(|| {
                DecideError::Inconsistent(format!("element {id}[{i}] has no input in {chunk}"))
            })
    }

    /// Starts the MAP `key`'s next elements in order: as many as its
    /// `concurrency` leaves room for, at most [`MAP_ARM_SLICE`].
    fn arm_elements(
        &mut self,
        key: &NodeKey,
        idx: usize,
        progress: &mut MapProgress,
        concurrency: u32,
    ) -> R {
        let due = (progress.total - progress.next)
            .min(concurrency.saturating_sub(progress.in_flight))
            .min(MAP_ARM_SLICE);
        let range = progress.next..progress.next + due;
        let elements: Vec<NodeKey> = range
            .clone()
            .map(|i| NodeKey::element(key.node.clone(), i))
            .collect();
        let mut wanted = elements.clone();
        if progress.chunked && due > 0 {
            let chunks = range.start / MAP_ARM_SLICE..=(range.end - 1) / MAP_ARM_SLICE;
            wanted.extend(chunks.map(|c| NodeKey::map_inputs(&key.node, c)));
        }
        let missing: Vec<NodeKey> = wanted.into_iter().filter(|k| !self.is_loaded(k)).collect();
        if !missing.is_empty() {
            return Err(DecideError::NeedNodes(missing));
        }
        for (i, ek) in range.zip(&elements) {
            let mut el = if progress.chunked {
                // a row left by an earlier try keeps its attempts counting,
                // so that try's late reports stay stale
                let mut el = NodeState::pending();
                el.attempt = self.peek(ek).map_or(0, |old| old.attempt);
                el.input = Some(self.pending_input(&key.node, i)?);
                el
            } else {
                self.load(ek)?.unwrap_or_else(NodeState::pending)
            };
            let attempt = el.attempt + 1;
            el.first_attempt = attempt;
            self.dispatch(ek, idx, el, attempt)?;
        }
        progress.next += due;
        progress.in_flight += due;
        Ok(())
    }

    fn event_received(&mut self, name: &str, payload: &Json, node: Option<&NodeKey>) -> R {
        if self.run.status != RunStatus::Running {
            self.ignore(node, None, "the run is not running");
            return Ok(());
        }
        let candidates: Vec<usize> = match node {
            Some(k) => self.wf.node_index(&k.node).into_iter().collect(),
            None => (0..self.wf.nodes.len())
                .filter(|&i| matches!(&self.wf.nodes[i].kind, Kind::WaitForEvent { event, .. } if event == name))
                .collect(),
        };
        let mut missing = Vec::new();
        for &c in &candidates {
            let k = self.key(c);
            if !self.is_loaded(&k) {
                missing.push(k);
            }
        }
        if !missing.is_empty() {
            return Err(DecideError::NeedNodes(missing));
        }
        for c in candidates {
            let Kind::WaitForEvent { event, .. } = &self.wf.nodes[c].kind else {
                continue;
            };
            if event != name {
                continue;
            }
            let key = self.key(c);
            let Some(st) = self.load(&key)? else { continue };
            if st.status != NodeStatus::Waiting {
                continue;
            }
            if self.wf.nodes[c].timeout_ms.is_some() {
                self.actions.push(Action::CancelTimer {
                    timer: TimerId::node(TimerKind::EventTimeout, key.clone(), None),
                });
            }
            self.history(H::EventReceived, Some(&key), None, json!({ "name": name }));
            return self.complete_node(c, st, Some(payload.clone()));
        }
        self.history(
            H::EventIgnored,
            node,
            None,
            json!({ "reason": "no node is waiting for this event", "name": name }),
        );
        Ok(())
    }

    // ------------------------------------------------------------ nodes

    /// Starts node `idx` (its first arrival, or a restart).
    fn start_node(&mut self, idx: usize, mut st: NodeState) -> R {
        let wf = self.wf;
        let node = &wf.nodes[idx];
        let key = self.key(idx);
        self.ensure_loaded(&node.refs)?;
        self.history(
            H::NodeStarted,
            Some(&key),
            None,
            json!({ "type": node.node_type }),
        );
        match &node.kind {
            Kind::Switch | Kind::Fork | Kind::Join => {
                let output = if node.node_type == NodeType::Join {
                    None
                } else {
                    Some(Json::Null)
                };
                self.complete_node(idx, st, output)
            }
            Kind::Task { .. }
            | Kind::Http { .. }
            | Kind::Code { .. }
            | Kind::SubWorkflow { .. } => {
                let input = match self.render_input(idx, None) {
                    Ok(input) => input,
                    Err(message) => return self.fail_at_start(idx, st, message),
                };
                st.input = Some(input);
                st.first_attempt = st.attempt + 1;
                st.error = None;
                self.activate(&st);
                let attempt = st.attempt + 1;
                self.dispatch(&key, idx, st, attempt)
            }
            Kind::Wait { duration_ms, until } => {
                let fire_at = match (duration_ms, until) {
                    (Some(ms), _) => self.now.plus_ms(*ms),
                    (None, Some(p)) => {
                        let env = EvalEnv {
                            ctx: self,
                            item: None,
                            index: None,
                        };
                        match p.eval(&env) {
                            Ok(Val::Timestamp(ms)) | Ok(Val::Int(ms)) => Timestamp(ms),
                            Ok(Val::Str(s)) => match parse_timestamp(&s) {
                                Ok(ms) => Timestamp(ms),
                                Err(e) => {
                                    return self.fail_at_start(idx, st, format!("until: {e}"));
                                }
                            },
                            Ok(other) => {
                                return self.fail_at_start(
                                    idx,
                                    st,
                                    format!("until must be a timestamp, not {:?}", other.to_json()),
                                );
                            }
                            Err(e) => return self.fail_at_start(idx, st, format!("until: {e}")),
                        }
                    }
                    (None, None) => self.now,
                };
                if fire_at.0.saturating_sub(self.now.0) > crate::duration::MAX_DURATION_MS as i64 {
                    return self.fail_at_start(
                        idx,
                        st,
                        "until: more than 3660d (about ten years) away, the furthest a timer may be"
                            .to_owned(),
                    );
                }
                self.activate(&st);
                st.status = NodeStatus::Waiting;
                self.put(key.clone(), st);
                self.actions.push(Action::ScheduleTimer {
                    timer: TimerId::node(TimerKind::Wait, key, None),
                    fire_at,
                });
                Ok(())
            }
            Kind::WaitForEvent { event, correlation } => {
                let correlation = match correlation {
                    None => None,
                    Some(p) => match p.eval(&EvalEnv {
                        ctx: self,
                        item: None,
                        index: None,
                    }) {
                        Ok(v) => Some(v.to_json()),
                        Err(e) => return self.fail_at_start(idx, st, format!("correlation: {e}")),
                    },
                };
                self.activate(&st);
                st.status = NodeStatus::Waiting;
                self.put(key.clone(), st);
                if let Some(ms) = node.timeout_ms {
                    self.actions.push(Action::ScheduleTimer {
                        timer: TimerId::node(TimerKind::EventTimeout, key.clone(), None),
                        fire_at: self.now.plus_ms(ms),
                    });
                }
                self.actions.push(Action::AwaitEvent {
                    node: key,
                    name: event.clone(),
                    correlation,
                });
                Ok(())
            }
            Kind::Map {
                items, concurrency, ..
            } => {
                let items = match items.eval(&EvalEnv {
                    ctx: self,
                    item: None,
                    index: None,
                }) {
                    Ok(Val::List(items)) => items,
                    Ok(other) => {
                        return self.fail_at_start(
                            idx,
                            st,
                            format!("items must be a list, not {}", other.to_json()),
                        );
                    }
                    Err(e) => return self.fail_at_start(idx, st, format!("items: {e}")),
                };
                let Ok(total) = u32::try_from(items.len()).map_err(|_| ()).and_then(|n| {
                    if n as usize > crate::compile::MAX_MAP_ITEMS {
                        Err(())
                    } else {
                        Ok(n)
                    }
                }) else {
                    return self.fail_at_start(
                        idx,
                        st,
                        format!(
                            "items has {} elements; a MAP takes at most {}",
                            items.len(),
                            crate::compile::MAX_MAP_ITEMS
                        ),
                    );
                };
                // Every element's input is rendered now, once: later starts
                // read the row of inputs it waits in, never the whole list.
                let mut inputs = Vec::with_capacity(items.len());
                let mut budget = self.wf.max_rendered_bytes;
                for (i, item) in items.iter().enumerate() {
                    let input = match self.render_input(idx, Some((&item.to_json(), i as u32))) {
                        Ok(input) => input,
                        Err(message) => {
                            return self.fail_at_start(idx, st, format!("element {i}: {message}"));
                        }
                    };
                    let size = json_size(&input, budget);
                    if size > budget {
                        let limit = self.wf.max_rendered_bytes;
                        return self.fail_at_start(
                            idx,
                            st,
                            format!(
                                "the inputs of its elements render to more than {limit} bytes \
                                 together (the payload limit)"
                            ),
                        );
                    }
                    budget -= size;
                    inputs.push(input);
                }
                self.activate(&st);
                st.status = NodeStatus::Running;
                st.attempt += 1;
                st.first_attempt = st.attempt;
                // a wide MAP arms a slice now and the rest in transactions
                // of their own, so no one transaction writes thousands of tasks
                let first = total.min(*concurrency).min(MAP_ARM_SLICE);
                st.map = Some(MapProgress {
                    total,
                    next: first,
                    in_flight: first,
                    done: 0,
                    slices: 0,
                    chunked: true,
                });
                if total.min(*concurrency) > first {
                    self.arm_next_slice_soon(&key, 1);
                }
                let later = inputs.split_off(first as usize);
                for (i, input) in inputs.into_iter().enumerate() {
                    let mut el = NodeState::pending();
                    el.input = Some(input);
                    el.first_attempt = 1;
                    self.dispatch(&NodeKey::element(node.id.clone(), i as u32), idx, el, 1)?;
                }
                self.write_pending_inputs(&node.id, first, later);
                if total == 0 {
                    return self.complete_node(idx, st, None);
                }
                self.put(key, st);
                Ok(())
            }
        }
    }

    fn fail_at_start(&mut self, idx: usize, st: NodeState, message: String) -> R {
        let key = self.key(idx);
        self.node_failed(idx, &key, st, ErrorInfo::new(codes::INPUT_ERROR, message))
    }

    fn activate(&mut self, st: &NodeState) {
        if !st.status.is_active() && self.run.status == RunStatus::Running {
            self.run.active += 1;
        }
    }

    fn deactivate(&mut self, key: &NodeKey, st: &NodeState) {
        if key.index.is_none() && st.status.is_active() && self.run.status == RunStatus::Running {
            self.run.active = self.run.active.saturating_sub(1);
        }
    }

    fn render_input(&self, idx: usize, element: Option<(&Json, u32)>) -> Result<Json, String> {
        let node = &self.wf.nodes[idx];
        let env = EvalEnv {
            ctx: self,
            item: element.map(|e| e.0),
            index: element.map(|e| e.1),
        };
        let input = match (&node.input, element) {
            (Some(t), _) => t.render(&env).map_err(|e| format!("input: {e}"))?,
            (None, Some((item, _))) => item.clone(),
            (None, None) => (*self.run.input).clone(),
        };
        let rendered = match &node.kind {
            Kind::Http { request } => request.render(&env).map_err(|e| format!("http: {e}"))?,
            Kind::Code { code, secrets, .. } if !secrets.is_empty() => {
                json!({ "code": code, "input": input, "secrets": secrets })
            }
            Kind::Code { code, .. } => json!({ "code": code, "input": input }),
            _ => input,
        };
        self.within_render_limit("input", rendered)
    }

    /// `value` if its JSON is at most the workflow's render limit: a template
    /// that multiplies its input must fail, not reach the database.
    fn within_render_limit(&self, what: &str, value: Json) -> Result<Json, String> {
        let limit = self.wf.max_rendered_bytes;
        let size = json_size(&value, limit);
        if size > limit {
            return Err(format!(
                "{what}: renders to more than {limit} bytes (the payload limit)"
            ));
        }
        Ok(value)
    }

    /// Sends out attempt `attempt` of `key` (a task or a child run).
    fn dispatch(&mut self, key: &NodeKey, idx: usize, mut st: NodeState, attempt: u32) -> R {
        let node = &self.wf.nodes[idx];
        let rate_limit_key = match self.rate_limit_key(idx)? {
            Ok(key) => key,
            Err(message) => return self.fail_at_start(idx, st, message),
        };
        let concurrency = match self.task_slot(idx)? {
            Ok(slot) => slot,
            Err(message) => return self.fail_at_start(idx, st, message),
        };
        st.attempt = attempt;
        st.status = NodeStatus::Running;
        let input = st.input.clone().unwrap_or(Json::Null);
        let task = |queue: &str, task_name: &str| Action::CreateTask {
            node: key.clone(),
            attempt,
            queue: queue.to_owned(),
            task_name: task_name.to_owned(),
            input: input.clone(),
            heartbeat_timeout_ms: node.heartbeat_timeout_ms,
            timeout_ms: node.timeout_ms,
            rate_limit_key: rate_limit_key.clone(),
            concurrency: concurrency.clone(),
        };
        let child = |workflow: &str, version: Option<u32>| Action::StartChildRun {
            node: key.clone(),
            attempt,
            workflow: workflow.to_owned(),
            version,
            input: input.clone(),
        };
        let action = match &node.kind {
            Kind::Task {
                queue, task: name, ..
            } => task(queue, name),
            Kind::Http { .. } => task(HTTP_QUEUE, "http"),
            Kind::Code { language, .. } => task(&format!("code.{language}"), "code"),
            Kind::SubWorkflow { workflow, version } => child(workflow, *version),
            Kind::Map {
                element: MapElement::Task { queue, task: name },
                ..
            } => task(queue, name),
            Kind::Map {
                element: MapElement::Workflow { workflow, version },
                ..
            } => child(workflow, *version),
            _ => {
                return Err(DecideError::Inconsistent(format!(
                    "node '{}' has no task to dispatch",
                    node.id
                )));
            }
        };
        self.actions.push(action);
        if let Some(ms) = node.timeout_ms {
            self.actions.push(Action::ScheduleTimer {
                timer: TimerId::node(TimerKind::AttemptTimeout, key.clone(), Some(attempt)),
                fire_at: self.now.plus_ms(ms),
            });
        }
        self.put(key.clone(), st);
        Ok(())
    }

    /// The value of a TASK node's `rate_limit_key` for the attempt being
    /// armed: a string as is, null as no key, any other value as its JSON
    /// text; `Err` (inner) fails the node like a bad input.
    fn rate_limit_key(&self, idx: usize) -> Result<Result<Option<String>, String>, DecideError> {
        let node = &self.wf.nodes[idx];
        let Kind::Task {
            rate_limit_key: Some(program),
            ..
        } = &node.kind
        else {
            return Ok(Ok(None));
        };
        // a retry arms again without start_node having loaded the refs
        self.ensure_loaded(&node.refs)?;
        let env = EvalEnv {
            ctx: self,
            item: None,
            index: None,
        };
        Ok(match program.eval(&env) {
            Ok(Val::Str(key)) => Ok(Some(key)),
            Ok(Val::Null) => Ok(None),
            Ok(other) => Ok(Some(other.to_json().to_string())),
            Err(e) => Err(format!("rate_limit_key: {e}")),
        })
    }

    /// The slot a TASK node's `concurrency` asks for, for the attempt being
    /// armed: its key's value (a string of at most
    /// [`MAX_CONCURRENCY_KEY_BYTES`]) and the node's `max`; `Err` (inner)
    /// fails the node like a bad input.
    fn task_slot(&self, idx: usize) -> Result<Result<Option<SlotKey>, String>, DecideError> {
        let node = &self.wf.nodes[idx];
        let Kind::Task {
            concurrency: Some(slot),
            ..
        } = &node.kind
        else {
            return Ok(Ok(None));
        };
        // a retry arms again without start_node having loaded the refs
        self.ensure_loaded(&node.refs)?;
        let env = EvalEnv {
            ctx: self,
            item: None,
            index: None,
        };
        Ok(match slot.key.eval(&env) {
            Ok(Val::Str(key)) if key.len() > MAX_CONCURRENCY_KEY_BYTES => Err(format!(
                "concurrency.key: longer than {MAX_CONCURRENCY_KEY_BYTES} bytes"
            )),
            Ok(Val::Str(key)) => Ok(Some(SlotKey { key, max: slot.max })),
            Ok(other) => Err(format!(
                "concurrency.key: must be a string, not {}",
                other.to_json()
            )),
            Err(e) => Err(format!("concurrency.key: {e}")),
        })
    }

    fn attempt_succeeded(
        &mut self,
        key: &NodeKey,
        idx: usize,
        mut st: NodeState,
        output: Json,
    ) -> R {
        if self.wf.nodes[idx].timeout_ms.is_some() {
            self.actions.push(Action::CancelTimer {
                timer: TimerId::node(TimerKind::AttemptTimeout, key.clone(), Some(st.attempt)),
            });
        }
        if self.run.status == RunStatus::Compensating {
            self.history(
                H::CompensationCompleted,
                Some(key),
                Some(st.attempt),
                json!({ "output": output }),
            );
            st.status = NodeStatus::Completed;
            st.output = Some(output);
            self.put(key.clone(), st);
            return self.next_compensation();
        }
        if key.index.is_some() {
            return self.element_completed(key, idx, st, output);
        }
        self.complete_node(idx, st, Some(output))
    }

    fn attempt_failed(
        &mut self,
        key: &NodeKey,
        idx: usize,
        mut st: NodeState,
        error: ErrorInfo,
        retryable: bool,
        seed: u64,
    ) -> R {
        let node = &self.wf.nodes[idx];
        if node.timeout_ms.is_some() && error.code != codes::TIMEOUT {
            self.actions.push(Action::CancelTimer {
                timer: TimerId::node(TimerKind::AttemptTimeout, key.clone(), Some(st.attempt)),
            });
        }
        let tries = st.attempt.saturating_sub(st.first_attempt) + 1;
        let policy = &node.retry;
        let non_retryable = !retryable || policy.non_retryable.contains(&error.code);
        self.history(
            H::AttemptFailed,
            Some(key),
            Some(st.attempt),
            json!({ "code": error.code, "message": error.message, "retryable": !non_retryable }),
        );
        if non_retryable || tries >= policy.max_attempts {
            return self.node_failed(idx, key, st, error);
        }
        let delay = policy.delay_ms(tries, seed);
        let next = st.attempt + 1;
        st.status = NodeStatus::RetryScheduled;
        st.error = Some(error);
        self.history(
            H::RetryScheduled,
            Some(key),
            Some(next),
            json!({ "delay_ms": delay }),
        );
        self.actions.push(Action::ScheduleTimer {
            timer: TimerId::node(TimerKind::Retry, key.clone(), Some(next)),
            fire_at: self.now.plus_ms(delay),
        });
        self.put(key.clone(), st);
        Ok(())
    }

    fn element_completed(
        &mut self,
        key: &NodeKey,
        idx: usize,
        mut st: NodeState,
        output: Json,
    ) -> R {
        st.status = NodeStatus::Completed;
        st.output = Some(output);
        self.put(key.clone(), st);
        let parent_key = key.parent();
        let Some(mut parent) = self.load(&parent_key)? else {
            return Err(DecideError::Inconsistent(format!(
                "element {key} without its MAP state"
            )));
        };
        let Some(mut progress) = parent.map.clone() else {
            return Err(DecideError::Inconsistent(format!(
                "MAP {parent_key} without progress"
            )));
        };
        progress.done += 1;
        progress.in_flight = progress.in_flight.saturating_sub(1);
        // the freed place, and while a wide MAP is still arming its slices,
        // up to a slice more: completions arm it alongside the continuation
        let Kind::Map { concurrency, .. } = &self.wf.nodes[idx].kind else {
            return Err(DecideError::Inconsistent(format!(
                "element {key} of a node that is not a MAP"
            )));
        };
        self.arm_elements(&parent_key, idx, &mut progress, *concurrency)?;
        let finished = progress.done == progress.total;
        parent.map = Some(progress);
        if finished {
            return self.complete_node(idx, parent, None);
        }
        self.put(parent_key, parent);
        Ok(())
    }

    /// Node `idx` completed (`output` None: assembled when read, JOIN/MAP).
    fn complete_node(&mut self, idx: usize, mut st: NodeState, output: Option<Json>) -> R {
        let key = self.key(idx);
        self.deactivate(&key, &st);
        st.status = NodeStatus::Completed;
        st.output = output;
        st.error = None;
        let node = &self.wf.nodes[idx];
        if node.compensate.is_some() && !self.run.compensable.contains(&node.id) {
            self.run.compensable.push(node.id.clone());
        }
        self.history(
            H::NodeCompleted,
            Some(&key),
            (st.attempt > 0).then_some(st.attempt),
            json!({}),
        );
        self.put(key, st);
        self.route(idx, true).map(|_| ())
    }

    /// A node key failed for good: an element fails its MAP; a node takes its
    /// error edges, or fails the run.
    fn node_failed(&mut self, idx: usize, key: &NodeKey, mut st: NodeState, error: ErrorInfo) -> R {
        if self.run.status == RunStatus::Compensating {
            self.history(
                H::CompensationFailed,
                Some(key),
                Some(st.attempt),
                json!({ "code": error.code, "message": error.message }),
            );
            st.status = NodeStatus::Failed;
            st.error = Some(error);
            self.put(key.clone(), st);
            return self.next_compensation();
        }
        if let Some(i) = key.index {
            st.status = NodeStatus::Failed;
            st.error = Some(error.clone());
            self.put(key.clone(), st);
            let parent_key = key.parent();
            let Some(parent) = self.load(&parent_key)? else {
                return Err(DecideError::Inconsistent(format!(
                    "element {key} without its MAP state"
                )));
            };
            self.actions.push(Action::CancelTask {
                node: parent_key.clone(),
            });
            if matches!(
                &self.wf.nodes[idx].kind,
                Kind::Map {
                    element: MapElement::Workflow { .. },
                    ..
                }
            ) {
                self.actions.push(Action::CancelChildRun {
                    node: parent_key.clone(),
                });
            }
            let error = ErrorInfo::new(error.code, format!("element {i}: {}", error.message));
            return self.fail_node(idx, &parent_key, parent, error, key.clone());
        }
        self.fail_node(idx, key, st, error, key.clone())
    }

    fn fail_node(
        &mut self,
        idx: usize,
        key: &NodeKey,
        mut st: NodeState,
        error: ErrorInfo,
        failed_key: NodeKey,
    ) -> R {
        self.deactivate(key, &st);
        st.status = NodeStatus::Failed;
        st.error = Some(error.clone());
        self.history(
            H::NodeFailed,
            Some(key),
            None,
            json!({ "code": error.code, "message": error.message }),
        );
        self.put(key.clone(), st);
        let handled = self.route(idx, false)?;
        if handled == 0 {
            let at = failed_key.to_string();
            if !self.run.failed.contains(&failed_key) {
                self.run.failed.push(failed_key);
            }
            self.end_run(Ending::Failed(error.at_node(at)))?;
        }
        Ok(())
    }

    /// Resolves the outgoing edges of `idx`; returns how many were taken.
    fn route(&mut self, idx: usize, completed: bool) -> R<usize> {
        let wf = self.wf;
        let node = &wf.nodes[idx];
        let refs: Vec<usize> = node
            .out_edges
            .iter()
            .flat_map(|&e| wf.edges[e].refs.iter().copied())
            .collect();
        self.ensure_loaded(&refs)?;
        let mut taken = vec![false; node.out_edges.len()];
        let holds = |ctx: &mut Ctx<'_>, e: usize| -> bool {
            let Some(p) = &wf.edges[e].when else {
                return true;
            };
            match p.eval(&EvalEnv {
                ctx,
                item: None,
                index: None,
            }) {
                Ok(Val::Bool(b)) => b,
                Ok(other) => {
                    let detail = json!({ "edge": e, "error": format!("when is not a bool: {}", other.to_json()) });
                    ctx.history(H::ExpressionError, Some(&ctx.key(idx)), None, detail);
                    false
                }
                Err(err) => {
                    let detail = json!({ "edge": e, "error": err.to_string() });
                    ctx.history(H::ExpressionError, Some(&ctx.key(idx)), None, detail);
                    false
                }
            }
        };
        if node.node_type == NodeType::Switch && completed {
            let mut chosen = None;
            for (i, &e) in node.out_edges.iter().enumerate() {
                if !wf.edges[e].on_error && wf.edges[e].when.is_some() && holds(self, e) {
                    chosen = Some(i);
                    break;
                }
            }
            if chosen.is_none() {
                chosen = node
                    .out_edges
                    .iter()
                    .position(|&e| !wf.edges[e].on_error && wf.edges[e].when.is_none());
            }
            if let Some(i) = chosen {
                taken[i] = true;
            }
        } else {
            for (i, &e) in node.out_edges.iter().enumerate() {
                taken[i] = wf.edges[e].on_error != completed && holds(self, e);
            }
        }
        let unhandled_failure = !completed && !taken.iter().any(|t| *t);
        for (i, &e) in node.out_edges.iter().enumerate() {
            let to = wf.edges[e].to;
            if taken[i] {
                self.work.push_back(Work::Arrive { to, from: idx });
            } else if !unhandled_failure {
                // A failure nobody handles leaves its edges open: RetryRequested
                // resumes from here.
                self.work.push_back(Work::Skip { to });
            }
        }
        Ok(taken.iter().filter(|t| **t).count())
    }

    /// Arrivals and skip marks, breadth first (no recursion: a long skipped
    /// chain must not grow the stack).
    fn drain(&mut self) -> R {
        while let Some(work) = self.work.pop_front() {
            if self.run.status != RunStatus::Running {
                self.work.clear();
                break;
            }
            match work {
                Work::Arrive { to, from } => {
                    let key = self.key(to);
                    let mut st = self.load(&key)?.unwrap_or_else(NodeState::pending);
                    if self.wf.nodes[to].node_type == NodeType::Join {
                        if st.status != NodeStatus::Pending {
                            self.history(
                                H::ArrivalIgnored,
                                Some(&key),
                                None,
                                json!({ "from": self.wf.nodes[from].id }),
                            );
                            continue;
                        }
                        st.arrived += 1;
                        self.check_join(to, st)?;
                    } else if st.status != NodeStatus::Pending {
                        self.history(
                            H::ArrivalIgnored,
                            Some(&key),
                            None,
                            json!({ "from": self.wf.nodes[from].id, "reason": "the node already started" }),
                        );
                    } else {
                        st.arrived += 1;
                        self.start_node(to, st)?;
                    }
                }
                Work::Skip { to } => {
                    let key = self.key(to);
                    let mut st = self.load(&key)?.unwrap_or_else(NodeState::pending);
                    if st.status != NodeStatus::Pending {
                        continue;
                    }
                    st.skipped += 1;
                    if self.wf.nodes[to].node_type == NodeType::Join {
                        self.check_join(to, st)?;
                    } else if st.skipped as usize >= self.wf.nodes[to].in_edges.len() {
                        self.skip_node(to, st);
                    } else {
                        self.put(key, st);
                    }
                }
            }
        }
        Ok(())
    }

    fn check_join(&mut self, idx: usize, st: NodeState) -> R {
        let incoming = self.wf.nodes[idx].in_edges.len();
        if (st.arrived + st.skipped) as usize >= incoming {
            if st.arrived > 0 {
                return self.start_node(idx, st);
            }
            self.skip_node(idx, st);
            return Ok(());
        }
        let key = self.key(idx);
        self.put(key, st);
        Ok(())
    }

    fn skip_node(&mut self, idx: usize, mut st: NodeState) {
        let key = self.key(idx);
        st.status = NodeStatus::Skipped;
        self.history(H::NodeSkipped, Some(&key), None, json!({}));
        self.put(key, st);
        for &e in &self.wf.nodes[idx].out_edges {
            self.work.push_back(Work::Skip {
                to: self.wf.edges[e].to,
            });
        }
    }

    // ------------------------------------------------------------ run

    fn check_completion(&mut self) -> R {
        if self.run.status != RunStatus::Running || self.run.active > 0 {
            return Ok(());
        }
        self.ensure_loaded(&self.wf.output_refs)?;
        let output = match &self.wf.output {
            None => Ok(Json::Null),
            Some(t) => t
                .render(&EvalEnv {
                    ctx: self,
                    item: None,
                    index: None,
                })
                .map_err(|e| e.to_string())
                .and_then(|output| self.within_render_limit("output", output)),
        };
        match output {
            Ok(output) => {
                if self.wf.run_timeout_ms.is_some() {
                    self.actions.push(Action::CancelTimer {
                        timer: TimerId::run_timeout(),
                    });
                }
                self.run.status = RunStatus::Completed;
                self.run.output = Some(output.clone());
                self.history(H::RunCompleted, None, None, json!({ "output": output }));
                self.actions.push(Action::CompleteRun { output });
                Ok(())
            }
            Err(e) => self.end_run(Ending::Failed(ErrorInfo::new(
                codes::OUTPUT_ERROR,
                format!("output: {e}"),
            ))),
        }
    }

    /// Fails or cancels the run: everything in flight is cancelled (run-scoped,
    /// O(1) here), then compensations run, then the final status.
    fn end_run(&mut self, ending: Ending) -> R {
        if !matches!(self.run.status, RunStatus::Running | RunStatus::Pending) {
            return Ok(());
        }
        self.actions.push(Action::CancelAllTasks);
        self.actions.push(Action::CancelAllTimers);
        self.actions.push(Action::CancelAllChildRuns);
        self.run.active = 0;
        if let Ending::Failed(e) = &ending {
            self.run.error = Some(e.clone());
        }
        if self.run.compensable.is_empty() {
            return self.finalize(ending);
        }
        let remaining: Vec<String> = self.run.compensable.iter().rev().cloned().collect();
        self.history(
            H::CompensationStarted,
            None,
            None,
            json!({ "nodes": remaining }),
        );
        self.run.status = RunStatus::Compensating;
        self.run.compensated = true;
        self.run.compensation = Some(Compensation {
            remaining,
            current: None,
            ending,
        });
        self.next_compensation()
    }

    /// Starts the next compensation, or ends the run when none is left.
    fn next_compensation(&mut self) -> R {
        loop {
            let Some(comp) = self.run.compensation.as_mut() else {
                return Ok(());
            };
            comp.current = None;
            if comp.remaining.is_empty() {
                let ending = comp.ending.clone();
                self.run.compensation = None;
                return self.finalize(ending);
            }
            let done = comp.remaining.remove(0);
            let Some(c) = self.wf.node(&done).and_then(|n| n.compensate) else {
                continue;
            };
            let key = self.key(c);
            self.ensure_loaded(&self.wf.nodes[c].refs)?;
            let mut st = self.load(&key)?.unwrap_or_else(NodeState::pending);
            if let Some(comp) = self.run.compensation.as_mut() {
                comp.current = Some(done.clone());
            }
            self.history(
                H::CompensationNodeStarted,
                Some(&key),
                None,
                json!({ "for": done }),
            );
            match self.render_input(c, None) {
                Ok(input) => {
                    st.input = Some(input);
                    st.first_attempt = st.attempt + 1;
                    st.error = None;
                    let attempt = st.attempt + 1;
                    return self.dispatch(&key, c, st, attempt);
                }
                Err(message) => {
                    self.history(
                        H::CompensationFailed,
                        Some(&key),
                        None,
                        json!({ "code": codes::INPUT_ERROR, "message": message }),
                    );
                }
            }
        }
    }

    fn finalize(&mut self, ending: Ending) -> R {
        match ending {
            Ending::Failed(error) => {
                self.run.status = RunStatus::Failed;
                self.run.error = Some(error.clone());
                self.history(
                    H::RunFailed,
                    None,
                    None,
                    json!({ "code": error.code, "message": error.message }),
                );
                self.actions.push(Action::FailRun { error });
            }
            Ending::Cancelled(reason) => {
                self.run.status = RunStatus::Cancelled;
                // the reason is the run's error, so a caller waiting for the
                // run learns why it ended as it would for a failure
                self.run.error = Some(ErrorInfo::new(codes::CANCELLED, reason.clone()));
                self.history(H::RunCancelled, None, None, json!({ "reason": reason }));
                self.actions.push(Action::CancelRun { reason });
            }
        }
        Ok(())
    }

    fn retry_run(&mut self, interrupted: &[NodeKey]) -> R {
        if self.run.status != RunStatus::Failed {
            self.ignore(None, None, "only a failed run can be retried");
            return Ok(());
        }
        if self.run.compensated {
            self.ignore(
                None,
                None,
                "the run was compensated: its completed work was undone, start a new run",
            );
            return Ok(());
        }
        let mut keys: Vec<NodeKey> = Vec::new();
        for k in self.run.failed.iter().chain(interrupted) {
            if self.wf.contains(&k.node) && !keys.contains(k) {
                keys.push(k.clone());
            }
        }
        let mut missing = Vec::new();
        for k in &keys {
            for k in [k.clone(), k.parent()] {
                if !self.is_loaded(&k) && !missing.contains(&k) {
                    missing.push(k);
                }
            }
        }
        if !missing.is_empty() {
            return Err(DecideError::NeedNodes(missing));
        }
        self.history(
            H::RunRetried,
            None,
            None,
            json!({ "nodes": keys.iter().map(|k| k.to_string()).collect::<Vec<_>>() }),
        );
        self.run.status = RunStatus::Running;
        self.run.error = None;
        self.run.failed.clear();
        self.run.active = 0;
        if let Some(ms) = self.wf.run_timeout_ms {
            self.actions.push(Action::ScheduleTimer {
                timer: TimerId::run_timeout(),
                fire_at: self.now.plus_ms(ms),
            });
        }
        let mut counted: HashSet<String> = HashSet::new();
        for key in keys {
            let Some(idx) = self.wf.node_index(&key.node) else {
                continue;
            };
            let Some(st) = self.load(&key)? else { continue };
            let is_map = self.wf.nodes[idx].node_type == NodeType::Map;
            if key.index.is_some() || (is_map && st.map.is_some()) {
                // The MAP goes on: it counts once as active, its element restarts.
                if counted.insert(key.node.clone()) {
                    let parent_key = key.parent();
                    if let Some(mut parent) = self.load(&parent_key)? {
                        parent.status = NodeStatus::Running;
                        parent.error = None;
                        self.run.active += 1;
                        self.put(parent_key, parent);
                    }
                }
                if key.index.is_some() && st.status != NodeStatus::Completed {
                    let mut st = st;
                    st.first_attempt = st.attempt + 1;
                    st.error = None;
                    let attempt = st.attempt + 1;
                    self.dispatch(&key, idx, st, attempt)?;
                }
                continue;
            }
            if matches!(st.status, NodeStatus::Completed | NodeStatus::Skipped) {
                continue;
            }
            let mut st = st;
            st.status = NodeStatus::Pending;
            self.start_node(idx, st)?;
        }
        Ok(())
    }
}

/// The size of `value` as compact JSON, counted up to a little past `limit`
/// (then the count stops: the caller only needs to know it is over).
fn json_size(value: &Json, limit: usize) -> usize {
    let mut size = 0usize;
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        if size > limit {
            break;
        }
        size += match value {
            Json::Null => 4,
            Json::Bool(_) => 5,
            Json::Number(n) => n.to_string().len(),
            Json::String(s) => s.len() + 2,
            Json::Array(items) => {
                stack.extend(items.iter());
                items.len() + 1
            }
            Json::Object(map) => {
                for (key, item) in map {
                    size += key.len() + 3;
                    stack.push(item);
                }
                map.len() + 1
            }
        };
    }
    size
}

/// The history details and the error of an attempt whose lease ran out:
/// WORKER_LOST when its worker never confirmed any of `lost_deliveries`.
fn lease_end(attempt: u32, lost_deliveries: Option<u32>) -> (Json, ErrorInfo) {
    let Some(deliveries) = lost_deliveries else {
        let error = ErrorInfo::new(
            codes::LEASE_EXPIRED,
            format!("attempt {attempt} lost its lease: no heartbeat or report in time"),
        );
        return (json!({}), error);
    };
    let error = ErrorInfo::new(
        codes::WORKER_LOST,
        format!(
            "attempt {attempt} was delivered {deliveries} times and no worker confirmed it: \
             the worker died or lost the task each time before its first heartbeat"
        ),
    );
    (
        json!({ "worker_lost": true, "deliveries": deliveries }),
        error,
    )
}
