//! Secrets end to end (issue 38, decision 0044): the real binary with a
//! key-encryption key, a real HTTP endpoint on loopback, the value set
//! through `composer secret set` (standard input). The endpoint gets the
//! value; afterwards it is nowhere in Postgres, Redis, the server's debug
//! log or the API's answers, and what the endpoint echoed is stored as
//! `[secret NAME]`.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use composer_proto::v1::{
    GetRunHistoryRequest, GetRunRequest, ListRunsRequest, ListSecretsRequest,
    RegisterWorkflowRequest, RunStatus, SetSecretRequest, WatchRunRequest,
    run_service_client::RunServiceClient, secret_service_client::SecretServiceClient,
    workflow_service_client::WorkflowServiceClient,
};
use composer_testkit::{ServerProcess, client::TestClient, fresh_database, fresh_redis_url};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use tonic::{Code, transport::Channel};

use crate::common::{
    TOKEN_ARGS, authed,
    cli::{binary, composer, finish},
    free_addr, violated_field,
};

/// A token of `namespace` with `roles`.
fn token(namespace: &str, roles: &[&str]) -> String {
    crate::common::token(
        namespace,
        &format!("{namespace}-{}", roles.join("-")),
        roles,
    )
}

const WAIT: Duration = Duration::from_secs(60);

/// Writes a key file (64 hex digits of `byte`) into `dir`.
fn key_file(dir: &Path, name: &str, byte: u8) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{byte:02x}").repeat(32) + "\n").expect("key file");
    path
}

async fn start(database: &str, redis: &str, keys: &[&Path], extra: &[&str]) -> ServerProcess {
    let joined = keys
        .iter()
        .map(|k| k.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(",");
    let mut args = vec!["--http-allow-loopback", "--log", "debug"];
    if !keys.is_empty() {
        args.extend(["--secrets-key-file", joined.as_str()]);
    }
    args.extend_from_slice(extra);
    ServerProcess::start_with(&binary(), database, redis, &args).await
}

/// `composer secret set NAME` with the value on standard input.
async fn set_secret(server: &ServerProcess, name: &str, value: &str) {
    let outcome = finish(composer(server, &["secret", "set", name]), Some(value)).await;
    assert_eq!(outcome.code, 0, "{outcome:#?}");
    assert!(!outcome.stdout.contains(value) && !outcome.stderr.contains(value));
}

/// What the endpoint got: each request's Authorization header and body.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A local endpoint that echoes the Authorization header it got: in a 200
/// JSON body on `/ok`, in a 400 text body on `/fail`.
async fn echo_endpoint() -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen: Seen = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 64 * 1024];
                let mut read = 0;
                loop {
                    let text = String::from_utf8_lossy(&buffer[..read]).into_owned();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|l| {
                                l.to_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().to_owned())
                            })
                            .and_then(|v| v.parse::<usize>().ok())
                            .unwrap_or(0);
                        if read >= end + 4 + length {
                            break;
                        }
                    }
                    match socket.read(&mut buffer[read..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read += n,
                    }
                }
                let request = String::from_utf8_lossy(&buffer[..read]).into_owned();
                let (head, body) = request.split_once("\r\n\r\n").unwrap_or((&request, ""));
                let auth = head
                    .lines()
                    .find_map(|l| {
                        l.split_once(':')
                            .filter(|(k, _)| k.eq_ignore_ascii_case("authorization"))
                            .map(|(_, v)| v.trim().to_owned())
                    })
                    .unwrap_or_default();
                record
                    .lock()
                    .expect("seen")
                    .push((auth.clone(), body.to_owned()));
                let response = if head.starts_with("POST /fail") {
                    let text = format!("refused: {auth}");
                    format!(
                        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                        text.len()
                    )
                } else {
                    let text = json!({ "auth": auth, "got": body }).to_string();
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                        text.len()
                    )
                };
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    (format!("http://{addr}"), seen)
}

