//! Large payloads end to end (issue 39, decision 0047): the real binary
//! with its blob store in a folder. Values over the threshold are kept as
//! blobs and carried as references; workers and clients move the bytes
//! through BlobService; expressions read inside references; a namespace
//! reaches only its own blobs; a gibibyte streams through with the
//! server's memory bounded; a server killed mid-upload shows nothing.

use std::time::Duration;

use composer_proto::v1::{
    DownloadBlobRequest, GetRunRequest, RunStatus, StartRunRequest, UploadBlobRequest,
    blob_service_client::BlobServiceClient, run_service_client::RunServiceClient,
};
use composer_testkit::{
    ServerProcess,
    blob_place::BlobPlace,
    client::{TestClient, output_of},
    fresh_database, fresh_redis_url,
    worker::{Outcome, TestWorker, json_of, value_of},
};
use futures::StreamExt;
use serde_json::{Value as Json, json};
use sqlx::Connection;
use tonic::{Code, transport::Channel};

use crate::common::{TOKEN_ARGS, authed, composer_binary, violated_field};

const WAIT: Duration = Duration::from_secs(60);

/// `a → b`: `a` gets the run's input whole, `b` gets `a`'s output whole;
/// the run's output reads inside `a`'s output (the server reads its blob).
const PASS_ALONG: &str = "name: pass-along
nodes:
  - { id: a, type: TASK, queue: blobs, task: a, input: '${input}' }
  - { id: b, type: TASK, queue: blobs, task: b, input: '${nodes.a.output}' }
edges:
  - { from: a, to: b }
output: { a: '${size(nodes.a.output.doc)}', n: '${nodes.a.output.n}', b: '${nodes.b.output}' }
";

fn digest_of(reference: &Json) -> String {
    reference["$blob"]["sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("not a reference: {reference:.200}"))
        .to_owned()
}

/// The bytes of a blob, downloaded whole.
async fn download(
    channel: &Channel,
    token: Option<&str>,
    sha256: &str,
) -> Result<Vec<u8>, tonic::Status> {
    let request = DownloadBlobRequest {
        sha256: sha256.to_owned(),
        offset: 0,
    };
    let request = match token {
        Some(token) => authed(request, token),
        None => tonic::Request::new(request),
    };
    let mut stream = BlobServiceClient::new(channel.clone())
        .download_blob(request)
        .await?
        .into_inner();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        bytes.extend_from_slice(&chunk?.data);
    }
    Ok(bytes)
}

async fn channel(server: &ServerProcess) -> Channel {
    crate::common::channel(server).await
}

