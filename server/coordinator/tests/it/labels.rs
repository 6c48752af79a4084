//! Searches by labels (decision 0050): runs_by_labels holds only the runs
//! that have labels, a search naming a label can read it, and a search
//! naming none lists every run.

use crate::common;

use composer_store::runs::{LABELLED, RunFilter};
use serde_json::{Value as Json, json};

fn by_labels(labels: Option<Json>) -> RunFilter {
    RunFilter {
        labels,
        ..RunFilter::default()
    }
}

#[tokio::test]
async fn a_label_search_finds_labelled_runs_and_no_label_lists_every_run() {
    let coordinator = common::coordinator_with(common::WAITS).await;
    let labels = [
        json!({"team": "a"}),
        json!({"team": "a", "tier": "gold"}),
        json!({"team": "b"}),
        json!({}),
        json!({}),
    ];
    for labels in labels {
        let request = composer_coordinator::StartRun {
            labels,
            ..common::start_request("waits", json!({}))
        };
        coordinator.start_run(request).await.expect("start");
    }
    let count = |filter: RunFilter| common::listed(&coordinator, filter);
    assert_eq!(count(by_labels(Some(json!({"team": "a"})))).await, 2);
    assert_eq!(count(by_labels(Some(json!({"tier": "gold"})))).await, 1);
    assert_eq!(count(by_labels(Some(json!({"team": "c"})))).await, 0);
    assert_eq!(
        count(by_labels(Some(json!({})))).await,
        5,
        "no label: every run"
    );
    assert_eq!(count(by_labels(None)).await, 5);
    let counted = coordinator
        .count_runs("default", &by_labels(Some(json!({"team": "b"}))))
        .await
        .expect("count");
    assert_eq!(counted.by_status, vec![("RUNNING".to_owned(), 1)]);
    assert!(!counted.more);

    // the index's predicate is the one the search states, so the planner
    // can read it (here made to: five rows would be read whole otherwise)
    let pool = coordinator.store().pool();
    let definition: String =
        sqlx::query_scalar("SELECT pg_get_indexdef('runs_by_labels'::regclass)")
            .fetch_one(pool)
            .await
            .expect("index");
    assert!(
        definition.ends_with(&format!("WHERE ({LABELLED})")),
        "{definition}"
    );
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SET LOCAL enable_seqscan = off")
        .execute(&mut *tx)
        .await
        .expect("set");
    let plan: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN SELECT id FROM runs WHERE labels @> $1::jsonb AND {LABELLED}"
    ))
    .bind(json!({"team": "a"}))
    .fetch_all(&mut *tx)
    .await
    .expect("explain");
    assert!(
        plan.iter().any(|line| line.contains("runs_by_labels")),
        "{plan:#?}"
    );
}
