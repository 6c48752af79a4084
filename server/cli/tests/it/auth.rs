//! Authentication and namespaces end to end: every RPC × every role from
//! the one role table, bad tokens, worker queues, namespace isolation,
//! browser origins, and who did what in history.

use std::{path::PathBuf, time::Duration};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use composer_grpc::auth::{NewToken, RPC_ROLES, Role, SigningKey, mint};
use composer_proto::v1::{
    CancelRunRequest, GetRunRequest, ListRunsRequest, PollTasksRequest, RegisterWorkflowRequest,
    RetryRunRequest, RunStatus, SendEventRequest, StartRunRequest, WatchRunRequest,
    run_service_client::RunServiceClient, send_event_request::Target,
    worker_service_client::WorkerServiceClient, workflow_service_client::WorkflowServiceClient,
};
use composer_testkit::ServerProcess;
use tonic::{Code, Request, transport::Channel};

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

fn claims(sub: &str, ns: &str, roles: &[&str]) -> NewToken {
    let now = now();
    NewToken {
        sub: sub.to_owned(),
        ns: ns.to_owned(),
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        queues: None,
        iat: now,
        nbf: now,
        exp: now + 3600,
        iss: None,
        aud: Some("composer".to_owned()),
    }
}

fn token(sub: &str, ns: &str, roles: &[&str]) -> String {
    mint(
        &claims(sub, ns, roles),
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

async fn server(extra: &[&str]) -> ServerProcess {
    let mut args = vec!["--auth-secret", SECRET, "--auth-audience", "composer"];
    args.extend_from_slice(extra);
    ServerProcess::start(&composer_binary(), &args).await
}

async fn channel(server: &ServerProcess) -> Channel {
    Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

/// Calls `path` with an empty message: enough to see whether auth let it in.
async fn call(channel: Channel, path: &'static str, token: Option<&str>) -> Code {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let mut request = Request::new(());
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
    }
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    let path = http::uri::PathAndQuery::from_static(path);
    match grpc.unary(request, path, codec).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn every_rpc_for_every_role_is_allowed_or_denied_as_the_table_says() {
    let server = server(&[]).await;
    let channel = channel(&server).await;
    for role in Role::ALL {
        let token = token("table", "default", &[role.as_str()]);
        for (path, allowed) in RPC_ROLES {
            let code = call(channel.clone(), path, Some(&token)).await;
            if allowed.contains(&role) {
                assert!(
                    !matches!(code, Code::Unauthenticated | Code::PermissionDenied),
                    "{} should reach {path}, got {code:?}",
                    role.as_str()
                );
            } else {
                assert_eq!(
                    code,
                    Code::PermissionDenied,
                    "{} must not reach {path}",
                    role.as_str()
                );
            }
        }
    }
    for (path, _) in RPC_ROLES {
        assert_eq!(
            call(channel.clone(), path, None).await,
            Code::Unauthenticated,
            "{path} without a token"
        );
    }
}

fn alg_none(claims: &NewToken) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).expect("claims"));
    format!("{header}.{body}.")
}

