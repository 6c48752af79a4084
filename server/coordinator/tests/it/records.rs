//! The run record each event rewrites stays small whatever the input's size:
//! the input is stored once and put back when the record is loaded.

use std::time::Duration;

use composer_coordinator::{Coordinator, CoordinatorConfig, EventTarget, StartRun};
use composer_store::{Store, StoreConfig};
use serde_json::json;

#[tokio::test]
async fn a_large_input_is_stored_once_and_still_read_by_later_events() {
    let store = Store::connect(&StoreConfig {
        database_url: composer_testkit::fresh_database().await,
        max_connections: 4,
        connect_timeout: Duration::from_secs(10),
        query_timeout: std::time::Duration::from_secs(30),
    })
    .await
    .expect("connect");
    store.migrate().await.expect("migrate");
    let coordinator = Coordinator::new(store, CoordinatorConfig::default());
    coordinator
        .workflows()
        .register(
            coordinator.store(),
            "default",
            "name: big\nnodes:\n  - { id: go, type: WAIT_FOR_EVENT, event: go }\noutput: { size: \"${size(input.blob)}\" }\n",
        )
        .await
        .expect("register");
    let blob = "x".repeat(200_000);
    let (run, _) = coordinator
        .start_run(StartRun {
            namespace: "default".to_owned(),
            workflow_name: "big".to_owned(),
            version: None,
            input: json!({ "blob": blob }),
            idempotency_key: None,
            labels: json!({}),
            actor: "test".to_owned(),
            traceparent: None,
            priority: 3,
        })
        .await
        .expect("start");
    let record_size: i32 =
        sqlx::query_scalar("SELECT length(record::text) FROM runs WHERE id = $1")
            .bind(run.id)
            .fetch_one(coordinator.store().pool())
            .await
            .expect("record");
    assert!(
        record_size < 2_000,
        "the record carries no input: {record_size} bytes"
    );

    coordinator
        .send_event(
            "default",
            EventTarget::Run(run.id),
            "go",
            json!({}),
            None,
            "test",
        )
        .await
        .expect("send");
    let done = coordinator
        .get_run(None, &run.id.to_string(), false)
        .await
        .expect("get");
    assert_eq!(done.run.status, "COMPLETED");
    assert_eq!(done.run.output, Some(json!({ "size": 200_000 })));
}
