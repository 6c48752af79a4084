//! Schedules end to end (docs/schedules.md): the real binary, several
//! servers on one Postgres and Redis, fires counted from the runs they
//! started. Each run carries the idempotency key
//! `schedule:<id>:<fire time>`, so the set of fire times is read back from
//! the runs themselves.

use std::{collections::BTreeSet, path::PathBuf, time::Duration};

use chrono::{DateTime, Utc};
use composer_grpc::auth::{NewToken, SigningKey, mint};
use composer_proto::v1::{
    CreateScheduleRequest, DeleteScheduleRequest, GetScheduleRequest, ListRunsRequest,
    ListSchedulesRequest, OverlapPolicy, PauseScheduleRequest, RegisterWorkflowRequest,
    ResumeScheduleRequest, Run, RunStatus, Schedule, ScheduleAction, ScheduleFireOutcome,
    ScheduleSpec, SendEventRequest, TriggerScheduleRequest, UpdateScheduleRequest,
    run_service_client::RunServiceClient, schedule_service_client::ScheduleServiceClient,
    send_event_request::Target, workflow_service_client::WorkflowServiceClient,
};
use composer_testkit::{ServerProcess, fresh_database, fresh_redis_url, worker::value_of};
use serde_json::json;
use tonic::{Code, Request, Status, transport::Channel};
use tonic_types::StatusExt;

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

const QUICK: &str = "name: tick\nnodes:\n  - { id: nap, type: WAIT, duration: 1ms }\n";
const SLOW: &str = "name: slow\nnodes:\n  - { id: go, type: WAIT_FOR_EVENT, event: go }\n";

struct Client {
    schedules: ScheduleServiceClient<Channel>,
    runs: RunServiceClient<Channel>,
    workflows: WorkflowServiceClient<Channel>,
}

async fn client(server: &ServerProcess) -> Client {
    let channel = Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    Client {
        schedules: ScheduleServiceClient::new(channel.clone()),
        runs: RunServiceClient::new(channel.clone()),
        workflows: WorkflowServiceClient::new(channel),
    }
}

fn every_second() -> ScheduleSpec {
    ScheduleSpec {
        cron: "* * * * * *".to_owned(),
        ..Default::default()
    }
}

fn interval(seconds: i64) -> ScheduleSpec {
    ScheduleSpec {
        interval: Some(prost_types::Duration { seconds, nanos: 0 }),
        ..Default::default()
    }
}

fn seconds(seconds: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos: 0 })
}

fn create(
    id: &str,
    workflow: &str,
    spec: ScheduleSpec,
    overlap: OverlapPolicy,
) -> CreateScheduleRequest {
    CreateScheduleRequest {
        schedule_id: id.to_owned(),
        spec: Some(spec),
        action: Some(ScheduleAction {
            workflow_name: workflow.to_owned(),
            input: Some(value_of(&json!({"from": id}))),
            ..Default::default()
        }),
        overlap_policy: overlap as i32,
        ..Default::default()
    }
}

impl Client {
    async fn register(&mut self, source: &str) {
        self.workflows
            .register_workflow(RegisterWorkflowRequest {
                source: source.to_owned(),
            })
            .await
            .expect("register");
    }

    async fn create(&mut self, request: CreateScheduleRequest) -> Schedule {
        self.schedules
            .create_schedule(request)
            .await
            .expect("create the schedule")
            .into_inner()
            .schedule
            .expect("schedule")
    }

    async fn get(&mut self, id: &str) -> Schedule {
        self.schedules
            .get_schedule(GetScheduleRequest {
                schedule_id: id.to_owned(),
            })
            .await
            .expect("get the schedule")
            .into_inner()
            .schedule
            .expect("schedule")
    }

    async fn pause(&mut self, id: &str) -> Schedule {
        self.schedules
            .pause_schedule(PauseScheduleRequest {
                schedule_id: id.to_owned(),
                note: "test over".to_owned(),
            })
            .await
            .expect("pause")
            .into_inner()
            .schedule
            .expect("schedule")
    }

