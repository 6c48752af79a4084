//! The recovery loops' lease scans run twice a second on every server, so
//! what one scan reads must follow the leases that ran out, not every task
//! leased since the last vacuum (migration 0015). Real Postgres.

use crate::common;

use composer_store::tasks;
use sqlx::{PgConnection, PgPool};

/// Tasks leased and then ended: each leaves a dead entry in any index of
/// leased tasks until vacuum, the load a busy server's scans meet.
const ENDED: i64 = 4_000;

/// One run whose tasks `n1`..`n{ENDED + 5}` were all leased. Half of the
/// ended ones had run out before they ended, half had an hour left. Left
/// leased and expired: `n1`..`n3` (confirmed) and `n4`, `n5` (receipt
/// never confirmed). Statistics are fresh, as autovacuum keeps them.
async fn leased_and_mostly_ended(pool: &PgPool) {
    let run_id = common::insert_run(pool).await;
    sqlx::query(
        "INSERT INTO tasks (id, namespace, run_id, node_key, workflow_name, workflow_version, \
           queue, task_name, status, attempt, input, heartbeat_timeout_ms, lease_token, \
           lease_owner, lease_expires_at, lease_confirmed) \
         SELECT gen_random_uuid(), 'default', $1, 'n' || i, 'wf', 1, 'q', 't', 'LEASED', 1, \
           '{}', 30000, gen_random_uuid(), 'w', \
           now() + CASE WHEN i > 5 AND i % 2 = 0 THEN interval '1 hour' \
             ELSE interval '-1 minute' END, \
           CASE WHEN i IN (4, 5) THEN false END \
         FROM generate_series(1, $2 + 5) AS i",
    )
    .bind(run_id)
    .bind(ENDED)
    .execute(pool)
    .await
    .expect("tasks");
    sqlx::query(
        "UPDATE tasks SET status = 'COMPLETED', outcome = 'COMPLETED', lease_expires_at = NULL \
         WHERE node_key NOT IN ('n1', 'n2', 'n3', 'n4', 'n5')",
    )
    .execute(pool)
    .await
    .expect("end");
    sqlx::query("ANALYZE tasks")
        .execute(pool)
        .await
        .expect("analyze");
}

/// How many times a scan is measured at most. A scan marks the index
/// entries of ended tasks dead only when no snapshot anywhere can still
/// see them, so a transaction of another test open meanwhile can make one
/// measure read them all again; a regression reads them on every pass.
const MEASURES: usize = 10;

/// Blocks of `tasks` and of its indexes read so far in this transaction.
async fn blocks_read(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT sum(pg_stat_get_xact_blocks_fetched(oid))::int8 FROM pg_class \
         WHERE oid = 'tasks'::regclass \
            OR oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'tasks'::regclass)",
    )
    .fetch_one(conn)
    .await
    .expect("block counters")
}

async fn heap_pages(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT pg_relation_size('tasks') / 8192")
        .fetch_one(pool)
        .await
        .expect("table size")
}

#[tokio::test]
async fn an_expired_lease_scan_reads_what_ran_out_not_every_task_once_leased() {
    let store = common::fresh_store(2).await;
    let pool = store.pool();
    leased_and_mostly_ended(pool).await;

    let first = tasks::expired_leases(pool, 200).await.expect("first scan");
    let mut found: Vec<String> = first.into_iter().map(|l| l.node_key).collect();
    found.sort();
    assert_eq!(
        found,
        ["n1", "n2", "n3"],
        "the confirmed leases that ran out"
    );

    let pages = heap_pages(pool).await;
    assert!(
        pages >= 40,
        "the table spans {pages} pages: too small to tell"
    );
    // a later scan, as the next pass of the loop: the entries of the tasks
    // that ended were passed once and need not be read again. 17 blocks
    // here in expiry order; 137 when the scan read every task once leased
    // (a bitmap scan of an index by id)
    let mut reads = Vec::new();
    for _ in 0..MEASURES {
        let mut tx = pool.begin().await.expect("begin");
        let before = blocks_read(&mut tx).await;
        let again = tasks::expired_leases(&mut *tx, 200).await.expect("scan");
        let read = blocks_read(&mut tx).await - before;
        tx.rollback().await.expect("rollback");
        assert_eq!(again.len(), 3);
        reads.push(read);
        if read * 5 < pages {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("each scan read {reads:?} blocks for 3 expired leases in a table of {pages} pages");
}

#[tokio::test]
async fn an_unconfirmed_lease_scan_reads_what_ran_out_not_every_task_once_leased() {
    let store = common::fresh_store(2).await;
    let pool = store.pool();
    leased_and_mostly_ended(pool).await;
    // the expired-lease scan passes the ended tasks' entries first, as the
    // loop does before each unconfirmed-lease scan
    tasks::expired_leases(pool, 200)
        .await
        .expect("expired scan");

    let pages = heap_pages(pool).await;
    assert!(
        pages >= 40,
        "the table spans {pages} pages: too small to tell"
    );
    // most of what it reads is the two updated rows' new index entries: 60
    // blocks here in expiry order; 175 when it read every task once leased
    // (measured in a transaction rolled back, so that it can be again)
    let mut reads = Vec::new();
    for _ in 0..MEASURES {
        let mut tx = pool.begin().await.expect("begin");
        let before = blocks_read(&mut tx).await;
        let returned = tasks::return_unconfirmed_leases(&mut *tx, 200)
            .await
            .expect("scan");
        let read = blocks_read(&mut tx).await - before;
        tx.rollback().await.expect("rollback");
        assert_eq!(returned, 2, "n4 and n5 go back to DISPATCHED");
        reads.push(read);
        if read * 2 < pages {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("each scan read {reads:?} blocks for 2 unconfirmed leases in a table of {pages} pages");
}
