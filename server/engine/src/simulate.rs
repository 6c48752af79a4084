//! A simulator: drives a compiled workflow with scripted outcomes and a
//! virtual clock, no database, and returns the full history.
//!
//! It plays the coordinator: it loads only the node states an event touches
//! (asking [`prefetch`](crate::prefetch) first, then answering `NeedNodes`), applies the
//! decision, and turns actions into future events: a task's scripted report,
//! a timer firing, a child run finishing, an external event.
//!
//! # Outcomes file (YAML or JSON)
//!
//! ```yaml
//! input: { order_id: 7, amount: 30 }   # the run input (default null)
//! tasks:                      # per node id, or per MAP element key `id[3]`:
//!   charge:                   # one entry per attempt, in order
//!     - fail: { code: HTTP_503, message: busy, retryable: true }
//!     - complete: { body: { id: ch_1 } }
//!       after: 2s             # how long the attempt takes (default 0s)
//!   reserve:
//!     - hang                  # never reports: its lease expires
//! children:                   # SUB_WORKFLOW / MAP-of-workflow nodes, same form
//!   child: [ { complete: { ok: true } } ]
//! events:                     # sent to the run at a time after its start
//!   - { at: 1h, name: approval, payload: { ok: true } }
//! cancel_at: 3h               # optional: CancelRun at that time
//! retry_at: 4h                # optional: RetryRun at that time (if failed)
//! expect:                     # optional: what the example promises
//!   status: COMPLETED
//!   output: { shipment: { tracking: T1 } }
//! ```
//!
//! A task with no scripted outcome left completes at once with output `null`.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value as Json;

use crate::compile::{CompiledWorkflow, splitmix64};
use crate::decide::decide_from;
use crate::definition::ValidationErrors;
use crate::duration::parse_duration;
use crate::state::{
    Action, ChildStatus, DecideError, ErrorInfo, Event, NodeKey, NodeState, RunState, RunStatus,
    TimerId, Timestamp,
};

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Json>, D::Error> {
    Json::deserialize(d).map(Some)
}

/// A scripted failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailSpec {
    pub code: String,
    #[serde(default)]
    pub message: String,
    #[serde(default = "yes")]
    pub retryable: bool,
}

/// How long a `lost` attempt takes to fail: two deliveries, each held for
/// the server's default `--lease-receipt-timeout` (5 s) before it is
/// given up.
pub const LOST_AFTER_MS: u64 = 10_000;

fn yes() -> bool {
    true
}

/// What one attempt does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Outcome {
    /// `hang`: no report, the lease expires (tasks) / never finishes (children).
    /// `lost` (tasks): the task kills its worker before the first heartbeat,
    /// at both of the attempt's deliveries; the attempt fails with
    /// WORKER_LOST after two receipt timeouts ([`LOST_AFTER_MS`]).
    Word(String),
    Full(OutcomeSpec),
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutcomeSpec {
    /// Complete with this output.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub complete: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail: Option<FailSpec>,
    /// For children: the child run was cancelled.
    #[serde(default)]
    pub cancelled: bool,
    #[serde(default)]
    pub hang: bool,
    /// How long the attempt takes, e.g. `2s` (default 0s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// An external event sent at a virtual time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedEvent {
    /// Time after the run's start, e.g. `1h`.
    pub at: String,
    pub name: String,
    #[serde(default)]
    pub payload: Json,
}

/// What an example promises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectation {
    pub status: RunStatus,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub output: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
}

/// The scripted world of one simulated run. See the module docs for the format.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcomes {
    #[serde(default)]
    pub input: Json,
    #[serde(default)]
    pub tasks: BTreeMap<String, Vec<Outcome>>,
    #[serde(default)]
    pub children: BTreeMap<String, Vec<Outcome>>,
    #[serde(default)]
    pub events: Vec<ScriptedEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<Expectation>,
    /// The run's priority, 1 (lowest) to 5 (highest), as StartRun takes it
    /// (default 3); the report shows it as every task's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
}

impl Outcomes {
    /// Parses an outcomes file (YAML or JSON).
    pub fn parse(text: &str) -> Result<Outcomes, ValidationErrors> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let mut errors = ValidationErrors::default();
            let path = e.path().to_string();
            errors.push(
                if path == "." { String::new() } else { path },
                e.inner().to_string(),
            );
            errors
        })
    }
}