/// Flags as the server starter takes them.
fn flags(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// How many blobs of the default namespace are visible in `place`.
async fn published(place: &BlobPlace) -> usize {
    place.open().list("default").await.expect("list").len()
}

#[tokio::test]
async fn large_values_are_kept_as_blobs_passed_along_unread_and_read_by_expressions() {
    values_kept_as_blobs(BlobPlace::folder()).await;
}

#[tokio::test]
async fn in_a_bucket_large_values_are_kept_as_blobs_passed_along_and_read() {
    values_kept_as_blobs(BlobPlace::bucket("composer-e2e").await).await;
}

async fn values_kept_as_blobs(place: BlobPlace) {
    let database = fresh_database().await;
    let args = place.server_args();
    let server = ServerProcess::start_with(
        &composer_binary(),
        &database,
        &fresh_redis_url(),
        &flags(&args),
    )
    .await;
    let url = format!("http://{}", server.addr);
    let mut client = TestClient::connect(&url).await;
    client.register(PASS_ALONG).await;
    let _worker = TestWorker::start(&url, &["blobs"], 1, 1, |lease| {
        match lease.task_name.as_str() {
            // the raw protocol: a worker that is not an SDK sees the reference
            "a" => {
                Outcome::Complete(json!({"doc": "y".repeat(200_000), "n": 7, "saw": lease.input}))
            }
            _ => Outcome::Complete(json!({"saw": lease.input})),
        }
    })
    .await;

    let input = json!({"doc": "x".repeat(150_000), "n": 7});
    let run_id = client.start("pass-along", input.clone()).await;
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:?}");
    let output = output_of(&run);
    assert_eq!(
        output["a"],
        json!(200_000),
        "size() read inside a's output blob"
    );
    assert_eq!(output["n"], json!(7));

    // the stored input is a reference with its size and first bytes
    let stored_input = run.input.clone().map(json_of).expect("input");
    let input_digest = digest_of(&stored_input);
    assert!(stored_input["$blob"]["size"].as_u64().expect("size") > 150_000);
    assert!(
        stored_input["$blob"]["head"]
            .as_str()
            .expect("head")
            .starts_with("{\"doc\"")
    );
    // a got the reference as it is (passed along unread), and b got a's
    let b_saw = &output["b"]["saw"];
    assert!(
        b_saw["$blob"]["size"]
            .as_u64()
            .expect("b's input is a reference")
            > 200_000,
        "{b_saw}"
    );
    let channel = channel(&server).await;
    let bytes = download(&channel, None, &input_digest)
        .await
        .expect("download the input");
    assert_eq!(serde_json::from_slice::<Json>(&bytes).expect("JSON"), input);
    let a_output = download(&channel, None, &digest_of(b_saw))
        .await
        .expect("download a's output");
    let a_output: Json = serde_json::from_slice(&a_output).expect("JSON");
    assert_eq!(a_output["doc"].as_str().map(str::len), Some(200_000));
    assert_eq!(
        digest_of(&a_output["saw"]),
        input_digest,
        "a saw the input's reference"
    );

    // Postgres holds references, not payloads, and knows who refers to what
    let mut db = sqlx::PgConnection::connect(&database)
        .await
        .expect("connect");
    let stored: i64 = sqlx::query_scalar("SELECT sum(pg_column_size(input))::int8 FROM runs")
        .fetch_one(&mut db)
        .await
        .expect("runs");
    assert!(
        stored < 2_000,
        "the runs table holds {stored} bytes of input"
    );
    let referred: Vec<String> =
        sqlx::query_scalar("SELECT sha256 FROM blob_refs WHERE owner = $1::uuid ORDER BY sha256")
            .bind(&run_id)
            .fetch_all(&mut db)
            .await
            .expect("blob_refs");
    assert!(referred.contains(&input_digest), "{referred:?}");
    assert!(referred.contains(&digest_of(b_saw)), "{referred:?}");

    // a small input stays inline
    let small = client
        .start("pass-along", json!({"doc": "s", "n": 1}))
        .await;
    let run = client.get(&small).await;
    assert_eq!(run.input.map(json_of), Some(json!({"doc": "s", "n": 1})));
}

#[tokio::test]
async fn a_namespace_reads_and_refers_to_its_own_blobs_only() {
    let server = ServerProcess::start(&composer_binary(), &TOKEN_ARGS).await;
    let channel = channel(&server).await;
    let alice = crate::common::token("alice", "alice-client", &["client"]);
    let bob = crate::common::token("bob", "bob-client", &["client", "operator"]);
    let alice_worker = crate::common::token("alice", "alice-worker", &["worker"]);
    let bytes = serde_json::to_vec(&json!({"secret plans": "z".repeat(1000)})).expect("json");
    let chunks = bytes
        .chunks(300)
        .map(|chunk| UploadBlobRequest {
            data: chunk.to_vec().into(),
        })
        .collect::<Vec<_>>();
    let uploaded = BlobServiceClient::new(channel.clone())
        .upload_blob(authed(futures::stream::iter(chunks), &alice_worker))
        .await
        .expect("alice's worker uploads")
        .into_inner()
        .blob
        .expect("a reference");
    assert_eq!(uploaded.size, bytes.len() as i64);
    assert!(uploaded.head.starts_with("{\"secret plans\""));
    let again = download(&channel, Some(&alice), &uploaded.sha256)
        .await
        .expect("alice reads");
    assert_eq!(again, bytes);

    let refused = download(&channel, Some(&bob), &uploaded.sha256)
        .await
        .expect_err("bob reads");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    for bad in ["../alice/sha256/x", &"A".repeat(64), ""] {
        let refused = download(&channel, Some(&bob), bad)
            .await
            .expect_err("a bad digest");
        assert_eq!(
            refused.code(),
            Code::InvalidArgument,
            "{bad:?}: {refused:?}"
        );
        assert_eq!(violated_field(&refused), "sha256");
    }

    // bob cannot start a run on alice's blob, nor on one that does not exist
    crate::common::register(
        &channel,
        &bob,
        "name: w\nnodes:\n  - { id: a, type: TASK, queue: q, task: t }\n",
    )
    .await;
    let reference = json!({"$blob": {"sha256": uploaded.sha256, "size": uploaded.size}});
    for input in [
        reference,
        json!({"doc": {"$blob": {"sha256": "0".repeat(64)}}}),
        json!({"$blob": "nope"}),
    ] {
        let refused = RunServiceClient::new(channel.clone())
            .start_run(authed(
                StartRunRequest {
                    workflow_name: "w".to_owned(),
                    input: Some(value_of(&input)),
                    ..Default::default()
                },
                &bob,
            ))
            .await
            .expect_err("a reference bob's namespace does not have");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert_eq!(violated_field(&refused), "input");
    }
}