    /// The runs a schedule started, oldest fire first.
    async fn runs_of(&mut self, id: &str) -> Vec<Run> {
        let mut runs = self
            .runs
            .list_runs(ListRunsRequest {
                labels: [("composer.schedule".to_owned(), id.to_owned())].into(),
                page_size: 1000,
                ..Default::default()
            })
            .await
            .expect("list runs")
            .into_inner()
            .runs;
        runs.sort_by_key(fire_time);
        runs
    }

    async fn send_go(&mut self, run_id: &str) {
        self.runs
            .send_event(SendEventRequest {
                target: Some(Target::RunId(run_id.to_owned())),
                event_name: "go".to_owned(),
                ..Default::default()
            })
            .await
            .expect("send the event");
    }
}

/// A run's fire time, read from its idempotency key (and checked against
/// its label).
fn fire_time(run: &Run) -> DateTime<Utc> {
    let (_, time) = run
        .idempotency_key
        .strip_prefix("schedule:")
        .and_then(|rest| rest.split_once(':'))
        .expect("a schedule's key");
    assert_eq!(
        run.labels["composer.fire_time"], time,
        "label and key agree"
    );
    DateTime::parse_from_rfc3339(time)
        .expect("rfc 3339")
        .with_timezone(&Utc)
}

fn time_of(ts: &prost_types::Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp(ts.seconds, u32::try_from(ts.nanos).unwrap_or(0)).expect("time")
}

/// Asserts the fire times are one a second, with none missing.
fn assert_contiguous(times: &[DateTime<Utc>]) {
    for pair in times.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            chrono::Duration::seconds(1),
            "fires {} then {}: one missing or doubled",
            pair[0],
            pair[1]
        );
    }
}

async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn three_servers_start_each_fire_of_a_one_second_schedule_exactly_once() {
    let database_url = fresh_database().await;
    let redis_url = fresh_redis_url();
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(
            ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await,
        );
    }
    let mut client = client(&servers[0]).await;
    client.register(QUICK).await;
    let created = client
        .create(create(
            "every-second",
            "tick",
            every_second(),
            OverlapPolicy::AllowAll,
        ))
        .await;
    let first_fire = time_of(&created.next_fire_times[0]);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let paused = client.pause("every-second").await;
    // a pass that claimed the schedule before the pause may still commit
    tokio::time::sleep(Duration::from_secs(1)).await;
    let schedule = client.get("every-second").await;
    let runs = client.runs_of("every-second").await;
    let times: Vec<DateTime<Utc>> = runs.iter().map(fire_time).collect();
    let distinct: BTreeSet<_> = times.iter().collect();
    assert_eq!(distinct.len(), runs.len(), "a fire time started twice");
    assert_eq!(
        times.first(),
        Some(&first_fire),
        "the first fire is the first one due"
    );
    assert_contiguous(&times);
    // 20 s of fires; the pause came at most a few hundred ms after the last
    assert!(runs.len() >= 18, "{} fires in 20 s", runs.len());
    let last = *times.last().expect("fires");
    assert!(
        time_of(paused.update_time.as_ref().expect("time")) - last < chrono::Duration::seconds(3),
        "the last fire {last} is more than 3 s before the pause"
    );
    assert_eq!(schedule.fired_count, runs.len() as i64);
    assert_eq!(schedule.missed_count, 0);
    assert_eq!(schedule.skipped_count, 0);
    assert_eq!(schedule.recent_fires.len(), 10);
    assert_eq!(
        schedule.recent_fires[0].run_id,
        runs.last().expect("run").run_id
    );
    assert!(schedule.next_fire_times.is_empty(), "paused: no next fires");
    // every server took part (each logs nothing per fire, but each could
    // serve the reads): at least the three are still healthy
    for server in &servers {
        let mut other = client_of(server).await;
        assert_eq!(
            other.get("every-second").await.fired_count,
            schedule.fired_count
        );
    }
}

async fn client_of(server: &ServerProcess) -> Client {
    client(server).await
}

