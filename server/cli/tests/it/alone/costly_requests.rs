//! Requests that cost CPU cost their own namespace time, not everyone's
//! (decision 0036): against the real server, an operator of namespace A
//! sends CreateSchedule with the costliest valid cron specs and with ones
//! that never fire, from four tasks at once, while namespace B starts
//! runs. B's StartRun p99 stays under 250 ms, and a spec that never fires
//! is refused at once with INVALID_ARGUMENT naming `spec.cron`.

use crate::common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use common::{TOKEN_ARGS, authed, channel, composer_binary, register, token};
use composer_proto::v1::{
    CreateScheduleRequest, ScheduleAction, ScheduleSpec, StartRunRequest,
    run_service_client::RunServiceClient, schedule_service_client::ScheduleServiceClient,
};
use composer_testkit::{ServerProcess, worker::value_of};
use serde_json::json;
use tonic::{Code, transport::Channel};
use tonic_types::StatusExt;

/// A run that waits for an event: starting one is all B does.
const WAITING: &str = "name: waiting\nnodes:\n  - { id: go, type: WAIT_FOR_EVENT, event: go }\n";
/// How long A's storm lasts.
const STORM: Duration = Duration::from_secs(6);
/// What B's StartRun p99 must stay under during the storm.
const MAX_P99: Duration = Duration::from_millis(250);
/// What refusing a spec that never fires may take, at the median, in A's
/// own queue.
const MAX_REFUSAL: Duration = Duration::from_secs(1);

/// Specs that fire, but rarely: the search for their next fires crosses
/// decades (February 29 on a Monday: 2044, 2072, then 40 years to 2112).
const COSTLY_VALID: [(&str, &str); 3] = [
    ("0 0 29 2 +MON", "Europe/Berlin"),
    ("0 9 * 2 MON#5", "Australia/Lord_Howe"),
    ("59 59 23 29 2 +SUN", "America/New_York"),
];
/// Specs that never fire: no February 30, no 31st in a month of 30 days.
const NEVER: [(&str, &str); 3] = [
    ("*/1 */1 */1 31 2,4,6,9,11 *", "UTC"),
    ("0 0 30 2 *", "UTC"),
    ("* * 31 4,6,9,11 *", "Europe/Berlin"),
];

