//! `composer run migrate` (RunService.MigrateRuns) end to end: runs of v1
//! (A → B → C, each node on its own queue so a test decides when each
//! runs) left waiting, then moved to changed versions by the real binary.
//! A compatible run goes on under the target and keeps the lease its
//! worker holds; an incompatible one stays, named, and completes on v1.

use std::time::Duration;

use composer_proto::v1::{
    CompleteTaskRequest, MigrateRunsRequest, NodeStatus, PollTasksRequest, Run, RunFilter,
    RunStatus, Task, run_service_client::RunServiceClient,
    worker_service_client::WorkerServiceClient,
};
use composer_testkit::{
    ServerProcess,
    client::TestClient,
    worker::{Outcome, TestWorker},
};
use serde_json::{Value as Json, json};
use tonic::{Code, transport::Channel};

use crate::common::{
    cli::{Finished, binary, cli},
    violated_field,
};

const V1: &str = r#"name: order
nodes:
  - { id: A, type: TASK, queue: mig-a, task: a }
  - { id: B, type: TASK, queue: mig-b, task: b }
  - { id: C, type: TASK, queue: mig-c, task: c }
edges:
  - { from: A, to: B }
  - { from: B, to: C }
"#;

fn with_d_after_c() -> String {
    V1.replace(
        "  - { id: C, type: TASK, queue: mig-c, task: c }\n",
        "  - { id: C, type: TASK, queue: mig-c, task: c }\n  - { id: D, type: TASK, queue: mig-d, task: d }\n",
    ) + "  - { from: C, to: D }\n"
}

fn with_b_renamed_task() -> String {
    V1.replace("task: b }", "task: b_v2 }")
}

fn with_b_as_b2() -> String {
    V1.replace("{ id: B,", "{ id: B2,")
        .replace("{ from: A, to: B }", "{ from: A, to: B2 }")
        .replace("{ from: B, to: C }", "{ from: B2, to: C }")
}

/// A worker that completes every task of `queues`.
async fn worker(server: &ServerProcess, queues: &[&str]) -> TestWorker {
    TestWorker::start(&server.url(), queues, 1, 4, |lease| {
        Outcome::Complete(json!({ "by": lease.node_id }))
    })
    .await
}

