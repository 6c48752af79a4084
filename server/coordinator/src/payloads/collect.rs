//! The blob collector: a blob lives while something refers to it
//! (`blob_refs`, written in the transactions of the runs that hold its
//! reference). A pass drops references whose owner is gone, then deletes
//! blobs untouched for the grace period that nothing refers to: each
//! batch's rows and bytes in one transaction, so a request that touches or
//! refers to one of them meanwhile waits for the rows and finds them gone
//! (and uploads again) or keeps them. Uploads cut short go after the same
//! grace.

use chrono::{DateTime, Utc};
use composer_store::blobs;

use crate::{Coordinator, error::CoordinatorError};

/// Blobs one transaction of the collector deletes.
const COLLECT_BATCH: i64 = 500;

/// References dropped per pass.
const ORPHAN_REFS_PER_PASS: i64 = 10_000;

/// What one pass of the collector removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollectorPass {
    /// References whose run or stored event is gone.
    pub refs_dropped: u64,
    /// Blobs nothing referred to.
    pub blobs_deleted: usize,
    /// Uploads (and staging files) cut short.
    pub uploads_deleted: usize,
}

impl Coordinator {
    /// One pass of the collector, as of `now`, sparing blobs touched within
    /// `grace` of it (and uploads written within `grace` of the wall
    /// clock). Nothing to do without a blob store.
    pub async fn collect_blobs(
        &self,
        now: DateTime<Utc>,
        grace: std::time::Duration,
    ) -> Result<CollectorPass, CoordinatorError> {
        let Some(payloads) = self.payloads.as_deref() else {
            return Ok(CollectorPass::default());
        };
        let cutoff = now - chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::zero());
        let pool = self.store.pool();
        let mut pass = CollectorPass {
            refs_dropped: blobs::drop_orphan_refs(pool, now, cutoff, ORPHAN_REFS_PER_PASS).await?,
            ..CollectorPass::default()
        };
        loop {
            let mut tx = pool.begin().await?;
            let taken = match blobs::take_unreferenced(&mut tx, cutoff, COLLECT_BATCH).await {
                Ok(taken) => taken,
                // a reference committed between the pick and the delete
                Err(error) if error.is_foreign_key_violation() => break,
                Err(error) => return Err(error.into()),
            };
            for blob in &taken {
                let key = composer_blobs::blob_key(&blob.namespace, &blob.sha256);
                // a failure rolls the rows back: the next pass tries again
                payloads
                    .store
                    .delete(&blob.namespace, &key)
                    .await
                    .map_err(|e| CoordinatorError::BlobStore(e.to_string()))?;
            }
            tx.commit().await?;
            for blob in &taken {
                payloads.rows.forget(&blob.namespace, &blob.sha256);
            }
            pass.blobs_deleted += taken.len();
            if taken.len() < COLLECT_BATCH as usize {
                break;
            }
        }
        // uploads by the wall clock: their age is the store's file time
        let abandoned =
            Utc::now() - chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::zero());
        pass.uploads_deleted = payloads
            .store
            .sweep_stale_uploads(abandoned)
            .await
            .map_err(|e| CoordinatorError::BlobStore(e.to_string()))?;
        Ok(pass)
    }
}