/// Knobs for tests.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Virtual time of the run's start.
    pub start_at: Timestamp,
    /// Order events due at the same time by this seed instead of by arrival.
    pub shuffle_seed: Option<u64>,
    /// After each event, apply it a second time and record a violation if
    /// that changes anything (an event twice must equal once).
    pub check_idempotence: bool,
    /// Stop after this many events.
    pub max_steps: usize,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            start_at: Timestamp(1_767_225_600_000),
            shuffle_seed: None,
            check_idempotence: false,
            max_steps: 100_000,
        }
    }
}

/// One applied event and what it decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub at: Timestamp,
    pub event: Event,
    pub actions: Vec<Action>,
    /// How many node states were loaded to decide it.
    pub loaded: usize,
    /// Load round trips after the prefetch (0: the prefetch sufficed).
    pub extra_rounds: usize,
}

/// The result of a simulation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimulationReport {
    pub status: RunStatus,
    pub output: Option<Json>,
    pub error: Option<ErrorInfo>,
    pub history: Vec<Step>,
    /// Every node state at the end.
    pub nodes: BTreeMap<NodeKey, NodeState>,
    /// Broken invariants seen on the way (idempotence checks).
    pub violations: Vec<String>,
    /// The run's concurrency key computed from the input, when the workflow
    /// declares `concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// The run's priority (and so every task's): the outcomes' or 3.
    pub priority: u8,
}

impl SimulationReport {
    /// Every action of the run, in order.
    pub fn actions(&self) -> impl Iterator<Item = &Action> {
        self.history.iter().flat_map(|s| s.actions.iter())
    }

    /// The history entries of `kind`, in order.
    pub fn history_of<'r>(&'r self, kind: &'r str) -> impl Iterator<Item = &'r Action> + 'r {
        self.actions().filter(
            move |a| matches!(a, Action::AppendHistory { kind: k, .. } if k.as_str() == kind),
        )
    }

    /// A readable timeline, one line per event and per action, times relative
    /// to the run's start; what `composer workflow test` prints.
    pub fn timeline(&self) -> String {
        let start = self.history.first().map_or(0, |s| s.at.0);
        let mut out = String::new();
        for step in &self.history {
            let at = offset(step.at.0 - start);
            out.push_str(&format!("{at:>13}  {}\n", describe_event(&step.event)));
            for a in &step.actions {
                out.push_str(&format!("{:>13}    {}\n", "", describe_action(a, start)));
            }
        }
        let result = match self.status {
            RunStatus::Completed => format!(
                "COMPLETED, output {}",
                self.output.clone().unwrap_or(Json::Null)
            ),
            RunStatus::Failed => match &self.error {
                Some(e) => format!("FAILED, {}: {}", e.code, e.message),
                None => "FAILED".into(),
            },
            other => format!("{other:?}").to_uppercase(),
        };
        out.push_str(&format!("result: {result}\n"));
        out
    }

    /// Whether the expectation of the outcomes file holds; the message says why not.
    pub fn check(&self, expect: &Expectation) -> Result<(), String> {
        if self.status != expect.status {
            return Err(format!(
                "status {:?}, expected {:?} (error: {:?})",
                self.status, expect.status, self.error
            ));
        }
        if let Some(out) = &expect.output
            && self.output.as_ref() != Some(out)
        {
            return Err(format!("output {:?}, expected {out}", self.output));
        }
        if let Some(code) = &expect.error_code
            && self.error.as_ref().map(|e| &e.code) != Some(code)
        {
            return Err(format!("error {:?}, expected code {code}", self.error));
        }
        Ok(())
    }
}

/// Why a simulation could not run to its end.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimulationError {
    #[error("bad outcomes: {0}")]
    BadOutcomes(String),
    #[error("decide failed at step {step}: {error}")]
    Decide { step: usize, error: DecideError },
    #[error("input: {0}")]
    ConcurrencyKey(#[from] crate::compile::ConcurrencyKeyError),
}

#[derive(Debug, Clone)]
enum Due {
    Deliver(Event),
    Timer(TimerId),
    External { name: String, payload: Json },
    Cancel,
    Retry,
}

/// Simulates one run with default options.
pub fn simulate(
    wf: &CompiledWorkflow,
    outcomes: &Outcomes,
) -> Result<SimulationReport, SimulationError> {
    simulate_with(wf, outcomes, &SimOptions::default())
}

