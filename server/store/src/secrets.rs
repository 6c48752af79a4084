//! Secrets (decision 0044): each namespace's wrapped data key and its
//! secrets' sealed versions. Nothing here sees a key or a value in clear:
//! the coordinator seals and opens them.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Row};

use crate::StoreError;

/// Versions kept of one secret; SetSecret deletes older ones.
pub const KEPT_VERSIONS: i32 = 10;

/// A namespace's data key, as stored: wrapped by the key-encryption key
/// `kek_id` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrappedKey {
    /// The namespace.
    pub namespace: String,
    /// Which key-encryption key wraps it (a fingerprint).
    pub kek_id: String,
    /// Nonce, sealed key and tag.
    pub wrapped: Vec<u8>,
}

/// A secret as listed: never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRow {
    /// The name.
    pub name: String,
    /// The newest version.
    pub version: i32,
    /// When the oldest kept version was set.
    pub created_at: DateTime<Utc>,
    /// When the newest was.
    pub updated_at: DateTime<Utc>,
    /// Who set the newest.
    pub updated_by: String,
}

/// The namespace's wrapped data key, if it has one.
pub async fn data_key(pool: &PgPool, namespace: &str) -> Result<Option<WrappedKey>, StoreError> {
    // data_key: primary key
    let row = sqlx::query("SELECT kek_id, wrapped_key FROM secret_keys WHERE namespace = $1")
        .bind(namespace)
        .fetch_optional(pool)
        .await?;
    Ok(row
        .map(|row| -> Result<WrappedKey, sqlx::Error> {
            Ok(WrappedKey {
                namespace: namespace.to_owned(),
                kek_id: row.try_get("kek_id")?,
                wrapped: row.try_get("wrapped_key")?,
            })
        })
        .transpose()?)
}

/// Stores `key` as the namespace's data key unless it has one already (two
/// servers making the first secret of a namespace at once): returns the
/// one stored.
pub async fn insert_data_key(pool: &PgPool, key: &WrappedKey) -> Result<WrappedKey, StoreError> {
    // insert_data_key: primary key; the first writer wins
    sqlx::query(
        "INSERT INTO secret_keys (namespace, kek_id, wrapped_key) VALUES ($1, $2, $3) \
         ON CONFLICT (namespace) DO NOTHING",
    )
    .bind(&key.namespace)
    .bind(&key.kek_id)
    .bind(&key.wrapped)
    .execute(pool)
    .await?;
    data_key(pool, &key.namespace)
        .await?
        .ok_or(StoreError::Database(sqlx::Error::RowNotFound))
}

/// Replaces a data key's wrapping; false when it changed meanwhile.
pub async fn rewrap(
    pool: &PgPool,
    old: &WrappedKey,
    kek_id: &str,
    wrapped: &[u8],
) -> Result<bool, StoreError> {
    // rewrap_data_key: primary key, only if still wrapped as read
    let done = sqlx::query(
        "UPDATE secret_keys SET kek_id = $2, wrapped_key = $3, updated_at = now() \
         WHERE namespace = $1 AND kek_id = $4 AND wrapped_key = $5",
    )
    .bind(&old.namespace)
    .bind(kek_id)
    .bind(wrapped)
    .bind(&old.kek_id)
    .bind(&old.wrapped)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Starts a SetSecret: locks the name (two sets of one name take versions
/// in turn) and answers the version to write and whether the name is new.
pub async fn next_version(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
) -> Result<(i32, bool), StoreError> {
    // lock_secret_name: a transaction-scoped advisory lock on the name
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 38))")
        .bind(namespace)
        .bind(name)
        .execute(&mut *conn)
        .await?;
    // next_secret_version: primary key prefix
    let newest: Option<i32> =
        sqlx::query_scalar("SELECT max(version) FROM secrets WHERE namespace = $1 AND name = $2")
            .bind(namespace)
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
    Ok((newest.unwrap_or(0) + 1, newest.is_none()))
}

