//! The admin CLI end to end: the real server, and the real `composer`
//! binary run as a subprocess with `--address`, its output read in both
//! formats and its exit codes checked against the documented table.

use std::{path::PathBuf, process::Stdio, sync::Arc, time::Duration};

use composer_grpc::auth::{NewToken, SigningKey, mint};
use composer_testkit::ServerProcess;

use crate::common::cli::{bare, binary, cli, composer, finish};
use serde_json::{Value as Json, json};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

const SECRET: &str = "a-test-secret-that-is-long-enough-for-hs256-0123456789";

/// Completes on its own: a 10 ms timer, then the input as output.
const NAP: &str = "name: nap
description: sleeps a little
nodes:
  - { id: pause, type: WAIT, duration: 10ms }
output: \"${input}\"
";

/// Waits for `approve`; its payload is the run's output.
const APPROVAL: &str = "name: approval
nodes:
  - { id: approved, type: WAIT_FOR_EVENT, event: approve }
output: \"${nodes.approved.output}\"
";

/// Fails on its own: no event arrives within 50 ms.
const IMPATIENT: &str = "name: impatient
nodes:
  - { id: approved, type: WAIT_FOR_EVENT, event: approve, timeout: 50ms }
";

async fn start(server: &ServerProcess, workflow: &str) -> String {
    let started = cli(server, &["run", "start", workflow, "-o", "json"])
        .await
        .ok();
    started.json()["run"]["run_id"]
        .as_str()
        .expect("run id")
        .to_owned()
}

/// Starts a long-running command whose standard output can be read line by line.
fn spawn(command: &mut Command) -> Child {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn composer")
}

async fn insecure_server() -> ServerProcess {
    ServerProcess::start(&binary(), &[]).await
}

