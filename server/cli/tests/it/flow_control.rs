//! Flow control end to end (issue 17): pausing and resuming runs, dispatch
//! priority, bulk actions. The real binary on real Postgres and Redis; a
//! worker played by the test through the raw worker protocol, so what is
//! (not) dispatched is seen exactly.

use std::{path::PathBuf, time::Duration};

use composer_grpc::auth::{NewToken, SigningKey, mint};
use composer_proto::v1::{
    CancelRunRequest, CompleteTaskRequest, CountRunsRequest, GetRunRequest, ListRunsRequest,
    NodeStatus, PauseRunRequest, PollTasksRequest, RegisterWorkflowRequest, ResumeRunRequest, Run,
    RunStatus, StartRunRequest, Task, run_service_client::RunServiceClient,
    worker_service_client::WorkerServiceClient, workflow_service_client::WorkflowServiceClient,
};
use composer_testkit::{ServerProcess, client::TestClient};
use serde_json::json;
use tonic::{Code, Request, Status, transport::Channel};
use tonic_types::StatusExt;

use crate::common::violated_field;

const WAIT: Duration = Duration::from_secs(60);
const SECRET: &str = "a-test-secret-that-is-long-enough-for-hs256-0123456789";

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

async fn channel(server: &ServerProcess) -> Channel {
    Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

fn poll_request(queue: &str, max_tasks: i32, wait: Duration) -> PollTasksRequest {
    PollTasksRequest {
        worker_id: "flow-test".to_owned(),
        queues: vec![queue.to_owned()],
        max_tasks,
        wait: Some(prost_types::Duration {
            seconds: i64::try_from(wait.as_secs()).unwrap_or(0),
            nanos: i32::try_from(wait.subsec_nanos()).unwrap_or(0),
        }),
        confirm_receipt: false,
    }
}

/// One poll's tasks.
async fn poll(
    workers: &mut WorkerServiceClient<Channel>,
    queue: &str,
    max_tasks: i32,
    wait: Duration,
) -> Vec<Task> {
    workers
        .poll_tasks(poll_request(queue, max_tasks, wait))
        .await
        .expect("poll")
        .into_inner()
        .tasks
}

/// Polls until a task comes (each poll waits up to a second), or panics
/// after [`WAIT`].
async fn poll_one(workers: &mut WorkerServiceClient<Channel>, queue: &str) -> Task {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(task) = poll(workers, queue, 1, Duration::from_secs(1))
            .await
            .into_iter()
            .next()
        {
            return task;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no task on {queue} within {WAIT:?}"
        );
    }
}

async fn complete(
    workers: &mut WorkerServiceClient<Channel>,
    task: &Task,
    output: serde_json::Value,
) {
    workers
        .complete_task(CompleteTaskRequest {
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            lease_token: task.lease_token.clone(),
            output: Some(composer_grpc::convert::from_json(&output)),
        })
        .await
        .expect("complete");
}

async fn pause(client: &mut TestClient, run_id: &str) -> Result<Run, Status> {
    Ok(client
        .runs
        .pause_run(PauseRunRequest {
            run_id: run_id.to_owned(),
            reason: "maintenance".to_owned(),
        })
        .await?
        .into_inner()
        .run
        .expect("run"))
}

async fn resume(client: &mut TestClient, run_id: &str) -> Result<Run, Status> {
    Ok(client
        .runs
        .resume_run(ResumeRunRequest {
            run_id: run_id.to_owned(),
        })
        .await?
        .into_inner()
        .run
        .expect("run"))
}

/// Node id -> status, sorted.
fn node_states(run: &Run) -> Vec<(String, NodeStatus)> {
    let mut nodes: Vec<(String, NodeStatus)> = run
        .nodes
        .iter()
        .map(|n| (n.node_id.clone(), n.status()))
        .collect();
    nodes.sort();
    nodes
}

const STEP_WAIT_STEP: &str = r#"
name: step_wait_step
nodes:
  - { id: a, type: TASK, queue: pq, task: step }
  - { id: w, type: WAIT, duration: 1s }
  - { id: c, type: TASK, queue: pq, task: step }
edges:
  - { from: a, to: w }
  - { from: w, to: c }
output: "${nodes.c.output}"
"#;