fn calling(name: &str, endpoint: &str, path: &str) -> String {
    format!(
        r#"
name: {name}
nodes:
  - id: call
    type: HTTP
    http:
      method: POST
      url: "{endpoint}/{path}"
      headers: {{ Authorization: "Bearer ${{secrets.partner_key}}" }}
      body: {{ note: "${{input.note}}" }}
output: {{ echoed: "${{nodes.call.output.body.auth}}", got: "${{nodes.call.output.body.got}}" }}
"#
    )
}

/// Every OTLP export request's bytes (a span's strings are their UTF-8 in
/// the protobuf, so a value in any attribute shows as a substring).
type Exports = Arc<Mutex<Vec<u8>>>;

/// An OTLP/HTTP receiver on loopback: its base URL and what it got.
async fn trace_receiver() -> (String, Exports) {
    use axum::{Router, body::Bytes, extract::State, routing::post};
    async fn receive(State(exports): State<Exports>, body: Bytes) -> Vec<u8> {
        exports.lock().expect("exports").extend_from_slice(&body);
        Vec::new()
    }
    let exports: Exports = Arc::default();
    let app = Router::new()
        .route("/v1/traces", post(receive))
        .with_state(Arc::clone(&exports));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, exports)
}

/// `pg_dump`, from PATH or Debian's versioned folder (which is not on PATH).
fn pg_dump_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("pg_dump"))
        .find(|candidate| candidate.is_file());
    let debian = || {
        let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path().join("bin/pg_dump"))
            .filter(|candidate| candidate.is_file())
            .collect();
        found.sort();
        found.pop()
    };
    on_path
        .or_else(debian)
        .expect("pg_dump (postgresql-client) is needed")
}

/// A plain-text `pg_dump` of the whole database: schema and every row.
async fn database_dump(database: &str) -> String {
    let output = tokio::process::Command::new(pg_dump_binary())
        .args(["--no-owner", "--dbname", database])
        .output()
        .await
        .expect("pg_dump runs");
    assert!(
        output.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("a UTF-8 dump")
}

/// Whether `text` holds `value` as written or as a `bytea` column's hex.
fn holds(text: &str, value: &str) -> bool {
    let hex: String = value.bytes().map(|b| format!("{b:02x}")).collect();
    text.contains(value) || text.contains(&hex)
}

/// A reply's bytes as text (lossy where they are not UTF-8), whatever its shape.
fn flatten(value: &redis::Value, into: &mut String) {
    match value {
        redis::Value::BulkString(bytes) => into.push_str(&String::from_utf8_lossy(bytes)),
        redis::Value::SimpleString(text) => into.push_str(text),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            for item in items {
                flatten(item, into);
                into.push(' ');
            }
        }
        redis::Value::Map(pairs) => {
            for (key, item) in pairs {
                flatten(key, into);
                into.push(' ');
                flatten(item, into);
                into.push(' ');
            }
        }
        other => into.push_str(&format!("{other:?}")),
    }
}

/// Every key of the Redis database with its contents, as text.
async fn redis_text(redis_url: &str) -> String {
    let client = redis::Client::open(redis_url).expect("redis url");
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut redis)
        .await
        .expect("keys");
    let mut all = String::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .expect("type");
        let command = match kind.as_str() {
            "string" => redis::cmd("GET").arg(&key).clone(),
            "hash" => redis::cmd("HGETALL").arg(&key).clone(),
            "list" => redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).clone(),
            "set" => redis::cmd("SMEMBERS").arg(&key).clone(),
            "zset" => redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).clone(),
            "stream" => redis::cmd("XRANGE").arg(&key).arg("-").arg("+").clone(),
            _ => continue,
        };
        let value: redis::Value = command.query_async(&mut redis).await.expect("value");
        all.push_str(&format!("{key} "));
        flatten(&value, &mut all);
        all.push('\n');
    }
    all
}

