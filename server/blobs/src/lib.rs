//! The blob store (issue 39, decision 0046): large payloads kept out of
//! Postgres, behind one interface over the `object_store` crate, a folder
//! on the local disk by default and S3-compatible storage (GCS, Azure) in
//! production.
//!
//! A blob is content-addressed within its namespace: its key is
//! `<namespace>/sha256/<digest>`, so the same bytes written twice in one
//! namespace are stored once, and two namespaces never share a blob. An
//! upload streams to `<namespace>/uploads/<uuid>` while its digest is
//! computed, and is copied to its key only once whole: a reader never sees
//! half a blob, and an upload cut short leaves only an upload that
//! [`BlobStore::stale_uploads`] lists for deletion.

mod folder_sync;

use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt, stream::BoxStream};
use object_store::{
    ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutPayload, WriteMultipart,
    aws::AmazonS3Builder,
    azure::MicrosoftAzureBuilder,
    gcp::GoogleCloudStorageBuilder,
    path::Path,
    signer::{Method, Signer},
};

/// Parts a multipart upload sends at once: memory per upload is bounded by
/// this many parts (5 MiB each) plus the chunk being written.
const UPLOAD_PARTS_IN_FLIGHT: usize = 2;

/// Below this many bytes a blob is written with one request.
const SINGLE_PUT_BYTES: usize = 5 * 1024 * 1024;

/// Why a blob could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("blob store: {0}")]
    Store(#[from] object_store::Error),
    #[error("blob store location {location:?}: {reason}")]
    Location { location: String, reason: String },
    #[error("the blob is larger than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("no blob {0}")]
    NotFound(String),
    #[error("blob {key} is not a blob of namespace {namespace}")]
    OtherNamespace { key: String, namespace: String },
    #[error("the upload failed: {0}")]
    Upload(String),
    #[error("the blob store does not presign URLs (a local folder)")]
    NoSignedUrls,
}

/// A stored blob: its key, size and SHA-256 digest (hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobRef {
    pub key: String,
    pub size: u64,
    pub digest: String,
}

/// An upload received whole and not yet visible at its key.
#[derive(Debug)]
pub struct Staged {
    pending: Pending,
    /// The blob it becomes.
    pub blob: BlobRef,
    /// Its first bytes (at most [`HEAD_BYTES`]).
    pub head: Bytes,
}

/// Where a staged upload's bytes wait for their publication.
#[derive(Debug)]
enum Pending {
    /// A small blob, held in memory: published by one write.
    Held(Vec<Bytes>),
    /// A large one, written to an upload object (multipart).
    Uploaded(Path),
}

/// How many of a blob's first bytes [`Staged::head`] keeps.
pub const HEAD_BYTES: usize = 256;

/// A namespace's stored blob (or upload), as listed for the collector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedBlob {
    pub key: String,
    pub size: u64,
    pub last_modified: chrono::DateTime<chrono::Utc>,
}

/// Where blobs live, shared by every task of a server.
#[derive(Clone)]
pub struct BlobStore {
    store: Arc<dyn ObjectStore>,
    /// The folder (or bucket prefix) the location named.
    root: Path,
    location: String,
    /// The folder, when the store is the local disk (its multipart uploads
    /// write staging files that listings do not show).
    local_folder: Option<std::path::PathBuf>,
    /// On the local disk: the folder syncs that make renames durable.
    folder_syncs: Arc<folder_sync::FolderSyncs>,
    /// What presigns URLs, when the store can (S3, GCS, Azure).
    signer: Option<Arc<dyn Signer>>,
}

/// A presigned URL and when it stops working.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedUrl {
    pub url: String,
    pub expires_at: std::time::SystemTime,
}

impl std::fmt::Debug for BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobStore")
            .field("location", &self.location)
            .finish()
    }
}

impl BlobStore {
    /// Opens `location`: a folder (a path, or `file:///...`; made if
    /// missing) or a URL `object_store` knows (`s3://bucket/prefix`,
    /// `gs://`, `az://`), configured by `options` (`aws_endpoint`,
    /// `aws_access_key_id`, ...) and, for what they leave out, the
    /// provider's usual environment variables.
    pub fn open(location: &str, options: &[(String, String)]) -> Result<BlobStore, BlobError> {
        let url = location_url(location)?;
        let mut settings: Vec<(String, String)> = provider_environment();
        settings.extend(options.iter().cloned());
        let (store, signer, root) = open_url(&url, &settings).map_err(|e| BlobError::Location {
            location: location.to_owned(),
            reason: e.to_string(),
        })?;
        let local_folder = (url.scheme() == "file")
            .then(|| url.to_file_path().ok())
            .flatten();
        Ok(BlobStore {
            store,
            root,
            location: location.to_owned(),
            local_folder,
            folder_syncs: Arc::default(),
            signer,
        })
    }

