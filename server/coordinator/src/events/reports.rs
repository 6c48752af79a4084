//! The worker side of a task's life: heartbeats and reports, fenced by the
//! lease `(task_id, attempt, lease_token)`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use composer_engine::{Event, NodeKey};
use composer_store::{
    runs,
    tasks::{self, HeartbeatOutcome, LeasedTask, ReportCheck, TaskScope},
};
use serde_json::Value as Json;
use tracing::Instrument;
use uuid::Uuid;

use crate::{
    Coordinator,
    dispatch::answer_sent::AnswerSent,
    error::CoordinatorError,
    events::apply::{RunTxn, seed},
};

/// How a worker ends an attempt.
#[derive(Debug, Clone)]
pub enum TaskReport {
    /// Success, with the output.
    Completed {
        /// The output.
        output: Json,
    },
    /// Failure.
    Failed {
        /// Machine-readable code.
        code: String,
        /// Message.
        message: String,
        /// False: final at once.
        retryable: bool,
        /// Structured details (a traceback).
        details: Option<Json>,
    },
}

/// Who reports: the actor the history names, the traceparent of the
/// worker's span that sent the report, if any, and when its answer is
/// written.
#[derive(Debug)]
pub struct Reporter<'a> {
    /// `worker:<subject>`, as the history records it.
    pub actor: &'a str,
    /// The report's `traceparent` header (read only when traces are on).
    pub traceparent: Option<&'a str>,
    /// Resolves once the transport has written the answer: a task the
    /// report's transaction hands to a poll goes out after it (None: the
    /// answer is out when [`Coordinator::report`] returns).
    pub answer_sent: Option<AnswerSent>,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatAnswer {
    /// The lease's new deadline (None once cancelled).
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// True when the run was cancelled.
    pub cancel_requested: bool,
    /// Why, when the run was cancelled with a reason; empty otherwise.
    pub cancel_reason: String,
}

fn parse_ids(
    task_id: &str,
    lease_token: &str,
    attempt: i32,
) -> Result<(Uuid, Uuid), CoordinatorError> {
    let task =
        Uuid::parse_str(task_id).map_err(|_| CoordinatorError::TaskNotFound(task_id.to_owned()))?;
    let token = Uuid::parse_str(lease_token).map_err(|_| CoordinatorError::LeaseLost {
        task_id: task_id.to_owned(),
        attempt,
    })?;
    Ok((task, token))
}

impl Coordinator {
    /// Extends a lease; says whether the run was cancelled.
    pub async fn heartbeat(
        &self,
        scope: &TaskScope,
        task_id: &str,
        attempt: i32,
        lease_token: &str,
    ) -> Result<HeartbeatAnswer, CoordinatorError> {
        let (task, token) = parse_ids(task_id, lease_token, attempt)?;
        match tasks::heartbeat(self.store.pool(), scope, task, attempt, token).await? {
            HeartbeatOutcome::Extended(until) => Ok(HeartbeatAnswer {
                lease_expires_at: Some(until),
                cancel_requested: false,
                cancel_reason: String::new(),
            }),
            HeartbeatOutcome::Cancelled(reason) => Ok(HeartbeatAnswer {
                lease_expires_at: None,
                cancel_requested: true,
                cancel_reason: reason.unwrap_or_default(),
            }),
            HeartbeatOutcome::Lost => self.lost_or_unknown(scope, task, attempt).await,
        }
    }

    async fn lost_or_unknown<T>(
        &self,
        scope: &TaskScope,
        task: Uuid,
        attempt: i32,
    ) -> Result<T, CoordinatorError> {
        match tasks::task_owner(self.store.pool(), scope, task).await? {
            None => Err(CoordinatorError::TaskNotFound(task.to_string())),
            Some(_) => Err(CoordinatorError::LeaseLost {
                task_id: task.to_string(),
                attempt,
            }),
        }
    }

