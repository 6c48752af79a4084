//! `composer workflow replay` end to end: the real server and a real
//! worker leave a run of v1 (A → B → C) waiting in B, and the binary replays
//! it against changed definitions, online and from the file `run history -o
//! json` writes; a recorded history kept in `tests/fixtures/replay/` replays
//! offline with no server at all.

use std::{path::PathBuf, time::Duration};

use composer_proto::v1::{NodeStatus, Run};
use composer_testkit::{
    ServerProcess,
    client::TestClient,
    worker::{Outcome, TestWorker},
};
use serde_json::{Value as Json, json};

use crate::common::cli::{Finished, bare, binary, cli, finish};

const V1: &str = r#"name: order
nodes:
  - { id: A, type: TASK, queue: replay, task: a }
  - { id: B, type: TASK, queue: replay, task: b, input: { amount: "${nodes.A.output.amount}" } }
  - { id: C, type: TASK, queue: replay, task: c }
edges:
  - { from: A, to: B }
  - { from: B, to: C }
"#;

fn with_d_after_c() -> String {
    V1.replace(
        "  - { id: C, type: TASK, queue: replay, task: c }\n",
        "  - { id: C, type: TASK, queue: replay, task: c }\n  - { id: D, type: TASK, queue: replay, task: d }\n",
    ) + "  - { from: C, to: D }\n"
}

fn with_b_renamed_task() -> String {
    V1.replace("task: b,", "task: b_v2,")
}

fn with_b_as_b2() -> String {
    V1.replace("{ id: B,", "{ id: B2,")
        .replace("{ from: A, to: B }", "{ from: A, to: B2 }")
        .replace("{ from: B, to: C }", "{ from: B2, to: C }")
}

const ROUTED: &str = r#"name: routed
nodes:
  - { id: A, type: TASK, queue: replay, task: a }
  - { id: S, type: SWITCH }
  - { id: big, type: TASK, queue: replay, task: big }
  - { id: small, type: TASK, queue: replay, task: small }
edges:
  - { from: A, to: S }
  - { from: S, to: big, when: "nodes.A.output.amount > LIMIT" }
  - { from: S, to: small }
"#;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/replay")
}

/// A worker that completes A with `{amount: 30}` and holds every other
/// task, heartbeating, for two minutes.
async fn worker(server: &ServerProcess) -> TestWorker {
    TestWorker::start(&server.url(), &["replay"], 2, 4, |lease| {
        if lease.node_id == "A" {
            Outcome::Complete(json!({ "amount": 30 }))
        } else {
            Outcome::Slow(Duration::from_secs(120), json!({ "done": true }))
        }
    })
    .await
}