struct Sim<'w> {
    wf: &'w CompiledWorkflow,
    opts: SimOptions,
    run: RunState,
    store: BTreeMap<NodeKey, NodeState>,
    queue: BTreeMap<(Timestamp, u64, u64), Due>,
    seq: u64,
    timers: HashMap<TimerId, (Timestamp, u64, u64)>,
    used: HashMap<String, usize>,
    waiting: Vec<(String, NodeKey)>,
    pending_events: Vec<(String, Json)>,
    history: Vec<Step>,
    violations: Vec<String>,
}

fn duration(text: &Option<String>) -> Result<u64, SimulationError> {
    text.as_ref().map_or(Ok(0), |t| {
        parse_duration(t).map_err(SimulationError::BadOutcomes)
    })
}

/// Simulates one run.
pub fn simulate_with(
    wf: &CompiledWorkflow,
    outcomes: &Outcomes,
    opts: &SimOptions,
) -> Result<SimulationReport, SimulationError> {
    let priority = outcomes.priority.unwrap_or(3);
    if !(1..=5).contains(&priority) {
        return Err(SimulationError::BadOutcomes(format!(
            "priority must be between 1 and 5, not {priority}"
        )));
    }
    let mut sim = Sim {
        wf,
        opts: opts.clone(),
        run: RunState::new("sim-run", wf.name(), 1, outcomes.input.clone()),
        store: BTreeMap::new(),
        queue: BTreeMap::new(),
        seq: 0,
        timers: HashMap::new(),
        used: HashMap::new(),
        waiting: Vec::new(),
        pending_events: Vec::new(),
        history: Vec::new(),
        violations: Vec::new(),
    };
    let start = opts.start_at;
    sim.push(start, Due::Deliver(Event::RunStarted));
    for e in &outcomes.events {
        let at = parse_duration(&e.at).map_err(SimulationError::BadOutcomes)?;
        sim.push(
            start.plus_ms(at),
            Due::External {
                name: e.name.clone(),
                payload: e.payload.clone(),
            },
        );
    }
    if outcomes.cancel_at.is_some() {
        sim.push(start.plus_ms(duration(&outcomes.cancel_at)?), Due::Cancel);
    }
    if outcomes.retry_at.is_some() {
        sim.push(start.plus_ms(duration(&outcomes.retry_at)?), Due::Retry);
    }
    let mut steps = 0;
    while let Some(((at, _, _), due)) = sim.queue.pop_first() {
        steps += 1;
        if steps > sim.opts.max_steps {
            break;
        }
        let event = match due {
            Due::Deliver(e) => e,
            Due::Timer(t) => {
                sim.timers.remove(&t);
                Event::TimerFired {
                    seed: splitmix64(sim.seq),
                    timer: t,
                }
            }
            Due::External { name, payload } => {
                match sim.waiting.iter().position(|(n, _)| *n == name) {
                    Some(i) => {
                        let (_, node) = sim.waiting.remove(i);
                        Event::EventReceived {
                            name,
                            payload,
                            node: Some(node),
                        }
                    }
                    None => {
                        sim.pending_events.push((name, payload));
                        continue;
                    }
                }
            }
            Due::Cancel => Event::CancelRequested {
                reason: "cancel_at in the outcomes".into(),
            },
            Due::Retry => {
                let interrupted = sim
                    .store
                    .iter()
                    .filter(|(_, s)| s.status.is_active())
                    .map(|(k, _)| k.clone())
                    .collect();
                Event::RetryRequested { interrupted }
            }
        };
        sim.step(at, event, outcomes)?;
        let terminal = sim.run.run.status.is_terminal();
        if terminal && !sim.queue.values().any(|d| matches!(d, Due::Retry)) {
            break;
        }
    }
    let concurrency_key = wf
        .concurrency()
        .map(|c| c.key_of(&outcomes.input))
        .transpose()?;
    Ok(SimulationReport {
        concurrency_key,
        priority,
        status: sim.run.run.status,
        output: sim.run.run.output.clone(),
        error: sim.run.run.error.clone(),
        history: sim.history,
        // a MAP's rows of inputs waiting to start are the engine's, not nodes
        nodes: sim
            .store
            .into_iter()
            .filter(|(key, _)| !key.is_map_inputs())
            .collect(),
        violations: sim.violations,
    })
}

