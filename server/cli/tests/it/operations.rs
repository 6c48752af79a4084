//! The operator's port: Prometheus metrics named by convention with
//! bounded labels, and HTTP liveness and readiness, against the real server.

use std::{path::PathBuf, time::Duration};

use composer_proto::v1::RunStatus;
use composer_testkit::{
    ServerProcess,
    client::TestClient,
    worker::{Outcome, TestWorker},
};
use serde_json::json;

use crate::common::free_addr;

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

const WAIT: Duration = Duration::from_secs(120);

async fn get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.expect("http");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// The value of the first sample of `metric` whose labels contain all of
/// `labels` (`key="value"` pieces).
fn sample(text: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.starts_with(&format!("{metric}{{")) || line.starts_with(&format!("{metric} "))
        })
        .find(|line| labels.iter().all(|l| line.contains(l)))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// An idle server lists its label-free metrics at zero from the first
/// scrape: `rate()` and alerts on an absent series need the series.
#[tokio::test]
async fn an_idle_server_lists_its_label_free_metrics_at_zero() {
    let metrics = free_addr();
    let _server = ServerProcess::start(&composer_binary(), &["--metrics-listen", &metrics]).await;
    let text = get(&format!("http://{metrics}/metrics")).await.1;
    for metric in [
        "composer_leases_returned_total",
        "composer_watched_runs",
        "composer_outbox_rows",
        "composer_timers_due",
    ] {
        assert_eq!(
            sample(&text, metric, &[]),
            Some(0.0),
            "{metric} in:\n{text}"
        );
    }
    assert_eq!(
        sample(
            &text,
            "composer_watch_reads_total",
            &["cause=\"announced\""]
        ),
        Some(0.0),
        "{text}"
    );
    assert!(
        text.contains("composer_event_transaction_seconds_count"),
        "the histogram is listed before its first sample:\n{text}"
    );
}

