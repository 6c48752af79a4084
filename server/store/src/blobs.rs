//! Which payload blobs exist and who refers to them (decision 0047). The
//! bytes are in the blob store; these rows let the collector delete a blob
//! only when nothing refers to it and no request is about to.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::StoreError;

/// A blob touched this recently is not touched again: the collector spares
/// a blob for an hour after its last touch, and most blobs are referred to
/// within seconds of their upload, so their rows are written once.
const FRESH_SECS: f64 = 300.0;

/// A stored blob, as a reference describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobRow {
    /// SHA-256 of its bytes, hex.
    pub sha256: String,
    /// Its length in bytes.
    pub size: i64,
    /// Its first bytes, as text.
    pub head: String,
}

/// A blob the collector took: its namespace and digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectedBlob {
    /// The namespace.
    pub namespace: String,
    /// SHA-256, hex.
    pub sha256: String,
}

/// Records blobs about to become visible, or touches the rows of those
/// already stored, in one statement: committed before the blobs are
/// published, so the collector cannot take one while it is being written.
/// `blobs` are `(namespace, row)`, in any order, the same blob any number
/// of times.
pub async fn touch(pool: &PgPool, blobs: &[(String, BlobRow)]) -> Result<(), StoreError> {
    // rows in key order: two servers' statements lock them in one order;
    // each once: a statement may not update a row twice
    let mut ordered: Vec<&(String, BlobRow)> = blobs.iter().collect();
    ordered.sort_by(|a, b| (&a.0, &a.1.sha256).cmp(&(&b.0, &b.1.sha256)));
    ordered.dedup_by(|a, b| a.0 == b.0 && a.1.sha256 == b.1.sha256);
    let namespaces: Vec<&str> = ordered.iter().map(|(n, _)| n.as_str()).collect();
    let digests: Vec<&str> = ordered.iter().map(|(_, r)| r.sha256.as_str()).collect();
    let sizes: Vec<i64> = ordered.iter().map(|(_, r)| r.size).collect();
    let heads: Vec<&str> = ordered.iter().map(|(_, r)| r.head.as_str()).collect();
    // touch: blobs' primary key
    sqlx::query(
        "INSERT INTO blobs (namespace, sha256, size, head) \
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::text[]) \
         ON CONFLICT (namespace, sha256) DO UPDATE SET touched_at = now() \
         WHERE blobs.touched_at < now() - make_interval(secs => $5)",
    )
    .bind(&namespaces)
    .bind(&digests)
    .bind(&sizes)
    .bind(&heads)
    .bind(FRESH_SECS)
    .execute(pool)
    .await?;
    Ok(())
}

/// Touches the namespace's blobs among `digests` (unless touched within
/// five minutes) and returns those that exist: a reference a request
/// carries is good for the collector's grace, less five minutes, after this.
pub async fn touch_existing(
    pool: &PgPool,
    namespace: &str,
    digests: &[String],
) -> Result<Vec<BlobRow>, StoreError> {
    // touch_existing: one primary-key probe per digest, whatever the plan
    // cached when the table was small (decision 0032); the touch by ctid
    let rows = sqlx::query(
        "WITH found AS ( \
           SELECT b.ctid AS at, b.sha256, b.size, b.head, b.touched_at \
           FROM UNNEST($2::text[]) AS d(sha256) \
           CROSS JOIN LATERAL ( \
             SELECT ctid, sha256, size, head, touched_at FROM blobs \
             WHERE namespace = $1 AND sha256 = d.sha256 LIMIT 1) b), \
         touched AS ( \
           UPDATE blobs SET touched_at = now() WHERE ctid = ANY(ARRAY( \
             SELECT at FROM found WHERE touched_at < now() - make_interval(secs => $3)))) \
         SELECT sha256, size, head FROM found",
    )
    .bind(namespace)
    .bind(digests)
    .bind(FRESH_SECS)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(|row| BlobRow {
            sha256: row.get(0),
            size: row.get(1),
            head: row.get(2),
        })
        .collect())
}