impl Sim<'_> {
    fn push(&mut self, at: Timestamp, due: Due) -> (Timestamp, u64, u64) {
        self.seq += 1;
        let order = match self.opts.shuffle_seed {
            Some(seed) => splitmix64(seed ^ self.seq),
            None => 0,
        };
        let key = (at, order, self.seq);
        self.queue.insert(key, due);
        key
    }

    /// Loads like a coordinator: prefetch, then whatever `decide` asks for.
    fn decide_loaded(
        &self,
        state: &mut RunState,
        event: &Event,
        now: Timestamp,
        step: usize,
    ) -> Result<(crate::Decision, usize), SimulationError> {
        decide_from(self.wf, state, &self.store, event, now)
            .map_err(|error| SimulationError::Decide { step, error })
    }

    fn step(
        &mut self,
        now: Timestamp,
        event: Event,
        outcomes: &Outcomes,
    ) -> Result<(), SimulationError> {
        let step = self.history.len();
        let mut state = RunState {
            run: self.run.run.clone(),
            nodes: BTreeMap::new(),
            blobs: Default::default(),
        };
        let (decision, extra_rounds) = self.decide_loaded(&mut state, &event, now, step)?;
        let loaded = state.nodes.len();
        state.apply(&decision.change);
        self.run.run = state.run.clone();
        for (k, s) in &decision.change.nodes {
            self.store.insert(k.clone(), s.clone());
        }
        if self.opts.check_idempotence {
            let mut again = RunState {
                run: self.run.run.clone(),
                nodes: BTreeMap::new(),
                blobs: Default::default(),
            };
            let (second, _) = self.decide_loaded(&mut again, &event, now, step)?;
            let effects: Vec<&Action> = second
                .actions
                .iter()
                .filter(|a| !matches!(a, Action::AppendHistory { .. }))
                .collect();
            if !second.change.is_empty() || !effects.is_empty() {
                self.violations.push(format!(
                    "applying {event:?} twice changed {:?} / {effects:?}",
                    second.change
                ));
            }
        }
        for action in &decision.actions {
            self.perform(now, action, outcomes)?;
        }
        self.history.push(Step {
            at: now,
            event,
            actions: decision.actions,
            loaded,
            extra_rounds,
        });
        Ok(())
    }

    fn next_outcome(
        &mut self,
        table: &BTreeMap<String, Vec<Outcome>>,
        key: &NodeKey,
    ) -> Option<Outcome> {
        let exact = key.to_string();
        let name = if table.contains_key(&exact) {
            exact
        } else {
            key.node.clone()
        };
        let list = table.get(&name)?;
        let used = self.used.entry(name).or_insert(0);
        let out = list.get(*used).cloned();
        *used += 1;
        out
    }

    fn perform(
        &mut self,
        now: Timestamp,
        action: &Action,
        outcomes: &Outcomes,
    ) -> Result<(), SimulationError> {
        match action {
            Action::CreateTask {
                node,
                attempt,
                heartbeat_timeout_ms,
                ..
            } => {
                let outcome = self.next_outcome(&outcomes.tasks, node);
                let seed = splitmix64(self.seq.wrapping_add(7));
                let (node, attempt) = (node.clone(), *attempt);
                match outcome {
                    None => {
                        self.push(
                            now,
                            Due::Deliver(Event::TaskCompleted {
                                node,
                                attempt,
                                output: Json::Null,
                            }),
                        );
                    }
                    Some(Outcome::Word(w)) if w == "hang" => {
                        self.push(
                            now.plus_ms(*heartbeat_timeout_ms),
                            Due::Deliver(Event::LeaseExpired {
                                node,
                                attempt,
                                lost_deliveries: None,
                                seed,
                            }),
                        );
                    }
                    Some(Outcome::Word(w)) if w == "lost" => {
                        self.push(
                            now.plus_ms(LOST_AFTER_MS),
                            Due::Deliver(Event::LeaseExpired {
                                node,
                                attempt,
                                lost_deliveries: Some(2),
                                seed,
                            }),
                        );
                    }
                    Some(Outcome::Word(w)) => {
                        return Err(SimulationError::BadOutcomes(format!(
                            "unknown outcome '{w}' (hang, lost, or a map)"
                        )));
                    }
                    Some(Outcome::Full(spec)) => {
                        let at = now.plus_ms(duration(&spec.after)?);
                        if spec.hang {
                            self.push(
                                now.plus_ms(*heartbeat_timeout_ms),
                                Due::Deliver(Event::LeaseExpired {
                                    node,
                                    attempt,
                                    lost_deliveries: None,
                                    seed,
                                }),
                            );
                        } else if let Some(f) = spec.fail {
                            let e = Event::TaskFailed {
                                node,
                                attempt,
                                code: f.code,
                                message: f.message,
                                retryable: f.retryable,
                                details: None,
                                seed,
                            };
                            self.push(at, Due::Deliver(e));
                        } else {
                            let output = spec.complete.unwrap_or(Json::Null);
                            self.push(
                                at,
                                Due::Deliver(Event::TaskCompleted {
                                    node,
                                    attempt,
                                    output,
                                }),
                            );
                        }
                    }
                }
            }
            Action::StartChildRun { node, attempt, .. } => {
                let outcome = self.next_outcome(&outcomes.children, node);
                let seed = splitmix64(self.seq.wrapping_add(11));
                let (node, attempt) = (node.clone(), *attempt);
                let finished = |status, output, error| Event::ChildRunFinished {
                    node: node.clone(),
                    attempt,
                    status,
                    output,
                    error,
                    seed,
                };
                match outcome {
                    None => {
                        self.push(
                            now,
                            Due::Deliver(finished(ChildStatus::Completed, Json::Null, None)),
                        );
                    }
                    Some(Outcome::Word(w)) if w == "hang" => {}
                    Some(Outcome::Word(w)) => {
                        return Err(SimulationError::BadOutcomes(format!(
                            "unknown outcome '{w}' (hang, or a map)"
                        )));
                    }
                    Some(Outcome::Full(spec)) => {
                        let at = now.plus_ms(duration(&spec.after)?);
                        if spec.hang {
                        } else if spec.cancelled {
                            self.push(
                                at,
                                Due::Deliver(finished(ChildStatus::Cancelled, Json::Null, None)),
                            );
                        } else if let Some(f) = spec.fail {
                            self.push(
                                at,
                                Due::Deliver(finished(
                                    ChildStatus::Failed,
                                    Json::Null,
                                    Some(ErrorInfo::new(f.code, f.message)),
                                )),
                            );
                        } else {
                            self.push(
                                at,
                                Due::Deliver(finished(
                                    ChildStatus::Completed,
                                    spec.complete.unwrap_or(Json::Null),
                                    None,
                                )),
                            );
                        }
                    }
                }
            }
            Action::ScheduleTimer { timer, fire_at } => {
                if let Some(old) = self.timers.remove(timer) {
                    self.queue.remove(&old);
                }
                let key = self.push((*fire_at).max(now), Due::Timer(timer.clone()));
                self.timers.insert(timer.clone(), key);
            }
            Action::CancelTimer { timer } => {
                if let Some(key) = self.timers.remove(timer) {
                    self.queue.remove(&key);
                }
            }
            Action::CancelAllTimers => {
                for (_, key) in self.timers.drain() {
                    self.queue.remove(&key);
                }
            }
            Action::CancelTask { node } => {
                let node = node.clone();
                self.queue.retain(|_, d| !matches!(d, Due::Deliver(e) if is_report(e) && e.node().is_some_and(|k| k.node == node.node && (node.index.is_none() || k.index == node.index))));
            }
            Action::CancelChildRun { node } => {
                let node = node.clone();
                self.queue.retain(|_, d| !matches!(d, Due::Deliver(Event::ChildRunFinished { node: k, .. }) if k.node == node.node && (node.index.is_none() || k.index == node.index)));
            }
            Action::CancelAllTasks => {
                self.queue.retain(|_, d| !matches!(d, Due::Deliver(e) if is_report(e) && !matches!(e, Event::ChildRunFinished { .. })));
                self.waiting.clear();
            }
            Action::CancelAllChildRuns => {
                self.queue
                    .retain(|_, d| !matches!(d, Due::Deliver(Event::ChildRunFinished { .. })));
            }
            Action::AwaitEvent { node, name, .. } => {
                match self.pending_events.iter().position(|(n, _)| n == name) {
                    Some(i) => {
                        let (name, payload) = self.pending_events.remove(i);
                        self.push(
                            now,
                            Due::Deliver(Event::EventReceived {
                                name,
                                payload,
                                node: Some(node.clone()),
                            }),
                        );
                    }
                    None => self.waiting.push((name.clone(), node.clone())),
                }
            }
            Action::CompleteRun { .. }
            | Action::FailRun { .. }
            | Action::CancelRun { .. }
            | Action::AppendHistory { .. } => {}
        }
        Ok(())
    }
}