    /// Whether the store presigns URLs (not a local folder).
    pub fn signs_urls(&self) -> bool {
        self.signer.is_some()
    }

    /// A URL from which a GET reads `key`, a blob of `namespace`, for
    /// `ttl`, and the blob's size; NotFound when it is not stored.
    pub async fn read_url(
        &self,
        namespace: &str,
        key: &str,
        ttl: std::time::Duration,
    ) -> Result<(SignedUrl, u64), BlobError> {
        let Some(size) = self.size(namespace, key).await? else {
            return Err(BlobError::NotFound(key.to_owned()));
        };
        let url = self.signed(Method::GET, &self.path(key), ttl).await?;
        Ok((url, size))
    }

    /// A new upload of `namespace`: its id (a random UUID, not guessable)
    /// and a URL to which one PUT writes its bytes for `ttl`. Nothing is a
    /// blob until [`BlobStore::stage_upload`] has read them.
    pub async fn upload_url(
        &self,
        namespace: &str,
        ttl: std::time::Duration,
    ) -> Result<(String, SignedUrl), BlobError> {
        check_namespace(namespace)?;
        let id = uuid::Uuid::new_v4().to_string();
        let path = self.path(&upload_key(namespace, &id));
        let url = self.signed(Method::PUT, &path, ttl).await?;
        Ok((id, url))
    }