    /// Applies a worker's report. Stale lease: LeaseLost, nothing changes. A
    /// repeat of an applied report: Ok, nothing changes. A task outside the
    /// caller's scope: TaskNotFound, nothing changes.
    pub async fn report(
        &self,
        scope: &TaskScope,
        task_id: &str,
        attempt: i32,
        lease_token: &str,
        report: TaskReport,
        reporter: Reporter<'_>,
    ) -> Result<(), CoordinatorError> {
        let (task, token) = parse_ids(task_id, lease_token, attempt)?;
        let report = match report {
            TaskReport::Completed { output } => TaskReport::Completed {
                output: self
                    .accept_payload(&scope.namespace, "output", output)
                    .await?,
            },
            failed => failed,
        };
        let (outcome, span_name) = match report {
            TaskReport::Completed { .. } => (tasks::status::COMPLETED, "CompleteTask"),
            TaskReport::Failed { .. } => (tasks::status::FAILED, "FailTask"),
        };
        let lease = Lease {
            task,
            attempt,
            token,
            outcome,
        };
        let hint = self.lease_hints.take(task);
        match hint.as_ref().and_then(|h| h.traceparent.as_deref()) {
            Some(lease_trace) => {
                let span = crate::observe::traces::report(
                    span_name,
                    reporter.traceparent,
                    Some(lease_trace),
                );
                self.report_with_hint(scope, lease, hint, report, reporter, span_name)
                    .instrument(span)
                    .await
            }
            None => {
                self.report_with_hint(scope, lease, hint, report, reporter, span_name)
                    .await
            }
        }
    }

    /// [`report`](Coordinator::report) once the lease hint, if any, is taken.
    async fn report_with_hint(
        &self,
        scope: &TaskScope,
        lease: Lease,
        hint: Option<LeaseHint>,
        report: TaskReport,
        reporter: Reporter<'_>,
        span_name: &'static str,
    ) -> Result<(), CoordinatorError> {
        let Reporter {
            actor,
            traceparent,
            answer_sent,
        } = reporter;
        let trace = ReportTrace {
            name: span_name,
            worker: traceparent,
        };
        let (task, outcome) = (lease.task, lease.outcome);
        let reported = match hint {
            Some(hint) if scope.covers(&hint.namespace, &hint.queue) => {
                let queue = hint.queue.clone();
                self.report_leased_here(scope, lease, hint, report, actor, answer_sent)
                    .await
                    .map(|()| queue)
            }
            Some(_) => Err(CoordinatorError::TaskNotFound(task.to_string())),
            None => {
                self.report_by_task(scope, lease, report, actor, trace)
                    .await
            }
        };
        let queue = reported?;
        crate::observe::metrics::task_reported(&scope.namespace, &queue, outcome);
        Ok(())
    }

    /// A report of a task this server leased. Reports of one run that
    /// arrive while one of them is being applied are applied together, in
    /// one transaction (a wide fan-in would otherwise queue one transaction
    /// per branch on the run's lock): the first report of a run starts a
    /// task that applies batches until the run's queue is empty; every
    /// report waits for its own answer.
    async fn report_leased_here(
        &self,
        scope: &TaskScope,
        lease: Lease,
        hint: LeaseHint,
        report: TaskReport,
        actor: &str,
        answer_sent: Option<AnswerSent>,
    ) -> Result<(), CoordinatorError> {
        let event = task_event(&hint.node_key, lease.attempt, report)?;
        let (answer, answered) = tokio::sync::oneshot::channel();
        let queue = (hint.run_id, scope.clone());
        let queued = QueuedReport {
            lease,
            hint,
            event,
            actor: actor.to_owned(),
            answer,
            answer_sent,
        };
        if self.report_queues.push(queue.clone(), queued) {
            let coordinator = self.clone();
            // its own task: a caller that goes away must not strand the queue
            tokio::spawn(async move { coordinator.drain_reports(queue).await });
        }
        answered.await.unwrap_or_else(|_| {
            Err(CoordinatorError::Corrupt(
                "the report was dropped unanswered".to_owned(),
            ))
        })
    }

