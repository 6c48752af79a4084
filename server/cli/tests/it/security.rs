//! The tenant boundary, tried as an attacker would (SECURITY.md): names
//! that could spell another tenant's keys, stream messages that name
//! another tenant's task, the server's own queue, reports with a lease
//! token learnt by other means, and tokens missing a configured claim.

use std::{path::PathBuf, time::Duration};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use composer_coordinator::dispatch::streams::stream_key;
use composer_grpc::auth::{NewToken, SigningKey, mint};
use composer_proto::v1::{
    CompleteTaskRequest, FailTaskRequest, GetRunRequest, GetWorkflowRequest, HeartbeatRequest,
    ListRunsRequest, PollTasksRequest, RegisterWorkflowRequest, RunStatus, SendEventRequest,
    StartRunRequest, Task, run_service_client::RunServiceClient, send_event_request::Target,
    worker_service_client::WorkerServiceClient, workflow_service_client::WorkflowServiceClient,
};
use composer_testkit::{ServerProcess, fresh_database, fresh_redis_url};
use sqlx::{Connection, PgConnection};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use tonic::{Code, Request, transport::Channel};
use tonic_types::StatusExt;

use crate::common::violated_field;

const SECRET: &str = "a-test-secret-that-is-long-enough-for-hs256-0123456789";

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn claims(ns: &str, roles: &[&str], queues: Option<&[&str]>) -> NewToken {
    let now = now();
    NewToken {
        sub: format!("{ns}-{}", roles.join("-")),
        ns: ns.to_owned(),
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        queues: queues.map(|q| q.iter().map(|s| (*s).to_owned()).collect()),
        iat: now,
        nbf: now,
        exp: now + 3600,
        iss: None,
        aud: None,
    }
}