/// Pause after step 1's task is leased: the attempt finishes and counts,
/// nothing is dispatched for 5 s and the WAIT node's timer, due a second
/// after step 1, does not fire; after resume it fires and the run ends.
#[tokio::test]
async fn a_paused_run_records_running_work_and_dispatches_nothing_until_resumed() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    client.register(STEP_WAIT_STEP).await;
    let run_id = client.start("step_wait_step", json!({})).await;

    let first = poll_one(&mut workers, "pq").await;
    assert_eq!(first.node_id, "a");
    let paused = pause(&mut client, &run_id).await.expect("pause");
    assert_eq!(paused.status(), RunStatus::Paused);
    // pausing again is OK and changes nothing
    assert_eq!(
        pause(&mut client, &run_id)
            .await
            .expect("pause again")
            .status(),
        RunStatus::Paused
    );

    // the leased attempt completes and its result is recorded
    complete(&mut workers, &first, json!({"a": 1})).await;
    let after_report = client.get(&run_id).await;
    assert_eq!(after_report.status(), RunStatus::Paused);
    let a = after_report
        .nodes
        .iter()
        .find(|n| n.node_id == "a")
        .expect("a");
    assert_eq!(a.status(), NodeStatus::Completed);
    assert_eq!(
        composer_testkit::worker::json_of(a.output.clone().expect("output")),
        json!({"a": 1})
    );

    // nothing is dispatched for 5 s, and no node moves: the WAIT node's
    // timer (due after 1 s) does not fire while paused
    let during = poll(&mut workers, "pq", 10, Duration::from_secs(5)).await;
    assert!(during.is_empty(), "dispatched while paused: {during:?}");
    let still = client.get(&run_id).await;
    assert_eq!(still.status(), RunStatus::Paused);
    assert_eq!(node_states(&still), node_states(&after_report));
    assert!(
        node_states(&still).contains(&("w".to_owned(), NodeStatus::Waiting)),
        "{:?}",
        node_states(&still)
    );

    // the paused run is what the status filter finds
    let listed = client
        .runs
        .list_runs(ListRunsRequest {
            statuses: vec![RunStatus::Paused as i32],
            ..Default::default()
        })
        .await
        .expect("list paused")
        .into_inner()
        .runs;
    assert_eq!(
        listed.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
        [run_id.as_str()]
    );
    let counts = client
        .runs
        .count_runs(CountRunsRequest::default())
        .await
        .expect("count")
        .into_inner()
        .counts;
    assert!(
        counts
            .iter()
            .any(|c| c.status() == RunStatus::Paused && c.count == 1),
        "{counts:?}"
    );

    let resumed = resume(&mut client, &run_id).await.expect("resume");
    assert_eq!(resumed.status(), RunStatus::Running);
    // the timer that fell due fires now, and the last step is dispatched
    let last = poll_one(&mut workers, "pq").await;
    assert_eq!(last.node_id, "c");
    complete(&mut workers, &last, json!({"done": true})).await;
    let done = client.wait_done(&run_id, WAIT).await;
    assert_eq!(done.status(), RunStatus::Completed, "{done:#?}");

    let history = client.history(&run_id).await;
    let types: Vec<&str> = history.iter().map(|e| e.event_type.as_str()).collect();
    let at = |name: &str| {
        types
            .iter()
            .position(|t| *t == name)
            .unwrap_or_else(|| panic!("no {name} in {types:?}"))
    };
    assert!(at("run_paused") < at("run_resumed"), "{types:?}");
    assert!(at("run_resumed") < at("wait_elapsed"), "{types:?}");
    assert_eq!(types.iter().filter(|t| **t == "run_paused").count(), 1);
    assert!(!history[at("run_paused")].actor.is_empty());
}

/// A task dispatched but not leased when the run is paused is taken back:
/// no poll gets it until resume, then one does.
#[tokio::test]
async fn a_pause_takes_back_dispatched_tasks_and_a_resume_dispatches_them() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    client.register(STEP_WAIT_STEP).await;
    let run_id = client.start("step_wait_step", json!({})).await;
    pause(&mut client, &run_id).await.expect("pause");

    let during = poll(&mut workers, "pq", 10, Duration::from_secs(3)).await;
    assert!(during.is_empty(), "dispatched while paused: {during:?}");

    resume(&mut client, &run_id).await.expect("resume");
    let task = poll_one(&mut workers, "pq").await;
    assert_eq!(task.node_id, "a");
    assert_eq!(task.attempt, 1, "a held task keeps its attempt");
}

/// A lease whose receipt is never confirmed, and which ends while its run
/// is paused, goes back HELD, not DISPATCHED: no poll gets it until resume.
#[tokio::test]
async fn a_lease_handed_back_during_a_pause_stays_held_until_resume() {
    let server = ServerProcess::start(&composer_binary(), &["--lease-receipt-timeout", "1s"]).await;
    let mut client = TestClient::connect(&server.url()).await;
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    client.register(STEP_WAIT_STEP).await;
    let run_id = client.start("step_wait_step", json!({})).await;
    let lost = workers
        .poll_tasks(PollTasksRequest {
            confirm_receipt: true,
            ..poll_request("pq", 1, Duration::from_secs(10))
        })
        .await
        .expect("poll")
        .into_inner()
        .tasks;
    assert_eq!(lost.len(), 1, "the first task");
    pause(&mut client, &run_id).await.expect("pause");

    // the unconfirmed lease ends after 1 s; recovery hands it back
    let during = poll(&mut workers, "pq", 10, Duration::from_secs(6)).await;
    assert!(during.is_empty(), "handed back while paused: {during:?}");

    resume(&mut client, &run_id).await.expect("resume");
    let task = poll_one(&mut workers, "pq").await;
    assert_eq!(task.task_id, lost[0].task_id);
    assert_eq!(task.attempt, 1, "no attempt spent");
}