/// The server's peak resident memory, from /proc.
fn peak_rss_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmHWM");
    kib * 1024
}

/// `size` bytes of a JSON string, made chunk by chunk: `"` then filler then `"`.
fn json_string_chunks(size: usize, chunk: usize) -> impl futures::Stream<Item = UploadBlobRequest> {
    let chunks = size.div_ceil(chunk);
    futures::stream::iter((0..chunks).map(move |index| {
        let start = index * chunk;
        let len = chunk.min(size - start);
        let mut data = vec![b'g'; len];
        if start == 0 {
            data[0] = b'"';
        }
        if start + len == size {
            data[len - 1] = b'"';
        }
        UploadBlobRequest { data: data.into() }
    }))
}

#[tokio::test]
async fn a_gibibyte_payload_streams_through_with_the_server_memory_bounded() {
    const SIZE: usize = 1 << 30;
    // a folder removed when the test ends: a gibibyte is not left behind
    let place = BlobPlace::folder();
    let args = place.server_args();
    let server = ServerProcess::start(&composer_binary(), &flags(&args)).await;
    let channel = channel(&server).await;
    let before = peak_rss_bytes(server.pid());
    let uploaded = BlobServiceClient::new(channel.clone())
        .upload_blob(json_string_chunks(SIZE, 1 << 20))
        .await
        .expect("upload a gibibyte")
        .into_inner()
        .blob
        .expect("reference");
    assert_eq!(uploaded.size, SIZE as i64);

    // a run takes it as input and hands it to a task without reading it
    let url = format!("http://{}", server.addr);
    let mut client = TestClient::connect(&url).await;
    client
        .register("name: big\nnodes:\n  - { id: a, type: TASK, queue: big, task: t, input: { doc: '${input}' } }\noutput: '${nodes.a.output}'\n")
        .await;
    let reference = json!({"$blob": {"sha256": uploaded.sha256}});
    let run_id = client.start("big", reference.clone()).await;
    let _worker = TestWorker::start(&url, &["big"], 1, 1, |lease| {
        Outcome::Complete(lease.input["doc"].clone())
    })
    .await;
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:?}");
    assert_eq!(digest_of(&output_of(&run)), uploaded.sha256);

    // and the whole of it comes back
    let mut stream = BlobServiceClient::new(channel.clone())
        .download_blob(DownloadBlobRequest {
            sha256: uploaded.sha256.clone(),
            offset: 0,
        })
        .await
        .expect("download")
        .into_inner();
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    let mut size = 0usize;
    let mut announced = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("chunk");
        announced.get_or_insert(chunk.size);
        assert!(chunk.data.len() <= 1 << 20);
        size += chunk.data.len();
        digest.update(&chunk.data);
    }
    assert_eq!((size, announced), (SIZE, Some(SIZE as i64)));
    let hex: String = digest
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(hex, uploaded.sha256);
    let peak = peak_rss_bytes(server.pid());
    assert!(
        peak < 200_000_000,
        "the server's peak RSS was {} MiB (before: {} MiB)",
        peak >> 20,
        before >> 20
    );
}

#[tokio::test]
async fn a_server_killed_mid_upload_shows_nothing_and_the_retry_completes() {
    killed_mid_upload(BlobPlace::folder()).await;
}