/// Waits until `node` of `run_id` runs.
async fn running_in(client: &mut TestClient, run_id: &str, node: &str) -> Run {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let run = client.get(run_id).await;
        let running = run
            .nodes
            .iter()
            .any(|n| n.node_id == node && n.status() == NodeStatus::Running);
        if running {
            return run;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{node} never ran: {run:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn replay(
    server: &ServerProcess,
    run_id: &str,
    file: &std::path::Path,
    extra: &[&str],
) -> Finished {
    let file = file.to_string_lossy().into_owned();
    let mut args = vec!["workflow", "replay", run_id, "--file", &file, "-o", "json"];
    args.extend_from_slice(extra);
    cli(server, &args).await
}

fn verdict(outcome: &Finished) -> (String, Json) {
    let json = outcome.json();
    (
        json["verdict"].as_str().unwrap_or_default().to_owned(),
        json,
    )
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write");
    path
}

#[tokio::test]
async fn a_run_waiting_in_b_replays_against_each_kind_of_change() {
    let server = ServerProcess::start(&binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(V1).await;
    client.register(&ROUTED.replace("LIMIT", "10")).await;
    let _worker = worker(&server).await;
    let run_id = client.start("order", json!({ "customer": "c-1" })).await;
    let routed_id = client.start("routed", json!({})).await;
    running_in(&mut client, &run_id, "B").await;
    running_in(&mut client, &routed_id, "big").await;
    let dir = tempfile::tempdir().expect("temp dir");

    // its own definition: identical
    let same = replay(&server, &run_id, &write(&dir, "v1.yaml", V1), &[])
        .await
        .ok();
    assert_eq!(verdict(&same).0, "identical", "{}", same.stdout);

    // D appended after C: compatible, D named as not reached
    let appended = write(&dir, "d.yaml", &with_d_after_c());
    let (said, json) = verdict(&replay(&server, &run_id, &appended, &[]).await.ok());
    assert_eq!(said, "compatible", "{json}");
    assert_eq!(json["differences"][0]["kind"], "node_added", "{json}");
    assert_eq!(json["differences"][0]["node"], "D", "{json}");

    // B's task renamed: incompatible, exit 1, B named
    let renamed = replay(
        &server,
        &run_id,
        &write(&dir, "b.yaml", &with_b_renamed_task()),
        &[],
    )
    .await;
    assert_eq!(renamed.code, 1, "{renamed:#?}");
    let (said, json) = verdict(&renamed);
    assert_eq!(said, "incompatible");
    assert_eq!(json["divergence"]["rule"], "node_changed", "{json}");
    assert_eq!(json["divergence"]["node"], "B", "{json}");
    assert!(
        json["divergence"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("b_v2")),
        "{json}"
    );

    // B removed: incompatible as is, compatible mapped to B2
    let b2 = write(&dir, "b2.yaml", &with_b_as_b2());
    let unmapped = replay(&server, &run_id, &b2, &[]).await;
    assert_eq!(unmapped.code, 1, "{unmapped:#?}");
    assert_eq!(
        verdict(&unmapped).1["divergence"]["rule"],
        "waiting_node_removed"
    );
    let (said, json) = verdict(&replay(&server, &run_id, &b2, &["--map", "B=B2"]).await.ok());
    assert_eq!(said, "compatible", "{json}");
    assert_eq!(json["differences"][0]["kind"], "node_renamed", "{json}");

    // the SWITCH would now pick `small` for this run's A output
    let switched = write(&dir, "routed.yaml", &ROUTED.replace("LIMIT", "100"));
    let outcome = replay(&server, &routed_id, &switched, &[]).await;
    assert_eq!(outcome.code, 1, "{outcome:#?}");
    let (_, json) = verdict(&outcome);
    assert_eq!(json["divergence"]["rule"], "branch_changed", "{json}");
    assert_eq!(json["divergence"]["node"], "S", "{json}");

    // a registered version instead of a file
    client.register(&with_d_after_c()).await;
    let by_version = cli(
        &server,
        &[
            "workflow",
            "replay",
            &run_id,
            "--version",
            "2",
            "-o",
            "json",
        ],
    )
    .await
    .ok();
    assert_eq!(
        verdict(&by_version).0,
        "compatible",
        "{}",
        by_version.stdout
    );

    // offline: the history file replays to the same verdicts, no server
    let history = cli(&server, &["run", "history", &run_id, "-o", "json"])
        .await
        .ok();
    let file = write(&dir, "history.json", &history.stdout);
    if let Some(keep) = std::env::var_os("COMPOSER_WRITE_REPLAY_FIXTURE") {
        std::fs::write(keep, &history.stdout).expect("write the fixture");
    }
    let offline = |new: PathBuf| {
        let mut command = bare(&["workflow", "replay", "--history"]);
        command
            .arg(&file)
            .arg("--file")
            .arg(new)
            .args(["-o", "json"]);
        command
    };
    let (said, _) = verdict(&finish(offline(appended.clone()), None).await.ok());
    assert_eq!(said, "compatible");
    let offline_renamed = finish(offline(dir.path().join("b.yaml")), None).await;
    assert_eq!(offline_renamed.code, 1, "{offline_renamed:#?}");
}

#[tokio::test]
async fn the_recorded_fixture_replays_offline() {
    let history = fixtures().join("order-waiting-in-b.history.json");
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        (V1.to_owned(), "identical", 0),
        (with_d_after_c(), "compatible", 0),
        (with_b_renamed_task(), "incompatible", 1),
    ];
    for (definition, expected, code) in cases {
        let new = write(&dir, "new.yaml", &definition);
        let mut command = bare(&["workflow", "replay", "--history"]);
        command
            .arg(&history)
            .arg("--file")
            .arg(&new)
            .args(["-o", "json"]);
        let outcome = finish(command, None).await;
        assert_eq!(outcome.code, code, "{outcome:#?}");
        assert_eq!(verdict(&outcome).0, expected, "{}", outcome.stdout);
    }
    // the table says it too
    let new = write(&dir, "new.yaml", &with_b_renamed_task());
    let mut command = bare(&["workflow", "replay", "--history"]);
    command.arg(&history).arg("--file").arg(&new);
    let table = finish(command, None).await;
    assert!(table.stdout.contains("incompatible"), "{table:#?}");
    assert!(table.stdout.contains("node_changed"), "{table:#?}");
}

#[tokio::test]
async fn what_cannot_be_replayed_says_why() {
    let dir = tempfile::tempdir().expect("temp dir");
    let new = write(&dir, "new.yaml", V1);
    let history = fixtures().join("order-waiting-in-b.history.json");
    let run = |args: Vec<String>| {
        let mut command = bare(&["workflow", "replay"]);
        command.args(args);
        finish(command, None)
    };
    // not a history file: 4, naming what is missing
    let not_history = write(&dir, "other.json", r#"{"events": []}"#);
    let outcome = run(vec![
        "--history".into(),
        not_history.display().to_string(),
        "--file".into(),
        new.display().to_string(),
    ])
    .await;
    assert_eq!(outcome.code, 4, "{outcome:#?}");
    assert!(outcome.stderr.contains("\"run\""), "{outcome:#?}");
    // a history cut in the middle of its events: 4, naming the entry
    let mut json: Json =
        serde_json::from_str(&std::fs::read_to_string(&history).expect("read")).expect("json");
    if let Some(events) = json["events"].as_array_mut() {
        events.retain(|e| e["event_type"] != "node_started" || e["node_id"] != "A");
    }
    let cut = write(&dir, "cut.json", &json.to_string());
    let outcome = run(vec![
        "--history".into(),
        cut.display().to_string(),
        "--file".into(),
        new.display().to_string(),
    ])
    .await;
    assert_eq!(outcome.code, 4, "{outcome:#?}");
    assert!(outcome.stderr.contains("history entry"), "{outcome:#?}");
    // an invalid new definition: 13, as register would say
    let broken = write(
        &dir,
        "broken.yaml",
        "name: order\nnodes:\n  - { id: A, type: NOPE }\n",
    );
    let outcome = run(vec![
        "--history".into(),
        history.display().to_string(),
        "--file".into(),
        broken.display().to_string(),
    ])
    .await;
    assert_eq!(outcome.code, 13, "{outcome:#?}");
    // a bad mapping or neither source: usage, 2
    let outcome = run(vec![
        "--history".into(),
        history.display().to_string(),
        "--file".into(),
        new.display().to_string(),
        "--map".into(),
        "B".into(),
    ])
    .await;
    assert_eq!(outcome.code, 2, "{outcome:#?}");
    let outcome = run(vec!["--history".into(), history.display().to_string()]).await;
    assert_eq!(outcome.code, 2, "{outcome:#?}");
}
