//! Durable execution end to end: the real binary, real Postgres and Redis,
//! and a Rust test worker speaking the gRPC worker protocol.

use std::{path::PathBuf, time::Duration};

use composer_proto::v1::RunStatus;
use composer_testkit::{
    ServerProcess,
    client::{TestClient, output_of},
    worker::{Outcome, TestWorker},
};
use serde_json::json;

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

const WAIT: Duration = Duration::from_secs(60);

/// The real server (no tokens) and a client connected to it.
/// Every run of the namespace (up to 1,000), newest first.
async fn all_runs(client: &mut TestClient) -> Vec<composer_proto::v1::Run> {
    client
        .runs
        .list_runs(composer_proto::v1::ListRunsRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .runs
}

async fn server_and_client() -> (ServerProcess, TestClient) {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let client = TestClient::connect(&server.url()).await;
    (server, client)
}

const THREE_STEPS: &str = r#"
name: three_steps
nodes:
  - { id: a, type: TASK, queue: q3, task: add, input: { n: "${input.n}" } }
  - { id: b, type: TASK, queue: q3, task: add, input: { n: "${nodes.a.output.n}" } }
  - { id: c, type: TASK, queue: q3, task: add, input: { n: "${nodes.b.output.n}" } }
edges:
  - { from: a, to: b }
  - { from: b, to: c }
output: { total: "${nodes.c.output.n}" }
"#;

fn add_one(input: &serde_json::Value) -> Outcome {
    Outcome::Complete(json!({"n": input["n"].as_i64().unwrap_or(0) + 1}))
}

#[tokio::test]
async fn a_three_step_run_completes_with_outputs_flowing_from_step_to_step() {
    let (server, mut client) = server_and_client().await;
    client.register(THREE_STEPS).await;
    let worker = TestWorker::start(&server.url(), &["q3"], 1, 1, |task| add_one(&task.input)).await;

    let run_id = client.start("three_steps", json!({"n": 40})).await;
    let run = client.wait_done(&run_id, WAIT).await;

    assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
    assert_eq!(output_of(&run), json!({"total": 43}));
    let leases = worker.leases();
    let nodes: Vec<&str> = leases.iter().map(|l| l.node_id.as_str()).collect();
    assert_eq!(nodes, ["a", "b", "c"]);
    assert!(leases.iter().all(|l| l.attempt == 1));
    assert_eq!(run.nodes.len(), 3);
    assert!(
        run.nodes.iter().all(|n| n.node_type == "TASK"),
        "{:?}",
        run.nodes
    );
    let summary = client
        .runs
        .get_run(composer_proto::v1::GetRunRequest {
            run_id: run_id.clone(),
            skip_nodes: true,
        })
        .await
        .expect("get without nodes")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(summary.status(), RunStatus::Completed);
    assert_eq!(output_of(&summary), json!({"total": 43}));
    assert!(summary.nodes.is_empty(), "{:?}", summary.nodes);
}

fn task_name_output(task: &composer_testkit::worker::LeaseRecord) -> Outcome {
    Outcome::Complete(json!({"task": task.task_name}))
}

#[tokio::test]
async fn fork_join_and_a_switch_whose_skipped_branch_joins_later() {
    let (server, mut client) = server_and_client().await;
    client
        .register(
            r#"
name: branching
nodes:
  - { id: start, type: FORK }
  - { id: left, type: TASK, queue: qb, task: left }
  - { id: right, type: TASK, queue: qb, task: right }
  - { id: both, type: JOIN }
  - { id: route, type: SWITCH }
  - { id: big, type: TASK, queue: qb, task: big }
  - { id: small, type: TASK, queue: qb, task: small }
  - { id: merge, type: JOIN }
edges:
  - { from: start, to: left }
  - { from: start, to: right }
  - { from: left, to: both }
  - { from: right, to: both }
  - { from: both, to: route }
  - { from: route, to: big, when: "input.n > 10" }
  - { from: route, to: small }
  - { from: big, to: merge }
  - { from: small, to: merge }
output: { joined: "${nodes.both.output}", merged: "${nodes.merge.output}" }
"#,
        )
        .await;
    let worker = TestWorker::start(&server.url(), &["qb"], 2, 4, task_name_output).await;

    let run_id = client.start("branching", json!({"n": 1})).await;
    let run = client.wait_done(&run_id, WAIT).await;

    assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
    assert_eq!(
        output_of(&run),
        json!({
            "joined": {"left": {"task": "left"}, "right": {"task": "right"}},
            "merged": {"small": {"task": "small"}},
        })
    );
    let big = run
        .nodes
        .iter()
        .find(|n| n.node_id == "big")
        .expect("big has a state");
    assert_eq!(big.status(), composer_proto::v1::NodeStatus::Skipped);
    // a JOIN shows the output expressions read from it
    let both = run
        .nodes
        .iter()
        .find(|n| n.node_id == "both")
        .expect("both");
    assert_eq!(
        composer_testkit::worker::json_of(both.output.clone().expect("JOIN output")),
        json!({"left": {"task": "left"}, "right": {"task": "right"}})
    );
    let mut names: Vec<String> = worker.leases().into_iter().map(|l| l.task_name).collect();
    names.sort();
    assert_eq!(names, ["left", "right", "small"]);
}

#[tokio::test]
async fn map_over_100_items_runs_at_most_10_at_once_and_keeps_order() {
    let (server, mut client) = server_and_client().await;
    client
        .register(
            r#"
name: doubling
nodes:
  - id: each
    type: MAP
    items: input.items
    concurrency: 10
    queue: qm
    task: double
    input: { n: "${item}", at: "${index}" }
output: { doubled: "${nodes.each.output}" }
"#,
        )
        .await;
    let worker = TestWorker::start(&server.url(), &["qm"], 4, 25, |task| {
        let n = task.input["n"].as_i64().unwrap_or_default();
        Outcome::Slow(Duration::from_millis(50), json!(n * 2))
    })
    .await;

    let items: Vec<i64> = (0..100).collect();
    let run_id = client.start("doubling", json!({ "items": items })).await;
    let run = client.wait_done(&run_id, WAIT).await;

    assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
    let expected: Vec<i64> = (0..100).map(|n| n * 2).collect();
    assert_eq!(output_of(&run), json!({ "doubled": expected }));
    let each = run
        .nodes
        .iter()
        .find(|n| n.node_id == "each")
        .expect("each");
    assert_eq!(
        composer_testkit::worker::json_of(each.output.clone().expect("MAP output")),
        json!(expected),
        "a MAP shows its elements' outputs"
    );
    assert_eq!(worker.leases().len(), 100);
    assert!(worker.max_active() <= 10, "{} at once", worker.max_active());
    assert!(worker.max_active() > 1, "elements ran in parallel");
}

const WAITS: &str = r#"
name: waits
nodes:
  - { id: nap, type: WAIT, duration: 300ms }
  - { id: approval, type: WAIT_FOR_EVENT, event: approve, timeout: 30s }
edges:
  - { from: nap, to: approval }
output: { ok: "${nodes.approval.output.ok}" }
"#;

async fn send(
    client: &mut TestClient,
    run_id: &str,
    payload: serde_json::Value,
) -> composer_proto::v1::SendEventResponse {
    use composer_proto::v1::{SendEventRequest, send_event_request::Target};
    client
        .runs
        .send_event(SendEventRequest {
            target: Some(Target::RunId(run_id.to_owned())),
            event_name: "approve".to_owned(),
            payload: Some(composer_testkit::worker::value_of(&payload)),
            request_id: String::new(),
        })
        .await
        .expect("send the event")
        .into_inner()
}

#[tokio::test]
async fn a_request_id_names_one_send_and_is_refused_for_another_target() {
    use composer_proto::v1::{SendEventRequest, send_event_request::Target};
    let (_server, mut client) = server_and_client().await;
    client.register(WAITS).await;
    let first = client.start("waits", json!({})).await;
    let second = client.start("waits", json!({})).await;
    let request = |run_id: &str| SendEventRequest {
        target: Some(Target::RunId(run_id.to_owned())),
        event_name: "approve".to_owned(),
        payload: Some(composer_testkit::worker::value_of(&json!({"ok": run_id}))),
        request_id: "r-1".to_owned(),
    };
    let sent = client
        .runs
        .send_event(request(&first))
        .await
        .expect("first send")
        .into_inner();
    let repeated = client
        .runs
        .send_event(request(&first))
        .await
        .expect("the same send again")
        .into_inner();
    assert_eq!(sent, repeated, "a repeat answers as the first did");
    let reused = client
        .runs
        .send_event(request(&second))
        .await
        .expect_err("the id was used for another run");
    assert_eq!(reused.code(), tonic::Code::InvalidArgument, "{reused:?}");
    assert!(reused.message().contains("request_id"), "{reused:?}");
    let run = client.wait_done(&first, WAIT).await;
    assert_eq!(output_of(&run), json!({"ok": first}));
    // the second run did not take the first one's event
    let mut fresh = request(&second);
    fresh.request_id = "r-2".to_owned();
    client.runs.send_event(fresh).await.expect("its own send");
    let run = client.wait_done(&second, WAIT).await;
    assert_eq!(output_of(&run), json!({"ok": second}));
}

#[tokio::test]
async fn wait_fires_and_an_event_is_consumed_whether_sent_before_or_after_the_wait() {
    let (_server, mut client) = server_and_client().await;
    client.register(WAITS).await;

    // before: sent during the 300ms WAIT, kept, consumed when the wait is reached
    let early = client.start("waits", json!({})).await;
    let sent = send(&mut client, &early, json!({"ok": "early"})).await;
    assert!(sent.stored && sent.delivered_run_ids.is_empty(), "{sent:?}");
    let run = client.wait_done(&early, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
    assert_eq!(output_of(&run), json!({"ok": "early"}));

    // after: the run waits, then the event arrives
    let late = client.start("waits", json!({})).await;
    loop {
        let run = client.get(&late).await;
        let waiting = run.nodes.iter().any(|n| {
            n.node_id == "approval" && n.status() == composer_proto::v1::NodeStatus::Waiting
        });
        if waiting {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = send(&mut client, &late, json!({"ok": "late"})).await;
    assert_eq!(sent.delivered_run_ids, vec![late.clone()]);
    let run = client.wait_done(&late, WAIT).await;
    assert_eq!(output_of(&run), json!({"ok": "late"}));
}

#[tokio::test]
async fn an_event_wait_times_out_and_fails_the_run() {
    let (_server, mut client) = server_and_client().await;
    client
        .register(
            "name: impatient\nnodes:\n  - { id: approval, type: WAIT_FOR_EVENT, event: approve, timeout: 400ms }\n",
        )
        .await;
    let run_id = client.start("impatient", json!({})).await;
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Failed, "{run:#?}");
    assert_eq!(run.error.expect("error").code, "TIMEOUT");
}

#[tokio::test]
async fn retries_back_off_then_succeed_and_a_non_retryable_failure_fails_the_run() {
    let (server, mut client) = server_and_client().await;
    client
        .register(
            r#"
name: flaky
nodes:
  - id: call
    type: TASK
    queue: qr
    task: flaky
    retry: { max_attempts: 3, initial_interval: 200ms, backoff: 2.0 }
output: { got: "${nodes.call.output}" }
"#,
        )
        .await;
    let worker = TestWorker::start(&server.url(), &["qr"], 1, 1, |task| {
        match (task.input["fatal"].as_bool(), task.attempt) {
            (Some(true), _) => Outcome::Fail {
                code: "BAD_CARD".to_owned(),
                retryable: false,
            },
            (_, attempt) if attempt < 3 => Outcome::Fail {
                code: "FLAKY".to_owned(),
                retryable: true,
            },
            _ => Outcome::Complete(json!("third time lucky")),
        }
    })
    .await;

    let flaky = client.start("flaky", json!({})).await;
    let run = client.wait_done(&flaky, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
    assert_eq!(output_of(&run), json!({"got": "third time lucky"}));
    let attempts: Vec<i32> = worker.leases().iter().map(|l| l.attempt).collect();
    assert_eq!(attempts, [1, 2, 3]);
    let history = client.history(&flaky).await;
    assert_eq!(
        history
            .iter()
            .filter(|e| e.event_type == "retry_scheduled")
            .count(),
        2,
        "two durable back-off timers"
    );

    let fatal = client.start("flaky", json!({"fatal": true})).await;
    let run = client.wait_done(&fatal, WAIT).await;
    assert_eq!(run.status(), RunStatus::Failed);
    let error = run.error.expect("error");
    assert_eq!(error.code, "BAD_CARD");
    assert_eq!(error.node_id, "call", "the run's failure names its node");
    let fatal_attempts = worker
        .leases()
        .iter()
        .filter(|l| l.input["fatal"] == json!(true))
        .count();
    assert_eq!(fatal_attempts, 1, "no retry after a non-retryable failure");
}

#[tokio::test]
async fn an_error_edge_catches_a_failure_and_compensation_runs_in_reverse_order() {
    let (server, mut client) = server_and_client().await;
    client
        .register(
            r#"
name: caught
nodes:
  - { id: risky, type: TASK, queue: qe, task: fail, retry: { max_attempts: 1 } }
  - { id: fallback, type: TASK, queue: qe, task: fallback }
edges:
  - { from: risky, to: fallback, on: error, when: "nodes.risky.error.code == 'NOPE'" }
output: { via: "${nodes.fallback.output.task}" }
"#,
        )
        .await;
    client
        .register(
            r#"
name: saga
nodes:
  - { id: charge, type: TASK, queue: qe, task: charge, compensate: refund }
  - { id: reserve, type: TASK, queue: qe, task: reserve, compensate: release }
  - { id: ship, type: TASK, queue: qe, task: fail, retry: { max_attempts: 1 } }
  - { id: refund, type: TASK, queue: qe, task: refund }
  - { id: release, type: TASK, queue: qe, task: release }
edges:
  - { from: charge, to: reserve }
  - { from: reserve, to: ship }
"#,
        )
        .await;
    let worker = TestWorker::start(&server.url(), &["qe"], 1, 1, |task| {
        if task.task_name == "fail" {
            Outcome::Fail {
                code: "NOPE".to_owned(),
                retryable: true,
            }
        } else {
            task_name_output(task)
        }
    })
    .await;

    let caught = client.start("caught", json!({})).await;
    let run = client.wait_done(&caught, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
    assert_eq!(output_of(&run), json!({"via": "fallback"}));

    let saga = client.start("saga", json!({})).await;
    let run = client.wait_done(&saga, WAIT).await;
    assert_eq!(run.status(), RunStatus::Failed, "{run:#?}");
    assert_eq!(run.error.expect("the original error").code, "NOPE");
    let order: Vec<String> = worker
        .leases()
        .into_iter()
        .map(|l| l.task_name)
        .filter(|n| ["charge", "reserve", "fail", "release", "refund"].contains(&n.as_str()))
        .collect();
    assert_eq!(
        order[order.len() - 2..],
        ["release".to_owned(), "refund".to_owned()],
        "{order:?}"
    );
}

#[tokio::test]
async fn starting_twice_with_one_idempotency_key_makes_one_run() {
    let (_server, mut client) = server_and_client().await;
    client.register(THREE_STEPS).await;
    let (first, created_first) = client
        .start_with_key("three_steps", json!({"n": 1}), "order-7")
        .await;
    let (second, created_second) = client
        .start_with_key("three_steps", json!({"n": 1}), "order-7")
        .await;
    assert_eq!(first, second);
    assert!(created_first && !created_second);
    let listed = client
        .runs
        .list_runs(composer_proto::v1::ListRunsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.runs.len(), 1);
}

#[tokio::test]
async fn a_start_without_a_version_takes_the_latest_even_one_registered_through_another_server() {
    // each server caches "the latest version" for StartRun; the insert
    // checks it, so a version registered elsewhere is used at once
    let database_url = composer_testkit::fresh_database().await;
    let redis_url = composer_testkit::fresh_redis_url();
    let first_server =
        ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let second_server =
        ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let mut first = TestClient::connect(&first_server.url()).await;
    let mut second = TestClient::connect(&second_server.url()).await;
    let v1 = first.register(THREE_STEPS).await;
    let on_v1 = second.start("three_steps", json!({"n": 1})).await;
    let v2 = first
        .register(&THREE_STEPS.replace("name: three_steps", "name: three_steps\ndescription: v2"))
        .await;
    assert_eq!((v1, v2), (1, 2));
    let on_v2 = second.start("three_steps", json!({"n": 1})).await;
    assert_eq!(second.get(&on_v1).await.workflow_version, 1);
    assert_eq!(second.get(&on_v2).await.workflow_version, 2);
}

#[tokio::test]
async fn oversized_input_is_refused_naming_the_limit_and_nothing_is_stored() {
    let server = ServerProcess::start(&composer_binary(), &["--max-payload-bytes", "1000"]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(THREE_STEPS).await;
    let big = "x".repeat(2000);
    let refused = client
        .runs
        .start_run(composer_proto::v1::StartRunRequest {
            workflow_name: "three_steps".to_owned(),
            input: Some(composer_testkit::worker::value_of(
                &json!({"n": 1, "pad": big}),
            )),
            ..Default::default()
        })
        .await
        .expect_err("too big");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(refused.message().contains("1000"), "{}", refused.message());
    assert!(refused.message().contains("input"), "{}", refused.message());
    let listed = client
        .runs
        .list_runs(composer_proto::v1::ListRunsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert!(listed.runs.is_empty(), "nothing stored");
}

async fn worker_client(
    url: &str,
) -> composer_proto::v1::worker_service_client::WorkerServiceClient<tonic::transport::Channel> {
    composer_proto::v1::worker_service_client::WorkerServiceClient::connect(url.to_owned())
        .await
        .expect("connect")
}

async fn poll_one(
    worker: &mut composer_proto::v1::worker_service_client::WorkerServiceClient<
        tonic::transport::Channel,
    >,
    id: &str,
    queue: &str,
    wait_secs: i64,
) -> Vec<composer_proto::v1::Task> {
    worker
        .poll_tasks(composer_proto::v1::PollTasksRequest {
            confirm_receipt: false,
            worker_id: id.to_owned(),
            queues: vec![queue.to_owned()],
            max_tasks: 1,
            wait: Some(prost_types::Duration {
                seconds: wait_secs,
                nanos: 0,
            }),
        })
        .await
        .expect("poll")
        .into_inner()
        .tasks
}

#[tokio::test]
async fn a_silent_worker_loses_its_lease_the_task_runs_again_and_its_late_report_is_refused() {
    use composer_proto::v1::CompleteTaskRequest;
    use tonic_types::StatusExt;
    let (server, mut client) = server_and_client().await;
    client
        .register("name: leased\nnodes:\n  - { id: only, type: TASK, queue: ql, task: t, heartbeat_timeout: 1s }\noutput: { by: \"${nodes.only.output}\" }\n")
        .await;
    let run_id = client.start("leased", json!({})).await;
    let mut first = worker_client(&server.url()).await;
    let mut second = worker_client(&server.url()).await;

    let lost = poll_one(&mut first, "first", "ql", 10)
        .await
        .pop()
        .expect("attempt 1 leased");
    assert_eq!(lost.attempt, 1);
    // no heartbeat: the lease (1s) expires and the task comes back as attempt 2
    let retried = poll_one(&mut second, "second", "ql", 20)
        .await
        .pop()
        .expect("attempt 2 leased");
    assert_eq!(
        (retried.task_id.as_str(), retried.attempt),
        (lost.task_id.as_str(), 2)
    );
    second
        .complete_task(CompleteTaskRequest {
            task_id: retried.task_id.clone(),
            attempt: retried.attempt,
            lease_token: retried.lease_token.clone(),
            output: Some(composer_testkit::worker::value_of(&json!("second"))),
        })
        .await
        .expect("attempt 2 reports");

    let late = first
        .complete_task(CompleteTaskRequest {
            task_id: lost.task_id.clone(),
            attempt: lost.attempt,
            lease_token: lost.lease_token.clone(),
            output: Some(composer_testkit::worker::value_of(&json!("first"))),
        })
        .await
        .expect_err("the late report is refused");
    assert_eq!(late.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        late.get_details_error_info().map(|i| i.reason),
        Some("LEASE_LOST".to_owned())
    );

    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(
        output_of(&run),
        json!({"by": "second"}),
        "the late report changed nothing"
    );
    let history = client.history(&run_id).await;
    assert_eq!(
        history
            .iter()
            .filter(|e| e.event_type == "node_completed")
            .count(),
        1
    );

    // a repeat of the applied report is OK and changes nothing
    second
        .complete_task(CompleteTaskRequest {
            task_id: retried.task_id.clone(),
            attempt: retried.attempt,
            lease_token: retried.lease_token.clone(),
            output: Some(composer_testkit::worker::value_of(&json!("second"))),
        })
        .await
        .expect("a repeated report is OK");
    assert_eq!(client.history(&run_id).await.len(), history.len());
}

#[tokio::test]
async fn a_report_to_another_server_than_the_lease_s_applies_once_and_a_repeat_anywhere_is_ok() {
    // the leasing server reports in one statement (it knows the task's
    // node); any other server takes the two-statement path: same answers
    use composer_proto::v1::CompleteTaskRequest;
    let database_url = composer_testkit::fresh_database().await;
    let redis_url = composer_testkit::fresh_redis_url();
    let leasing =
        ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let other = ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let mut client = TestClient::connect(&leasing.url()).await;
    client.register(THREE_STEPS).await;
    let run_id = client.start("three_steps", json!({"n": 1})).await;
    let mut on_leasing = worker_client(&leasing.url()).await;
    let mut on_other = worker_client(&other.url()).await;
    let mut finished = Vec::new();
    for step in 0..3 {
        let task = poll_one(&mut on_leasing, "w", "q3", 10)
            .await
            .pop()
            .expect("a task");
        let input = composer_testkit::worker::json_of(task.input.clone().unwrap_or_default());
        let report = CompleteTaskRequest {
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            lease_token: task.lease_token.clone(),
            output: Some(composer_testkit::worker::value_of(
                &json!({"n": input["n"].as_i64().unwrap_or(0) + 1}),
            )),
        };
        // alternate: the first report goes to the other server or here
        let (first, second) = if step % 2 == 0 {
            (&mut on_other, &mut on_leasing)
        } else {
            (&mut on_leasing, &mut on_other)
        };
        first.complete_task(report.clone()).await.expect("applied");
        second.complete_task(report).await.expect("a repeat is OK");
        finished.push(task.node_id);
    }
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(output_of(&run), json!({"total": 4}));
    assert_eq!(finished, ["a", "b", "c"]);
    let completions = client
        .history(&run_id)
        .await
        .iter()
        .filter(|e| e.event_type == "node_completed")
        .count();
    assert_eq!(completions, 3, "each step applied once");
}

#[tokio::test]
async fn three_hundred_waits_on_two_servers_each_fire_exactly_once() {
    // timers fire in batches, one transaction per batch, on every server;
    // a run another server is firing is skipped, never fired twice
    let database_url = composer_testkit::fresh_database().await;
    let redis_url = composer_testkit::fresh_redis_url();
    let first = ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let second =
        ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let mut client = TestClient::connect(&first.url()).await;
    client
        .register("name: nap\nnodes:\n  - { id: w, type: WAIT, duration: 1s }\n  - { id: after, type: WAIT, duration: 1ms }\nedges:\n  - { from: w, to: after }\n")
        .await;
    let mut runs = Vec::new();
    for _ in 0..300 {
        runs.push(client.start("nap", json!({})).await);
    }
    let mut watcher = TestClient::connect(&second.url()).await;
    for run_id in &runs {
        let run = watcher.wait_done(run_id, WAIT).await;
        assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
        let fired = watcher
            .history(run_id)
            .await
            .iter()
            .filter(|e| e.event_type == "wait_elapsed")
            .count();
        assert_eq!(fired, 2, "each of the run's two waits fired once");
    }
}

#[tokio::test]
async fn two_pollers_racing_for_one_task_get_exactly_one_lease() {
    let (server, mut client) = server_and_client().await;
    client
        .register("name: single\nnodes:\n  - { id: only, type: TASK, queue: qx, task: t }\n")
        .await;
    let mut a = worker_client(&server.url()).await;
    let mut b = worker_client(&server.url()).await;
    let (got_a, got_b, _) = tokio::join!(
        poll_one(&mut a, "a", "qx", 3),
        poll_one(&mut b, "b", "qx", 3),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            client.start("single", json!({})).await
        }
    );
    assert_eq!(got_a.len() + got_b.len(), 1, "a: {got_a:?}, b: {got_b:?}");
}

#[tokio::test]
async fn cancel_during_a_retry_back_off_starts_no_further_attempt() {
    let (server, mut client) = server_and_client().await;
    client
        .register("name: backoff\nnodes:\n  - { id: only, type: TASK, queue: qc, task: t, retry: { max_attempts: 5, initial_interval: 1s } }\n")
        .await;
    let worker = TestWorker::start(&server.url(), &["qc"], 1, 1, |_| Outcome::Fail {
        code: "DOWN".to_owned(),
        retryable: true,
    })
    .await;
    let run_id = client.start("backoff", json!({})).await;
    while worker.leases().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // attempt 1 failed (or is failing); the back-off timer is set
    tokio::time::sleep(Duration::from_millis(200)).await;
    client
        .runs
        .cancel_run(composer_proto::v1::CancelRunRequest {
            run_id: run_id.clone(),
            reason: "customer gave up".to_owned(),
        })
        .await
        .expect("cancel");
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Cancelled);
    let only = run
        .nodes
        .iter()
        .find(|n| n.node_id == "only")
        .expect("only");
    assert_eq!(
        only.status(),
        composer_proto::v1::NodeStatus::Cancelled,
        "a node waiting for its retry shows CANCELLED once the run is"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(worker.leases().len(), 1, "no attempt after the cancel");
    let history = client.history(&run_id).await;
    let cancel = history
        .iter()
        .find(|e| e.event_type == "cancel_requested_by")
        .expect("who cancelled is recorded");
    assert_eq!(cancel.actor, "anonymous");
}

#[tokio::test]
async fn recursion_through_sub_workflows_stops_at_the_depth_limit() {
    let (_server, mut client) = server_and_client().await;
    // each starts the other: no registration can see the cycle
    client
        .register("name: ping\nnodes:\n  - { id: down, type: SUB_WORKFLOW, workflow: pong }\n")
        .await;
    client
        .register("name: pong\nnodes:\n  - { id: down, type: SUB_WORKFLOW, workflow: ping }\n")
        .await;
    let root = client.start("ping", json!({})).await;
    let run = client.wait_done(&root, WAIT).await;
    assert_eq!(run.status(), RunStatus::Failed, "{run:#?}");
    let listed = all_runs(&mut client).await;
    assert_eq!(
        listed.len(),
        17,
        "the root and 16 levels of children, no more"
    );
    let deepest = listed
        .iter()
        .filter_map(|r| r.error.as_ref())
        .any(|e| e.message.contains("SUB_WORKFLOW_TOO_DEEP") || e.code == "SUB_WORKFLOW_TOO_DEEP");
    let node_errors: Vec<String> = listed
        .iter()
        .flat_map(|r| {
            r.nodes
                .iter()
                .filter_map(|n| n.error.as_ref().map(|e| e.code.clone()))
        })
        .collect();
    assert!(
        deepest || node_errors.iter().any(|c| c == "SUB_WORKFLOW_TOO_DEEP"),
        "the deepest run says why: {listed:#?}"
    );
}

#[tokio::test]
async fn recursion_through_maps_of_workflows_stops_at_the_runs_per_tree_limit() {
    let server = ServerProcess::start(&composer_binary(), &["--max-runs-per-tree", "40"]).await;
    let mut client = TestClient::connect(&server.url()).await;
    // ten children each, each starting ten more: unbounded without the limit
    let fan = |name: &str, other: &str| {
        format!(
            "name: {name}\nnodes:\n  - {{ id: fan, type: MAP, items: '${{[1,2,3,4,5,6,7,8,9,10]}}', workflow: {other} }}\n"
        )
    };
    client.register(&fan("tick", "tock")).await;
    client.register(&fan("tock", "tick")).await;
    let root = client.start("tick", json!({})).await;
    let run = client.wait_done(&root, WAIT).await;
    assert_eq!(run.status(), RunStatus::Failed, "{run:#?}");
    // every run the tree got ends; none starts after the root ended
    let mut listed = Vec::new();
    for _ in 0..100 {
        listed = all_runs(&mut client).await;
        if listed.iter().all(|r| r.end_time.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(listed.len(), 40, "the tree holds exactly the limit");
    let said_why = listed
        .iter()
        .filter_map(|r| r.error.as_ref())
        .any(|e| e.code == "RUN_TREE_TOO_LARGE" && e.message.contains("--max-runs-per-tree"));
    assert!(said_why, "a run says which limit stopped it: {listed:#?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = all_runs(&mut client).await;
    assert_eq!(after.len(), 40, "nothing grows after the root ended");
    // another tree has its own budget
    client
        .register(
            "name: small\nnodes:\n  - { id: fan, type: MAP, items: '${[1,2]}', workflow: leaf }\n",
        )
        .await;
    client
        .register("name: leaf\nnodes:\n  - { id: done, type: WAIT, duration: 1ms }\n")
        .await;
    let small = client.start("small", json!({})).await;
    assert_eq!(
        client.wait_done(&small, WAIT).await.status(),
        RunStatus::Completed
    );
}

#[tokio::test]
async fn cancelling_a_parent_cancels_its_child() {
    let (server, mut client) = server_and_client().await;
    client
        .register("name: child\nnodes:\n  - { id: work, type: TASK, queue: qp, task: t }\n")
        .await;
    client
        .register("name: parent\nnodes:\n  - { id: sub, type: SUB_WORKFLOW, workflow: child }\n")
        .await;
    let worker = TestWorker::start(&server.url(), &["qp"], 1, 1, |_| Outcome::Vanish).await;
    let parent = client.start("parent", json!({})).await;
    while worker.leases().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let children = client
        .runs
        .list_runs(composer_proto::v1::ListRunsRequest {
            parent_run_id: parent.clone(),
            ..Default::default()
        })
        .await
        .expect("list children")
        .into_inner()
        .runs;
    assert_eq!(children.len(), 1);
    client
        .runs
        .cancel_run(composer_proto::v1::CancelRunRequest {
            run_id: parent.clone(),
            reason: String::new(),
        })
        .await
        .expect("cancel");
    let parent_run = client.wait_done(&parent, WAIT).await;
    assert_eq!(parent_run.status(), RunStatus::Cancelled);
    let child = client.wait_done(&children[0].run_id, WAIT).await;
    assert_eq!(child.status(), RunStatus::Cancelled);
}

#[tokio::test]
async fn a_sub_workflow_returns_its_childs_output() {
    let (server, mut client) = server_and_client().await;
    client.register(THREE_STEPS).await;
    client
        .register("name: wrapper\nnodes:\n  - { id: sub, type: SUB_WORKFLOW, workflow: three_steps, input: { n: \"${input.start}\" } }\noutput: \"${nodes.sub.output}\"\n")
        .await;
    let _worker =
        TestWorker::start(&server.url(), &["q3"], 1, 1, |task| add_one(&task.input)).await;
    let run_id = client.start("wrapper", json!({"start": 1})).await;
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
    assert_eq!(output_of(&run), json!({"total": 4}));
}

#[tokio::test]
async fn a_running_worker_learns_of_a_cancel_at_its_next_heartbeat_and_watch_run_streams_to_the_end()
 {
    use composer_proto::v1::{HeartbeatRequest, WatchRunRequest};
    let (server, mut client) = server_and_client().await;
    client
        .register("name: long\nnodes:\n  - { id: only, type: TASK, queue: qw, task: t }\n")
        .await;
    let run_id = client.start("long", json!({})).await;
    let mut stream = client
        .runs
        .watch_run(WatchRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = stream
        .message()
        .await
        .expect("stream")
        .expect("a first snapshot");
    assert_eq!(first.run.expect("run").status(), RunStatus::Running);

    let mut worker = worker_client(&server.url()).await;
    let task = poll_one(&mut worker, "w", "qw", 10)
        .await
        .pop()
        .expect("leased");
    let beat = HeartbeatRequest {
        task_id: task.task_id.clone(),
        attempt: task.attempt,
        lease_token: task.lease_token.clone(),
    };
    let alive = worker
        .heartbeat(beat.clone())
        .await
        .expect("heartbeat")
        .into_inner();
    assert!(!alive.cancel_requested && alive.lease_expire_time.is_some());

    client
        .runs
        .cancel_run(composer_proto::v1::CancelRunRequest {
            run_id: run_id.clone(),
            reason: "stop".to_owned(),
        })
        .await
        .expect("cancel");
    let told = worker
        .heartbeat(beat)
        .await
        .expect("heartbeat after cancel")
        .into_inner();
    assert!(told.cancel_requested, "the worker learns of the cancel");
    assert_eq!(told.cancel_reason, "stop", "and why");

    let mut last = None;
    while let Some(update) = stream.message().await.expect("stream") {
        last = update.run;
    }
    let last = last.expect("a final snapshot");
    assert_eq!(
        last.status(),
        RunStatus::Cancelled,
        "the stream ends with the run"
    );
    let error = last.error.expect("a cancelled run says why");
    assert_eq!(
        (error.code.as_str(), error.message.as_str()),
        ("CANCELLED", "stop")
    );
}

#[tokio::test]
async fn list_runs_pages_newest_first_and_filters_by_status_and_label() {
    use composer_proto::v1::ListRunsRequest;
    let (_server, mut client) = server_and_client().await;
    client
        .register("name: idle\nnodes:\n  - { id: only, type: WAIT_FOR_EVENT, event: never }\n")
        .await;
    let mut started = Vec::new();
    for n in 0..5 {
        let response = client
            .runs
            .start_run(composer_proto::v1::StartRunRequest {
                workflow_name: "idle".to_owned(),
                labels: [(
                    "team".to_owned(),
                    if n % 2 == 0 { "even" } else { "odd" }.to_owned(),
                )]
                .into(),
                ..Default::default()
            })
            .await
            .expect("start")
            .into_inner();
        started.push(response.run.expect("run").run_id);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .runs
            .list_runs(ListRunsRequest {
                page_size: 2,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("page")
            .into_inner();
        assert!(page.runs.len() <= 2);
        seen.extend(page.runs.into_iter().map(|r| r.run_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    started.reverse();
    assert_eq!(seen, started, "every run once, newest first");

    let even = client
        .runs
        .list_runs(ListRunsRequest {
            labels: [("team".to_owned(), "even".to_owned())].into(),
            statuses: vec![RunStatus::Running as i32],
            ..Default::default()
        })
        .await
        .expect("filter")
        .into_inner();
    assert_eq!(even.runs.len(), 3);
    let bad = client
        .runs
        .list_runs(ListRunsRequest {
            page_token: "garbage".to_owned(),
            ..Default::default()
        })
        .await
        .expect_err("a bad token is refused");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
}

/// WatchRun as a browser receives it: grpc-web over HTTP/1.1, one frame per
/// snapshot, then the trailers once the run has ended.
#[tokio::test]
async fn watch_run_streams_over_grpc_web_until_the_run_ends() {
    use prost::Message;
    let (server, mut client) = server_and_client().await;
    // the run waits for an event sent once the stream is open: a timer
    // could end it before a loaded machine opened the stream
    client
        .register("name: napping\nnodes:\n  - { id: nap, type: WAIT_FOR_EVENT, event: approve }\noutput: { slept: true }\n")
        .await;
    let run_id = client.start("napping", json!({})).await;
    let mut body = vec![0u8, 0, 0, 0, 0];
    let request = composer_proto::v1::WatchRunRequest {
        run_id: run_id.clone(),
    }
    .encode_to_vec();
    body[1..5].copy_from_slice(
        &u32::try_from(request.len())
            .unwrap_or_default()
            .to_be_bytes(),
    );
    body.extend(request);
    let response = reqwest::Client::builder()
        .http1_only()
        .build()
        .expect("client")
        .post(format!("{}/composer.v1.RunService/WatchRun", server.url()))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .body(body)
        .send()
        .await
        .expect("grpc-web request");
    assert_eq!(response.version(), reqwest::Version::HTTP_11);
    send(&mut client, &run_id, json!({})).await;
    let bytes = response
        .bytes()
        .await
        .expect("the stream ends with the run");
    let mut rest = &bytes[..];
    let mut snapshots = Vec::new();
    let mut trailers = String::new();
    while rest.len() >= 5 {
        let flags = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let frame = &rest[5..5 + len];
        if flags & 0x80 == 0 {
            snapshots
                .push(composer_proto::v1::WatchRunResponse::decode(frame).expect("a snapshot"));
        } else {
            trailers = String::from_utf8_lossy(frame).into_owned();
        }
        rest = &rest[5 + len..];
    }
    assert!(
        snapshots.len() >= 2,
        "a first snapshot and at least the final one"
    );
    let last = snapshots.last().and_then(|s| s.run.clone()).expect("run");
    assert_eq!(last.status(), RunStatus::Completed);
    assert!(trailers.contains("grpc-status:0"), "{trailers}");
}

#[tokio::test]
async fn history_records_who_held_each_lease_and_when_one_expired() {
    let (server, mut client) = server_and_client().await;
    client
        .register(
            "name: flaky_lease\nnodes:\n  - { id: step, type: TASK, queue: ql, task: t, \
             heartbeat_timeout: 1s, retry: { max_attempts: 2, initial_interval: 10ms } }\n",
        )
        .await;
    // the first attempt's worker vanishes; the second completes it
    let worker = TestWorker::start(&server.url(), &["ql"], 1, 1, |lease| {
        if lease.attempt == 1 {
            Outcome::Vanish
        } else {
            Outcome::Complete(json!({ "ok": true }))
        }
    })
    .await;
    let run_id = client.start("flaky_lease", json!({})).await;
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
    drop(worker);
    let history = client.history(&run_id).await;
    let of_step: Vec<(&str, i32)> = history
        .iter()
        .filter(|e| e.node_id == "step")
        .map(|e| (e.event_type.as_str(), e.attempt))
        .collect();
    assert_eq!(
        of_step,
        [
            ("node_started", 0),
            ("lease_expired", 1),
            ("attempt_failed", 1),
            ("retry_scheduled", 2),
            ("node_completed", 2),
        ],
        "{history:#?}"
    );
    // each ended lease names its worker in the attempt's outcome entry
    // (one history row per attempt, decision 0024)
    let holders: Vec<(&str, String)> = history
        .iter()
        .filter_map(|e| {
            let details = composer_testkit::worker::json_of(e.details.clone()?);
            let worker = details["worker_id"].as_str()?.to_owned();
            Some((e.event_type.as_str(), worker))
        })
        .collect();
    assert_eq!(
        holders,
        [
            ("lease_expired", "test-worker-0".to_owned()),
            ("node_completed", "test-worker-0".to_owned())
        ]
    );
    // every type the server wrote is one of the documented list
    let known: Vec<&str> = composer_engine::history::HistoryEventType::ALL
        .iter()
        .map(|t| t.as_str())
        .collect();
    for event in &history {
        assert!(known.contains(&event.event_type.as_str()), "{event:?}");
    }
}

#[tokio::test]
async fn a_node_shows_its_rendered_input_its_worker_and_its_lease() {
    let (server, mut client) = server_and_client().await;
    client
        .register(
            "name: shown\nnodes:\n  - { id: step, type: TASK, queue: qs, task: t, \
             heartbeat_timeout: 30s, input: { n: '${input.n * 2}' } }\n",
        )
        .await;
    let worker = TestWorker::start(&server.url(), &["qs"], 1, 1, |_| {
        Outcome::Slow(Duration::from_millis(1500), json!({ "ok": true }))
    })
    .await;
    let run_id = client.start("shown", json!({ "n": 21 })).await;
    let node_of = |run: &composer_proto::v1::Run| {
        run.nodes
            .iter()
            .find(|n| n.node_id == "step")
            .cloned()
            .expect("step")
    };
    // while the worker holds it
    let mut running = None;
    for _ in 0..200 {
        let run = client
            .runs
            .get_run(composer_proto::v1::GetRunRequest {
                run_id: run_id.clone(),
                ..Default::default()
            })
            .await
            .expect("get")
            .into_inner()
            .run
            .expect("run");
        let node = node_of(&run);
        if node.lease_expire_time.is_some() {
            running = Some(node);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let running = running.expect("a lease shows while the task runs");
    assert_eq!(running.worker_id, "test-worker-0");
    let input = composer_testkit::worker::json_of(running.input.clone().expect("input"));
    assert_eq!(input, json!({ "n": 42 }), "the input as the worker gets it");
    // once done: no lease, the worker and the input stay
    let done = node_of(&client.wait_done(&run_id, WAIT).await);
    assert!(done.lease_expire_time.is_none());
    assert_eq!(done.worker_id, "test-worker-0");
    assert!(done.input.is_some());
    drop(worker);
}
