//! Schedules: their definitions, and the scheduler loop that fires them.
//!
//! Every server runs the loop. A pass claims one due schedule with `FOR
//! UPDATE SKIP LOCKED`, starts its due fires' runs and advances its next
//! fire time in the same transaction, then commits; a fire's run carries
//! the idempotency key `schedule:<id>:<fire time>`, so even a pass that
//! commits its runs and then loses its schedule row update could never
//! start a fire twice. Fire times, catch-up and jitter are computed by
//! `composer_engine::schedule` from the database's clock (decision 0016).

use std::time::Duration;

use chrono::{DateTime, Utc};
use composer_engine::{
    Event,
    history::HistoryEventType,
    schedule::{self as plan, ScheduleSpec, Timetable},
};
use composer_store::{
    runs,
    schedules::{self, FireState, Inserted, ScheduleDefinition, ScheduleRow},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};
use sqlx::PgConnection;
use tokio::sync::watch;
use uuid::Uuid;

pub use composer_engine::schedule::{DEFAULT_CATCH_UP_WINDOW_MS, ScheduleSpec as StoredSpec};

use crate::{
    Coordinator, StartRun,
    error::{CoordinatorError, FieldProblem},
    events::apply::{Applied, RunTxn},
    events::runs::is_final,
};

/// Fires kept in a schedule's recent list.
pub const RECENT_FIRES: usize = 10;
/// Next fire times a schedule shows.
pub const NEXT_FIRES: usize = 10;
/// Runs one pass starts for one schedule at most (catching up); the rest
/// stay due for the next pass.
pub const MAX_FIRES_PER_PASS: usize = 100;

/// What a fire does when the schedule's previous run still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Start nothing; count the fire as skipped.
    Skip,
    /// Keep one fire, started when the previous run ends; more are skipped.
    BufferOne,
    /// Start anyway.
    AllowAll,
    /// Cancel the previous run, then start.
    CancelPrevious,
}

impl Overlap {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "SKIP",
            Overlap::BufferOne => "BUFFER_ONE",
            Overlap::AllowAll => "ALLOW_ALL",
            Overlap::CancelPrevious => "CANCEL_PREVIOUS",
        }
    }

    /// From storage.
    pub fn parse(text: &str) -> Option<Overlap> {
        [
            Overlap::Skip,
            Overlap::BufferOne,
            Overlap::AllowAll,
            Overlap::CancelPrevious,
        ]
        .into_iter()
        .find(|o| o.as_str() == text)
    }
}

/// What a fire starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleAction {
    /// The workflow.
    pub workflow_name: String,
    /// Its version; None: the latest at fire time.
    pub version: Option<i32>,
    /// The run's input.
    pub input: Json,
    /// The run's labels (besides `composer.schedule` and `composer.fire_time`).
    pub labels: std::collections::BTreeMap<String, String>,
}

/// When a schedule fires, as a caller gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum SpecRequest {
    /// A cron expression in a time zone (empty: UTC).
    Cron {
        /// Expression.
        expression: String,
        /// IANA zone.
        time_zone: String,
    },
    /// Every this many seconds, from now.
    Interval {
        /// Seconds.
        every_secs: i64,
    },
}

/// A schedule's definition, as CreateSchedule and UpdateSchedule give it.
#[derive(Debug, Clone)]
pub struct ScheduleRequest {
    /// Namespace.
    pub namespace: String,
    /// Id (a name).
    pub id: String,
    /// When.
    pub spec: SpecRequest,
    /// What.
    pub action: ScheduleAction,
    /// Overlap policy.
    pub overlap: Overlap,
    /// Catch-up window.
    pub catch_up_window_ms: i64,
    /// Largest jitter.
    pub jitter_ms: i64,
}

/// How a fire went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FireOutcome {
    /// A run started (or, for a repeated fire, had started).
    Started,
    /// The overlap policy skipped it.
    Skipped,
    /// Kept until the previous run ends (BUFFER_ONE).
    Buffered,
    /// No run could start (see the schedule's last error).
    Failed,
}