    /// Applies a run's queued reports, batch after batch, until none is
    /// left: each batch in the next group transaction (decision 0023), or
    /// in its own when group commit is off.
    async fn drain_reports(&self, queue: QueueKey) {
        while let Some(batch) = self.report_queues.next_batch(&queue) {
            if !self.group_commit.is_on() {
                self.reports_alone(&queue, batch).await;
                continue;
            }
            // the next batch of this run waits for this one's commit
            self.reports_grouped(&queue, batch).await;
        }
    }

    /// A batch of one run's reports in a transaction of its own; if that
    /// fails, each report alone.
    pub(crate) async fn reports_alone(&self, queue: &QueueKey, batch: Vec<QueuedReport>) {
        let answers = match self.apply_reports(queue, &batch).await {
            Ok((answers, mut applied, handed)) => {
                // answer before the next tasks go out: a worker never
                // sees a task of a node whose previous step it has not
                // yet been told is done (MAP concurrency, as workers
                // count it)
                let sent = batch
                    .into_iter()
                    .zip(answers)
                    .filter_map(|(queued, answer)| queued.answer_with(answer))
                    .collect();
                self.send_handed(handed, sent);
                self.announce(&mut applied).await;
                return;
            }
            Err(error) => {
                tracing::warn!(run_id = %queue.0, %error, "report batch failed; one by one");
                let mut answers = Vec::with_capacity(batch.len());
                for queued in &batch {
                    answers.push(
                        self.report_elsewhere(
                            &queue.1,
                            queued.lease,
                            queued.event.clone(),
                            &queued.actor,
                        )
                        .await,
                    );
                }
                answers
            }
        };
        for (queued, answer) in batch.into_iter().zip(answers) {
            queued.answer_with(answer);
        }
    }

    /// [`apply_reports_on`](Coordinator::apply_reports_on) in a transaction
    /// of its own, with the tasks it arms for a poll waiting here leased to
    /// it before the commit.
    async fn apply_reports(
        &self,
        queue: &QueueKey,
        batch: &[QueuedReport],
    ) -> Result<
        (
            Vec<ReportAnswer>,
            crate::events::apply::Applied,
            Option<crate::dispatch::hand_off::Handed>,
        ),
        CoordinatorError,
    > {
        let mut tx = self.store.begin().await?;
        let (answers, mut applied) = self.apply_reports_on(&mut tx, queue, batch).await?;
        let handed = self.hand_off(&mut tx, &mut [&mut applied.outbox]).await?;
        tx.commit().await?;
        Ok((answers, applied, handed))
    }

    /// A batch of one run's reports on `conn`, inside the caller's
    /// transaction: lock, fence each and load (one statement), apply the
    /// ones that held, write; the caller commits. Returns each report's
    /// answer and what to publish; Err: the caller must undo what it wrote.
    pub(crate) async fn apply_reports_on(
        &self,
        conn: &mut sqlx::PgConnection,
        queue: &QueueKey,
        batch: &[QueuedReport],
    ) -> Result<(Vec<ReportAnswer>, crate::events::apply::Applied), CoordinatorError> {
        let plan = self.plan_reports(queue, batch).await?;
        let found = plan.lock_alone(&mut *conn).await?;
        self.apply_fenced_reports(conn, batch, &plan, found).await
    }

    /// What the lock statement needs for a batch of one run's reports: its
    /// leases, and the node rows its events need first, as far as the
    /// workflow tells (compensation keys depend on the run record; decide
    /// asks for them).
    pub(crate) async fn plan_reports(
        &self,
        queue: &QueueKey,
        batch: &[QueuedReport],
    ) -> Result<ReportPlan, CoordinatorError> {
        let first = &batch[0].hint;
        let workflow = self
            .workflows
            .get(
                &self.store,
                &first.namespace,
                &first.workflow_name,
                Some(first.workflow_version),
            )
            .await?;
        let blank = composer_engine::RunState::new(
            "",
            &first.workflow_name,
            u32::try_from(first.workflow_version).unwrap_or_default(),
            Json::Null,
        );
        let mut keys: Vec<String> = batch
            .iter()
            .flat_map(|queued| composer_engine::prefetch(&workflow.compiled, &blank, &queued.event))
            .map(|key| key.to_string())
            .collect();
        keys.sort();
        keys.dedup();
        Ok(ReportPlan {
            run_id: queue.0,
            namespace: queue.1.namespace.clone(),
            keys,
            leases: batch
                .iter()
                .map(|queued| queued.lease.as_report_lease())
                .collect(),
        })
    }