/// The issue's first proof: the endpoint gets the value; it is stored
/// nowhere, and what the endpoint echoed back is stored redacted.
#[tokio::test]
async fn an_http_node_sends_the_secret_and_nothing_keeps_it() {
    let dir = tempfile::tempdir().expect("dir");
    let key = key_file(dir.path(), "kek", 0x11);
    let (database, redis) = (fresh_database().await, fresh_redis_url());
    let (collector, exports) = trace_receiver().await;
    let metrics = free_addr();
    let server = start(
        &database,
        &redis,
        &[&key],
        &["--otlp-endpoint", &collector, "--metrics-listen", &metrics],
    )
    .await;
    let value = format!("pk_live_{}", uuid::Uuid::new_v4().simple());
    set_secret(&server, "partner_key", &value).await;
    let (endpoint, seen) = echo_endpoint().await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(&calling("partner", &endpoint, "ok")).await;
    client
        .register(&calling("refused", &endpoint, "fail"))
        .await;

    // data that looks like a reference stays data
    let ok = client
        .start("partner", json!({ "note": "${secrets.partner_key}" }))
        .await;
    let done = client.wait_done(&ok, WAIT).await;
    assert_eq!(done.status(), RunStatus::Completed, "{done:#?}");
    let failed = client.start("refused", json!({ "note": "x" })).await;
    let failed_run = client.wait_done(&failed, WAIT).await;
    assert_eq!(failed_run.status(), RunStatus::Failed, "{failed_run:#?}");

    let requests = seen.lock().expect("seen").clone();
    assert_eq!(requests[0].0, format!("Bearer {value}"));
    assert!(
        requests[0].1.contains("${secrets.partner_key}") && !requests[0].1.contains(&value),
        "the input's look-alike went as text: {}",
        requests[0].1
    );
    let output = composer_testkit::client::output_of(&done);
    assert_eq!(output["echoed"], "Bearer [secret partner_key]");
    let error = failed_run.error.clone().expect("error");
    assert!(error.message.contains("[secret partner_key]"), "{error:?}");

    let mut answers = format!("{done:?}{failed_run:?}");
    let channel = Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut runs = RunServiceClient::new(channel.clone());
    for run_id in [&ok, &failed] {
        let run = runs
            .get_run(GetRunRequest {
                run_id: run_id.clone(),
                skip_nodes: false,
            })
            .await
            .expect("get");
        answers.push_str(&format!("{:?}", run.into_inner()));
        let history = runs
            .get_run_history(GetRunHistoryRequest {
                run_id: run_id.clone(),
                page_size: 1000,
                page_token: String::new(),
            })
            .await
            .expect("history");
        answers.push_str(&format!("{:?}", history.into_inner()));
        let mut watch = runs
            .watch_run(WatchRunRequest {
                run_id: run_id.clone(),
            })
            .await
            .expect("watch")
            .into_inner();
        let first = watch.message().await.expect("watch message");
        answers.push_str(&format!("{first:?}"));
    }
    let listed = runs
        .list_runs(ListRunsRequest::default())
        .await
        .expect("list");
    answers.push_str(&format!("{:?}", listed.into_inner()));
    let secrets = SecretServiceClient::new(channel)
        .list_secrets(ListSecretsRequest::default())
        .await
        .expect("list secrets");
    answers.push_str(&format!("{:?}", secrets.into_inner()));
    assert!(
        answers.contains("${secrets.partner_key}"),
        "the input shows the reference"
    );
    assert!(!answers.contains(&value), "an API answer holds the value");

    let dump = database_dump(&database).await;
    assert!(
        dump.contains("partner_key") && dump.contains("[secret partner_key]"),
        "the dump holds the secret's name and the redacted echo"
    );
    assert!(!holds(&dump, &value), "Postgres holds the value");
    let stored = redis_text(&redis).await;
    assert!(stored.contains("composer"), "Redis was read: {stored:.200}");
    assert!(!holds(&stored, &value), "Redis holds the value");
    let metrics = reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics");
    assert!(
        metrics.contains("workflow=\"partner\""),
        "the runs are counted: {metrics:.300}"
    );
    assert!(!holds(&metrics, &value), "the metrics hold the value");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while exports.lock().expect("exports").is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no trace exported");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // the runs' spans went out: give the last batch its export interval
    tokio::time::sleep(Duration::from_secs(6)).await;
    let exported = exports.lock().expect("exports").clone();
    assert!(
        !exported.windows(value.len()).any(|w| w == value.as_bytes()),
        "an exported trace holds the value"
    );
    let log = server.stderr_lines().join("\n");
    assert!(
        log.contains("DEBUG") || log.contains("\"level\":\"DEBUG\""),
        "a debug log"
    );
    assert!(!log.contains(&value), "the server's log holds the value");
}

