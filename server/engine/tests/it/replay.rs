//! Replay (`docs/versions.md`): one test per verdict rule. A run of v1 is
//! simulated, cut where it waits in B (or kept whole), and replayed against
//! a changed definition.

use composer_engine::replay::{
    DifferenceKind, DivergenceRule, NodeMapping, RecordedRun, ReplayError, ReplayReport, Verdict,
    replay,
};
use serde_json::json;

use crate::common::{compile, recorded_of, simulate};

const V1: &str = r#"
name: order
nodes:
  - { id: A, type: TASK, queue: q, task: a }
  - { id: B, type: TASK, queue: q, task: b, input: { id: "${nodes.A.output.id}" } }
  - { id: C, type: TASK, queue: q, task: c }
edges:
  - { from: A, to: B }
  - { from: B, to: C }
"#;

const OUTCOMES: &str = r#"
input: { kind: "x" }
tasks:
  A: [ { complete: { id: 7 } } ]
"#;

/// A run of V1 that has completed A and waits in B.
fn waiting_in_b() -> RecordedRun {
    let report = simulate(V1, OUTCOMES);
    recorded_of(&report, json!({ "kind": "x" }), Some("B"))
}

/// A run of V1 that completed.
fn completed_run() -> RecordedRun {
    let report = simulate(V1, OUTCOMES);
    recorded_of(&report, json!({ "kind": "x" }), None)
}

fn against(recorded: &RecordedRun, new: &str, mapping: &[&str]) -> ReplayReport {
    let mapping = NodeMapping::parse(mapping.iter().copied()).expect("mapping");
    replay(&compile(V1), &compile(new), recorded, &mapping).expect("replays")
}

fn divergence_of(report: &ReplayReport) -> (DivergenceRule, String, String) {
    assert_eq!(report.verdict, Verdict::Incompatible, "{report:#?}");
    let d = report.divergence.as_ref().expect("a divergence");
    (
        d.rule,
        d.node.clone().unwrap_or_default(),
        d.message.clone(),
    )
}

#[test]
fn the_same_definition_is_identical() {
    let report = against(&waiting_in_b(), V1, &[]);
    assert_eq!(report.verdict, Verdict::Identical, "{report:#?}");
    assert!(report.events >= 2, "{report:#?}");
    let report = against(&completed_run(), V1, &[]);
    assert_eq!(report.verdict, Verdict::Identical, "{report:#?}");
}

#[test]
fn a_node_appended_where_the_run_has_not_been_is_compatible() {
    let v2 = format!("{V1}  - {{ from: C, to: D }}\n").replace(
        "  - { id: C, type: TASK, queue: q, task: c }\n",
        "  - { id: C, type: TASK, queue: q, task: c }\n  - { id: D, type: TASK, queue: q, task: d }\n",
    );
    let report = against(&waiting_in_b(), &v2, &[]);
    assert_eq!(report.verdict, Verdict::Compatible, "{report:#?}");
    assert!(
        report
            .differences
            .iter()
            .any(|d| d.kind == DifferenceKind::NodeAdded && d.node == "D"),
        "{report:#?}"
    );
}

#[test]
fn a_changed_node_the_run_has_not_reached_is_compatible() {
    let v2 = V1.replace("task: c }", "task: c, retry: { max_attempts: 5 } }");
    let report = against(&waiting_in_b(), &v2, &[]);
    assert_eq!(report.verdict, Verdict::Compatible, "{report:#?}");
    assert_eq!(report.differences[0].kind, DifferenceKind::NodeChanged);
    assert_eq!(report.differences[0].node, "C");
}

#[test]
fn another_rendered_input_for_a_started_node_is_compatible() {
    let v2 = V1.replace(
        r#"input: { id: "${nodes.A.output.id}" }"#,
        r#"input: { id: "${nodes.A.output.id}", note: "v2" }"#,
    );
    let report = against(&waiting_in_b(), &v2, &[]);
    assert_eq!(report.verdict, Verdict::Compatible, "{report:#?}");
    let input = report
        .differences
        .iter()
        .find(|d| d.kind == DifferenceKind::InputDiffers)
        .expect("the input difference");
    assert_eq!(input.node, "B");
}