fn describe_event(e: &Event) -> String {
    match e {
        Event::RunStarted => "run started".into(),
        Event::TaskCompleted {
            node,
            attempt,
            output,
        } => format!("{node} #{attempt} completed: {output}"),
        Event::TaskFailed {
            node,
            attempt,
            code,
            message,
            retryable,
            ..
        } => {
            format!(
                "{node} #{attempt} failed: {code} {message}{}",
                if *retryable { "" } else { " (not retryable)" }
            )
        }
        Event::LeaseExpired { node, attempt, .. } => format!("{node} #{attempt} lease expired"),
        Event::TimerFired { timer, .. } => format!("timer fired: {}", describe_timer(timer)),
        Event::EventReceived { name, payload, .. } => format!("event {name}: {payload}"),
        Event::CancelRequested { reason } => format!("cancel requested: {reason}"),
        Event::RetryRequested { .. } => "retry requested".into(),
        Event::ChildRunFinished {
            node,
            attempt,
            status,
            output,
            error,
            ..
        } => match error {
            Some(e) if *status != ChildStatus::Completed => format!(
                "child {node} #{attempt} {status:?}: {} {}",
                e.code, e.message
            ),
            _ => format!("child {node} #{attempt} {status:?}: {output}"),
        },
    }
}

/// `+h:mm:ss.mmm` after the run's start.
fn offset(ms: i64) -> String {
    let ms = ms.max(0);
    format!(
        "+{}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1_000 % 60,
        ms % 1_000
    )
}

