//! CountRuns by workflow and version reads the workflow index alone
//! (migration 0028): each match used to be a visit to its run's row for
//! the version and the status. Real Postgres.

#[tokio::test]
async fn counting_runs_by_workflow_and_version_reads_only_the_workflow_index() {
    let pool = crate::fresh::migrated_database().await;
    // 40,000 runs of 20 workflows, two versions each, all visible (vacuumed)
    sqlx::query(
        "INSERT INTO runs (id, namespace, workflow_name, workflow_version, status, input, \
           record, created_at) \
         SELECT gen_random_uuid(), 'default', 'w' || n % 20, 1 + n / 20 % 2, \
           (ARRAY['COMPLETED','FAILED','RUNNING'])[1 + n % 3], '{}', '{}', \
           now() - make_interval(secs => n) \
         FROM generate_series(1, 40000) AS n",
    )
    .execute(&pool)
    .await
    .expect("fill");
    sqlx::query("VACUUM ANALYZE runs")
        .execute(&pool)
        .await
        .expect("vacuum");
    // CountRuns' statement for a workflow and a version (store::runs::
    // count_runs), planned by its values as listings are
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SELECT set_config('enable_seqscan', 'on', true)")
        .execute(&mut *tx)
        .await
        .expect("set");
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) \
         SELECT status, count(*) FROM \
           (SELECT status FROM runs WHERE namespace = 'default' AND workflow_name = 'w7' \
              AND workflow_version = 2 LIMIT 100001) AS m \
         GROUP BY status ORDER BY status",
    )
    .fetch_all(&mut *tx)
    .await
    .expect("explain");
    tx.rollback().await.expect("rollback");
    let plan = plan.join("\n");
    assert!(
        plan.contains("Index Only Scan using runs_by_workflow"),
        "{plan}"
    );
    assert!(plan.contains("Heap Fetches: 0"), "{plan}");
}