#[tokio::test]
async fn bad_tokens_are_unauthenticated_and_change_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let private = dir.path().join("rsa.pem");
    let public = dir.path().join("rsa.pub.pem");
    let made = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&private)
        .status()
        .expect("openssl");
    assert!(made.success());
    let exported = std::process::Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&private)
        .arg("-out")
        .arg(&public)
        .status()
        .expect("openssl");
    assert!(exported.success());
    let public_key = public.to_str().expect("path").to_owned();
    // only the RSA key: an HS256 token must not be checked against its bytes
    let server = ServerProcess::start(
        &composer_binary(),
        &[
            "--auth-public-key",
            &public_key,
            "--auth-audience",
            "composer",
        ],
    )
    .await;
    let mut workflows = WorkflowServiceClient::new(channel(&server).await);
    let source = "name: guarded\nnodes:\n  - { id: a, type: TASK, queue: q, task: t }\n";
    let admin = claims("mallory", "default", &["admin"]);
    let secret = SigningKey::Secret(SECRET.as_bytes());

    let mut expired = admin.clone();
    expired.exp = now() - 3600;
    expired.nbf = now() - 7200;
    let mut early = admin.clone();
    early.nbf = now() + 3600;
    let mut elsewhere = admin.clone();
    elsewhere.aud = Some("another-service".to_owned());
    let public_pem = std::fs::read(&public).expect("public key");
    let bad: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        (
            "expired",
            Some(mint(&expired, SigningKey::Secret(SECRET.as_bytes()), None).expect("mint")),
        ),
        (
            "not yet valid",
            Some(mint(&early, SigningKey::Secret(SECRET.as_bytes()), None).expect("mint")),
        ),
        (
            "wrong signature",
            Some(
                mint(
                    &admin,
                    SigningKey::Secret(b"another-secret-another-secret-another-secret"),
                    None,
                )
                .expect("mint"),
            ),
        ),
        (
            "wrong audience",
            Some(mint(&elsewhere, SigningKey::Secret(SECRET.as_bytes()), None).expect("mint")),
        ),
        ("alg none", Some(alg_none(&admin))),
        (
            "HS256 signed with the RSA public key",
            Some(mint(&admin, SigningKey::Secret(&public_pem), None).expect("mint")),
        ),
        ("garbage", Some("not.a.jwt".to_owned())),
    ];
    for (why, token) in bad {
        let mut request = Request::new(RegisterWorkflowRequest {
            source: source.to_owned(),
        });
        if let Some(token) = &token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("header"),
            );
        }
        let status = workflows.register_workflow(request).await.expect_err(why);
        assert_eq!(status.code(), Code::Unauthenticated, "{why}: {status:?}");
        let message = status.message();
        assert!(
            !["Base64", "symbol", "offset", "Json"]
                .iter()
                .any(|internal| message.contains(internal)),
            "{why}: the decoder's own text reaches the caller: {message}"
        );
        if why == "garbage" {
            assert!(
                message.contains("not a well-formed JWT"),
                "{why}: {message}"
            );
        }
    }
    // the same claims signed properly with the RSA key and the HS secret
    let good_rsa = mint(
        &admin,
        SigningKey::Pem(&std::fs::read(&private).expect("key")),
        None,
    )
    .expect("mint");
    let listed = workflows
        .list_workflows(authed(Default::default(), &good_rsa))
        .await
        .expect("a good RS256 token works")
        .into_inner();
    assert!(
        listed.workflows.is_empty(),
        "nothing was registered by a bad token"
    );
    let hs = mint(&admin, secret, None).expect("mint");
    let refused = workflows
        .list_workflows(authed(Default::default(), &hs))
        .await
        .expect_err("HS256 is not configured here");
    assert_eq!(refused.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn workers_poll_only_their_queues_and_cannot_touch_another_namespaces_tasks() {
    let server = server(&[]).await;
    let channel = channel(&server).await;
    let mut worker = WorkerServiceClient::new(channel.clone());
    let mut scoped = claims("w1", "default", &["worker"]);
    scoped.queues = Some(vec!["mine".to_owned()]);
    let scoped = mint(&scoped, SigningKey::Secret(SECRET.as_bytes()), None).expect("mint");
    let poll = |queue: &str| PollTasksRequest {
        confirm_receipt: false,
        worker_id: "w1".to_owned(),
        queues: vec![queue.to_owned()],
        max_tasks: 1,
        wait: Some(prost_types::Duration {
            seconds: 0,
            nanos: 100_000_000,
        }),
    };
    let denied = worker
        .poll_tasks(authed(poll("theirs"), &scoped))
        .await
        .expect_err("not my queue");
    assert_eq!(denied.code(), Code::PermissionDenied);
    worker
        .poll_tasks(authed(poll("mine"), &scoped))
        .await
        .expect("my queue");

    // a task of namespace b, leased by b's worker
    let operator_b = token("op-b", "b", &["operator"]);
    let mut workflows = WorkflowServiceClient::new(channel.clone());
    workflows
        .register_workflow(authed(
            RegisterWorkflowRequest {
                source: "name: w\nnodes:\n  - { id: a, type: TASK, queue: jobs, task: t }\n"
                    .to_owned(),
            },
            &operator_b,
        ))
        .await
        .expect("register in b");
    let mut runs = RunServiceClient::new(channel.clone());
    let run = runs
        .start_run(authed(
            StartRunRequest {
                workflow_name: "w".to_owned(),
                ..Default::default()
            },
            &operator_b,
        ))
        .await
        .expect("start in b")
        .into_inner()
        .run
        .expect("run");
    let worker_b = token("wb", "b", &["worker"]);
    let mut task = None;
    for _ in 0..50 {
        let mut request = poll("jobs");
        request.wait = Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        });
        let mut tasks = worker
            .poll_tasks(authed(request, &worker_b))
            .await
            .expect("poll b")
            .into_inner()
            .tasks;
        if let Some(found) = tasks.pop() {
            task = Some(found);
            break;
        }
    }
    let task = task.expect("b's task leased");
    let worker_a = token("wa", "a", &["worker"]);
    let stolen = worker
        .complete_task(authed(
            composer_proto::v1::CompleteTaskRequest {
                task_id: task.task_id.clone(),
                attempt: task.attempt,
                lease_token: task.lease_token.clone(),
                output: None,
            },
            &worker_a,
        ))
        .await
        .expect_err("another namespace's task");
    assert_eq!(stolen.code(), Code::NotFound);
    let after = runs
        .get_run(authed(
            GetRunRequest {
                run_id: run.run_id.clone(),
                skip_nodes: false,
            },
            &operator_b,
        ))
        .await
        .expect("get")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(after.status(), RunStatus::Running, "the task is unchanged");
}