fn schedule(id: String, (cron, zone): (&str, &str)) -> CreateScheduleRequest {
    CreateScheduleRequest {
        schedule_id: id,
        spec: Some(ScheduleSpec {
            cron: cron.to_owned(),
            time_zone: zone.to_owned(),
            ..Default::default()
        }),
        action: Some(ScheduleAction {
            workflow_name: "waiting".to_owned(),
            input: Some(value_of(&json!({}))),
            ..Default::default()
        }),
        // a jitter makes the server check it against the gap between the
        // next 20 fires: 20 searches across decades
        jitter: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// StartRun latencies of `count` runs in a row, or for as long as `until`
/// says to go on.
async fn start_runs(
    channel: &Channel,
    token: &str,
    count: usize,
    until: Option<Arc<AtomicBool>>,
) -> Vec<Duration> {
    let mut runs = RunServiceClient::new(channel.clone());
    let mut latencies = Vec::new();
    while latencies.len() < count || until.as_ref().is_some_and(|go| go.load(Ordering::Acquire)) {
        let began = Instant::now();
        runs.start_run(authed(
            StartRunRequest {
                workflow_name: "waiting".to_owned(),
                input: Some(value_of(&json!({}))),
                ..Default::default()
            },
            token,
        ))
        .await
        .expect("B's StartRun succeeds");
        latencies.push(began.elapsed());
    }
    latencies
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summary(mut latencies: Vec<Duration>) -> (Duration, Duration, usize) {
    latencies.sort();
    (
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.len(),
    )
}

/// What one of A's storm tasks saw.
#[derive(Default)]
struct StormTally {
    created: usize,
    refused: Vec<Duration>,
    busy: usize,
}

async fn storm(channel: Channel, token: String, worker: usize, go: Arc<AtomicBool>) -> StormTally {
    let mut schedules = ScheduleServiceClient::new(channel);
    let mut tally = StormTally::default();
    let mut call = 0;
    while go.load(Ordering::Acquire) {
        call += 1;
        let never = call % 2 == 0;
        let spec = if never {
            NEVER[call % NEVER.len()]
        } else {
            COSTLY_VALID[call % COSTLY_VALID.len()]
        };
        let began = Instant::now();
        let answer = schedules
            .create_schedule(authed(schedule(format!("s{worker}-{call}"), spec), &token))
            .await;
        let took = began.elapsed();
        match (never, answer) {
            (false, Ok(_)) => tally.created += 1,
            (true, Err(status)) if status.code() == Code::InvalidArgument => {
                let details = status.get_error_details();
                let field = details
                    .bad_request()
                    .and_then(|b| b.field_violations.first())
                    .map(|v| v.field.clone());
                assert_eq!(field.as_deref(), Some("spec.cron"), "{status:?}");
                assert!(status.message().contains("never fires"), "{status:?}");
                tally.refused.push(took);
            }
            // the namespace's own queue of checks is full: its problem
            (_, Err(status)) if status.code() == Code::ResourceExhausted => tally.busy += 1,
            (never, answer) => panic!("{spec:?} (never fires: {never}): {answer:?}"),
        }
    }
    tally
}

#[tokio::test]
async fn a_storm_of_costly_cron_specs_from_one_namespace_leaves_another_namespaces_starts_fast() {
    let server = ServerProcess::start(&composer_binary(), &TOKEN_ARGS).await;
    let channel = channel(&server).await;
    let a = token("tenant-a", "a-operator", &["operator"]);
    let b = token("tenant-b", "b-operator", &["operator"]);
    register(&channel, &a, WAITING).await;
    register(&channel, &b, WAITING).await;

    // warm up, then B alone
    start_runs(&channel, &b, 20, None).await;
    let (idle_p50, idle_p99, idle_n) = summary(start_runs(&channel, &b, 200, None).await);
    println!("B idle: p50 {idle_p50:?}, p99 {idle_p99:?} over {idle_n} StartRuns");

    let go = Arc::new(AtomicBool::new(true));
    let aggressors: Vec<_> = (0..4)
        .map(|worker| tokio::spawn(storm(channel.clone(), a.clone(), worker, Arc::clone(&go))))
        .collect();
    let measured = {
        let (channel, b, go) = (channel.clone(), b.clone(), Arc::clone(&go));
        tokio::spawn(async move { start_runs(&channel, &b, 0, Some(go)).await })
    };
    tokio::time::sleep(STORM).await;
    go.store(false, Ordering::Release);
    let (storm_p50, storm_p99, storm_n) = summary(measured.await.expect("B's task"));
    let mut created = 0;
    let mut refused = Vec::new();
    let mut busy = 0;
    for aggressor in aggressors {
        let tally = aggressor.await.expect("A's task");
        created += tally.created;
        refused.extend(tally.refused);
        busy += tally.busy;
    }
    let (refused_p50, refused_p99, refused_n) = summary(refused);
    println!(
        "B during A's storm: p50 {storm_p50:?}, p99 {storm_p99:?} over {storm_n} StartRuns; \
         A: {created} costly schedules created, {refused_n} never-firing specs refused \
         (p50 {refused_p50:?}, p99 {refused_p99:?}), {busy} refused as busy"
    );
    assert!(
        created > 0 && refused_n > 0,
        "the storm ran: {created} created, {refused_n} refused"
    );
    assert!(
        storm_p99 < MAX_P99,
        "B's StartRun p99 during the storm is {storm_p99:?} (idle: {idle_p99:?}); at most {MAX_P99:?}"
    );
    // each is refused at once: a search of 400 years, not a walk to the
    // year 5000 (seconds of CPU a call in a debug build); the checks run at
    // a lower priority and queue behind A's own, so the bound is loose
    assert!(
        refused_p50 < MAX_REFUSAL,
        "a spec that never fires took {refused_p50:?} (p50) to refuse"
    );
}
