//! End-to-end: `composer dev`, the README's run command.

use std::{
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Command,
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

fn field<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    line.trim()
        .strip_prefix(label)
        .map(|rest| rest.trim().split(' ').next().unwrap_or_default())
}

/// Every line of `reader`, gathered until it closes.
fn gather_lines(
    reader: impl tokio::io::AsyncRead + Unpin + Send + 'static,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(reader).lines();
        let mut all = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            all.push(line);
        }
        all
    })
}

/// A call with `token` as its bearer.
fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

/// What a newcomer's session leaves open when they press Ctrl-C: a run
/// waiting for its task, a worker's long poll on another queue and a
/// WatchRun stream on the run.
async fn leave_work_open(
    channel: tonic::transport::Channel,
    admin: &str,
) -> Vec<tokio::task::JoinHandle<()>> {
    use composer_proto::v1::{
        PollTasksRequest, RegisterWorkflowRequest, StartRunRequest, WatchRunRequest,
        run_service_client::RunServiceClient, worker_service_client::WorkerServiceClient,
        workflow_service_client::WorkflowServiceClient,
    };
    let source =
        "name: left-open\nnodes:\n  - { id: step, type: TASK, queue: waiting, task: step }\n";
    WorkflowServiceClient::new(channel.clone())
        .register_workflow(with_token(
            RegisterWorkflowRequest {
                source: source.to_owned(),
            },
            admin,
        ))
        .await
        .expect("register");
    let mut runs = RunServiceClient::new(channel.clone());
    let run_id = runs
        .start_run(with_token(
            StartRunRequest {
                workflow_name: "left-open".to_owned(),
                ..StartRunRequest::default()
            },
            admin,
        ))
        .await
        .expect("start")
        .into_inner()
        .run
        .expect("run")
        .run_id;
    let mut stream = runs
        .watch_run(with_token(WatchRunRequest { run_id }, admin))
        .await
        .expect("watch")
        .into_inner();
    let watch = tokio::spawn(async move { while let Ok(Some(_)) = stream.message().await {} });
    let token = admin.to_owned();
    let poll = tokio::spawn(async move {
        let _ = WorkerServiceClient::new(channel)
            .poll_tasks(with_token(
                PollTasksRequest {
                    worker_id: "left-open".to_owned(),
                    queues: vec!["nothing-here".to_owned()],
                    max_tasks: 1,
                    wait: Some(prost_types::Duration {
                        seconds: 30,
                        nanos: 0,
                    }),
                    confirm_receipt: false,
                },
                &token,
            ))
            .await;
    });
    vec![watch, poll]
}

/// Whether a log line (JSON or text) is the server's last: `stopped`.
fn says_stopped(line: &str) -> bool {
    line.contains("\"message\":\"stopped\"") || line.trim_end().ends_with(": stopped")
}

/// The lines of a log (JSON or text) after its `stopped` line that warn or
/// err.
fn complaints_after_stopped(log: &[String]) -> Vec<String> {
    let after = log
        .iter()
        .position(|line| says_stopped(line))
        .map_or(log.len(), |at| at + 1);
    let complains = |line: &&String| {
        [
            "\"level\":\"WARN\"",
            "\"level\":\"ERROR\"",
            " WARN ",
            " ERROR ",
        ]
        .iter()
        .any(|level| line.contains(level))
    };
    log[after..].iter().filter(complains).cloned().collect()
}

