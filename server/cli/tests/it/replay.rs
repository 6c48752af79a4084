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

const MIX: &str = r#"name: mix
nodes:
  - { id: A, type: TASK, queue: mix-a, task: a }
  - { id: S, type: SWITCH }
  - { id: B, type: TASK, queue: mix-rest, task: b }
  - { id: C, type: TASK, queue: mix-rest, task: c }
edges:
  - { from: A, to: S }
  - { from: S, to: B, when: "input.route == 'b'" }
  - { from: S, to: C }
"#;

/// Waits until every run in `ids` has left A.
async fn past_a(client: &mut TestClient, ids: &[String]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    for id in ids {
        loop {
            let run = client.get(id).await;
            let moved = run.nodes.iter().any(|n| {
                (n.node_id == "B" || n.node_id == "C") && n.status() == NodeStatus::Running
            });
            if moved {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{id} never left A");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The issue's measure: 1,000 runs in flight with a mix of verdicts, the
/// counts exact, replayed by the server a page at a time; the same few
/// runs replayed here and on the server agree.
#[tokio::test]
async fn workflow_check_counts_every_run_in_flight_by_verdict() {
    let server = ServerProcess::start(&binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(MIX).await;
    let worker = TestWorker::start(&server.url(), &["mix-a"], 4, 32, |_| {
        Outcome::Complete(json!({ "ok": true }))
    })
    .await;
    let mut passed = Vec::new();
    for i in 0..600 {
        let route = if i % 2 == 0 { "b" } else { "c" };
        passed.push(client.start("mix", json!({ "route": route })).await);
    }
    past_a(&mut client, &passed).await;
    drop(worker);
    // 400 more wait in A: no worker serves its queue now
    for _ in 0..400 {
        client.start("mix", json!({ "route": "b" })).await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // B's task renamed: 300 in B incompatible, 300 past C (B skipped)
    // identical, 400 in A (B not reached, changed) compatible
    let v2 = write(
        &dir,
        "mix-v2.yaml",
        &MIX.replace("task: b }", "task: b_v2 }"),
    );
    let file = v2.display().to_string();
    let outcome = cli(
        &server,
        &["workflow", "check", "mix", "--file", &file, "-o", "json"],
    )
    .await;
    assert_eq!(outcome.code, 1, "{}", outcome.stderr);
    let json = outcome.json();
    assert_eq!(json["replayed_by"], "server", "{json}");
    assert_eq!(
        json["in_flight"],
        json!({ "checked": 1000, "identical": 300, "compatible": 400, "incompatible": 300, "unreplayable": 0 }),
    );
    let runs = json["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 700);
    let incompatible: Vec<&Json> = runs
        .iter()
        .filter(|r| r["verdict"] == "REPLAY_VERDICT_INCOMPATIBLE")
        .collect();
    assert_eq!(incompatible.len(), 300);
    assert!(
        incompatible
            .iter()
            .all(|r| r["divergence"]["rule"] == "node_changed" && r["divergence"]["node_id"] == "B"),
        "{incompatible:?}"
    );
    // the table says it too
    let table = cli(&server, &["workflow", "check", "mix", "--file", &file]).await;
    assert_eq!(table.code, 1);
    assert!(table.stdout.contains("in flight"), "{}", table.stdout);
    assert!(table.stdout.contains("node_changed"), "{}", table.stdout);

    // a change no run in flight meets: exit 0; completed runs checked too
    let harmless = write(
        &dir,
        "mix-v3.yaml",
        &MIX.replace("task: c }", "task: c, retry: { max_attempts: 4 } }"),
    );
    let outcome = cli(
        &server,
        &[
            "workflow",
            "check",
            "mix",
            "--file",
            &harmless.display().to_string(),
            "--completed",
            "5",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(outcome.code, 0, "{outcome:#?}");
    assert_eq!(outcome.json()["completed"]["checked"], 0);
}

#[tokio::test]
async fn a_few_runs_are_checked_here_and_agree_with_the_server() {
    let server = ServerProcess::start(&binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(V1).await;
    let _worker = worker(&server).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(client.start("order", json!({ "i": i })).await);
    }
    for id in &ids {
        running_in(&mut client, id, "B").await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let renamed = write(&dir, "b.yaml", &with_b_renamed_task())
        .display()
        .to_string();
    let here = cli(
        &server,
        &[
            "workflow", "check", "order", "--file", &renamed, "-o", "json",
        ],
    )
    .await;
    let there = cli(
        &server,
        &[
            "workflow",
            "check",
            "order",
            "--file",
            &renamed,
            "--on-server",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!((here.code, there.code), (1, 1), "{here:#?}\n{there:#?}");
    let (here, there) = (here.json(), there.json());
    assert_eq!(here["replayed_by"], "here");
    assert_eq!(there["replayed_by"], "server");
    assert_eq!(here["in_flight"], there["in_flight"]);
    assert_eq!(here["in_flight"]["incompatible"], 3, "{here}");
    let rules = |json: &Json| -> Vec<String> {
        let mut rules: Vec<String> = json["runs"]
            .as_array()
            .map(|runs| {
                runs.iter()
                    .map(|r| format!("{}", r["divergence"]))
                    .collect()
            })
            .unwrap_or_default();
        rules.sort();
        rules
    };
    assert_eq!(rules(&here), rules(&there));
    // the same through ReplayRun, by id and by a history given whole
    let by_version = cli(
        &server,
        &["workflow", "check", "order", "--version", "1", "-o", "json"],
    )
    .await
    .ok();
    assert_eq!(by_version.json()["in_flight"]["identical"], 3);
}

mod rpc {
    //! ReplayRun and CheckWorkflowVersion called as an SDK calls them:
    //! tokens, namespaces, a history given whole, and every bad field named.

    use composer_proto::v1::{
        CheckWorkflowVersionRequest, CompleteTaskRequest, GetRunHistoryRequest, GetRunRequest,
        GetWorkflowRequest, PollTasksRequest, RecordedRun, ReplayRunRequest, ReplayVerdict,
        StartRunRequest, replay_run_request::Recorded, run_service_client::RunServiceClient,
        worker_service_client::WorkerServiceClient, workflow_service_client::WorkflowServiceClient,
    };
    use composer_testkit::ServerProcess;
    use serde_json::json;
    use tonic::{Code, transport::Channel};

    use super::{V1, with_b_renamed_task, with_d_after_c};
    use crate::common::{
        TOKEN_ARGS, authed, channel, cli::binary, register, token, violated_field,
    };

    fn replay(run_id: &str, source: &str) -> ReplayRunRequest {
        ReplayRunRequest {
            recorded: Some(Recorded::RunId(run_id.to_owned())),
            source: source.to_owned(),
            ..ReplayRunRequest::default()
        }
    }

    /// A run of V1 in `admin`'s namespace whose A completed: it waits in B.
    async fn run_in_b(channel: &Channel, admin: &str, worker: &str) -> String {
        let run_id = RunServiceClient::new(channel.clone())
            .start_run(authed(
                StartRunRequest {
                    workflow_name: "order".to_owned(),
                    ..StartRunRequest::default()
                },
                admin,
            ))
            .await
            .expect("start")
            .into_inner()
            .run
            .expect("run")
            .run_id;
        let mut workers = WorkerServiceClient::new(channel.clone());
        let task = loop {
            let tasks = workers
                .poll_tasks(authed(
                    PollTasksRequest {
                        worker_id: "w".to_owned(),
                        queues: vec!["replay".to_owned()],
                        max_tasks: 1,
                        wait: Some(prost_types::Duration {
                            seconds: 5,
                            nanos: 0,
                        }),
                        confirm_receipt: false,
                    },
                    worker,
                ))
                .await
                .expect("poll")
                .into_inner()
                .tasks;
            if let Some(task) = tasks.into_iter().next() {
                break task;
            }
        };
        workers
            .complete_task(authed(
                CompleteTaskRequest {
                    task_id: task.task_id,
                    attempt: task.attempt,
                    lease_token: task.lease_token,
                    output: Some(composer_grpc::convert::from_json(&json!({ "amount": 30 }))),
                },
                worker,
            ))
            .await
            .expect("complete");
        run_id
    }

    #[tokio::test]
    async fn replay_run_by_id_or_given_whole_stays_in_its_namespace_and_names_bad_fields() {
        let server = ServerProcess::start(&binary(), &TOKEN_ARGS).await;
        let channel = channel(&server).await;
        let admin = token("team-a", "alice", &["admin"]);
        let reader = token("team-a", "rita", &["reader"]);
        let worker = token("team-a", "w", &["worker"]);
        let other = token("team-b", "bob", &["admin"]);
        register(&channel, &admin, V1).await;
        let run_id = run_in_b(&channel, &admin, &worker).await;
        let mut workflows = WorkflowServiceClient::new(channel.clone());

        // a reader replays by id: B's task renamed is incompatible
        let replay_of = |request, token: &str| authed(request, token);
        let answer = workflows
            .replay_run(replay_of(replay(&run_id, &with_b_renamed_task()), &reader))
            .await
            .expect("replay")
            .into_inner()
            .replay
            .expect("replay");
        assert_eq!(answer.verdict(), ReplayVerdict::Incompatible, "{answer:?}");
        let divergence = answer.divergence.expect("divergence");
        assert_eq!(
            (divergence.rule.as_str(), divergence.node_id.as_str()),
            ("node_changed", "B")
        );
        // its own registered version: identical
        let mut by_version = replay(&run_id, "");
        by_version.version = 1;
        let answer = workflows
            .replay_run(replay_of(by_version, &reader))
            .await
            .expect("replay")
            .into_inner()
            .replay
            .expect("replay");
        assert_eq!(answer.verdict(), ReplayVerdict::Identical, "{answer:?}");

        // another namespace does not see the run
        let refused = workflows
            .replay_run(replay_of(replay(&run_id, V1), &other))
            .await
            .expect_err("not its run");
        assert_eq!(refused.code(), Code::NotFound, "{refused:?}");

        // given whole, the history replays for anyone: nothing is read
        let mut runs = RunServiceClient::new(channel.clone());
        let run = runs
            .get_run(authed(
                GetRunRequest {
                    run_id: run_id.clone(),
                    skip_nodes: false,
                },
                &reader,
            ))
            .await
            .expect("run")
            .into_inner()
            .run;
        let events = runs
            .get_run_history(authed(
                GetRunHistoryRequest {
                    run_id: run_id.clone(),
                    page_size: 1000,
                    page_token: String::new(),
                },
                &reader,
            ))
            .await
            .expect("history")
            .into_inner()
            .events;
        let definition = workflows
            .get_workflow(authed(
                GetWorkflowRequest {
                    name: "order".to_owned(),
                    version: 1,
                },
                &reader,
            ))
            .await
            .expect("workflow")
            .into_inner()
            .workflow;
        let given = ReplayRunRequest {
            recorded: Some(Recorded::History(RecordedRun {
                run,
                workflow: definition,
                events,
            })),
            source: with_d_after_c(),
            ..ReplayRunRequest::default()
        };
        let answer = workflows
            .replay_run(replay_of(given.clone(), &other))
            .await
            .expect("replay given whole")
            .into_inner()
            .replay
            .expect("replay");
        assert_eq!(answer.verdict(), ReplayVerdict::Compatible, "{answer:?}");
        assert_eq!(answer.differences[0].node_id, "D");
        // cut short, it is unreplayable, not an error
        let mut cut = given.clone();
        if let Some(Recorded::History(history)) = &mut cut.recorded {
            history
                .events
                .retain(|e| !(e.event_type == "node_started" && e.node_id == "A"));
        }
        let answer = workflows
            .replay_run(replay_of(cut, &other))
            .await
            .expect("replay")
            .into_inner()
            .replay
            .expect("replay");
        assert_eq!(answer.verdict(), ReplayVerdict::Unreplayable, "{answer:?}");
        assert!(!answer.unreplayable_reason.is_empty());

        // every bad field is named
        let mut mapped = replay(&run_id, V1);
        mapped
            .node_mapping
            .insert("B".to_owned(), "no spaces allowed".to_owned());
        let mut negative = replay(&run_id, "");
        negative.version = -1;
        let cases: Vec<(ReplayRunRequest, &str)> = vec![
            (replay(&run_id, ""), "source"),
            (negative, "version"),
            (
                replay(&run_id, "name: order\nnodes:\n  - { id: A, type: NOPE }\n"),
                "nodes[0].type",
            ),
            (
                replay(&run_id, &V1.replace("name: order", "name: other")),
                "source",
            ),
            (mapped, "node_mapping"),
            (
                ReplayRunRequest {
                    source: V1.to_owned(),
                    ..ReplayRunRequest::default()
                },
                "run_id",
            ),
        ];
        for (request, field) in cases {
            let refused = workflows
                .replay_run(replay_of(request, &reader))
                .await
                .expect_err("refused");
            assert_eq!(
                refused.code(),
                Code::InvalidArgument,
                "{field}: {refused:?}"
            );
            assert_eq!(violated_field(&refused), field, "{refused:?}");
        }

        // CheckWorkflowVersion: only this namespace's runs, bad fields named
        let check = |request: CheckWorkflowVersionRequest, token: &str| authed(request, token);
        let request = CheckWorkflowVersionRequest {
            name: "order".to_owned(),
            source: with_b_renamed_task(),
            ..CheckWorkflowVersionRequest::default()
        };
        let mine = workflows
            .check_workflow_version(check(request.clone(), &reader))
            .await
            .expect("check")
            .into_inner();
        assert_eq!((mine.checked, mine.incompatible), (1, 1), "{mine:?}");
        register(&channel, &other, V1).await;
        let theirs = workflows
            .check_workflow_version(check(request.clone(), &other))
            .await
            .expect("check")
            .into_inner();
        assert_eq!(theirs.checked, 0, "{theirs:?}");
        let bad: Vec<(CheckWorkflowVersionRequest, &str)> = vec![
            (
                CheckWorkflowVersionRequest {
                    name: String::new(),
                    ..request.clone()
                },
                "name",
            ),
            (
                CheckWorkflowVersionRequest {
                    page_size: -1,
                    ..request.clone()
                },
                "page_size",
            ),
            (
                CheckWorkflowVersionRequest {
                    scope: 99,
                    ..request.clone()
                },
                "scope",
            ),
            (
                CheckWorkflowVersionRequest {
                    page_token: "nope".into(),
                    ..request.clone()
                },
                "page_token",
            ),
            (
                CheckWorkflowVersionRequest {
                    source: String::new(),
                    ..request.clone()
                },
                "source",
            ),
        ];
        for (request, field) in bad {
            let refused = workflows
                .check_workflow_version(check(request, &reader))
                .await
                .expect_err("refused");
            assert_eq!(violated_field(&refused), field, "{refused:?}");
        }
    }
}
