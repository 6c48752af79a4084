//! End-to-end: the real `composer` binary against real Postgres and Redis.

use std::{path::PathBuf, process::Command as StdCommand, time::Duration};

use composer_proto::v1::{
    GetServerInfoRequest, GetServerInfoResponse, StartRunRequest,
    run_service_client::RunServiceClient, server_service_client::ServerServiceClient,
};
use composer_testkit::ServerProcess;
use nix::sys::signal::Signal;
use prost::Message;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

async fn health_status(url: &str) -> Result<ServingStatus, tonic::Status> {
    let channel = tonic::transport::Channel::from_shared(url.to_owned())
        .expect("valid url")
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    Ok(response.into_inner().status())
}

/// grpcurl from COMPOSER_GRPCURL, the project's `.tools/bin`, or PATH.
fn grpcurl() -> PathBuf {
    if let Some(path) = std::env::var_os("COMPOSER_GRPCURL") {
        return PathBuf::from(path);
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools/bin/grpcurl");
    if local.is_file() {
        return local;
    }
    PathBuf::from("grpcurl")
}

fn run_grpcurl(args: &[&str]) -> String {
    let output = StdCommand::new(grpcurl())
        .args(args)
        .output()
        .expect("grpcurl runs (installed by scripts/setup.sh)");
    assert!(
        output.status.success(),
        "grpcurl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn serve_starts_on_an_ephemeral_port_and_reports_serving() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    assert_ne!(server.addr, "127.0.0.1:0");
    assert_eq!(
        health_status(&server.url()).await.expect("health answers"),
        ServingStatus::Serving
    );

    let channel = tonic::transport::Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let info = ServerServiceClient::new(channel.clone())
        .get_server_info(GetServerInfoRequest {})
        .await
        .expect("GetServerInfo answers")
        .into_inner();
    assert_eq!(info.protocol_version, composer_proto::PROTOCOL_VERSION);
    assert_eq!(info.server_version, env!("CARGO_PKG_VERSION"));
    assert!(info.features.iter().any(|f| f == "grpc-web"));

    let refused = RunServiceClient::new(channel)
        .start_run(StartRunRequest::default())
        .await
        .expect_err("a StartRun without a workflow is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("workflow_name"),
        "{}",
        refused.message()
    );
}

#[tokio::test]
async fn reflection_lists_every_service_and_describe_shows_the_contracts() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let listed = run_grpcurl(&["-plaintext", &server.addr, "list"]);
    for service in [
        "composer.v1.WorkflowService",
        "composer.v1.RunService",
        "composer.v1.WorkerService",
        "composer.v1.ServerService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            listed.lines().any(|line| line.trim() == service),
            "{service} missing from:\n{listed}"
        );
    }
    let described = run_grpcurl(&[
        "-plaintext",
        &server.addr,
        "describe",
        "composer.v1.WorkerService",
    ]);
    assert!(
        described.contains("LEASE_LOST"),
        "the worker protocol contract is missing:\n{described}"
    );
    assert!(described.contains("rpc CompleteTask"), "{described}");
    let method = run_grpcurl(&[
        "-plaintext",
        &server.addr,
        "describe",
        "composer.v1.RunService.StartRun",
    ]);
    assert!(method.contains("idempotency_key"), "{method}");
}

#[tokio::test]
async fn grpcurl_decodes_the_details_of_an_error_through_reflection() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let output = StdCommand::new(grpcurl())
        .args([
            "-plaintext",
            "-d",
            r#"{"workflow_name": "no:colons"}"#,
            &server.addr,
            "composer.v1.RunService/StartRun",
        ])
        .output()
        .expect("grpcurl runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("InvalidArgument"), "{stderr}");
    // decoded, not "unknown type" or raw bytes
    assert!(
        stderr.contains("google.rpc.BadRequest") && stderr.contains("\"field\": \"workflow_name\""),
        "grpcurl could not decode the details:\n{stderr}"
    );
}

/// A grpc-web call as a browser makes it: HTTP/1.1, a length-prefixed frame
/// in the body, the status in a trailer frame.
#[tokio::test]
async fn grpc_web_over_http1_answers_get_server_info() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut body = vec![0u8, 0, 0, 0, 0]; // uncompressed, empty message
    body.extend(GetServerInfoRequest {}.encode_to_vec());
    let response = reqwest::Client::builder()
        .http1_only()
        .build()
        .expect("client")
        .post(format!(
            "{}/composer.v1.ServerService/GetServerInfo",
            server.url()
        ))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .body(body)
        .send()
        .await
        .expect("grpc-web request");
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), reqwest::Version::HTTP_11);
    let bytes = response.bytes().await.expect("body");

    let (message, rest) = read_frame(&bytes);
    assert_eq!(message.0 & 0x80, 0, "first frame is the message");
    let info = GetServerInfoResponse::decode(message.1).expect("decodes");
    assert_eq!(info.protocol_version, composer_proto::PROTOCOL_VERSION);
    let (trailers, _) = read_frame(rest);
    assert_eq!(trailers.0 & 0x80, 0x80, "second frame is the trailers");
    let trailers = String::from_utf8_lossy(trailers.1);
    assert!(trailers.contains("grpc-status:0"), "{trailers}");
}