/// Each run uses the version current when its node executes.
#[tokio::test]
async fn a_run_uses_the_version_current_at_its_execution() {
    let dir = tempfile::tempdir().expect("dir");
    let key = key_file(dir.path(), "kek", 0x22);
    let server = start(&fresh_database().await, &fresh_redis_url(), &[&key], &[]).await;
    let (endpoint, seen) = echo_endpoint().await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(&calling("partner", &endpoint, "ok")).await;
    for value in ["first-value-1", "second-value-2"] {
        set_secret(&server, "partner_key", value).await;
        let run = client.start("partner", json!({ "note": "n" })).await;
        let done = client.wait_done(&run, WAIT).await;
        assert_eq!(done.status(), RunStatus::Completed, "{done:#?}");
        let last = seen
            .lock()
            .expect("seen")
            .last()
            .cloned()
            .expect("a request");
        assert_eq!(last.0, format!("Bearer {value}"));
    }
}

/// A key rotation: a new key given first, `secret rewrap`, the old key
/// dropped: the secret is still used; a server given only the old key
/// afterwards says which key it lacks.
#[tokio::test]
async fn rewrap_moves_the_data_key_to_the_new_key_encryption_key() {
    let dir = tempfile::tempdir().expect("dir");
    let (old, new) = (
        key_file(dir.path(), "old", 0x33),
        key_file(dir.path(), "new", 0x44),
    );
    let (database, redis) = (fresh_database().await, fresh_redis_url());
    let (endpoint, seen) = echo_endpoint().await;
    let mut server = start(&database, &redis, &[&old], &[]).await;
    set_secret(&server, "partner_key", "rotated-value").await;
    TestClient::connect(&server.url())
        .await
        .register(&calling("partner", &endpoint, "ok"))
        .await;
    server.kill().await;

    let mut server = start(&database, &redis, &[&new, &old], &[]).await;
    let outcome = finish(composer(&server, &["secret", "rewrap", "-o", "json"]), None).await;
    assert_eq!(outcome.code, 0, "{outcome:#?}");
    let answer: serde_json::Value = serde_json::from_str(&outcome.stdout).expect("json");
    assert_eq!(answer["rewrapped"], 1, "{answer}");
    server.kill().await;

    let mut server = start(&database, &redis, &[&new], &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    let run = client.start("partner", json!({ "note": "n" })).await;
    assert_eq!(
        client.wait_done(&run, WAIT).await.status(),
        RunStatus::Completed
    );
    assert_eq!(
        seen.lock().expect("seen").last().map(|r| r.0.clone()),
        Some("Bearer rotated-value".to_owned())
    );
    server.kill().await;

    let server = start(&database, &redis, &[&old], &[]).await;
    let refused = finish(composer(&server, &["secret", "set", "other"]), Some("v")).await;
    assert_ne!(refused.code, 0);
    let mut client = TestClient::connect(&server.url()).await;
    let run = client.start("partner", json!({ "note": "n" })).await;
    let failed = client.wait_done(&run, WAIT).await;
    let error = failed.error.clone().expect("error");
    assert_eq!(error.code, "SECRET_UNAVAILABLE", "{failed:#?}");
    assert!(error.message.contains("was not given"), "{error:?}");
}

/// Wrong role, another namespace, a bad name, a 1 MB value, `secrets.` in
/// a place it may not stand, and a server without a key: each refused,
/// naming what is wrong.
#[tokio::test]
async fn what_may_not_touch_a_secret_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let key = key_file(dir.path(), "kek", 0x55);
    let server = start(
        &fresh_database().await,
        &fresh_redis_url(),
        &[&key],
        &TOKEN_ARGS,
    )
    .await;
    let channel = Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut secrets = SecretServiceClient::new(channel.clone());
    let set = |name: &str, value: Vec<u8>, token: &str| {
        authed(
            SetSecretRequest {
                name: name.to_owned(),
                value,
            },
            token,
        )
    };
    let operator = token("tenant-a", &["operator"]);
    secrets
        .set_secret(set("api_key", b"tenant-a-value".to_vec(), &operator))
        .await
        .expect("an operator sets");
    for role in ["reader", "client", "worker"] {
        let refused = secrets
            .set_secret(set("api_key", b"x".to_vec(), &token("tenant-a", &[role])))
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::PermissionDenied, "{role}");
        let refused = secrets
            .list_secrets(authed(
                ListSecretsRequest::default(),
                &token("tenant-a", &[role]),
            ))
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::PermissionDenied, "{role} lists");
    }
    let other = token("tenant-b", &["operator"]);
    let listed = secrets
        .list_secrets(authed(ListSecretsRequest::default(), &other))
        .await
        .expect("list")
        .into_inner();
    assert!(listed.secrets.is_empty(), "another namespace sees none");
    for (name, value, field) in [
        ("not a name!", b"v".to_vec(), "name"),
        ("", b"v".to_vec(), "name"),
        ("big", vec![b'x'; 1024 * 1024], "value"),
        ("empty", Vec::new(), "value"),
    ] {
        let refused = secrets
            .set_secret(set(name, value, &operator))
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument, "{name}");
        assert_eq!(violated_field(&refused), field, "{name}");
    }

    let mut workflows = WorkflowServiceClient::new(channel);
    for (source, field) in [
        (
            "name: leak\nnodes:\n  - { id: t, type: TASK, queue: q, task: t, input: { k: \"${secrets.api_key}\" } }\n",
            "nodes[0].input.k",
        ),
        (
            "name: leak\nnodes:\n  - { id: t, type: TASK, queue: q, task: t }\noutput: { k: \"${secrets.api_key}\" }\n",
            "output.k",
        ),
        (
            "name: leak\nnodes:\n  - { id: h, type: HTTP, http: { method: GET, url: \"http://example.com/${secrets.api_key + 'x'}\" } }\n",
            "nodes[0].http.url",
        ),
    ] {
        let refused = workflows
            .register_workflow(authed(
                RegisterWorkflowRequest {
                    source: source.to_owned(),
                },
                &operator,
            ))
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument, "{source}");
        assert_eq!(violated_field(&refused), field, "{source}");
        assert!(
            refused.message().contains("secrets") || format!("{refused:?}").contains("secrets")
        );
    }

    let keyless = ServerProcess::start(&binary(), &[]).await;
    let refused = finish(composer(&keyless, &["secret", "set", "k"]), Some("v")).await;
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("--secrets-key-file"),
        "{refused:#?}"
    );
}