    /// Reads the bytes PUT to upload `id` of `namespace` once, learning
    /// their digest, size and first bytes: staged like a streamed upload,
    /// the caller records and publishes it. NotFound when the id is not an
    /// upload of the namespace or nothing was PUT; TooLarge past `limit`
    /// (the upload is deleted).
    pub async fn stage_upload(
        &self,
        namespace: &str,
        id: &str,
        limit: u64,
    ) -> Result<Staged, BlobError> {
        check_namespace(namespace)?;
        let id = uuid::Uuid::parse_str(id)
            .map_err(|_| BlobError::NotFound(format!("upload {id}")))?
            .to_string();
        let path = self.path(&upload_key(namespace, &id));
        let got = match self.store.get(&path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(BlobError::NotFound(format!("upload {id}")));
            }
            Err(error) => return Err(error.into()),
        };
        if got.meta.size > limit {
            let _ = self.store.delete(&path).await;
            return Err(BlobError::TooLarge { limit });
        }
        let mut chunks = got.into_stream();
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        let mut size: u64 = 0;
        let mut head: Vec<Bytes> = Vec::new();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            size += chunk.len() as u64;
            if size > limit {
                // written again since: still refused
                let _ = self.store.delete(&path).await;
                return Err(BlobError::TooLarge { limit });
            }
            digest.update(&chunk);
            if head.iter().map(Bytes::len).sum::<usize>() < HEAD_BYTES {
                head.push(chunk);
            }
        }
        let digest = hex(digest.finish().as_ref());
        Ok(Staged {
            pending: Pending::Uploaded(path),
            blob: BlobRef {
                key: blob_key(namespace, &digest),
                size,
                digest,
            },
            head: first_bytes(&head),
        })
    }

    async fn signed(
        &self,
        method: Method,
        path: &Path,
        ttl: std::time::Duration,
    ) -> Result<SignedUrl, BlobError> {
        let Some(signer) = &self.signer else {
            return Err(BlobError::NoSignedUrls);
        };
        let expires_at = std::time::SystemTime::now() + ttl;
        let url = signer.signed_url(method, path, ttl).await?;
        Ok(SignedUrl {
            url: url.to_string(),
            expires_at,
        })
    }

    /// The location it was opened with.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Streams `chunks` into a blob of `namespace`, refusing past `limit`
    /// bytes (nothing is left at the blob's key then, and the upload is
    /// aborted). Memory stays bounded whatever the size.
    pub async fn put<S, E>(
        &self,
        namespace: &str,
        chunks: S,
        limit: u64,
    ) -> Result<BlobRef, BlobError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        let staged = self.stage(namespace, chunks, limit).await?;
        self.publish(staged).await
    }

    /// The first half of [`put`](BlobStore::put): receives `chunks` and
    /// learns their digest, without making a blob visible: a small blob is
    /// held in memory, a large one streams to an upload object. The caller
    /// records the blob (the server touches its row, so the collector
    /// leaves it) and then publishes it.
    pub async fn stage<S, E>(
        &self,
        namespace: &str,
        chunks: S,
        limit: u64,
    ) -> Result<Staged, BlobError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        check_namespace(namespace)?;
        let upload = self.path(&upload_key(namespace, &uuid::Uuid::now_v7().to_string()));
        match self.write(&upload, chunks, limit).await {
            Ok((size, digest, head, held)) => Ok(Staged {
                pending: match held {
                    Some(chunks) => Pending::Held(chunks),
                    None => Pending::Uploaded(upload),
                },
                blob: BlobRef {
                    key: blob_key(namespace, &digest),
                    size,
                    digest,
                },
                head,
            }),
            Err(error) => {
                // a multipart upload was aborted; its object, if any, goes
                let _ = self.store.delete(&upload).await;
                Err(error)
            }
        }
    }

    /// Makes a staged upload the blob at its key (content-addressed: a
    /// blob already there holds these same bytes). On the local disk the
    /// blob is synced before it is visible: a reference committed to
    /// Postgres never outlives its bytes in a crash.
    pub async fn publish(&self, staged: Staged) -> Result<BlobRef, BlobError> {
        let target = self.path(&staged.blob.key);
        match staged.pending {
            Pending::Held(chunks) => self.publish_held(&target, chunks).await?,
            Pending::Uploaded(upload) => self.publish_uploaded(&upload, &target).await?,
        }
        Ok(staged.blob)
    }

    /// A held blob: on the local disk one blocking call writes, syncs and
    /// renames it into place; elsewhere one PUT (all or nothing).
    async fn publish_held(&self, target: &Path, chunks: Vec<Bytes>) -> Result<(), BlobError> {
        let (Some(file), Some(staging)) = (self.local_file(target), self.local_uploads(target))
        else {
            return match self.store.head(target).await {
                Ok(_) => Ok(()),
                Err(object_store::Error::NotFound { .. }) => {
                    self.store
                        .put(target, PutPayload::from_iter(chunks))
                        .await?;
                    Ok(())
                }
                Err(error) => Err(error.into()),
            };
        };
        let syncs = Arc::clone(&self.folder_syncs);
        tokio::task::spawn_blocking(move || write_synced(&file, &staging, &chunks, &syncs))
            .await
            .map_err(|e| BlobError::Upload(e.to_string()))?
            .map_err(|e| BlobError::Upload(format!("write: {e}")))
    }

    /// A large blob already in its upload object: synced, renamed into
    /// place (a copy and a delete off the local disk).
    async fn publish_uploaded(&self, upload: &Path, target: &Path) -> Result<(), BlobError> {
        match self.store.head(target).await {
            Ok(_) => {
                let _ = self.store.delete(upload).await;
                return Ok(());
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(error) => {
                let _ = self.store.delete(upload).await;
                return Err(error.into());
            }
        }
        self.sync_local(upload).await?;
        if let Err(error) = self.store.rename(upload, target).await {
            let _ = self.store.delete(upload).await;
            return Err(error.into());
        }
        self.sync_local_folder(target).await
    }

    /// Drops a staged upload that will not be published.
    pub async fn discard(&self, staged: Staged) {
        if let Pending::Uploaded(upload) = staged.pending {
            let _ = self.store.delete(&upload).await;
        }
    }

    /// On the local disk: the uploads folder of the namespace `target`
    /// (a blob's path) is in.
    fn local_uploads(&self, target: &Path) -> Option<std::path::PathBuf> {
        let namespace = target.prefix_match(&self.root)?.next()?;
        Some(
            self.local_folder
                .as_ref()?
                .join(namespace.as_ref())
                .join("uploads"),
        )
    }

    /// On the local disk: flushes the file at `path` to the disk.
    async fn sync_local(&self, path: &Path) -> Result<(), BlobError> {
        let Some(file) = self.local_file(path) else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let opened = std::fs::File::open(file)?;
            opened.sync_all()?;
            drop_cached(&opened);
            Ok(())
        })
        .await
        .map_err(|e| BlobError::Upload(e.to_string()))?
        .map_err(|e| BlobError::Upload(format!("sync: {e}")))
    }

    /// On the local disk: flushes the folder holding `path` (its entry).
    async fn sync_local_folder(&self, path: &Path) -> Result<(), BlobError> {
        let Some(folder) = self
            .local_file(path)
            .and_then(|file| file.parent().map(std::path::Path::to_path_buf))
        else {
            return Ok(());
        };
        let syncs = Arc::clone(&self.folder_syncs);
        tokio::task::spawn_blocking(move || syncs.sync_after_rename(&folder))
            .await
            .map_err(|e| BlobError::Upload(e.to_string()))?
            .map_err(|e| BlobError::Upload(format!("sync: {e}")))
    }

    /// The file of `path` when the store is the local disk.
    fn local_file(&self, path: &Path) -> Option<std::path::PathBuf> {
        let folder = self.local_folder.as_ref()?;
        let relative = path.prefix_match(&self.root)?;
        Some(relative.fold(folder.clone(), |file, part| file.join(part.as_ref())))
    }

    /// Receives the stream: a small one is returned, held, for one write at
    /// publication; a large one goes to `path` as a multipart upload with a
    /// bounded number of parts in flight.
    async fn write<S, E>(
        &self,
        path: &Path,
        chunks: S,
        limit: u64,
    ) -> Result<(u64, String, Bytes, Option<Vec<Bytes>>), BlobError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        let mut chunks = std::pin::pin!(chunks);
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        let mut size: u64 = 0;
        let mut head: Vec<Bytes> = Vec::new();
        let mut head_bytes = 0usize;
        // small blobs: gather, then one request
        while head_bytes <= SINGLE_PUT_BYTES {
            let Some(chunk) = chunks.next().await else {
                let first = first_bytes(&head);
                return Ok((size, hex(digest.finish().as_ref()), first, Some(head)));
            };
            let chunk = chunk.map_err(|e| BlobError::Upload(e.to_string()))?;
            size += chunk.len() as u64;
            if size > limit {
                return Err(BlobError::TooLarge { limit });
            }
            digest.update(&chunk);
            head_bytes += chunk.len();
            head.push(chunk);
        }
        let first = first_bytes(&head);
        let mut upload = WriteMultipart::new(self.store.put_multipart(path).await?);
        for chunk in head {
            upload.write(&chunk);
        }
        let outcome: Result<(), BlobError> = async {
            while let Some(chunk) = chunks.next().await {
                let chunk = chunk.map_err(|e| BlobError::Upload(e.to_string()))?;
                size += chunk.len() as u64;
                if size > limit {
                    return Err(BlobError::TooLarge { limit });
                }
                digest.update(&chunk);
                upload.wait_for_capacity(UPLOAD_PARTS_IN_FLIGHT).await?;
                upload.write(&chunk);
            }
            Ok(())
        }
        .await;
        match outcome {
            Ok(()) => {
                upload.finish().await?;
                Ok((size, hex(digest.finish().as_ref()), first, None))
            }
            Err(error) => {
                let _ = upload.abort().await;
                Err(error)
            }
        }
    }

    /// The bytes of `key`, which must be a blob of `namespace`, as a stream
    /// of chunks (never whole in memory).
    pub async fn get(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, BlobError>>, BlobError> {
        self.own(namespace, key)?;
        let got = match self.store.get(&self.path(key)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(BlobError::NotFound(key.to_owned()));
            }
            Err(error) => return Err(error.into()),
        };
        Ok(got.into_stream().map_err(BlobError::from).boxed())
    }

    /// The bytes of `key` from `offset` on, as a stream, with the blob's
    /// whole size (NotFound past its end is no error: an empty stream).
    pub async fn get_from(
        &self,
        namespace: &str,
        key: &str,
        offset: u64,
    ) -> Result<(u64, BoxStream<'static, Result<Bytes, BlobError>>), BlobError> {
        self.own(namespace, key)?;
        let path = self.path(key);
        if let Some(file) = self.local_file(&path)
            && let Some(whole) = read_local(file, offset, key).await?
        {
            return Ok(whole);
        }
        let size = match self.store.head(&path).await {
            Ok(meta) => meta.size,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(BlobError::NotFound(key.to_owned()));
            }
            Err(error) => return Err(error.into()),
        };
        if offset >= size {
            return Ok((size, futures::stream::empty().boxed()));
        }
        let options = object_store::GetOptions {
            range: Some((offset..size).into()),
            ..Default::default()
        };
        let got = match self.store.get_opts(&path, options).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(BlobError::NotFound(key.to_owned()));
            }
            Err(error) => return Err(error.into()),
        };
        Ok((size, got.into_stream().map_err(BlobError::from).boxed()))
    }

    /// The whole of `key`, refused (TooLarge) when it is over `limit` bytes:
    /// for the server's own reads of small blobs (expressions).
    pub async fn read(&self, namespace: &str, key: &str, limit: u64) -> Result<Bytes, BlobError> {
        self.own(namespace, key)?;
        let path = self.path(key);
        let got = match self.store.get(&path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(BlobError::NotFound(key.to_owned()));
            }
            Err(error) => return Err(error.into()),
        };
        if got.meta.size > limit {
            return Err(BlobError::TooLarge { limit });
        }
        Ok(got.bytes().await?)
    }

    /// Whether `key`, a blob of `namespace`, is stored, and its size.
    pub async fn size(&self, namespace: &str, key: &str) -> Result<Option<u64>, BlobError> {
        self.own(namespace, key)?;
        match self.store.head(&self.path(key)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Deletes `key`, a blob of `namespace`; deleting one that is not
    /// there is no error.
    pub async fn delete(&self, namespace: &str, key: &str) -> Result<(), BlobError> {
        self.own(namespace, key)?;
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// The namespace's blobs, for the collector to compare with what runs
    /// reference.
    pub async fn list(&self, namespace: &str) -> Result<Vec<ListedBlob>, BlobError> {
        self.list_under(namespace, "sha256").await
    }

    /// Uploads of `namespace` older than `before` (their writer gone).
    pub async fn stale_uploads(
        &self,
        namespace: &str,
        before: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<ListedBlob>, BlobError> {
        let mut uploads = self.list_under(namespace, "uploads").await?;
        uploads.retain(|upload| upload.last_modified < before);
        Ok(uploads)
    }

    /// Every object in the namespace's `folder`.
    async fn list_under(
        &self,
        namespace: &str,
        folder: &str,
    ) -> Result<Vec<ListedBlob>, BlobError> {
        check_namespace(namespace)?;
        let prefix = self.path(&format!("{namespace}/{folder}"));
        let listed: Vec<object_store::ObjectMeta> =
            self.store.list(Some(&prefix)).try_collect().await?;
        Ok(listed
            .into_iter()
            .filter_map(|meta| {
                Some(ListedBlob {
                    key: self.key_of(&meta.location)?,
                    size: meta.size,
                    last_modified: meta.last_modified,
                })
            })
            .collect())
    }

    /// Deletes every upload of every namespace last written before
    /// `before` (their writers gone), and on the local disk the staging
    /// files of multipart uploads cut short. Returns how many went.
    pub async fn sweep_stale_uploads(
        &self,
        before: chrono::DateTime<chrono::Utc>,
    ) -> Result<usize, BlobError> {
        let listed = self.store.list_with_delimiter(Some(&self.root)).await?;
        let mut swept = 0;
        for prefix in listed.common_prefixes {
            let Some(namespace) = prefix.filename().map(str::to_owned) else {
                continue;
            };
            if check_namespace(&namespace).is_err() {
                continue;
            }
            for upload in self.stale_uploads(&namespace, before).await? {
                self.delete_upload(&namespace, &upload.key).await?;
                swept += 1;
            }
            swept += self.sweep_staging_files(&namespace, before);
        }
        Ok(swept)
    }

    /// On the local disk: removes the `#`-suffixed staging files of the
    /// namespace's uploads older than `before`.
    fn sweep_staging_files(&self, namespace: &str, before: chrono::DateTime<chrono::Utc>) -> usize {
        let Some(folder) = &self.local_folder else {
            return 0;
        };
        let Ok(entries) = std::fs::read_dir(folder.join(namespace).join("uploads")) else {
            return 0;
        };
        let before = std::time::SystemTime::from(before);
        entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().contains('#'))
            .filter(|entry| {
                entry
                    .metadata()
                    .and_then(|meta| meta.modified())
                    .is_ok_and(|modified| modified < before)
            })
            .filter(|entry| std::fs::remove_file(entry.path()).is_ok())
            .count()
    }

    /// Deletes an upload [`BlobStore::stale_uploads`] listed.
    pub async fn delete_upload(&self, namespace: &str, key: &str) -> Result<(), BlobError> {
        if !key.starts_with(&format!("{namespace}/uploads/")) {
            return Err(BlobError::OtherNamespace {
                key: key.to_owned(),
                namespace: namespace.to_owned(),
            });
        }
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    fn own(&self, namespace: &str, key: &str) -> Result<(), BlobError> {
        check_namespace(namespace)?;
        let digest = key.strip_prefix(&format!("{namespace}/sha256/"));
        match digest {
            Some(d) if d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(()),
            _ => Err(BlobError::OtherNamespace {
                key: key.to_owned(),
                namespace: namespace.to_owned(),
            }),
        }
    }

    fn path(&self, key: &str) -> Path {
        key.split('/')
            .fold(self.root.clone(), |path, part| path.join(part))
    }

    fn key_of(&self, path: &Path) -> Option<String> {
        let parts: Vec<String> = path
            .prefix_match(&self.root)?
            .map(|part| part.as_ref().to_owned())
            .collect();
        Some(parts.join("/"))
    }
}

/// A local blob's bytes from `offset`, read in one blocking call when they
/// are at most this many (more: streamed by the store).
const LOCAL_WHOLE_READ_BYTES: u64 = 4 * 1024 * 1024;

type Chunks = BoxStream<'static, Result<Bytes, BlobError>>;

/// `file` from `offset` with its size, in one read, unless it has more
/// than [`LOCAL_WHOLE_READ_BYTES`] left (None).
async fn read_local(
    file: std::path::PathBuf,
    offset: u64,
    key: &str,
) -> Result<Option<(u64, Chunks)>, BlobError> {
    use std::io::{Read, Seek};
    let key = key.to_owned();
    let read = tokio::task::spawn_blocking(move || -> std::io::Result<Option<(u64, Bytes)>> {
        let mut opened = std::fs::File::open(&file)?;
        let size = opened.metadata()?.len();
        if size.saturating_sub(offset) > LOCAL_WHOLE_READ_BYTES {
            return Ok(None);
        }
        let mut bytes =
            Vec::with_capacity(usize::try_from(size.saturating_sub(offset)).unwrap_or(0));
        opened.seek(std::io::SeekFrom::Start(offset.min(size)))?;
        opened.read_to_end(&mut bytes)?;
        Ok(Some((size, Bytes::from(bytes))))
    })
    .await
    .map_err(|e| BlobError::Upload(e.to_string()))?;
    match read {
        Ok(Some((size, bytes))) => {
            let chunks: Chunks = if bytes.is_empty() {
                futures::stream::empty().boxed()
            } else {
                futures::stream::once(async move { Ok(bytes) }).boxed()
            };
            Ok(Some((size, chunks)))
        }
        Ok(None) => Ok(None),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(BlobError::NotFound(key)),
        Err(error) => Err(BlobError::Upload(format!("read: {error}"))),
    }
}

/// Writes `chunks` to a file in `staging`, syncs it, renames it to `file`
/// and syncs `file`'s folder; a file already at `file` holds these bytes.
/// A crash leaves at most the `#`-suffixed staging file, which the
/// collector sweeps.
fn write_synced(
    file: &std::path::Path,
    staging: &std::path::Path,
    chunks: &[Bytes],
    syncs: &folder_sync::FolderSyncs,
) -> std::io::Result<()> {
    use std::io::Write;
    if file.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(staging)?;
    let temporary = staging.join(format!("{}#held", uuid::Uuid::now_v7()));
    let written = (|| {
        let mut out = std::fs::File::create(&temporary)?;
        for chunk in chunks {
            out.write_all(chunk)?;
        }
        out.sync_all()?;
        drop_cached(&out);
        let folder = file
            .parent()
            .ok_or_else(|| std::io::Error::other("a blob's path has a folder"))?;
        std::fs::create_dir_all(folder)?;
        std::fs::rename(&temporary, file)?;
        syncs.sync_after_rename(folder)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Lets the kernel drop the cached pages of `file`, whose bytes are on the
/// disk: kept, a stream of blobs written once would fill the page cache,
/// pushing out what Postgres reads, and every page it takes anew costs
/// more to fill than the read that may follow.
fn drop_cached(file: &std::fs::File) {
    #[cfg(target_os = "linux")]
    let _ = nix::fcntl::posix_fadvise(
        file,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// The key of upload `id` of `namespace`.
fn upload_key(namespace: &str, id: &str) -> String {
    format!("{namespace}/uploads/{id}")
}

type Opened = (Arc<dyn ObjectStore>, Option<Arc<dyn Signer>>, Path);

/// The store `url` names, configured by `settings` (the keys a store does
/// not know are left out, as `object_store::parse_url_opts` does), with its
/// signer when it presigns URLs.
fn open_url(url: &url::Url, settings: &[(String, String)]) -> Result<Opened, object_store::Error> {
    macro_rules! signing {
        ($builder:expr) => {{
            let store = Arc::new(
                settings
                    .iter()
                    .fold(
                        $builder.with_url(url.to_string()),
                        |builder, (key, value)| match key.to_ascii_lowercase().parse() {
                            Ok(key) => builder.with_config(key, value.clone()),
                            Err(_) => builder,
                        },
                    )
                    .build()?,
            );
            let signer: Arc<dyn Signer> = store.clone();
            (store as Arc<dyn ObjectStore>, Some(signer))
        }};
    }
    let (scheme, path) = ObjectStoreScheme::parse(url)?;
    let (store, signer) = match scheme {
        ObjectStoreScheme::AmazonS3 => signing!(AmazonS3Builder::new()),
        ObjectStoreScheme::GoogleCloudStorage => signing!(GoogleCloudStorageBuilder::new()),
        ObjectStoreScheme::MicrosoftAzure => signing!(MicrosoftAzureBuilder::new()),
        _ => {
            let (store, _) = object_store::parse_url_opts(url, settings.iter().cloned())?;
            (Arc::from(store), None)
        }
    };
    Ok((store, signer, path))
}

/// The key of the blob of `namespace` whose SHA-256 is `sha256` (hex).
pub fn blob_key(namespace: &str, sha256: &str) -> String {
    format!("{namespace}/sha256/{sha256}")
}

/// A namespace as a path segment: what the name rule allows, never a
/// separator or a dot segment.
fn check_namespace(namespace: &str) -> Result<(), BlobError> {
    let valid = !namespace.is_empty()
        && namespace.len() <= 64
        && namespace != "."
        && namespace != ".."
        && namespace
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(BlobError::OtherNamespace {
            key: String::new(),
            namespace: namespace.to_owned(),
        })
    }
}

/// `location` as a URL: a URL as it is; a path as a `file://` URL of its
/// absolute form, the folder made if missing.
fn location_url(location: &str) -> Result<url::Url, BlobError> {
    let fail = |reason: String| BlobError::Location {
        location: location.to_owned(),
        reason,
    };
    if location.contains("://") {
        let url = url::Url::parse(location).map_err(|e| fail(e.to_string()))?;
        if url.scheme() == "file" {
            let folder = url
                .to_file_path()
                .map_err(|()| fail("not a local path".to_owned()))?;
            std::fs::create_dir_all(&folder).map_err(|e| fail(e.to_string()))?;
        }
        return Ok(url);
    }
    std::fs::create_dir_all(location).map_err(|e| fail(e.to_string()))?;
    let absolute = std::fs::canonicalize(location).map_err(|e| fail(e.to_string()))?;
    url::Url::from_directory_path(&absolute).map_err(|()| fail("not an absolute path".to_owned()))
}

/// The cloud providers' environment variables, as `object_store` options
/// (what their builders' `from_env` read).
fn provider_environment() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(name, _)| {
            name.starts_with("AWS_") || name.starts_with("GOOGLE_") || name.starts_with("AZURE_")
        })
        .map(|(name, value)| (name.to_ascii_lowercase(), value))
        .collect()
}

/// The first [`HEAD_BYTES`] of the gathered chunks.
fn first_bytes(chunks: &[Bytes]) -> Bytes {
    let mut first = Vec::with_capacity(HEAD_BYTES);
    for chunk in chunks {
        let room = HEAD_BYTES - first.len();
        first.extend_from_slice(&chunk[..room.min(chunk.len())]);
        if first.len() == HEAD_BYTES {
            break;
        }
    }
    Bytes::from(first)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