impl FireOutcome {
    fn metric(self) -> &'static str {
        match self {
            FireOutcome::Started => "started",
            FireOutcome::Skipped => "skipped",
            FireOutcome::Buffered => "buffered",
            FireOutcome::Failed => "failed",
        }
    }
}

/// One fire, as a schedule remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fire {
    /// The fire time (the spec's, before jitter).
    pub fire_time: DateTime<Utc>,
    /// The run it started.
    pub run_id: Option<Uuid>,
    /// What happened.
    pub outcome: FireOutcome,
}

/// A schedule with what it will do.
#[derive(Debug, Clone)]
pub struct ScheduleView {
    /// The row.
    pub row: ScheduleRow,
    /// Its spec.
    pub spec: ScheduleSpec,
    /// Its action.
    pub action: ScheduleAction,
    /// Its overlap policy.
    pub overlap: Overlap,
    /// The last fires, newest first.
    pub recent_fires: Vec<Fire>,
    /// The next fire times (none while paused).
    pub next_fires: Vec<DateTime<Utc>>,
}

/// How the scheduler loop runs.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// How long the loop sleeps when nothing was due: the most a fire
    /// starts after its time (plus a transaction).
    pub poll_interval: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(200),
        }
    }
}

fn field(field: &str, description: impl Into<String>) -> CoordinatorError {
    CoordinatorError::InvalidArgument(vec![FieldProblem {
        field: field.to_owned(),
        description: description.into(),
    }])
}

fn not_found(id: &str) -> CoordinatorError {
    CoordinatorError::ScheduleNotFound(id.to_owned())
}

fn corrupt(what: &str, error: impl std::fmt::Display) -> CoordinatorError {
    CoordinatorError::Corrupt(format!("schedule {what}: {error}"))
}

fn whole_seconds(time: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(time.timestamp(), 0).unwrap_or(time)
}

/// The next fire after `after` and when it is due (with its jitter).
/// The stored definition of a create or update request.
fn definition<'a>(
    request: &'a ScheduleRequest,
    spec: &'a Json,
    action: &'a Json,
    (next_fire_at, next_due_at): (Option<DateTime<Utc>>, Option<DateTime<Utc>>),
) -> ScheduleDefinition<'a> {
    ScheduleDefinition {
        namespace: &request.namespace,
        id: &request.id,
        spec,
        action,
        overlap: request.overlap.as_str(),
        catch_up_window_ms: request.catch_up_window_ms,
        jitter_ms: request.jitter_ms,
        next_fire_at,
        next_due_at,
    }
}

/// A schedule's next fire time and when it is due (with its jitter).
type NextAndDue = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

fn next_and_due(
    timetable: &Timetable,
    namespace: &str,
    id: &str,
    jitter_ms: i64,
    after: DateTime<Utc>,
) -> (Option<DateTime<Utc>>, Option<DateTime<Utc>>) {
    let next = timetable.next_after(after);
    (next, next.map(|at| due_at(namespace, id, jitter_ms, at)))
}

fn due_at(namespace: &str, id: &str, jitter_ms: i64, at: DateTime<Utc>) -> DateTime<Utc> {
    at + chrono::Duration::milliseconds(plan::jitter_ms(namespace, id, at, jitter_ms))
}

fn stored_spec(row: &ScheduleRow) -> Result<ScheduleSpec, CoordinatorError> {
    serde_json::from_value(row.spec.clone()).map_err(|e| corrupt("spec", e))
}

fn view(row: ScheduleRow) -> Result<ScheduleView, CoordinatorError> {
    let spec = stored_spec(&row)?;
    let action: ScheduleAction =
        serde_json::from_value(row.action.clone()).map_err(|e| corrupt("action", e))?;
    let overlap = Overlap::parse(&row.overlap).ok_or_else(|| corrupt("overlap", &row.overlap))?;
    let recent_fires: Vec<Fire> =
        serde_json::from_value(row.recent_fires.clone()).map_err(|e| corrupt("fires", e))?;
    let next_fires = match (row.paused, row.next_fire_at) {
        (false, Some(next)) => {
            let timetable = Timetable::new(&spec).map_err(|p| corrupt("spec", p.description))?;
            std::iter::once(next)
                .chain(timetable.upcoming(next, NEXT_FIRES - 1))
                .collect()
        }
        _ => Vec::new(),
    };
    Ok(ScheduleView {
        row,
        spec,
        action,
        overlap,
        recent_fires,
        next_fires,
    })
}