#[tokio::test(flavor = "multi_thread")]
async fn after_downtime_fires_within_the_catch_up_window_start_once_and_older_ones_are_counted() {
    let database_url = fresh_database().await;
    let redis_url = fresh_redis_url();
    let mut server =
        ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let mut client = client(&server).await;
    client.register(QUICK).await;
    let mut wide = create("wide", "tick", every_second(), OverlapPolicy::AllowAll);
    wide.catch_up_window = seconds(60);
    let mut narrow = create("narrow", "tick", every_second(), OverlapPolicy::AllowAll);
    narrow.catch_up_window = seconds(2);
    client.create(wide).await;
    client.create(narrow).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.kill().await;
    let _ = server.wait(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let server =
        ServerProcess::start_with(&composer_binary(), &database_url, &redis_url, &[]).await;
    let mut client = client_of(&server).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    client.pause("wide").await;
    client.pause("narrow").await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // wide: every fire of the downtime started once, nothing missed
    let wide = client.get("wide").await;
    let runs = client.runs_of("wide").await;
    let times: Vec<DateTime<Utc>> = runs.iter().map(fire_time).collect();
    assert_contiguous(&times);
    assert!(times.len() >= 15, "{} fires over about 16 s", times.len());
    assert_eq!(wide.missed_count, 0);
    assert_eq!(wide.fired_count, runs.len() as i64);

    // narrow: the downtime's fires older than 2 s were missed and counted;
    // with the runs they make up every second from first to last
    let narrow = client.get("narrow").await;
    let runs = client.runs_of("narrow").await;
    let times: Vec<DateTime<Utc>> = runs.iter().map(fire_time).collect();
    let span = (*times.last().expect("fires") - *times.first().expect("fires")).num_seconds() + 1;
    assert_eq!(
        span,
        runs.len() as i64 + narrow.missed_count,
        "every second either started a run or was counted as missed"
    );
    assert!(
        narrow.missed_count >= 6,
        "about 10 s down with a 2 s window: {} missed",
        narrow.missed_count
    );
    let gaps = times
        .windows(2)
        .filter(|pair| pair[1] - pair[0] > chrono::Duration::seconds(1))
        .count();
    // the downtime's; a loaded machine may add one of its own, counted too
    assert!(gaps >= 1, "no gap: nothing was missed");
}

#[tokio::test(flavor = "multi_thread")]
async fn overlap_policies_skip_buffer_one_or_cancel_the_previous_run() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut client = client(&server).await;
    client.register(SLOW).await;
    client
        .create(create("skip", "slow", interval(1), OverlapPolicy::Skip))
        .await;
    client
        .create(create(
            "buffer",
            "slow",
            interval(1),
            OverlapPolicy::BufferOne,
        ))
        .await;
    client
        .create(create(
            "cancel",
            "slow",
            interval(1),
            OverlapPolicy::CancelPrevious,
        ))
        .await;
    tokio::time::sleep(Duration::from_millis(3500)).await;

    // SKIP: one run, still waiting; the fires since were skipped
    let runs = client.runs_of("skip").await;
    assert_eq!(runs.len(), 1, "SKIP starts nothing while its run runs");
    let skip = client.get("skip").await;
    assert!(skip.skipped_count >= 2, "skipped {}", skip.skipped_count);
    assert_eq!(
        skip.recent_fires[0].outcome,
        ScheduleFireOutcome::Skipped as i32
    );
    // once it ends, the next fire starts a run
    client.send_go(&runs[0].run_id).await;
    wait_until("SKIP's second run", Duration::from_secs(10), || {
        let mut client = Client {
            schedules: client.schedules.clone(),
            runs: client.runs.clone(),
            workflows: client.workflows.clone(),
        };
        async move { client.runs_of("skip").await.len() == 2 }
    })
    .await;

    // BUFFER_ONE: one run, one fire kept, the others skipped
    let runs = client.runs_of("buffer").await;
    assert_eq!(runs.len(), 1);
    let buffer = client.get("buffer").await;
    let buffered = time_of(buffer.buffered_fire_time.as_ref().expect("a buffered fire"));
    assert!(
        buffer.skipped_count >= 1,
        "skipped {}",
        buffer.skipped_count
    );
    client.send_go(&runs[0].run_id).await;
    wait_until("the buffered fire's run", Duration::from_secs(10), || {
        let mut client = Client {
            schedules: client.schedules.clone(),
            runs: client.runs.clone(),
            workflows: client.workflows.clone(),
        };
        async move { client.runs_of("buffer").await.len() >= 2 }
    })
    .await;
    let runs = client.runs_of("buffer").await;
    assert_eq!(
        fire_time(&runs[1]),
        buffered,
        "the buffered fire started, with its own time"
    );
    // the next fire may be buffered behind the new run already, but not this one
    let after = client.get("buffer").await;
    assert_ne!(
        after.buffered_fire_time.as_ref().map(time_of),
        Some(buffered)
    );
    assert!(
        after
            .recent_fires
            .iter()
            .any(|f| f.outcome == ScheduleFireOutcome::Started as i32
                && f.fire_time.as_ref().map(time_of) == Some(buffered)),
        "the buffered fire is recorded as started"
    );

    // CANCEL_PREVIOUS: each fire cancelled the one before
    let runs = client.runs_of("cancel").await;
    assert!(runs.len() >= 3, "{} runs", runs.len());
    let (last, earlier) = runs.split_last().expect("runs");
    for run in earlier {
        let run = client
            .runs
            .get_run(composer_proto::v1::GetRunRequest {
                run_id: run.run_id.clone(),
                skip_nodes: true,
            })
            .await
            .expect("get")
            .into_inner()
            .run
            .expect("run");
        // the newest earlier one may be cancelled by a fire after the list
        assert_eq!(run.status, RunStatus::Cancelled as i32, "{}", run.run_id);
    }
    assert_eq!(last.status, RunStatus::Running as i32);
    for id in ["skip", "buffer", "cancel"] {
        client.pause(id).await;
    }
}