/// Pausing an ended run is FAILED_PRECONDITION; a paused run can be
/// cancelled; resuming a running run is OK; bad ids are refused by field.
#[tokio::test]
async fn pause_and_resume_refuse_what_they_cannot_do() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(STEP_WAIT_STEP).await;
    let run_id = client.start("step_wait_step", json!({})).await;

    let running = resume(&mut client, &run_id)
        .await
        .expect("resume a running run");
    assert_eq!(running.status(), RunStatus::Running);
    pause(&mut client, &run_id).await.expect("pause");
    let cancelled = client
        .runs
        .cancel_run(CancelRunRequest {
            run_id: run_id.clone(),
            reason: "no longer needed".to_owned(),
        })
        .await
        .expect("cancel a paused run")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(cancelled.status(), RunStatus::Cancelled);
    let ended = client
        .runs
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
            skip_nodes: false,
        })
        .await
        .expect("get")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(ended.status(), RunStatus::Cancelled);

    let refused = pause(&mut client, &run_id)
        .await
        .expect_err("pause an ended run");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let refused = resume(&mut client, &run_id)
        .await
        .expect_err("resume an ended run");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");

    let empty = pause(&mut client, "").await.expect_err("empty id");
    assert_eq!(empty.code(), Code::InvalidArgument);
    assert_eq!(violated_field(&empty), "run_id");
    let long = resume(&mut client, &"x".repeat(10_000))
        .await
        .expect_err("long id");
    assert_eq!(long.code(), Code::InvalidArgument);
    assert_eq!(violated_field(&long), "run_id");
    let unknown = pause(&mut client, &uuid::Uuid::new_v4().to_string())
        .await
        .expect_err("unknown run");
    assert_eq!(unknown.code(), Code::NotFound);
    let reason = client
        .runs
        .pause_run(PauseRunRequest {
            run_id: run_id.clone(),
            reason: "r".repeat(100_000),
        })
        .await
        .expect_err("long reason");
    assert_eq!(violated_field(&reason), "reason");
}

fn token(ns: &str, roles: &[&str]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    mint(
        &NewToken {
            sub: format!("{ns}-{}", roles.join("-")),
            ns: ns.to_owned(),
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
            queues: None,
            iat: now,
            nbf: now,
            exp: now + 3600,
            iss: None,
            aud: None,
        },
        SigningKey::Secret(SECRET.as_bytes()),
        None,
    )
    .expect("mint")
}

fn authed<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

/// Another tenant cannot pause or resume a run, whatever its role; in the
/// run's own namespace a reader may not either, an operator may.
#[tokio::test]
async fn pause_and_resume_stay_inside_the_namespace_and_need_an_operator() {
    let server = ServerProcess::start(&composer_binary(), &["--auth-secret", SECRET]).await;
    let channel = channel(&server).await;
    let mut runs = RunServiceClient::new(channel.clone());
    let mut workflows = WorkflowServiceClient::new(channel);
    let owner = token("tenant-a", &["operator"]);
    workflows
        .register_workflow(authed(
            RegisterWorkflowRequest {
                source: STEP_WAIT_STEP.to_owned(),
            },
            &owner,
        ))
        .await
        .expect("register");
    let run = runs
        .start_run(authed(
            StartRunRequest {
                workflow_name: "step_wait_step".to_owned(),
                ..Default::default()
            },
            &owner,
        ))
        .await
        .expect("start")
        .into_inner()
        .run
        .expect("run");

    let pause_as = |token: String| {
        authed(
            PauseRunRequest {
                run_id: run.run_id.clone(),
                reason: String::new(),
            },
            &token,
        )
    };
    for role in ["operator", "admin"] {
        let other = runs
            .pause_run(pause_as(token("tenant-b", &[role])))
            .await
            .expect_err("another tenant");
        assert_eq!(other.code(), Code::NotFound, "{role}: {other:?}");
        let other = runs
            .resume_run(authed(
                ResumeRunRequest {
                    run_id: run.run_id.clone(),
                },
                &token("tenant-b", &[role]),
            ))
            .await
            .expect_err("another tenant");
        assert_eq!(other.code(), Code::NotFound, "{role}: {other:?}");
    }
    for role in ["reader", "client", "worker"] {
        let denied = runs
            .pause_run(pause_as(token("tenant-a", &[role])))
            .await
            .expect_err("not an operator");
        assert_eq!(denied.code(), Code::PermissionDenied, "{role}: {denied:?}");
    }
    let still = runs
        .get_run(authed(
            GetRunRequest {
                run_id: run.run_id.clone(),
                skip_nodes: true,
            },
            &owner,
        ))
        .await
        .expect("get")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(still.status(), RunStatus::Running, "nobody else paused it");
    let paused = runs
        .pause_run(pause_as(owner.clone()))
        .await
        .expect("the owner pauses")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(paused.status(), RunStatus::Paused);
}