impl Coordinator {
    /// Checks a definition (spec, bounds, the workflow and its input
    /// schema) and returns its stored spec, anchored at `now`, and its
    /// next fire and its due time after `now`.
    async fn check_schedule(
        &self,
        request: &ScheduleRequest,
        now: DateTime<Utc>,
    ) -> Result<(ScheduleSpec, NextAndDue), CoordinatorError> {
        let spec = match &request.spec {
            SpecRequest::Cron {
                expression,
                time_zone,
            } => ScheduleSpec::Cron {
                expression: expression.clone(),
                time_zone: if time_zone.is_empty() {
                    "UTC".to_owned()
                } else {
                    time_zone.clone()
                },
            },
            SpecRequest::Interval { every_secs } => ScheduleSpec::Interval {
                every_secs: *every_secs,
                anchor: whole_seconds(now),
            },
        };
        let (next, shortest_gap) = self
            .timetable_of(&request.namespace, spec.clone(), now, request.jitter_ms > 0)
            .await?;
        if !(1000..=plan::MAX_CATCH_UP_WINDOW_MS).contains(&request.catch_up_window_ms) {
            return Err(field(
                "catch_up_window",
                "must be 1 s to 7 days (unset: 60 s)",
            ));
        }
        if !(0..=plan::MAX_JITTER_MS).contains(&request.jitter_ms) {
            return Err(field("jitter", "must be 0 to 24 hours"));
        }
        if let Some(gap) = shortest_gap
            && request.jitter_ms >= gap.num_milliseconds()
        {
            return Err(field(
                "jitter",
                format!(
                    "must be shorter than the time between two fires ({} s)",
                    gap.num_seconds()
                ),
            ));
        }
        for key in request.action.labels.keys() {
            if key.starts_with(plan::RESERVED_LABEL_PREFIX) {
                return Err(field(
                    &format!("action.labels[{key:?}]"),
                    "keys starting with `composer.` are set by the server",
                ));
            }
        }
        // the workflow exists and takes the input (as a StartRun would)
        let start = self.fire_request(&request.namespace, &request.id, &request.action, now);
        self.workflow_to_start(&start, true)
            .await
            .map_err(|error| match error {
                CoordinatorError::InvalidArgument(problems) => CoordinatorError::InvalidArgument(
                    problems
                        .into_iter()
                        .map(|p| FieldProblem {
                            field: format!("action.{}", p.field),
                            description: p.description,
                        })
                        .collect(),
                ),
                other => other,
            })?;
        self.check_payload("action.input", &request.action.input)?;
        let due = due_at(&request.namespace, &request.id, request.jitter_ms, next);
        Ok((spec, (Some(next), Some(due))))
    }

    /// Checks `spec` on the CPU pool (decision 0036): it parses and fires
    /// after `now` within the search bound. Returns that next fire and,
    /// when `with_gap`, the shortest time between its next fires (for the
    /// jitter check).
    async fn timetable_of(
        &self,
        namespace: &str,
        spec: ScheduleSpec,
        now: DateTime<Utc>,
        with_gap: bool,
    ) -> Result<(DateTime<Utc>, Option<chrono::Duration>), CoordinatorError> {
        self.workflows
            .cpu_pool()
            .run(
                namespace,
                crate::limits::cpu_pool::Admission::RefuseWhenFull,
                move || {
                    let timetable =
                        Timetable::new(&spec).map_err(|p| field(p.field, p.description))?;
                    let Some(next) = timetable.next_after(now) else {
                        return Err(field(
                            "spec.cron",
                            format!(
                                "never fires: no time in the next {} years matches it, and the \
                             calendar repeats after that (e.g. February 30, or day 31 in \
                             months of 30 days)",
                                plan::SEARCH_YEARS
                            ),
                        ));
                    };
                    let gap = with_gap.then(|| timetable.shortest_gap(now, 20)).flatten();
                    Ok((next, gap))
                },
            )
            .await?
    }