#[test]
fn a_started_node_with_another_task_is_incompatible() {
    let v2 = V1.replace("task: b,", "task: b2,");
    let (rule, node, message) = divergence_of(&against(&waiting_in_b(), &v2, &[]));
    assert_eq!((rule, node.as_str()), (DivergenceRule::NodeChanged, "B"));
    assert!(message.contains("\"b2\""), "{message}");
}

#[test]
fn a_started_node_on_another_queue_is_incompatible() {
    let v2 = V1.replace(
        "{ id: B, type: TASK, queue: q,",
        "{ id: B, type: TASK, queue: q2,",
    );
    let (rule, node, _) = divergence_of(&against(&waiting_in_b(), &v2, &[]));
    assert_eq!((rule, node.as_str()), (DivergenceRule::NodeChanged, "B"));
}

#[test]
fn a_started_node_of_another_type_is_incompatible() {
    let v2 = V1.replace(
        r#"{ id: B, type: TASK, queue: q, task: b, input: { id: "${nodes.A.output.id}" } }"#,
        "{ id: B, type: WAIT, duration: 1h }",
    );
    let (rule, node, message) = divergence_of(&against(&waiting_in_b(), &v2, &[]));
    assert_eq!((rule, node.as_str()), (DivergenceRule::NodeChanged, "B"));
    assert!(message.contains("WAIT"), "{message}");
}

#[test]
fn a_removed_node_the_run_waits_in_is_incompatible() {
    let v2 = r#"
name: order
nodes:
  - { id: A, type: TASK, queue: q, task: a }
  - { id: C, type: TASK, queue: q, task: c }
edges:
  - { from: A, to: C }
"#;
    let (rule, node, _) = divergence_of(&against(&waiting_in_b(), v2, &[]));
    assert_eq!(
        (rule, node.as_str()),
        (DivergenceRule::WaitingNodeRemoved, "B")
    );
}

#[test]
fn a_removed_node_mapped_to_its_successor_is_compatible() {
    let v2 = V1.replace("id: B,", "id: B2,").replace(
        "  - { from: A, to: B }\n  - { from: B, to: C }",
        "  - { from: A, to: B2 }\n  - { from: B2, to: C }",
    );
    let report = against(&waiting_in_b(), &v2, &["B=B2"]);
    assert_eq!(report.verdict, Verdict::Compatible, "{report:#?}");
    assert!(
        report
            .differences
            .iter()
            .any(|d| d.kind == DifferenceKind::NodeRenamed && d.node == "B"),
        "{report:#?}"
    );
    // unmapped, the same change is incompatible
    let (rule, _, _) = divergence_of(&against(&waiting_in_b(), &v2, &[]));
    assert_eq!(rule, DivergenceRule::WaitingNodeRemoved);
}

#[test]
fn a_node_the_run_started_that_the_new_definition_would_not_start_is_incompatible() {
    // B now comes after a new node E: the run started B right after A
    let v2 = r#"
name: order
nodes:
  - { id: A, type: TASK, queue: q, task: a }
  - { id: E, type: TASK, queue: q, task: e }
  - { id: B, type: TASK, queue: q, task: b, input: { id: "${nodes.A.output.id}" } }
  - { id: C, type: TASK, queue: q, task: c }
edges:
  - { from: A, to: E }
  - { from: E, to: B }
  - { from: B, to: C }
"#;
    let report = against(&waiting_in_b(), v2, &[]);
    let (rule, node, message) = divergence_of(&report);
    assert_eq!(rule, DivergenceRule::NodeNotStarted, "{message}");
    assert_eq!(node, "B");
}

const SWITCHED: &str = r#"
name: order
nodes:
  - { id: A, type: TASK, queue: q, task: a }
  - { id: S, type: SWITCH }
  - { id: big, type: TASK, queue: q, task: big }
  - { id: small, type: TASK, queue: q, task: small }
edges:
  - { from: A, to: S }
  - { from: S, to: big, when: "nodes.A.output.id > LIMIT" }
  - { from: S, to: small }
"#;

#[test]
fn a_switch_that_would_take_another_branch_is_incompatible() {
    let v1 = SWITCHED.replace("LIMIT", "5");
    let report = simulate(&v1, OUTCOMES);
    let recorded = recorded_of(&report, json!({ "kind": "x" }), Some("big"));
    let v2 = SWITCHED.replace("LIMIT", "10");
    let report = replay(
        &compile(&v1),
        &compile(&v2),
        &recorded,
        &NodeMapping::default(),
    )
    .expect("replays");
    let (rule, node, message) = divergence_of(&report);
    assert_eq!((rule, node.as_str()), (DivergenceRule::BranchChanged, "S"));
    assert!(message.contains("big"), "{message}");
}