#[tokio::test]
async fn one_namespace_cannot_see_or_touch_another_namespaces_runs() {
    let server = server(&[]).await;
    let channel = channel(&server).await;
    let mut workflows = WorkflowServiceClient::new(channel.clone());
    let mut runs = RunServiceClient::new(channel.clone());
    let b = token("owner-b", "b", &["operator"]);
    let a = token("intruder-a", "a", &["operator"]);
    workflows
        .register_workflow(authed(
            RegisterWorkflowRequest {
                source:
                    "name: private\nnodes:\n  - { id: wait, type: WAIT_FOR_EVENT, event: go }\n"
                        .to_owned(),
            },
            &b,
        ))
        .await
        .expect("register in b");
    let run = runs
        .start_run(authed(
            StartRunRequest {
                workflow_name: "private".to_owned(),
                ..Default::default()
            },
            &b,
        ))
        .await
        .expect("start in b")
        .into_inner()
        .run
        .expect("run");
    let id = run.run_id.clone();

    let not_found = |result: Result<tonic::Response<_>, tonic::Status>, what: &str| {
        let status = result.map(|_: tonic::Response<()>| ()).expect_err(what);
        assert_eq!(status.code(), Code::NotFound, "{what}: {status:?}");
    };
    not_found(
        runs.get_run(authed(
            GetRunRequest {
                run_id: id.clone(),
                skip_nodes: false,
            },
            &a,
        ))
        .await
        .map(|r| r.map(|_| ())),
        "get",
    );
    not_found(
        runs.cancel_run(authed(
            CancelRunRequest {
                run_id: id.clone(),
                reason: String::new(),
            },
            &a,
        ))
        .await
        .map(|r| r.map(|_| ())),
        "cancel",
    );
    not_found(
        runs.retry_run(authed(RetryRunRequest { run_id: id.clone() }, &a))
            .await
            .map(|r| r.map(|_| ())),
        "retry",
    );
    not_found(
        runs.watch_run(authed(WatchRunRequest { run_id: id.clone() }, &a))
            .await
            .map(|r| r.map(|_| ())),
        "watch",
    );
    not_found(
        runs.send_event(authed(
            SendEventRequest {
                target: Some(Target::RunId(id.clone())),
                event_name: "go".to_owned(),
                payload: None,
                request_id: String::new(),
            },
            &a,
        ))
        .await
        .map(|r| r.map(|_| ())),
        "send event",
    );
    let listed = runs
        .list_runs(authed(ListRunsRequest::default(), &a))
        .await
        .expect("list")
        .into_inner();
    assert!(listed.runs.is_empty(), "a lists none of b's runs");
    let start_in_a = runs
        .start_run(authed(
            StartRunRequest {
                workflow_name: "private".to_owned(),
                ..Default::default()
            },
            &a,
        ))
        .await
        .expect_err("b's workflow is not a's");
    assert_eq!(start_in_a.code(), Code::NotFound);

    let unchanged = runs
        .get_run(authed(
            GetRunRequest {
                run_id: id.clone(),
                skip_nodes: false,
            },
            &b,
        ))
        .await
        .expect("b still sees it")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(unchanged.status(), RunStatus::Running);

    // the owner cancels; history names who
    runs.cancel_run(authed(
        CancelRunRequest {
            run_id: id.clone(),
            reason: "done".to_owned(),
        },
        &b,
    ))
    .await
    .expect("cancel");
    let history = runs
        .get_run_history(authed(
            composer_proto::v1::GetRunHistoryRequest {
                run_id: id.clone(),
                page_size: 100,
                page_token: String::new(),
            },
            &b,
        ))
        .await
        .expect("history")
        .into_inner()
        .events;
    let cancel = history
        .iter()
        .find(|e| e.event_type == "cancel_requested_by")
        .expect("recorded");
    assert_eq!(cancel.actor, "owner-b");
    assert_eq!(
        history
            .iter()
            .find(|e| e.event_type == "run_started")
            .map(|e| e.actor.as_str()),
        Some("owner-b")
    );
}

#[tokio::test]
async fn grpc_web_from_an_allowed_origin_works_and_from_another_is_refused() {
    use prost::Message;
    let server = server(&["--cors-origins", "http://dashboard.example"]).await;
    let token = token("browser", "default", &["reader"]);
    let http = reqwest::Client::builder()
        .http1_only()
        .build()
        .expect("client");
    let call = |origin: &'static str| {
        let mut body = vec![0u8, 0, 0, 0, 0];
        body.extend(composer_proto::v1::ListRunsRequest::default().encode_to_vec());
        http.post(format!("{}/composer.v1.RunService/ListRuns", server.url()))
            .header("content-type", "application/grpc-web+proto")
            .header("x-grpc-web", "1")
            .header("origin", origin)
            .header("authorization", format!("Bearer {token}"))
            .body(body)
            .send()
    };
    let allowed = call("http://dashboard.example").await.expect("request");
    assert_eq!(
        allowed
            .headers()
            .get("access-control-allow-origin")
            .and_then(|v| v.to_str().ok()),
        Some("http://dashboard.example")
    );
    let status = allowed
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let body = allowed.bytes().await.expect("body");
    let text = String::from_utf8_lossy(&body);
    assert!(
        status.as_deref() == Some("0") || text.contains("grpc-status:0"),
        "{status:?} {text}"
    );

    let refused = call("http://evil.example").await.expect("request");
    assert!(
        refused
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    let code = refused
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    assert_eq!(
        code.as_deref(),
        Some("7"),
        "PERMISSION_DENIED for a foreign origin"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
}