    /// The views of `rows`, their next fires computed on the CPU pool.
    async fn views(
        &self,
        namespace: &str,
        rows: Vec<ScheduleRow>,
    ) -> Result<Vec<ScheduleView>, CoordinatorError> {
        self.workflows
            .cpu_pool()
            .run(
                namespace,
                crate::limits::cpu_pool::Admission::RefuseWhenFull,
                move || rows.into_iter().map(view).collect(),
            )
            .await?
    }

    /// The view of `row`, its next fires computed on the CPU pool.
    async fn view_of(
        &self,
        namespace: &str,
        row: ScheduleRow,
    ) -> Result<ScheduleView, CoordinatorError> {
        let mut views = self.views(namespace, vec![row]).await?;
        views
            .pop()
            .ok_or_else(|| corrupt("view", "a row gave no view"))
    }

    /// The StartRun of a fire of `id` at `at`.
    fn fire_request(
        &self,
        namespace: &str,
        id: &str,
        action: &ScheduleAction,
        at: DateTime<Utc>,
    ) -> StartRun {
        let mut labels = action.labels.clone();
        labels.insert(plan::SCHEDULE_LABEL.to_owned(), id.to_owned());
        labels.insert(plan::FIRE_TIME_LABEL.to_owned(), plan::fire_time_text(at));
        StartRun {
            namespace: namespace.to_owned(),
            workflow_name: action.workflow_name.clone(),
            version: action.version,
            input: action.input.clone(),
            idempotency_key: Some(plan::fire_key(id, at)),
            labels: json!(labels),
            actor: format!("schedule:{id}"),
            traceparent: None,
            priority: crate::dispatch::streams::DEFAULT_PRIORITY,
        }
    }

    /// Creates a schedule. ALREADY_EXISTS for a taken id; over the
    /// namespace's `schedules` quota, QuotaExceeded.
    pub async fn create_schedule(
        &self,
        request: ScheduleRequest,
        paused: bool,
        note: &str,
    ) -> Result<ScheduleView, CoordinatorError> {
        let now = Utc::now();
        let (spec, (next_fire_at, next_due_at)) = self.check_schedule(&request, now).await?;
        let spec = serde_json::to_value(&spec)?;
        let action = serde_json::to_value(&request.action)?;
        let quotas = self.quotas().of(&request.namespace);
        let mut tx = self.store.begin().await?;
        let inserted = schedules::insert_schedule(
            &mut tx,
            &definition(&request, &spec, &action, (next_fire_at, next_due_at)),
            paused,
            note,
            i64::from(quotas.schedules),
        )
        .await?;
        match inserted {
            Inserted::Created(row) => {
                tx.commit().await?;
                self.view_of(&request.namespace, *row).await
            }
            Inserted::Exists => Err(CoordinatorError::ScheduleExists(request.id)),
            Inserted::Full => Err(crate::limits::quotas::QuotaExceeded::counted(
                crate::limits::quotas::Quota::Schedules,
                crate::limits::quotas::Subject::Namespace(request.namespace),
                &quotas,
                // a place frees only when a schedule is deleted
                Duration::from_secs(60),
            )
            .into()),
        }
    }

