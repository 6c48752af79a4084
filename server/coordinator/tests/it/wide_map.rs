//! A wide MAP arms its elements a slice per transaction (decision 0045):
//! no one commit writes more than `MAP_ARM_SLICE` of its tasks, the slices
//! follow one another without the timer loop, and they stop at the MAP's
//! concurrency. Each task row's `xmin` is the transaction that wrote it.

use crate::common;

use std::time::Duration;

use composer_coordinator::{Coordinator, CoordinatorConfig};
use composer_engine::MAP_ARM_SLICE;
use serde_json::json;
use uuid::Uuid;

const WIDE: &str = "name: wide\nnodes:\n  - { id: m, type: MAP, items: input.xs, concurrency: 900, queue: wide, task: t, input: { x: \"${item}\" } }\n";

/// How many of the run's tasks each transaction wrote, most first.
async fn tasks_per_transaction(pool: &sqlx::PgPool, run_id: Uuid) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM tasks WHERE run_id = $1 GROUP BY xmin::text ORDER BY 1 DESC",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await
    .expect("tasks")
}

/// A coordinator with `source` registered, and a run of it over 1,000 items.
async fn start_wide(source: &str) -> (Coordinator, Uuid) {
    let coordinator = Coordinator::new(common::fresh_store(8).await, CoordinatorConfig::default());
    coordinator
        .workflows()
        .register(coordinator.store(), "default", source)
        .await
        .expect("register");
    let xs: Vec<u32> = (0..1_000).collect();
    let (run, _) = coordinator
        .start_run(common::start_request("wide", json!({ "xs": xs })))
        .await
        .expect("start");
    (coordinator, run.id)
}

#[tokio::test]
async fn a_wide_map_arms_a_slice_per_transaction_up_to_its_concurrency() {
    // no timer loop runs here: the committing server continues on its own
    let (coordinator, run_id) = start_wide(WIDE).await;
    let pool = coordinator.store().pool();

    let mut counts = Vec::new();
    for _ in 0..300 {
        counts = tasks_per_transaction(pool, run_id).await;
        if counts.iter().sum::<i64>() >= 900 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let slice = i64::from(MAP_ARM_SLICE);
    assert_eq!(
        counts,
        vec![slice, slice, slice, 900 - 3 * slice],
        "{counts:?}"
    );

    // the window is full: nothing more is armed, and no continuation waits
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        tasks_per_transaction(pool, run_id)
            .await
            .iter()
            .sum::<i64>(),
        900
    );
    let continuations: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM timers WHERE run_id = $1 AND timer->>'kind' = 'MAP_ARM'",
    )
    .bind(run_id)
    .fetch_one(pool)
    .await
    .expect("timers");
    assert_eq!(continuations, 0);
    let inputs: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT input FROM tasks WHERE run_id = $1 ORDER BY (substring(node_key from '\\[(\\d+)\\]'))::int",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await
    .expect("inputs");
    let expected: Vec<serde_json::Value> = (0..900).map(|x| json!({ "x": x })).collect();
    assert_eq!(inputs, expected, "the first 900 elements, each once");
}

#[tokio::test]
async fn a_map_keeps_the_inputs_of_elements_not_started_in_rows_of_a_slice_that_get_run_hides() {
    let (coordinator, run_id) =
        start_wide(&WIDE.replace("concurrency: 900", "concurrency: 10")).await;
    let pool = coordinator.store().pool();

    // the start wrote the MAP's row, the 10 elements it started and four
    // rows of inputs: not a row per element
    let keys: Vec<String> =
        sqlx::query_scalar("SELECT node_key FROM run_nodes WHERE run_id = $1 ORDER BY node_key")
            .bind(run_id)
            .fetch_all(pool)
            .await
            .expect("node rows");
    let inputs_rows: Vec<&String> = keys.iter().filter(|k| k.contains("#inputs")).collect();
    assert_eq!(
        inputs_rows,
        ["m#inputs[0]", "m#inputs[1]", "m#inputs[2]", "m#inputs[3]"],
        "{keys:?}"
    );
    assert_eq!(keys.len(), 1 + 10 + 4, "{keys:?}");

    let view = coordinator
        .get_run(Some("default"), &run_id.to_string(), true)
        .await
        .expect("get run");
    let shown: Vec<&str> = view.nodes.iter().map(|n| n.key.as_str()).collect();
    assert_eq!(
        shown.len(),
        11,
        "the MAP and its started elements: {shown:?}"
    );
    assert!(shown.iter().all(|k| !k.contains('#')), "{shown:?}");
}