#[tokio::test]
async fn dev_serves_on_private_postgres_and_redis_and_cleans_up_on_ctrl_c() {
    // a port other than the default, as `--listen` sets it
    let mut child = Command::new(composer_binary())
        .args(["dev", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn composer dev");
    let logs = gather_lines(child.stderr.take().expect("stderr"));
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut url, mut data, mut admin, mut dashboard) = (None, None, None, None);
    let mut export = None;
    let started = Instant::now();
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(120), stdout.next_line()).await
    {
        url = url.or(field(&line, "gRPC + grpc-web").map(str::to_owned));
        data = data.or(field(&line, "data").map(PathBuf::from));
        admin = admin.or(field(&line, "admin token").map(str::to_owned));
        dashboard = dashboard.or(field(&line, "dashboard").map(str::to_owned));
        export = export.or(line
            .trim()
            .strip_prefix("address")
            .map(|rest| rest.trim().to_owned()));
        if line.starts_with("Press Ctrl-C") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "dev never started"
        );
    }
    let url = url.expect("dev printed its address");
    assert_eq!(
        export.as_deref(),
        Some(format!("export COMPOSER_ADDRESS={url}").as_str()),
        "the address line names the port dev listens on"
    );
    let data = data.expect("dev printed its data folder");
    assert!(
        data.join("postgres/PG_VERSION").is_file(),
        "postgres data in {data:?}"
    );

    let channel = tonic::transport::Channel::from_shared(url.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel.clone());
    let status = health
        .check(HealthCheckRequest::default())
        .await
        .expect("health")
        .into_inner()
        .status();
    assert_eq!(status, ServingStatus::Serving);

    // the printed admin token works; no token does not
    let admin = admin.expect("dev printed an admin token");
    let mut runs = composer_proto::v1::run_service_client::RunServiceClient::new(channel);
    runs.list_runs(with_token(
        composer_proto::v1::ListRunsRequest::default(),
        &admin,
    ))
    .await
    .expect("the admin token is accepted");
    let anonymous = runs
        .list_runs(composer_proto::v1::ListRunsRequest::default())
        .await
        .expect_err("no token");
    assert_eq!(anonymous.code(), tonic::Code::Unauthenticated);

    // the dashboard: one click logs in (the token rides in the fragment),
    // and its grpc-web calls from its own origin pass the origin check
    assert_eq!(
        dashboard.expect("dev printed the dashboard's URL"),
        format!("{url}/#token={admin}")
    );
    let http = reqwest::Client::builder()
        .http1_only()
        .build()
        .expect("client");
    let page = http.get(format!("{url}/")).send().await.expect("GET /");
    assert_eq!(page.status(), 200);
    let mut body = vec![0u8, 0, 0, 0, 0];
    body.extend(prost::Message::encode_to_vec(
        &composer_proto::v1::ListRunsRequest::default(),
    ));
    let same_origin = http
        .post(format!("{url}/composer.v1.RunService/ListRuns"))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .header("origin", url.clone())
        .header("authorization", format!("Bearer {admin}"))
        .body(body)
        .send()
        .await
        .expect("grpc-web from the dashboard's origin");
    let status = same_origin
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let text = String::from_utf8_lossy(&same_origin.bytes().await.expect("body")).into_owned();
    assert!(
        status.as_deref() == Some("0") || text.contains("grpc-status:0"),
        "{status:?} {text}"
    );

    let open = leave_work_open(
        tonic::transport::Channel::from_shared(url.clone())
            .expect("url")
            .connect()
            .await
            .expect("connect"),
        &admin,
    )
    .await;
    // the poll and the stream are held by the server before Ctrl-C comes
    tokio::time::sleep(Duration::from_millis(500)).await;

    let pid = child.id().and_then(|p| i32::try_from(p).ok()).expect("pid");
    kill(Pid::from_raw(pid), Signal::SIGINT).expect("ctrl-c");
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("dev stopped within 30 s")
        .expect("exit status");
    assert!(exit.success(), "{exit:?}");
    assert!(!data.exists(), "the temporary folder {data:?} was removed");
    for task in open {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    // once the server said it stopped, taking Postgres and Redis down
    // behind it warns about nothing
    let log = logs.await.expect("logs");
    assert!(
        log.iter().any(|line| says_stopped(line)),
        "the server logged that it stopped:\n{}",
        log.join("\n")
    );
    let complaints = complaints_after_stopped(&log);
    assert!(
        complaints.is_empty(),
        "after stopped:\n{}",
        complaints.join("\n")
    );
}

