//! A lease reads its candidates by primary key whatever the statistics
//! say (decision 0055): a generic plan made while `tasks` was counted small
//! read the queue's index of dispatched tasks instead, every task
//! dispatched to the queue for each lease. Real Postgres.

use composer_store::tasks::lease_sql;
use sqlx::PgPool;

/// The plan Postgres caches for the lease of `candidates` tasks.
async fn generic_plan(pool: &PgPool, candidates: usize) -> String {
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SET LOCAL plan_cache_mode = force_generic_plan")
        .execute(&mut *tx)
        .await
        .expect("set");
    sqlx::query(&format!(
        "PREPARE lease_{candidates}(uuid[], int[], text, text, text, bigint) AS {}",
        lease_sql(candidates)
    ))
    .execute(&mut *tx)
    .await
    .expect("prepare");
    let ids: Vec<String> = (0..candidates)
        .map(|_| format!("'{}'", uuid::Uuid::new_v4()))
        .collect();
    let plan: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN EXECUTE lease_{candidates}(ARRAY[{}]::uuid[], ARRAY[{}]::int[], 'w', 'default', \
         'q', NULL)",
        ids.join(","),
        vec!["1"; candidates].join(",")
    ))
    .fetch_all(&mut *tx)
    .await
    .expect("explain");
    tx.rollback().await.expect("rollback");
    plan.join("\n")
}

#[tokio::test]
async fn a_lease_reads_its_candidates_by_primary_key_while_the_statistics_count_few_tasks() {
    let pool = crate::fresh::migrated_database().await;
    // statistics of a table with a few dispatched tasks, then thousands
    // dispatched to the same queue before the next analyze
    let insert = "INSERT INTO tasks (id, namespace, run_id, node_key, workflow_name, \
       workflow_version, queue, task_name, status, attempt, input, heartbeat_timeout_ms, \
       dispatched_at) \
     SELECT gen_random_uuid(), 'default', gen_random_uuid(), 'm[' || i || ']', 'wide', 1, 'q', \
       't', 'DISPATCHED', 1, '{}'::jsonb, 30000, now() FROM generate_series(1, $1) AS i";
    sqlx::query(insert)
        .bind(3_i32)
        .execute(&pool)
        .await
        .expect("a few tasks");
    sqlx::query("ANALYZE tasks")
        .execute(&pool)
        .await
        .expect("analyze");
    sqlx::query(insert)
        .bind(20_000_i32)
        .execute(&pool)
        .await
        .expect("many tasks");

    for candidates in [1, 15, 32] {
        let plan = generic_plan(&pool, candidates).await;
        assert!(plan.contains("tasks_pkey"), "{candidates}: {plan}");
        assert!(
            !plan.contains("tasks_dispatched_by_queue"),
            "{candidates}: {plan}"
        );
    }
}
