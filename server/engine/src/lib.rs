//! composer-engine: the pure workflow engine.
//!
//! What a workflow means (`docs/language.md`) as pure code: definitions and their
//! validation, the DAG index, CEL, the state machine [`decide`], and a
//! [`simulate()`] driver with a virtual clock. No I/O, no clock, no randomness:
//! `now` arrives with every call and jitter comes from a seed in the event.
//!
//! # Registering a workflow
//!
//! [`parse_definition`] turns YAML or JSON into a [`Definition`], reporting
//! every problem with its path (`nodes[3].retry.max_attempts: must be at
//! least 1`); [`CompiledWorkflow::compile`] builds the DAG index and the
//! checked expressions. Store [`Definition::canonical_json`] (hash it to
//! recognise a re-registration of the same content) and cache the compiled
//! workflow per (workflow, version) in an `Arc`.
//!
//! # One event, one transaction
//!
//! ```text
//! lock the run row; state = RunState { run: <run row>, nodes: {} }
//! for key in prefetch(&wf, &state, &event): state.load(key, <row or None>)
//! loop {
//!     match decide(&wf, &state, &event, now) {
//!         Err(DecideError::NeedNodes(keys)) => load them (None if no row), again
//!         Ok(Decision { change, actions }) => break
//!     }
//! }
//! persist change.run (if Some) and upsert change.nodes;
//! carry out actions in order (CancelAllTimers before a ScheduleTimer in the
//! same list must leave the new timer in place)
//! ```
//!
//! Node keys are node ids, or `id[i]` for MAP elements; tasks are
//! `(node key, attempt)` and the store maps a node key to one task id for all
//! its attempts. A report for another attempt, or one repeated, changes
//! nothing and only appends a history entry. Events that may compute a retry
//! delay carry a `seed` (any number the coordinator picks, e.g. from the
//! event's row id) from which jitter is drawn, so decisions stay reproducible.

pub mod blob;
pub mod cel;
mod compile;
mod decide;
mod definition;
pub mod duration;
pub mod history;
pub mod json_text;
mod mapping;
pub mod names;
pub mod replay;
pub mod schedule;
pub mod simulate;
mod state;
pub mod template;

pub use compile::{
    CEdge, CNode, CompiledWorkflow, ConcurrencyKeyError, DEFAULT_HEARTBEAT_TIMEOUT_MS,
    DEFAULT_MAP_CONCURRENCY, HTTP_QUEUE, Kind, MAX_CONCURRENCY_KEY_BYTES, MAX_EDGES, MAX_MAP_ITEMS,
    MapElement, RetryPolicy, RunConcurrency, TaskSlot, parse_definition, splitmix64,
};
pub use decide::{MAP_ARM_SLICE, codes, decide, decide_from, prefetch, render_node_input};
pub use definition::{
    ConcurrencySpec, Definition, Edge, EdgeOn, HttpSpec, MAX_CONCURRENCY, MAX_DEFINITION_BYTES,
    MAX_NODES, Node, NodeConcurrency, NodeType, OnLimit, RetrySpec, TaskConcurrency,
    ValidationError, ValidationErrors,
};
pub use simulate::{
    Outcomes, SimOptions, SimulationError, SimulationReport, simulate, simulate_with,
};
pub use state::{
    Action, ChildStatus, Compensation, DecideError, Decision, Ending, ErrorInfo, Event,
    MapProgress, NodeKey, NodeState, NodeStatus, RunRecord, RunState, RunStatus, SlotKey,
    StateChange, TimerId, TimerKind, Timestamp,
};

/// Whether an HTTP node's attempt that ended with `status` may be retried:
/// 5xx and 429 yes, other 4xx no (network errors, no status, are retryable).
pub fn http_status_is_retryable(status: Option<u16>) -> bool {
    match status {
        None => true,
        Some(s) => s == 429 || (500..600).contains(&s),
    }
}
