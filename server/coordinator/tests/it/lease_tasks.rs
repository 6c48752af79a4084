//! A lease takes exactly the candidates still DISPATCHED at the attempt
//! their message names, in the namespace and queue of the poll, whether a
//! poll brings a few candidates (joined by the cached statement) or many
//! (one probe each, planned per list: decision 0029). A rate-limited
//! queue's hand-out reads the same candidates by the same two forms before
//! it takes tokens. Real Postgres.

use crate::common;

use std::collections::HashSet;

use composer_store::tasks;
use sqlx::PgPool;
use uuid::Uuid;

/// Inserts `count` tasks of one run in `queue`, each at attempt 2, the
/// first `leased` of them already LEASED; returns their ids in order.
async fn tasks_in(pool: &PgPool, queue: &str, count: i64, leased: i64) -> Vec<Uuid> {
    let run_id = common::insert_run(pool).await;
    sqlx::query_scalar(
        "INSERT INTO tasks (id, namespace, run_id, node_key, workflow_name, workflow_version, \
           queue, task_name, status, attempt, input, heartbeat_timeout_ms) \
         SELECT gen_random_uuid(), 'default', $1, 'n' || i, 'wf', 1, $2, 't', \
           CASE WHEN i <= $4 THEN 'LEASED' ELSE 'DISPATCHED' END, 2, '{}', 30000 \
         FROM generate_series(1, $3) AS i ORDER BY i \
         RETURNING id",
    )
    .bind(run_id)
    .bind(queue)
    .bind(count)
    .bind(leased)
    .fetch_all(pool)
    .await
    .expect("tasks")
}

/// Leases `count` candidates of which only some qualify, and checks that
/// exactly those were leased, each once, with a fencing token.
async fn only_the_dispatched_of_the_queue_at_their_attempt_are_leased(count: i64) {
    let store = common::fresh_store(4).await;
    let pool = store.pool();
    let queue = format!("q{}", Uuid::new_v4().simple());
    let ours = tasks_in(pool, &queue, count, 3).await;
    let elsewhere = tasks_in(pool, "another-queue", 2, 0).await;
    // the first three are leased already; every fifth names a stale attempt
    let mut candidates: Vec<(Uuid, i32)> = ours
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, if i % 5 == 4 { 1 } else { 2 }))
        .collect();
    candidates.extend(elsewhere.iter().map(|id| (*id, 2)));
    candidates.push((Uuid::new_v4(), 2));
    let expected: HashSet<Uuid> = ours
        .iter()
        .enumerate()
        .filter(|(i, _)| *i >= 3 && i % 5 != 4)
        .map(|(_, id)| *id)
        .collect();

    let unleased = tasks::dispatched_with_keys(pool, &candidates, "default", &queue)
        .await
        .expect("dispatched");
    let found: HashSet<Uuid> = unleased.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(found.len(), unleased.len(), "a task found twice");
    assert_eq!(found, expected, "the rate-limited hand-out's candidates");
    assert!(
        unleased
            .iter()
            .all(|(_, attempt, key)| *attempt == 2 && key.is_none())
    );

    let leased = tasks::lease_tasks(pool, &candidates, "w", "default", &queue, None)
        .await
        .expect("lease");

    let got: HashSet<Uuid> = leased.iter().map(|t| t.id).collect();
    assert_eq!(got.len(), leased.len(), "a task leased twice");
    assert_eq!(got, expected);
    assert!(leased.iter().all(|t| t.attempt == 2));
    let again = tasks::lease_tasks(pool, &candidates, "w2", "default", &queue, None)
        .await
        .expect("lease again");
    assert!(again.is_empty(), "a leased task is not leased again");
}

#[tokio::test]
async fn a_poll_of_a_few_candidates_leases_only_those_still_dispatched() {
    only_the_dispatched_of_the_queue_at_their_attempt_are_leased(20).await;
}

#[tokio::test]
async fn a_poll_of_many_candidates_leases_only_those_still_dispatched() {
    only_the_dispatched_of_the_queue_at_their_attempt_are_leased(1_000).await;
}

/// The connection's `synchronous_commit` as its transaction sees it now.
async fn synchronous_commit(conn: &mut sqlx::PgConnection) -> String {
    sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(conn)
        .await
        .expect("show synchronous_commit")
}

/// A lease's transaction commits without waiting for its WAL flush
/// (decision 0033), in both forms of the statement, and the setting ends
/// with that transaction: the connection's next one, an event's, waits
/// for its flush again.
async fn a_lease_commits_without_waiting_for_its_flush(count: i64) {
    use sqlx::Connection;

    let store = common::fresh_store(4).await;
    let pool = store.pool();
    let queue = format!("q{}", Uuid::new_v4().simple());
    let ids = tasks_in(pool, &queue, count, 0).await;
    let candidates: Vec<(Uuid, i32)> = ids.iter().map(|id| (*id, 2)).collect();
    let mut conn = pool.acquire().await.expect("connection");
    assert_eq!(synchronous_commit(&mut conn).await, "on");

    let mut lease = conn.begin().await.expect("begin");
    let leased = tasks::lease_tasks(&mut *lease, &candidates, "w", "default", &queue, None)
        .await
        .expect("lease");
    assert_eq!(leased.len(), ids.len(), "every candidate leased");
    assert_eq!(synchronous_commit(&mut lease).await, "off");
    lease.commit().await.expect("commit");

    assert_eq!(synchronous_commit(&mut conn).await, "on");
    let status: Vec<String> = sqlx::query_scalar("SELECT status FROM tasks WHERE id = ANY($1)")
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await
        .expect("status");
    assert!(status.iter().all(|s| s == "LEASED"), "{status:?}");
}

#[tokio::test]
async fn a_lease_of_a_few_candidates_commits_without_waiting_for_its_flush() {
    a_lease_commits_without_waiting_for_its_flush(3).await;
}

#[tokio::test]
async fn a_lease_of_many_candidates_commits_without_waiting_for_its_flush() {
    a_lease_commits_without_waiting_for_its_flush(100).await;
}

/// The lease inside an event's transaction (the direct hand-off, decision
/// 0034) leaves that transaction's flush alone: the event still commits
/// durably, as every event does.
#[tokio::test]
async fn a_lease_inside_an_events_transaction_keeps_its_flush() {
    use sqlx::Connection;

    let store = common::fresh_store(4).await;
    let pool = store.pool();
    let queue = format!("q{}", Uuid::new_v4().simple());
    let ids = tasks_in(pool, &queue, 3, 0).await;
    let candidates: Vec<(Uuid, i32)> = ids.iter().map(|id| (*id, 2)).collect();
    let mut conn = pool.acquire().await.expect("connection");

    let mut event = conn.begin().await.expect("begin");
    let leased = tasks::lease_armed_tasks(&mut event, &candidates, "w", "default", &queue, None)
        .await
        .expect("lease");
    assert_eq!(leased.len(), ids.len(), "every candidate leased");
    assert_eq!(synchronous_commit(&mut event).await, "on");
    event.commit().await.expect("commit");
}
