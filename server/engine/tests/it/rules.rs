//! One test per rule of docs/language.md, named after the rule.

use crate::common;

use common::*;
use composer_engine::{
    Action, ChildStatus, ErrorInfo, Event, MAP_ARM_SLICE, MAX_MAP_ITEMS, NodeStatus, RetryPolicy,
    RunStatus, TimerId, TimerKind, Timestamp, codes,
};
use serde_json::{Value as Json, json};

const TASK: &str = "type: TASK\n    queue: q\n    task: t";

// ------------------------------------------------------------------ routing

#[test]
fn routing_non_switch_node_follows_every_outgoing_edge_whose_when_holds() {
    let yaml = format!(
        "name: r
nodes:
  - id: a
    {TASK}
  - id: b
    {TASK}
  - id: c
    {TASK}
  - id: d
    {TASK}
edges:
  - {{ from: a, to: b, when: 'nodes.a.output.n > 1' }}
  - {{ from: a, to: c, when: 'nodes.a.output.n > 5' }}
  - {{ from: a, to: d }}
"
    );
    let r = simulate(&yaml, "tasks: { a: [ { complete: { n: 3 } } ] }");
    assert_eq!(r.status, RunStatus::Completed);
    assert_eq!(started_tasks(&r), vec!["a", "b", "d"]);
    assert_eq!(node_status(&r, "c"), Some(NodeStatus::Skipped));
}

#[test]
fn switch_takes_the_first_matching_edge_in_file_order() {
    let yaml = format!(
        "name: s
nodes:
  - id: sw
    type: SWITCH
  - id: low
    {TASK}
  - id: high
    {TASK}
  - id: fallback
    {TASK}
edges:
  - {{ from: sw, to: fallback }}
  - {{ from: sw, to: low, when: 'input.n > 1' }}
  - {{ from: sw, to: high, when: 'input.n > 2' }}
"
    );
    let r = simulate(&yaml, "input: { n: 5 }");
    assert_eq!(
        started_tasks(&r),
        vec!["low"],
        "first true edge in file order wins, even over a later one"
    );
    assert_eq!(node_status(&r, "high"), Some(NodeStatus::Skipped));
    assert_eq!(
        node_status(&r, "fallback"),
        Some(NodeStatus::Skipped),
        "the default is not taken when an edge matched"
    );
}

#[test]
fn switch_takes_the_default_edge_when_no_when_holds() {
    let yaml = format!(
        "name: s
nodes:
  - id: sw
    type: SWITCH
  - id: yes
    {TASK}
  - id: other
    {TASK}
edges:
  - {{ from: sw, to: other }}
  - {{ from: sw, to: yes, when: 'input.ok' }}
"
    );
    let r = simulate(&yaml, "input: { ok: false }");
    assert_eq!(started_tasks(&r), vec!["other"]);
    assert_eq!(node_status(&r, "yes"), Some(NodeStatus::Skipped));
    assert_eq!(r.status, RunStatus::Completed);
}