/// How many secrets (names) the namespace holds.
pub async fn count(conn: &mut PgConnection, namespace: &str) -> Result<i64, StoreError> {
    // count_secrets: primary key prefix
    Ok(
        sqlx::query_scalar("SELECT count(DISTINCT name) FROM secrets WHERE namespace = $1")
            .bind(namespace)
            .fetch_one(conn)
            .await?,
    )
}

/// Writes a version (after [`next_version`], in its transaction) and
/// deletes the versions past [`KEPT_VERSIONS`].
pub async fn insert_version(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
    version: i32,
    sealed: &[u8],
    created_by: &str,
) -> Result<(), StoreError> {
    // insert_secret_version: primary key
    sqlx::query(
        "INSERT INTO secrets (namespace, name, version, sealed, created_by) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(namespace)
    .bind(name)
    .bind(version)
    .bind(sealed)
    .bind(created_by)
    .execute(&mut *conn)
    .await?;
    // prune_secret_versions: primary key prefix
    sqlx::query("DELETE FROM secrets WHERE namespace = $1 AND name = $2 AND version <= $3")
        .bind(namespace)
        .bind(name)
        .bind(version - KEPT_VERSIONS)
        .execute(conn)
        .await?;
    Ok(())
}

/// The newest version of a secret: its number and sealed value.
pub async fn newest(
    pool: &PgPool,
    namespace: &str,
    name: &str,
) -> Result<Option<(i32, Vec<u8>)>, StoreError> {
    // newest_secret: primary key, newest first
    let row = sqlx::query(
        "SELECT version, sealed FROM secrets WHERE namespace = $1 AND name = $2 \
         ORDER BY version DESC LIMIT 1",
    )
    .bind(namespace)
    .bind(name)
    .fetch_optional(pool)
    .await?;
    Ok(row
        .map(|row| -> Result<(i32, Vec<u8>), sqlx::Error> {
            Ok((row.try_get("version")?, row.try_get("sealed")?))
        })
        .transpose()?)
}

/// A listed secret: one row per name, its newest version and times.
const LISTED: &str = "SELECT name, max(version) AS version, min(created_at) AS created_at, \
       max(created_at) AS updated_at, \
       (array_agg(created_by ORDER BY version DESC))[1] AS updated_by \
     FROM secrets";

fn listed(row: &sqlx::postgres::PgRow) -> Result<SecretRow, sqlx::Error> {
    Ok(SecretRow {
        name: row.try_get("name")?,
        version: row.try_get("version")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        updated_by: row.try_get("updated_by")?,
    })
}

/// One page of the namespace's secrets by name, after `after`.
pub async fn list(
    pool: &PgPool,
    namespace: &str,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<SecretRow>, StoreError> {
    // list_secrets: primary key order; one row per name
    let rows = sqlx::query(&format!(
        "{LISTED} WHERE namespace = $1 AND ($2::text IS NULL OR name > $2) \
         GROUP BY name ORDER BY name LIMIT $3"
    ))
    .bind(namespace)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(listed)
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// One secret as [`list`] shows it, if it exists.
pub async fn listed_one(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
) -> Result<Option<SecretRow>, StoreError> {
    // listed_secret: primary key prefix
    let row = sqlx::query(&format!(
        "{LISTED} WHERE namespace = $1 AND name = $2 GROUP BY name"
    ))
    .bind(namespace)
    .bind(name)
    .fetch_optional(conn)
    .await?;
    Ok(row.as_ref().map(listed).transpose()?)
}

/// Deletes every version of a secret; false when it had none.
pub async fn delete(pool: &PgPool, namespace: &str, name: &str) -> Result<bool, StoreError> {
    // delete_secret: primary key prefix
    let done = sqlx::query("DELETE FROM secrets WHERE namespace = $1 AND name = $2")
        .bind(namespace)
        .bind(name)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() > 0)
}
