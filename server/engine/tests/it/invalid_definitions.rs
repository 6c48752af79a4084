//! The table of broken definitions: each must be rejected with exactly the
//! listed problems (path and message), all reported at once.

use composer_engine::{ValidationError, parse_definition};

/// A valid two-node base the rows break.
fn base(nodes: &str, edges: &str) -> String {
    format!("name: broken\nnodes:\n{nodes}\nedges:\n{edges}\n")
}

const A: &str = "  - { id: a, type: TASK, queue: q, task: t }";
const B: &str = "  - { id: b, type: TASK, queue: q, task: t }";
const AB: &str = "  - { from: a, to: b }";

/// What is broken, the definition, the problems expected (path, message).
type Row = (&'static str, String, Vec<(&'static str, String)>);

fn errors(text: &str) -> Vec<(String, String)> {
    match parse_definition(text) {
        Ok(_) => Vec::new(),
        Err(e) => {
            e.0.into_iter()
                .map(|ValidationError { path, message }| (path, message))
                .collect()
        }
    }
}

#[test]
fn broken_definitions_are_rejected_with_path_and_message() {
    let long_expr = format!("input.x == '{}'", "y".repeat(5000));
    let deep_expr = format!("{}true{}", "(".repeat(40), ")".repeat(40));
    let mut many_nodes = String::from("name: big\nnodes:\n");
    for i in 0..10_001 {
        many_nodes.push_str(&format!("  - {{ id: n{i}, type: FORK }}\n"));
    }
    let huge = format!(
        "name: huge\ndescription: '{}'\nnodes: []\n",
        "x".repeat(4 * 1024 * 1024)
    );
    let rows: Vec<Row> = vec![
        ("unknown top-level field", format!("{}colour: red\n", base(&format!("{A}\n{B}"), AB)), vec![("colour", "unknown field `colour`".into())]),
        (
            "unknown node field",
            base(&format!("{A}\n  - {{ id: b, type: TASK, queue: q, task: t, retries: 3 }}"), AB),
            vec![("nodes[1].retries", "unknown field `retries`".into())],
        ),
        (
            "unknown node type",
            base(&format!("{A}\n  - {{ id: b, type: LAMBDA }}"), AB),
            vec![("nodes[1].type", "unknown variant `LAMBDA`, expected one of `TASK`, `HTTP`, `CODE`, `SWITCH`, `FORK`, `JOIN`, `WAIT`, `WAIT_FOR_EVENT`, `SUB_WORKFLOW`, `MAP`".into())],
        ),
        ("duplicate ids", base(&format!("{A}\n{B}\n  - {{ id: a, type: FORK }}"), AB), vec![("nodes[2].id", "duplicate id 'a' (first at nodes[0])".into())]),
        ("edge to an unknown node", base(&format!("{A}\n{B}"), &format!("{AB}\n  - {{ from: b, to: zz }}")), vec![("edges[1].to", "unknown node 'zz'".into())]),
        ("edge from an unknown node", base(&format!("{A}\n{B}"), &format!("{AB}\n  - {{ from: yy, to: b }}")), vec![("edges[1].from", "unknown node 'yy'".into())]),
        (
            "cycle",
            base(&format!("{A}\n{B}\n  - {{ id: c, type: TASK, queue: q, task: t }}"), &format!("{AB}\n  - {{ from: b, to: c }}\n  - {{ from: c, to: b }}")),
            vec![("nodes[1]", "cycle: b -> c -> b".into())],
        ),
        ("self loop", base(&format!("{A}\n{B}"), &format!("{AB}\n  - {{ from: b, to: b }}")), vec![("nodes[1]", "cycle: b -> b".into())]),
        (
            "unreachable node",
            base(&format!("{A}\n{B}\n  - {{ id: lost, type: TASK, queue: q, task: t }}"), AB),
            vec![("nodes[2]", "unreachable: no path from the start node 'a'".into())],
        ),
        ("JOIN with one incoming edge", base(&format!("{A}\n  - {{ id: j, type: JOIN }}"), "  - { from: a, to: j }"), vec![("nodes[1]", "a JOIN needs at least two incoming edges (has 1)".into())]),
        ("SWITCH without outgoing edges", base(&format!("{A}\n  - {{ id: s, type: SWITCH }}"), "  - { from: a, to: s }"), vec![("nodes[1]", "a SWITCH needs at least one outgoing edge".into())]),
        (
            "bad duration",
            base(&format!("  - {{ id: a, type: TASK, queue: q, task: t, timeout: 30 seconds }}\n{B}"), AB),
            vec![("nodes[0].timeout", "invalid duration '30 seconds': expected a number and a unit (ms, s, m, h, d), e.g. 30s".into())],
        ),
        (
            "bad retry interval",
            base(&format!("  - {{ id: a, type: TASK, queue: q, task: t, retry: {{ initial_interval: 5x }} }}\n{B}"), AB),
            vec![("nodes[0].retry.initial_interval", "invalid duration '5x': expected a number and a unit (ms, s, m, h, d), e.g. 30s".into())],
        ),
        (
            "max_attempts 0",
            base(&format!("  - {{ id: a, type: TASK, queue: q, task: t, retry: {{ max_attempts: 0 }} }}\n{B}"), AB),
            vec![("nodes[0].retry.max_attempts", "must be at least 1".into())],
        ),
        (
            "CEL syntax error",
            base(&format!("{A}\n{B}"), "  - { from: a, to: b, when: 'input.x ==' }"),
            vec![("edges[0].when", "syntax error: expected an expression but the expression ended".into())],
        ),
        (
            "CEL unknown variable",
            base(&format!("{A}\n{B}"), "  - { from: a, to: b, when: 'foo.bar' }"),
            vec![("edges[0].when", "undeclared reference to 'foo' (in scope: input, nodes, run)".into())],
        ),
        (
            "CEL unknown node",
            base(&format!("{A}\n  - {{ id: b, type: TASK, queue: q, task: t, input: {{ x: '${{nodes.ghost.output}}' }} }}"), AB),
            vec![("nodes[1].input.x", "unknown node 'ghost' in nodes.ghost".into())],
        ),
        (
            "CEL type error",
            base(&format!("{A}\n{B}"), "  - { from: a, to: b, when: \"1 + 'a' == 2\" }"),
            vec![("edges[0].when", "no matching overload for '+' applied to (int, string)".into())],
        ),
        ("when is not a bool", base(&format!("{A}\n{B}"), "  - { from: a, to: b, when: '1 + 2' }"), vec![("edges[0].when", "must be a bool expression, not int".into())]),
        (
            "item outside a MAP",
            base(&format!("  - {{ id: a, type: TASK, queue: q, task: t, input: '${{item}}' }}\n{B}"), AB),
            vec![("nodes[0].input", "'item' is only in scope in the input of a MAP node".into())],
        ),
        (
            "queue reserved for the server",
            base(&format!("  - {{ id: a, type: TASK, queue: _http, task: t }}\n{B}"), AB),
            vec![("nodes[0].queue", "\"_http\" names starting with '_' are reserved for the server (1 to 64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit)".into())],
        ),
        (
            "task name with a character outside the rule",
            base(&format!("  - {{ id: a, type: TASK, queue: q, task: 'a:b' }}\n{B}"), AB),
            vec![("nodes[0].task", "\"a:b\" character ':' at position 1 is not allowed (1 to 64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit)".into())],
        ),
        (
            "event name too long",
            base(&format!("{A}\n  - {{ id: b, type: WAIT_FOR_EVENT, event: {} }}", "e".repeat(65)), AB),
            vec![("nodes[1].event", format!("\"{}\"... is 65 bytes long; at most 64 are allowed", "e".repeat(40)))],
        ),
        (
            "workflow name with a space",
            format!("name: 'two words'\nnodes:\n{A}\n"),
            vec![("name", "\"two words\" character ' ' at position 3 is not allowed (1 to 64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit)".into())],
        ),
        (
            "a WAIT past the timer horizon (it once overflowed and fired at once)",
            base(&format!("{A}\n  - {{ id: w, type: WAIT, duration: 26687997791d }}"), "  - { from: a, to: w }"),
            vec![("nodes[1].duration", "duration '26687997791d' is longer than the maximum of 3660d (about ten years)".into())],
        ),
        (
            "a timeout past the timer horizon",
            base(&format!("  - {{ id: a, type: TASK, queue: q, task: t, timeout: 99999999d }}\n{B}"), AB),
            vec![("nodes[0].timeout", "duration '99999999d' is longer than the maximum of 3660d (about ten years)".into())],
        ),
        (
            "an expression over input checked against the input_schema's types",
            "name: typed\ninput_schema: { type: object, properties: { x: { type: number }, who: { type: object, properties: { name: { type: string } } } } }\nnodes:\n  - { id: a, type: TASK, queue: q, task: t, input: { s: '${input.x + \"a\"}', n: '${input.who.name * 2}', ok: '${input.x + 1}' } }\n".to_owned(),
            vec![
                ("nodes[0].input.n", "no matching overload for '*' applied to (string, int)".into()),
                ("nodes[0].input.s", "no matching overload for '+' applied to (double, string)".into()),
            ],
        ),
        (
            "a field a closed input_schema does not list",
            "name: closed\ninput_schema: { type: object, additionalProperties: false, properties: { x: { type: integer } } }\nnodes:\n  - { id: a, type: TASK, queue: q, task: t, input: '${input.y}' }\n".to_owned(),
            vec![("nodes[0].input", "input.y is not in the input_schema (its object allows no other properties)".into())],
        ),
        (
            "a workflow that starts itself",
            "name: again\nnodes:\n  - { id: m, type: MAP, items: 'input.xs', workflow: again }\n".to_owned(),
            vec![("nodes[0].workflow", "a workflow may not start itself (recursion without a bound)".into())],
        ),
        (
            "compensate naming an unknown node",
            base(&format!("  - {{ id: a, type: TASK, queue: q, task: t, compensate: nope }}\n{B}"), AB),
            vec![("nodes[0].compensate", "unknown node 'nope'".into())],
        ),
        (
            "compensation node with edges",
            base(&format!("  - {{ id: a, type: TASK, queue: q, task: t, compensate: b }}\n{B}"), AB),
            vec![("edges[0]", "compensation node 'b' cannot have edges".into())],
        ),
        (
            "MAP without items",
            base(&format!("{A}\n  - {{ id: m, type: MAP, queue: q, task: t }}"), "  - { from: a, to: m }"),
            vec![("nodes[1].items", "is required on a MAP node".into())],
        ),
        (
            "concurrency key of the wrong type",
            format!("name: broken\nconcurrency: {{ key: 'input.n + 1', max: 1 }}\ninput_schema: {{ type: object, properties: {{ n: {{ type: integer }} }} }}\nnodes:\n{A}\n"),
            vec![("concurrency.key", "must be a string expression, not int".into())],
        ),
        (
            "concurrency key reading a node",
            format!("name: broken\nconcurrency: {{ key: 'nodes.a.output.k', max: 1 }}\nnodes:\n{A}\n"),
            vec![("concurrency.key", "unknown node 'a' in nodes.a".into())],
        ),
        (
            "concurrency key reading the run",
            format!("name: broken\nconcurrency: {{ key: 'run.id', max: 1 }}\nnodes:\n{A}\n"),
            vec![("concurrency.key", "may read only `input`: the key is computed before the run starts".into())],
        ),
        (
            "concurrency max 0 and an unknown on_limit",
            format!("name: broken\nconcurrency: {{ key: 'input.k', max: 0 }}\nnodes:\n{A}\n"),
            vec![("concurrency.max", "must be between 1 and 10000".into())],
        ),
        (
            "concurrency max too large",
            format!("name: broken\nconcurrency: {{ key: 'input.k', max: 10001 }}\nnodes:\n{A}\n"),
            vec![("concurrency.max", "must be between 1 and 10000".into())],
        ),
        (
            "concurrency on_limit unknown",
            format!("name: broken\nconcurrency: {{ key: 'input.k', max: 1, on_limit: drop }}\nnodes:\n{A}\n"),
            vec![("concurrency.on_limit", "unknown variant `drop`, expected one of `queue`, `cancel_new`, `cancel_oldest`".into())],
        ),
        (
            "concurrency without a key",
            format!("name: broken\nconcurrency: {{ max: 1 }}\nnodes:\n{A}\n"),
            vec![("concurrency", "missing field `key`".into())],
        ),
        (
            "TASK concurrency key of the wrong type",
            "name: broken\ninput_schema: { type: object, properties: { n: { type: integer } } }\nnodes:\n  - { id: a, type: TASK, queue: q, task: t, concurrency: { key: 'input.n + 1', max: 2 } }\n".to_owned(),
            vec![("nodes[0].concurrency.key", "must be a string expression, not int".into())],
        ),
        (
            "TASK concurrency max out of range",
            "name: broken\nnodes:\n  - { id: a, type: TASK, queue: q, task: t, concurrency: { key: 'input.k', max: 0 } }\n".to_owned(),
            vec![("nodes[0].concurrency.max", "must be between 1 and 10000".into())],
        ),
        (
            "TASK concurrency as a number",
            "name: broken\nnodes:\n  - { id: a, type: TASK, queue: q, task: t, concurrency: 3 }\n".to_owned(),
            vec![("nodes[0].concurrency", "on a TASK node, concurrency is {key, max}".into())],
        ),
        (
            "TASK concurrency key reading an unknown node",
            "name: broken\nnodes:\n  - { id: a, type: TASK, queue: q, task: t, concurrency: { key: 'nodes.zz.output.k', max: 1 } }\n".to_owned(),
            vec![("nodes[0].concurrency.key", "unknown node 'zz' in nodes.zz".into())],
        ),
        (
            "MAP with a keyed concurrency",
            base(&format!("{A}\n  - {{ id: m, type: MAP, items: '[1]', queue: q, task: t, concurrency: {{ key: 'input.k', max: 1 }} }}"), "  - { from: a, to: m }"),
            vec![("nodes[1].concurrency", "on a MAP node, concurrency is a number (elements in flight); {key, max} is for TASK nodes".into())],
        ),
        (
            "keyed concurrency on a WAIT node",
            "name: broken\nnodes:\n  - { id: w, type: WAIT, duration: 1s, concurrency: { key: 'input.k', max: 1 } }\n".to_owned(),
            vec![("nodes[0].concurrency", "not allowed on a WAIT node".into())],
        ),
        (
            "MAP concurrency 0",
            base(&format!("{A}\n  - {{ id: m, type: MAP, items: '[1]', queue: q, task: t, concurrency: 0 }}"), "  - { from: a, to: m }"),
            vec![("nodes[1].concurrency", "must be at least 1".into())],
        ),
        (
            "MAP with both task and workflow",
            base(&format!("{A}\n  - {{ id: m, type: MAP, items: '[1]', queue: q, task: t, workflow: w }}"), "  - { from: a, to: m }"),
            vec![("nodes[1]", "a MAP node needs either queue and task, or workflow".into())],
        ),
        ("TASK without queue", base(&format!("  - {{ id: a, type: TASK, task: t }}\n{B}"), AB), vec![("nodes[0].queue", "is required on a TASK node".into())]),
        ("field of another type", base(&format!("{A}\n  - {{ id: b, type: FORK, queue: q }}"), AB), vec![("nodes[1].queue", "not allowed on a FORK node".into())]),
        (
            "CODE in an unknown language",
            base(&format!("{A}\n  - {{ id: b, type: CODE, language: ruby, code: 'x' }}"), AB),
            vec![("nodes[1].language", "must be python or javascript, not 'ruby'".into())],
        ),
        (
            "WAIT with duration and until",
            base(&format!("{A}\n  - {{ id: b, type: WAIT, duration: 1h, until: 'timestamp(\"2030-01-01T00:00:00Z\")' }}"), AB),
            vec![("nodes[1]", "a WAIT node needs exactly one of duration or until".into())],
        ),
        (
            "HTTP with an unknown method",
            base(&format!("{A}\n  - {{ id: b, type: HTTP, http: {{ method: FETCH, url: 'https://x' }} }}"), AB),
            vec![("nodes[1].http.method", "unknown method 'FETCH' (one of GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS)".into())],
        ),
        ("edge with an unknown `on`", base(&format!("{A}\n{B}"), "  - { from: a, to: b, on: failure }"), vec![("edges[0].on", "unknown variant `failure`, expected `error`".into())]),
        (
            "node id that is not an identifier",
            base(&format!("{A}\n  - {{ id: my-node, type: FORK }}"), "  - { from: a, to: my-node }"),
            vec![("nodes[1].id", "\"my-node\" character '-' at position 2 is not allowed (1 to 64 characters from A-Z a-z 0-9 _, starting with a letter)".into())],
        ),
        (
            "error edge from a node that never fails",
            base(&format!("  - {{ id: a, type: FORK }}\n{B}"), "  - { from: a, to: b, on: error }"),
            vec![("edges[0].on", "a FORK node never fails, so it has no error edges".into())],
        ),
        (
            "status compared with a value it never has",
            base(&format!("{A}\n{B}"), "  - { from: a, to: b, when: \"nodes.a.status == 'DONE'\" }"),
            vec![("edges[0].when", "nodes.a.status is never 'DONE' (it is one of PENDING, RUNNING, WAITING, RETRY_SCHEDULED, COMPLETED, FAILED, SKIPPED)".into())],
        ),
        ("missing name", format!("nodes:\n{A}\n"), vec![("name", "is required".into())]),
        ("no nodes", "name: empty\nnodes: []\n".into(), vec![("nodes", "a workflow needs at least one node".into())]),
        (
            "output reading an unknown variable",
            format!("{}output: {{ x: '${{nope}}' }}\n", base(&format!("{A}\n{B}"), AB)),
            vec![("output.x", "undeclared reference to 'nope' (in scope: input, nodes, run)".into())],
        ),
        ("bad run timeout", format!("{}timeout: forever\n", base(&format!("{A}\n{B}"), AB)), vec![("timeout", "invalid duration 'forever': expected a number and a unit (ms, s, m, h, d), e.g. 30s".into())]),
        (
            "expression too long",
            base(&format!("{A}\n{B}"), &format!("  - {{ from: a, to: b, when: \"{long_expr}\" }}")),
            vec![("edges[0].when", format!("expression is longer than 4096 characters ({})", long_expr.len()))],
        ),
        (
            "expression nested too deep",
            base(&format!("{A}\n{B}"), &format!("  - {{ from: a, to: b, when: '{deep_expr}' }}")),
            vec![("edges[0].when", "syntax error: expression nests deeper than 32 levels".into())],
        ),
        ("too many nodes", many_nodes, vec![("nodes", "too many nodes: 10001 (at most 10000)".into())]),
        ("definition too large", huge.clone(), vec![("", format!("definition is larger than 4194304 bytes ({})", huge.len()))]),
        ("not a mapping", "- just\n- a list\n".into(), vec![("", "a definition must be a mapping with name, nodes and edges".into())]),
    ];
    assert!(rows.len() >= 25);
    let mut failures = Vec::new();
    for (what, text, expected) in &rows {
        let got = errors(text);
        let want: Vec<(String, String)> = expected
            .iter()
            .map(|(p, m)| (p.to_string(), m.clone()))
            .collect();
        if got != want {
            failures.push(format!("{what}:\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} rows differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = "name: many
nodes:
  - { id: a, type: TASK, queue: q, task: t, retry: { max_attempts: 0 } }
  - { id: b, type: TASK, queue: q, task: t, bogus: 1 }
  - { id: c, type: JOIN }
  - { id: a, type: FORK }
edges:
  - { from: a, to: c, when: 'nodes.nope.output' }
  - { from: b, to: c }
  - { from: c, to: z }
";
    let got = errors(text);
    let paths: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
    for want in [
        "nodes[1].bogus",
        "nodes[3].id",
        "nodes[0].retry.max_attempts",
        "edges[0].when",
        "edges[2].to",
    ] {
        assert!(paths.contains(&want), "missing {want} in {got:?}");
    }
    // b did not parse, but the edge from it is not reported as unknown.
    assert!(!got.iter().any(|(p, _)| p == "edges[1].from"), "{got:?}");
}

#[test]
fn yaml_and_json_are_the_same_document_with_the_same_canonical_bytes() {
    let yaml =
        "name: same\nnodes:\n  - { id: a, type: TASK, queue: q, task: t, input: { y: 1, x: 2 } }\n";
    let json = r#"{"nodes": [{"task": "t", "queue": "q", "type": "TASK", "id": "a", "input": {"x": 2, "y": 1}}], "name": "same"}"#;
    let a = parse_definition(yaml).expect("yaml");
    let b = parse_definition(json).expect("json");
    assert_eq!(a, b);
    assert_eq!(a.canonical_json(), b.canonical_json());
    let c = parse_definition(&yaml.replace("x: 2", "x: 3")).expect("yaml");
    assert_ne!(a.canonical_json(), c.canonical_json());
}
