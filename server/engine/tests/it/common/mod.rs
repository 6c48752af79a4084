//! Test helpers: compile a definition, run it through the simulator, or drive
//! it event by event as the coordinator would (loading lazily).
#![allow(dead_code)]

use std::collections::BTreeMap;

use composer_engine::{
    Action, CompiledWorkflow, DecideError, Decision, Event, NodeKey, NodeState, NodeStatus,
    Outcomes, RunState, SimOptions, SimulationReport, Timestamp, decide, simulate_with,
};
use serde_json::Value as Json;

pub fn compile(yaml: &str) -> CompiledWorkflow {
    CompiledWorkflow::from_text(yaml).unwrap_or_else(|e| panic!("definition should compile: {e}"))
}

/// Simulates with idempotence checks on; fails the test on a violation.
pub fn simulate(yaml: &str, outcomes: &str) -> SimulationReport {
    simulate_opts(
        yaml,
        outcomes,
        SimOptions {
            check_idempotence: true,
            ..SimOptions::default()
        },
    )
}

pub fn simulate_opts(yaml: &str, outcomes: &str, opts: SimOptions) -> SimulationReport {
    let wf = compile(yaml);
    let outcomes = Outcomes::parse(outcomes).unwrap_or_else(|e| panic!("outcomes: {e}"));
    let report = simulate_with(&wf, &outcomes, &opts).unwrap_or_else(|e| panic!("simulation: {e}"));
    assert!(
        report.violations.is_empty(),
        "violations: {:?}",
        report.violations
    );
    report
}

pub const T0: Timestamp = Timestamp(1_767_225_600_000);

/// Drives a workflow event by event with a full store, answering NeedNodes
/// like the coordinator.
pub struct Driver {
    pub wf: CompiledWorkflow,
    pub state: RunState,
    pub store: BTreeMap<NodeKey, NodeState>,
    pub now: Timestamp,
}

impl Driver {
    pub fn new(yaml: &str, input: Json) -> Driver {
        let wf = compile(yaml);
        let state = RunState::new("run-1", wf.name().to_owned(), 1, input);
        Driver {
            wf,
            state,
            store: BTreeMap::new(),
            now: T0,
        }
    }

    pub fn decide(&self, event: &Event) -> Decision {
        let mut state = RunState {
            run: self.state.run.clone(),
            nodes: BTreeMap::new(),
            blobs: Default::default(),
        };
        loop {
            match decide(&self.wf, &state, event, self.now) {
                Ok(d) => return d,
                Err(DecideError::NeedNodes(keys)) => {
                    for k in keys {
                        let s = self.store.get(&k).cloned();
                        state.load(k, s);
                    }
                }
                Err(e) => panic!("decide: {e}"),
            }
        }
    }

    pub fn send(&mut self, event: Event) -> Vec<Action> {
        let d = self.decide(&event);
        self.state.apply(&d.change);
        for (k, s) in &d.change.nodes {
            self.store.insert(k.clone(), s.clone());
        }
        d.actions
    }

    pub fn at(&mut self, ms: i64) -> &mut Driver {
        self.now = Timestamp(T0.0 + ms);
        self
    }

    pub fn node(&self, key: &str) -> Option<&NodeState> {
        self.store.get(&key.parse::<NodeKey>().expect("key"))
    }

    pub fn status(&self, key: &str) -> Option<NodeStatus> {
        self.node(key).map(|s| s.status)
    }
}

pub fn key(s: &str) -> NodeKey {
    s.parse().expect("node key")
}

pub fn completed(node: &str, attempt: u32, output: Json) -> Event {
    Event::TaskCompleted {
        node: key(node),
        attempt,
        output,
    }
}

pub fn failed(node: &str, attempt: u32, code: &str, retryable: bool) -> Event {
    Event::TaskFailed {
        node: key(node),
        attempt,
        code: code.into(),
        message: format!("{code} happened"),
        retryable,
        details: None,
        seed: 1,
    }
}

/// `(node key, attempt)` of every CreateTask among `actions`.
pub fn created(actions: &[Action]) -> Vec<(String, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateTask { node, attempt, .. } => Some((node.to_string(), *attempt)),
            _ => None,
        })
        .collect()
}

pub fn history_kinds(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::AppendHistory { kind, node, .. } => Some(
                node.as_ref()
                    .map_or_else(|| kind.to_string(), |n| format!("{kind}:{n}")),
            ),
            _ => None,
        })
        .collect()
}

/// Node keys that got a CreateTask over a whole simulation, in order.
pub fn started_tasks(report: &SimulationReport) -> Vec<String> {
    report
        .actions()
        .filter_map(|a| match a {
            Action::CreateTask {
                node, attempt: 1, ..
            } => Some(node.to_string()),
            _ => None,
        })
        .collect()
}

pub fn node_status(report: &SimulationReport, k: &str) -> Option<NodeStatus> {
    report.nodes.get(&key(k)).map(|s| s.status)
}

/// What the server would have recorded of a simulated run with `input`: its
/// history entries, and the outputs its nodes hold. With `until`, only the
/// events up to the one that started that node: a run still in flight.
pub fn recorded_of(
    report: &SimulationReport,
    input: Json,
    until: Option<&str>,
) -> composer_engine::replay::RecordedRun {
    use composer_engine::replay::{RecordedEntry, RecordedRun};
    let mut history = Vec::new();
    let mut steps = 0;
    for step in &report.history {
        steps += 1;
        let mut reached = false;
        for action in &step.actions {
            if let Action::AppendHistory {
                kind,
                node,
                attempt,
                detail,
            } = action
            {
                reached |= *kind == composer_engine::history::HistoryEventType::NodeStarted
                    && node
                        .as_ref()
                        .is_some_and(|k| Some(k.node.as_str()) == until);
                history.push(RecordedEntry {
                    sequence: history.len() as u64 + 1,
                    kind: *kind,
                    node: node.clone(),
                    attempt: *attempt,
                    details: detail.clone(),
                    at: step.at,
                });
            }
        }
        if reached {
            break;
        }
    }
    // what reports, events and child runs handed in: the outputs a run's
    // node rows hold
    let mut outputs = BTreeMap::new();
    for step in &report.history[..steps] {
        match &step.event {
            Event::TaskCompleted { node, output, .. } => {
                outputs.insert(node.clone(), output.clone());
            }
            Event::ChildRunFinished { node, output, .. } => {
                outputs.insert(node.clone(), output.clone());
            }
            Event::EventReceived {
                node: Some(node),
                payload,
                ..
            } => {
                outputs.insert(node.clone(), payload.clone());
            }
            _ => {}
        }
    }
    RecordedRun {
        input,
        outputs,
        history,
        blobs: Default::default(),
    }
}
