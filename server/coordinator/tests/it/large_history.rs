//! Reads of a large history (decision 0052): ListRuns' search by run id
//! is a primary-key probe and by key prefix a range of
//! runs_idempotency_key, whatever it matches, never a walk of the
//! namespace's runs; CountRuns stops counting at its limit and says so.

use crate::common;

use composer_store::runs::{self, RunFilter};
use serde_json::json;

/// Enough runs that reading them all costs more than any index probe.
const RUNS: i64 = 20_000;

fn search(text: &str) -> RunFilter {
    RunFilter {
        search: Some(text.to_owned()),
        ..RunFilter::default()
    }
}

#[tokio::test]
async fn a_search_reads_the_key_index_or_the_primary_key_never_every_run() {
    let coordinator = common::coordinator_with(common::WAITS).await;
    let template = coordinator
        .start_run(composer_coordinator::StartRun {
            idempotency_key: Some("template".to_owned()),
            ..common::start_request("waits", json!({}))
        })
        .await
        .expect("start")
        .0
        .id;
    let pool = coordinator.store().pool();
    // a large history written at once, keys order-1 .. order-20000
    sqlx::query(
        "INSERT INTO runs (id, namespace, workflow_name, workflow_version, status, input, \
                           idempotency_key, record, created_at) \
         SELECT gen_random_uuid(), t.namespace, t.workflow_name, 1, 'COMPLETED', t.input, \
                'order-' || n, t.record, now() - make_interval(secs => n) \
         FROM generate_series(1, $2) AS n, runs t WHERE t.id = $1",
    )
    .bind(template)
    .bind(RUNS)
    .execute(pool)
    .await
    .expect("fill");
    sqlx::query("ANALYZE runs")
        .execute(pool)
        .await
        .expect("analyze");

    let found = |filter: RunFilter| common::listed(&coordinator, filter);
    assert_eq!(found(search("order-4242")).await, 1);
    assert_eq!(
        found(search("order-1999")).await,
        11,
        "1999 and 19990..19999"
    );
    assert_eq!(found(search(&template.to_string())).await, 1);
    assert_eq!(found(search("no-such-key")).await, 0);

    // counted to a limit: past it the counts are floors and say so; at
    // exactly the limit they are whole
    let count = |filter: RunFilter, limit: i64| async move {
        runs::count_runs(pool, "default", &filter, limit)
            .await
            .expect("count")
    };
    let floors = count(RunFilter::default(), 3).await;
    assert!(floors.more);
    assert_eq!(floors.by_status.iter().map(|(_, n)| n).sum::<i64>(), 3);
    let whole = count(RunFilter::default(), RUNS + 1).await;
    assert!(!whole.more);
    assert_eq!(
        whole.by_status,
        [("COMPLETED".to_owned(), RUNS), ("RUNNING".to_owned(), 1)]
    );
    let exactly = count(search("order-1999"), 11).await;
    assert_eq!(exactly.by_status, [("COMPLETED".to_owned(), 11)]);
    assert!(!exactly.more, "11 of 11 is all of them");

    for (text, index) in [
        ("order-4242", "runs_idempotency_key"),
        ("no-such-key", "runs_idempotency_key"),
        (&template.to_string(), "runs_pkey"),
    ] {
        let plan = runs::list_runs_plan(pool, "default", &search(text), 100)
            .await
            .expect("plan");
        assert!(
            plan.iter().any(|line| line.contains(index)),
            "{text}: {plan:#?}"
        );
        assert!(
            !plan.iter().any(|line| line.contains("runs_by_created")),
            "{text} walked the runs newest first: {plan:#?}"
        );
    }
}