const ONE_TASK: &str = r#"
name: one_task
nodes:
  - { id: only, type: TASK, queue: prio, task: work }
"#;

/// Starts `count` runs of `one_task` at `priority`, a few at a time;
/// returns their ids.
async fn start_many(client: &TestClient, count: usize, priority: i32) -> Vec<String> {
    let mut ids = Vec::with_capacity(count);
    let mut pending = futures::stream::FuturesUnordered::new();
    for i in 0..count {
        let mut runs = client.runs.clone();
        pending.push(async move {
            runs.start_run(StartRunRequest {
                workflow_name: "one_task".to_owned(),
                priority,
                idempotency_key: format!("p{priority}-{i}"),
                ..Default::default()
            })
            .await
            .expect("start")
            .into_inner()
            .run
            .expect("run")
            .run_id
        });
        if pending.len() >= 16 {
            ids.push(futures::StreamExt::next(&mut pending).await.expect("one"));
        }
    }
    while let Some(id) = futures::StreamExt::next(&mut pending).await {
        ids.push(id);
    }
    ids
}

/// 2,000 tasks of priority 1 wait on a queue; a run of priority 5 started
/// after them is what the next poll for one task gets.
#[tokio::test]
async fn a_high_priority_task_overtakes_a_flood_of_low_priority_ones() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    let mut workers = WorkerServiceClient::new(channel(&server).await);
    client.register(ONE_TASK).await;
    let low = start_many(&client, 2_000, 1).await;
    // the poll hub reads the queue now: one low task is leased
    let first = poll(&mut workers, "prio", 1, Duration::from_secs(5)).await;
    assert_eq!(first.len(), 1);
    assert!(low.contains(&first[0].run_id));

    let high = client
        .runs
        .start_run(StartRunRequest {
            workflow_name: "one_task".to_owned(),
            priority: 5,
            ..Default::default()
        })
        .await
        .expect("start the high-priority run")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(high.priority, 5);
    let next = poll(&mut workers, "prio", 1, Duration::from_secs(5)).await;
    assert_eq!(next.len(), 1);
    assert_eq!(
        next[0].run_id, high.run_id,
        "the next poll got a low-priority task"
    );
    // the low ones are all still there, in order of their own priority
    let more = poll(&mut workers, "prio", 100, Duration::from_secs(5)).await;
    assert!(!more.is_empty());
    assert!(more.iter().all(|t| low.contains(&t.run_id)));
    let low_run = client.get(&low[0]).await;
    assert_eq!(low_run.priority, 1);
}

/// Priority is 0 (the default, 3) or 1 to 5; anything else is refused by
/// field, and the default shows as 3.
#[tokio::test]
async fn priority_outside_one_to_five_is_refused() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(ONE_TASK).await;
    for priority in [-1, 6, 1000, i32::MIN] {
        let refused = client
            .runs
            .start_run(StartRunRequest {
                workflow_name: "one_task".to_owned(),
                priority,
                ..Default::default()
            })
            .await
            .expect_err("out of range");
        assert_eq!(refused.code(), Code::InvalidArgument, "{priority}");
        assert_eq!(violated_field(&refused), "priority", "{priority}");
    }
    let default = client.start("one_task", json!({})).await;
    assert_eq!(client.get(&default).await.priority, 3);
}

/// StartRun names every bad field at once, as RegisterWorkflow does, so a
/// caller fixes them in one go.
#[tokio::test]
async fn start_run_reports_every_bad_field_in_one_answer() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    let refused = client
        .runs
        .start_run(StartRunRequest {
            workflow_name: "Not A Name!".to_owned(),
            version: -2,
            priority: 9,
            idempotency_key: "k".repeat(300),
            labels: [("Bad Key".to_owned(), "v".to_owned())].into(),
            ..Default::default()
        })
        .await
        .expect_err("five bad fields");
    assert_eq!(refused.code(), Code::InvalidArgument);
    let mut fields: Vec<String> = refused
        .get_details_bad_request()
        .expect("google.rpc.BadRequest")
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "idempotency_key",
            "labels[\"Bad Key\"]",
            "priority",
            "version",
            "workflow_name"
        ],
        "{}",
        refused.message()
    );
    assert!(
        !refused.message().starts_with("invalid argument"),
        "the code says it already: {}",
        refused.message()
    );
}
