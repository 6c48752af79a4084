//! Fuzz-style properties: the definition parser, the CEL compiler and the
//! evaluator never panic, whatever they are given; bad input is an error.

use composer_engine::cel::{self, Env, NodeField, Scope, Val};
use composer_engine::{CompiledWorkflow, parse_definition};
use proptest::prelude::*;

const ORDER: &str = include_str!("../../../examples/workflows/order.yaml");

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
