//! Pausing and resuming runs. A pause is not an engine event: the engine
//! keeps deciding as usual (a running attempt's report is applied), and
//! the write side holds what it would dispatch (see `RunTxn::held`).

use composer_engine::history::HistoryEventType;
use composer_store::{
    pause::{self, PAUSED},
    runs::{self, HistoryWrite, RunRow},
};
use serde_json::json;
use uuid::Uuid;

use crate::{
    Coordinator, error::CoordinatorError, events::apply::engine_status,
    events::bulk_step::BulkStep, events::runs::is_final,
};

/// What a pause or resume found: whether it changed the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowChange {
    /// The run was paused or resumed by this call.
    Changed,
    /// The run already was as asked (an idempotent repeat).
    Unchanged,
}

impl Coordinator {
    /// Pauses a live run; OK and unchanged when it already is paused,
    /// FAILED_PRECONDITION once it ended. One transaction under the run lock.
    pub async fn pause_run(
        &self,
        namespace: Option<&str>,
        run_id: Uuid,
        reason: &str,
        actor: &str,
    ) -> Result<(RunRow, FlowChange), CoordinatorError> {
        let change = self
            .pause_run_step(namespace, run_id, reason, actor, None)
            .await?;
        Ok((self.expect_run(namespace, run_id).await?, change))
    }

    /// PauseRun's transaction; with a bulk step, a pause that changes the
    /// run records the step in it.
    pub(crate) async fn pause_run_step(
        &self,
        namespace: Option<&str>,
        run_id: Uuid,
        reason: &str,
        actor: &str,
        step: Option<&BulkStep<'_>>,
    ) -> Result<FlowChange, CoordinatorError> {
        let (mut tx, run) = self.lock_existing(namespace, run_id).await?;
        if is_final(&run.status) {
            return Err(CoordinatorError::WrongRunStatus {
                run_id: run_id.to_string(),
                status: run.status,
                why: "a run that ended cannot be paused",
            });
        }
        if run.status == PAUSED {
            return Ok(FlowChange::Unchanged);
        }
        if let Some(step) = step {
            step.record(&mut tx).await?;
        }
        if run.status == composer_store::concurrency::QUEUED {
            return Err(CoordinatorError::WrongRunStatus {
                run_id: run_id.to_string(),
                status: run.status,
                why: "a QUEUED run has started nothing to pause; cancel it instead",
            });
        }
        let held = pause::pause_run(&mut tx, run_id).await?;
        let history = HistoryWrite {
            event_type: HistoryEventType::RunPaused.as_str().to_owned(),
            node_key: None,
            attempt: None,
            actor: actor.to_owned(),
            details: json!({"reason": reason, "by": actor, "held_tasks": held}),
        };
        runs::append_history(&mut tx, run_id, &run.namespace, &[history]).await?;
        tx.commit().await?;
        self.run_changed(run_id);
        Ok(FlowChange::Changed)
    }

    /// Resumes a paused run: held tasks are dispatched, held timers fire
    /// when due. OK and unchanged for a live run that is not paused.
    pub async fn resume_run(
        &self,
        namespace: Option<&str>,
        run_id: Uuid,
        actor: &str,
    ) -> Result<(RunRow, FlowChange), CoordinatorError> {
        let change = self.resume_run_step(namespace, run_id, actor, None).await?;
        Ok((self.expect_run(namespace, run_id).await?, change))
    }

    /// ResumeRun's transaction; with a bulk step, a resume that changes the
    /// run records the step in it.
    pub(crate) async fn resume_run_step(
        &self,
        namespace: Option<&str>,
        run_id: Uuid,
        actor: &str,
        step: Option<&BulkStep<'_>>,
    ) -> Result<FlowChange, CoordinatorError> {
        let (mut tx, run) = self.lock_existing(namespace, run_id).await?;
        if is_final(&run.status) {
            return Err(CoordinatorError::WrongRunStatus {
                run_id: run_id.to_string(),
                status: run.status,
                why: "a run that ended cannot be resumed",
            });
        }
        if run.status != PAUSED {
            return Ok(FlowChange::Unchanged);
        }
        if let Some(step) = step {
            step.record(&mut tx).await?;
        }
        let status = engine_status(&run)?;
        let outbox = pause::resume_run(&mut tx, run_id, &status).await?;
        let history = HistoryWrite {
            event_type: HistoryEventType::RunResumed.as_str().to_owned(),
            node_key: None,
            attempt: None,
            actor: actor.to_owned(),
            details: json!({"by": actor, "released_tasks": outbox.len()}),
        };
        runs::append_history(&mut tx, run_id, &run.namespace, &[history]).await?;
        if !outbox.is_empty() && self.publisher.is_none() {
            composer_store::tasks::notify_outbox(&mut tx).await?;
        }
        tx.commit().await?;
        self.run_changed(run_id);
        self.publish(outbox).await;
        Ok(FlowChange::Changed)
    }
}