/// Waits until `node` of `run_id` is in `status`.
async fn node_in(client: &mut TestClient, run_id: &str, node: &str, status: NodeStatus) -> Run {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let run = client.get(run_id).await;
        if run
            .nodes
            .iter()
            .any(|n| n.node_id == node && n.status() == status)
        {
            return run;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{node} never became {status:?}: {run:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a run of `order` and lets a worker of `queues` take it until
/// `node` runs (its task out, not leased).
async fn started_until(
    server: &ServerProcess,
    client: &mut TestClient,
    queues: &[&str],
    node: &str,
) -> String {
    let run_id = client.start("order", json!({})).await;
    let finishing = worker(server, queues).await;
    node_in(client, &run_id, node, NodeStatus::Running).await;
    drop(finishing);
    run_id
}

async fn register(server: &ServerProcess, source: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("order.yaml");
    std::fs::write(&path, source).expect("write");
    cli(server, &["workflow", "register", &path.to_string_lossy()])
        .await
        .ok();
}

/// `composer run migrate --workflow order --to-version N --wait -o json`.
async fn migrate(server: &ServerProcess, version: &str, extra: &[&str]) -> Finished {
    let mut args = vec![
        "run",
        "migrate",
        "--workflow",
        "order",
        "--to-version",
        version,
        "--wait",
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    cli(server, &args).await
}

fn has_node(run: &Run, node: &str, status: NodeStatus) -> bool {
    run.nodes
        .iter()
        .any(|n| n.node_id == node && n.status() == status)
}

async fn migrated_entries(client: &mut TestClient, run_id: &str) -> Vec<Json> {
    client
        .history(run_id)
        .await
        .into_iter()
        .filter(|e| e.event_type == "run_migrated")
        .map(|e| composer_grpc::convert::to_json(e.details, "details").expect("details"))
        .collect()
}

async fn lease_one(workers: &mut WorkerServiceClient<Channel>, queue: &str) -> Task {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let tasks = workers
            .poll_tasks(PollTasksRequest {
                worker_id: "migrate-test".to_owned(),
                queues: vec![queue.to_owned()],
                max_tasks: 1,
                wait: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                confirm_receipt: false,
            })
            .await
            .expect("poll")
            .into_inner()
            .tasks;
        if let Some(task) = tasks.into_iter().next() {
            return task;
        }
        assert!(tokio::time::Instant::now() < deadline, "no task on {queue}");
    }
}

/// The issue's first case: D appended after C. The run waiting in B moves
/// to v2 while a worker holds B's lease; that worker's report still lands,
/// and the run ends having run D.
#[tokio::test]
async fn a_compatible_run_moves_keeps_its_lease_and_runs_the_new_node() {
    let server = ServerProcess::start(&binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    register(&server, V1).await;
    let run_id = started_until(&server, &mut client, &["mig-a"], "B").await;
    let mut workers = WorkerServiceClient::connect(server.url())
        .await
        .expect("connect");
    let b = lease_one(&mut workers, "mig-b").await;
    register(&server, &with_d_after_c()).await;

    let operation = migrate(&server, "2", &[]).await.ok().json();
    assert_eq!(
        operation["status"], "BULK_OPERATION_STATUS_SUCCEEDED",
        "{operation}"
    );
    assert_eq!(operation["kind"], "BULK_OPERATION_KIND_MIGRATE");
    assert_eq!(operation["target_version"], 2);
    assert_eq!(
        (
            operation["matched"].as_i64(),
            operation["succeeded"].as_i64()
        ),
        (Some(1), Some(1)),
        "{operation}"
    );
    let moved = client.get(&run_id).await;
    assert_eq!(moved.workflow_version, 2);
    let entries = migrated_entries(&mut client, &run_id).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["from_version"], 1);
    assert_eq!(entries[0]["to_version"], 2);
    assert_eq!(entries[0]["verdict"], "compatible");

    workers
        .complete_task(CompleteTaskRequest {
            task_id: b.task_id.clone(),
            attempt: b.attempt,
            lease_token: b.lease_token.clone(),
            output: Some(composer_grpc::convert::from_json(&json!({ "by": "B" }))),
        })
        .await
        .expect("the lease taken before the move still reports");
    let _rest = worker(&server, &["mig-c", "mig-d"]).await;
    let done = client.wait_done(&run_id, Duration::from_secs(60)).await;
    assert_eq!(done.status(), RunStatus::Completed, "{done:?}");
    assert!(has_node(&done, "D", NodeStatus::Completed), "{done:?}");

    // moved once: a second migration to the same version skips it
    let again = migrate(&server, "2", &[]).await.ok().json();
    assert_eq!(again["succeeded"].as_i64().unwrap_or(0), 0, "{again}");
}

/// B's task renamed: the run is not moved, its divergence is in the
/// operation's failures, and it completes on v1 without D.
#[tokio::test]
async fn an_incompatible_run_stays_named_and_completes_on_its_version() {
    let server = ServerProcess::start(&binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    register(&server, V1).await;
    let run_id = started_until(&server, &mut client, &["mig-a"], "B").await;
    register(&server, &with_b_renamed_task()).await;

    let operation = migrate(&server, "2", &[]).await.ok().json();
    assert_eq!(
        operation["status"], "BULK_OPERATION_STATUS_SUCCEEDED",
        "{operation}"
    );
    assert_eq!(
        (
            operation["succeeded"].as_i64(),
            operation["failed"].as_i64()
        ),
        (Some(0), Some(1)),
        "{operation}"
    );
    let why = operation["failures"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(operation["failures"][0]["run_id"], run_id.as_str());
    assert!(why.contains("node_changed") && why.contains('B'), "{why}");
    assert_eq!(client.get(&run_id).await.workflow_version, 1);
    assert!(migrated_entries(&mut client, &run_id).await.is_empty());

    let _rest = worker(&server, &["mig-b", "mig-c"]).await;
    let done = client.wait_done(&run_id, Duration::from_secs(60)).await;
    assert_eq!(done.status(), RunStatus::Completed, "{done:?}");
    assert_eq!(done.workflow_version, 1);
}

/// B renamed to B2 in v2 (`--map B=B2`): a run already past B moves, its
/// B recorded as B2; a run still in B stays until B settles.
#[tokio::test]
async fn a_mapped_rename_moves_settled_nodes_and_waits_for_running_ones() {
    let server = ServerProcess::start(&binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    register(&server, V1).await;
    let past_b = started_until(&server, &mut client, &["mig-a", "mig-b"], "C").await;
    let in_b = started_until(&server, &mut client, &["mig-a"], "B").await;
    register(&server, &with_b_as_b2()).await;

    let operation = migrate(&server, "2", &["--map", "B=B2"]).await.ok().json();
    assert_eq!(operation["node_mapping"]["B"], "B2", "{operation}");
    assert_eq!(
        (
            operation["succeeded"].as_i64(),
            operation["failed"].as_i64()
        ),
        (Some(1), Some(1)),
        "{operation}"
    );
    assert_eq!(operation["failures"][0]["run_id"], in_b.as_str());
    let why = operation["failures"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("node B is RUNNING"), "{why}");

    let moved = client.get(&past_b).await;
    assert_eq!(moved.workflow_version, 2);
    assert!(has_node(&moved, "B2", NodeStatus::Completed), "{moved:?}");
    assert!(!moved.nodes.iter().any(|n| n.node_id == "B"), "{moved:?}");
    let entries = migrated_entries(&mut client, &past_b).await;
    assert_eq!(entries[0]["node_mapping"]["B"], "B2", "{entries:?}");

    let _rest = worker(&server, &["mig-b", "mig-c"]).await;
    for run_id in [&past_b, &in_b] {
        let done = client.wait_done(run_id, Duration::from_secs(60)).await;
        assert_eq!(done.status(), RunStatus::Completed, "{done:?}");
    }
    // the moved run replays as identical against its new version, its
    // history's B read as B2 through run_migrated
    let replayed = cli(
        &server,
        &[
            "workflow",
            "replay",
            &past_b,
            "--version",
            "2",
            "-o",
            "json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(replayed["verdict"], "identical", "{replayed}");
}

/// Every bad field is named before anything starts.
#[tokio::test]
async fn a_bad_request_names_its_field() {
    let server = ServerProcess::start(&binary(), &[]).await;
    register(&server, V1).await;
    register(&server, &with_b_as_b2()).await;
    let mut runs = RunServiceClient::connect(server.url())
        .await
        .expect("connect");
    let request = |name: &str, version: i32, mapping: &[(&str, &str)]| MigrateRunsRequest {
        filter: Some(RunFilter {
            workflow_name: name.to_owned(),
            ..RunFilter::default()
        }),
        target_version: version,
        node_mapping: mapping
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect(),
        request_id: String::new(),
    };
    for (bad, field) in [
        (request("", 2, &[]), "filter.workflow_name"),
        (request("order", 0, &[]), "target_version"),
        (request("order", 9, &[]), "target_version"),
        (request("order", 2, &[("B", "nowhere")]), "node_mapping"),
        (request("order", 2, &[("A", "B2")]), "node_mapping"),
        (request("order", 2, &[("B", "not a name!")]), "node_mapping"),
    ] {
        let status = runs.migrate_runs(bad.clone()).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}: {status:?}");
        assert_eq!(violated_field(&status), field, "{bad:?}: {status:?}");
    }
    let missing = cli(&server, &["run", "migrate", "--workflow", "order"]).await;
    assert_eq!(missing.code, 2, "{missing:?}");
    assert!(missing.stderr.contains("--to-version"), "{missing:?}");
}
