//! B6: the dashboard's reads on a large history. 100,000 runs are written
//! straight into `runs` with one `INSERT ... SELECT generate_series` (rows
//! shaped like a real run's: the record copied from one, input, output or
//! error, labels, an idempotency key, creation times over 30 days), then
//! ListRuns' first page and CountRuns are called one at a time from a
//! client on loopback; the call latency is the server's time plus one
//! loopback round trip.

use std::time::Instant;

use anyhow::{Context, Result};
use composer_proto::v1::{
    CountRunsRequest, ListRunsRequest, RunStatus, run_service_client::RunServiceClient,
};
use tonic::transport::Channel;

use crate::{
    benches::{Ctx, Dist, dist, ms, register, start_request, stop_all},
    worker::channel,
};

/// One measured call shape.
#[derive(Debug, Clone)]
pub struct ReadCase {
    /// What was called.
    pub label: String,
    /// Latency, ms.
    pub latency: Dist,
    /// Runs returned (ListRuns) or counted (CountRuns) by one call.
    pub rows: i64,
    /// Whether it is a first page of ListRuns (the 300 ms target).
    pub first_page: bool,
}

/// B6's results.
#[derive(Debug, Clone)]
pub struct Listing {
    /// Runs in the database.
    pub runs: i64,
    /// Seconds the insert (and VACUUM ANALYZE) took.
    pub load_secs: f64,
    /// Each call shape.
    pub cases: Vec<ReadCase>,
}

const WORKFLOW: &str =
    "name: bench_list\nnodes:\n  - { id: wait, type: WAIT_FOR_EVENT, event: never }\n";

/// Fills `runs` with `count` rows shaped like the real run `template`'s.
/// Status by `n % 10`: 7 COMPLETED, 1 FAILED, 1 RUNNING, 1 CANCELLED.
const FILL: &str = "\
INSERT INTO runs (id, namespace, workflow_name, workflow_version, status, input, output, \
                  error, labels, idempotency_key, record, created_at, updated_at, ended_at)
SELECT gen_random_uuid(), t.namespace, t.workflow_name, 1 + n % 2,
       (ARRAY['COMPLETED','COMPLETED','COMPLETED','COMPLETED','COMPLETED','COMPLETED',
              'COMPLETED','FAILED','RUNNING','CANCELLED'])[1 + n % 10],
       jsonb_build_object('order', 'A-' || n, 'sku', 'BOOK-' || n % 97, 'quantity', 1 + n % 5),
       CASE WHEN n % 10 < 7 THEN jsonb_build_object('shipment',
            jsonb_build_object('tracking', 'TRK-A-' || n, 'sku', 'BOOK-' || n % 97)) END,
       CASE WHEN n % 10 = 7 THEN jsonb_build_object('code', 'TASK_FAILED',
            'message', 'card declined', 'node', 'charge') END,
       jsonb_build_object('team', (ARRAY['red','green','blue'])[1 + n % 3]),
       'order-' || n, t.record,
       now() - make_interval(secs => n * 26), now() - make_interval(secs => n * 26 - 5),
       CASE WHEN n % 10 <> 8 THEN now() - make_interval(secs => n * 26 - 5) END
FROM generate_series(1, $2) AS n, runs t
WHERE t.id = $1";

/// B6 on a fresh database.
pub async fn listing(ctx: &Ctx) -> Result<Listing> {
    ctx.reset().await?;
    let servers = ctx.start_servers(1).await?;
    let result = listing_on(ctx, &servers[0].url).await;
    stop_all(servers).await;
    result
}

async fn listing_on(ctx: &Ctx, url: &str) -> Result<Listing> {
    register(url, WORKFLOW).await?;
    let mut client = RunServiceClient::new(channel(url).await?);
    let template = client
        .start_run(start_request("bench_list", serde_json::json!({})))
        .await
        .context("start the template run")?
        .into_inner()
        .run
        .context("run")?
        .run_id;
    let template = sqlx::types::Uuid::parse_str(&template)?;
    let count = ctx.profile.list_runs;
    let began = Instant::now();
    sqlx::query(FILL)
        .bind(template)
        .bind(i64::try_from(count)?)
        .execute(&ctx.db)
        .await
        .context("fill runs")?;
    // the steady state autovacuum reaches on a table this size
    sqlx::raw_sql("VACUUM ANALYZE runs")
        .execute(&ctx.db)
        .await?;
    let load_secs = began.elapsed().as_secs_f64();
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(&ctx.db)
        .await?;
    let calls = ctx.profile.list_calls;
    let mut cases = Vec::new();
    for (label, request) in list_cases(&template.to_string()) {
        cases.push(measure_list(&mut client, label, request, calls).await?);
    }
    for (label, request) in count_cases() {
        cases.push(measure_count(&mut client, label, request, calls).await?);
    }
    Ok(Listing {
        runs,
        load_secs,
        cases,
    })
}

