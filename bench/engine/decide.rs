//! Cost of one `decide` call for the last completion of a wide FORK/JOIN or
//! MAP, with the state loaded as the coordinator loads it: only the node
//! states the event touches. The bar: the 10,000-branch FORK/JOIN
//! costs less than 5x the 10-branch one. A definition holds at most 10,000
//! nodes, so the wide FORK/JOIN has 9,997 branches (plus FORK, JOIN and one
//! task after it); the MAP has 10,000 elements.
//!
//! cargo bench -p composer-engine --bench decide -- --warm-up-time 1 --measurement-time 3

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use composer_engine::{
    CompiledWorkflow, DecideError, Event, NodeKey, NodeState, RunState, Timestamp, decide, prefetch,
};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

const NOW: Timestamp = Timestamp(1_767_225_600_000);

/// A run driven event by event the way the coordinator does it: a full
/// store, and per event only the keys `decide` touches.
struct Run {
    wf: CompiledWorkflow,
    run: RunState,
    store: BTreeMap<NodeKey, NodeState>,
}

impl Run {
    fn new(yaml: &str, input: serde_json::Value) -> Run {
        let wf = CompiledWorkflow::from_text(yaml).expect("bench workflow compiles");
        let run = RunState::new("bench", wf.name().to_owned(), 1, input);
        Run {
            wf,
            run,
            store: BTreeMap::new(),
        }
    }

    /// The state the coordinator would load for `event`.
    fn loaded_for(&self, event: &Event) -> RunState {
        let mut state = RunState {
            run: self.run.run.clone(),
            nodes: BTreeMap::new(),
            blobs: Default::default(),
        };
        for k in prefetch(&self.wf, &state, event) {
            let s = self.store.get(&k).cloned();
            state.load(k, s);
        }
        loop {
            match decide(&self.wf, &state, event, NOW) {
                Ok(_) => return state,
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

    fn send(&mut self, event: &Event) {
        let mut state = self.loaded_for(event);
        let d = decide(&self.wf, &state, event, NOW).expect("decides");
        state.apply(&d.change);
        self.run.run = state.run;
        for (k, s) in d.change.nodes {
            self.store.insert(k, s);
        }
    }
}

fn done(node: NodeKey) -> Event {
    Event::TaskCompleted {
        node,
        attempt: 1,
        output: json!({"ok": true}),
    }
}

/// FORK of `n` tasks into a JOIN, then one task; every branch but the last
/// completed. Returns the run and the last branch's completion.
fn fork_join(n: usize) -> (Run, Event) {
    let mut yaml = String::from("name: wide\nnodes:\n  - { id: f, type: FORK }\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{ id: b{i}, type: TASK, queue: q, task: t }}\n"
        ));
    }
    yaml.push_str(
        "  - { id: j, type: JOIN }\n  - { id: after, type: TASK, queue: q, task: t }\nedges:\n",
    );
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{ from: f, to: b{i} }}\n  - {{ from: b{i}, to: j }}\n"
        ));
    }
    yaml.push_str("  - { from: j, to: after }\n");
    let mut run = Run::new(&yaml, json!({}));
    run.send(&Event::RunStarted);
    for i in 0..n - 1 {
        run.send(&done(NodeKey::node(format!("b{i}"))));
    }
    (run, done(NodeKey::node(format!("b{}", n - 1))))
}

/// MAP over `n` items, 100 at a time; every element but the last completed.
/// The task after it takes a small input: by default a task's input is the
/// run's input, here the `n` items, and copying that into its CreateTask
/// would measure the input's size, not the engine's cost per event.
fn map(n: usize) -> (Run, Event) {
    let yaml = "name: mapped\nnodes:\n  - { id: m, type: MAP, items: input.xs, concurrency: 100, queue: q, task: t }\n  - { id: after, type: TASK, queue: q, task: t, input: { done: true } }\nedges:\n  - { from: m, to: after }\n";
    let xs: Vec<usize> = (0..n).collect();
    let mut run = Run::new(yaml, json!({ "xs": xs }));
    run.send(&Event::RunStarted);
    for i in 0..n - 1 {
        run.send(&done(NodeKey::element("m", i as u32)));
    }
    (run, done(NodeKey::element("m", (n - 1) as u32)))
}

struct Case {
    name: String,
    run: Run,
    state: RunState,
    event: Event,
}

fn case(name: &str, (run, event): (Run, Event)) -> Case {
    let state = run.loaded_for(&event);
    let d = decide(&run.wf, &state, &event, NOW).expect("decides");
    println!(
        "{name}: loads {} node states, writes {}, {} actions",
        state.nodes.len(),
        d.change.nodes.len(),
        d.actions.len()
    );
    Case {
        name: name.to_owned(),
        run,
        state,
        event,
    }
}

fn per_call_ns(c: &Case, iterations: u32) -> f64 {
    let start = Instant::now();
    for _ in 0..iterations {
        black_box(decide(&c.run.wf, black_box(&c.state), black_box(&c.event), NOW).ok());
    }
    start.elapsed().as_nanos() as f64 / f64::from(iterations)
}

fn bench(c: &mut Criterion) {
    let cases = [
        case("fork_join_10", fork_join(10)),
        // The widest FORK/JOIN the 10,000-node limit allows: FORK + 9,997
        // branches + JOIN + one task after it.
        case("fork_join_9997", fork_join(9_997)),
        case("map_10", map(10)),
        case("map_10000", map(10_000)),
    ];
    let mut group = c.benchmark_group("decide_last_completion");
    for k in &cases {
        group.bench_function(&k.name, |b| {
            b.iter(|| decide(&k.run.wf, black_box(&k.state), black_box(&k.event), NOW))
        });
    }
    group.finish();
    // The ratio the issue asks for, measured side by side.
    let t: Vec<f64> = cases.iter().map(|k| per_call_ns(k, 20_000)).collect();
    println!(
        "ratio fork_join 9997/10 = {:.2} ({:.0} ns / {:.0} ns)",
        t[1] / t[0],
        t[1],
        t[0]
    );
    println!(
        "ratio map 10000/10 = {:.2} ({:.0} ns / {:.0} ns)",
        t[3] / t[2],
        t[3],
        t[2]
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
