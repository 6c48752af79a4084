//! Migrations against the real Postgres.

use std::time::Duration;

use composer_store::{MIGRATOR, Store, StoreConfig};

#[tokio::test]
async fn migrations_run_twice_are_a_no_op() {
    let store = Store::connect(&StoreConfig {
        database_url: composer_testkit::fresh_database().await,
        max_connections: 2,
        connect_timeout: Duration::from_secs(10),
        query_timeout: std::time::Duration::from_secs(30),
    })
    .await
    .expect("connect");
    store.migrate().await.expect("first run applies");
    let schema = schema_fingerprint(&store).await;
    let applied = applied_versions(&store).await;
    assert_eq!(applied.len(), MIGRATOR.iter().count());

    store.migrate().await.expect("second run is fine");
    assert_eq!(applied_versions(&store).await, applied);
    assert_eq!(schema_fingerprint(&store).await, schema);
}

async fn applied_versions(store: &Store) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
        .fetch_all(store.pool())
        .await
        .expect("migrations table")
}

async fn schema_fingerprint(store: &Store) -> Vec<(String, String, String)> {
    sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text \
         FROM information_schema.columns WHERE table_schema = 'public' \
         ORDER BY table_name, ordinal_position",
    )
    .fetch_all(store.pool())
    .await
    .expect("schema")
}