fn list_cases(run_id: &str) -> Vec<(&'static str, ListRunsRequest)> {
    let base = ListRunsRequest::default();
    vec![
        ("ListRuns first page (100), no filter", base.clone()),
        (
            "ListRuns first page, status FAILED",
            ListRunsRequest {
                statuses: vec![RunStatus::Failed as i32],
                ..base.clone()
            },
        ),
        (
            "ListRuns first page, workflow + version 2",
            ListRunsRequest {
                workflow_name: "bench_list".to_owned(),
                workflow_version: 2,
                ..base.clone()
            },
        ),
        (
            "ListRuns first page, label team=red",
            ListRunsRequest {
                labels: [("team".to_owned(), "red".to_owned())].into(),
                ..base.clone()
            },
        ),
        (
            "ListRuns search key prefix `order-4242`",
            ListRunsRequest {
                search: "order-4242".to_owned(),
                ..base.clone()
            },
        ),
        (
            "ListRuns search by run id",
            ListRunsRequest {
                search: run_id.to_owned(),
                ..base.clone()
            },
        ),
        (
            "ListRuns search matching nothing",
            ListRunsRequest {
                search: "no-such-key".to_owned(),
                ..base
            },
        ),
    ]
}

fn count_cases() -> Vec<(&'static str, CountRunsRequest)> {
    vec![
        ("CountRuns, no filter", CountRunsRequest::default()),
        (
            "CountRuns, workflow + version 2",
            CountRunsRequest {
                workflow_name: "bench_list".to_owned(),
                workflow_version: 2,
                ..Default::default()
            },
        ),
        (
            "CountRuns, label team=red",
            CountRunsRequest {
                labels: [("team".to_owned(), "red".to_owned())].into(),
                ..Default::default()
            },
        ),
        (
            "CountRuns, last 24 h",
            CountRunsRequest {
                create_time_after: Some(prost_types::Timestamp {
                    seconds: chrono::Utc::now().timestamp() - 86_400,
                    nanos: 0,
                }),
                ..Default::default()
            },
        ),
    ]
}

const WARM_UP: usize = 3;

async fn measure_list(
    client: &mut RunServiceClient<Channel>,
    label: &str,
    request: ListRunsRequest,
    calls: usize,
) -> Result<ReadCase> {
    let mut times = Vec::with_capacity(calls);
    let mut rows = 0;
    for i in 0..WARM_UP + calls {
        let sent = Instant::now();
        let page = client
            .list_runs(request.clone())
            .await
            .with_context(|| label.to_owned())?
            .into_inner();
        if i >= WARM_UP {
            times.push(ms(sent.elapsed()));
        }
        rows = page.runs.len() as i64;
    }
    Ok(ReadCase {
        label: label.to_owned(),
        latency: dist(times),
        rows,
        first_page: true,
    })
}

async fn measure_count(
    client: &mut RunServiceClient<Channel>,
    label: &str,
    request: CountRunsRequest,
    calls: usize,
) -> Result<ReadCase> {
    let mut times = Vec::with_capacity(calls);
    let mut rows = 0;
    for i in 0..WARM_UP + calls {
        let sent = Instant::now();
        let counts = client
            .count_runs(request.clone())
            .await
            .with_context(|| label.to_owned())?
            .into_inner()
            .counts;
        if i >= WARM_UP {
            times.push(ms(sent.elapsed()));
        }
        rows = counts.iter().map(|c| c.count).sum();
    }
    Ok(ReadCase {
        label: label.to_owned(),
        latency: dist(times),
        rows,
        first_page: false,
    })
}
