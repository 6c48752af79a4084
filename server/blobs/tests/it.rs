//! The blob store against a local folder and against a real S3 API (moto's
//! server on loopback, installed by scripts/setup.sh; decision 0046): the
//! same rules on both.

use bytes::Bytes;
use composer_blobs::{BlobError, BlobStore};
use composer_testkit::moto::Moto;
use futures::{StreamExt, TryStreamExt, stream};

fn s3(moto: &Moto) -> BlobStore {
    BlobStore::open(&moto.location(), &moto.options()).expect("open s3")
}

/// `size` bytes that differ from any other call's (a counter and a seed).
fn bytes_of(size: usize, seed: u8) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect()
}

/// `data` as a stream of 64 KiB chunks, as a worker's upload arrives.
fn chunks(data: &[u8]) -> impl futures::Stream<Item = Result<Bytes, String>> + Send + 'static {
    let parts: Vec<Result<Bytes, String>> = data
        .chunks(64 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    stream::iter(parts)
}

fn sha256(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn read(store: &BlobStore, namespace: &str, key: &str) -> Vec<u8> {
    let parts: Vec<Bytes> = store
        .get(namespace, key)
        .await
        .expect("get")
        .try_collect()
        .await
        .expect("read");
    parts.concat()
}

/// The rules every store follows; `large` is over the single-request size,
/// so it goes as a multipart upload.
async fn follows_the_rules(store: &BlobStore) {
    for size in [0, 10_000, 12 * 1024 * 1024 + 7] {
        let data = bytes_of(size, 1);
        let blob = store
            .put("shop", chunks(&data), u64::MAX)
            .await
            .expect("put");
        assert_eq!(blob.size, size as u64);
        assert_eq!(blob.digest, sha256(&data));
        assert_eq!(blob.key, format!("shop/sha256/{}", blob.digest));
        assert_eq!(
            read(store, "shop", &blob.key).await,
            data,
            "{size} bytes back"
        );
        assert_eq!(
            store.size("shop", &blob.key).await.expect("size"),
            Some(size as u64)
        );
    }

    // the same bytes twice are one blob; another namespace's are its own
    let data = bytes_of(300_000, 2);
    let first = store
        .put("shop", chunks(&data), u64::MAX)
        .await
        .expect("put");
    let again = store
        .put("shop", chunks(&data), u64::MAX)
        .await
        .expect("put again");
    assert_eq!(first, again);
    let theirs = store
        .put("bank", chunks(&data), u64::MAX)
        .await
        .expect("put bank");
    assert_ne!(theirs.key, first.key);
    let listed = store.list("shop").await.expect("list");
    assert_eq!(listed.len(), 4, "{listed:?}");
    assert_eq!(store.list("bank").await.expect("list").len(), 1);

    // a namespace reads only its own blobs, however the key is spelt
    for key in [
        first.key.clone(),
        format!("bank/sha256/../../{}", first.key),
        format!("bank/sha256/{}/..", first.digest),
        "bank/uploads/x".to_owned(),
    ] {
        let refused = store.get("bank", &key).await.err().expect("refused");
        assert!(
            matches!(refused, BlobError::OtherNamespace { .. }),
            "{key}: {refused}"
        );
    }
    assert!(matches!(
        store
            .get("../shop", &first.key)
            .await
            .err()
            .expect("refused"),
        BlobError::OtherNamespace { .. }
    ));
    let missing = format!("shop/sha256/{}", "0".repeat(64));
    assert!(matches!(
        store.get("shop", &missing).await.err().expect("missing"),
        BlobError::NotFound(_)
    ));

    // past the limit: refused, nothing stored, no upload left behind
    for size in [3_000, 7 * 1024 * 1024] {
        let data = bytes_of(size, 3);
        let refused = store
            .put("limits", chunks(&data), (size - 1) as u64)
            .await
            .expect_err("too large");
        assert!(matches!(refused, BlobError::TooLarge { .. }), "{refused}");
    }
    // a writer that fails midway (a worker gone): nothing visible
    let data = bytes_of(9 * 1024 * 1024, 4);
    let cut = chunks(&data)
        .take(100)
        .chain(stream::iter([Err("the worker went away".to_owned())]));
    let failed = store.put("limits", cut, u64::MAX).await.expect_err("cut");
    assert!(matches!(failed, BlobError::Upload(_)), "{failed}");
    assert!(store.list("limits").await.expect("list").is_empty());
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    assert!(
        store
            .stale_uploads("limits", later)
            .await
            .expect("uploads")
            .is_empty()
    );

    // deleting is idempotent
    store.delete("shop", &first.key).await.expect("delete");
    store
        .delete("shop", &first.key)
        .await
        .expect("delete again");
    assert_eq!(store.size("shop", &first.key).await.expect("size"), None);
    assert_eq!(
        read(store, "bank", &theirs.key).await,
        data_of(&theirs, store).await
    );
}

/// What `blob` holds, read back (the other namespace's copy survives a
/// delete in the first).
async fn data_of(blob: &composer_blobs::BlobRef, store: &BlobStore) -> Vec<u8> {
    let namespace = blob.key.split('/').next().expect("namespace");
    read(store, namespace, &blob.key).await
}

#[tokio::test]
async fn a_local_folder_follows_the_rules() {
    let dir = tempfile::tempdir().expect("dir");
    let store =
        BlobStore::open(dir.path().join("blobs").to_str().expect("path"), &[]).expect("open");
    follows_the_rules(&store).await;
    // a file:// URL names the same folder
    let again = BlobStore::open(
        &format!("file://{}", dir.path().join("blobs").display()),
        &[],
    )
    .expect("open url");
    assert_eq!(again.list("bank").await.expect("list").len(), 1);
}

#[tokio::test]
async fn an_s3_bucket_follows_the_rules() {
    let moto = Moto::start("composer-blobs").await;
    follows_the_rules(&s3(&moto)).await;
}

#[tokio::test]
async fn an_unknown_location_is_refused_plainly() {
    let refused = BlobStore::open("ftp://example/blobs", &[]).expect_err("refused");
    assert!(
        refused.to_string().contains("ftp://example/blobs"),
        "{refused}"
    );
}

#[tokio::test]
async fn an_upload_left_behind_is_listed_once_stale() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("blobs");
    let store = BlobStore::open(root.to_str().expect("path"), &[]).expect("open");
    // what a server killed mid-upload leaves: a part written under uploads/
    let uploads = root.join("shop/uploads");
    std::fs::create_dir_all(&uploads).expect("dir");
    std::fs::write(uploads.join("0190-half"), b"half an upload").expect("write");
    let now = chrono::Utc::now();
    assert!(
        store.list("shop").await.expect("list").is_empty(),
        "never a blob"
    );
    let before = now - chrono::Duration::hours(1);
    assert!(
        store
            .stale_uploads("shop", before)
            .await
            .expect("stale")
            .is_empty()
    );
    let stale = store
        .stale_uploads("shop", now + chrono::Duration::seconds(5))
        .await
        .expect("stale");
    assert_eq!(stale.len(), 1, "{stale:?}");
    store
        .delete_upload("shop", &stale[0].key)
        .await
        .expect("delete");
    assert!(!uploads.join("0190-half").exists());
    assert!(store.delete_upload("bank", &stale[0].key).await.is_err());
}

/// Resident bytes of `file` in the page cache, as util-linux's `fincore`
/// counts them.
fn cached_bytes(file: &std::path::Path) -> u64 {
    let out = std::process::Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(file)
        .output()
        .expect("fincore (util-linux)");
    assert!(out.status.success(), "fincore: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a byte count")
}

/// A blob written to the local disk leaves the page cache once it is
/// synced (decision 0049), whether it came in one request or as an upload
/// of parts; read again, it is whole.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_blob_on_the_local_disk_leaves_the_page_cache_once_synced() {
    // under target/, not /tmp: a tmpfs keeps every page it holds
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let root = dir.path().join("blobs");
    let store = BlobStore::open(root.to_str().expect("path"), &[]).expect("open");
    for size in [1_000_000, 12 * 1024 * 1024 + 7] {
        let data = bytes_of(size, 9);
        let blob = store
            .put("media", chunks(&data), u64::MAX)
            .await
            .expect("put");
        let file = blob
            .key
            .split('/')
            .fold(root.clone(), |path, part| path.join(part));
        assert_eq!(cached_bytes(&file), 0, "{size} bytes: none cached");
        assert_eq!(read(&store, "media", &blob.key).await, data);
    }
}