#[test]
fn error_edge_is_taken_only_after_the_last_attempt_and_may_read_the_error_code() {
    let yaml = format!(
        "name: e
nodes:
  - id: a
    {TASK}
    retry: {{ max_attempts: 2, initial_interval: 1s }}
  - id: ok
    {TASK}
  - id: on_busy
    {TASK}
  - id: on_other
    {TASK}
edges:
  - {{ from: a, to: ok }}
  - {{ from: a, to: on_busy, on: error, when: \"nodes.a.error.code == 'BUSY'\" }}
  - {{ from: a, to: on_other, on: error, when: \"nodes.a.error.code != 'BUSY'\" }}
"
    );
    // Fails once, then completes: no error edge.
    let r = simulate(
        &yaml,
        "tasks: { a: [ { fail: { code: BUSY } }, { complete: 1 } ] }",
    );
    assert_eq!(started_tasks(&r), vec!["a", "ok"]);
    assert_eq!(r.status, RunStatus::Completed);
    // Fails on both attempts: the matching error edge, normal edge skipped.
    let r = simulate(
        &yaml,
        "tasks: { a: [ { fail: { code: BUSY } }, { fail: { code: BUSY } } ] }",
    );
    assert_eq!(started_tasks(&r), vec!["a", "on_busy"]);
    assert_eq!(node_status(&r, "a"), Some(NodeStatus::Failed));
    assert_eq!(node_status(&r, "ok"), Some(NodeStatus::Skipped));
    assert_eq!(node_status(&r, "on_other"), Some(NodeStatus::Skipped));
    assert_eq!(
        r.status,
        RunStatus::Completed,
        "a handled failure does not fail the run"
    );
}

#[test]
fn unhandled_failure_fails_the_run() {
    let yaml = format!(
        "name: u
nodes:
  - id: f
    type: FORK
  - id: a
    {TASK}
    retry: {{ max_attempts: 1 }}
  - id: slow
    {TASK}
  - id: handler
    {TASK}
edges:
  - {{ from: f, to: a }}
  - {{ from: f, to: slow }}
  - {{ from: a, to: handler, on: error, when: \"nodes.a.error.code == 'OTHER'\" }}
"
    );
    let r = simulate(
        &yaml,
        "tasks: { a: [ { fail: { code: BOOM, message: it broke } } ], slow: [ { complete: 1, after: 1h } ] }",
    );
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(
        r.error,
        Some(ErrorInfo::new("BOOM", "it broke").at_node("a".into())),
        "the run's error names the node that failed it"
    );
    let last = &r.history.last().expect("history").actions;
    assert!(last.iter().any(|a| matches!(a, Action::FailRun { .. })));
    // The other branch is cancelled with the run, not waited for.
    assert!(r.actions().any(|a| matches!(a, Action::CancelAllTasks)));
    assert!(r.history.last().expect("step").at < Timestamp(T0.0 + 3_600_000));
}

#[test]
fn dead_path_elimination_skips_nodes_whose_incoming_edges_are_all_skipped() {
    let yaml = format!(
        "name: d
nodes:
  - id: sw
    type: SWITCH
  - id: left
    {TASK}
  - id: l2
    {TASK}
  - id: l3
    {TASK}
  - id: right
    {TASK}
edges:
  - {{ from: sw, to: left, when: 'false' }}
  - {{ from: left, to: l2 }}
  - {{ from: l2, to: l3 }}
  - {{ from: sw, to: right }}
"
    );
    let r = simulate(&yaml, "{}");
    for k in ["left", "l2", "l3"] {
        assert_eq!(node_status(&r, k), Some(NodeStatus::Skipped), "{k}");
    }
    assert_eq!(started_tasks(&r), vec!["right"]);
    assert_eq!(r.history_of("node_skipped").count(), 3);
}

const JOIN_YAML: &str = "name: j
nodes:
  - id: sw
    type: FORK
  - id: a
    type: TASK
    queue: q
    task: t
  - id: b
    type: TASK
    queue: q
    task: t
  - id: c
    type: TASK
    queue: q
    task: t
  - id: j
    type: JOIN
  - id: after
    type: TASK
    queue: q
    task: t
    input: '${nodes.j.output}'
edges:
  - { from: sw, to: a, when: 'input.a' }
  - { from: sw, to: b, when: 'input.b' }
  - { from: sw, to: c, when: 'input.c' }
  - { from: a, to: j }
  - { from: b, to: j }
  - { from: c, to: j }
  - { from: j, to: after }
output: '${nodes.j.output}'
";

#[test]
fn join_fires_when_every_incoming_edge_arrived_or_was_skipped_with_at_least_one_arrival() {
    let mut d = Driver::new(JOIN_YAML, json!({"a": true, "b": true, "c": false}));
    let acts = d.send(Event::RunStarted);
    assert_eq!(
        created(&acts),
        vec![("a".to_string(), 1), ("b".to_string(), 1)]
    );
    let acts = d.send(completed("a", 1, json!("A")));
    assert!(created(&acts).is_empty(), "the JOIN waits for b");
    assert_eq!(d.node("j").map(|s| (s.arrived, s.skipped)), Some((1, 1)));
    let acts = d.send(completed("b", 1, json!("B")));
    assert_eq!(created(&acts), vec![("after".to_string(), 1)]);
    let input = acts.iter().find_map(|a| match a {
        Action::CreateTask { input, .. } => Some(input.clone()),
        _ => None,
    });
    assert_eq!(
        input,
        Some(json!({"a": "A", "b": "B"})),
        "JOIN output maps each arrived node to its output"
    );
    // All branches skipped: the JOIN is skipped, not fired.
    let r = simulate(JOIN_YAML, "input: { a: false, b: false, c: false }");
    assert_eq!(node_status(&r, "j"), Some(NodeStatus::Skipped));
    assert_eq!(node_status(&r, "after"), Some(NodeStatus::Skipped));
    assert_eq!(r.status, RunStatus::Completed);
}

#[test]
fn join_fires_once() {
    let r = simulate(JOIN_YAML, "input: { a: true, b: true, c: true }");
    let fired = r
        .history_of("node_completed")
        .filter(|a| a.node().is_some_and(|n| n.node == "j"))
        .count();
    assert_eq!(fired, 1);
    assert_eq!(
        started_tasks(&r).iter().filter(|n| *n == "after").count(),
        1
    );
    assert_eq!(r.output, Some(json!({"a": null, "b": null, "c": null})));
}

#[test]
fn merge_node_starts_on_first_arrival_and_a_later_arrival_is_ignored_and_recorded() {
    let yaml = format!(
        "name: m
nodes:
  - id: f
    type: FORK
  - id: a
    {TASK}
  - id: b
    {TASK}
  - id: merge
    {TASK}
edges:
  - {{ from: f, to: a }}
  - {{ from: f, to: b }}
  - {{ from: a, to: merge }}
  - {{ from: b, to: merge }}
"
    );
    let r = simulate(
        &yaml,
        "tasks: { a: [ { complete: 1, after: 1s } ], b: [ { complete: 2, after: 5s } ], merge: [ { complete: 3, after: 10s } ] }",
    );
    assert_eq!(
        started_tasks(&r).iter().filter(|n| *n == "merge").count(),
        1
    );
    let ignored: Vec<_> = r.history_of("arrival_ignored").collect();
    assert_eq!(ignored.len(), 1);
    assert_eq!(
        ignored[0].node().map(|n| n.to_string()),
        Some("merge".into())
    );
    assert_eq!(r.status, RunStatus::Completed);
}

#[test]
fn run_completes_when_nothing_is_running_and_then_evaluates_output() {
    let yaml = format!(
        "name: c
nodes:
  - id: a
    {TASK}
  - id: w
    type: WAIT
    duration: 1h
edges:
  - {{ from: a, to: w }}
output: {{ a: '${{nodes.a.output}}', waited: '${{nodes.w.status}}' }}
"
    );
    let mut d = Driver::new(&yaml, json!(null));
    d.send(Event::RunStarted);
    let acts = d.send(completed("a", 1, json!({"x": 1})));
    assert!(
        !acts.iter().any(|a| matches!(a, Action::CompleteRun { .. })),
        "the WAIT is still active"
    );
    assert_eq!(d.state.run.active, 1);
    let acts = d.at(3_600_000).send(Event::TimerFired {
        timer: TimerId::node(TimerKind::Wait, key("w"), None),
        seed: 0,
    });
    let out = acts.iter().find_map(|a| match a {
        Action::CompleteRun { output } => Some(output.clone()),
        _ => None,
    });
    assert_eq!(out, Some(json!({"a": {"x": 1}, "waited": "COMPLETED"})));
    assert_eq!(d.state.run.status, RunStatus::Completed);
}

// ------------------------------------------------------------------ node types

#[test]
fn task_node_hands_its_input_to_its_queue() {
    let yaml = "name: t
nodes:
  - id: a
    type: TASK
    queue: inventory
    task: reserve
    heartbeat_timeout: 10s
    timeout: 1m
    input: { sku: '${input.sku}' }
";
    let mut d = Driver::new(yaml, json!({"sku": "X"}));
    let acts = d.send(Event::RunStarted);
    assert!(acts.contains(&Action::CreateTask {
        node: key("a"),
        attempt: 1,
        queue: "inventory".into(),
        task_name: "reserve".into(),
        input: json!({"sku": "X"}),
        heartbeat_timeout_ms: 10_000,
        timeout_ms: Some(60_000),
        rate_limit_key: None,
        concurrency: None,
    }));
    assert!(acts.contains(&Action::ScheduleTimer {
        timer: TimerId::node(TimerKind::AttemptTimeout, key("a"), Some(1)),
        fire_at: Timestamp(T0.0 + 60_000),
    }));
}

#[test]
fn http_node_is_a_task_on_the_http_queue_with_the_rendered_request() {
    let yaml = "name: h
nodes:
  - id: call
    type: HTTP
    http:
      method: post
      url: 'https://api/${input.id}'
      headers: { X-Trace: '${run.id}' }
      body: { amount: '${input.amount}' }
      timeout: 5s
";
    let mut d = Driver::new(yaml, json!({"id": 7, "amount": 12.5}));
    let acts = d.send(Event::RunStarted);
    let task = acts.iter().find_map(|a| match a {
        Action::CreateTask {
            queue,
            task_name,
            input,
            ..
        } => Some((queue.clone(), task_name.clone(), input.clone())),
        _ => None,
    });
    assert_eq!(
        task,
        Some((
            "_http".into(),
            "http".into(),
            json!({"method": "POST", "url": "https://api/7", "headers": {"X-Trace": "run-1"}, "body": {"amount": 12.5}, "timeout_ms": 5000})
        ))
    );
}

#[test]
fn code_node_runs_on_its_language_queue_with_code_and_input() {
    let yaml = "name: c
nodes:
  - id: py
    type: CODE
    language: python
    code: 'def main(i): return i'
    input: { n: '${input.n}' }
";
    let mut d = Driver::new(yaml, json!({"n": 2}));
    let acts = d.send(Event::RunStarted);
    let task = acts.iter().find_map(|a| match a {
        Action::CreateTask { queue, input, .. } => Some((queue.clone(), input.clone())),
        _ => None,
    });
    assert_eq!(
        task,
        Some((
            "code.python".into(),
            json!({"code": "def main(i): return i", "input": {"n": 2}})
        ))
    );
}

#[test]
fn wait_node_is_a_durable_timer_for_a_duration_or_until_a_timestamp() {
    let yaml = "name: w
nodes:
  - id: d
    type: WAIT
    duration: 24h
  - id: u
    type: WAIT
    until: 'timestamp(input.at) + duration(\"1h\")'
edges:
  - { from: d, to: u }
";
    let mut d = Driver::new(yaml, json!({"at": "2026-03-01T00:00:00Z"}));
    let acts = d.send(Event::RunStarted);
    assert!(acts.contains(&Action::ScheduleTimer {
        timer: TimerId::node(TimerKind::Wait, key("d"), None),
        fire_at: Timestamp(T0.0 + 86_400_000)
    }));
    let acts = d.at(86_400_000).send(Event::TimerFired {
        timer: TimerId::node(TimerKind::Wait, key("d"), None),
        seed: 0,
    });
    assert!(acts.contains(&Action::ScheduleTimer {
        timer: TimerId::node(TimerKind::Wait, key("u"), None),
        fire_at: Timestamp(1_772_326_800_000)
    }));
    assert_eq!(d.state.run.status, RunStatus::Running);
}

#[test]
fn a_wait_until_past_the_timer_horizon_fails_the_node_instead_of_firing_at_once() {
    let yaml = "name: w
nodes:
  - id: u
    type: WAIT
    until: 'timestamp(input.at)'
";
    let mut d = Driver::new(yaml, json!({"at": "9999-01-01T00:00:00Z"}));
    let acts = d.send(Event::RunStarted);
    assert!(
        !acts
            .iter()
            .any(|a| matches!(a, Action::ScheduleTimer { .. })),
        "no timer is scheduled: {acts:?}"
    );
    assert_eq!(d.state.run.status, RunStatus::Failed);
    let error = d.state.run.error.clone().expect("the run's error");
    assert!(
        error.message.contains("3660d"),
        "the error names the horizon: {error:?}"
    );
}

#[test]
fn wait_for_event_awaits_its_correlation_key_and_outputs_the_payload() {
    let yaml = "name: e
nodes:
  - id: approval
    type: WAIT_FOR_EVENT
    event: approved
    correlation: \"'order-' + string(input.id)\"
    timeout: 2h
output: '${nodes.approval.output.by}'
";
    let mut d = Driver::new(yaml, json!({"id": 9}));
    let acts = d.send(Event::RunStarted);
    assert!(acts.contains(&Action::AwaitEvent {
        node: key("approval"),
        name: "approved".into(),
        correlation: Some(json!("order-9"))
    }));
    // An event of another name changes nothing; the coordinator keeps it.
    let other = Event::EventReceived {
        name: "other".into(),
        payload: json!({}),
        node: None,
    };
    assert!(!d.decide(&other).event_consumed());
    let acts = d.send(other);
    assert_eq!(history_kinds(&acts), vec!["event_ignored"]);
    let approved = Event::EventReceived {
        name: "approved".into(),
        payload: json!({"by": "ana"}),
        node: None,
    };
    assert!(d.decide(&approved).event_consumed());
    let acts = d.send(Event::EventReceived {
        name: "approved".into(),
        payload: json!({"by": "ana"}),
        node: None,
    });
    assert!(acts.contains(&Action::CancelTimer {
        timer: TimerId::node(TimerKind::EventTimeout, key("approval"), None)
    }));
    assert!(acts.contains(&Action::CompleteRun {
        output: json!("ana")
    }));
    // Timeout without an event fails the node with TIMEOUT.
    let r = simulate(yaml, "input: { id: 1 }");
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.error.map(|e| e.code), Some(codes::TIMEOUT.into()));
}

#[test]
fn sub_workflow_starts_a_child_run_and_outputs_its_output() {
    let yaml = "name: p
nodes:
  - id: child
    type: SUB_WORKFLOW
    workflow: billing
    version: 3
    input: { account: '${input.account}' }
output: '${nodes.child.output}'
";
    let mut d = Driver::new(yaml, json!({"account": "A1"}));
    let acts = d.send(Event::RunStarted);
    assert!(acts.contains(&Action::StartChildRun {
        node: key("child"),
        attempt: 1,
        workflow: "billing".into(),
        version: Some(3),
        input: json!({"account": "A1"})
    }));
    let acts = d.send(Event::ChildRunFinished {
        node: key("child"),
        attempt: 1,
        status: ChildStatus::Completed,
        output: json!({"invoice": 5}),
        error: None,
        seed: 0,
    });
    assert!(acts.contains(&Action::CompleteRun {
        output: json!({"invoice": 5})
    }));
    // Cancelling the parent cancels the child.
    let mut d = Driver::new(yaml, json!({"account": "A1"}));
    d.send(Event::RunStarted);
    let acts = d.send(Event::CancelRequested {
        reason: "user".into(),
    });
    assert!(acts.contains(&Action::CancelAllChildRuns));
    assert!(acts.contains(&Action::CancelRun {
        reason: "user".into()
    }));
}

#[test]
fn a_map_wider_than_its_limit_fails_the_node_before_creating_any_element() {
    let yaml = "name: m
nodes:
  - id: m
    type: MAP
    items: input.xs
    queue: q
    task: t
";
    let too_wide: Vec<usize> = (0..=MAX_MAP_ITEMS).collect();
    let mut d = Driver::new(yaml, json!({ "xs": too_wide }));
    let acts = d.send(Event::RunStarted);
    assert!(created(&acts).is_empty(), "no element was created");
    assert_eq!(d.state.run.status, RunStatus::Failed);
    let error = d.state.run.error.clone().expect("error");
    assert!(error.message.contains("at most 100000"), "{error:?}");
    assert_eq!(error.node.as_deref(), Some("m"));
    let widest: Vec<usize> = (0..MAX_MAP_ITEMS).collect();
    let mut d = Driver::new(yaml, json!({ "xs": widest }));
    d.send(Event::RunStarted);
    assert_eq!(d.state.run.status, RunStatus::Running, "100,000 is allowed");
}

#[test]
fn a_template_that_multiplies_its_input_past_the_payload_limit_fails_instead_of_rendering() {
    // the expression is cheap in steps; what it builds is not
    let yaml = "name: amp
nodes:
  - id: a
    type: TASK
    queue: q
    task: t
    input: '${[0, 1, 2, 3, 4, 5, 6, 7, 8, 9].map(x, [0, 1, 2, 3, 4].map(y, input))}'
";
    let mut d = Driver::new(yaml, json!({ "blob": "x".repeat(2_000) }));
    d.wf = compile(yaml).with_max_rendered_bytes(50_000);
    let acts = d.send(Event::RunStarted);
    assert!(
        !acts.iter().any(|a| matches!(a, Action::CreateTask { .. })),
        "no task carries the amplified input"
    );
    assert_eq!(d.state.run.status, RunStatus::Failed);
    let error = d.state.run.error.clone().expect("error");
    assert!(error.message.contains("more than 50000 bytes"), "{error:?}");
    // the same template within the limit renders
    let mut d = Driver::new(yaml, json!({ "blob": "x".repeat(100) }));
    d.wf = compile(yaml).with_max_rendered_bytes(50_000);
    let acts = d.send(Event::RunStarted);
    assert!(acts.iter().any(|a| matches!(a, Action::CreateTask { .. })));
}

#[test]
fn map_runs_each_element_at_most_concurrency_at_a_time_and_outputs_results_in_order() {
    let yaml = "name: m
nodes:
  - id: m
    type: MAP
    items: input.xs
    concurrency: 2
    queue: q
    task: double
    input: { x: '${item}', i: '${index}' }
output: '${nodes.m.output}'
";
    let mut d = Driver::new(yaml, json!({"xs": [10, 20, 30]}));
    let acts = d.send(Event::RunStarted);
    assert_eq!(
        created(&acts),
        vec![("m[0]".to_string(), 1), ("m[1]".to_string(), 1)]
    );
    let acts = d.send(completed("m[1]", 1, json!(40)));
    assert_eq!(
        created(&acts),
        vec![("m[2]".to_string(), 1)],
        "a free slot starts the next element"
    );
    let third_input = acts.iter().find_map(|a| match a {
        Action::CreateTask { input, .. } => Some(input.clone()),
        _ => None,
    });
    assert_eq!(third_input, Some(json!({"x": 30, "i": 2})));
    d.send(completed("m[2]", 1, json!(60)));
    let acts = d.send(completed("m[0]", 1, json!(20)));
    assert!(acts.contains(&Action::CompleteRun {
        output: json!([20, 40, 60])
    }));
    // An empty list completes at once with [].
    let r = simulate(yaml, "input: { xs: [] }");
    assert_eq!(r.output, Some(json!([])));
    // A MAP of child workflows.
    let child = "name: mc
nodes:
  - id: m
    type: MAP
    items: '[1, 2]'
    workflow: per_item
output: '${nodes.m.output}'
";
    let r = simulate(
        child,
        "children: { 'm[0]': [ { complete: a } ], 'm[1]': [ { complete: b } ] }",
    );
    assert_eq!(r.output, Some(json!(["a", "b"])));
}

/// The MAP_ARM timer among `actions`, if one was scheduled, and when.
fn next_slice(actions: &[Action]) -> Option<(TimerId, Timestamp)> {
    actions.iter().find_map(|a| match a {
        Action::ScheduleTimer { timer, fire_at } if timer.kind == TimerKind::MapArm => {
            Some((timer.clone(), *fire_at))
        }
        _ => None,
    })
}

fn fired(timer: TimerId) -> Event {
    Event::TimerFired { timer, seed: 1 }
}

const WIDE_MAP: &str = "name: wide
nodes:
  - id: m
    type: MAP
    items: input.xs
    concurrency: 600
    queue: q
    task: t
    input: { x: '${item}' }
";

#[test]
fn a_wide_map_arms_its_elements_a_slice_per_event_up_to_its_concurrency() {
    let slice = MAP_ARM_SLICE as usize;
    let xs: Vec<u32> = (0..1_000).collect();
    let mut d = Driver::new(WIDE_MAP, json!({ "xs": xs }));
    let acts = d.send(Event::RunStarted);
    let first: Vec<String> = created(&acts).into_iter().map(|(k, _)| k).collect();
    assert_eq!(first.len(), slice, "the start arms one slice");
    assert_eq!(first[0], "m[0]");
    assert_eq!(
        d.status("m[999]"),
        None,
        "an element's row waits for its start"
    );
    assert_eq!(
        d.node("m#inputs[3]").and_then(|row| row.input.clone()),
        Some(json!(
            (750..1_000).map(|x| json!({ "x": x })).collect::<Vec<_>>()
        )),
        "the later elements' inputs wait in rows of a slice"
    );
    let (timer, at) = next_slice(&acts).expect("the next slice is scheduled");
    assert_eq!(at, d.now, "due at once");

    let acts = d.send(fired(timer));
    let second: Vec<String> = created(&acts).into_iter().map(|(k, _)| k).collect();
    assert_eq!(second.len(), slice);
    assert_eq!(
        second[0],
        format!("m[{slice}]"),
        "in order, after the first"
    );
    let (timer, _) = next_slice(&acts).expect("and the one after");
    let acts = d.send(fired(timer.clone()));
    assert_eq!(
        created(&acts).len(),
        600 - 2 * slice,
        "up to the MAP's concurrency, no further"
    );
    assert!(next_slice(&acts).is_none(), "the window is full");

    // a completion frees one place, which the next element takes at once
    let acts = d.send(completed("m[0]", 1, json!(0)));
    assert_eq!(created(&acts), vec![("m[600]".to_string(), 1)]);
    // a continuation that comes again arms nothing and records nothing
    let acts = d.send(fired(timer));
    assert!(acts.is_empty(), "{acts:?}");
}

#[test]
fn a_completion_while_a_wide_map_arms_starts_a_slice_more_and_the_continuation_the_rest() {
    let slice = MAP_ARM_SLICE as usize;
    let xs: Vec<u32> = (0..1_000).collect();
    let mut d = Driver::new(WIDE_MAP, json!({ "xs": xs }));
    let acts = d.send(Event::RunStarted);
    let (timer, _) = next_slice(&acts).expect("the next slice is scheduled");
    let acts = d.send(completed("m[0]", 1, json!(0)));
    let armed = created(&acts);
    assert_eq!(armed.len(), slice, "the completion arms a slice");
    assert_eq!(armed[0].0, format!("m[{slice}]"));
    // 2 × slice - 1 in flight: the continuation fills the window to 600
    let acts = d.send(fired(timer));
    assert_eq!(created(&acts).len(), 600 - (2 * slice - 1));
    assert!(next_slice(&acts).is_none(), "the window is full");
}

#[test]
fn a_map_that_failed_before_its_next_slice_arms_no_more() {
    let xs: Vec<u32> = (0..1_000).collect();
    let mut d = Driver::new(WIDE_MAP, json!({ "xs": xs }));
    let acts = d.send(Event::RunStarted);
    let (timer, _) = next_slice(&acts).expect("the next slice is scheduled");
    d.send(failed("m[3]", 1, "BROKEN", false));
    assert_eq!(d.state.run.status, RunStatus::Failed);
    let acts = d.send(fired(timer));
    assert!(created(&acts).is_empty(), "{acts:?}");
}

/// Every CreateTask among `actions`: its node key and rendered input.
fn task_inputs(actions: &[Action]) -> Vec<(String, Json)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateTask { node, input, .. } => Some((node.to_string(), input.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_map_element_started_later_gets_the_input_rendered_at_the_maps_start() {
    let xs: Vec<u32> = (0..700).collect();
    let mut d = Driver::new(WIDE_MAP.replace("600", "300").as_str(), json!({ "xs": xs }));
    let acts = d.send(Event::RunStarted);
    let rows: Vec<String> = d.store.keys().map(ToString::to_string).collect();
    assert!(
        rows.contains(&"m#inputs[1]".to_owned()) && rows.contains(&"m#inputs[2]".to_owned()),
        "{rows:?}"
    );
    assert!(
        !rows.contains(&"m#inputs[0]".to_owned()),
        "a row whose elements all started at once is not written"
    );
    assert_eq!(
        task_inputs(&acts)[7],
        ("m[7]".to_owned(), json!({ "x": 7 }))
    );
    let (timer, _) = next_slice(&acts).expect("the next slice is scheduled");
    let acts = d.send(fired(timer));
    let armed = task_inputs(&acts);
    assert_eq!(armed.len(), 50, "up to the concurrency of 300");
    assert_eq!(armed[0], ("m[250]".to_owned(), json!({ "x": 250 })));
    // a completion starts the next element, from the row of inputs
    let acts = d.send(completed("m[4]", 1, json!(4)));
    assert_eq!(
        task_inputs(&acts),
        vec![("m[300]".to_owned(), json!({ "x": 300 }))]
    );
    assert_eq!(
        d.node("m[300]").and_then(|row| row.input.clone()),
        Some(json!({ "x": 300 })),
        "a started element's row keeps its input, for its retries"
    );
    // the rows of inputs are not nodes: the run completes on its elements
    for i in (0..700).filter(|&i| i != 4) {
        let element = format!("m[{i}]");
        assert_eq!(d.status(&element), Some(NodeStatus::Running), "{element}");
        d.send(completed(&element, 1, json!(i)));
    }
    assert_eq!(d.state.run.status, RunStatus::Completed);
}

#[test]
fn a_map_whose_element_inputs_together_pass_the_payload_limit_fails_before_any_starts() {
    let xs: Vec<String> = (0..1_000).map(|i| format!("{i:0>90}")).collect();
    let mut d = Driver::new(WIDE_MAP, json!({ "xs": xs }));
    // each element renders to about a hundred bytes, all of them to 100,000
    d.wf = compile(WIDE_MAP).with_max_rendered_bytes(50_000);
    let acts = d.send(Event::RunStarted);
    assert!(created(&acts).is_empty(), "{acts:?}");
    assert_eq!(d.state.run.status, RunStatus::Failed);
    let error = d.state.run.error.clone().expect("an error");
    assert!(
        error
            .message
            .contains("render to more than 50000 bytes together"),
        "{error:?}"
    );
}

#[test]
fn a_map_started_before_rows_of_inputs_starts_its_next_elements_from_their_own_rows() {
    let xs: Vec<u32> = (0..400).collect();
    let mut d = Driver::new(WIDE_MAP, json!({ "xs": xs }));
    let acts = d.send(Event::RunStarted);
    let (timer, _) = next_slice(&acts).expect("the next slice is scheduled");
    // as such a MAP was stored: every element row written at its start
    // with its input, no rows of inputs, and no `chunked` in its progress
    let inputs = d
        .store
        .remove(&key("m#inputs[1]"))
        .expect("a row of inputs");
    let Some(Json::Array(inputs)) = inputs.input else {
        panic!("a row of inputs holds a list")
    };
    for (i, input) in (250..).zip(inputs) {
        let mut row = composer_engine::NodeState::pending();
        row.input = Some(input);
        d.store.insert(key(&format!("m[{i}]")), row);
    }
    let map = d.store.get_mut(&key("m")).expect("the MAP's row");
    let progress = map.map.as_mut().expect("its progress");
    progress.chunked = false;
    let stored = serde_json::to_value(&*progress).expect("progress as JSON");
    assert!(stored.get("chunked").is_none(), "{stored}");

    let armed = task_inputs(&d.send(fired(timer)));
    assert_eq!(armed.len(), 150);
    assert_eq!(armed[0], ("m[250]".to_owned(), json!({ "x": 250 })));
    assert_eq!(armed[149], ("m[399]".to_owned(), json!({ "x": 399 })));
}

#[test]
fn a_simulated_map_reports_its_elements_and_not_its_rows_of_inputs() {
    let xs: Vec<u32> = (0..700).collect();
    let r = simulate(
        &WIDE_MAP.replace("600", "300"),
        &format!("input: {{ xs: {xs:?} }}"),
    );
    assert_eq!(r.status, RunStatus::Completed);
    assert_eq!(r.nodes.len(), 1 + 700, "the MAP and its elements");
    assert!(r.nodes.keys().all(|k| !k.is_map_inputs()));
}

#[test]
fn a_map_of_the_most_elements_starts_with_a_slice_and_rows_of_inputs() {
    let xs: Vec<usize> = (0..MAX_MAP_ITEMS).collect();
    let mut d = Driver::new(WIDE_MAP, json!({ "xs": xs }));
    let decision = d.decide(&Event::RunStarted);
    let written = decision.change.nodes.len();
    let slice = MAP_ARM_SLICE as usize;
    // the MAP's row, a slice of elements, and a row per later slice
    assert_eq!(written, 1 + slice + MAX_MAP_ITEMS / slice - 1);
    d.send(Event::RunStarted);
    assert_eq!(d.state.run.status, RunStatus::Running);
}

#[test]
fn a_map_within_one_slice_arms_every_element_in_its_start() {
    let xs: Vec<u32> = (0..MAP_ARM_SLICE).collect();
    let mut d = Driver::new(WIDE_MAP, json!({ "xs": xs }));
    let acts = d.send(Event::RunStarted);
    assert_eq!(created(&acts).len(), MAP_ARM_SLICE as usize);
    assert!(next_slice(&acts).is_none());
}

#[test]
fn fork_starts_every_outgoing_edge_in_parallel() {
    let r = simulate(JOIN_YAML, "input: { a: true, b: true, c: true }");
    let first_step = &r.history[0].actions;
    assert_eq!(
        created(first_step).len(),
        3,
        "all three branches start on the same event"
    );
}

// ------------------------------------------------------------------ retries and time

#[test]
fn retry_delay_is_min_of_initial_times_backoff_to_the_n_minus_1_and_max_interval() {
    let p = RetryPolicy {
        initial_interval_ms: 1_000,
        backoff: 2.0,
        max_interval_ms: 5_000,
        ..RetryPolicy::default()
    };
    let delays: Vec<u64> = (1..=5).map(|n| p.delay_ms(n, 0)).collect();
    assert_eq!(delays, vec![1_000, 2_000, 4_000, 5_000, 5_000]);
    // And through the state machine: the retry timers fire at those delays.
    let yaml = format!(
        "name: r\nnodes:\n  - id: a\n    {TASK}\n    retry: {{ max_attempts: 4, initial_interval: 1s, backoff: 3, max_interval: 5s }}\n"
    );
    let r = simulate(
        &yaml,
        "tasks: { a: [ { fail: { code: X } }, { fail: { code: X } }, { fail: { code: X } }, { complete: 1 } ] }",
    );
    let waits: Vec<i64> = r
        .history
        .iter()
        .flat_map(|s| s.actions.iter().map(move |a| (s.at, a)))
        .filter_map(|(at, a)| match a {
            Action::ScheduleTimer { timer, fire_at } if timer.kind == TimerKind::Retry => {
                Some(fire_at.0 - at.0)
            }
            _ => None,
        })
        .collect();
    assert_eq!(waits, vec![1_000, 3_000, 5_000]);
    assert_eq!(r.status, RunStatus::Completed);
}

#[test]
fn retry_jitter_stays_within_bounds_and_is_deterministic_from_the_seed() {
    let p = RetryPolicy {
        initial_interval_ms: 1_000,
        backoff: 2.0,
        max_interval_ms: 60_000,
        jitter: true,
        ..RetryPolicy::default()
    };
    let mut distinct = std::collections::HashSet::new();
    for seed in 0..200u64 {
        let d = p.delay_ms(3, seed);
        assert!(d <= 4_000, "full jitter stays within [0, 4000], got {d}");
        assert_eq!(d, p.delay_ms(3, seed), "same seed, same delay");
        distinct.insert(d);
    }
    assert!(distinct.len() > 50, "the seed actually spreads delays");
}

#[test]
fn non_retryable_codes_are_final_at_once() {
    let yaml = format!(
        "name: n\nnodes:\n  - id: a\n    {TASK}\n    retry: {{ max_attempts: 5, non_retryable: [BAD_INPUT] }}\n"
    );
    let r = simulate(&yaml, "tasks: { a: [ { fail: { code: BAD_INPUT } } ] }");
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(started_tasks(&r).len(), 1);
    assert_eq!(
        r.actions()
            .filter(|a| matches!(a, Action::CreateTask { .. }))
            .count(),
        1
    );
}

#[test]
fn worker_marked_non_retryable_error_is_final_at_once() {
    let yaml =
        format!("name: n\nnodes:\n  - id: a\n    {TASK}\n    retry: {{ max_attempts: 5 }}\n");
    let r = simulate(
        &yaml,
        "tasks: { a: [ { fail: { code: HTTP_404, retryable: false } } ] }",
    );
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.error.clone().map(|e| e.code), Some("HTTP_404".into()));
    assert_eq!(
        r.actions()
            .filter(|a| matches!(a, Action::CreateTask { .. }))
            .count(),
        1
    );
    // A retryable one is retried up to max_attempts.
    let r = simulate(
        &yaml,
        "tasks: { a: [ { fail: { code: E } }, { fail: { code: E } }, { fail: { code: E } }, { fail: { code: E } }, { fail: { code: E } } ] }",
    );
    assert_eq!(
        r.actions()
            .filter(|a| matches!(a, Action::CreateTask { .. }))
            .count(),
        5
    );
}

#[test]
fn attempt_timeout_fails_the_attempt_with_code_timeout() {
    let yaml = format!(
        "name: t\nnodes:\n  - id: a\n    {TASK}\n    timeout: 10s\n    retry: {{ max_attempts: 2, initial_interval: 1s }}\n"
    );
    let r = simulate(
        &yaml,
        "tasks: { a: [ { complete: late, after: 1m }, { complete: ok, after: 1s } ] }",
    );
    let failures: Vec<_> = r.history_of("attempt_failed").collect();
    assert_eq!(failures.len(), 1);
    assert!(
        matches!(failures[0], Action::AppendHistory { detail, .. } if detail["code"] == "TIMEOUT")
    );
    assert!(
        r.actions()
            .any(|a| matches!(a, Action::CancelTask { node } if node.node == "a")),
        "the timed-out task is cancelled"
    );
    assert_eq!(r.status, RunStatus::Completed);
    assert_eq!(
        r.nodes.get(&key("a")).and_then(|s| s.output.clone()),
        Some(json!("ok"))
    );
}

#[test]
fn lease_expiry_fails_the_attempt_with_code_lease_expired() {
    let yaml = format!(
        "name: l\nnodes:\n  - id: a\n    {TASK}\n    heartbeat_timeout: 15s\n    retry: {{ max_attempts: 1 }}\n"
    );
    let r = simulate(&yaml, "tasks: { a: [ hang ] }");
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some(codes::LEASE_EXPIRED)
    );
    assert_eq!(
        r.history.last().map(|s| s.at),
        Some(Timestamp(T0.0 + 15_000))
    );
}

#[test]
fn a_task_lost_with_its_worker_at_every_delivery_fails_the_attempt_with_worker_lost() {
    let yaml = format!(
        "name: l\nnodes:\n  - id: a\n    {TASK}\n    retry: {{ max_attempts: 3, initial_interval: 1s }}\n"
    );
    let r = simulate(&yaml, "tasks: { a: [ lost, lost, lost ] }");
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some(codes::WORKER_LOST)
    );
    let lost: Vec<_> = r.history_of("lease_expired").collect();
    assert_eq!(lost.len(), 3, "one per attempt");
    assert!(
        lost.iter()
            .all(|a| matches!(a, Action::AppendHistory { detail, .. }
        if detail["worker_lost"] == true && detail["deliveries"] == 2))
    );
    let failures: Vec<_> = r.history_of("attempt_failed").collect();
    assert!(
        failures.iter().all(
            |a| matches!(a, Action::AppendHistory { detail, .. } if detail["code"] == "WORKER_LOST")
        ),
        "{failures:?}"
    );
    // the retry policy runs as for any failure: 10 s + 1 s + 10 s + 2 s + 10 s
    assert_eq!(
        r.history.last().map(|s| s.at),
        Some(Timestamp(T0.0 + 33_000))
    );
}

#[test]
fn run_timeout_fails_the_run() {
    let yaml = format!("name: t\ntimeout: 1h\nnodes:\n  - id: a\n    {TASK}\n");
    let r = simulate(&yaml, "tasks: { a: [ { complete: 1, after: 2h } ] }");
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some(codes::RUN_TIMEOUT)
    );
    assert_eq!(
        r.history.last().map(|s| s.at),
        Some(Timestamp(T0.0 + 3_600_000))
    );
    // Finishing in time cancels the run timer.
    let r = simulate(&yaml, "tasks: { a: [ { complete: 1, after: 1m } ] }");
    assert_eq!(r.status, RunStatus::Completed);
    assert!(r.actions().any(
        |a| matches!(a, Action::CancelTimer { timer } if timer.kind == TimerKind::RunTimeout)
    ));
}

// ------------------------------------------------------------------ compensation, cancel, retry

const SAGA: &str = "name: saga
nodes:
  - id: a
    type: TASK
    queue: q
    task: a
    compensate: undo_a
  - id: b
    type: TASK
    queue: q
    task: b
    compensate: undo_b
  - id: c
    type: TASK
    queue: q
    task: c
    retry: { max_attempts: 1 }
  - id: undo_a
    type: TASK
    queue: q
    task: undo_a
    input: { id: '${nodes.a.output.id}' }
  - id: undo_b
    type: TASK
    queue: q
    task: undo_b
    retry: { max_attempts: 2, initial_interval: 1s }
edges:
  - { from: a, to: b }
  - { from: b, to: c }
";

#[test]
fn compensation_runs_for_every_completed_node_in_reverse_completion_order() {
    let r = simulate(
        SAGA,
        "tasks: { a: [ { complete: { id: A1 } } ], c: [ { fail: { code: NOPE } } ] }",
    );
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(started_tasks(&r), vec!["a", "b", "c", "undo_b", "undo_a"]);
    let undo_a_input = r.actions().find_map(|a| match a {
        Action::CreateTask { node, input, .. } if node.node == "undo_a" => Some(input.clone()),
        _ => None,
    });
    assert_eq!(undo_a_input, Some(json!({"id": "A1"})));
    assert_eq!(r.history_of("compensation_completed").count(), 2);
    // The final status comes after the compensations.
    let fail_step = r.history.iter().position(|s| {
        s.actions
            .iter()
            .any(|a| matches!(a, Action::FailRun { .. }))
    });
    let last_comp = r.history.iter().rposition(|s| {
        s.actions.iter().any(
            |a| matches!(a, Action::AppendHistory { kind, .. } if kind.as_str() == "compensation_completed"),
        )
    });
    assert_eq!(fail_step, last_comp);
}

#[test]
fn failing_compensation_is_retried_then_recorded_and_never_hides_the_original_error() {
    let r = simulate(
        SAGA,
        "tasks: { a: [ { complete: { id: A1 } } ], c: [ { fail: { code: ORIGINAL, message: first } } ], undo_b: [ { fail: { code: UNDO } }, { fail: { code: UNDO } } ] }",
    );
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(
        r.error,
        Some(ErrorInfo::new("ORIGINAL", "first").at_node("c".into()))
    );
    assert_eq!(
        r.actions()
            .filter(|a| matches!(a, Action::CreateTask { node, .. } if node.node == "undo_b"))
            .count(),
        2
    );
    assert_eq!(r.history_of("compensation_failed").count(), 1);
    assert!(
        started_tasks(&r).contains(&"undo_a".to_string()),
        "later compensations still run"
    );
}

#[test]
fn a_compensated_run_cannot_be_retried() {
    let r = simulate(
        SAGA,
        "tasks: { a: [ { complete: { id: A1 } } ], c: [ { fail: { code: NOPE } } ] }\nretry_at: 1h\n",
    );
    assert_eq!(r.status, RunStatus::Failed);
    let last = r.history.last().expect("history");
    assert!(matches!(last.event, Event::RetryRequested { .. }));
    assert_eq!(
        last.actions,
        vec![Action::AppendHistory {
            kind: composer_engine::history::HistoryEventType::EventIgnored,
            node: None,
            attempt: None,
            detail: json!({"reason": "the run was compensated: its completed work was undone, start a new run"}),
        }]
    );
}

#[test]
fn cancellation_cancels_tasks_timers_and_children_runs_compensations_and_ends_cancelled() {
    let mut d = Driver::new(SAGA, json!(null));
    d.send(Event::RunStarted);
    d.send(completed("a", 1, json!({"id": "A"})));
    let acts = d.send(Event::CancelRequested {
        reason: "changed my mind".into(),
    });
    for a in [
        Action::CancelAllTasks,
        Action::CancelAllTimers,
        Action::CancelAllChildRuns,
    ] {
        assert!(acts.contains(&a), "{a:?}");
    }
    assert_eq!(created(&acts), vec![("undo_a".to_string(), 1)]);
    assert_eq!(d.state.run.status, RunStatus::Compensating);
    // A late report from the cancelled task changes nothing.
    let acts = d.send(completed("b", 1, json!(1)));
    assert_eq!(history_kinds(&acts), vec!["event_ignored:b"]);
    let acts = d.send(completed("undo_a", 1, json!("voided")));
    assert!(acts.contains(&Action::CancelRun {
        reason: "changed my mind".into()
    }));
    assert_eq!(d.state.run.status, RunStatus::Cancelled);
    let error = d
        .state
        .run
        .error
        .as_ref()
        .expect("a cancelled run says why");
    assert_eq!(
        (error.code.as_str(), error.message.as_str()),
        ("CANCELLED", "changed my mind")
    );
    // Cancelling again: ignored.
    let acts = d.send(Event::CancelRequested {
        reason: "again".into(),
    });
    assert_eq!(history_kinds(&acts), vec!["event_ignored"]);
    assert_eq!(
        d.state.run.error.as_ref().map(|e| e.message.as_str()),
        Some("changed my mind"),
        "the first reason stays"
    );
}

#[test]
fn retry_requested_resumes_a_failed_run_from_its_failed_nodes() {
    let yaml = format!(
        "name: r
nodes:
  - id: a
    {TASK}
  - id: b
    {TASK}
    retry: {{ max_attempts: 1 }}
  - id: c
    {TASK}
edges:
  - {{ from: a, to: b }}
  - {{ from: b, to: c }}
output: '${{nodes.c.output}}'
"
    );
    let mut d = Driver::new(&yaml, json!(null));
    d.send(Event::RunStarted);
    d.send(completed("a", 1, json!(1)));
    d.send(failed("b", 1, "DOWN", true));
    assert_eq!(d.state.run.status, RunStatus::Failed);
    assert_eq!(d.state.run.failed, vec![key("b")]);
    let acts = d.send(Event::RetryRequested {
        interrupted: vec![],
    });
    assert_eq!(
        created(&acts),
        vec![("b".to_string(), 2)],
        "only the failed node restarts, as a new attempt"
    );
    assert_eq!(d.state.run.status, RunStatus::Running);
    // The old attempt's late report is stale now.
    let acts = d.send(completed("b", 1, json!("late")));
    assert_eq!(history_kinds(&acts), vec!["event_ignored:b"]);
    d.send(completed("b", 2, json!(2)));
    let acts = d.send(completed("c", 1, json!("done")));
    assert!(acts.contains(&Action::CompleteRun {
        output: json!("done")
    }));
    // A run that did not fail cannot be retried.
    let acts = d.send(Event::RetryRequested {
        interrupted: vec![],
    });
    assert_eq!(history_kinds(&acts), vec!["event_ignored"]);
}

// ------------------------------------------------------------------ events

#[test]
fn stale_event_for_another_attempt_is_ignored_and_recorded() {
    let yaml = format!("name: s\nnodes:\n  - id: a\n    {TASK}\n");
    let mut d = Driver::new(&yaml, json!(null));
    d.send(Event::RunStarted);
    d.send(failed("a", 1, "X", true));
    d.at(1_000).send(Event::TimerFired {
        timer: TimerId::node(TimerKind::Retry, key("a"), Some(2)),
        seed: 0,
    });
    let before = d.state.clone();
    let decision = d.decide(&completed("a", 1, json!("stale")));
    assert!(decision.change.is_empty());
    assert_eq!(
        decision.actions,
        vec![Action::AppendHistory {
            kind: composer_engine::history::HistoryEventType::EventIgnored,
            node: Some(key("a")),
            attempt: Some(1),
            detail: json!({"reason": "stale attempt (current attempt is 2)"}),
        }]
    );
    let decision = d.decide(&completed("a", 3, json!("future")));
    assert!(decision.change.is_empty());
    assert_eq!(d.state, before);
    // A report for a node that does not exist is recorded, not applied.
    let decision = d.decide(&completed("ghost", 1, json!(1)));
    assert!(decision.change.is_empty());
    assert_eq!(
        history_kinds(&decision.actions),
        vec!["event_ignored:ghost"]
    );
}

#[test]
fn duplicate_event_is_applied_once() {
    let yaml = format!(
        "name: d\nnodes:\n  - id: a\n    {TASK}\n  - id: b\n    {TASK}\nedges:\n  - {{ from: a, to: b }}\n"
    );
    let mut d = Driver::new(&yaml, json!(null));
    d.send(Event::RunStarted);
    let first = d.send(completed("a", 1, json!(1)));
    assert_eq!(created(&first), vec![("b".to_string(), 1)]);
    let after_once = d.state.clone();
    let second = d.decide(&completed("a", 1, json!(1)));
    assert!(second.change.is_empty());
    assert!(created(&second.actions).is_empty());
    assert_eq!(history_kinds(&second.actions), vec!["event_ignored:a"]);
    d.send(completed("a", 1, json!(1)));
    assert_eq!(d.state, after_once);
    let dup_start = d.decide(&Event::RunStarted);
    assert!(dup_start.change.is_empty());
}

// ------------------------------------------------------------------ templating

#[test]
fn templating_whole_string_keeps_the_type_and_mixed_text_interpolates() {
    let yaml = "name: t
nodes:
  - id: a
    type: TASK
    queue: q
    task: t
    input:
      number: '${input.n}'
      list: '${input.xs}'
      map: '${ {\"k\": input.n + 1} }'
      text: 'n=${input.n}, xs=${input.xs}, name=${input.name}'
      literal: plain text
      nested: [ '${input.n * 2}', { deep: '${input.name}' } ]
";
    let mut d = Driver::new(yaml, json!({"n": 3, "xs": [1, 2], "name": "ada"}));
    let acts = d.send(Event::RunStarted);
    let input = acts.iter().find_map(|a| match a {
        Action::CreateTask { input, .. } => Some(input.clone()),
        _ => None,
    });
    assert_eq!(
        input,
        Some(json!({
            "number": 3,
            "list": [1, 2],
            "map": {"k": 4},
            "text": "n=3, xs=[1,2], name=ada",
            "literal": "plain text",
            "nested": [6, {"deep": "ada"}],
        }))
    );
}

#[test]
fn a_bad_input_expression_at_run_time_fails_the_node_with_input_error() {
    let yaml = "name: t\nnodes:\n  - id: a\n    type: TASK\n    queue: q\n    task: t\n    input: '${input.missing.deeper}'\n";
    let r = simulate(yaml, "input: {}");
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.error.map(|e| e.code), Some(codes::INPUT_ERROR.into()));
}

#[test]
fn decide_is_a_pure_function_of_its_inputs() {
    let mut d = Driver::new(SAGA, json!({"x": 1}));
    let a = d.decide(&Event::RunStarted);
    let b = d.decide(&Event::RunStarted);
    assert_eq!(a, b);
    d.send(Event::RunStarted);
    let e = failed("a", 1, "X", true);
    assert_eq!(d.decide(&e), d.decide(&e));
}

// ------------------------------------------------------------------ cost

#[test]
fn cost_of_an_event_is_bounded_by_the_nodes_it_touches_not_by_the_run_size() {
    let mut wide = String::from("name: wide\nnodes:\n  - { id: f, type: FORK }\n");
    for i in 0..2_000 {
        wide.push_str(&format!(
            "  - {{ id: b{i}, type: TASK, queue: q, task: t }}\n"
        ));
    }
    wide.push_str("  - { id: j, type: JOIN }\nedges:\n");
    for i in 0..2_000 {
        wide.push_str(&format!(
            "  - {{ from: f, to: b{i} }}\n  - {{ from: b{i}, to: j }}\n"
        ));
    }
    let r = simulate_opts(&wide, "{}", composer_engine::SimOptions::default());
    assert_eq!(r.status, RunStatus::Completed);
    let completions: Vec<usize> = r
        .history
        .iter()
        .filter(|s| matches!(s.event, Event::TaskCompleted { .. }))
        .map(|s| s.loaded)
        .collect();
    assert_eq!(completions.len(), 2_000);
    assert!(
        completions.iter().all(|&n| n <= 3),
        "a branch completion loads its node, the JOIN and nothing else: {:?}",
        completions.iter().max()
    );
    let map = "name: m\nnodes:\n  - { id: m, type: MAP, items: input.xs, concurrency: 50, queue: q, task: t }\n";
    let xs: Vec<u32> = (0..2_000).collect();
    let r = simulate_opts(
        map,
        &format!("input: {{ xs: {xs:?} }}"),
        composer_engine::SimOptions::default(),
    );
    assert_eq!(r.status, RunStatus::Completed);
    let max_loaded = r
        .history
        .iter()
        .filter(|s| matches!(s.event, Event::TaskCompleted { .. }))
        .map(|s| s.loaded)
        .max();
    assert!(
        max_loaded.is_some_and(|n| n <= 4),
        "an element completion loads the element, the next one, the row of inputs it \
         waits in and the MAP: {max_loaded:?}"
    );
}

#[test]
fn retry_requested_also_restarts_the_branches_interrupted_by_the_failure() {
    let mut d = Driver::new(JOIN_YAML, json!({"a": true, "b": true, "c": false}));
    d.send(Event::RunStarted);
    // a fails for good while b is still running: the run fails, b is cancelled.
    for attempt in 1..=3 {
        d.send(failed("a", attempt, "DOWN", true));
        if attempt < 3 {
            d.send(Event::TimerFired {
                timer: TimerId::node(TimerKind::Retry, key("a"), Some(attempt + 1)),
                seed: 0,
            });
        }
    }
    assert_eq!(d.state.run.status, RunStatus::Failed);
    assert_eq!(d.status("b"), Some(NodeStatus::Running));
    let acts = d.send(Event::RetryRequested {
        interrupted: vec![key("b")],
    });
    assert_eq!(
        created(&acts),
        vec![("a".to_string(), 4), ("b".to_string(), 2)]
    );
    assert_eq!(d.state.run.active, 2);
    d.send(completed("a", 4, json!("A")));
    let acts = d.send(completed("b", 2, json!("B")));
    assert_eq!(
        created(&acts),
        vec![("after".to_string(), 1)],
        "the JOIN fires once both are back"
    );
    let acts = d.send(completed("after", 1, json!(null)));
    assert!(acts.contains(&Action::CompleteRun {
        output: json!({"a": "A", "b": "B"})
    }));
    // The simulator's retry_at computes the interrupted keys the same way.
    let r = simulate(
        JOIN_YAML,
        "input: { a: true, b: true, c: false }\ntasks: { a: [ { fail: { code: X, retryable: false } } ], b: [ { complete: 1, after: 1h }, { complete: 2 } ] }\nretry_at: 1m\n",
    );
    assert_eq!(r.status, RunStatus::Completed);
    assert_eq!(r.output, Some(json!({"a": null, "b": 2})));
}

#[test]
fn cancellation_during_a_retry_back_off_removes_the_timer_and_a_late_firing_changes_nothing() {
    let yaml = format!(
        "name: c\nnodes:\n  - id: a\n    {TASK}\n    retry: {{ max_attempts: 3, initial_interval: 1h, max_interval: 2h }}\n"
    );
    let mut d = Driver::new(&yaml, json!(null));
    d.send(Event::RunStarted);
    let acts = d.send(failed("a", 1, "BUSY", true));
    let retry = TimerId::node(TimerKind::Retry, key("a"), Some(2));
    assert!(acts.contains(&Action::ScheduleTimer {
        timer: retry.clone(),
        fire_at: Timestamp(T0.0 + 3_600_000)
    }));
    assert_eq!(d.status("a"), Some(NodeStatus::RetryScheduled));
    let acts = d.at(60_000).send(Event::CancelRequested {
        reason: "stop".into(),
    });
    assert!(acts.contains(&Action::CancelAllTimers));
    assert!(acts.contains(&Action::CancelRun {
        reason: "stop".into()
    }));
    let late = d.at(3_600_000).decide(&Event::TimerFired {
        timer: retry,
        seed: 0,
    });
    assert!(late.change.is_empty());
    assert!(created(&late.actions).is_empty());
    assert_eq!(d.state.run.status, RunStatus::Cancelled);
}

// -------------------------------------------------------------- concurrency

const KEYED: &str = "name: keyed
concurrency: { key: 'input.tenant', max: 2 }
nodes:
  - { id: a, type: TASK, queue: q, task: t }
";

#[test]
fn concurrency_key_is_computed_from_the_input_alone_and_on_limit_defaults_to_queue() {
    let wf = compile(KEYED);
    let c = wf.concurrency().expect("declared");
    assert_eq!((c.max, c.on_limit), (2, composer_engine::OnLimit::Queue));
    assert_eq!(c.key_of(&json!({"tenant": "acme"})), Ok("acme".to_owned()));
    let interpolated = compile(
        "name: k\nconcurrency: { key: \"input.region + '-' + input.tenant\", max: 1, on_limit: cancel_oldest }\nnodes:\n  - { id: a, type: TASK, queue: q, task: t }\n",
    );
    let c = interpolated.concurrency().expect("declared");
    assert_eq!(c.on_limit, composer_engine::OnLimit::CancelOldest);
    assert_eq!(
        c.key_of(&json!({"region": "eu", "tenant": "acme"})),
        Ok("eu-acme".to_owned())
    );
}

#[test]
fn concurrency_key_that_is_not_a_string_at_start_is_an_error_not_a_key() {
    let wf = compile(KEYED);
    let c = wf.concurrency().expect("declared");
    let not_string = c.key_of(&json!({"tenant": 7})).unwrap_err();
    assert_eq!(
        not_string.to_string(),
        "the concurrency key `input.tenant` is a int, not a string"
    );
    assert!(c.key_of(&json!({})).is_err(), "a missing field has no key");
    let long = "x".repeat(composer_engine::MAX_CONCURRENCY_KEY_BYTES + 1);
    assert_eq!(
        c.key_of(&json!({ "tenant": long })),
        Err(composer_engine::ConcurrencyKeyError::TooLong)
    );
}

#[test]
fn simulator_reports_the_concurrency_key_and_the_priority() {
    let r = simulate(
        KEYED,
        "input: { tenant: acme }\npriority: 5\ntasks: { a: [ { complete: 1 } ] }",
    );
    assert_eq!(r.status, RunStatus::Completed);
    assert_eq!(r.concurrency_key.as_deref(), Some("acme"));
    assert_eq!(r.priority, 5);
    let plain = simulate(
        "name: p\nnodes:\n  - { id: a, type: TASK, queue: q, task: t }\n",
        "tasks: { a: [ { complete: 1 } ] }",
    );
    assert_eq!((plain.concurrency_key, plain.priority), (None, 3));
}

#[test]
fn a_task_carries_its_rate_limit_key_evaluated_for_each_attempt() {
    let yaml = r"
name: keyed
nodes:
  - id: a
    type: TASK
    queue: mail
    task: send
    rate_limit_key: input.customer
";
    let mut d = Driver::new(yaml, json!({"customer": "acme"}));
    let acts = d.send(Event::RunStarted);
    assert!(acts.iter().any(|a| matches!(
        a,
        Action::CreateTask { rate_limit_key: Some(k), .. } if k == "acme"
    )));
}

const TASK_KEYED: &str = r#"
name: task_keyed
nodes:
  - id: a
    type: TASK
    queue: q
    task: t
    retry: { max_attempts: 2, initial_interval: 1s }
    concurrency: { key: "input.tenant + '/' + string(input.n)", max: 2 }
"#;

#[test]
fn a_task_carries_its_concurrency_key_and_max_for_each_attempt() {
    let mut d = Driver::new(TASK_KEYED, json!({"tenant": "acme", "n": 1}));
    let acts = d.send(Event::RunStarted);
    let slot = composer_engine::SlotKey {
        key: "acme/1".to_owned(),
        max: 2,
    };
    assert!(
        acts.iter().any(|a| matches!(
            a,
            Action::CreateTask { attempt: 1, concurrency: Some(s), .. } if *s == slot
        )),
        "{acts:?}"
    );
    // the retry asks for a slot again, with the same key
    let r = simulate(
        TASK_KEYED,
        "input: { tenant: acme, n: 1 }\ntasks: { a: [ { fail: { code: X } }, { complete: 1 } ] }",
    );
    assert_eq!(r.status, RunStatus::Completed);
    let slots: Vec<(u32, Option<composer_engine::SlotKey>)> = r
        .actions()
        .filter_map(|a| match a {
            Action::CreateTask {
                attempt,
                concurrency,
                ..
            } => Some((*attempt, concurrency.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(slots, vec![(1, Some(slot.clone())), (2, Some(slot))]);
}

#[test]
fn a_task_whose_concurrency_key_is_not_a_string_fails_its_node_as_bad_input() {
    let yaml = TASK_KEYED.replace("input.tenant + '/' + string(input.n)", "input.tenant");
    let mut d = Driver::new(&yaml, json!({"tenant": 7}));
    let acts = d.send(Event::RunStarted);
    assert!(created(&acts).is_empty(), "{acts:?}");
    assert_eq!(d.state.run.status, RunStatus::Failed);
    let error = d.state.run.error.as_ref().expect("error");
    assert!(error.message.contains("concurrency.key"), "{error:?}");
}

#[test]
fn a_task_without_concurrency_asks_for_no_slot() {
    let mut d = Driver::new(
        "name: p\nnodes:\n  - { id: a, type: TASK, queue: q, task: t }\n",
        json!({}),
    );
    let acts = d.send(Event::RunStarted);
    assert!(acts.iter().any(|a| matches!(
        a,
        Action::CreateTask {
            concurrency: None,
            ..
        }
    )));
}