#[tokio::test]
async fn in_a_bucket_a_server_killed_mid_upload_shows_nothing_and_the_retry_completes() {
    killed_mid_upload(BlobPlace::bucket("composer-e2e").await).await;
}

async fn killed_mid_upload(place: BlobPlace) {
    const SIZE: usize = 64 << 20;
    let database = fresh_database().await;
    let redis = fresh_redis_url();
    let args = place.server_args();
    let args = flags(&args);
    let mut server = ServerProcess::start_with(&composer_binary(), &database, &redis, &args).await;
    let channel = channel(&server).await;
    // half the bytes, then a stream that never ends
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&sent);
    let half = json_string_chunks(SIZE, 1 << 20)
        .take(32)
        .inspect(move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
    let stalled = half.chain(futures::stream::pending());
    let upload = tokio::spawn({
        let channel = channel.clone();
        async move { BlobServiceClient::new(channel).upload_blob(stalled).await }
    });
    let deadline = tokio::time::Instant::now() + WAIT;
    while sent.load(std::sync::atomic::Ordering::SeqCst) < 32 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the chunks did not go out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill().await;
    let broken = upload.await.expect("join");
    assert!(
        broken.is_err(),
        "the upload cannot have completed: {broken:?}"
    );

    // nothing is visible: no blob row, no object under sha256/
    let mut db = sqlx::PgConnection::connect(&database)
        .await
        .expect("connect");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM blobs")
        .fetch_one(&mut db)
        .await
        .expect("blobs");
    assert_eq!(rows, 0);
    assert_eq!(published(&place).await, 0, "a blob appeared");

    // the retry, on a new server, completes
    let server = ServerProcess::start_with(&composer_binary(), &database, &redis, &args).await;
    let channel = crate::common::channel(&server).await;
    let uploaded = BlobServiceClient::new(channel.clone())
        .upload_blob(json_string_chunks(SIZE, 1 << 20))
        .await
        .expect("the retry")
        .into_inner()
        .blob
        .expect("reference");
    assert_eq!(uploaded.size, SIZE as i64);
    let bytes = download(&channel, None, &uploaded.sha256)
        .await
        .expect("download");
    assert_eq!(bytes.len(), SIZE);
    assert_eq!(published(&place).await, 1);
}

#[tokio::test]
async fn an_expression_reads_a_blob_up_to_its_limit_and_null_past_it() {
    // --max-expression-blob-bytes bounds what an expression reads
    let server = ServerProcess::start(
        &composer_binary(),
        &[
            "--max-expression-blob-bytes",
            "100000",
            "--payload-offload-bytes",
            "1000",
        ],
    )
    .await;
    let url = format!("http://{}", server.addr);
    let mut client = TestClient::connect(&url).await;
    let channel = channel(&server).await;
    client
        .register("name: reads\nnodes:\n  - { id: s, type: SWITCH }\n  - { id: big, type: TASK, queue: r, task: t }\n  - { id: small, type: TASK, queue: r, task: t }\nedges:\n  - { from: s, to: big, when: 'size(input.doc) > 50000' }\n  - { from: s, to: small }\n")
        .await;
    let _worker = TestWorker::start(&url, &["r"], 1, 1, |_| Outcome::Complete(json!(null))).await;
    // 60 KB: offloaded (over 1000), read (under 100000): the big edge
    let run_id = client
        .start("reads", json!({"doc": "q".repeat(60_000)}))
        .await;
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:?}");
    let taken: Vec<String> = RunServiceClient::new(channel.clone())
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner()
        .run
        .expect("run")
        .nodes
        .into_iter()
        .filter(|n| n.status() == composer_proto::v1::NodeStatus::Completed)
        .map(|n| n.node_id)
        .collect();
    assert!(taken.contains(&"big".to_owned()), "{taken:?}");
    // 200 KB: over what an expression reads: it reads null, the condition
    // errs, and the edge is not taken
    let run_id = client
        .start("reads", json!({"doc": "q".repeat(200_000)}))
        .await;
    let run = client.wait_done(&run_id, WAIT).await;
    assert_eq!(run.status(), RunStatus::Completed, "{run:?}");
    let big = run.nodes.iter().find(|n| n.node_id == "big").expect("big");
    assert_eq!(big.status(), composer_proto::v1::NodeStatus::Skipped);
}
