//! A pooled connection dropped while it sat idle is replaced before anyone
//! uses it: the pool pings a connection idle for a second or more before
//! handing it out (decision 0033). Real Postgres.

use std::time::Duration;

use composer_store::{Store, StoreConfig};

async fn store_of_one_connection() -> Store {
    Store::connect(&StoreConfig {
        database_url: composer_testkit::fresh_database().await,
        max_connections: 1,
        connect_timeout: Duration::from_secs(10),
        query_timeout: Duration::from_secs(30),
    })
    .await
    .expect("connect")
}

async fn backend_pid(store: &Store) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .expect("backend pid")
}

#[tokio::test]
async fn a_connection_dropped_while_idle_is_replaced_before_anyone_uses_it() {
    let store = store_of_one_connection().await;
    let first = backend_pid(&store).await;
    assert_eq!(
        backend_pid(&store).await,
        first,
        "the one connection is reused"
    );

    // idle past the pool's one second, the connection's backend ends, as
    // a restart, a failover or a proxy's idle timeout would end it
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let admin = store_of_one_connection().await;
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(admin.pool())
        .await
        .expect("terminate");
    assert!(ended);

    let second = backend_pid(&store).await;
    assert_ne!(
        second, first,
        "a new connection took the dropped one's place"
    );
}