fn read_frame(bytes: &[u8]) -> ((u8, &[u8]), &[u8]) {
    assert!(bytes.len() >= 5, "frame header present");
    let flags = bytes[0];
    let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
    ((flags, &bytes[5..5 + len]), &bytes[5 + len..])
}

#[tokio::test]
async fn sigterm_reports_not_serving_then_exits_zero_within_five_seconds() {
    let mut server = ServerProcess::start(&composer_binary(), &["--drain-delay", "1500ms"]).await;
    assert_eq!(
        health_status(&server.url()).await.expect("health"),
        ServingStatus::Serving
    );
    let signalled = std::time::Instant::now();
    server.signal(Signal::SIGTERM);

    let mut saw_not_serving = false;
    while signalled.elapsed() < Duration::from_secs(1) {
        if let Ok(ServingStatus::NotServing) = health_status(&server.url()).await {
            saw_not_serving = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(saw_not_serving, "health never turned NOT_SERVING");

    let status = server
        .wait(Duration::from_secs(5))
        .await
        .expect("exited within 5 s of SIGTERM");
    assert!(status.success(), "exit status {status:?}");
    assert!(
        server
            .stderr_lines()
            .iter()
            .any(|line| line.contains("\"stopped\"")),
        "logs say it stopped"
    );
}

#[tokio::test]
async fn an_open_watch_does_not_hold_a_stopping_server() {
    let mut server = ServerProcess::start(&composer_binary(), &["--drain-delay", "500ms"]).await;
    let channel = tonic::transport::Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    composer_proto::v1::workflow_service_client::WorkflowServiceClient::new(channel.clone())
        .register_workflow(composer_proto::v1::RegisterWorkflowRequest {
            source: "name: waits\nnodes:\n  - { id: w, type: WAIT_FOR_EVENT, event: go }\n"
                .to_owned(),
        })
        .await
        .expect("register");
    let mut runs = RunServiceClient::new(channel);
    let run = runs
        .start_run(StartRunRequest {
            workflow_name: "waits".to_owned(),
            ..Default::default()
        })
        .await
        .expect("start")
        .into_inner()
        .run
        .expect("run");
    let mut watch = runs
        .watch_run(composer_proto::v1::WatchRunRequest {
            run_id: run.run_id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    watch.message().await.expect("first").expect("a snapshot");
    server.signal(Signal::SIGTERM);
    // snapshots may still come (the watch re-reads every second) until the
    // stream ends with a status telling the client to watch again
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the watch ended within 5 s of SIGTERM");
    let status = ended.expect_err("the watch ends with a status");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let exit = server
        .wait(Duration::from_secs(5))
        .await
        .expect("exited within 5 s of SIGTERM with a watch open");
    assert!(exit.success(), "{exit:?}");
}

#[test]
fn a_bad_database_url_exits_non_zero_with_one_line_naming_the_setting() {
    let output = StdCommand::new(composer_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--insecure"])
        .args([
            "--database-url",
            "not a url",
            "--redis-url",
            "redis://127.0.0.1:1/0",
        ])
        .output()
        .expect("composer runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line, got:\n{stderr}");
    assert!(lines[0].contains("COMPOSER_DATABASE_URL"), "{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"));
}

#[test]
fn an_unreachable_database_names_the_setting_too() {
    let output = StdCommand::new(composer_binary())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--connect-timeout",
            "1s",
            "--insecure",
        ])
        .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
        .args(["--redis-url", "redis://127.0.0.1:1/0"])
        .output()
        .expect("composer runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("COMPOSER_DATABASE_URL"), "{stderr}");
    assert!(!stderr.contains("panicked"));
}

#[test]
fn serve_without_a_token_key_refuses_to_start_unless_told_insecure() {
    let output = StdCommand::new(composer_binary())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
        .args(["--redis-url", "redis://127.0.0.1:1/0"])
        .env_remove("COMPOSER_AUTH_SECRET")
        .env_remove("COMPOSER_INSECURE")
        .output()
        .expect("composer runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("COMPOSER_AUTH_SECRET") && stderr.contains("--insecure"),
        "{stderr}"
    );
}

#[test]
fn composer_token_mints_a_token_and_refuses_an_unknown_role() {
    let secret = "0123456789abcdef0123456789abcdef0123456789";
    let output = StdCommand::new(composer_binary())
        .args([
            "token", "--sub", "ci", "--ns", "team-a", "--role", "worker", "--queues", "a,b",
            "--ttl", "1h",
        ])
        .env("COMPOSER_AUTH_SECRET", secret)
        .output()
        .expect("composer runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let token = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let payload = token.split('.').nth(1).expect("a JWT has three parts");
    use base64::Engine;
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .expect("base64"),
    )
    .expect("json");
    assert_eq!(claims["sub"], "ci");
    assert_eq!(claims["ns"], "team-a");
    assert_eq!(claims["roles"], serde_json::json!(["worker"]));
    assert_eq!(claims["queues"], serde_json::json!(["a", "b"]));
    assert_eq!(
        claims["exp"].as_u64().unwrap_or_default() - claims["iat"].as_u64().unwrap_or_default(),
        3600
    );

    let refused = StdCommand::new(composer_binary())
        .args(["token", "--sub", "ci", "--role", "superuser"])
        .env("COMPOSER_AUTH_SECRET", secret)
        .output()
        .expect("composer runs");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unknown role"));
}
