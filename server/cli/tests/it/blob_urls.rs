//! Presigned blob URLs end to end (issue 39, decision 0056): with its blobs
//! in a bucket of a real S3 API (moto), the real binary gives URLs from
//! which a GET reads a blob and to which a PUT writes an upload; the bytes
//! never pass through the server but for the one read that learns an
//! upload's digest. A namespace reaches only its own blobs and uploads; a
//! folder, or `--blob-url-secs 0`, gives no URL and says so.

use composer_proto::v1::{
    FinishBlobUploadRequest, GetBlobUrlRequest, GetServerInfoRequest, StartBlobUploadRequest,
    StartRunRequest, blob_service_client::BlobServiceClient, run_service_client::RunServiceClient,
    server_service_client::ServerServiceClient,
};
use composer_testkit::{
    ServerProcess, blob_place::BlobPlace, fresh_database, fresh_redis_url, worker::value_of,
};
use serde_json::json;
use tonic::{Code, transport::Channel};

use crate::common::{TOKEN_ARGS, authed, composer_binary, token, violated_field};

async fn start(place: &BlobPlace, extra: &[&str]) -> ServerProcess {
    let mut args: Vec<String> = place.server_args();
    args.extend(TOKEN_ARGS.iter().map(|arg| (*arg).to_owned()));
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ServerProcess::start_with(
        &composer_binary(),
        &fresh_database().await,
        &fresh_redis_url(),
        &args,
    )
    .await
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// StartBlobUpload, a PUT of `bytes` to its URL; the upload's id.
async fn put_upload(channel: &Channel, caller: &str, bytes: &[u8]) -> String {
    let upload = BlobServiceClient::new(channel.clone())
        .start_blob_upload(authed(StartBlobUploadRequest {}, caller))
        .await
        .expect("an upload URL")
        .into_inner();
    assert!(upload.expires_at.is_some());
    let put = reqwest::Client::new()
        .put(&upload.url)
        .body(bytes.to_vec())
        .send()
        .await
        .expect("the PUT reaches the store");
    assert!(put.status().is_success(), "PUT: {}", put.status());
    upload.upload_id
}

async fn finish(
    channel: &Channel,
    caller: &str,
    upload_id: &str,
) -> Result<composer_proto::v1::BlobRef, tonic::Status> {
    let finished = BlobServiceClient::new(channel.clone())
        .finish_blob_upload(authed(
            FinishBlobUploadRequest {
                upload_id: upload_id.to_owned(),
            },
            caller,
        ))
        .await?;
    Ok(finished.into_inner().blob.expect("a reference"))
}

async fn url_of(
    channel: &Channel,
    caller: &str,
    sha256: &str,
) -> Result<composer_proto::v1::GetBlobUrlResponse, tonic::Status> {
    Ok(BlobServiceClient::new(channel.clone())
        .get_blob_url(authed(
            GetBlobUrlRequest {
                sha256: sha256.to_owned(),
            },
            caller,
        ))
        .await?
        .into_inner())
}

#[tokio::test]
async fn in_a_bucket_blobs_move_through_presigned_urls_of_the_callers_namespace_only() {
    let place = BlobPlace::bucket("composer-urls").await;
    let server = start(&place, &["--max-payload-bytes", "300000"]).await;
    let channel = crate::common::channel(&server).await;
    let alice = token("alice", "alice-worker", &["worker", "client", "operator"]);
    let bob = token("bob", "bob-worker", &["worker", "client"]);

    let info = ServerServiceClient::new(channel.clone())
        .get_server_info(authed(GetServerInfoRequest {}, &alice))
        .await
        .expect("server info")
        .into_inner();
    assert!(info.blob_urls);
    assert!(info.features.iter().any(|f| f == "blob-urls"));

    // up: the bytes go to the store, the server reads them for their digest
    let bytes = serde_json::to_vec(&json!({"doc": "q".repeat(150_000)})).expect("json");
    let upload_id = put_upload(&channel, &alice, &bytes).await;
    let blob = finish(&channel, &alice, &upload_id)
        .await
        .expect("alice finishes her upload");
    assert_eq!(blob.sha256, sha256_hex(&bytes));
    assert_eq!(blob.size, bytes.len() as i64);
    assert!(blob.head.starts_with("{\"doc\":\"qqq"), "{}", blob.head);
    // published at its key, and the upload object is gone
    let store = place.open();
    assert_eq!(
        store
            .size("alice", &composer_blobs::blob_key("alice", &blob.sha256))
            .await
            .expect("head"),
        Some(bytes.len() as u64)
    );
    let far = chrono::Utc::now() + chrono::Duration::hours(1);
    assert!(
        store
            .stale_uploads("alice", far)
            .await
            .expect("list")
            .is_empty()
    );
    let again = finish(&channel, &alice, &upload_id)
        .await
        .expect_err("an upload finishes once");
    assert_eq!(again.code(), Code::NotFound, "{again:?}");

    // down: a GET of the URL reads the blob
    let url = url_of(&channel, &alice, &blob.sha256).await.expect("a URL");
    assert_eq!(url.size, bytes.len() as i64);
    let got = reqwest::get(&url.url)
        .await
        .expect("the GET reaches the store");
    assert!(got.status().is_success(), "GET: {}", got.status());
    assert_eq!(got.bytes().await.expect("body").as_ref(), bytes.as_slice());

    // the reference runs like any other
    crate::common::register(
        &channel,
        &alice,
        "name: w\nnodes:\n  - { id: a, type: TASK, queue: q, task: t }\n",
    )
    .await;
    let reference = json!({"$blob": {"sha256": blob.sha256, "size": blob.size}});
    RunServiceClient::new(channel.clone())
        .start_run(authed(
            StartRunRequest {
                workflow_name: "w".to_owned(),
                input: Some(value_of(&reference)),
                ..Default::default()
            },
            &alice,
        ))
        .await
        .expect("a run on the uploaded blob");

    // bob reaches neither alice's blob nor her upload
    let refused = url_of(&channel, &bob, &blob.sha256)
        .await
        .expect_err("bob asks for alice's blob");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    let hers = put_upload(&channel, &alice, b"\"alice's\"").await;
    let refused = finish(&channel, &bob, &hers)
        .await
        .expect_err("bob finishes alice's upload");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    assert_eq!(violated_field(&refused), "upload_id");
    finish(&channel, &alice, &hers)
        .await
        .expect("still hers to finish");

    // bad names, nothing PUT, too large
    for bad in ["../alice/uploads/x", "", &"0".repeat(36)] {
        let refused = finish(&channel, &bob, bad).await.expect_err("a bad id");
        assert_eq!(
            refused.code(),
            Code::InvalidArgument,
            "{bad:?}: {refused:?}"
        );
        assert_eq!(violated_field(&refused), "upload_id");
    }
    let refused = url_of(&channel, &bob, "../alice").await.expect_err("bad");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(violated_field(&refused), "sha256");
    let nothing = BlobServiceClient::new(channel.clone())
        .start_blob_upload(authed(StartBlobUploadRequest {}, &bob))
        .await
        .expect("an upload URL")
        .into_inner();
    let refused = finish(&channel, &bob, &nothing.upload_id)
        .await
        .expect_err("nothing was PUT");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    let large = serde_json::to_vec(&json!("z".repeat(400_000))).expect("json");
    let too_large = put_upload(&channel, &bob, &large).await;
    let refused = finish(&channel, &bob, &too_large)
        .await
        .expect_err("over --max-payload-bytes");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        store
            .stale_uploads("bob", far)
            .await
            .expect("list")
            .is_empty(),
        "the refused upload is deleted"
    );
    assert!(store.list("bob").await.expect("list").is_empty());
}

#[tokio::test]
async fn a_folder_or_blob_url_secs_0_gives_no_url_and_says_so() {
    let folder = BlobPlace::folder();
    let bucket = BlobPlace::bucket("composer-no-urls").await;
    for (place, extra) in [(&folder, &[][..]), (&bucket, &["--blob-url-secs", "0"][..])] {
        let server = start(place, extra).await;
        let channel = crate::common::channel(&server).await;
        let alice = token("alice", "alice-worker", &["worker", "client"]);
        let info = ServerServiceClient::new(channel.clone())
            .get_server_info(authed(GetServerInfoRequest {}, &alice))
            .await
            .expect("server info")
            .into_inner();
        assert!(!info.blob_urls, "{}", place.location);
        assert!(!info.features.iter().any(|f| f == "blob-urls"));
        let refused = url_of(&channel, &alice, &"0".repeat(64))
            .await
            .expect_err("no URLs");
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        let refused = BlobServiceClient::new(channel.clone())
            .start_blob_upload(authed(StartBlobUploadRequest {}, &alice))
            .await
            .expect_err("no URLs");
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        assert!(refused.message().contains("UploadBlob"), "{refused:?}");
    }
}