const SECRET: &str = "a-test-secret-that-is-long-enough-for-hs256-0123456789";

fn token(ns: &str, roles: &[&str]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    mint(
        &NewToken {
            sub: format!("{ns}-user"),
            ns: ns.to_owned(),
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
            queues: None,
            iat: now,
            nbf: now,
            exp: now + 3600,
            iss: None,
            aud: None,
        },
        SigningKey::Secret(SECRET.as_bytes()),
        None,
    )
    .expect("mint")
}

fn authed<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

/// The field of an INVALID_ARGUMENT's first violation.
fn violated_field(status: &Status) -> String {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    status
        .get_details_bad_request()
        .and_then(|bad| bad.field_violations.into_iter().next())
        .map(|v| v.field)
        .unwrap_or_else(|| panic!("no field violation in {status:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn schedules_are_checked_field_by_field_and_stay_in_their_namespace() {
    let server = ServerProcess::start(&composer_binary(), &["--auth-secret", SECRET]).await;
    let channel = Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut schedules = ScheduleServiceClient::new(channel.clone());
    let mut workflows = WorkflowServiceClient::new(channel.clone());
    let acme = token("acme", &["admin"]);
    let globex = token("globex", &["admin"]);
    let reader = token("acme", &["reader"]);
    let typed = "name: typed\ninput_schema:\n  type: object\n  required: [n]\n\
                 nodes:\n  - { id: nap, type: WAIT, duration: 1ms }\n";
    for source in [QUICK, typed] {
        workflows
            .register_workflow(authed(
                RegisterWorkflowRequest {
                    source: source.to_owned(),
                },
                &acme,
            ))
            .await
            .expect("register");
    }
    let hourly = || ScheduleSpec {
        cron: "0 * * * *".to_owned(),
        time_zone: "Europe/Berlin".to_owned(),
        interval: None,
    };

    // validation: each bad field is named
    let bad = |change: &dyn Fn(&mut CreateScheduleRequest)| {
        let mut request = create("nightly", "tick", hourly(), OverlapPolicy::Skip);
        change(&mut request);
        request
    };
    let cases: Vec<(CreateScheduleRequest, &str)> = vec![
        (
            bad(&|r| r.schedule_id = "has space".to_owned()),
            "schedule_id",
        ),
        (
            bad(&|r| r.schedule_id = "_reserved".to_owned()),
            "schedule_id",
        ),
        (
            bad(&|r| r.spec.as_mut().unwrap().cron = "61 * * * *".to_owned()),
            "spec.cron",
        ),
        (
            bad(&|r| r.spec.as_mut().unwrap().time_zone = "Mars/Base".to_owned()),
            "spec.time_zone",
        ),
        (bad(&|r| r.spec = None), "spec"),
        (bad(&|r| r.spec = Some(interval(0))), "spec.interval"),
        (
            bad(&|r| {
                r.spec = Some(ScheduleSpec {
                    interval: Some(prost_types::Duration {
                        seconds: 0,
                        nanos: 500_000_000,
                    }),
                    ..Default::default()
                })
            }),
            "spec.interval",
        ),
        (
            bad(&|r| r.catch_up_window = seconds(8 * 24 * 3600)),
            "catch_up_window",
        ),
        (bad(&|r| r.jitter = seconds(3600)), "jitter"),
        (bad(&|r| r.overlap_policy = 99), "overlap_policy"),
        (
            bad(&|r| r.action.as_mut().unwrap().workflow_name = "no:such".to_owned()),
            "action.workflow_name",
        ),
        (
            bad(&|r| {
                r.action
                    .as_mut()
                    .unwrap()
                    .labels
                    .insert("composer.schedule".to_owned(), "x".to_owned());
            }),
            "action.labels[\"composer.schedule\"]",
        ),
        (
            bad(&|r| r.action.as_mut().unwrap().workflow_name = "typed".to_owned()),
            "action.input",
        ),
    ];
    for (request, field) in cases {
        let status = schedules
            .create_schedule(authed(request, &acme))
            .await
            .expect_err(field);
        let named = violated_field(&status);
        assert!(
            named.starts_with(field),
            "{field}: got {named} ({status:?})"
        );
    }
    let unknown = schedules
        .create_schedule(authed(
            create("nightly", "nope", hourly(), OverlapPolicy::Skip),
            &acme,
        ))
        .await
        .expect_err("unknown workflow");
    assert_eq!(unknown.code(), Code::NotFound);

    // create, get, list, update, pause, resume, trigger, delete
    let created = schedules
        .create_schedule(authed(
            create("nightly", "tick", hourly(), OverlapPolicy::Skip),
            &acme,
        ))
        .await
        .expect("create")
        .into_inner()
        .schedule
        .expect("schedule");
    assert_eq!(created.next_fire_times.len(), 10);
    assert_eq!(
        created.spec.as_ref().expect("spec").time_zone,
        "Europe/Berlin"
    );
    assert_eq!(created.catch_up_window, seconds(60), "the default window");
    let again = schedules
        .create_schedule(authed(
            create("nightly", "tick", hourly(), OverlapPolicy::Skip),
            &acme,
        ))
        .await
        .expect_err("taken id");
    assert_eq!(again.code(), Code::AlreadyExists);
    let listed = schedules
        .list_schedules(authed(ListSchedulesRequest::default(), &reader))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.schedules.len(), 1);
    let forbidden = schedules
        .trigger_schedule(authed(
            TriggerScheduleRequest {
                schedule_id: "nightly".to_owned(),
            },
            &reader,
        ))
        .await
        .expect_err("a reader may not trigger");
    assert_eq!(forbidden.code(), Code::PermissionDenied);
    let updated = schedules
        .update_schedule(authed(
            UpdateScheduleRequest {
                schedule_id: "nightly".to_owned(),
                spec: Some(interval(3600)),
                action: created.action.clone(),
                overlap_policy: OverlapPolicy::AllowAll as i32,
                ..Default::default()
            },
            &acme,
        ))
        .await
        .expect("update")
        .into_inner()
        .schedule
        .expect("schedule");
    assert_eq!(updated.overlap_policy, OverlapPolicy::AllowAll as i32);
    assert_eq!(updated.spec.as_ref().expect("spec").interval, seconds(3600));
    let paused = schedules
        .pause_schedule(authed(
            PauseScheduleRequest {
                schedule_id: "nightly".to_owned(),
                note: "maintenance".to_owned(),
            },
            &acme,
        ))
        .await
        .expect("pause")
        .into_inner()
        .schedule
        .expect("schedule");
    assert!(paused.paused);
    assert_eq!(paused.note, "maintenance");
    assert!(paused.next_fire_times.is_empty());
    // a paused schedule still fires when triggered
    let fire = schedules
        .trigger_schedule(authed(
            TriggerScheduleRequest {
                schedule_id: "nightly".to_owned(),
            },
            &acme,
        ))
        .await
        .expect("trigger")
        .into_inner()
        .fire
        .expect("fire");
    assert_eq!(fire.outcome, ScheduleFireOutcome::Started as i32);
    assert!(!fire.run_id.is_empty());
    let resumed = schedules
        .resume_schedule(authed(
            ResumeScheduleRequest {
                schedule_id: "nightly".to_owned(),
                note: String::new(),
            },
            &acme,
        ))
        .await
        .expect("resume")
        .into_inner()
        .schedule
        .expect("schedule");
    assert!(!resumed.paused);
    assert_eq!(resumed.next_fire_times.len(), 10);
    assert_eq!(resumed.fired_count, 1);
    assert_eq!(resumed.recent_fires[0].run_id, fire.run_id);

    // another namespace neither sees nor touches it
    let theirs = schedules
        .list_schedules(authed(ListSchedulesRequest::default(), &globex))
        .await
        .expect("list")
        .into_inner();
    assert!(theirs.schedules.is_empty());
    let get = schedules
        .get_schedule(authed(
            GetScheduleRequest {
                schedule_id: "nightly".to_owned(),
            },
            &globex,
        ))
        .await
        .expect_err("not theirs");
    assert_eq!(get.code(), Code::NotFound);
    for status in [
        schedules
            .trigger_schedule(authed(
                TriggerScheduleRequest {
                    schedule_id: "nightly".to_owned(),
                },
                &globex,
            ))
            .await
            .expect_err("not theirs"),
        schedules
            .pause_schedule(authed(
                PauseScheduleRequest {
                    schedule_id: "nightly".to_owned(),
                    note: String::new(),
                },
                &globex,
            ))
            .await
            .expect_err("not theirs"),
        schedules
            .delete_schedule(authed(
                DeleteScheduleRequest {
                    schedule_id: "nightly".to_owned(),
                },
                &globex,
            ))
            .await
            .expect_err("not theirs"),
    ] {
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    }
    // the same id in another namespace is another schedule (its workflow
    // does not exist there)
    let elsewhere = schedules
        .create_schedule(authed(
            create("nightly", "tick", hourly(), OverlapPolicy::Skip),
            &globex,
        ))
        .await
        .expect_err("no workflow tick in globex");
    assert_eq!(elsewhere.code(), Code::NotFound);
    assert!(!acme_still_has(&mut schedules, &acme).await.paused);

    schedules
        .delete_schedule(authed(
            DeleteScheduleRequest {
                schedule_id: "nightly".to_owned(),
            },
            &acme,
        ))
        .await
        .expect("delete");
    let gone = schedules
        .get_schedule(authed(
            GetScheduleRequest {
                schedule_id: "nightly".to_owned(),
            },
            &acme,
        ))
        .await
        .expect_err("deleted");
    assert_eq!(gone.code(), Code::NotFound);
}

async fn acme_still_has(schedules: &mut ScheduleServiceClient<Channel>, token: &str) -> Schedule {
    schedules
        .get_schedule(authed(
            GetScheduleRequest {
                schedule_id: "nightly".to_owned(),
            },
            token,
        ))
        .await
        .expect("still there")
        .into_inner()
        .schedule
        .expect("schedule")
}

/// `composer <args> --address <server>`: its exit code, stdout and stderr.
async fn cli(server: &ServerProcess, args: &[&str]) -> (i32, String, String) {
    let output = tokio::process::Command::new(composer_binary())
        .args(args)
        .args(["--address", &server.url()])
        .env_remove("COMPOSER_ADDRESS")
        .env_remove("COMPOSER_TOKEN")
        .env_remove("COMPOSER_NAMESPACE")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run composer");
    (
        output.status.code().expect("exited"),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn json_of(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_schedule_commands_work_end_to_end_with_tables_json_and_exit_codes() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    client(&server).await.register(QUICK).await;

    let (code, stdout, stderr) = cli(
        &server,
        &[
            "schedule",
            "create",
            "nightly",
            "--workflow",
            "tick",
            "--cron",
            "30 2 * * *",
            "--time-zone",
            "Europe/Berlin",
            "--input",
            r#"{"n": 1}"#,
            "--label",
            "team=ops",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let created = json_of(&stdout);
    assert_eq!(created["schedule"]["schedule_id"], "nightly");
    assert_eq!(created["schedule"]["spec"]["time_zone"], "Europe/Berlin");
    assert_eq!(created["schedule"]["action"]["input"], json!({"n": 1}));
    assert_eq!(created["schedule"]["overlap_policy"], "OVERLAP_POLICY_SKIP");
    assert_eq!(
        created["schedule"]["next_fire_times"]
            .as_array()
            .map(Vec::len),
        Some(10)
    );

    // a bad field: INVALID_ARGUMENT (exit 13) naming it
    let (code, _, stderr) = cli(
        &server,
        &[
            "schedule",
            "create",
            "bad",
            "--workflow",
            "tick",
            "--cron",
            "61 * * * *",
        ],
    )
    .await;
    assert_eq!(code, 13, "{stderr}");
    assert!(stderr.contains("spec.cron"), "{stderr}");
    // neither --cron nor --every: a usage error
    let (code, _, _) = cli(
        &server,
        &["schedule", "create", "bad", "--workflow", "tick"],
    )
    .await;
    assert_eq!(code, 2);

    let (code, stdout, _) = cli(&server, &["schedule", "get", "nightly"]).await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains(r#"cron "30 2 * * *" in Europe/Berlin"#),
        "{stdout}"
    );
    assert!(stdout.contains("team=ops"), "{stdout}");
    let (code, stdout, _) = cli(&server, &["schedule", "list"]).await;
    assert_eq!(code, 0);
    assert!(stdout.starts_with("SCHEDULE"), "{stdout}");
    assert!(
        stdout.contains("nightly") && stdout.contains("ACTIVE"),
        "{stdout}"
    );

    let (code, stdout, stderr) = cli(
        &server,
        &[
            "schedule",
            "update",
            "nightly",
            "--workflow",
            "tick",
            "--every",
            "1h",
            "--overlap",
            "allow-all",
            "--jitter",
            "10s",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let updated = json_of(&stdout);
    assert_eq!(updated["schedule"]["spec"]["interval"], "3600s");
    assert_eq!(updated["schedule"]["jitter"], "10s");
    assert_eq!(
        updated["schedule"]["overlap_policy"],
        "OVERLAP_POLICY_ALLOW_ALL"
    );

    let (code, stdout, _) = cli(
        &server,
        &["schedule", "pause", "nightly", "--note", "maintenance"],
    )
    .await;
    assert_eq!(code, 0);
    assert_eq!(stdout, "schedule nightly paused\n");
    let (code, stdout, _) = cli(&server, &["schedule", "trigger", "nightly", "-o", "json"]).await;
    assert_eq!(code, 0);
    let fire = json_of(&stdout);
    assert_eq!(fire["fire"]["outcome"], "SCHEDULE_FIRE_OUTCOME_STARTED");
    let run_id = fire["fire"]["run_id"].as_str().expect("run id").to_owned();
    let (code, stdout, _) = cli(&server, &["schedule", "get", "nightly"]).await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains(&run_id) && stdout.contains("STARTED"),
        "{stdout}"
    );
    let (code, stdout, _) = cli(&server, &["schedule", "resume", "nightly"]).await;
    assert_eq!(code, 0);
    assert!(
        stdout.starts_with("schedule nightly resumed: next fire "),
        "{stdout}"
    );

    let (code, stdout, _) = cli(&server, &["schedule", "delete", "nightly"]).await;
    assert_eq!((code, stdout.as_str()), (0, "schedule nightly deleted\n"));
    let (code, _, stderr) = cli(&server, &["schedule", "get", "nightly"]).await;
    assert_eq!(code, 15, "NOT_FOUND: {stderr}");
    let (code, _, _) = cli(&server, &["schedule", "trigger", "nightly"]).await;
    assert_eq!(code, 15);
}
