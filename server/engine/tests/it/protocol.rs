//! The coordinator-facing protocol: lazy loading with NeedNodes, serde forms
//! of what the coordinator persists, and small helpers.

use crate::common;

use std::collections::BTreeMap;

use common::*;
use composer_engine::{
    Action, DecideError, Event, NodeKey, RunState, TimerId, TimerKind, decide,
    http_status_is_retryable, prefetch,
};
use serde_json::json;

#[test]
fn decide_asks_for_unloaded_node_states_and_prefetch_names_them() {
    let yaml = "name: p\nnodes:\n  - { id: a, type: TASK, queue: q, task: t }\n  - { id: b, type: TASK, queue: q, task: t, input: '${nodes.a.output}' }\nedges:\n  - { from: a, to: b }\n";
    let mut d = Driver::new(yaml, json!(null));
    d.send(Event::RunStarted);
    let event = completed("a", 1, json!({"x": 1}));
    let empty = RunState {
        run: d.state.run.clone(),
        nodes: BTreeMap::new(),
        blobs: Default::default(),
    };
    match decide(&d.wf, &empty, &event, d.now) {
        Err(DecideError::NeedNodes(keys)) => assert!(keys.contains(&key("a")), "{keys:?}"),
        other => panic!("expected NeedNodes, got {other:?}"),
    }
    let keys = prefetch(&d.wf, &empty, &event);
    assert_eq!(keys, vec![key("a"), key("b")]);
    let mut loaded = empty.clone();
    for k in keys {
        let s = d.store.get(&k).cloned();
        loaded.load(k, s);
    }
    let decision = decide(&d.wf, &loaded, &event, d.now).expect("one round trip is enough");
    assert_eq!(created(&decision.actions), vec![("b".to_string(), 1)]);
    assert_eq!(decision.change.nodes.len(), 2, "only a and b are written");
}

fn task_input(actions: &[Action], node: &str) -> serde_json::Value {
    actions
        .iter()
        .find_map(|action| match action {
            Action::CreateTask { node: n, input, .. } if n.node == node => Some(input.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no task for {node} in {actions:?}"))
}

#[test]
fn a_template_passes_a_blob_reference_along_unread_and_an_expression_looking_inside_asks_for_it() {
    let digest = "ab".repeat(32);
    let reference = composer_engine::blob::reference(&digest, 200_000, "{\"doc\"");
    let yaml = "name: p\nnodes:\n  - { id: a, type: TASK, queue: q, task: t }\n  - { id: b, type: TASK, queue: q, task: t, input: { whole: '${nodes.a.output}', n: '${input.n}' } }\n  - { id: c, type: TASK, queue: q, task: t, input: { size: '${size(nodes.a.output.doc)}' } }\nedges:\n  - { from: a, to: b }\n  - { from: a, to: c }\n";
    let mut d = Driver::new(yaml, json!({"n": 7}));
    d.send(Event::RunStarted);
    let event = completed("a", 1, reference.clone());
    let mut state = d.state.clone();
    for k in prefetch(&d.wf, &state, &event) {
        let s = d.store.get(&k).cloned();
        state.load(k, s);
    }
    match decide(&d.wf, &state, &event, d.now) {
        Err(DecideError::NeedBlobs(digests)) => assert_eq!(digests, vec![digest.clone()]),
        other => panic!("expected NeedBlobs for c's size(), got {other:?}"),
    }
    state.blobs.insert(
        digest.clone(),
        std::sync::Arc::new(json!({"doc": "x".repeat(20)})),
    );
    let decision = decide(&d.wf, &state, &event, d.now).expect("decides with the blob");
    assert_eq!(
        task_input(&decision.actions, "b"),
        json!({"whole": reference, "n": 7}),
        "passed along as the reference, not the value"
    );
    assert_eq!(task_input(&decision.actions, "c"), json!({"size": 20}));
}

#[test]
fn what_the_coordinator_persists_round_trips_through_json() {
    let mut d = Driver::new(
        include_str!("../../../../examples/workflows/order.yaml"),
        json!({"order_id": 1, "amount": 2, "sku": "s"}),
    );
    let actions = d.send(Event::RunStarted);
    let run_json = serde_json::to_string(&d.state).expect("state serialises");
    let back: RunState = serde_json::from_str(&run_json).expect("state parses");
    assert_eq!(back, d.state);
    let actions_json = serde_json::to_value(&actions).expect("actions serialise");
    let back: Vec<Action> = serde_json::from_value(actions_json.clone()).expect("actions parse");
    assert_eq!(back, actions);
    assert_eq!(actions_json[1]["type"], "SCHEDULE_TIMER");
    let events = vec![
        Event::RunStarted,
        completed("m[3]", 2, json!([1])),
        Event::TimerFired {
            timer: TimerId::node(TimerKind::Retry, NodeKey::element("m", 3), Some(2)),
            seed: 9,
        },
        Event::RetryRequested {
            interrupted: vec![key("x")],
        },
    ];
    let text = serde_json::to_string(&events).expect("events serialise");
    assert!(text.contains("\"node\":\"m[3]\""), "{text}");
    let back: Vec<Event> = serde_json::from_str(&text).expect("events parse");
    assert_eq!(back, events);
}

/// Zero counters and empty lists are left out of what is stored (decision
/// 0061), and a state stored with them, as before, reads the same.
#[test]
fn defaults_are_left_out_of_stored_states_and_read_back_either_way() {
    let mut node = composer_engine::NodeState::pending();
    node.attempt = 1;
    node.first_attempt = 1;
    let stored = serde_json::to_value(&node).expect("node serialises");
    assert_eq!(
        stored,
        json!({"status": "PENDING", "attempt": 1, "first_attempt": 1})
    );
    let mut whole = stored.clone();
    whole["arrived"] = json!(0);
    whole["skipped"] = json!(0);
    for form in [stored, whole] {
        let back: composer_engine::NodeState = serde_json::from_value(form).expect("parses");
        assert_eq!(back, node);
    }

    let run = RunState::new("r", "w", 1, json!(null)).run;
    let stored = serde_json::to_value(&run).expect("record serialises");
    for absent in ["compensable", "failed", "compensated"] {
        assert!(stored.get(absent).is_none(), "{absent} in {stored}");
    }
    let mut whole = stored.clone();
    whole["compensable"] = json!([]);
    whole["failed"] = json!([]);
    whole["compensated"] = json!(false);
    for form in [stored, whole] {
        let back: composer_engine::RunRecord = serde_json::from_value(form).expect("parses");
        assert_eq!(back, run);
    }
}

#[test]
fn http_retryability_follows_the_language() {
    assert!(http_status_is_retryable(None), "network error");
    assert!(http_status_is_retryable(Some(503)));
    assert!(http_status_is_retryable(Some(429)));
    assert!(!http_status_is_retryable(Some(404)));
    assert!(!http_status_is_retryable(Some(400)));
}