/// One blob an owner (a run, or a stored event) is to refer to.
#[derive(Debug, Clone, Copy)]
pub struct BlobReference<'a> {
    /// The run, or the stored event.
    pub owner: Uuid,
    /// The namespace of both.
    pub namespace: &'a str,
    /// The blob's digest.
    pub sha256: &'a str,
}

/// Makes each owner refer to its blob (kept until `keep_until`, or for
/// good while the owner lives), in one statement, and returns the
/// references whose blob exists as (owner, digest). The blobs' rows are
/// locked (FOR KEY SHARE) until the caller commits: the collector skips
/// them meanwhile, and one it already took is not returned.
pub async fn refer(
    conn: &mut PgConnection,
    references: &[BlobReference<'_>],
    keep_until: Option<DateTime<Utc>>,
) -> Result<Vec<(Uuid, String)>, StoreError> {
    let owners: Vec<Uuid> = references.iter().map(|r| r.owner).collect();
    let namespaces: Vec<&str> = references.iter().map(|r| r.namespace).collect();
    let digests: Vec<&str> = references.iter().map(|r| r.sha256).collect();
    // refer: a primary-key probe of blobs per reference (decision 0032)
    let rows = sqlx::query(
        "WITH found AS ( \
           SELECT w.owner, w.namespace, w.sha256 \
           FROM UNNEST($1::uuid[], $2::text[], $3::text[]) AS w(owner, namespace, sha256) \
           CROSS JOIN LATERAL ( \
             SELECT 1 FROM blobs WHERE namespace = w.namespace AND sha256 = w.sha256 \
             FOR KEY SHARE) b), \
         added AS ( \
           INSERT INTO blob_refs (owner, namespace, sha256, keep_until) \
           SELECT owner, namespace, sha256, $4 FROM found ON CONFLICT DO NOTHING) \
         SELECT owner, sha256 FROM found",
    )
    .bind(owners)
    .bind(namespaces)
    .bind(digests)
    .bind(keep_until)
    .fetch_all(conn)
    .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// In the caller's transaction, deletes the rows of up to `limit` blobs
/// untouched since `cutoff` that nothing refers to, and returns them: the
/// caller deletes their bytes before it commits, so a request touching one
/// meanwhile waits for the row and then writes it anew.
pub async fn take_unreferenced(
    conn: &mut PgConnection,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<CollectedBlob>, StoreError> {
    // take_unreferenced: blobs_untouched, then blob_refs_by_blob per blob
    let rows = sqlx::query(
        "DELETE FROM blobs b USING ( \
           SELECT namespace, sha256 FROM blobs x WHERE touched_at < $1 \
             AND NOT EXISTS (SELECT 1 FROM blob_refs r \
                             WHERE r.namespace = x.namespace AND r.sha256 = x.sha256) \
           ORDER BY touched_at LIMIT $2 FOR UPDATE SKIP LOCKED) old \
         WHERE b.namespace = old.namespace AND b.sha256 = old.sha256 \
         RETURNING b.namespace, b.sha256",
    )
    .bind(cutoff)
    .bind(limit)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .iter()
        .map(|row| CollectedBlob {
            namespace: row.get(0),
            sha256: row.get(1),
        })
        .collect())
}

/// Drops up to `limit` references whose owner is gone: a stored event's
/// past its `keep_until`, and a run's whose run no longer exists (made
/// before `cutoff`: a run's references are written just before the run).
pub async fn drop_orphan_refs(
    pool: &PgPool,
    now: DateTime<Utc>,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<u64, StoreError> {
    // drop_orphan_refs: a scan of blob_refs, each run by its primary key
    let dropped = sqlx::query(
        "DELETE FROM blob_refs r USING ( \
           SELECT owner, namespace, sha256 FROM blob_refs x \
           WHERE (x.keep_until IS NOT NULL AND x.keep_until < $1) \
              OR (x.keep_until IS NULL AND x.created_at < $2 \
                  AND NOT EXISTS (SELECT 1 FROM runs WHERE id = x.owner)) \
           LIMIT $3) gone \
         WHERE r.owner = gone.owner AND r.namespace = gone.namespace AND r.sha256 = gone.sha256",
    )
    .bind(now)
    .bind(cutoff)
    .bind(limit)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(dropped)
}