#[tokio::test]
async fn metrics_count_runs_tasks_and_calls_and_readiness_follows_the_drain() {
    let metrics = free_addr();
    let server = ServerProcess::start(
        &composer_binary(),
        &["--metrics-listen", &metrics, "--drain-delay", "3s"],
    )
    .await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(
            "name: measured\nnodes:\n  - { id: a, type: TASK, queue: mq, task: t }\n  - { id: b, type: TASK, queue: mq, task: t }\nedges:\n  - { from: a, to: b }\n",
        )
        .await;
    let worker = TestWorker::start(&server.url(), &["mq"], 1, 4, |_| {
        Outcome::Complete(json!({}))
    })
    .await;
    for _ in 0..3 {
        let run = client.start("measured", json!({})).await;
        assert_eq!(
            client.wait_done(&run, WAIT).await.status(),
            RunStatus::Completed
        );
    }
    drop(worker);
    let base = format!("http://{metrics}");
    assert_eq!(get(&format!("{base}/healthz")).await.0, 200);
    assert_eq!(get(&format!("{base}/readyz")).await.0, 200);

    // the gauges refresh every few seconds
    let mut text = String::new();
    for _ in 0..100 {
        text = get(&format!("{base}/metrics")).await.1;
        if text.contains("composer_db_pool_connections") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let run = ["namespace=\"default\"", "workflow=\"measured\""];
    let queue = ["namespace=\"default\"", "queue=\"mq\""];
    assert_eq!(
        sample(&text, "composer_runs_started_total", &run),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "composer_runs_ended_total",
            &[run[0], run[1], "status=\"completed\""]
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(&text, "composer_tasks_dispatched_total", &queue),
        Some(6.0)
    );
    assert_eq!(
        sample(&text, "composer_tasks_leased_total", &queue),
        Some(6.0)
    );
    assert_eq!(
        sample(
            &text,
            "composer_tasks_reported_total",
            &[queue[0], queue[1], "outcome=\"completed\""]
        ),
        Some(6.0)
    );
    assert_eq!(
        sample(
            &text,
            "composer_task_dispatch_latency_seconds_count",
            &queue
        ),
        Some(6.0)
    );
    assert!(
        sample(&text, "composer_event_transaction_seconds_count", &[]).is_some_and(|n| n >= 9.0)
    );
    assert!(
        sample(
            &text,
            "composer_event_transaction_events_bucket",
            &["le=\"+Inf\""]
        )
        .is_some()
    );
    assert_eq!(
        sample(
            &text,
            "composer_grpc_requests_total",
            &["method=\"/composer.v1.RunService/StartRun\"", "code=\"Ok\""]
        ),
        Some(3.0)
    );
    assert!(
        sample(
            &text,
            "composer_grpc_request_duration_seconds_bucket",
            &["StartRun"]
        )
        .is_some()
    );
    for gauge in [
        "composer_outbox_rows",
        "composer_outbox_oldest_age_seconds",
        "composer_timers_due",
        "composer_timer_lag_seconds",
    ] {
        assert!(sample(&text, gauge, &[]).is_some(), "{gauge} in {text}");
    }
    assert!(
        sample(
            &text,
            "composer_db_pool_connections",
            &["pool=\"requests\"", "state=\"idle\""]
        )
        .is_some()
    );
    assert!(
        text.contains("# HELP composer_runs_started_total"),
        "help text"
    );
    assert!(!text.contains("run_id"), "no run id is ever a label");

    // a made-up method is counted as unknown, not by its path
    let channel = tonic::transport::Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let made_up: Result<tonic::Response<()>, tonic::Status> = grpc
        .unary(
            tonic::Request::new(()),
            http::uri::PathAndQuery::from_static("/composer.v1.RunService/MadeUp12345"),
            tonic_prost::ProstCodec::<(), ()>::default(),
        )
        .await;
    assert_eq!(
        made_up.expect_err("no such method").code(),
        tonic::Code::Unimplemented
    );
    let text = get(&format!("{base}/metrics")).await.1;
    assert!(
        !text.contains("MadeUp12345"),
        "an invented path is not a label"
    );
    assert!(
        sample(
            &text,
            "composer_grpc_requests_total",
            &["method=\"unknown\""]
        )
        .is_some()
    );

    // draining: not ready, still alive
    server.signal(nix::sys::signal::Signal::SIGTERM);
    let mut ready = 200;
    for _ in 0..50 {
        ready = get(&format!("{base}/readyz")).await.0;
        if ready == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ready, 503, "a draining server is not ready");
}

/// `--metrics-tenant-labels false`: /metrics (which needs no token) names
/// no namespace, workflow or queue; every such label reads `_all`. Every
/// answer of the port carries `nosniff` and the CSP, a 404 included.
#[tokio::test]
async fn without_tenant_labels_metrics_name_no_tenant() {
    let metrics = free_addr();
    let server = ServerProcess::start(
        &composer_binary(),
        &[
            "--metrics-listen",
            &metrics,
            "--metrics-tenant-labels",
            "false",
        ],
    )
    .await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(
            "name: secret_project\nnodes:\n  - { id: a, type: TASK, queue: hidden_queue, task: t }\n",
        )
        .await;
    let worker = TestWorker::start(&server.url(), &["hidden_queue"], 1, 4, |_| {
        Outcome::Complete(json!({}))
    })
    .await;
    let run = client.start("secret_project", json!({})).await;
    assert_eq!(
        client.wait_done(&run, WAIT).await.status(),
        RunStatus::Completed
    );
    drop(worker);
    let base = format!("http://{metrics}");
    let text = get(&format!("{base}/metrics")).await.1;
    let all = ["namespace=\"_all\"", "workflow=\"_all\""];
    assert_eq!(
        sample(&text, "composer_runs_started_total", &all),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "composer_tasks_leased_total",
            &["namespace=\"_all\"", "queue=\"_all\""]
        ),
        Some(1.0),
        "{text}"
    );
    for name in ["default", "secret_project", "hidden_queue"] {
        assert!(
            !text.contains(&format!("\"{name}\"")),
            "/metrics names {name}: {text}"
        );
    }
    for path in ["/metrics", "/healthz", "/no-such-page"] {
        let answer = reqwest::get(format!("{base}{path}")).await.expect("http");
        let header = |name: &str| {
            answer
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        assert!(
            header("content-security-policy").contains("default-src 'self'"),
            "{path}"
        );
    }
}
