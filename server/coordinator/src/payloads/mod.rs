//! Large payloads (decision 0047): values over the offload threshold go to
//! the blob store, and runs carry references to them.
//!
//! - [`Coordinator::accept_payload`]: a value a request brings (a run's
//!   input, a task's output, an event's payload) is offloaded when large,
//!   and the references it holds are checked against the namespace's
//!   blobs, touched (so the collector leaves them for an hour) and written
//!   out canonically (size and head as stored, never as sent).
//! - [`Coordinator::upload_blob`]: BlobService's upload, streamed; or
//!   presigned URLs when the store signs them (`urls`).
//! - [`Coordinator::blob_value`]: a blob's value for an expression,
//!   bounded and cached.
//! - The collector: [`Coordinator::collect_blobs`].

mod cache;
mod collect;
mod touch;
mod urls;

use std::sync::Arc;

use bytes::Bytes;
use composer_blobs::{BlobError, BlobStore, HEAD_BYTES};
use composer_engine::{blob, json_text, replay::RecordedRun};
use composer_store::blobs::{self, BlobRow};
use futures::Stream;
use serde_json::Value as Json;

use crate::{
    Coordinator,
    error::{CoordinatorError, FieldProblem},
};

pub use collect::CollectorPass;
pub use urls::BlobUpload;

/// How long an untouched blob that nothing refers to is kept, and how old
/// an upload must be before it is taken for abandoned.
pub const BLOB_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The blob store with what the server keeps beside it.
pub struct Payloads {
    store: BlobStore,
    cache: cache::BlobCache,
    rows: touch::RowWriter,
    /// How long a presigned URL works; zero: none is given.
    url_ttl: std::time::Duration,
}

impl std::fmt::Debug for Payloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payloads")
            .field("store", &self.store)
            .finish()
    }
}

impl Payloads {
    /// Payloads kept in `store`, with `cache_bytes` of blob values cached
    /// for expressions.
    pub fn new(store: BlobStore, cache_bytes: usize) -> Self {
        Self {
            store,
            cache: cache::BlobCache::new(cache_bytes),
            rows: touch::RowWriter::default(),
            url_ttl: std::time::Duration::ZERO,
        }
    }

    /// Gives presigned URLs that work for `ttl` when the store signs them
    /// (zero: never).
    pub fn with_url_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.url_ttl = ttl;
        self
    }
}

/// What an upload stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlob {
    /// SHA-256, hex.
    pub sha256: String,
    /// Bytes.
    pub size: u64,
    /// Its first bytes, as text.
    pub head: String,
}

/// The first bytes of a blob as text: cut at a character boundary.
fn head_text(head: &[u8]) -> String {
    let end = head.len().min(HEAD_BYTES);
    match std::str::from_utf8(&head[..end]) {
        Ok(text) => text.to_owned(),
        Err(error) => String::from_utf8_lossy(&head[..error.valid_up_to()]).into_owned(),
    }
}

