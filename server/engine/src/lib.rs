//! composer-engine: the pure workflow engine.
//!
//! What a workflow means (`LANGUAGE.md`) as pure code: definitions and their
//! validation, the DAG index, CEL, the state machine [`decide`], and a
//! [`simulate`] driver with a virtual clock. No I/O, no clock, no randomness:
//! `now` arrives with every call and jitter comes from a seed in the event.

pub mod cel;
mod compile;
mod definition;
pub mod duration;
pub mod template;

pub use compile::{
    CEdge, CNode, CompiledWorkflow, DEFAULT_HEARTBEAT_TIMEOUT_MS, DEFAULT_MAP_CONCURRENCY,
    HTTP_QUEUE, Kind, MAX_EDGES, MapElement, RetryPolicy, splitmix64,
};
pub use definition::{
    Definition, Edge, EdgeOn, HttpSpec, MAX_DEFINITION_BYTES, MAX_NODES, Node, NodeType, RetrySpec,
    ValidationError, ValidationErrors, parse_definition,
};
mod decide;
mod state;

pub use decide::{codes, decide, prefetch};
pub use state::{
    Action, ChildStatus, Compensation, DecideError, Decision, Ending, ErrorInfo, Event,
    MapProgress, NodeKey, NodeState, NodeStatus, RunRecord, RunState, RunStatus, StateChange,
    TimerId, TimerKind, Timestamp,
};
pub mod simulate;

pub use simulate::{
    Outcomes, SimOptions, SimulationError, SimulationReport, simulate, simulate_with,
};
