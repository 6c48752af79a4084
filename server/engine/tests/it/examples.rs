//! Every example under `examples/workflows/` validates, and each of its
//! `*.outcomes.yaml` files simulates to the output it promises.
//!
//! Naming: `NAME.yaml` is a workflow; `NAME[-VARIANT].outcomes.yaml` scripts
//! a run of it.

use std::path::{Path, PathBuf};

use composer_engine::{CompiledWorkflow, Outcomes, SimOptions, simulate_with};

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows")
}

fn workflow_for(outcomes: &Path) -> PathBuf {
    let file = outcomes
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_default();
    let mut name = file.trim_end_matches(".outcomes.yaml").to_owned();
    loop {
        let candidate = outcomes.with_file_name(format!("{name}.yaml"));
        if candidate.exists() {
            return candidate;
        }
        match name.rfind('-') {
            Some(cut) => name.truncate(cut),
            None => panic!("no workflow file for {file}"),
        }
    }
}

#[test]
fn every_example_validates_and_simulates_to_its_expected_output() {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .expect("examples dir")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    let workflows: Vec<&PathBuf> = entries
        .iter()
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml")
                && !p.to_string_lossy().ends_with(".outcomes.yaml")
        })
        .collect();
    assert!(
        workflows.len() >= 5,
        "expected at least 5 example workflows, found {}",
        workflows.len()
    );
    for wf in &workflows {
        let text = std::fs::read_to_string(wf).expect("read workflow");
        if let Err(e) = CompiledWorkflow::from_text(&text) {
            panic!("{} does not validate: {e}", wf.display());
        }
    }
    let mut simulated = 0;
    for path in entries
        .iter()
        .filter(|p| p.to_string_lossy().ends_with(".outcomes.yaml"))
    {
        let wf_path = workflow_for(path);
        let wf = CompiledWorkflow::from_text(&std::fs::read_to_string(&wf_path).expect("read"))
            .expect("compiles");
        let outcomes = Outcomes::parse(&std::fs::read_to_string(path).expect("read"))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let expect = outcomes
            .expect
            .clone()
            .unwrap_or_else(|| panic!("{} has no expect", path.display()));
        let opts = SimOptions {
            check_idempotence: true,
            ..SimOptions::default()
        };
        let report = simulate_with(&wf, &outcomes, &opts)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Err(why) = report.check(&expect) {
            let kinds: Vec<String> = report
                .history
                .iter()
                .map(|s| format!("{:?}", s.event))
                .collect();
            panic!("{}: {why}\nevents: {kinds:#?}", path.display());
        }
        assert!(
            report.violations.is_empty(),
            "{}: {:?}",
            path.display(),
            report.violations
        );
        simulated += 1;
    }
    assert!(
        simulated >= 8,
        "expected every outcomes file to run, ran {simulated}"
    );
}

/// The prefetch hint is good enough that most events decide in one call:
/// the coordinator's round trips per event stay at one in the common case.
#[test]
fn prefetch_lets_most_events_decide_without_another_load() {
    let dir = examples_dir();
    let (mut events, mut first_try) = (0usize, 0usize);
    for (wf, outcomes) in [
        ("order", "order"),
        ("order", "order-saga"),
        ("fork-join", "fork-join"),
        ("approval", "approval"),
        ("linear", "linear"),
    ] {
        let wf = CompiledWorkflow::from_text(
            &std::fs::read_to_string(dir.join(format!("{wf}.yaml"))).expect("read"),
        )
        .expect("compiles");
        let outcomes = Outcomes::parse(
            &std::fs::read_to_string(dir.join(format!("{outcomes}.outcomes.yaml"))).expect("read"),
        )
        .expect("parses");
        let report = simulate_with(&wf, &outcomes, &SimOptions::default()).expect("runs");
        events += report.history.len();
        first_try += report
            .history
            .iter()
            .filter(|s| s.extra_rounds == 0)
            .count();
    }
    assert!(
        first_try * 10 >= events * 9,
        "only {first_try} of {events} events decided after the prefetch alone"
    );
}

#[test]
fn the_timeline_tells_the_run_as_it_happened() {
    let dir = examples_dir();
    let wf = CompiledWorkflow::from_text(
        &std::fs::read_to_string(dir.join("order.yaml")).expect("read"),
    )
    .expect("compiles");
    let outcomes =
        Outcomes::parse(&std::fs::read_to_string(dir.join("order.outcomes.yaml")).expect("read"))
            .expect("parses");
    let text = simulate_with(&wf, &outcomes, &SimOptions::default())
        .expect("runs")
        .timeline();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.first().map(|l| l.trim()),
        Some("+0:00:00.000  run started")
    );
    assert!(
        text.contains("charge #1 failed: HTTP_503 service unavailable"),
        "{text}"
    );
    assert!(
        text.contains("-> timer Retry charge #2 at +0:00:01.000"),
        "{text}"
    );
    assert!(
        text.contains("+1:00:00.000  event approval: {\"ok\":true}"),
        "{text}"
    );
    assert_eq!(
        lines.last().copied(),
        Some("result: COMPLETED, output {\"shipment\":{\"tracking\":\"T1\"}}")
    );
}

/// Every example run (failures, retries, timers, events, compensations,
/// cancels) replays as identical against its own definition: replay
/// rebuilds each event from the history alone.
#[test]
fn every_example_run_replays_as_identical_against_its_own_definition() {
    use composer_engine::replay::{NodeMapping, Verdict, replay};
    let mut replayed = 0;
    for entry in std::fs::read_dir(examples_dir()).expect("examples dir") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with(".outcomes.yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let outcomes = Outcomes::parse(&text).expect("outcomes");
        let wf = CompiledWorkflow::from_text(
            &std::fs::read_to_string(workflow_for(&path)).expect("read"),
        )
        .expect("compiles");
        let report = simulate_with(&wf, &outcomes, &SimOptions::default()).expect("simulates");
        let recorded = crate::common::recorded_of(&report, outcomes.input.clone(), None);
        let verdict = replay(&wf, &wf, &recorded, &NodeMapping::default())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            verdict.verdict,
            Verdict::Identical,
            "{}: {verdict:#?}",
            path.display()
        );
        replayed += 1;
    }
    assert!(replayed >= 5, "{replayed} example runs");
}
