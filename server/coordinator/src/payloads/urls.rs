//! Presigned URLs (decision 0056): where the blob store signs them, a
//! caller moves a blob's bytes straight to and from the store, and the
//! server only checks the namespace, signs, and reads an upload once to
//! learn its digest.

use composer_blobs::{BlobError, SignedUrl};

use super::{StoredBlob, blob_error, is_digest};
use crate::{
    Coordinator,
    error::{CoordinatorError, FieldProblem},
};

/// A presigned URL for an upload, and the upload's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobUpload {
    pub upload_id: String,
    pub url: SignedUrl,
}

impl Coordinator {
    /// Whether BlobService gives presigned URLs here.
    pub fn gives_blob_urls(&self) -> bool {
        self.payloads
            .as_deref()
            .is_some_and(|p| p.store.signs_urls() && !p.url_ttl.is_zero())
    }

    /// A URL from which a GET reads the blob `sha256` of `namespace`, and
    /// the blob's size.
    pub async fn blob_url(
        &self,
        namespace: &str,
        sha256: &str,
    ) -> Result<(SignedUrl, u64), CoordinatorError> {
        let payloads = self.url_payloads()?;
        if !is_digest(sha256) {
            return Err(CoordinatorError::InvalidArgument(vec![FieldProblem {
                field: "sha256".to_owned(),
                description: "must be 64 lowercase hex digits".to_owned(),
            }]));
        }
        let key = composer_blobs::blob_key(namespace, sha256);
        match payloads
            .store
            .read_url(namespace, &key, payloads.url_ttl)
            .await
        {
            Ok(found) => Ok(found),
            Err(BlobError::NotFound(_) | BlobError::OtherNamespace { .. }) => {
                Err(CoordinatorError::NoSuchBlob(sha256.to_owned()))
            }
            Err(error) => Err(blob_error(error, "sha256")),
        }
    }

    /// A new upload of `namespace` and the URL its bytes are PUT to.
    pub async fn start_blob_upload(&self, namespace: &str) -> Result<BlobUpload, CoordinatorError> {
        let payloads = self.url_payloads()?;
        let (upload_id, url) = payloads
            .store
            .upload_url(namespace, payloads.url_ttl)
            .await
            .map_err(|e| blob_error(e, "upload_id"))?;
        Ok(BlobUpload { upload_id, url })
    }

    /// Makes the bytes PUT to upload `upload_id` of `namespace` a blob: read
    /// once for their digest, recorded, then moved to their key.
    pub async fn finish_blob_upload(
        &self,
        namespace: &str,
        upload_id: &str,
    ) -> Result<StoredBlob, CoordinatorError> {
        let payloads = self.url_payloads()?;
        let limit = self.config.max_payload_bytes as u64;
        let staged = match payloads
            .store
            .stage_upload(namespace, upload_id, limit)
            .await
        {
            Ok(staged) => staged,
            Err(BlobError::NotFound(_)) => {
                return Err(CoordinatorError::NoSuchUpload(upload_id.to_owned()));
            }
            Err(error) => return Err(blob_error(error, "upload_id")),
        };
        self.record_and_publish(namespace, staged, "upload_id")
            .await
    }

    fn url_payloads(&self) -> Result<&super::Payloads, CoordinatorError> {
        let payloads = self.payloads()?;
        if !self.gives_blob_urls() {
            return Err(CoordinatorError::NoBlobUrls);
        }
        Ok(payloads)
    }
}
