//! Traces across the server and its workers: a small OTLP/HTTP receiver on
//! loopback collects what the real server and a real Python worker (the
//! SDK with OpenTelemetry installed) export, and the spans of one run must
//! form one trace with the right parents.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, extract::State, routing::post};
use composer_proto::v1::{
    PollTasksRequest, RunStatus, StartRunRequest, worker_service_client::WorkerServiceClient,
};
use composer_testkit::{ServerProcess, client::TestClient, worker::value_of};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use serde_json::json;

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

const WAIT: Duration = Duration::from_secs(120);
const CALLER_TRACE: &str = "5b8aa5a2d2c872e8321cf37308d69df2";
const CALLER_SPAN: &str = "051581bf3cb55c13";

/// One exported span, as the receiver saw it.
#[derive(Debug, Clone)]
struct Seen {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: HashMap<String, String>,
}

type Spans = Arc<Mutex<Vec<Seen>>>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute_text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

async fn receive(State(spans): State<Spans>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
    let mut seen = spans.lock().expect("spans");
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .map(|a| attribute_text(a.value.as_ref()))
            .unwrap_or_default();
        for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
            seen.push(Seen {
                service: service.clone(),
                name: span.name,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: hex(&span.parent_span_id),
                attributes: span
                    .attributes
                    .iter()
                    .map(|a| (a.key.clone(), attribute_text(a.value.as_ref())))
                    .collect(),
            });
        }
    }
    ExportTraceServiceResponse::default().encode_to_vec()
}

/// An OTLP/HTTP receiver on a loopback port: its base URL and what it got.
async fn start_receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let app = Router::new()
        .route("/v1/traces", post(receive))
        .with_state(Arc::clone(&spans));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, spans)
}

/// The SDK's Python (a venv with the SDK and OpenTelemetry): COMPOSER_PYTHON,
/// else the project's venv, made by scripts/python-venv.sh if need be.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("COMPOSER_PYTHON") {
        return PathBuf::from(python);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let made = std::process::Command::new(root.join("scripts/python-venv.sh"))
        .output()
        .expect("run scripts/python-venv.sh");
    assert!(
        made.status.success(),
        "python-venv.sh: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&made.stdout).trim())
}

const WORKER: &str = r#"
import os

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from composer import TaskContext, Worker

provider = TracerProvider(resource=Resource.create({"service.name": "python-worker"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=os.environ["COLLECTOR"] + "/v1/traces")))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("traced-worker")

worker = Worker(os.environ["COMPOSER_ADDRESS"], slots=1)


@worker.task("traced", "step")
async def step(ctx: TaskContext) -> dict[str, object]:
    with tracer.start_as_current_span("user work"):
        return {"n": int(ctx.input.get("n", 0)) + 1}


try:
    worker.run()
finally:
    provider.shutdown()
"#;

const THREE_STEPS: &str = "name: traced\nnodes:\n  - { id: a, type: TASK, queue: traced, task: step, input: { n: 0 } }\n  - { id: b, type: TASK, queue: traced, task: step, input: { n: \"${nodes.a.output.n}\" } }\n  - { id: c, type: TASK, queue: traced, task: step, input: { n: \"${nodes.b.output.n}\" } }\nedges:\n  - { from: a, to: b }\n  - { from: b, to: c }\noutput: { n: \"${nodes.c.output.n}\" }\n";