#[tokio::test]
async fn workflows_register_from_a_file_and_stdin_and_read_back_as_tables_and_json() {
    let server = insecure_server().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("nap.yaml");
    std::fs::write(&file, NAP).expect("write");
    let path = file.to_str().expect("utf-8 path");

    let first = cli(&server, &["workflow", "register", path]).await.ok();
    assert_eq!(first.stdout, "nap v1 registered\n");
    let again = finish(composer(&server, &["workflow", "register", "-"]), Some(NAP))
        .await
        .ok();
    assert!(again.stdout.contains("nap v1 unchanged"), "{again:?}");
    let changed = NAP.replace("sleeps a little", "sleeps a little more");
    let second = finish(
        composer(&server, &["workflow", "register", "-", "-o", "json"]),
        Some(&changed),
    )
    .await
    .ok()
    .json();
    assert_eq!(second["created"], true);
    assert_eq!(second["workflow"]["version"], 2);
    assert_eq!(second["workflow"]["name"], "nap");

    let table = cli(&server, &["workflow", "list"]).await.ok().stdout;
    let mut lines = table.lines();
    assert!(
        lines.next().unwrap_or_default().starts_with("NAME"),
        "{table}"
    );
    let row = lines.next().unwrap_or_default();
    assert!(row.starts_with("nap") && row.contains("v2"), "{table}");
    assert!(row.contains("sleeps a little more"), "{table}");
    let listed = cli(&server, &["workflow", "list", "-o", "json"])
        .await
        .ok()
        .json();
    assert_eq!(listed["workflows"][0]["name"], "nap");
    assert_eq!(listed["workflows"][0]["latest_version"], 2);
    assert_eq!(listed["next_page_token"], "");

    let latest = cli(&server, &["workflow", "get", "nap"]).await.ok().stdout;
    assert!(
        latest.contains("version:") && latest.contains("v2"),
        "{latest}"
    );
    assert!(latest.contains("sleeps a little more"), "{latest}");
    let source = cli(
        &server,
        &["workflow", "get", "nap", "--version", "1", "--source"],
    )
    .await
    .ok();
    assert_eq!(source.stdout, NAP, "the source comes back byte for byte");
    let got = cli(&server, &["workflow", "get", "nap", "-o", "json"])
        .await
        .ok()
        .json();
    assert_eq!(got["workflow"]["version"], 2);
    assert_eq!(got["workflow"]["definition"]["name"], "nap");

    let versions = cli(&server, &["workflow", "versions", "nap", "-o", "json"])
        .await
        .ok()
        .json();
    let numbers: Vec<_> = versions["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .map(|v| v["version"].as_i64())
        .collect();
    assert_eq!(numbers, [Some(2), Some(1)], "newest first");
    let table = cli(&server, &["workflow", "versions", "nap", "--limit", "1"])
        .await
        .ok();
    assert_eq!(table.stdout.lines().count(), 2, "a header and one version");
    assert!(table.stderr.contains("more: --page-token "), "{table:?}");

    let missing = cli(&server, &["workflow", "get", "nope"]).await;
    assert_eq!(missing.code, 15, "NOT_FOUND: {missing:?}");
    assert!(missing.stderr.contains("NOT_FOUND"), "{missing:?}");
}

#[tokio::test]
async fn a_bad_definition_or_flag_exits_with_its_documented_code_and_says_what_is_wrong() {
    let server = insecure_server().await;
    let bad = "name: broken\nnodes:\n  - { id: a, type: NOPE }\n";

    let validated = finish(composer(&server, &["workflow", "validate", "-"]), Some(bad)).await;
    assert_eq!(validated.code, 13, "INVALID_ARGUMENT: {validated:?}");
    assert!(validated.stderr.contains("nodes[0].type"), "{validated:?}");
    let as_json = finish(
        composer(&server, &["workflow", "validate", "-", "-o", "json"]),
        Some(bad),
    )
    .await;
    assert_eq!(as_json.code, 13);
    assert_eq!(as_json.json()["valid"], false);
    assert_eq!(as_json.json()["problems"][0]["path"], "nodes[0].type");
    let good = finish(composer(&server, &["workflow", "validate", "-"]), Some(NAP))
        .await
        .ok();
    assert_eq!(good.stdout, "valid\n");

    let registered = finish(composer(&server, &["workflow", "register", "-"]), Some(bad)).await;
    assert_eq!(registered.code, 13, "{registered:?}");
    assert!(
        registered.stderr.contains("INVALID_ARGUMENT")
            && registered.stderr.contains("  nodes[0].type: "),
        "the field violation is printed on its own line: {registered:?}"
    );

    let not_json = cli(&server, &["run", "start", "nap", "--input", "{nope"]).await;
    assert_eq!(not_json.code, 2, "{not_json:?}");
    assert!(
        not_json.stderr.contains("--input is not JSON"),
        "{not_json:?}"
    );
    let bad_label = cli(&server, &["run", "start", "nap", "--label", "nolabel"]).await;
    assert_eq!(bad_label.code, 2, "clap's usage code: {bad_label:?}");
    let no_file = cli(&server, &["workflow", "register", "/nonexistent/x.yaml"]).await;
    assert_eq!(no_file.code, 3, "{no_file:?}");

    let unused_port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let unreachable = finish(
        {
            let mut command = Command::new(binary());
            command.args([
                "server",
                "info",
                "--address",
                &format!("127.0.0.1:{unused_port}"),
            ]);
            command
        },
        None,
    )
    .await;
    assert_eq!(unreachable.code, 24, "UNAVAILABLE: {unreachable:?}");
    assert!(
        unreachable.stderr.contains("cannot reach"),
        "{unreachable:?}"
    );
}

#[tokio::test]
async fn a_run_started_with_wait_prints_its_end_and_is_found_by_get_list_and_history() {
    let server = insecure_server().await;
    finish(composer(&server, &["workflow", "register", "-"]), Some(NAP))
        .await
        .ok();

    let waited = cli(
        &server,
        &[
            "run",
            "start",
            "nap",
            "--input",
            r#"{"name": "ada"}"#,
            "--label",
            "team=core",
            "--idempotency-key",
            "ada-1",
            "--wait",
            "-o",
            "json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(waited["created"], true);
    assert_eq!(waited["run"]["status"], "RUN_STATUS_COMPLETED");
    assert_eq!(waited["run"]["output"], json!({"name": "ada"}));
    assert_eq!(waited["run"]["labels"], json!({"team": "core"}));
    let run_id = waited["run"]["run_id"].as_str().expect("run id").to_owned();

    let repeated = cli(
        &server,
        &[
            "run",
            "start",
            "nap",
            "--idempotency-key",
            "ada-1",
            "-o",
            "json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(repeated["created"], false);
    assert_eq!(repeated["run"]["run_id"], run_id.as_str());

    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("input.json");
    std::fs::write(&input, r#"{"name": "bob"}"#).expect("write");
    let table = cli(
        &server,
        &[
            "run",
            "start",
            "nap",
            "--input-file",
            input.to_str().expect("path"),
            "--wait",
        ],
    )
    .await
    .ok();
    assert!(
        table.stdout.contains("status:") && table.stdout.contains("COMPLETED"),
        "{table:?}"
    );
    assert!(table.stdout.contains(r#"{"name":"bob"}"#), "{table:?}");
    assert!(table.stderr.contains("started: nap v1"), "{table:?}");

    let got = cli(&server, &["run", "get", &run_id]).await.ok().stdout;
    assert!(
        got.contains("COMPLETED") && got.contains("team=core"),
        "{got}"
    );
    let node_row = got
        .lines()
        .find(|l| l.starts_with("pause"))
        .unwrap_or_default();
    assert!(
        node_row.contains("WAIT") && node_row.contains("COMPLETED"),
        "{got}"
    );
    let got = cli(&server, &["run", "get", &run_id, "-o", "json"])
        .await
        .ok()
        .json();
    assert_eq!(got["run"]["nodes"][0]["node_id"], "pause");
    assert_eq!(got["run"]["nodes"][0]["node_type"], "WAIT");
    assert_eq!(got["run"]["nodes"][0]["status"], "NODE_STATUS_COMPLETED");

    let labelled = cli(
        &server,
        &[
            "run",
            "list",
            "--workflow",
            "nap",
            "--label",
            "team=core",
            "-o",
            "json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(
        labelled["runs"].as_array().map(Vec::len),
        Some(1),
        "{labelled}"
    );
    assert_eq!(labelled["runs"][0]["run_id"], run_id.as_str());
    let failed = cli(
        &server,
        &["run", "list", "--status", "failed", "-o", "json"],
    )
    .await
    .ok()
    .json();
    assert_eq!(failed["runs"], json!([]));
    let first_page = cli(
        &server,
        &["run", "list", "--status", "completed", "--limit", "1"],
    )
    .await
    .ok();
    assert_eq!(first_page.stdout.lines().count(), 2, "{first_page:?}");
    let token = first_page
        .stderr
        .trim()
        .strip_prefix("more: --page-token ")
        .expect("a next page is announced")
        .to_owned();
    let second_page = cli(
        &server,
        &[
            "run",
            "list",
            "--status",
            "completed",
            "--page-token",
            &token,
            "-o",
            "json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(second_page["runs"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        second_page["runs"][0]["run_id"],
        run_id.as_str(),
        "newest first: the first run is last"
    );

    let history = cli(&server, &["run", "history", &run_id]).await.ok().stdout;
    for event in ["run_started", "wait_elapsed", "run_completed"] {
        assert!(history.contains(event), "{event} missing:\n{history}");
    }
    let history = cli(&server, &["run", "history", &run_id, "-o", "json"])
        .await
        .ok()
        .json();
    assert_eq!(history["events"][0]["sequence"], 1);
    assert_eq!(history["events"][0]["event_type"], "run_started");

    let missing = cli(
        &server,
        &["run", "get", "0190a1a2-0000-7000-8000-000000000000"],
    )
    .await;
    assert_eq!(missing.code, 15, "NOT_FOUND: {missing:?}");

    let plain = cli(&server, &["run", "start", "nap"]).await.ok();
    let started = plain
        .stdout
        .strip_prefix("run ")
        .and_then(|rest| rest.strip_suffix(" started: nap v1\n"))
        .unwrap_or_else(|| panic!("{plain:?}"))
        .to_owned();
    let snapshots = cli(&server, &["run", "watch", &started, "-o", "json"])
        .await
        .ok();
    let last: Json = serde_json::from_str(snapshots.stdout.lines().last().unwrap_or_default())
        .expect("one JSON snapshot per line");
    assert_eq!(
        last["run"]["status"], "RUN_STATUS_COMPLETED",
        "{snapshots:?}"
    );
    assert_eq!(last["run"]["nodes"][0]["status"], "NODE_STATUS_COMPLETED");
}

#[tokio::test]
async fn a_failed_run_exits_1_when_waited_on_and_retry_resumes_it() {
    let server = insecure_server().await;
    finish(
        composer(&server, &["workflow", "register", "-"]),
        Some(IMPATIENT),
    )
    .await
    .ok();

    let waited = cli(&server, &["run", "start", "impatient", "--wait"]).await;
    assert_eq!(waited.code, 1, "{waited:?}");
    assert!(waited.stdout.contains("FAILED"), "{waited:?}");
    assert!(
        waited.stderr.contains("ended FAILED: TIMEOUT"),
        "{waited:?}"
    );
    let run_id = cli(&server, &["run", "list", "-o", "json"])
        .await
        .ok()
        .json()["runs"][0]["run_id"]
        .as_str()
        .expect("run id")
        .to_owned();

    let retried = cli(&server, &["run", "retry", &run_id]).await.ok();
    assert_eq!(retried.stdout, format!("run {run_id} RUNNING\n"));
    let watched = cli(&server, &["run", "watch", &run_id]).await;
    assert_eq!(watched.code, 1, "it times out again: {watched:?}");
    assert!(
        watched
            .stdout
            .lines()
            .last()
            .unwrap_or_default()
            .contains("FAILED"),
        "{watched:?}"
    );
    let history = cli(&server, &["run", "history", &run_id]).await.ok().stdout;
    assert!(history.contains("run_retried"), "{history}");

    let again = cli(&server, &["run", "retry", &run_id, "-o", "json"])
        .await
        .ok()
        .json();
    assert_eq!(again["run"]["status"], "RUN_STATUS_RUNNING");
    assert_eq!(cli(&server, &["run", "watch", &run_id]).await.code, 1);
    let ended = cli(&server, &["run", "cancel", &run_id]).await;
    assert_eq!(ended.code, 19, "FAILED_PRECONDITION: {ended:?}");
    assert!(ended.stderr.contains("FAILED_PRECONDITION"), "{ended:?}");
}

#[tokio::test]
async fn watch_prints_each_change_until_the_run_ends_and_send_event_and_cancel_steer_it() {
    let server = insecure_server().await;
    finish(
        composer(&server, &["workflow", "register", "-"]),
        Some(APPROVAL),
    )
    .await
    .ok();
    let run_id = start(&server, "approval").await;

    let mut watch = spawn(&mut composer(&server, &["run", "watch", &run_id]));
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    while let Some(line) = lines.next_line().await.expect("read watch") {
        let waiting = line.starts_with("node approved WAIT_FOR_EVENT WAITING");
        seen.push(line);
        if waiting {
            break;
        }
    }
    let sent = cli(
        &server,
        &[
            "run",
            "send-event",
            "approve",
            &run_id,
            "--payload",
            r#"{"ok": true}"#,
        ],
    )
    .await
    .ok();
    assert_eq!(sent.stdout, format!("delivered to run {run_id}\n"));
    while let Some(line) = lines.next_line().await.expect("read watch") {
        seen.push(line);
    }
    let status = watch.wait().await.expect("watch exits");
    assert_eq!(status.code(), Some(0), "{seen:#?}");
    assert!(
        seen.contains(&format!("run {run_id} approval v1 RUNNING")),
        "{seen:#?}"
    );
    assert!(
        seen.iter()
            .any(|l| l.starts_with("node approved WAIT_FOR_EVENT COMPLETED")),
        "{seen:#?}"
    );
    assert_eq!(
        seen.iter().rev().nth(1),
        Some(&format!("run {run_id} approval v1 COMPLETED")),
        "{seen:#?}"
    );
    assert_eq!(
        seen.last().map(String::as_str),
        Some(r#"output: {"ok":true}"#),
        "the watch ends with what the run produced: {seen:#?}"
    );
    let got = cli(&server, &["run", "get", &run_id, "-o", "json"])
        .await
        .ok()
        .json();
    assert_eq!(got["run"]["output"], json!({"ok": true}));

    let by_key = cli(
        &server,
        &[
            "run",
            "send-event",
            "approve",
            "--correlation-key",
            "nobody",
            "-o",
            "json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(by_key["delivered_run_ids"], json!([]));
    assert_eq!(by_key["stored"], true);

    let mut waiting = spawn(&mut composer(
        &server,
        &["run", "start", "approval", "--wait"],
    ));
    let mut started = BufReader::new(waiting.stderr.take().expect("stderr")).lines();
    let line = started
        .next_line()
        .await
        .expect("read")
        .expect("a started line");
    let cancelled_id = line
        .strip_prefix("run ")
        .and_then(|rest| rest.split(' ').next())
        .expect("run <id> started")
        .to_owned();
    let cancelled = cli(
        &server,
        &["run", "cancel", &cancelled_id, "--reason", "not needed"],
    )
    .await
    .ok();
    assert_eq!(cancelled.stdout, format!("run {cancelled_id} CANCELLED\n"));
    let status = waiting.wait().await.expect("start --wait exits");
    assert_eq!(status.code(), Some(1), "a cancelled run is exit code 1");
    let rest = started.next_line().await.expect("read").unwrap_or_default();
    assert!(rest.contains("ended CANCELLED"), "{rest}");
    let twice = cli(&server, &["run", "cancel", &cancelled_id]).await;
    assert_eq!(twice.code, 19, "FAILED_PRECONDITION: {twice:?}");
    let another = start(&server, "approval").await;
    let as_json = cli(&server, &["run", "cancel", &another, "-o", "json"])
        .await
        .ok()
        .json();
    assert_eq!(as_json["run"]["status"], "RUN_STATUS_CANCELLED");
    assert_eq!(as_json["run"]["run_id"], another.as_str());
}

fn token(ns: &str, roles: &[&str]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let claims = NewToken {
        sub: "cli-test".to_owned(),
        ns: ns.to_owned(),
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        queues: None,
        iat: now,
        nbf: now,
        exp: now + 3600,
        iss: None,
        aud: None,
    };
    mint(&claims, SigningKey::Secret(SECRET.as_bytes()), None).expect("mint")
}

#[tokio::test]
async fn a_token_comes_from_the_environment_a_bad_one_is_unauthenticated_and_admins_pick_a_namespace()
 {
    let server = ServerProcess::start(&binary(), &["--auth-secret", SECRET]).await;
    let admin = token("default", &["admin"]);

    let info = finish(
        {
            let mut command = composer(&server, &["server", "info", "-o", "json"]);
            command.env("COMPOSER_TOKEN", &admin);
            command
        },
        None,
    )
    .await
    .ok()
    .json();
    assert_eq!(info["protocol_version"], composer_proto::PROTOCOL_VERSION);
    assert!(
        info["features"]
            .as_array()
            .expect("features")
            .contains(&json!("auth")),
        "{info}"
    );

    let table = cli(&server, &["server", "info", "--token", &admin])
        .await
        .ok();
    assert!(table.stdout.contains("protocol version: 1."), "{table:?}");
    assert!(table.stdout.contains("auth"), "{table:?}");

    let forged = cli(&server, &["workflow", "list", "--token", "not.a.token"]).await;
    assert_eq!(forged.code, 26, "UNAUTHENTICATED: {forged:?}");
    assert!(forged.stderr.contains("UNAUTHENTICATED"), "{forged:?}");
    let without = cli(&server, &["workflow", "list"]).await;
    assert_eq!(without.code, 26, "{without:?}");
    let reader = token("default", &["reader"]);
    let denied = finish(
        composer(&server, &["workflow", "register", "-", "--token", &reader]),
        Some(NAP),
    )
    .await;
    assert_eq!(denied.code, 17, "PERMISSION_DENIED: {denied:?}");

    let in_shop = finish(
        composer(
            &server,
            &[
                "workflow",
                "register",
                "-",
                "--token",
                &admin,
                "--namespace",
                "shop",
            ],
        ),
        Some(NAP),
    )
    .await
    .ok();
    assert!(in_shop.stdout.contains("nap v1 registered"), "{in_shop:?}");
    let shop = cli(
        &server,
        &[
            "workflow",
            "list",
            "--token",
            &admin,
            "--namespace",
            "shop",
            "-o",
            "json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(shop["workflows"][0]["namespace"], "shop");
    let default = cli(
        &server,
        &["workflow", "list", "--token", &admin, "-o", "json"],
    )
    .await
    .ok()
    .json();
    assert_eq!(
        default["workflows"],
        json!([]),
        "the token's own namespace is empty"
    );
}

#[tokio::test]
async fn completions_and_help_describe_the_cli() {
    let bash = finish(
        {
            let mut command = Command::new(binary());
            command.args(["completions", "bash"]);
            command
        },
        None,
    )
    .await
    .ok();
    assert!(bash.stdout.contains("composer"), "{bash:?}");
    assert!(
        bash.stdout.contains("send-event"),
        "every subcommand is completed"
    );
    assert!(
        bash.stdout.contains("complete -F"),
        "a bash completion script"
    );

    let help = finish(
        {
            let mut command = Command::new(binary());
            command.arg("--help");
            command
        },
        None,
    )
    .await
    .ok();
    assert!(
        help.stdout.contains("26 UNAUTHENTICATED"),
        "{}",
        help.stdout
    );
    assert!(
        help.stdout
            .contains("1   the run ended FAILED or CANCELLED"),
        "{}",
        help.stdout
    );
}

fn tls_fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls")
}

/// A TLS endpoint in front of the server, as an ingress would be: it
/// terminates TLS with a certificate for 127.0.0.1 from the test CA and
/// passes the bytes on. Returns its `https://` address.
async fn tls_proxy(server: &ServerProcess) -> (String, tokio::task::JoinHandle<()>) {
    use tokio_rustls::{
        TlsAcceptor,
        rustls::{
            ServerConfig,
            crypto::aws_lc_rs,
            pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
        },
    };
    let certs = CertificateDer::pem_file_iter(tls_fixtures().join("server.pem"))
        .expect("server.pem")
        .collect::<Result<Vec<_>, _>>()
        .expect("certificates");
    let key = PrivateKeyDer::from_pem_file(tls_fixtures().join("server.key")).expect("key");
    let mut config = ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("certificate and key");
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = format!("https://{}", listener.local_addr().expect("addr"));
    let backend = server.addr.clone();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, backend) = (acceptor.clone(), backend.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut upstream) = tokio::net::TcpStream::connect(&backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut upstream).await;
            });
        }
    });
    (address, task)
}

#[tokio::test]
async fn an_https_address_speaks_tls_and_trusts_a_private_ca_only_when_given() {
    let server = insecure_server().await;
    let (address, _proxy) = tls_proxy(&server).await;
    let ca = tls_fixtures().join("ca.pem");
    let ca = ca.to_str().expect("utf-8 path");

    let trusted = finish(
        bare(&[
            "server",
            "info",
            "-o",
            "json",
            "--address",
            &address,
            "--ca-cert",
            ca,
        ]),
        None,
    )
    .await
    .ok()
    .json();
    assert_eq!(
        trusted["protocol_version"],
        composer_proto::PROTOCOL_VERSION
    );
    let mut from_env = bare(&["workflow", "list", "--address", &address]);
    from_env.env("COMPOSER_CA_CERT", ca);
    finish(from_env, None).await.ok();

    let untrusted = finish(bare(&["server", "info", "--address", &address]), None).await;
    assert_eq!(untrusted.code, 24, "UNAVAILABLE: {untrusted:?}");
    assert!(
        untrusted.stderr.contains("certificate"),
        "the reason names the certificate: {untrusted:?}"
    );
}

#[tokio::test]
async fn watch_outlives_a_server_restart_and_still_sees_the_run_end() {
    let database = composer_testkit::fresh_database().await;
    let redis = composer_testkit::fresh_redis_url();
    let mut server = ServerProcess::start_with(&binary(), &database, &redis, &[]).await;
    let address = server.addr.clone();
    finish(
        composer(&server, &["workflow", "register", "-"]),
        Some(APPROVAL),
    )
    .await
    .ok();
    let run_id = start(&server, "approval").await;

    let mut watch = spawn(&mut composer(&server, &["run", "watch", &run_id]));
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    while let Some(line) = lines.next_line().await.expect("read watch") {
        if line.starts_with("node approved WAIT_FOR_EVENT WAITING") {
            break;
        }
    }
    server.kill().await;
    let restarted = ServerProcess::start_on(&binary(), &address, &database, &redis, &[]).await;
    cli(&restarted, &["run", "send-event", "approve", &run_id])
        .await
        .ok();
    let mut rest = Vec::new();
    while let Some(line) = lines.next_line().await.expect("read watch") {
        rest.push(line);
    }
    let status = tokio::time::timeout(Duration::from_secs(60), watch.wait())
        .await
        .expect("watch ends")
        .expect("watch exits");
    let mut errors = String::new();
    if let Some(mut stderr) = watch.stderr.take() {
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut errors).await;
    }
    assert_eq!(status.code(), Some(0), "{rest:#?}\n{errors}");
    assert_eq!(
        rest.last(),
        Some(&format!("run {run_id} approval v1 COMPLETED")),
        "{rest:#?}"
    );
}

/// The connection and output flags work before the command group too, as
/// `git -C dir status` or `kubectl -n ns get pods` do.
#[tokio::test]
async fn connection_and_output_flags_may_come_before_the_command() {
    let server = ServerProcess::start(&binary(), &[]).await;
    let url = server.url();
    for args in [
        vec!["--address", url.as_str(), "-o", "json", "server", "info"],
        vec!["server", "--address", url.as_str(), "--output=json", "info"],
        vec!["server", "info", "--address", url.as_str(), "-ojson"],
    ] {
        let got = finish(bare(&args), None).await.ok().json();
        assert!(
            got["protocol_version"]
                .as_str()
                .is_some_and(|v| v.starts_with('1')),
            "{args:?}: {got}"
        );
    }
}

/// `composer token --dev-data DIR` signs with the secret `composer dev`
/// keeps in its data folder, so a developer mints tokens of any role for
/// the dev server; a folder without one says so.
#[tokio::test]
async fn token_dev_data_mints_with_the_dev_servers_secret() {
    let data = tempfile::tempdir().expect("temp dir");
    std::fs::write(data.path().join("auth-secret"), SECRET).expect("secret");
    let server = ServerProcess::start(&binary(), &["--auth-secret", SECRET]).await;
    let folder = data.path().to_str().expect("path");
    let minted = finish(
        bare(&[
            "token",
            "--dev-data",
            folder,
            "--sub",
            "me",
            "--role",
            "reader",
        ]),
        None,
    )
    .await
    .ok();
    let token = minted.stdout.trim();
    let info = cli(&server, &["server", "info", "--token", token, "-o", "json"])
        .await
        .ok()
        .json();
    assert_eq!(info["protocol_version"], composer_proto::PROTOCOL_VERSION);

    let empty = tempfile::tempdir().expect("temp dir");
    let refused = finish(
        bare(&[
            "token",
            "--dev-data",
            empty.path().to_str().expect("path"),
            "--sub",
            "me",
            "--role",
            "reader",
        ]),
        None,
    )
    .await;
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("no `composer dev` secret here"),
        "{refused:#?}"
    );
}
