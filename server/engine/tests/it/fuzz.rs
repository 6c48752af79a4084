//! Fuzz-style properties: the definition parser, the CEL compiler and the
//! evaluator never panic, whatever they are given; bad input is an error.

use composer_engine::cel::{self, Env, NodeField, Scope, Val};
use composer_engine::{CompiledWorkflow, parse_definition};
use proptest::prelude::*;

const ORDER: &str = include_str!("../../../../examples/workflows/order.yaml");

struct AnyEnv;
impl Env for AnyEnv {
    fn input(&self) -> Val {
        Val::from_json(&serde_json::json!({"a": 1, "b": [1, 2, {"c": "x"}], "s": "text"}))
    }
    fn run(&self) -> Val {
        Val::from_json(&serde_json::json!({"id": "r", "workflow": "w", "version": 1}))
    }
    fn item(&self) -> Val {
        Val::Int(3)
    }
    fn index(&self) -> Val {
        Val::Int(0)
    }
    fn node(&self, _id: &str, _field: NodeField) -> Val {
        Val::Null
    }
}

fn any_node(_: &str) -> bool {
    true
}

fn compile_and_eval(src: &str) {
    let scope = Scope {
        node_ids: &any_node,
        map_element: true,
        input_schema: None,
    };
    if let Ok(program) = cel::compile(src, &scope) {
        let _ = program.eval(&AnyEnv);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn parser_never_panics_on_arbitrary_text(text in any::<String>()) {
        let _ = parse_definition(&text);
    }

    #[test]
    fn parser_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_definition(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn parser_never_panics_on_mutated_definitions(at in 0usize..ORDER.len(), len in 0usize..40, insert in "[ -~\n]{0,20}") {
        let start = (0..=at).rev().find(|i| ORDER.is_char_boundary(*i)).unwrap_or(0);
        let end = (start + len..=ORDER.len()).find(|i| ORDER.is_char_boundary(*i)).unwrap_or(ORDER.len());
        let text = format!("{}{}{}", &ORDER[..start], insert, &ORDER[end..]);
        if let Ok(def) = parse_definition(&text) {
            prop_assert!(CompiledWorkflow::compile(def).is_ok(), "parse_definition accepted what compile rejects");
        }
    }

    #[test]
    fn cel_never_panics_on_arbitrary_text(src in any::<String>()) {
        compile_and_eval(&src);
    }

    #[test]
    fn cel_never_panics_on_expression_like_text(src in "[a-z0-9 .,()\\[\\]{}+*/%<>=!&|?:'\"_-]{0,80}") {
        compile_and_eval(&src);
    }

    #[test]
    fn cel_never_panics_on_operator_soup(parts in proptest::collection::vec(prop_oneof![
        Just("input.a"), Just("input.b"), Just("item"), Just("index"), Just("1"), Just("2.5"), Just("'s'"), Just("true"),
        Just("null"), Just(" + "), Just(" - "), Just(" * "), Just(" / "), Just(" % "), Just(" == "), Just(" < "), Just(" && "),
        Just(" || "), Just(" in "), Just("!"), Just("-"), Just("("), Just(")"), Just("["), Just("]"), Just("{"), Just("}"),
        Just(":"), Just(","), Just("."), Just("size("), Just(".map(x, "), Just(".all(x, "), Just("x"), Just(" ? "),
        Just("nodes.n.output"), Just("timestamp('2020-01-01T00:00:00Z')"), Just("duration('1h')"), Just("9223372036854775807"),
    ], 0..40)) {
        compile_and_eval(&parts.concat());
    }
}

#[test]
fn pathological_inputs_are_errors_not_crashes() {
    // Deep YAML nesting, deep CEL nesting, a huge integer, a billion laughs.
    let deep_yaml = format!(
        "name: x\nnodes: {}{}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    assert!(parse_definition(&deep_yaml).is_err());
    let laughs = "name: x\na: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nnodes: []\n";
    assert!(parse_definition(laughs).is_err());
    compile_and_eval(&"(".repeat(100_000));
    compile_and_eval(&"!".repeat(100_000));
    compile_and_eval(&"-".repeat(100_000));
    compile_and_eval(&"a.".repeat(100_000));
    compile_and_eval("99999999999999999999999");
    compile_and_eval("-9223372036854775808 / -1");
    compile_and_eval("[1,2,3].map(x, [1,2,3].map(y, [1,2,3]))");
}

mod decide_fuzz {
    use std::collections::BTreeMap;

    use composer_engine::{
        ChildStatus, CompiledWorkflow, DecideError, ErrorInfo, Event, NodeKey, NodeState, RunState,
        RunStatus, TimerId, TimerKind, Timestamp, decide,
    };
    use proptest::prelude::*;
    use serde_json::json;

    const WORKFLOWS: [&str; 5] = [
        include_str!("../../../../examples/workflows/order.yaml"),
        include_str!("../../../../examples/workflows/fork-join.yaml"),
        include_str!("../../../../examples/workflows/map.yaml"),
        include_str!("../../../../examples/workflows/approval.yaml"),
        include_str!("../../../../examples/workflows/linear.yaml"),
    ];

    fn key_for(wf: &CompiledWorkflow, pick: u8, index: u8) -> NodeKey {
        let ids = wf.topological_order();
        let id = match pick as usize % (ids.len() + 2) {
            i if i < ids.len() => ids[i].to_owned(),
            i if i == ids.len() => "undo_charge".to_owned(),
            _ => "ghost".to_owned(),
        };
        if index.is_multiple_of(3) {
            NodeKey::element(id, u32::from(index % 5))
        } else {
            NodeKey::node(id)
        }
    }

    fn event(wf: &CompiledWorkflow, kind: u8, pick: u8, index: u8, attempt: u8) -> Event {
        let node = key_for(wf, pick, index);
        let attempt = u32::from(attempt % 4);
        match kind % 11 {
            0 => Event::RunStarted,
            1 | 2 => Event::TaskCompleted {
                node,
                attempt,
                output: json!({"ok": true, "body": {"id": "x"}}),
            },
            3 => Event::TaskFailed {
                node,
                attempt,
                code: "E".into(),
                message: "m".into(),
                retryable: index.is_multiple_of(2),
                details: None,
                seed: 7,
            },
            4 => Event::LeaseExpired {
                node,
                attempt,
                lost_deliveries: index.is_multiple_of(3).then_some(2),
                seed: 3,
            },
            5 => {
                let kinds = [
                    TimerKind::Wait,
                    TimerKind::Retry,
                    TimerKind::EventTimeout,
                    TimerKind::AttemptTimeout,
                    TimerKind::RunTimeout,
                ];
                let k = kinds[index as usize % kinds.len()];
                let timer = if k == TimerKind::RunTimeout {
                    TimerId::run_timeout()
                } else {
                    TimerId::node(k, node, Some(attempt))
                };
                Event::TimerFired {
                    timer,
                    seed: u64::from(pick),
                }
            }
            6 => Event::EventReceived {
                name: ["approval", "expense_decision", "nope"][index as usize % 3].into(),
                payload: json!({"ok": true, "approved": true, "by": "x"}),
                node: index.is_multiple_of(2).then_some(node),
            },
            7 => Event::CancelRequested {
                reason: "fuzz".into(),
            },
            8 => Event::RetryRequested {
                interrupted: vec![node],
            },
            9 => Event::ChildRunFinished {
                node,
                attempt,
                status: [
                    ChildStatus::Completed,
                    ChildStatus::Failed,
                    ChildStatus::Cancelled,
                ][index as usize % 3],
                output: json!(1),
                error: Some(ErrorInfo::new("C", "child")),
                seed: 1,
            },
            _ => Event::TaskCompleted {
                node,
                attempt: 1,
                output: json!(null),
            },
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        /// Any sequence of events, sensible or not, is decided without a
        /// panic or an inconsistency, and a finished run has nothing active.
        #[test]
        fn decide_never_panics_on_arbitrary_event_sequences(
            which in 0usize..5,
            events in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()), 1..60),
        ) {
            let wf = CompiledWorkflow::from_text(WORKFLOWS[which]).expect("example compiles");
            let input = json!({"order_id": 1, "amount": 2, "sku": "s", "doc_id": "d", "weight": 3, "images": ["a", "b"], "expense_id": 1});
            let mut state = RunState::new("r", wf.name().to_owned(), 1, input);
            let mut store: BTreeMap<NodeKey, NodeState> = BTreeMap::new();
            let run_started = std::iter::once((0u8, 0u8, 1u8, 0u8));
            for (step, (kind, pick, index, attempt)) in run_started.chain(events).enumerate() {
                let ev = event(&wf, kind, pick, index, attempt);
                let mut loaded = RunState { run: state.run.clone(), nodes: BTreeMap::new(), blobs: Default::default() };
                let decision = loop {
                    match decide(&wf, &loaded, &ev, Timestamp(step as i64 * 1000)) {
                        Ok(d) => break d,
                        Err(DecideError::NeedNodes(keys)) => {
                            prop_assert!(keys.iter().any(|k| !loaded.nodes.contains_key(k)), "NeedNodes for loaded keys");
                            for k in keys {
                                let s = store.get(&k).cloned();
                                loaded.load(k, s);
                            }
                        }
                        Err(e) => return Err(TestCaseError::fail(format!("{e} on {ev:?}"))),
                    }
                };
                state.apply(&decision.change);
                for (k, s) in decision.change.nodes {
                    prop_assert!(wf.contains(k.node_id()), "wrote unknown node {k}");
                    store.insert(k, s);
                }
                if state.run.status.is_terminal() && state.run.status != RunStatus::Failed {
                    prop_assert_eq!(state.run.active, 0);
                }
            }
        }
    }
}
