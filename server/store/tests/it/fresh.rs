//! A fresh database with the store's migrations applied, for the tests
//! that read the plans Postgres makes.

use sqlx::PgPool;

/// The pool of a new, migrated database (two connections).
pub async fn migrated_database() -> PgPool {
    let url = composer_testkit::fresh_database().await;
    let store = composer_store::Store::connect(&composer_store::StoreConfig {
        database_url: url,
        max_connections: 2,
        connect_timeout: std::time::Duration::from_secs(10),
        query_timeout: std::time::Duration::from_secs(60),
    })
    .await
    .expect("connect");
    store.migrate().await.expect("migrate");
    store.pool().clone()
}