fn is_digest(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn blob_error(error: BlobError, field: &str) -> CoordinatorError {
    match error {
        BlobError::TooLarge { limit } => CoordinatorError::PayloadTooLarge {
            field: field.to_owned(),
            size: usize::try_from(limit)
                .unwrap_or(usize::MAX)
                .saturating_add(1),
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
        },
        BlobError::Upload(reason) => CoordinatorError::InvalidArgument(vec![FieldProblem {
            field: field.to_owned(),
            description: format!("the upload broke off: {reason}"),
        }]),
        other => CoordinatorError::BlobStore(other.to_string()),
    }
}

impl Coordinator {
    /// Keeps payloads over the threshold in `payloads` (none: values stay
    /// inline, and references are refused).
    pub fn with_payloads(mut self, payloads: Payloads) -> Self {
        self.payloads = Some(Arc::new(payloads));
        self
    }

    /// Whether large payloads go to a blob store here.
    pub fn keeps_blobs(&self) -> bool {
        self.payloads.is_some()
    }

    fn payloads(&self) -> Result<&Payloads, CoordinatorError> {
        self.payloads
            .as_deref()
            .ok_or(CoordinatorError::NoBlobStore)
    }

    /// Whether `value` goes to the blob store: counted only when offload
    /// is on, and only up to the threshold (a task's input on the hot path).
    pub(crate) fn offloads(&self, value: &Json) -> bool {
        let threshold = self.config.payload_offload_bytes;
        self.payloads.is_some() && threshold > 0 && json_text::longer_than(value, threshold)
    }

    /// Streams `chunks` into a blob of `namespace` (BlobService's upload):
    /// the JSON text of a value, read as JSON only when an expression looks
    /// inside.
    pub async fn upload_blob<S, E>(
        &self,
        namespace: &str,
        chunks: S,
    ) -> Result<StoredBlob, CoordinatorError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        let payloads = self.payloads()?;
        let limit = self.config.max_payload_bytes as u64;
        let staged = payloads
            .store
            .stage(namespace, chunks, limit)
            .await
            .map_err(|e| blob_error(e, "data"))?;
        self.record_and_publish(namespace, staged, "data").await
    }

    /// Makes a staged upload a blob of `namespace`: its row first (the
    /// collector cannot take a blob being published), then its bytes.
    async fn record_and_publish(
        &self,
        namespace: &str,
        staged: composer_blobs::Staged,
        field: &str,
    ) -> Result<StoredBlob, CoordinatorError> {
        let payloads = self.payloads()?;
        let row = BlobRow {
            sha256: staged.blob.digest.clone(),
            size: i64::try_from(staged.blob.size).unwrap_or(i64::MAX),
            head: head_text(&staged.head),
        };
        if let Err(error) = payloads
            .rows
            .touch(self.store.pool(), namespace, row.clone())
            .await
        {
            payloads.store.discard(staged).await;
            return Err(error.into());
        }
        let stored = payloads
            .store
            .publish(staged)
            .await
            .map_err(|e| blob_error(e, field))?;
        Ok(StoredBlob {
            sha256: stored.digest,
            size: stored.size,
            head: row.head,
        })
    }

    /// The bytes of a blob of `namespace` from `offset`, streamed, with its
    /// whole size (BlobService's download).
    pub async fn download_blob(
        &self,
        namespace: &str,
        sha256: &str,
        offset: u64,
    ) -> Result<
        (
            u64,
            futures::stream::BoxStream<'static, Result<Bytes, BlobError>>,
        ),
        CoordinatorError,
    > {
        let payloads = self.payloads()?;
        if !is_digest(sha256) {
            return Err(CoordinatorError::InvalidArgument(vec![FieldProblem {
                field: "sha256".to_owned(),
                description: "must be 64 lowercase hex digits".to_owned(),
            }]));
        }
        let key = composer_blobs::blob_key(namespace, sha256);
        match payloads.store.get_from(namespace, &key, offset).await {
            Ok(found) => Ok(found),
            Err(BlobError::NotFound(_) | BlobError::OtherNamespace { .. }) => {
                Err(CoordinatorError::NoSuchBlob(sha256.to_owned()))
            }
            Err(error) => Err(blob_error(error, "sha256")),
        }
    }

    /// A value a request brings, as the run will hold it: offloaded when
    /// over the threshold, its references checked, touched and canonical.
    pub(crate) async fn accept_payload(
        &self,
        namespace: &str,
        field: &str,
        value: Json,
    ) -> Result<Json, CoordinatorError> {
        if self.offloads(&value) {
            return self.offload(namespace, field, &value).await;
        }
        if !blob::holds_references(&value) {
            self.check_payload(field, &value)?;
            return Ok(value);
        }
        self.checked_references(namespace, field, value).await
    }

    /// Writes `value` to the blob store and returns its reference.
    pub(crate) async fn offload(
        &self,
        namespace: &str,
        field: &str,
        value: &Json,
    ) -> Result<Json, CoordinatorError> {
        let bytes = Bytes::from(json_text::to_vec(value));
        if bytes.len() > self.config.max_payload_bytes {
            return Err(CoordinatorError::PayloadTooLarge {
                field: field.to_owned(),
                size: bytes.len(),
                limit: self.config.max_payload_bytes,
            });
        }
        let chunks = futures::stream::iter([Ok::<_, std::convert::Infallible>(bytes)]);
        let stored = self.upload_blob(namespace, chunks).await?;
        Ok(blob::reference(&stored.sha256, stored.size, &stored.head))
    }

    /// `value` with each reference checked against the namespace's blobs
    /// and rewritten as stored; a reference to no blob is refused naming
    /// `field`.
    async fn checked_references(
        &self,
        namespace: &str,
        field: &str,
        mut value: Json,
    ) -> Result<Json, CoordinatorError> {
        let payloads = self.payloads()?;
        let mut digests: Vec<String> = Vec::new();
        for reference in blob::references(&value) {
            let digest = blob::reference_digest(reference).filter(|d| is_digest(d));
            let Some(digest) = digest else {
                return Err(CoordinatorError::InvalidArgument(vec![FieldProblem {
                    field: field.to_owned(),
                    description: format!(
                        "holds a `{}` object that is not a reference: \
                         {{\"$blob\": {{\"sha256\": <64 lowercase hex digits>}}}}",
                        blob::BLOB_KEY
                    ),
                }]));
            };
            if !digests.iter().any(|d| d == digest) {
                digests.push(digest.to_owned());
            }
        }
        // most references come back just after their upload here: only
        // the others are looked up (and touched)
        let mut found = Vec::with_capacity(digests.len());
        let mut unknown = Vec::new();
        for digest in &digests {
            match payloads.rows.written_lately(namespace, digest) {
                Some(row) => found.push(row),
                None => unknown.push(digest.clone()),
            }
        }
        if !unknown.is_empty() {
            found.extend(blobs::touch_existing(self.store.pool(), namespace, &unknown).await?);
        }
        if let Some(missing) = digests
            .iter()
            .find(|d| !found.iter().any(|row| &row.sha256 == *d))
        {
            return Err(CoordinatorError::BlobNotFound {
                field: field.to_owned(),
                sha256: missing.clone(),
            });
        }
        canonical_references(&mut value, &found);
        self.check_payload(field, &value)?;
        Ok(value)
    }

    /// The value of a blob of `namespace`, for an expression: read whole
    /// (at most `max_expression_blob_bytes`) and cached. A blob that cannot
    /// be read is null to the expression, and the reason is logged.
    pub(crate) async fn blob_value(&self, namespace: &str, sha256: &str) -> Arc<Json> {
        match self.read_blob_value(namespace, sha256).await {
            Ok(value) => value,
            Err(reason) => {
                tracing::warn!(%namespace, %sha256, %reason, "an expression read a blob it cannot have");
                Arc::new(Json::Null)
            }
        }
    }

    /// [`blob_value`](Self::blob_value), or why the blob cannot be read.
    async fn read_blob_value(&self, namespace: &str, sha256: &str) -> Result<Arc<Json>, String> {
        let payloads = self.payloads().map_err(|e| e.to_string())?;
        if let Some(cached) = payloads.cache.get(namespace, sha256) {
            return Ok(cached);
        }
        let key = composer_blobs::blob_key(namespace, sha256);
        let limit = self.config.max_expression_blob_bytes;
        let bytes = payloads
            .store
            .read(namespace, &key, limit)
            .await
            .map_err(|e| e.to_string())?;
        let value: Json = serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))?;
        let value = Arc::new(value);
        payloads
            .cache
            .put(namespace, sha256, Arc::clone(&value), bytes.len());
        Ok(value)
    }

    /// `recorded` with the values of the blobs its input, outputs and
    /// history refer to, read as for an expression, in the order they
    /// appear, up to [`REPLAY_BLOB_BYTES`] in all: a replay looks inside
    /// them as the run did. One that cannot be read, or past the budget,
    /// is left out, and a replay that needs it says which.
    pub(crate) async fn with_blob_values(
        &self,
        namespace: &str,
        mut recorded: RecordedRun,
    ) -> RecordedRun {
        let mut wanted: Vec<(String, u64)> = Vec::new();
        let values = std::iter::once(&recorded.input)
            .chain(recorded.outputs.values())
            .chain(recorded.history.iter().map(|entry| &entry.details));
        for value in values {
            for reference in blob::references(value) {
                let Some(digest) = blob::reference_digest(reference) else {
                    continue;
                };
                if wanted.iter().all(|(known, _)| known != digest) {
                    let size = reference[blob::BLOB_KEY]["size"]
                        .as_u64()
                        .unwrap_or(u64::MAX);
                    wanted.push((digest.to_owned(), size));
                }
            }
        }
        let mut spent = 0u64;
        for (digest, size) in wanted {
            if spent.saturating_add(size) > REPLAY_BLOB_BYTES {
                continue;
            }
            spent += size;
            match self.read_blob_value(namespace, &digest).await {
                Ok(value) => {
                    recorded.blobs.insert(digest, value);
                }
                Err(reason) => {
                    tracing::warn!(%namespace, sha256 = %digest, %reason, "a replay left out a blob it cannot read");
                }
            }
        }
        recorded
    }
}

