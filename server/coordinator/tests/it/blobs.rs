//! The lifetime of payload blobs (decision 0047), against Postgres and a
//! blob store in a folder or a real S3 API (moto): retention takes a run's references, the
//! collector deletes a blob once nothing refers to it, and, whatever the
//! interleaving of uploads, runs started on references, run deletions and
//! collector passes, no run ever holds a reference to a deleted blob.

use crate::common;

use std::time::Duration;

use composer_blobs::{BlobStore, blob_key};
use composer_coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorError, payloads::Payloads,
    time::recovery::RecoveryConfig,
};
use composer_testkit::blob_place::BlobPlace;
use proptest::prelude::*;
use serde_json::{Value as Json, json};
use uuid::Uuid;

/// One TASK: a run stays RUNNING until cancelled.
const WAITS: &str =
    "name: waits\nnodes:\n  - { id: a, type: TASK, queue: q, task: t, input: '${input}' }\n";

struct Setup {
    coordinator: Coordinator,
    store: BlobStore,
    /// Kept (the folder, the moto server) while the test runs.
    _place: BlobPlace,
}

async fn setup() -> Setup {
    setup_on(BlobPlace::folder()).await
}

async fn setup_on_s3() -> Setup {
    setup_on(BlobPlace::bucket("composer-lifetime").await).await
}

async fn setup_on(place: BlobPlace) -> Setup {
    let store = place.open();
    let coordinator = Coordinator::new(
        common::fresh_store(16).await,
        CoordinatorConfig {
            payload_offload_bytes: 1_000,
            ..CoordinatorConfig::default()
        },
    )
    .with_payloads(Payloads::new(store.clone(), 1 << 20));
    coordinator
        .workflows()
        .register(coordinator.store(), "default", WAITS)
        .await
        .expect("register");
    Setup {
        coordinator,
        store,
        _place: place,
    }
}

fn digest_of(reference: &Json) -> String {
    reference["$blob"]["sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("not a reference: {reference}"))
        .to_owned()
}

async fn stored(store: &BlobStore, sha256: &str) -> bool {
    store
        .size("default", &blob_key("default", sha256))
        .await
        .expect("size")
        .is_some()
}

/// Ends `run_id` and makes it look two days old, so retention takes it.
async fn end_long_ago(coordinator: &Coordinator, run_id: Uuid) {
    coordinator
        .cancel_run(Some("default"), &run_id.to_string(), "done", "test")
        .await
        .expect("cancel");
    sqlx::query("UPDATE runs SET ended_at = now() - interval '2 days' WHERE id = $1")
        .bind(run_id)
        .execute(coordinator.store().pool())
        .await
        .expect("age");
}

#[tokio::test]
async fn retention_takes_a_runs_references_and_the_collector_then_its_blob() {
    retention_then_collector(setup().await).await;
}

#[tokio::test]
async fn on_s3_retention_takes_a_runs_references_and_the_collector_then_its_blob() {
    retention_then_collector(setup_on_s3().await).await;
}

async fn retention_then_collector(setup: Setup) {
    let Setup {
        coordinator, store, ..
    } = setup;
    let input = json!({"doc": "d".repeat(5_000)});
    let (first, _) = coordinator
        .start_run(common::start_request("waits", input.clone()))
        .await
        .expect("start");
    let (second, _) = coordinator
        .start_run(common::start_request("waits", input))
        .await
        .expect("start again");
    let digest = digest_of(&first.input);
    assert_eq!(
        digest,
        digest_of(&second.input),
        "the same bytes are one blob"
    );
    let later = chrono::Utc::now() + chrono::Duration::hours(2);
    let grace = Duration::from_secs(3600);

    // the first run goes; the second still refers to the blob
    end_long_ago(&coordinator, first.id).await;
    let retention = RecoveryConfig::default();
    coordinator
        .apply_retention(Duration::from_secs(24 * 3600), retention.batch)
        .await
        .expect("retention");
    let pass = coordinator
        .collect_blobs(later, grace)
        .await
        .expect("collect");
    assert_eq!(pass.blobs_deleted, 0, "{pass:?}");
    assert!(stored(&store, &digest).await);

    // within the grace nothing goes, even unreferenced
    end_long_ago(&coordinator, second.id).await;
    coordinator
        .apply_retention(Duration::from_secs(24 * 3600), retention.batch)
        .await
        .expect("retention");
    let pass = coordinator
        .collect_blobs(chrono::Utc::now(), grace)
        .await
        .expect("collect");
    assert_eq!(pass.blobs_deleted, 0, "touched within the grace: {pass:?}");

    // past it, the blob and its row go
    let pass = coordinator
        .collect_blobs(later, grace)
        .await
        .expect("collect");
    assert_eq!(pass.blobs_deleted, 1, "{pass:?}");
    assert!(!stored(&store, &digest).await);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM blobs")
        .fetch_one(coordinator.store().pool())
        .await
        .expect("blobs");
    assert_eq!(rows, 0);
}

/// Replay reads inside a run's blobs as the run did (decision 0047): a
/// run whose task input is rendered from inside its offloaded input is
/// replayed against its own definition with the blob's value, as
/// identical; without it the replay could not decide the run's start.
#[tokio::test]
async fn a_run_whose_expression_read_inside_its_blob_replays_as_identical() {
    let Setup { coordinator, .. } = setup().await;
    let reads = "name: reads\nnodes:\n  - { id: a, type: TASK, queue: q, task: t, \
                 input: { n: '${size(input.doc)}' } }\n";
    coordinator
        .workflows()
        .register(coordinator.store(), "default", reads)
        .await
        .expect("register");
    let (run, _) = coordinator
        .start_run(common::start_request(
            "reads",
            json!({"doc": "d".repeat(5_000)}),
        ))
        .await
        .expect("start");
    assert!(
        run.input.get("$blob").is_some(),
        "the input is offloaded: {}",
        run.input
    );
    let verdict = coordinator
        .replay_run(
            "default",
            run.id,
            &composer_coordinator::versions::NewDefinition::Version(1),
            &composer_engine::replay::NodeMapping::default(),
        )
        .await
        .expect("replay");
    let report = verdict.outcome.expect("replayed with the blob's value");
    assert_eq!(
        report.verdict,
        composer_engine::replay::Verdict::Identical,
        "{report:#?}"
    );
}

/// Uploads at the same time have their rows written together: a group
/// holding the same blob twice and blobs of two namespaces writes one row
/// per blob, every upload gets its blob back, and a reference coming back
/// right after its upload is accepted.
#[tokio::test]
async fn uploads_at_the_same_time_write_their_rows_together_one_per_blob() {
    let setup = setup().await;
    let coordinator = &setup.coordinator;
    let uploads = (0..60u8).map(|i| async move {
        let namespace = if i % 2 == 0 { "default" } else { "other" };
        (
            namespace,
            i % 6,
            upload(coordinator, namespace, i % 6).await,
        )
    });
    let done = futures::future::join_all(uploads).await;
    for (_, n, digest) in &done {
        assert_eq!(*digest, sha256(&content(*n)));
    }
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT namespace, count(*) FROM blobs GROUP BY namespace ORDER BY namespace",
    )
    .fetch_all(coordinator.store().pool())
    .await
    .expect("rows");
    // even i: contents 0, 2, 4 in default; odd i: 1, 3, 5 in other
    assert_eq!(
        rows,
        vec![("default".to_owned(), 3), ("other".to_owned(), 3)]
    );
    let reference = json!({"$blob": {"sha256": sha256(&content(0))}});
    let (run, _) = coordinator
        .start_run(common::start_request("waits", reference))
        .await
        .expect("a reference to a blob just uploaded is accepted");
    // written out as stored: the size and head the upload recorded
    assert_eq!(run.input["$blob"]["size"], json!(content(0).len()));
    assert!(
        run.input["$blob"]["head"]
            .as_str()
            .is_some_and(|h| h.starts_with("{\"content\":0"))
    );
}