/// `make dev` as a person runs it: the script in a terminal's foreground
/// process group, one Ctrl-C sent to that whole group.
#[tokio::test]
async fn make_dev_drains_on_one_ctrl_c_and_prints_commands_that_work_as_typed() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let env_file = tempfile::NamedTempFile::new().expect("env file");
    // a terminal's job starts with SIGINT at its default; a test runner
    // started in the background may have it ignored, which bash could then
    // not trap: `env --default-signal` puts it back
    let mut command = Command::new("env");
    command.args(["--default-signal=INT", "bash"]);
    let mut child = command
        .arg(repo.join("scripts/dev.sh"))
        .args(["--listen", "127.0.0.1:0"])
        .current_dir(&repo)
        .env("COMPOSER_LOG_FORMAT", "text")
        .env("DEV_ENV_COPY", env_file.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn scripts/dev.sh");
    let group = child.id().and_then(|p| i32::try_from(p).ok()).expect("pid");
    // whatever happens below, the script is told to stop everything it started
    let _stop = StopGroup(group);
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let logs = gather_lines(child.stderr.take().expect("stderr"));
    let mut printed = Vec::new();
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(300), stdout.next_line()).await
    {
        let done = line.starts_with("Ctrl-C stops");
        printed.push(line);
        if done {
            break;
        }
    }
    assert!(
        printed.iter().any(|l| l.starts_with("Ctrl-C stops")),
        "make dev never came up:\n{}",
        printed.join("\n")
    );
    // the printed grpcurl command names a program that exists as typed
    let grpcurl_line = printed
        .iter()
        .find(|l| l.contains("-plaintext"))
        .expect("a grpcurl line");
    let program = grpcurl_line
        .split_whitespace()
        .find(|w| w.ends_with("grpcurl"))
        .expect("grpcurl named");
    let runs = std::process::Command::new(program)
        .arg("-version")
        .current_dir(&repo)
        .output();
    assert!(
        runs.is_ok_and(|o| o.status.success()),
        "`{program}` does not run as printed"
    );
    // the env file carries both tokens
    let copied = std::fs::read_to_string(env_file.path()).expect("env copy");
    for key in [
        "COMPOSER_ADDRESS=",
        "COMPOSER_TOKEN=",
        "COMPOSER_WORKER_TOKEN=",
    ] {
        assert!(copied.contains(key), "{key} missing from:\n{copied}");
    }

    nix::sys::signal::killpg(Pid::from_raw(group), Signal::SIGINT).expect("ctrl-c");
    let exit = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("make dev stopped within 60 s")
        .expect("exit status");
    let log = logs.await.expect("logs");
    let complaints = complaints_after_stopped(&log);
    assert!(
        complaints.is_empty(),
        "after stopped:\n{}",
        complaints.join("\n")
    );
    let logs = log.join("\n");
    assert!(logs.contains("draining"), "the server drained:\n{logs}");
    assert!(
        log.iter().any(|line| says_stopped(line)),
        "the server logged that it stopped:\n{logs}"
    );
    assert!(
        !logs.contains("second signal: exiting now"),
        "one Ctrl-C counted twice:\n{logs}"
    );
    let _ = exit; // like any program stopped by Ctrl-C, it ends with 130
    let address = copied
        .lines()
        .find_map(|l| l.strip_prefix("COMPOSER_ADDRESS="))
        .expect("address");
    assert!(
        std::net::TcpStream::connect(address).is_err(),
        "the server at {address} stopped with the script"
    );
}

/// Sends SIGTERM to a process group when dropped.
struct StopGroup(i32);

impl Drop for StopGroup {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(Pid::from_raw(self.0), Signal::SIGTERM);
    }
}

#[test]
fn a_missing_redis_gets_one_line_with_the_install_command() {
    let output = std::process::Command::new(composer_binary())
        .args(["dev", "--listen", "127.0.0.1:0"])
        .env("PATH", "/nonexistent")
        .output()
        .expect("composer runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("apt-get install -y"), "{stderr}");
}
