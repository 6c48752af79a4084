//! Property tests over random valid DAGs and random event orders.

use std::collections::HashMap;

use composer_engine::{
    Action, CompiledWorkflow, Outcomes, RunStatus, SimOptions, SimulationReport, simulate_with,
    splitmix64,
};
use proptest::prelude::*;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A random valid workflow (YAML) and a random script for it.
fn random_workflow(n: usize, seed: u64) -> (String, String, Vec<String>) {
    random_workflow_with(n, seed, false)
}

/// `saga`: some tasks carry a compensation (which may fail), tasks take
/// 0-3s, and the run may be cancelled at a random time.
fn random_workflow_with(n: usize, seed: u64, saga: bool) -> (String, String, Vec<String>) {
    let mut rng = Rng(seed);
    let mut types = vec!["FORK".to_string()];
    let mut edges: Vec<(usize, usize, Option<String>, bool)> = Vec::new();
    for i in 1..n {
        let t = match rng.below(10) {
            0..=4 => "TASK",
            5 | 6 => "FORK",
            7 => "SWITCH",
            _ if i >= 2 => "JOIN",
            _ => "TASK",
        };
        types.push(t.to_string());
        let wanted = if t == "JOIN" {
            2 + rng.below(2) as usize
        } else {
            1 + rng.below(2) as usize
        };
        let mut preds: Vec<usize> = Vec::new();
        while preds.len() < wanted.min(i) {
            let p = rng.below(i as u64) as usize;
            if !preds.contains(&p) {
                preds.push(p);
            }
        }
        for p in preds {
            let on_error = types[p] == "TASK" && rng.chance(20);
            let when = match rng.below(6) {
                0 => Some("input.flag".to_string()),
                1 => Some("!input.flag".to_string()),
                2 if types[p] == "TASK" && !on_error => {
                    Some(format!("nodes.n{p}.output.ok == true"))
                }
                3 => Some("true".to_string()),
                _ => None,
            };
            edges.push((p, i, when, on_error));
        }
    }
    // A SWITCH needs an outgoing edge; a JOIN at least two incoming.
    for (i, t) in types.iter_mut().enumerate() {
        let outs = edges.iter().filter(|e| e.0 == i).count();
        let ins = edges.iter().filter(|e| e.1 == i).count();
        if (t == "SWITCH" && outs == 0) || (t == "JOIN" && ins < 2) {
            *t = "TASK".into();
        }
    }
    let mut yaml = String::from("name: random\nnodes:\n");
    let mut undo: Vec<usize> = Vec::new();
    for (i, t) in types.iter().enumerate() {
        if t == "TASK" {
            let compensate = if saga && rng.chance(50) {
                undo.push(i);
                format!(", compensate: undo_n{i}")
            } else {
                String::new()
            };
            yaml.push_str(&format!("  - {{ id: n{i}, type: TASK, queue: q, task: t, retry: {{ max_attempts: {}, initial_interval: 1s }}{compensate} }}\n", 1 + rng.below(2)));
        } else {
            yaml.push_str(&format!("  - {{ id: n{i}, type: {t} }}\n"));
        }
    }
    for i in &undo {
        yaml.push_str(&format!("  - {{ id: undo_n{i}, type: TASK, queue: q, task: undo, retry: {{ max_attempts: 2, initial_interval: 1s }} }}\n"));
    }
    yaml.push_str("edges:\n");
    for (from, to, when, on_error) in &edges {
        let mut e = format!("  - {{ from: n{from}, to: n{to}");
        if let Some(w) = when {
            e.push_str(&format!(", when: '{w}'"));
        }
        if *on_error {
            e.push_str(", on: error");
        }
        e.push_str(" }\n");
        yaml.push_str(&e);
    }
    yaml.push_str("output:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  n{i}: '${{nodes.n{i}.status}}/${{nodes.n{i}.output}}'\n"
        ));
    }
    let mut outcomes = format!("input: {{ flag: {} }}\ntasks:\n", rng.chance(50));
    for (i, t) in types.iter().enumerate() {
        if t != "TASK" {
            continue;
        }
        let mut list = Vec::new();
        for attempt in 0..2 {
            let after = if saga {
                format!(", after: {}s", rng.below(4))
            } else {
                String::new()
            };
            if rng.chance(20) {
                list.push(format!(
                    "{{ fail: {{ code: E{i}_{attempt}, retryable: {} }}{after} }}",
                    rng.chance(70)
                ));
            } else {
                list.push(format!(
                    "{{ complete: {{ ok: {}, v: {i} }}{after} }}",
                    rng.chance(50)
                ));
            }
        }
        outcomes.push_str(&format!("  n{i}: [ {} ]\n", list.join(", ")));
    }
    for i in &undo {
        let first = if rng.chance(30) {
            "{ fail: { code: UNDO_FAILED } }"
        } else {
            "{ complete: undone }"
        };
        outcomes.push_str(&format!(
            "  undo_n{i}: [ {first}, {{ fail: {{ code: UNDO_FAILED }} }} ]\n"
        ));
    }
    if saga && rng.chance(50) {
        outcomes.push_str(&format!("cancel_at: {}ms\n", rng.below(5_000)));
    }
    (yaml, outcomes, types)
}