    /// The rest of a batch once its run is locked and its leases fenced
    /// (`found`; None: no such run): apply the reports that held, write.
    pub(crate) async fn apply_fenced_reports(
        &self,
        conn: &mut sqlx::PgConnection,
        batch: &[QueuedReport],
        plan: &ReportPlan,
        found: Option<runs::FencedReports>,
    ) -> Result<(Vec<ReportAnswer>, crate::events::apply::Applied), CoordinatorError> {
        let (answers, txn) = self.fenced_txn(conn, batch, plan, found).await?;
        let applied = match txn {
            Some(txn) => txn.finish(conn).await?,
            None => crate::events::apply::Applied::default(),
        };
        Ok((answers, applied))
    }

    /// A batch's answers, and the run's events queued in a [`RunTxn`] for
    /// the reports that held (None: no such run, every report refused).
    pub(crate) async fn fenced_txn(
        &self,
        conn: &mut sqlx::PgConnection,
        batch: &[QueuedReport],
        plan: &ReportPlan,
        found: Option<runs::FencedReports>,
    ) -> Result<(Vec<ReportAnswer>, Option<RunTxn<'_>>), CoordinatorError> {
        let Some(found) = found else {
            let answers = batch
                .iter()
                .map(|queued| {
                    Err(CoordinatorError::TaskNotFound(
                        queued.lease.task.to_string(),
                    ))
                })
                .collect();
            return Ok((answers, None));
        };
        let mut answers = Vec::with_capacity(batch.len());
        let mut txn = RunTxn::new(self, found.run, &mut *conn).await?;
        if found.consistent {
            txn.preload(&plan.keys, found.nodes)?;
        }
        for (index, queued) in batch.iter().enumerate() {
            if found.applied.get(index).copied().unwrap_or(false) {
                let holder = found.holders.get(index).cloned().flatten();
                txn.push_lease_end(
                    queued.event.clone(),
                    &queued.actor,
                    holder.unwrap_or_default(),
                );
                answers.push(Ok(()));
                continue;
            }
            let repeat = if found.consistent {
                found.repeat.get(index).copied().unwrap_or(false)
            } else {
                let lease = queued.lease;
                tasks::reported_before(
                    &mut *conn,
                    (lease.task, lease.attempt, lease.token),
                    lease.outcome,
                )
                .await?
            };
            answers.push(queued.lease.refused(repeat));
        }
        Ok((answers, Some(txn)))
    }

    /// A report of a task leased by another server (or before a restart):
    /// the run and node come from the task row.
    async fn report_by_task(
        &self,
        scope: &TaskScope,
        lease: Lease,
        report: TaskReport,
        actor: &str,
        trace: ReportTrace<'_>,
    ) -> Result<String, CoordinatorError> {
        let mut tx = self.store.begin().await?;
        let Some((run, node_key, queue)) =
            runs::lock_run_of_task(&mut tx, scope, lease.task).await?
        else {
            return Err(CoordinatorError::TaskNotFound(lease.task.to_string()));
        };
        let event = task_event(&node_key, lease.attempt, report)?;
        // not leased here: the run's root stands for the lease span
        let span =
            crate::observe::traces::report(trace.name, trace.worker, run.traceparent.as_deref());
        self.apply_locked_report(tx, run, lease, event, actor)
            .instrument(span)
            .await?;
        Ok(queue)
    }

    /// One report on its own: lock the task's run, then fence and load.
    async fn report_elsewhere(
        &self,
        scope: &TaskScope,
        lease: Lease,
        event: Event,
        actor: &str,
    ) -> Result<(), CoordinatorError> {
        let mut tx = self.store.begin().await?;
        let Some((run, _, _)) = runs::lock_run_of_task(&mut tx, scope, lease.task).await? else {
            return Err(CoordinatorError::TaskNotFound(lease.task.to_string()));
        };
        self.apply_locked_report(tx, run, lease, event, actor).await
    }