fn token(ns: &str, roles: &[&str], queues: Option<&[&str]>) -> String {
    mint(
        &claims(ns, roles, queues),
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

async fn channel(server: &ServerProcess) -> Channel {
    Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

fn poll(queues: &[&str], wait_ms: i32) -> PollTasksRequest {
    PollTasksRequest {
        confirm_receipt: false,
        worker_id: "attacker".to_owned(),
        queues: queues.iter().map(|q| (*q).to_owned()).collect(),
        max_tasks: 10,
        wait: Some(prost_types::Duration {
            seconds: i64::from(wait_ms / 1000),
            nanos: (wait_ms % 1000) * 1_000_000,
        }),
    }
}

/// Polls until a task comes (or ~20 s pass).
async fn poll_one(worker: &mut WorkerServiceClient<Channel>, token: &str, queue: &str) -> Task {
    for _ in 0..20 {
        let mut tasks = worker
            .poll_tasks(authed(poll(&[queue], 1000), token))
            .await
            .expect("poll")
            .into_inner()
            .tasks;
        if let Some(task) = tasks.pop() {
            return task;
        }
    }
    panic!("no task on {queue}");
}

async fn register(channel: &Channel, token: &str, source: &str) {
    WorkflowServiceClient::new(channel.clone())
        .register_workflow(authed(
            RegisterWorkflowRequest {
                source: source.to_owned(),
            },
            token,
        ))
        .await
        .expect("register");
}

async fn start(channel: &Channel, token: &str, workflow: &str) -> String {
    RunServiceClient::new(channel.clone())
        .start_run(authed(
            StartRunRequest {
                workflow_name: workflow.to_owned(),
                ..Default::default()
            },
            token,
        ))
        .await
        .expect("start")
        .into_inner()
        .run
        .expect("run")
        .run_id
}

async fn run_status(channel: &Channel, token: &str, run_id: &str) -> composer_proto::v1::Run {
    RunServiceClient::new(channel.clone())
        .get_run(authed(
            GetRunRequest {
                run_id: run_id.to_owned(),
                skip_nodes: false,
            },
            token,
        ))
        .await
        .expect("get run")
        .into_inner()
        .run
        .expect("run")
}

async fn wait_done(channel: &Channel, token: &str, run_id: &str) -> composer_proto::v1::Run {
    for _ in 0..300 {
        let run = run_status(channel, token, run_id).await;
        if !matches!(run.status(), RunStatus::Running | RunStatus::Unspecified) {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("run {run_id} did not end");
}

#[tokio::test]
async fn every_name_follows_one_rule_at_every_entry_point() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let channel = channel(&server).await;
    let mut workflows = WorkflowServiceClient::new(channel.clone());
    let mut runs = RunServiceClient::new(channel.clone());
    let mut worker = WorkerServiceClient::new(channel.clone());
    let too_long = "n".repeat(65);
    // (what is wrong, the bad name, the words the description must hold)
    let cases = [
        ("too long", too_long.as_str(), "at most 64"),
        ("a bad character", "org:prod", "not allowed"),
        ("a brace", "a}b", "not allowed"),
        ("a NUL", "a\0b", "not allowed"),
        ("the reserved prefix", "_http", "reserved"),
        ("empty", "", ""),
    ];
    for (why, name, words) in cases {
        let register = |field: &str| {
            let mut yaml = serde_json::json!({
                "name": "fine",
                "nodes": [{"id": "a", "type": "TASK", "queue": "q", "task": "t"}],
            });
            match field {
                "name" => yaml["name"] = name.into(),
                "nodes[0].id" => yaml["nodes"][0]["id"] = name.into(),
                "nodes[0].queue" => yaml["nodes"][0]["queue"] = name.into(),
                "nodes[0].task" => yaml["nodes"][0]["task"] = name.into(),
                _ => unreachable!(),
            }
            RegisterWorkflowRequest {
                source: yaml.to_string(),
            }
        };
        for field in ["name", "nodes[0].id", "nodes[0].queue", "nodes[0].task"] {
            if field == "nodes[0].id" && name.is_empty() {
                continue; // an empty id is "required", checked elsewhere
            }
            let status = workflows
                .register_workflow(register(field))
                .await
                .expect_err(why);
            assert_eq!(status.code(), Code::InvalidArgument, "{field} {why}");
            let violations = status.get_details_bad_request().expect("bad request");
            let violation = violations
                .field_violations
                .iter()
                .find(|v| v.field == field)
                .unwrap_or_else(|| panic!("{field} {why}: {violations:?}"));
            assert!(
                violation.description.contains(words),
                "{field} {why}: {}",
                violation.description
            );
            assert!(status.message().len() < 600, "no echo of the input");
        }
        let event = serde_json::json!({
            "name": "waits",
            "nodes": [{"id": "w", "type": "WAIT_FOR_EVENT", "event": name}],
        });
        let status = workflows
            .register_workflow(RegisterWorkflowRequest {
                source: event.to_string(),
            })
            .await
            .expect_err(why);
        assert_eq!(violated_field(&status), "nodes[0].event", "{why}");

        let status = runs
            .start_run(StartRunRequest {
                workflow_name: name.to_owned(),
                ..Default::default()
            })
            .await
            .expect_err(why);
        assert_eq!(
            (status.code(), violated_field(&status).as_str()),
            (Code::InvalidArgument, "workflow_name"),
            "{why}"
        );
        if !name.is_empty() {
            let status = runs
                .start_run(StartRunRequest {
                    workflow_name: "fine".to_owned(),
                    labels: [(name.to_owned(), "v".to_owned())].into(),
                    ..Default::default()
                })
                .await
                .expect_err(why);
            assert_eq!(status.code(), Code::InvalidArgument, "{why}");
            assert!(violated_field(&status).starts_with("labels["), "{why}");
            let status = runs
                .list_runs(ListRunsRequest {
                    workflow_name: name.to_owned(),
                    ..Default::default()
                })
                .await
                .expect_err(why);
            assert_eq!(violated_field(&status), "workflow_name", "{why}");
        }
        let status = runs
            .send_event(SendEventRequest {
                event_name: name.to_owned(),
                target: Some(Target::CorrelationKey("k".to_owned())),
                ..Default::default()
            })
            .await
            .expect_err(why);
        assert_eq!(violated_field(&status), "event_name", "{why}");
        let status = worker
            .poll_tasks(poll(&["fine", name], 100))
            .await
            .expect_err(why);
        assert_eq!(
            (status.code(), violated_field(&status).as_str()),
            (Code::InvalidArgument, "queues[1]"),
            "{why}"
        );
        let status = workflows
            .get_workflow(GetWorkflowRequest {
                name: name.to_owned(),
                ..Default::default()
            })
            .await
            .expect_err(why);
        assert_eq!(violated_field(&status), "name", "{why}");
        if !name.is_empty() && !name.contains('\0') {
            let mut request = Request::new(ListRunsRequest::default());
            request
                .metadata_mut()
                .insert("x-composer-namespace", name.parse().expect("header"));
            let status = runs.list_runs(request).await.expect_err(why);
            assert_eq!(
                (status.code(), violated_field(&status).as_str()),
                (Code::InvalidArgument, "x-composer-namespace"),
                "{why}"
            );
        }
    }
    // the longest name and every allowed character still work
    let longest = format!("a{}", "b.c-d_e".repeat(9));
    assert_eq!(longest.len(), 64);
    workflows
        .register_workflow(RegisterWorkflowRequest {
            source: format!(
                "name: {longest}\nnodes:\n  - {{ id: a, type: TASK, queue: {longest}, task: {longest} }}\n"
            ),
        })
        .await
        .expect("a name at the limit");
}

#[tokio::test]
async fn a_token_whose_namespace_breaks_the_rule_is_refused() {
    let server = ServerProcess::start(&composer_binary(), &["--auth-secret", SECRET]).await;
    let mut runs = RunServiceClient::new(channel(&server).await);
    // `mint` refuses to make such a token, so it is signed by hand
    let mut forged = claims("org:prod", &["admin"], None);
    assert!(mint(&forged, SigningKey::Secret(SECRET.as_bytes()), None).is_err());
    forged.ns = "org:prod".to_owned();
    let signed = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &forged,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("sign");
    let status = runs
        .list_runs(authed(ListRunsRequest::default(), &signed))
        .await
        .expect_err("bad namespace");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("ns"), "{}", status.message());
}

/// Writes a stream message naming `task` into another tenant's stream, the
/// way any Redis client on the network could.
async fn inject(redis_url: &str, key: &str, task: uuid::Uuid, attempt: i32) {
    let client = redis::Client::open(redis_url).expect("redis url");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let _: String = redis::cmd("XADD")
        .arg(key)
        .arg("*")
        .arg("task_id")
        .arg(task.to_string())
        .arg("attempt")
        .arg(attempt)
        .query_async(&mut connection)
        .await
        .expect("xadd");
}

#[tokio::test]
async fn a_stream_message_naming_another_tenants_task_leases_nothing() {
    let database = fresh_database().await;
    let redis_url = fresh_redis_url();
    let server = ServerProcess::start_with(
        &composer_binary(),
        &database,
        &redis_url,
        &["--auth-secret", SECRET, "--stream-shards", "1"],
    )
    .await;
    let channel = channel(&server).await;

    // the collision once found: namespace `org` + queue `prod:email` and
    // namespace `org:prod` + queue `email` spelt one stream key; neither
    // name is accepted now, and the keys of any two triples differ
    let org_worker = token("org", &["worker"], Some(&["*"]));
    let status = WorkerServiceClient::new(channel.clone())
        .poll_tasks(authed(poll(&["prod:email"], 100), &org_worker))
        .await
        .expect_err("a queue with ':'");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_ne!(
        stream_key("org", "prod:email", 0),
        stream_key("org:prod", "email", 0)
    );

    // tenant `victim` has a task waiting on queue `email`
    let victim_operator = token("victim", &["operator"], None);
    register(
        &channel,
        &victim_operator,
        "name: mail\nnodes:\n  - { id: send, type: TASK, queue: email, task: send, input: { secret: s3cret } }\n",
    )
    .await;
    let run_id = start(&channel, &victim_operator, "mail").await;
    let mut db = PgConnection::connect(&database).await.expect("db");
    let mut task = None;
    for _ in 0..100 {
        task = sqlx::query_as::<_, (uuid::Uuid, i32)>(
            "SELECT id, attempt FROM tasks WHERE namespace = 'victim' AND status = 'DISPATCHED'",
        )
        .fetch_optional(&mut db)
        .await
        .expect("read task");
        if task.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (task_id, attempt) = task.expect("the victim's task is dispatched");

    // the attacker's own stream, and one of its other queues, now carry
    // messages naming the victim's task: its worker leases nothing
    inject(&redis_url, &stream_key("org", "email", 0), task_id, attempt).await;
    inject(&redis_url, &stream_key("org", "other", 0), task_id, attempt).await;
    let mut attacker = WorkerServiceClient::new(channel.clone());
    for _ in 0..3 {
        let tasks = attacker
            .poll_tasks(authed(poll(&["email", "other"], 700), &org_worker))
            .await
            .expect("poll")
            .into_inner()
            .tasks;
        assert!(tasks.is_empty(), "leased across namespaces: {tasks:?}");
    }
    // and within one namespace, a message on one queue cannot lease a
    // task of another queue: the victim's own worker for `sms` gets nothing
    inject(
        &redis_url,
        &stream_key("victim", "sms", 0),
        task_id,
        attempt,
    )
    .await;
    let victim_sms = token("victim", &["worker"], Some(&["sms"]));
    let tasks = attacker
        .poll_tasks(authed(poll(&["sms"], 700), &victim_sms))
        .await
        .expect("poll sms")
        .into_inner()
        .tasks;
    assert!(tasks.is_empty(), "leased across queues: {tasks:?}");

    // the victim's worker still gets its task, whole
    let victim_worker = token("victim", &["worker"], Some(&["email"]));
    let leased = poll_one(&mut attacker, &victim_worker, "email").await;
    assert_eq!(leased.task_id, task_id.to_string());
    assert_eq!(leased.namespace, "victim");
    assert_eq!(leased.attempt, 1, "no attempt was spent by the attack");
    attacker
        .complete_task(authed(
            CompleteTaskRequest {
                task_id: leased.task_id.clone(),
                attempt: leased.attempt,
                lease_token: leased.lease_token.clone(),
                output: None,
            },
            &victim_worker,
        ))
        .await
        .expect("complete");
    let run = wait_done(&channel, &victim_operator, &run_id).await;
    assert_eq!(run.status(), RunStatus::Completed);
}

/// An endpoint that holds each request for `hold`, then answers 200 with
/// `{"real": true}`.
async fn slow_endpoint(hold: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 16 * 1024];
                let mut read = 0;
                while !String::from_utf8_lossy(&buffer[..read]).contains("\r\n\r\n") {
                    match socket.read(&mut buffer[read..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read += n,
                    }
                }
                tokio::time::sleep(hold).await;
                let body = r#"{"real":true}"#;
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn the_servers_own_queue_is_out_of_every_workers_reach() {
    let database = fresh_database().await;
    let server = ServerProcess::start_with(
        &composer_binary(),
        &database,
        &fresh_redis_url(),
        &["--auth-secret", SECRET, "--http-allow-loopback"],
    )
    .await;
    let channel = channel(&server).await;
    let mut worker = WorkerServiceClient::new(channel.clone());
    let everything = token("default", &["worker"], Some(&["*"]));
    let admin = token("default", &["admin"], None);
    let listing_it = token("default", &["worker"], Some(&["_http", "jobs"]));

    // no token polls `_http`, `*` and admin included
    for (who, token) in [
        ("a * worker", &everything),
        ("an admin", &admin),
        ("a token listing it", &listing_it),
    ] {
        let status = worker
            .poll_tasks(authed(poll(&["_http"], 100), token))
            .await
            .expect_err(who);
        assert_eq!(status.code(), Code::InvalidArgument, "{who}");
        assert_eq!(violated_field(&status), "queues[0]", "{who}");
        assert!(status.message().contains("reserved"), "{who}: {status:?}");
    }

    // an HTTP node whose request carries a secret header is in flight
    let endpoint = slow_endpoint(Duration::from_secs(3)).await;
    register(
        &channel,
        &admin,
        &format!(
            "name: charge\nnodes:\n  - {{ id: charge, type: HTTP, http: {{ method: POST, url: \"{endpoint}/charge\", headers: {{ Authorization: \"Bearer partner-secret\" }} }} }}\noutput: \"${{nodes.charge.output.body}}\"\n"
        ),
    )
    .await;
    let run_id = start(&channel, &admin, "charge").await;
    let mut db = PgConnection::connect(&database).await.expect("db");
    let mut leased = None;
    for _ in 0..100 {
        leased = sqlx::query_as::<_, (uuid::Uuid, i32, uuid::Uuid)>(
            "SELECT id, attempt, lease_token FROM tasks WHERE queue = '_http' AND status = 'LEASED'",
        )
        .fetch_optional(&mut db)
        .await
        .expect("read task");
        if leased.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (task_id, attempt, lease_token) = leased.expect("the server's worker leased it");

    // a worker that polls everything it may sees nothing of it
    let tasks = worker
        .poll_tasks(authed(poll(&["jobs", "email"], 500), &everything))
        .await
        .expect("poll")
        .into_inner()
        .tasks;
    assert!(tasks.is_empty());

    // even holding the lease token, no worker reports on it or extends it
    let forged = Some(composer_testkit::worker::value_of(
        &serde_json::json!({"forged": true}),
    ));
    for (who, token) in [("a * worker", &everything), ("an admin", &admin)] {
        let completed = worker
            .complete_task(authed(
                CompleteTaskRequest {
                    task_id: task_id.to_string(),
                    attempt,
                    lease_token: lease_token.to_string(),
                    output: forged.clone(),
                },
                token,
            ))
            .await
            .expect_err(who);
        assert_eq!(completed.code(), Code::NotFound, "{who}: {completed:?}");
        let failed = worker
            .fail_task(authed(
                FailTaskRequest {
                    task_id: task_id.to_string(),
                    attempt,
                    lease_token: lease_token.to_string(),
                    error_code: "X".to_owned(),
                    ..Default::default()
                },
                token,
            ))
            .await
            .expect_err(who);
        assert_eq!(failed.code(), Code::NotFound, "{who}");
        let beat = worker
            .heartbeat(authed(
                HeartbeatRequest {
                    task_id: task_id.to_string(),
                    attempt,
                    lease_token: lease_token.to_string(),
                },
                token,
            ))
            .await
            .expect_err(who);
        assert_eq!(beat.code(), Code::NotFound, "{who}");
    }
    let run = wait_done(&channel, &admin, &run_id).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:#?}");
    let output = composer_testkit::worker::json_of(run.output.clone().expect("output"));
    assert_eq!(
        output,
        serde_json::json!({"real": true}),
        "the endpoint's answer, not the forged one"
    );
}

#[tokio::test]
async fn a_worker_reaches_only_the_queues_its_token_lists_even_with_a_lease_token() {
    let server = ServerProcess::start(&composer_binary(), &["--auth-secret", SECRET]).await;
    let channel = channel(&server).await;
    let operator = token("shop", &["operator"], None);
    register(
        &channel,
        &operator,
        "name: pay\nnodes:\n  - { id: pay, type: TASK, queue: payments, task: pay }\n",
    )
    .await;
    let run_id = start(&channel, &operator, "pay").await;
    let payments = token("shop", &["worker"], Some(&["payments"]));
    let emails = token("shop", &["worker"], Some(&["emails"]));
    let mut worker = WorkerServiceClient::new(channel.clone());
    let task = poll_one(&mut worker, &payments, "payments").await;
    let beat = worker
        .heartbeat(authed(
            HeartbeatRequest {
                task_id: task.task_id.clone(),
                attempt: task.attempt,
                lease_token: task.lease_token.clone(),
            },
            &emails,
        ))
        .await
        .expect_err("not its queue");
    assert_eq!(beat.code(), Code::NotFound);
    let stolen = worker
        .complete_task(authed(
            CompleteTaskRequest {
                task_id: task.task_id.clone(),
                attempt: task.attempt,
                lease_token: task.lease_token.clone(),
                output: None,
            },
            &emails,
        ))
        .await
        .expect_err("not its queue");
    assert_eq!(stolen.code(), Code::NotFound);
    assert_eq!(
        run_status(&channel, &operator, &run_id).await.status(),
        RunStatus::Running
    );
    worker
        .complete_task(authed(
            CompleteTaskRequest {
                task_id: task.task_id.clone(),
                attempt: task.attempt,
                lease_token: task.lease_token.clone(),
                output: None,
            },
            &payments,
        ))
        .await
        .expect("its own worker completes it");
    assert_eq!(
        wait_done(&channel, &operator, &run_id).await.status(),
        RunStatus::Completed
    );
}

fn openssl(args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
    out.stdout
}

/// A JWKS document holding the RSA public key of `private` under `kid`.
fn jwks_of(private: &str, kid: &str) -> String {
    let modulus =
        String::from_utf8(openssl(&["rsa", "-in", private, "-noout", "-modulus"])).expect("utf-8");
    let hex = modulus.trim().trim_start_matches("Modulus=");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    serde_json::json!({"keys": [{
        "kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig",
        "n": URL_SAFE_NO_PAD.encode(bytes), "e": "AQAB",
    }]})
    .to_string()
}

#[tokio::test]
async fn a_configured_issuer_and_audience_are_required_claims_for_every_key_kind() {
    let dir = tempfile::tempdir().expect("dir");
    let path = |name: &str| dir.path().join(name).to_str().expect("path").to_owned();
    let (rsa, rsa_pub, ed, ed_pub, jwks_rsa, jwks) = (
        path("rsa.pem"),
        path("rsa.pub.pem"),
        path("ed.pem"),
        path("ed.pub.pem"),
        path("jwks-rsa.pem"),
        path("jwks.json"),
    );
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        &rsa,
    ]);
    openssl(&["pkey", "-pubout", "-in", &rsa, "-out", &rsa_pub]);
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", &ed]);
    openssl(&["pkey", "-pubout", "-in", &ed, "-out", &ed_pub]);
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        &jwks_rsa,
    ]);
    std::fs::write(&jwks, jwks_of(&jwks_rsa, "k1")).expect("write jwks");
    let server = ServerProcess::start(
        &composer_binary(),
        &[
            "--auth-secret",
            SECRET,
            "--auth-public-key",
            &format!("{rsa_pub},{ed_pub}"),
            "--auth-jwks",
            &jwks,
            "--auth-issuer",
            "https://issuer.example",
            "--auth-audience",
            "composer",
        ],
    )
    .await;
    let mut runs = RunServiceClient::new(channel(&server).await);
    let rsa_key = std::fs::read(&rsa).expect("rsa");
    let ed_key = std::fs::read(&ed).expect("ed");
    let jwks_key = std::fs::read(&jwks_rsa).expect("jwks rsa");
    let keys: [(&str, SigningKey<'_>, Option<&str>); 4] = [
        ("HS256", SigningKey::Secret(SECRET.as_bytes()), None),
        ("RS256", SigningKey::Pem(&rsa_key), None),
        ("EdDSA", SigningKey::Pem(&ed_key), None),
        ("JWKS", SigningKey::Pem(&jwks_key), Some("k1")),
    ];
    for (kind, key, kid) in keys {
        let mut whole = claims("default", &["reader"], None);
        whole.iss = Some("https://issuer.example".to_owned());
        whole.aud = Some("composer".to_owned());
        let mut no_iss = whole.clone();
        no_iss.iss = None;
        let mut no_aud = whole.clone();
        no_aud.aud = None;
        let good = mint(&whole, key, kid).expect("mint");
        runs.list_runs(authed(ListRunsRequest::default(), &good))
            .await
            .unwrap_or_else(|e| panic!("{kind}: a whole token works: {e:?}"));
        for (missing, claims) in [("iss", &no_iss), ("aud", &no_aud)] {
            let token = mint(claims, key, kid).expect("mint");
            let status = runs
                .list_runs(authed(ListRunsRequest::default(), &token))
                .await
                .expect_err(kind);
            assert_eq!(
                status.code(),
                Code::Unauthenticated,
                "{kind} without {missing}: {status:?}"
            );
        }
    }
}
