//! `composer workflow test`: the simulator from the command line.

use std::{path::PathBuf, process::Command};

fn composer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_composer"))
}

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows")
}

#[test]
fn every_example_runs_offline_to_its_expected_result() {
    let mut checked = 0;
    for entry in std::fs::read_dir(examples()).expect("examples") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let Some(stem) = name.strip_suffix(".outcomes.yaml") else {
            continue;
        };
        // `order-saga.outcomes.yaml` scripts `order.yaml`; `fork-join` is its own
        let own = examples().join(format!("{stem}.yaml"));
        let workflow = if own.is_file() {
            own
        } else {
            examples().join(format!("{}.yaml", stem.split('-').next().unwrap_or(stem)))
        };
        let output = composer()
            .args(["workflow", "test"])
            .arg(&workflow)
            .arg("--outcomes")
            .arg(&path)
            .output()
            .expect("composer runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{name}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("expectation met"), "{name}: {stdout}");
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} outcome files found");
}

#[test]
fn an_unmet_expectation_or_a_broken_file_exits_non_zero() {
    let dir = tempfile::tempdir().expect("temp dir");
    let wrong = dir.path().join("wrong.outcomes.yaml");
    let original = std::fs::read_to_string(examples().join("linear.outcomes.yaml")).expect("read");
    std::fs::write(
        &wrong,
        original.replace("words: 6, stored", "words: 7, stored"),
    )
    .expect("write");
    let output = composer()
        .args(["workflow", "test"])
        .arg(examples().join("linear.yaml"))
        .arg("--outcomes")
        .arg(&wrong)
        .output()
        .expect("composer runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("expectation not met"));

    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "name: x\nnodes:\n  - { id: a, type: NOPE }\n").expect("write");
    let output = composer()
        .args(["workflow", "test"])
        .arg(&broken)
        .arg("--outcomes")
        .arg(&wrong)
        .output()
        .expect("composer runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("nodes[0].type"), "{stderr}");
}

#[test]
fn every_workflow_under_examples_validates() {
    fn walk(dir: &std::path::Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read examples").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "yaml")
                && !path.to_string_lossy().ends_with(".outcomes.yaml")
            {
                found.push(path);
            }
        }
    }
    let mut workflows = Vec::new();
    walk(&examples().join(".."), &mut workflows);
    let workflows: Vec<PathBuf> = workflows
        .into_iter()
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains("nodes:")))
        .collect();
    assert!(workflows.len() >= 6, "{workflows:?}");
    for path in workflows {
        let text = std::fs::read_to_string(&path).expect("read");
        if let Err(errors) = composer_engine::CompiledWorkflow::from_text(&text) {
            panic!("{} does not validate: {:?}", path.display(), errors.0);
        }
    }
}