    /// With the run locked: fence the report and load what the event needs
    /// (a statement whose snapshot follows the lock), apply, commit.
    async fn apply_locked_report(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
        run: runs::RunRow,
        lease: Lease,
        event: Event,
        actor: &str,
    ) -> Result<(), CoordinatorError> {
        let mut txn = RunTxn::new(self, run, &mut tx).await?;
        let keys = txn.first_keys(&event);
        let (check, holder, rows) = runs::finish_task_and_load(
            &mut tx,
            (lease.task, lease.attempt, lease.token, lease.outcome),
            txn.run_id(),
            &keys,
        )
        .await?;
        match check {
            ReportCheck::Applied => {}
            ReportCheck::Repeat => return lease.refused(true),
            ReportCheck::Stale => return lease.refused(false),
        }
        txn.preload(&keys, rows)?;
        txn.push_lease_end(event, actor, holder.unwrap_or_default());
        txn.commit(tx).await?;
        Ok(())
    }

    /// Remembers which workflow and node the tasks a poll leased belong to,
    /// so their reports to this server take the one-statement path.
    pub fn remember_leases(&self, leased: &[LeasedTask]) {
        self.lease_hints.remember(leased);
    }
}

/// What a report's span needs: its name and the worker's traceparent.
#[derive(Debug, Clone, Copy)]
struct ReportTrace<'a> {
    name: &'static str,
    worker: Option<&'a str>,
}

/// A batch of one run's reports, as the lock statement takes it.
pub(crate) struct ReportPlan {
    run_id: Uuid,
    namespace: String,
    keys: Vec<String>,
    leases: Vec<runs::ReportLease<'static>>,
}

impl ReportPlan {
    pub(crate) fn run_id(&self) -> Uuid {
        self.run_id
    }

    /// Locks, fences and loads this batch's run on its own (None: no such
    /// run), in a statement of its own.
    pub(crate) async fn lock_alone(
        &self,
        conn: &mut sqlx::PgConnection,
    ) -> Result<Option<runs::FencedReports>, composer_store::StoreError> {
        Ok(runs::lock_runs_fence_and_load(conn, &[self.request()])
            .await?
            .pop()
            .flatten())
    }

    pub(crate) fn request(&self) -> runs::RunReports<'_> {
        runs::RunReports {
            run_id: self.run_id,
            namespace: &self.namespace,
            leases: &self.leases,
            keys: &self.keys,
        }
    }
}

/// The lease a report names, and the outcome it reports.
#[derive(Debug, Clone, Copy)]
struct Lease {
    task: Uuid,
    attempt: i32,
    token: Uuid,
    outcome: &'static str,
}

impl Lease {
    fn as_report_lease(&self) -> runs::ReportLease<'static> {
        runs::ReportLease {
            task_id: self.task,
            attempt: self.attempt,
            lease_token: self.token,
            outcome: self.outcome,
        }
    }

    /// The answer to a report whose lease did not hold: OK for a repeat of
    /// what was applied, LEASE_LOST otherwise. Nothing changes either way.
    fn refused(&self, repeat: bool) -> Result<(), CoordinatorError> {
        if repeat {
            return Ok(());
        }
        Err(CoordinatorError::LeaseLost {
            task_id: self.task.to_string(),
            attempt: self.attempt,
        })
    }
}

/// The engine event of a report.
fn task_event(node_key: &str, attempt: i32, report: TaskReport) -> Result<Event, CoordinatorError> {
    let node: NodeKey = node_key
        .parse()
        .map_err(|_| CoordinatorError::Corrupt(format!("task node key {node_key:?}")))?;
    let attempt = u32::try_from(attempt).unwrap_or_default();
    Ok(match report {
        TaskReport::Completed { output } => Event::TaskCompleted {
            node,
            attempt,
            output,
        },
        TaskReport::Failed {
            code,
            message,
            retryable,
            details,
        } => Event::TaskFailed {
            node,
            attempt,
            code,
            message,
            retryable,
            details,
            seed: seed(),
        },
    })
}

