//! A run as the API returns it (`Run` with its nodes, `HistoryEvent`s),
//! turned into what the engine's replay reads.

use std::collections::{BTreeMap, HashMap};

use composer_engine::replay::{NodeMapping, ReplayReport, Verdict};
use composer_engine::{
    NodeKey,
    replay::{EntryError, RecordedEntry, RecordedRun},
};
use composer_proto::v1::{
    HistoryEvent, ReplayDifference, ReplayDivergence, ReplayVerdict, Run, RunReplay,
};
use serde_json::Value as Json;
use tonic::Status;

use crate::status::invalid_field;

/// Renames one call may name.
const MAX_MAPPED_NODES: usize = 1_000;

/// The renames a request names, each checked by the name rule.
pub(crate) fn node_mapping(pairs: &HashMap<String, String>) -> Result<NodeMapping, Status> {
    if pairs.len() > MAX_MAPPED_NODES {
        return Err(invalid_field(
            "node_mapping",
            format!(
                "names {} nodes, over the limit of {MAX_MAPPED_NODES}",
                pairs.len()
            ),
        ));
    }
    let mut texts = Vec::with_capacity(pairs.len());
    for (from, to) in pairs {
        crate::status::check_name("node_mapping", from)?;
        crate::status::check_name("node_mapping", to)?;
        texts.push(format!("{from}={to}"));
    }
    NodeMapping::parse(texts.iter().map(String::as_str))
        .map_err(|e| invalid_field("node_mapping", e))
}

/// Why a run's record cannot be replayed as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("history entry {sequence}: unknown event type {event_type:?}")]
    UnknownEventType { sequence: i64, event_type: String },
    #[error("history entry {sequence}: {problem}")]
    BadEntry { sequence: i64, problem: String },
    #[error("node {node_id:?}: {problem}")]
    BadNode { node_id: String, problem: String },
    #[error("run: {0}")]
    BadRun(String),
}

/// The engine's view of `run` and its `history` (oldest first).
pub fn recorded_run(run: &Run, history: &[HistoryEvent]) -> Result<RecordedRun, RecordError> {
    let input = json_of(run.input.clone()).map_err(RecordError::BadRun)?;
    let mut outputs = BTreeMap::new();
    for node in &run.nodes {
        let Some(output) = node.output.clone() else {
            continue;
        };
        let key = node
            .node_id
            .parse::<NodeKey>()
            .map_err(|problem| RecordError::BadNode {
                node_id: node.node_id.clone(),
                problem,
            })?;
        let output = json_of(Some(output)).map_err(|problem| RecordError::BadNode {
            node_id: node.node_id.clone(),
            problem,
        })?;
        outputs.insert(key, output);
    }
    let history = history
        .iter()
        .map(entry_of)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RecordedRun {
        input,
        outputs,
        history,
        blobs: Default::default(),
    })
}

fn entry_of(event: &HistoryEvent) -> Result<RecordedEntry, RecordError> {
    let sequence = event.sequence;
    let details = json_of(event.details.clone())
        .map_err(|problem| RecordError::BadEntry { sequence, problem })?;
    let at = event
        .event_time
        .as_ref()
        .map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000);
    RecordedEntry::parse(
        sequence,
        &event.event_type,
        Some(&event.node_id),
        Some(event.attempt),
        details,
        at,
    )
    .map_err(|error| match error {
        EntryError::UnknownEventType {
            sequence,
            event_type,
        } => RecordError::UnknownEventType {
            sequence,
            event_type,
        },
        EntryError::Malformed { sequence, problem } => RecordError::BadEntry { sequence, problem },
    })
}

fn json_of(value: Option<prost_types::Value>) -> Result<Json, String> {
    crate::convert::to_json(value, "value").map_err(|status| status.message().to_owned())
}

/// Differences listed per run.
const MAX_DIFFERENCES: usize = 20;

/// One run's verdict as the API says it (ReplayRun, CheckWorkflowVersion
/// and `composer workflow check` alike).
pub fn replay_message(
    run_id: &str,
    version: i32,
    status: i32,
    outcome: &Result<ReplayReport, String>,
) -> RunReplay {
    let mut replay = RunReplay {
        run_id: run_id.to_owned(),
        workflow_version: version,
        status,
        ..RunReplay::default()
    };
    let report = match outcome {
        Ok(report) => report,
        Err(reason) => {
            replay.set_verdict(ReplayVerdict::Unreplayable);
            replay.unreplayable_reason = reason.clone();
            return replay;
        }
    };
    replay.set_verdict(match report.verdict {
        Verdict::Identical => ReplayVerdict::Identical,
        Verdict::Compatible => ReplayVerdict::Compatible,
        Verdict::Incompatible => ReplayVerdict::Incompatible,
    });
    replay.events = i32::try_from(report.events).unwrap_or(i32::MAX);
    replay.divergence = report.divergence.as_ref().map(|d| ReplayDivergence {
        rule: d.rule.as_str().to_owned(),
        node_id: d.node.clone().unwrap_or_default(),
        sequence: i64::try_from(d.sequence.unwrap_or(0)).unwrap_or(0),
        message: d.message.clone(),
    });
    replay.differences = report
        .differences
        .iter()
        .take(MAX_DIFFERENCES)
        .map(|d| ReplayDifference {
            kind: snake(&d.kind),
            node_id: d.node.clone(),
            message: d.message.clone(),
        })
        .collect();
    replay
}

/// A rule's or kind's name as docs/versions.md spells it.
fn snake(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use composer_engine::history::HistoryEventType;
    use composer_proto::v1::NodeState;

    fn event(sequence: i64, event_type: &str, node_id: &str, attempt: i32) -> HistoryEvent {
        HistoryEvent {
            sequence,
            event_type: event_type.to_owned(),
            node_id: node_id.to_owned(),
            attempt,
            ..HistoryEvent::default()
        }
    }

    #[test]
    fn nodes_outputs_and_entries_become_the_engines() {
        let run = Run {
            input: Some(crate::convert::from_json(&serde_json::json!({ "a": 1 }))),
            nodes: vec![
                NodeState {
                    node_id: "m[2]".to_owned(),
                    output: Some(crate::convert::from_json(&serde_json::json!("done"))),
                    ..NodeState::default()
                },
                NodeState {
                    node_id: "waiting".to_owned(),
                    ..NodeState::default()
                },
            ],
            ..Run::default()
        };
        let recorded = recorded_run(
            &run,
            &[
                event(1, "run_started", "", 0),
                event(2, "node_started", "m", 1),
            ],
        )
        .expect("converts");
        assert_eq!(recorded.input, serde_json::json!({ "a": 1 }));
        assert_eq!(
            recorded.outputs.get(&NodeKey::element("m", 2)),
            Some(&serde_json::json!("done"))
        );
        assert_eq!(recorded.outputs.len(), 1);
        assert_eq!(recorded.history[1].kind, HistoryEventType::NodeStarted);
        assert_eq!(recorded.history[1].attempt, Some(1));
        assert_eq!(recorded.history[0].node, None);
    }

    #[test]
    fn an_unknown_type_or_a_bad_key_is_named() {
        let run = Run::default();
        let error = recorded_run(&run, &[event(4, "run_exploded", "", 0)]).expect_err("unknown");
        assert!(error.to_string().contains("run_exploded"), "{error}");
        let error = recorded_run(&run, &[event(5, "node_started", "a[x]", 1)]).expect_err("key");
        assert!(error.to_string().contains("entry 5"), "{error}");
    }
}