#[test]
fn a_finished_run_that_the_new_definition_would_continue_is_incompatible() {
    let v2 = format!("{V1}  - {{ from: C, to: D }}\n").replace(
        "  - { id: C, type: TASK, queue: q, task: c }\n",
        "  - { id: C, type: TASK, queue: q, task: c }\n  - { id: D, type: TASK, queue: q, task: d }\n",
    );
    let (rule, node, _) = divergence_of(&against(&completed_run(), &v2, &[]));
    assert_eq!(
        (rule, node.as_str()),
        (DivergenceRule::UnexpectedStart, "D")
    );
}

#[test]
fn an_output_a_later_node_can_no_longer_read_is_incompatible() {
    let v2 = V1.replace(
        "{ id: C, type: TASK, queue: q, task: c }",
        r#"{ id: C, type: TASK, queue: q, task: c, input: { order: "${nodes.A.output.order_id}" } }"#,
    );
    // C reads only A, which the run completed: it can be checked now
    let (rule, node, message) = divergence_of(&against(&waiting_in_b(), &v2, &[]));
    assert_eq!(
        (rule, node.as_str()),
        (DivergenceRule::OutputUnreadable, "C"),
        "{message}"
    );
    assert!(message.contains("order_id"), "{message}");
}

#[test]
fn a_history_its_own_definition_does_not_reproduce_is_refused() {
    let mut recorded = waiting_in_b();
    // B's start claims another node
    if let Some(entry) = recorded
        .history
        .iter_mut()
        .rev()
        .find(|e| e.kind == composer_engine::history::HistoryEventType::NodeStarted)
    {
        entry.node = Some("C".parse().expect("key"));
    }
    let error = replay(
        &compile(V1),
        &compile(V1),
        &recorded,
        &NodeMapping::default(),
    )
    .expect_err("not reproducible");
    assert!(
        matches!(error, ReplayError::NotReproducible { .. }),
        "{error}"
    );
    recorded.history.clear();
    let error = replay(
        &compile(V1),
        &compile(V1),
        &recorded,
        &NodeMapping::default(),
    )
    .expect_err("empty");
    assert_eq!(error, ReplayError::NoStart);
}

#[test]
fn a_mapping_is_old_equals_new() {
    assert!(NodeMapping::parse(["B=B2", "C = C2"]).is_ok());
    for bad in ["B", "=B2", "B=", ""] {
        assert!(NodeMapping::parse([bad]).is_err(), "{bad:?}");
    }
    assert!(NodeMapping::parse(["B=X", "B=Y"]).is_err());
}

#[test]
fn a_migrated_run_replays_against_its_new_version_under_the_new_ids() {
    // v2 renames B to B2; the run moved to v2 with B=B2 at the end of its
    // history: entries before the move name B, the run's own definition is v2
    let v2 = V1
        .replace("id: B,", "id: B2,")
        .replace("{ from: A, to: B }", "{ from: A, to: B2 }")
        .replace("{ from: B, to: C }", "{ from: B2, to: C }");
    let mut recorded = waiting_in_b();
    let last = recorded.history.last().cloned().expect("entries");
    recorded
        .history
        .push(composer_engine::replay::RecordedEntry {
            sequence: last.sequence + 1,
            kind: composer_engine::history::HistoryEventType::RunMigrated,
            node: None,
            attempt: None,
            details: json!({ "from_version": 1, "to_version": 2, "node_mapping": { "B": "B2" } }),
            at: last.at,
        });
    let v2 = compile(&v2);
    let report = replay(&v2, &v2, &recorded, &NodeMapping::default()).expect("replays");
    assert_eq!(report.verdict, Verdict::Identical, "{report:#?}");
}