/// What a server remembers of a task it leased.
#[derive(Debug, Clone)]
pub(crate) struct LeaseHint {
    run_id: Uuid,
    namespace: String,
    queue: String,
    workflow_name: String,
    workflow_version: i32,
    node_key: String,
    /// The lease span's traceparent (traces on only).
    traceparent: Option<String>,
}

/// The tasks this server leased and not yet heard of, bounded: a hint only
/// saves a round trip, so forgetting (a full map, a restart) is harmless.
#[derive(Default)]
pub(crate) struct LeaseHints {
    hints: std::sync::Mutex<HashMap<Uuid, LeaseHint>>,
}

/// Hints kept at most (about 100 bytes each).
const LEASE_HINTS: usize = 100_000;

impl LeaseHints {
    fn remember(&self, leased: &[LeasedTask]) {
        let mut hints = self.hints.lock().unwrap_or_else(|p| p.into_inner());
        if hints.len() + leased.len() > LEASE_HINTS {
            hints.clear();
        }
        for task in leased {
            hints.insert(
                task.id,
                LeaseHint {
                    run_id: task.run_id,
                    namespace: task.namespace.clone(),
                    queue: task.queue.clone(),
                    workflow_name: task.workflow_name.clone(),
                    workflow_version: task.workflow_version,
                    node_key: task.node_key.clone(),
                    traceparent: task.traceparent.clone(),
                },
            );
        }
    }

    fn take(&self, task: Uuid) -> Option<LeaseHint> {
        self.hints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&task)
    }
}

/// A report's answer: OK, LEASE_LOST or NOT_FOUND.
pub(crate) type ReportAnswer = Result<(), CoordinatorError>;

/// A report waiting for its run's batch.
pub(crate) struct QueuedReport {
    lease: Lease,
    hint: LeaseHint,
    event: Event,
    actor: String,
    answer: tokio::sync::oneshot::Sender<ReportAnswer>,
    /// When the answer is written, if the transport says (see
    /// [`AnswerSent`]).
    answer_sent: Option<AnswerSent>,
}

impl QueuedReport {
    /// Answers the reporter (one gone meanwhile is no matter); returns
    /// what says when that answer is written, for a hand-off to wait on.
    pub(crate) fn answer_with(self, answer: ReportAnswer) -> Option<AnswerSent> {
        let _ = self.answer.send(answer);
        self.answer_sent
    }
}

/// A run and the namespace its reporters gave (None: internal callers).
pub(crate) type QueueKey = (Uuid, TaskScope);

/// Reports per (run, caller's scope) waiting to be applied. A queue
/// present in the map has a task draining it.
#[derive(Default)]
pub(crate) struct ReportQueues {
    queues: std::sync::Mutex<HashMap<QueueKey, std::collections::VecDeque<QueuedReport>>>,
}

/// Reports applied in one transaction, at most.
const REPORT_BATCH: usize = 100;

impl ReportQueues {
    /// Queues a report; true when its queue was idle (the caller starts
    /// the task that drains it).
    fn push(&self, queue: QueueKey, report: QueuedReport) -> bool {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let idle = !queues.contains_key(&queue);
        queues.entry(queue).or_default().push_back(report);
        idle
    }

    /// The next batch (distinct tasks, oldest first; a second report of a
    /// task waits for the next batch); None, and the queue is gone, when
    /// nothing is left.
    fn next_batch(&self, queue: &QueueKey) -> Option<Vec<QueuedReport>> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let waiting = queues.get_mut(queue)?;
        if waiting.is_empty() {
            queues.remove(queue);
            return None;
        }
        let mut batch: Vec<QueuedReport> = Vec::new();
        let mut later = std::collections::VecDeque::new();
        while let Some(report) = waiting.pop_front() {
            if batch.len() >= REPORT_BATCH {
                later.push_back(report);
                later.extend(waiting.drain(..));
                break;
            }
            if batch.iter().any(|b| b.lease.task == report.lease.task) {
                later.push_back(report);
            } else {
                batch.push(report);
            }
        }
        *waiting = later;
        Some(batch)
    }
}