async fn start_traced(client: &mut TestClient, traceparent: &str) -> String {
    let mut request = tonic::Request::new(StartRunRequest {
        workflow_name: "traced".to_owned(),
        input: Some(value_of(&json!({}))),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().expect("ascii"));
    client
        .runs
        .start_run(request)
        .await
        .expect("start")
        .into_inner()
        .run
        .expect("run")
        .run_id
}

/// Waits until `ready` holds of the spans received.
async fn wait_for(spans: &Spans, what: &str, ready: impl Fn(&[Seen]) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if ready(&spans.lock().expect("spans")) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: never received; got {:#?}",
            spans.lock().expect("spans")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn named<'a>(spans: &'a [Seen], service: &str, name: &str) -> Vec<&'a Seen> {
    spans
        .iter()
        .filter(|s| s.service == service && s.name == name)
        .collect()
}

#[tokio::test]
async fn one_run_is_one_trace_through_the_server_and_a_python_worker() {
    let (collector, spans) = start_receiver().await;
    let mut server =
        ServerProcess::start(&composer_binary(), &["--otlp-endpoint", &collector]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(THREE_STEPS).await;

    let mut worker = tokio::process::Command::new(python())
        .args(["-c", WORKER])
        .env(
            "COMPOSER_ADDRESS",
            server.url().trim_start_matches("http://"),
        )
        .env("COLLECTOR", &collector)
        .kill_on_drop(true)
        .spawn()
        .expect("start the Python worker");

    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let run_id = start_traced(&mut client, &caller).await;
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:?}");
    // the worker's spans are exported as each ends; the server's when it
    // stops (its exporter flushes at exit)
    wait_for(&spans, "three worker spans", |s| {
        named(s, "python-worker", "task step").len() == 3
    })
    .await;
    worker.start_kill().expect("stop the worker");
    let _ = worker.wait().await;
    // a caller's traceparent that is not one starts a trace of its own
    let broken = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-zz");
    let untraced = start_traced(&mut client, &broken).await;
    server.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(server.wait(WAIT).await.is_some(), "the server did not stop");
    wait_for(&spans, "the server's spans", |s| {
        named(s, "composer", "CompleteTask").len() == 3
    })
    .await;
    let spans = spans.lock().expect("spans").clone();

    // every span of the run is of the caller's trace
    let of_run: Vec<&Seen> = spans
        .iter()
        .filter(|s| s.trace_id == CALLER_TRACE)
        .collect();
    let ids: HashMap<&str, &Seen> = of_run.iter().map(|s| (s.span_id.as_str(), *s)).collect();
    let parent_of = |span: &Seen| ids.get(span.parent_span_id.as_str()).copied();

    // StartRun continues the caller's span and is the run's root
    let starts = named(&spans, "composer", "StartRun");
    let root = starts
        .iter()
        .find(|s| s.trace_id == CALLER_TRACE)
        .expect("the run's StartRun span");
    assert_eq!(root.parent_span_id, CALLER_SPAN);
    assert_eq!(root.attributes["composer.workflow_name"], "traced");

    // each event transaction hangs under the root: the start and three reports
    let transactions: Vec<&Seen> = of_run
        .iter()
        .copied()
        .filter(|s| s.name == "run.events")
        .collect();
    assert!(transactions.len() >= 4, "{transactions:#?}");
    for txn in &transactions {
        assert_eq!(txn.parent_span_id, root.span_id, "{txn:?}");
        assert_eq!(txn.attributes["composer.run_id"], run_id);
    }

    // each task was dispatched and leased under the transaction that armed it
    let leases: Vec<&Seen> = of_run
        .iter()
        .copied()
        .filter(|s| s.name == "task.lease")
        .collect();
    assert_eq!(leases.len(), 3, "{leases:#?}");
    for span in of_run
        .iter()
        .filter(|s| s.name == "task.lease" || s.name == "task.dispatch")
    {
        assert_eq!(
            parent_of(span).map(|p| p.name.as_str()),
            Some("run.events"),
            "{span:?}"
        );
    }
    assert!(of_run.iter().filter(|s| s.name == "task.dispatch").count() >= 3);

    // the worker's handler span is the lease's child, and the user's span
    // inside it is the handler's
    let handlers = named(&spans, "python-worker", "task step");
    let mut leased_under: HashSet<&str> = HashSet::new();
    for handler in &handlers {
        assert_eq!(handler.trace_id, CALLER_TRACE, "{handler:?}");
        let lease = parent_of(handler).expect("the handler's parent was exported");
        assert_eq!(lease.name, "task.lease");
        assert_eq!(lease.service, "composer");
        assert!(
            leased_under.insert(lease.span_id.as_str()),
            "two handlers under one lease"
        );
        assert_eq!(handler.attributes["composer.run_id"], run_id);
    }
    let handler_ids: HashSet<&str> = handlers.iter().map(|h| h.span_id.as_str()).collect();
    let user = named(&spans, "python-worker", "user work");
    assert_eq!(user.len(), 3);
    assert!(
        user.iter()
            .all(|u| handler_ids.contains(u.parent_span_id.as_str()))
    );

    // each report is the server's span under the handler that sent it
    let reports = named(&spans, "composer", "CompleteTask");
    let reported: HashSet<&str> = reports.iter().map(|r| r.parent_span_id.as_str()).collect();
    assert_eq!(reported, handler_ids, "{reports:#?}");
    assert!(reports.iter().all(|r| r.trace_id == CALLER_TRACE));

    // the run with a broken traceparent has a trace of its own, rooted at StartRun
    let other = starts
        .iter()
        .find(|s| s.trace_id != CALLER_TRACE)
        .unwrap_or_else(|| panic!("no StartRun span for run {untraced}"));
    assert!(other.parent_span_id.is_empty(), "{other:?}");
}

#[tokio::test]
async fn without_an_endpoint_no_trace_context_reaches_a_worker() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = TestClient::connect(&server.url()).await;
    client.register(THREE_STEPS).await;
    start_traced(&mut client, &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")).await;
    let task = poll_one(&server.url()).await;
    assert!(task.trace_context.is_empty(), "{:?}", task.trace_context);
}

const ONE_STEP: &str =
    "name: traced\nnodes:\n  - { id: a, type: TASK, queue: traced, task: step }\n";

async fn poll_one(url: &str) -> composer_proto::v1::Task {
    let mut worker = WorkerServiceClient::connect(url.to_owned())
        .await
        .expect("connect");
    worker
        .poll_tasks(PollTasksRequest {
            worker_id: "raw".to_owned(),
            queues: vec!["traced".to_owned()],
            max_tasks: 1,
            wait: Some(prost_types::Duration {
                seconds: 30,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .expect("poll")
        .into_inner()
        .tasks
        .pop()
        .expect("a task")
}

async fn complete_with(url: &str, task: &composer_proto::v1::Task, traceparent: &str) {
    let mut worker = WorkerServiceClient::connect(url.to_owned())
        .await
        .expect("connect");
    let mut request = tonic::Request::new(composer_proto::v1::CompleteTaskRequest {
        task_id: task.task_id.clone(),
        attempt: task.attempt,
        lease_token: task.lease_token.clone(),
        output: Some(value_of(&json!({}))),
    });
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().expect("ascii"));
    worker.complete_task(request).await.expect("complete");
}

#[tokio::test]
async fn a_report_to_another_server_stays_in_its_run_s_trace() {
    let (collector, spans) = start_receiver().await;
    let database = composer_testkit::fresh_database().await;
    let redis = composer_testkit::fresh_redis_url();
    let args = ["--otlp-endpoint", collector.as_str()];
    let mut leasing = ServerProcess::start_with(&composer_binary(), &database, &redis, &args).await;
    let mut reporting =
        ServerProcess::start_with(&composer_binary(), &database, &redis, &args).await;
    let mut client = TestClient::connect(&leasing.url()).await;
    client.register(ONE_STEP).await;

    // a worker that names a span of another trace: its report's span stays
    // in the run's trace, under the run's root
    let first = start_traced(&mut client, &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")).await;
    let task = poll_one(&leasing.url()).await;
    let lease = &task.trace_context["traceparent"];
    assert!(lease.starts_with(&format!("00-{CALLER_TRACE}-")), "{lease}");
    let foreign = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    complete_with(&reporting.url(), &task, foreign).await;

    // a worker whose span is of the run's trace: the report hangs under it
    let second_trace = "d4cda95b652f4a1592b449d5929fda1b";
    start_traced(&mut client, &format!("00-{second_trace}-{CALLER_SPAN}-01")).await;
    let task = poll_one(&leasing.url()).await;
    let handler = format!("00-{second_trace}-6e0c63257de34c92-01");
    complete_with(&reporting.url(), &task, &handler).await;
    assert_eq!(
        client.wait_done(&first, WAIT).await.status(),
        RunStatus::Completed
    );

    for server in [&mut leasing, &mut reporting] {
        server.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(server.wait(WAIT).await.is_some(), "the server did not stop");
    }
    wait_for(&spans, "both reports' spans", |s| {
        named(s, "composer", "CompleteTask").len() == 2
    })
    .await;
    let spans = spans.lock().expect("spans").clone();
    assert!(
        spans.iter().all(|s| s.trace_id != foreign[3..35]),
        "a span was grafted into the foreign trace"
    );
    let root = |trace: &str| {
        spans
            .iter()
            .find(|s| s.name == "StartRun" && s.trace_id == trace)
            .expect("StartRun")
            .span_id
            .clone()
    };
    let report = |trace: &str| {
        spans
            .iter()
            .find(|s| s.name == "CompleteTask" && s.trace_id == trace)
            .unwrap_or_else(|| panic!("no report span in {trace}: {spans:#?}"))
            .clone()
    };
    assert_eq!(report(CALLER_TRACE).parent_span_id, root(CALLER_TRACE));
    assert_eq!(report(second_trace).parent_span_id, "6e0c63257de34c92");
}
