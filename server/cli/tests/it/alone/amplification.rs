//! The amplifications found by hostile clients, replayed against one real
//! server: each is refused or stopped at its limit, the server answers
//! other callers meanwhile, and its peak resident memory (VmHWM, the high
//! water mark of the whole process) stays under 300 MB.

use std::{path::PathBuf, time::Duration};

use composer_proto::v1::{
    GetServerInfoRequest, PollTasksRequest, RegisterWorkflowRequest, RunStatus, StartRunRequest,
    server_service_client::ServerServiceClient, worker_service_client::WorkerServiceClient,
};
use composer_testkit::{ServerProcess, client::TestClient};
use serde_json::json;
use tonic::{Code, transport::Channel};

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

const WAIT: Duration = Duration::from_secs(120);
const MAX_PEAK_RSS_BYTES: u64 = 300 * 1024 * 1024;

/// The server's peak resident memory so far.
fn peak_rss_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("kB");
    kib * 1024
}

fn assert_bounded(server: &ServerProcess, after: &str) {
    let peak = peak_rss_bytes(server.pid());
    println!("after {after}: peak RSS {} MiB", peak / (1024 * 1024));
    assert!(
        peak < MAX_PEAK_RSS_BYTES,
        "after {after} the server peaked at {} MiB",
        peak / (1024 * 1024)
    );
}

async fn channel(server: &ServerProcess) -> Channel {
    Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

#[tokio::test]
async fn the_amplifications_found_stay_bounded_in_memory_and_refused_or_stopped() {
    let server = ServerProcess::start(&composer_binary(), &["--max-runs-per-tree", "2000"]).await;
    let mut client = TestClient::connect(&server.url()).await;
    let channel = channel(&server).await;

    // 1. a template that copies a 1.9 MB input 500 times
    client
        .register(
            "name: amplifier\nnodes:\n  - { id: a, type: TASK, queue: amp, task: t, input: \
             '${[0,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,7,8,9,\
             0,1,2,3,4,5,6,7,8,9].map(x, [0,1,2,3,4,5,6,7,8,9].map(y, input))}' }\n",
        )
        .await;
    for _ in 0..3 {
        let run = client
            .start("amplifier", json!({ "blob": "x".repeat(1_900_000) }))
            .await;
        let ended = client.wait_done(&run, WAIT).await;
        assert_eq!(ended.status(), RunStatus::Failed, "{ended:#?}");
        let error = ended.error.expect("error");
        assert!(error.message.contains("cost limit"), "{error:?}");
    }
    assert_bounded(&server, "three 1.9 MB inputs copied 500 times each");

    // 2. workflows that start each other ten at a time
    let fan = |name: &str, other: &str| {
        format!(
            "name: {name}\nnodes:\n  - {{ id: fan, type: MAP, items: '${{[1,2,3,4,5,6,7,8,9,10]}}', workflow: {other} }}\n"
        )
    };
    client.register(&fan("tick", "tock")).await;
    client.register(&fan("tock", "tick")).await;
    let root = client.start("tick", json!({})).await;
    assert_eq!(
        client.wait_done(&root, WAIT).await.status(),
        RunStatus::Failed
    );
    assert_bounded(&server, "a recursion ten wide");

    // 3. YAML nested 60,000 deep (117 KiB), three at once, while another
    //    caller asks the server something
    let deep = format!(
        "name: deep\nnodes:\n  - {{ id: a, type: TASK, queue: q, task: t, input: {}1{} }}\n",
        "[".repeat(60_000),
        "]".repeat(60_000)
    );
    let mut registrations = Vec::new();
    for _ in 0..3 {
        let mut workflows = client.workflows.clone();
        let source = deep.clone();
        registrations.push(tokio::spawn(async move {
            workflows
                .register_workflow(RegisterWorkflowRequest { source })
                .await
        }));
    }
    ServerServiceClient::new(channel.clone())
        .get_server_info(GetServerInfoRequest {})
        .await
        .expect("the server answers others meanwhile");
    for registration in registrations {
        let refused = registration.await.expect("join").expect_err("too deep");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    }
    assert_bounded(&server, "three 60,000-deep sources");

    // 4. polls naming 12,000 made-up queues
    let mut workers = WorkerServiceClient::new(channel.clone());
    let mut refused = 0;
    for poll in 0..188 {
        let queues = (0..64).map(|i| format!("made-up-{poll}-{i}")).collect();
        let answer = workers
            .poll_tasks(PollTasksRequest {
                worker_id: "amplifier".to_owned(),
                queues,
                max_tasks: 1,
                wait: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 1_000_000,
                }),
                confirm_receipt: false,
            })
            .await;
        if let Err(status) = answer {
            assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
            refused += 1;
        }
    }
    assert!(refused > 0, "12,000 queues are past the namespace's limit");
    assert_bounded(&server, "polls of 12,000 queues");

    // 5. a 650,000-item input, and 30,000 labels
    let items: Vec<u32> = (0..650_000).collect();
    let huge = client
        .runs
        .start_run(StartRunRequest {
            workflow_name: "amplifier".to_owned(),
            input: Some(composer_grpc::convert::from_json(
                &json!({ "items": items }),
            )),
            ..Default::default()
        })
        .await
        .expect_err("over the payload limit");
    assert_eq!(huge.code(), Code::ResourceExhausted, "{huge:?}");
    let labels = (0..30_000)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect();
    let labelled = client
        .runs
        .start_run(StartRunRequest {
            workflow_name: "amplifier".to_owned(),
            labels,
            ..Default::default()
        })
        .await
        .expect_err("too many labels");
    assert_eq!(labelled.code(), Code::InvalidArgument, "{labelled:?}");
    assert_bounded(&server, "a 650,000-item input and 30,000 labels");
}