/// The runs of one group refer to their blobs in one statement: each run
/// started holds its references, and a run whose blob's row went after its
/// reference was accepted (another server's collector took it) fails
/// alone, its group's other runs written.
#[tokio::test]
async fn runs_started_together_refer_to_their_blobs_and_one_whose_blob_went_fails_alone() {
    let setup = setup().await;
    let coordinator = &setup.coordinator;
    for n in 0..6u8 {
        upload(coordinator, "default", n).await;
    }
    let gone = sha256(&content(5));
    // this server still remembers writing the row: only the run's own
    // statement can find that it went
    sqlx::query("DELETE FROM blobs WHERE namespace = 'default' AND sha256 = $1")
        .bind(&gone)
        .execute(coordinator.store().pool())
        .await
        .expect("take the row");
    let before = coordinator.group_commit_stats();
    // one run of the blob that went: a group redoes itself without one
    // failed item, and sends every item alone at a second
    let starts = (0..31u8).map(|i| async move {
        let n = if i == 30 { 5 } else { i % 5 };
        let reference = json!({"$blob": {"sha256": sha256(&content(n))}});
        let outcome = coordinator
            .start_run(common::start_request("waits", reference))
            .await;
        (n, outcome)
    });
    let mut started = Vec::new();
    for (n, outcome) in futures::future::join_all(starts).await {
        match outcome {
            Ok((run, _)) if n != 5 => started.push(run.id),
            Err(CoordinatorError::BlobNotFound { sha256, .. }) if n == 5 => {
                assert_eq!(sha256, gone);
            }
            other => panic!("content {n}: {other:?}"),
        }
    }
    assert_eq!(started.len(), 30);
    let referring: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT owner) FROM blob_refs WHERE owner = ANY($1) AND sha256 <> $2",
    )
    .bind(&started)
    .bind(&gone)
    .fetch_one(coordinator.store().pool())
    .await
    .expect("refs");
    assert_eq!(referring, 30, "every run started refers to its blob");
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(coordinator.store().pool())
        .await
        .expect("runs");
    assert_eq!(runs, 30, "no run of the blob that went");
    let after = coordinator.group_commit_stats();
    assert!(
        after.shared_writes >= before.shared_writes + 2,
        "the starts were written together: {after:?}"
    );
}