/// A CODE node's declared secrets reach its code runner with the lease
/// (and nothing else does): the task's stored input names them only, a
/// node that declares none is handed none, a TASK node may not declare
/// any, and an unset one fails the attempt instead of running without it.
#[tokio::test]
async fn a_code_runner_gets_exactly_the_secrets_its_node_declares() {
    use composer_proto::v1::{PollTasksRequest, worker_service_client::WorkerServiceClient};
    let dir = tempfile::tempdir().expect("dir");
    let key = key_file(dir.path(), "kek", 0x66);
    let (database, redis) = (fresh_database().await, fresh_redis_url());
    let server = start(&database, &redis, &[&key], &[]).await;
    set_secret(&server, "signing_key", "code-secret-value").await;
    let mut client = TestClient::connect(&server.url()).await;
    client
        .register(
            "name: signer\nnodes:\n  - { id: sign, type: CODE, language: python, secrets: [signing_key], code: \"result = 1\" }\n  - { id: plain, type: CODE, language: python, code: \"result = 2\" }\nedges:\n  - { from: sign, to: plain }\n",
        )
        .await;
    let run = client.start("signer", json!({ "p": 1 })).await;
    let mut workers = WorkerServiceClient::connect(server.url())
        .await
        .expect("connect");
    let poll = PollTasksRequest {
        worker_id: "runner".to_owned(),
        queues: vec!["code.python".to_owned()],
        max_tasks: 1,
        wait: Some(prost_types::Duration {
            seconds: 10,
            nanos: 0,
        }),
        confirm_receipt: false,
    };
    async fn next_task(
        workers: &mut WorkerServiceClient<Channel>,
        poll: &PollTasksRequest,
    ) -> composer_proto::v1::Task {
        let mut tasks = workers
            .poll_tasks(poll.clone())
            .await
            .expect("poll")
            .into_inner()
            .tasks;
        tasks.pop().expect("a task")
    }
    let task = next_task(&mut workers, &poll).await;
    assert_eq!(task.node_id, "sign");
    assert_eq!(
        task.secrets.get("signing_key").map(String::as_str),
        Some("code-secret-value")
    );
    let input = composer_grpc::convert::to_json(task.input.clone(), "input").expect("input");
    assert_eq!(input["secrets"], json!(["signing_key"]), "{input}");
    workers
        .complete_task(composer_proto::v1::CompleteTaskRequest {
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            lease_token: task.lease_token.clone(),
            output: Some(composer_grpc::convert::from_json(
                &json!({ "signed": true }),
            )),
        })
        .await
        .expect("complete");
    let plain = next_task(&mut workers, &poll).await;
    assert_eq!(plain.node_id, "plain");
    assert!(plain.secrets.is_empty(), "{plain:?}");
    let plain_input = composer_grpc::convert::to_json(plain.input.clone(), "input").expect("input");
    assert!(plain_input.get("secrets").is_none(), "{plain_input}");
    assert!(!holds(&database_dump(&database).await, "code-secret-value"));
    drop(run);

    let refused = WorkflowServiceClient::connect(server.url())
        .await
        .expect("connect")
        .register_workflow(RegisterWorkflowRequest {
            source: "name: t\nnodes:\n  - { id: t, type: TASK, queue: q, task: t, secrets: [signing_key] }\n".to_owned(),
        })
        .await
        .expect_err("refused");
    assert_eq!(violated_field(&refused), "nodes[0].secrets");

    client
        .register(
            "name: unset\nnodes:\n  - { id: sign, type: CODE, language: python, secrets: [never_set], code: \"result = 1\" }\n",
        )
        .await;
    let unset = client.start("unset", json!({})).await;
    let handed = workers
        .poll_tasks(PollTasksRequest {
            wait: Some(prost_types::Duration {
                seconds: 2,
                nanos: 0,
            }),
            ..poll
        })
        .await
        .expect("poll")
        .into_inner()
        .tasks;
    assert!(
        handed.is_empty(),
        "a task whose secret is unset is not handed out: {handed:?}"
    );
    let history = client.history(&unset).await;
    let failed = history
        .iter()
        .find(|e| e.event_type == "attempt_failed")
        .expect("the attempt failed");
    let details =
        composer_grpc::convert::to_json(failed.details.clone(), "details").expect("details");
    assert_eq!(details["code"], "SECRET_UNAVAILABLE", "{details}");
}