#[test]
fn a_run_record_renames_its_nodes() {
    let mut record = composer_engine::RunState::new("r", "w", 1, json!(null)).run;
    record.compensable = vec!["A".into(), "B".into()];
    record.failed = vec!["B".parse().expect("key"), "M[2]".parse().expect("key")];
    record.error = Some(composer_engine::ErrorInfo::new("X", "y").at_node("M[2]".into()));
    let mapping = NodeMapping::parse(["B=B2", "M=M2"]).expect("mapping");
    mapping.rename_record(&mut record);
    assert_eq!(record.compensable, ["A", "B2"]);
    assert_eq!(
        record
            .failed
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["B2", "M2[2]"]
    );
    assert_eq!(record.error.and_then(|e| e.node).as_deref(), Some("M2[2]"));
}

/// A rule's name is the one docs/versions.md and the API use, in serde's
/// spelling too (what `workflow replay -o json` prints).
#[test]
fn every_rule_is_named_as_the_docs_name_it() {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/versions.md"
    ))
    .expect("docs/versions.md");
    for rule in [
        DivergenceRule::NodeNotStarted,
        DivergenceRule::NodeChanged,
        DivergenceRule::BranchChanged,
        DivergenceRule::WaitingNodeRemoved,
        DivergenceRule::UnexpectedStart,
        DivergenceRule::RunEndDiffers,
        DivergenceRule::OutputUnreadable,
        DivergenceRule::HistoryDiffers,
        DivergenceRule::DecisionFailed,
    ] {
        assert_eq!(
            serde_json::to_value(rule).expect("rule"),
            json!(rule.as_str())
        );
        assert!(
            docs.contains(&format!("`{}`", rule.as_str())),
            "{rule:?} is not in the docs"
        );
    }
}

#[test]
fn a_wide_map_armed_in_slices_replays_identically() {
    let wide = r#"
name: wide
nodes:
  - { id: m, type: MAP, items: input.xs, concurrency: 600, queue: q, task: t }
  - { id: after, type: TASK, queue: q, task: after }
edges:
  - { from: m, to: after }
output: "${nodes.m.output}"
"#;
    let xs: Vec<u32> = (0..700).collect();
    let input = json!({ "xs": xs });
    let report = simulate(wide, &format!("input: {input}"));
    let output = report.output.clone().expect("the run completed");
    assert_eq!(
        output.as_array().map(Vec::len),
        Some(700),
        "every element ran"
    );
    let recorded = recorded_of(&report, input, None);
    let report = replay(
        &compile(wide),
        &compile(wide),
        &recorded,
        &NodeMapping::default(),
    )
    .expect("replays");
    assert_eq!(report.verdict, Verdict::Identical, "{report:#?}");
}

/// A node's output offloaded to the blob store is recorded as a reference
/// (docs/payloads.md); an expression that looks inside it reads the blob.
/// Replay is given the values of the blobs a run refers to, and reads them
/// as the run did; one it was not given is named, not taken for a history
/// the engine cannot reproduce.
#[test]
fn a_run_whose_expressions_read_inside_a_blob_replays_with_its_value_and_names_it_without() {
    const READS_A_BLOB: &str = r#"
name: order
nodes:
  - { id: A, type: TASK, queue: q, task: a }
  - { id: B, type: TASK, queue: q, task: b, input: { size: "${size(nodes.A.output.doc)}" } }
edges:
  - { from: A, to: B }
"#;
    let document = json!({ "doc": "a long document" });
    let report = simulate(
        READS_A_BLOB,
        r#"
input: {}
tasks:
  A: [ { complete: { doc: "a long document" } } ]
"#,
    );
    let mut recorded = recorded_of(&report, json!({}), Some("B"));
    let digest = "cd".repeat(32);
    let key = composer_engine::NodeKey::node("A");
    assert_eq!(recorded.outputs.get(&key), Some(&document));
    recorded.outputs.insert(
        key,
        composer_engine::blob::reference(&digest, 200_000, "{\"doc\""),
    );
    let old = compile(READS_A_BLOB);
    let mapping = NodeMapping::default();

    match replay(&old, &old, &recorded, &mapping) {
        Err(ReplayError::BlobsNotGiven { digests, .. }) => {
            assert_eq!(digests, vec![digest.clone()])
        }
        other => panic!("expected the blob to be named, got {other:?}"),
    }

    recorded.blobs.insert(digest, std::sync::Arc::new(document));
    let report = replay(&old, &old, &recorded, &mapping).expect("replays with the blob");
    assert_eq!(report.verdict, Verdict::Identical, "{report:#?}");
}