/// The blobs one replay reads at most, in all (as much as the server's
/// blob cache holds).
const REPLAY_BLOB_BYTES: u64 = 64 << 20;

impl Coordinator {
    /// `value` with its references replaced by the blobs' values (read as
    /// for an expression): what a schema checks.
    pub(crate) async fn resolved(&self, namespace: &str, value: &Json) -> Json {
        let mut values = blob::BlobValues::new();
        for digest in referenced_digests(value) {
            let found = self.blob_value(namespace, &digest).await;
            values.insert(digest, found);
        }
        blob::substitute(value, &values, &mut Vec::new())
    }

    /// Keeps the blobs an event stored for a correlation key refers to as
    /// long as the event is kept.
    pub(crate) async fn keep_blobs_of_stored_event(
        &self,
        conn: &mut sqlx::PgConnection,
        namespace: &str,
        payload: &Json,
    ) -> Result<(), CoordinatorError> {
        let digests = referenced_digests(payload);
        if digests.is_empty() {
            return Ok(());
        }
        let retention = chrono::Duration::milliseconds(
            (self.config.correlation_retention_secs * 1000.0) as i64,
        );
        let keep_until = chrono::Utc::now() + retention;
        let event = OwnedBlobs {
            owner: uuid::Uuid::now_v7(),
            namespace,
            digests: &digests,
        };
        let references: Vec<_> = event.references().collect();
        blobs::refer(conn, &references, Some(keep_until)).await?;
        Ok(())
    }

