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
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
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
}
