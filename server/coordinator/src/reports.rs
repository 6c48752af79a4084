//! The worker side of a task's life: heartbeats and reports, fenced by the
//! lease `(task_id, attempt, lease_token)`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use composer_engine::{Event, NodeKey};
use composer_store::{
    runs,
    tasks::{self, HeartbeatOutcome, LeasedTask, ReportCheck},
};
use serde_json::Value as Json;
use uuid::Uuid;

use crate::{
    Coordinator,
    apply::{RunTxn, seed},
    error::CoordinatorError,
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

/// The answer to a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatAnswer {
    /// The lease's new deadline (None once cancelled).
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// True when the run was cancelled.
    pub cancel_requested: bool,
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
        namespace: Option<&str>,
        task_id: &str,
        attempt: i32,
        lease_token: &str,
    ) -> Result<HeartbeatAnswer, CoordinatorError> {
        let (task, token) = parse_ids(task_id, lease_token, attempt)?;
        match tasks::heartbeat(self.store.pool(), namespace, task, attempt, token).await? {
            HeartbeatOutcome::Extended(until) => Ok(HeartbeatAnswer {
                lease_expires_at: Some(until),
                cancel_requested: false,
            }),
            HeartbeatOutcome::Cancelled => Ok(HeartbeatAnswer {
                lease_expires_at: None,
                cancel_requested: true,
            }),
            HeartbeatOutcome::Lost => self.lost_or_unknown(namespace, task, attempt).await,
        }
    }

    async fn lost_or_unknown<T>(
        &self,
        namespace: Option<&str>,
        task: Uuid,
        attempt: i32,
    ) -> Result<T, CoordinatorError> {
        match tasks::task_owner(self.store.pool(), namespace, task).await? {
            None => Err(CoordinatorError::TaskNotFound(task.to_string())),
            Some(_) => Err(CoordinatorError::LeaseLost {
                task_id: task.to_string(),
                attempt,
            }),
        }
    }

    /// Applies a worker's report. Stale lease: LeaseLost, nothing changes. A
    /// repeat of an applied report: Ok, nothing changes.
    pub async fn report(
        &self,
        namespace: Option<&str>,
        task_id: &str,
        attempt: i32,
        lease_token: &str,
        report: TaskReport,
        actor: &str,
    ) -> Result<(), CoordinatorError> {
        let (task, token) = parse_ids(task_id, lease_token, attempt)?;
        if let TaskReport::Completed { output } = &report {
            self.check_payload("output", output)?;
        }
        let outcome = match report {
            TaskReport::Completed { .. } => tasks::status::COMPLETED,
            TaskReport::Failed { .. } => tasks::status::FAILED,
        };
        let lease = Lease {
            task,
            attempt,
            token,
            outcome,
        };
        match self.lease_hints.take(task) {
            Some(hint) => {
                self.report_leased_here(namespace, lease, hint, report, actor)
                    .await
            }
            None => self.report_elsewhere(namespace, lease, report, actor).await,
        }
    }

    /// A report of a task this server leased: it knows the task's workflow
    /// and node, so one statement locks, fences and loads.
    async fn report_leased_here(
        &self,
        namespace: Option<&str>,
        lease: Lease,
        hint: LeaseHint,
        report: TaskReport,
        actor: &str,
    ) -> Result<(), CoordinatorError> {
        let workflow = self
            .workflows
            .get(
                &self.store,
                hint.namespace.as_str(),
                &hint.workflow_name,
                Some(hint.workflow_version),
            )
            .await?;
        let event = task_event(&hint.node_key, lease.attempt, report)?;
        // the keys the event needs first, as far as the workflow tells
        // (compensation keys depend on the run record; decide asks for them)
        let blank = composer_engine::RunState::new(
            "",
            &hint.workflow_name,
            u32::try_from(hint.workflow_version).unwrap_or_default(),
            Json::Null,
        );
        let keys: Vec<String> = composer_engine::prefetch(&workflow.compiled, &blank, &event)
            .iter()
            .map(ToString::to_string)
            .collect();
        let mut tx = self.store.begin().await?;
        let Some(found) = runs::lock_run_fence_and_load(
            &mut tx,
            namespace,
            (lease.task, lease.attempt, lease.token, lease.outcome),
            &keys,
        )
        .await?
        else {
            return Err(CoordinatorError::TaskNotFound(lease.task.to_string()));
        };
        if found.node_key != hint.node_key {
            return Err(CoordinatorError::Corrupt(format!(
                "task {} is node {:?}, leased as {:?}",
                lease.task, found.node_key, hint.node_key
            )));
        }
        if !found.applied {
            let repeat = if found.consistent {
                found.repeat
            } else {
                tasks::reported_before(
                    &mut tx,
                    (lease.task, lease.attempt, lease.token),
                    lease.outcome,
                )
                .await?
            };
            return lease.refused(repeat);
        }
        let mut txn = RunTxn::new(self, found.run).await?;
        if found.consistent {
            txn.preload(&keys, found.nodes)?;
        }
        txn.push(event, actor);
        txn.commit(tx).await?;
        Ok(())
    }

    /// A report of a task leased by another server (or before a restart):
    /// lock the task's run, then (a statement whose snapshot follows the
    /// lock) fence the report and load what the event needs.
    async fn report_elsewhere(
        &self,
        namespace: Option<&str>,
        lease: Lease,
        report: TaskReport,
        actor: &str,
    ) -> Result<(), CoordinatorError> {
        let mut tx = self.store.begin().await?;
        let Some((run, node_key)) = runs::lock_run_of_task(&mut tx, namespace, lease.task).await?
        else {
            return Err(CoordinatorError::TaskNotFound(lease.task.to_string()));
        };
        let event = task_event(&node_key, lease.attempt, report)?;
        let mut txn = RunTxn::new(self, run).await?;
        let keys = txn.first_keys(&event);
        let (check, rows) = tasks::finish_task_and_load(
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
        txn.push(event, actor);
        txn.commit(tx).await?;
        Ok(())
    }

    /// Remembers which workflow and node the tasks a poll leased belong to,
    /// so their reports to this server take the one-statement path.
    pub fn remember_leases(&self, leased: &[LeasedTask]) {
        self.lease_hints.remember(leased);
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
    namespace: String,
    workflow_name: String,
    workflow_version: i32,
    node_key: String,
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
                    namespace: task.namespace.clone(),
                    workflow_name: task.workflow_name.clone(),
                    workflow_version: task.workflow_version,
                    node_key: task.node_key.clone(),
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