    /// Makes each run refer to the blobs its values brought, in one
    /// statement of the runs' transaction. A blob the collector took since
    /// the request was checked fails that run, named by its place in
    /// `runs` (the caller uploads again): a run never holds a dangling
    /// reference.
    pub(crate) async fn refer_runs_to_blobs(
        &self,
        conn: &mut sqlx::PgConnection,
        runs: &[OwnedBlobs<'_>],
    ) -> Result<(), ReferFailed> {
        let references: Vec<_> = runs.iter().flat_map(OwnedBlobs::references).collect();
        if references.is_empty() {
            return Ok(());
        }
        let found = blobs::refer(conn, &references, None)
            .await
            .map_err(|error| ReferFailed::Store(error.into()))?;
        let found: std::collections::HashSet<(uuid::Uuid, &str)> = found
            .iter()
            .map(|(owner, sha256)| (*owner, sha256.as_str()))
            .collect();
        for (place, run) in runs.iter().enumerate() {
            let missing = run
                .digests
                .iter()
                .find(|d| !found.contains(&(run.owner, d.as_str())));
            if let Some(missing) = missing {
                return Err(ReferFailed::Missing(
                    place,
                    CoordinatorError::BlobNotFound {
                        field: "payload".to_owned(),
                        sha256: missing.clone(),
                    },
                ));
            }
        }
        Ok(())
    }
}

/// Why runs could not refer to their blobs.
pub(crate) enum ReferFailed {
    /// The run at this place refers to a blob that is gone.
    Missing(usize, CoordinatorError),
    /// The statement failed.
    Store(CoordinatorError),
}

impl From<ReferFailed> for CoordinatorError {
    fn from(failed: ReferFailed) -> Self {
        match failed {
            ReferFailed::Missing(_, error) | ReferFailed::Store(error) => error,
        }
    }
}

/// The blobs an owner's new values refer to: a run's, or a stored event's.
pub(crate) struct OwnedBlobs<'a> {
    pub(crate) owner: uuid::Uuid,
    pub(crate) namespace: &'a str,
    pub(crate) digests: &'a [String],
}

impl OwnedBlobs<'_> {
    /// One reference per digest.
    fn references(&self) -> impl Iterator<Item = blobs::BlobReference<'_>> {
        self.digests.iter().map(|sha256| blobs::BlobReference {
            owner: self.owner,
            namespace: self.namespace,
            sha256,
        })
    }
}

/// Rewrites every reference in `value` with the size and head `found` has
/// for its digest.
fn canonical_references(value: &mut Json, found: &[BlobRow]) {
    if let Some(digest) = blob::reference_digest(value) {
        if let Some(row) = found.iter().find(|row| row.sha256 == digest) {
            *value = blob::reference(&row.sha256, row.size.max(0) as u64, &row.head);
        }
        return;
    }
    match value {
        Json::Object(map) => map
            .values_mut()
            .for_each(|v| canonical_references(v, found)),
        Json::Array(items) => items
            .iter_mut()
            .for_each(|v| canonical_references(v, found)),
        _ => {}
    }
}

/// The distinct digests of the references `value` holds.
pub(crate) fn referenced_digests(value: &Json) -> Vec<String> {
    let mut digests: Vec<String> = Vec::new();
    for reference in blob::references(value) {
        if let Some(digest) = blob::reference_digest(reference)
            && !digests.iter().any(|d| d == digest)
        {
            digests.push(digest.to_owned());
        }
    }
    digests
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_cut_at_a_character_boundary() {
        let text = "é".repeat(200);
        let head = head_text(&text.as_bytes()[..HEAD_BYTES]);
        assert_eq!(head.chars().count(), HEAD_BYTES / 2);
        let odd = &"aé".as_bytes()[..2];
        assert_eq!(head_text(odd), "a");
    }

    #[test]
    fn references_are_rewritten_as_stored() {
        let digest = "ab".repeat(32);
        let mut value =
            serde_json::json!({"x": {"$blob": {"sha256": digest, "size": 1, "head": "forged"}}});
        let found = vec![BlobRow {
            sha256: digest.clone(),
            size: 10,
            head: "{\"a\"".to_owned(),
        }];
        canonical_references(&mut value, &found);
        assert_eq!(value["x"], blob::reference(&digest, 10, "{\"a\""));
        assert_eq!(referenced_digests(&value), vec![digest]);
    }
}