fn run(wf: &CompiledWorkflow, outcomes: &str, shuffle: Option<u64>) -> SimulationReport {
    let outcomes = Outcomes::parse(outcomes).expect("outcomes parse");
    let opts = SimOptions {
        check_idempotence: true,
        shuffle_seed: shuffle,
        ..SimOptions::default()
    };
    simulate_with(wf, &outcomes, &opts).expect("simulation runs")
}

fn check_invariants(
    wf: &CompiledWorkflow,
    types: &[String],
    r: &SimulationReport,
) -> Result<(), TestCaseError> {
    // Exactly one terminal status.
    prop_assert!(r.status.is_terminal(), "run ended {:?}", r.status);
    let terminal = r
        .actions()
        .filter(|a| {
            matches!(
                a,
                Action::CompleteRun { .. } | Action::FailRun { .. } | Action::CancelRun { .. }
            )
        })
        .count();
    prop_assert_eq!(terminal, 1);
    // An event applied twice equals once.
    prop_assert!(r.violations.is_empty(), "{:?}", r.violations);
    // No action names a node that does not exist.
    for a in r.actions() {
        if let Some(k) = a.node() {
            prop_assert!(wf.contains(&k.node), "action names unknown node {k}");
        }
    }
    // Order facts from the history.
    let mut first_done: HashMap<String, usize> = HashMap::new();
    let mut first_resolved: HashMap<String, usize> = HashMap::new();
    let mut starts: HashMap<String, usize> = HashMap::new();
    let mut completions: HashMap<String, usize> = HashMap::new();
    for (i, a) in r.actions().enumerate() {
        let Action::AppendHistory {
            kind,
            node: Some(node),
            ..
        } = a
        else {
            continue;
        };
        let id = node.node.clone();
        match kind.as_str() {
            "node_completed" | "node_failed" => {
                first_done.entry(id.clone()).or_insert(i);
                first_resolved.entry(id.clone()).or_insert(i);
                if kind.as_str() == "node_completed" {
                    *completions.entry(id).or_default() += 1;
                }
            }
            "node_skipped" => {
                first_resolved.entry(id).or_insert(i);
            }
            "node_started" => {
                prop_assert!(starts.insert(id.clone(), i).is_none(), "{id} started twice");
                let preds = wf.predecessors(&id);
                if types
                    .iter()
                    .enumerate()
                    .any(|(n, t)| t == "JOIN" && format!("n{n}") == id)
                {
                    // A JOIN fires once every incoming branch resolved, one arrived.
                    for p in &preds {
                        prop_assert!(
                            first_resolved.get(*p).is_some_and(|&d| d < i),
                            "JOIN {id} fired before {p} resolved"
                        );
                    }
                }
                if !preds.is_empty() {
                    prop_assert!(
                        preds
                            .iter()
                            .any(|p| first_done.get(*p).is_some_and(|&d| d < i)),
                        "{id} started before any of {preds:?} finished"
                    );
                }
            }
            _ => {}
        }
    }
    // A JOIN fires at most once (and no node completes twice).
    for (id, n) in &completions {
        prop_assert!(*n <= 1, "{id} completed {n} times");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_dags_keep_the_invariants_in_any_event_order(n in 2usize..14, seed in any::<u64>(), order_a in any::<u64>(), order_b in any::<u64>()) {
        let (yaml, outcomes, types) = random_workflow(n, seed);
        let wf = CompiledWorkflow::from_text(&yaml).map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
        let a = run(&wf, &outcomes, Some(order_a));
        check_invariants(&wf, &types, &a)?;
        let b = run(&wf, &outcomes, Some(order_b));
        check_invariants(&wf, &types, &b)?;
        // The same run whatever the order of independent completions.
        prop_assert_eq!(a.status, b.status);
        if a.status == RunStatus::Completed {
            prop_assert_eq!(&a.output, &b.output, "\n{}\n{}", yaml, outcomes);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_sagas_compensate_in_reverse_completion_order_and_keep_the_error(n in 2usize..12, seed in any::<u64>(), order in any::<u64>()) {
        let (yaml, outcomes, types) = random_workflow_with(n, seed, true);
        let wf = CompiledWorkflow::from_text(&yaml).map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
        let r = run(&wf, &outcomes, Some(order));
        check_invariants(&wf, &types, &r)?;
        let mut completed_with_undo = Vec::new();
        let mut compensated = Vec::new();
        let mut ended = false;
        for a in r.actions() {
            match a {
                Action::AppendHistory { kind, node: Some(node), detail, .. } => match kind.as_str() {
                    "node_completed" if !ended && wf.node(&node.node).is_some_and(|n| n.compensate.is_some()) => {
                        completed_with_undo.push(node.node.clone());
                    }
                    "compensation_node_started" => compensated.push(detail["for"].as_str().unwrap_or_default().to_owned()),
                    _ => {}
                },
                Action::AppendHistory { kind, .. } if kind.as_str() == "compensation_started" || kind.as_str() == "run_completed" => ended = true,
                _ => {}
            }
        }
        if r.status == RunStatus::Completed {
            prop_assert!(compensated.is_empty());
        } else {
            completed_with_undo.reverse();
            prop_assert_eq!(&compensated, &completed_with_undo, "\n{}\n{}", yaml, outcomes);
            // A failing compensation never replaces the run's error.
            prop_assert!(r.error.as_ref().is_none_or(|e| e.code != "UNDO_FAILED"), "{:?}", r.error);
        }
    }
}

/// The generator must reach the interesting cases, or the property above
/// proves little: completed and failed runs, JOINs that fire and are skipped,
/// ignored arrivals, skipped nodes, handled failures.
#[test]
fn random_workflows_cover_the_interesting_cases() {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for seed in 0..300u64 {
        let (yaml, outcomes, types) = random_workflow(2 + (seed % 12) as usize, seed);
        let wf = CompiledWorkflow::from_text(&yaml).expect("valid");
        let r = run(&wf, &outcomes, None);
        *seen
            .entry(if r.status == RunStatus::Completed {
                "completed"
            } else {
                "failed"
            })
            .or_default() += 1;
        for a in r.actions() {
            if let Action::AppendHistory {
                kind,
                node: Some(node),
                ..
            } = a
            {
                let is_join = types
                    .iter()
                    .enumerate()
                    .any(|(n, t)| t == "JOIN" && format!("n{n}") == node.node);
                let label = match (kind.as_str(), is_join) {
                    ("node_completed", true) => "join fired",
                    ("node_skipped", true) => "join skipped",
                    ("node_skipped", false) => "skipped",
                    ("arrival_ignored", _) => "arrival ignored",
                    ("retry_scheduled", _) => "retried",
                    _ => continue,
                };
                *seen.entry(label).or_default() += 1;
            }
        }
    }
    for seed in 0..300u64 {
        let (yaml, outcomes, _) = random_workflow_with(2 + (seed % 10) as usize, seed, true);
        let wf = CompiledWorkflow::from_text(&yaml).expect("valid");
        let r = run(&wf, &outcomes, None);
        if r.status == RunStatus::Cancelled {
            *seen.entry("cancelled").or_default() += 1;
        }
        for kind in ["compensation_completed", "compensation_failed"] {
            if r.history_of(kind).next().is_some() {
                *seen.entry(kind).or_default() += 1;
            }
        }
    }
    for want in [
        "completed",
        "failed",
        "join fired",
        "join skipped",
        "skipped",
        "arrival ignored",
        "retried",
        "cancelled",
        "compensation_completed",
        "compensation_failed",
    ] {
        assert!(
            seen.get(want).copied().unwrap_or(0) > 0,
            "never saw {want}: {seen:?}"
        );
    }
}

/// A run replayed against its own definition: identical, whether cut in
/// flight after any event or kept whole.
fn replays_as_identical(
    wf: &CompiledWorkflow,
    outcomes: &str,
    r: &SimulationReport,
    cut: u64,
) -> Result<(), TestCaseError> {
    use composer_engine::replay::{NodeMapping, Verdict, replay};
    let input = Outcomes::parse(outcomes).expect("outcomes parse").input;
    let whole = crate::common::recorded_of(r, input, None);
    let mut cut_short = whole.clone();
    let events: Vec<usize> = (0..whole.history.len())
        .filter(|&i| i == 0 || whole.history[i].at != whole.history[i - 1].at)
        .collect();
    if let Some(&at) = events.get((cut % events.len().max(1) as u64) as usize)
        && at > 0
    {
        cut_short.history.truncate(at);
    }
    for recorded in [&whole, &cut_short] {
        let report = replay(wf, wf, recorded, &NodeMapping::default())
            .map_err(|e| TestCaseError::fail(format!("{e}\n{outcomes}")))?;
        prop_assert_eq!(
            report.verdict,
            Verdict::Identical,
            "{:#?}\n{}",
            report,
            outcomes
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn a_run_replayed_against_its_own_definition_is_identical(n in 2usize..12, seed in any::<u64>(), saga in any::<bool>(), order in any::<u64>(), cut in any::<u64>()) {
        let (yaml, outcomes, _) = random_workflow_with(n, seed, saga);
        let wf = CompiledWorkflow::from_text(&yaml).map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
        let r = run(&wf, &outcomes, Some(order));
        replays_as_identical(&wf, &outcomes, &r, cut)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
    }
}