fn describe_timer(t: &TimerId) -> String {
    let node = t.node.as_ref().map(|n| format!(" {n}")).unwrap_or_default();
    let attempt = t.attempt.map(|a| format!(" #{a}")).unwrap_or_default();
    format!("{:?}{node}{attempt}", t.kind)
}

fn describe_action(a: &Action, start: i64) -> String {
    match a {
        Action::CreateTask {
            node,
            attempt,
            queue,
            input,
            ..
        } => format!("-> task {node} #{attempt} on {queue}: {input}"),
        Action::ScheduleTimer { timer, fire_at } => {
            format!(
                "-> timer {} at {}",
                describe_timer(timer),
                offset(fire_at.0 - start)
            )
        }
        Action::CancelTimer { timer } => format!("-> cancel timer {}", describe_timer(timer)),
        Action::CancelTask { node } => format!("-> cancel task {node}"),
        Action::CancelAllTasks => "-> cancel all tasks".into(),
        Action::CancelAllTimers => "-> cancel all timers".into(),
        Action::AwaitEvent {
            node,
            name,
            correlation,
        } => match correlation {
            Some(c) => format!("-> {node} awaits event {name} (correlation {c})"),
            None => format!("-> {node} awaits event {name}"),
        },
        Action::StartChildRun {
            node,
            attempt,
            workflow,
            input,
            ..
        } => format!("-> child run {node} #{attempt} of {workflow}: {input}"),
        Action::CancelChildRun { node } => format!("-> cancel child run {node}"),
        Action::CancelAllChildRuns => "-> cancel all child runs".into(),
        Action::CompleteRun { output } => format!("-> run completed: {output}"),
        Action::FailRun { error } => format!("-> run failed: {} {}", error.code, error.message),
        Action::CancelRun { reason } => format!("-> run cancelled: {reason}"),
        Action::AppendHistory {
            kind, node, detail, ..
        } => {
            let node = node.as_ref().map(|n| format!(" {n}")).unwrap_or_default();
            let detail = if detail.as_object().is_some_and(|m| m.is_empty()) {
                String::new()
            } else {
                format!(" {detail}")
            };
            format!("   {kind}{node}{detail}")
        }
    }
}

fn is_report(e: &Event) -> bool {
    matches!(
        e,
        Event::TaskCompleted { .. }
            | Event::TaskFailed { .. }
            | Event::LeaseExpired { .. }
            | Event::ChildRunFinished { .. }
    )
}
