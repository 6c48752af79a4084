//! History written several events to a row (migration 0029) reads back
//! one event at a time, from any place, in pages of any size, and through
//! the `run_events_each` view. Real Postgres.

use composer_store::runs::{HistoryWrite, append_history, history_page};
use serde_json::json;
use uuid::Uuid;

/// An event as `run_events_each` shows it: seq, type, node, attempt, details.
type EventColumns = (i64, String, Option<String>, Option<i32>, serde_json::Value);

fn event(n: usize) -> HistoryWrite {
    HistoryWrite {
        event_type: format!("kind_{}", n % 3),
        node_key: (!n.is_multiple_of(4)).then(|| format!("node[{n}]")),
        attempt: (!n.is_multiple_of(5)).then(|| i32::try_from(n).unwrap()),
        actor: "worker-1".to_owned(),
        // every seventh event too large to share its row
        details: if n.is_multiple_of(7) {
            json!({"output": "x".repeat(3_000), "n": n})
        } else {
            json!({"n": n})
        },
    }
}

#[tokio::test]
async fn history_reads_back_event_by_event_from_any_place() {
    let pool = crate::fresh::migrated_database().await;
    let run_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO runs (id, namespace, workflow_name, workflow_version, status, input, record) \
         VALUES ($1, 'default', 'w', 1, 'RUNNING', '{}', '{}')",
    )
    .bind(run_id)
    .execute(&pool)
    .await
    .expect("run");
    // writes of 1, 40 and 3 events
    let written: Vec<HistoryWrite> = (1..=44).map(event).collect();
    let mut conn = pool.acquire().await.expect("conn");
    for part in [&written[..1], &written[1..41], &written[41..]] {
        append_history(&mut conn, run_id, "default", part)
            .await
            .expect("append");
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM run_events WHERE run_id = $1")
        .bind(run_id)
        .fetch_one(&pool)
        .await
        .expect("rows");
    assert!(rows < 20, "44 events in {rows} rows");

    for after in 0..=45_i64 {
        for limit in [1_i64, 2, 5, 16, 17, 100] {
            let page = history_page(&pool, run_id, after, limit)
                .await
                .expect("page");
            let expected: Vec<i64> = (after + 1..=44).take(limit as usize).collect();
            let seqs: Vec<i64> = page.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, expected, "after {after}, limit {limit}");
            for e in &page {
                let w = &written[(e.seq - 1) as usize];
                assert_eq!(
                    (&e.event_type, &e.node_key, e.attempt, &e.actor, &e.details),
                    (&w.event_type, &w.node_key, w.attempt, &w.actor, &w.details),
                    "seq {}",
                    e.seq
                );
            }
        }
    }

    let each: Vec<EventColumns> = sqlx::query_as(
        "SELECT seq, event_type, node_key, attempt, details FROM run_events_each \
             WHERE run_id = $1 ORDER BY seq",
    )
    .bind(run_id)
    .fetch_all(&pool)
    .await
    .expect("view");
    let expected: Vec<_> = (1_i64..)
        .zip(&written)
        .map(|(seq, w)| {
            (
                seq,
                w.event_type.clone(),
                w.node_key.clone(),
                w.attempt,
                w.details.clone(),
            )
        })
        .collect();
    assert_eq!(each, expected);
}