/// One step of an actor.
#[derive(Debug, Clone)]
enum Step {
    /// Upload content `n` (the same bytes as other uploads of `n`).
    Upload(u8),
    /// Start a run whose input refers to content `n`'s blob.
    Start(u8),
    /// Delete a run started earlier (as retention does), picked by index.
    Delete(u8),
    /// A collector pass that spares nothing for its age.
    Collect,
}

fn content(n: u8) -> Vec<u8> {
    serde_json::to_vec(&json!({"content": n, "pad": "p".repeat(2_000)})).expect("json")
}

/// Uploads content `n` to `namespace` in one chunk; its digest.
async fn upload(coordinator: &Coordinator, namespace: &str, n: u8) -> String {
    let chunks = futures::stream::iter([Ok::<_, std::convert::Infallible>(bytes::Bytes::from(
        content(n),
    ))]);
    coordinator
        .upload_blob(namespace, chunks)
        .await
        .expect("upload")
        .sha256
}

fn sha256(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

async fn perform(setup: &Setup, step: Step, started: &tokio::sync::Mutex<Vec<Uuid>>) {
    let coordinator = &setup.coordinator;
    match step {
        Step::Upload(n) => {
            upload(coordinator, "default", n).await;
        }
        Step::Start(n) => {
            let reference = json!({"$blob": {"sha256": sha256(&content(n))}});
            match coordinator
                .start_run(common::start_request("waits", reference))
                .await
            {
                Ok((run, _)) => started.lock().await.push(run.id),
                // never uploaded, or collected before the run committed
                Err(CoordinatorError::BlobNotFound { .. }) => {}
                Err(error) => panic!("start: {error}"),
            }
        }
        Step::Delete(pick) => {
            let run_id = {
                let mut started = started.lock().await;
                if started.is_empty() {
                    return;
                }
                let index = usize::from(pick) % started.len();
                started.swap_remove(index)
            };
            let pool = coordinator.store().pool();
            // what retention's statement does for one run
            sqlx::query("DELETE FROM blob_refs WHERE owner = $1")
                .bind(run_id)
                .execute(pool)
                .await
                .expect("refs");
            for statement in [
                "DELETE FROM run_nodes WHERE run_id = $1",
                "DELETE FROM tasks WHERE run_id = $1",
                "DELETE FROM runs WHERE id = $1",
            ] {
                sqlx::query(statement)
                    .bind(run_id)
                    .execute(pool)
                    .await
                    .expect(statement);
            }
        }
        Step::Collect => {
            let far = chrono::Utc::now() + chrono::Duration::days(1);
            coordinator
                .collect_blobs(far, Duration::from_secs(3600))
                .await
                .expect("collect");
        }
    }
}

/// Every run that exists has its input's blob, row and bytes.
async fn every_reference_holds(setup: &Setup) -> Result<(), String> {
    let unowned: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM runs r WHERE NOT EXISTS (SELECT 1 FROM blob_refs b WHERE b.owner = r.id)",
    )
    .fetch_all(setup.coordinator.store().pool())
    .await
    .expect("runs");
    if !unowned.is_empty() {
        return Err(format!("runs refer to no blob: {unowned:?}"));
    }
    let inputs: Vec<Json> = sqlx::query_scalar("SELECT input FROM runs")
        .fetch_all(setup.coordinator.store().pool())
        .await
        .expect("runs");
    for input in inputs {
        let digest = digest_of(&input);
        if !stored(&setup.store, &digest).await {
            return Err(format!("a run refers to deleted blob {digest}"));
        }
        let row: i64 = sqlx::query_scalar("SELECT count(*) FROM blobs WHERE sha256 = $1")
            .bind(&digest)
            .fetch_one(setup.coordinator.store().pool())
            .await
            .expect("blobs");
        if row != 1 {
            return Err(format!("a run refers to blob {digest}, which has no row"));
        }
    }
    Ok(())
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..3).prop_map(Step::Upload),
        4 => (0u8..3).prop_map(Step::Start),
        2 => any::<u8>().prop_map(Step::Delete),
        2 => Just(Step::Collect),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Steps run in waves of up to `width` at once, so every kind of step
    /// meets every other mid-way; after each wave, no run that exists
    /// refers to a blob that is gone.
    #[test]
    fn the_collector_never_deletes_a_blob_a_run_refers_to(
        steps in prop::collection::vec(step(), 10..40),
        width in 2usize..6,
        on_s3 in prop::bool::weighted(0.25),
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("runtime");
        let outcome: Result<(), String> = runtime.block_on(async {
            let setup = if on_s3 { setup_on_s3().await } else { setup().await };
            let started = tokio::sync::Mutex::new(Vec::new());
            for wave in steps.chunks(width) {
                futures::future::join_all(
                    wave.iter().cloned().map(|step| perform(&setup, step, &started)),
                )
                .await;
                every_reference_holds(&setup).await?;
            }
            Ok(())
        });
        prop_assert!(outcome.is_ok(), "{:?}", outcome);
    }
}
