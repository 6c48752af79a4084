//! The worker side of a task's life: heartbeats and reports, fenced by the
//! lease `(task_id, attempt, lease_token)`.

use chrono::{DateTime, Utc};
use composer_engine::{Event, NodeKey};
use composer_store::{
    runs,
    tasks::{self, HeartbeatOutcome, ReportCheck},
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
        // lock the task's run, then (a statement whose snapshot follows the
        // lock) fence the report and load what the event needs: two round
        // trips before the write
        let mut tx = self.store.begin().await?;
        let Some((run, node_key)) = runs::lock_run_of_task(&mut tx, namespace, task).await? else {
            return Err(CoordinatorError::TaskNotFound(task_id.to_owned()));
        };
        let node: NodeKey = node_key
            .parse()
            .map_err(|_| CoordinatorError::Corrupt(format!("task node key {node_key:?}")))?;
        let outcome = match report {
            TaskReport::Completed { .. } => tasks::status::COMPLETED,
            TaskReport::Failed { .. } => tasks::status::FAILED,
        };
        let attempt_number = u32::try_from(attempt).unwrap_or_default();
        let event = match report {
            TaskReport::Completed { output } => Event::TaskCompleted {
                node,
                attempt: attempt_number,
                output,
            },
            TaskReport::Failed {
                code,
                message,
                retryable,
                details,
            } => Event::TaskFailed {
                node,
                attempt: attempt_number,
                code,
                message,
                retryable,
                details,
                seed: seed(),
            },
        };
        let mut txn = RunTxn::new(self, run).await?;
        let keys = txn.first_keys(&event);
        let (check, rows) = tasks::finish_task_and_load(
            &mut tx,
            (task, attempt, token, outcome),
            txn.run_id(),
            &keys,
        )
        .await?;
        match check {
            ReportCheck::Applied => {}
            ReportCheck::Repeat => return Ok(()),
            ReportCheck::Stale => {
                return Err(CoordinatorError::LeaseLost {
                    task_id: task_id.to_owned(),
                    attempt,
                });
            }
        }
        txn.preload(&keys, rows)?;
        txn.push(event, actor);
        txn.commit(tx).await?;
        Ok(())
    }
}