    /// A schedule of the namespace.
    pub async fn get_schedule(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<ScheduleView, CoordinatorError> {
        let row = schedules::get_schedule(self.store.pool(), namespace, id)
            .await?
            .ok_or_else(|| not_found(id))?;
        self.view_of(namespace, row).await
    }

    /// One page of the namespace's schedules, by id.
    pub async fn list_schedules(
        &self,
        namespace: &str,
        after_id: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ScheduleView>, CoordinatorError> {
        let rows = schedules::list_schedules(self.store.pool(), namespace, after_id, limit).await?;
        self.views(namespace, rows).await
    }

    /// Replaces a schedule's spec, action and policies; its counters and
    /// recent fires stay, its next fire is computed anew from now, and a
    /// buffered fire is dropped.
    pub async fn update_schedule(
        &self,
        request: ScheduleRequest,
    ) -> Result<ScheduleView, CoordinatorError> {
        let now = Utc::now();
        let (spec, (next_fire_at, next_due_at)) = self.check_schedule(&request, now).await?;
        let mut tx = self.store.begin().await?;
        schedules::lock_schedule(&mut tx, &request.namespace, &request.id)
            .await?
            .ok_or_else(|| not_found(&request.id))?;
        let spec = serde_json::to_value(&spec)?;
        let action = serde_json::to_value(&request.action)?;
        let row = schedules::update_definition(
            &mut tx,
            &definition(&request, &spec, &action, (next_fire_at, next_due_at)),
        )
        .await?;
        tx.commit().await?;
        self.view_of(&request.namespace, row).await
    }

    /// Pauses (`paused`) or resumes a schedule, with a note. A resume
    /// fires next at the first fire time after now: fires that fell in the
    /// pause are neither started nor counted as missed.
    pub async fn pause_schedule(
        &self,
        namespace: &str,
        id: &str,
        paused: bool,
        note: &str,
    ) -> Result<ScheduleView, CoordinatorError> {
        let mut tx = self.store.begin().await?;
        let row = schedules::lock_schedule(&mut tx, namespace, id)
            .await?
            .ok_or_else(|| not_found(id))?;
        let next = if !paused && row.paused {
            let now = schedules::database_now(&mut tx).await?;
            let timetable =
                Timetable::new(&stored_spec(&row)?).map_err(|p| corrupt("spec", p.description))?;
            Some(next_and_due(&timetable, namespace, id, row.jitter_ms, now))
        } else {
            None
        };
        let row = schedules::set_paused(&mut tx, namespace, id, paused, note, next).await?;
        tx.commit().await?;
        self.view_of(namespace, row).await
    }

    /// Deletes a schedule; the runs it started stay.
    pub async fn delete_schedule(&self, namespace: &str, id: &str) -> Result<(), CoordinatorError> {
        if schedules::delete_schedule(self.store.pool(), namespace, id).await? {
            Ok(())
        } else {
            Err(not_found(id))
        }
    }

    /// Fires a schedule now, paused or not, under its overlap policy: the
    /// fire time is now (milliseconds), so its run's key is new.
    pub async fn trigger_schedule(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Fire, CoordinatorError> {
        let mut tx = self.store.begin().await?;
        let row = schedules::lock_schedule(&mut tx, namespace, id)
            .await?
            .ok_or_else(|| not_found(id))?;
        let now = schedules::database_now(&mut tx).await?;
        let at = DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now);
        let mut pass = Pass::new(&row)?;
        let fire = self.fire_one(&mut tx, &row, &mut pass, at).await?;
        schedules::save_fire_state(&mut tx, namespace, id, &pass.state).await?;
        tx.commit().await?;
        pass.announce(self, namespace).await;
        Ok(fire)
    }

    /// Claims one due schedule and fires it; false when none was due.
    pub async fn fire_due_schedule(&self) -> Result<bool, CoordinatorError> {
        let mut tx = self.store.begin().await?;
        let Some((row, now)) = schedules::claim_due_schedule(&mut tx).await? else {
            tx.rollback().await?;
            return Ok(false);
        };
        let mut pass = Pass::new(&row)?;
        let timetable =
            Timetable::new(&stored_spec(&row)?).map_err(|p| corrupt("spec", p.description))?;
        // a buffered fire whose previous run ended starts first
        if let Some(buffered) = pass.state.buffered_fire_at
            && !self.previous_running(&mut tx, &pass).await?
        {
            pass.state.buffered_fire_at = None;
            self.start_fire(&mut tx, &row, &mut pass, buffered).await?;
        }
        if let (Some(next), Some(due)) = (row.next_fire_at, row.next_due_at)
            && due <= now
        {
            let window = chrono::Duration::milliseconds(row.catch_up_window_ms);
            let plan = plan::due_fires(&timetable, next, now, window, MAX_FIRES_PER_PASS);
            pass.state.missed += i64::try_from(plan.missed).unwrap_or(i64::MAX);
            let mut next = plan.next;
            for (i, at) in plan.fire.iter().enumerate() {
                // a later fire's own jitter may not have passed yet
                if i > 0 && due_at(&row.namespace, &row.id, row.jitter_ms, *at) > now {
                    next = Some(*at);
                    break;
                }
                self.fire_one(&mut tx, &row, &mut pass, *at).await?;
            }
            pass.state.next_fire_at = next;
            pass.state.next_due_at =
                next.map(|at| due_at(&row.namespace, &row.id, row.jitter_ms, at));
        }
        schedules::save_fire_state(&mut tx, &row.namespace, &row.id, &pass.state).await?;
        tx.commit().await?;
        pass.announce(self, &row.namespace).await;
        Ok(true)
    }

    async fn previous_running(
        &self,
        conn: &mut PgConnection,
        pass: &Pass,
    ) -> Result<bool, CoordinatorError> {
        let Some(run_id) = pass.state.last_run_id else {
            return Ok(false);
        };
        Ok(schedules::run_status(conn, run_id)
            .await?
            .is_some_and(|status| !is_final(&status)))
    }

    /// One fire under the overlap policy.
    async fn fire_one(
        &self,
        conn: &mut PgConnection,
        row: &ScheduleRow,
        pass: &mut Pass,
        at: DateTime<Utc>,
    ) -> Result<Fire, CoordinatorError> {
        let running = match pass.overlap {
            Overlap::AllowAll => false,
            _ => self.previous_running(conn, pass).await?,
        };
        if running {
            match pass.overlap {
                Overlap::Skip | Overlap::AllowAll => {
                    return Ok(pass.record(at, None, FireOutcome::Skipped));
                }
                Overlap::BufferOne => {
                    if pass.state.buffered_fire_at.is_none() {
                        pass.state.buffered_fire_at = Some(at);
                        return Ok(pass.record(at, None, FireOutcome::Buffered));
                    }
                    return Ok(pass.record(at, None, FireOutcome::Skipped));
                }
                Overlap::CancelPrevious => {
                    if let Some(previous) = pass.state.last_run_id {
                        self.cancel_previous(conn, row, pass, previous).await?;
                    }
                }
            }
        }
        self.start_fire(conn, row, pass, at).await
    }

    async fn cancel_previous(
        &self,
        conn: &mut PgConnection,
        row: &ScheduleRow,
        pass: &mut Pass,
        previous: Uuid,
    ) -> Result<(), CoordinatorError> {
        let Some(run) = runs::lock_run(conn, Some(&row.namespace), previous).await? else {
            return Ok(());
        };
        if is_final(&run.status) {
            return Ok(());
        }
        let actor = format!("schedule:{}", row.id);
        let reason = format!(
            "schedule {}: a new fire cancels the previous run (CANCEL_PREVIOUS)",
            row.id
        );
        let mut txn = RunTxn::new(self, run, conn).await?;
        txn.note(
            HistoryEventType::CancelRequestedBy,
            &actor,
            json!({"reason": reason, "by": actor}),
        );
        txn.push(Event::CancelRequested { reason }, &actor);
        pass.applied.push(txn.finish(conn).await?);
        Ok(())
    }

    /// Starts the run of a fire in the pass's transaction. A fire whose
    /// run cannot start (the workflow is gone, its latest version refuses
    /// the input) is recorded as failed with the reason; a database error
    /// fails the whole pass.
    async fn start_fire(
        &self,
        conn: &mut PgConnection,
        row: &ScheduleRow,
        pass: &mut Pass,
        at: DateTime<Utc>,
    ) -> Result<Fire, CoordinatorError> {
        let request = self.fire_request(&row.namespace, &row.id, &pass.action, at);
        match self.start_run_on(conn, &request).await {
            Ok((run_id, applied)) => {
                pass.applied.extend(applied);
                pass.state.last_run_id = Some(run_id);
                pass.state.last_error = None;
                Ok(pass.record(at, Some(run_id), FireOutcome::Started))
            }
            Err(
                error @ (CoordinatorError::WorkflowNotFound { .. }
                | CoordinatorError::InvalidArgument(_)
                | CoordinatorError::PayloadTooLarge { .. }
                | CoordinatorError::QuotaExceeded(_)),
            ) => {
                tracing::warn!(schedule = %row.id, namespace = %row.namespace, %error, "schedule fire started no run");
                pass.state.last_error = Some(error.to_string());
                Ok(pass.record(at, None, FireOutcome::Failed))
            }
            Err(error) => Err(error),
        }
    }

    /// Fires due schedules until `shutdown` flips: a schedule per
    /// transaction, as long as some are due, then a sleep of
    /// `poll_interval`.
    pub async fn run_scheduler_loop(
        self,
        config: SchedulerConfig,
        mut shutdown: watch::Receiver<bool>,
    ) {
        while !*shutdown.borrow() {
            let fired = match self.fire_due_schedule().await {
                Ok(fired) => fired,
                Err(error) => {
                    tracing::warn!(%error, "scheduler pass");
                    false
                }
            };
            if !fired {
                tokio::select! {
                    () = tokio::time::sleep(config.poll_interval) => {},
                    _ = shutdown.changed() => {},
                }
            }
        }
    }
}

/// What one transaction does to one schedule.
struct Pass {
    overlap: Overlap,
    action: ScheduleAction,
    state: FireState,
    recent: Vec<Fire>,
    counts: [u64; 4],
    applied: Vec<Applied>,
}

impl Pass {
    fn new(row: &ScheduleRow) -> Result<Pass, CoordinatorError> {
        let view = view(row.clone())?;
        Ok(Pass {
            overlap: view.overlap,
            action: view.action,
            recent: view.recent_fires,
            state: FireState {
                next_fire_at: row.next_fire_at,
                next_due_at: row.next_due_at,
                buffered_fire_at: row.buffered_fire_at,
                last_run_id: row.last_run_id,
                recent_fires: row.recent_fires.clone(),
                fired: 0,
                skipped: 0,
                missed: 0,
                last_error: row.last_error.clone(),
            },
            counts: [0; 4],
            applied: Vec::new(),
        })
    }

    fn record(&mut self, at: DateTime<Utc>, run_id: Option<Uuid>, outcome: FireOutcome) -> Fire {
        match outcome {
            FireOutcome::Started => self.state.fired += 1,
            FireOutcome::Skipped => self.state.skipped += 1,
            FireOutcome::Buffered | FireOutcome::Failed => {}
        }
        self.counts[outcome as usize] += 1;
        let fire = Fire {
            fire_time: at,
            run_id,
            outcome,
        };
        self.recent.insert(0, fire.clone());
        self.recent.truncate(RECENT_FIRES);
        self.state.recent_fires = json!(self.recent);
        fire
    }

    /// After the commit: announce the runs and count the fires.
    async fn announce(mut self, coordinator: &Coordinator, namespace: &str) {
        for mut applied in std::mem::take(&mut self.applied) {
            coordinator.announce(&mut applied).await;
        }
        for outcome in [
            FireOutcome::Started,
            FireOutcome::Skipped,
            FireOutcome::Buffered,
            FireOutcome::Failed,
        ] {
            crate::observe::metrics::schedule_fires(
                namespace,
                outcome.metric(),
                self.counts[outcome as usize],
            );
        }
        crate::observe::metrics::schedule_fires(
            namespace,
            "missed",
            u64::try_from(self.state.missed).unwrap_or(0),
        );
    }
}
