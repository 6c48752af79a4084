//! Bulk operations on runs (decision 0019): cancel, retry, pause or resume
//! every run a ListRuns filter matches, as a long-running operation.
//!
//! Every server runs the loop. It claims an operation whose lease lapsed,
//! then walks its runs newest first, a page of keys at a time, acting on
//! each through the single-run path (its own transaction, the run's row
//! locked). The count a run adds and the cursor past it are written in
//! that same transaction, fenced by the lease owner: a server that dies
//! mid-page leaves exact counts, and the next owner resumes after the last
//! run committed. Between pages it sleeps, so live traffic keeps its
//! database connections and latency.

use std::time::Duration;

use chrono::{DateTime, Utc};
use composer_store::{
    StoreError,
    bulk::{self, BulkOperationRow, CancelRequest, Hold, NewBulkOperation, RunOutcome},
    runs::RunFilter,
};
use tokio::sync::watch;
use uuid::Uuid;

use crate::{
    Coordinator, error::CoordinatorError, events::bulk_step::BulkStep, events::migrate::Migration,
    events::pause::FlowChange, observe::metrics,
};

/// What a bulk operation does to each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkKind {
    /// CancelRun.
    Cancel,
    /// RetryRun.
    Retry,
    /// PauseRun.
    Pause,
    /// ResumeRun.
    Resume,
    /// A move to another version (MigrateRuns).
    Migrate,
}

impl BulkKind {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            BulkKind::Cancel => "CANCEL",
            BulkKind::Retry => "RETRY",
            BulkKind::Pause => "PAUSE",
            BulkKind::Resume => "RESUME",
            BulkKind::Migrate => "MIGRATE",
        }
    }

    /// From storage.
    pub fn parse(text: &str) -> Option<BulkKind> {
        [
            BulkKind::Cancel,
            BulkKind::Retry,
            BulkKind::Pause,
            BulkKind::Resume,
            BulkKind::Migrate,
        ]
        .into_iter()
        .find(|k| k.as_str() == text)
    }
}

/// A bulk operation to start.
#[derive(Debug, Clone)]
pub struct BulkRequest {
    /// Namespace.
    pub namespace: String,
    /// What to do.
    pub kind: BulkKind,
    /// Which runs (checked by the caller).
    pub filter: RunFilter,
    /// Why (cancel and pause).
    pub reason: String,
    /// Where to (MIGRATE only).
    pub migration: Option<Migration>,
    /// Optional idempotency key.
    pub request_id: Option<String>,
    /// Who asks.
    pub actor: String,
}

/// How the bulk loop paces itself.
#[derive(Debug, Clone)]
pub struct BulkConfig {
    /// Run keys read per page; each run is still its own transaction.
    pub batch_size: i64,
    /// Sleep between pages, so live traffic gets the database.
    pub batch_pause: Duration,
    /// How often to look for an operation when not woken.
    pub poll_interval: Duration,
    /// How long a claim holds without progress before another server may
    /// take the operation over.
    pub lease: Duration,
}

impl Default for BulkConfig {
    fn default() -> Self {
        Self {
            // BENCHMARKS.md, "What a bulk retry costs live dispatch": about
            // a quarter of the time at work, B2's p99 within 2x of idle
            batch_size: 20,
            batch_pause: Duration::from_millis(100),
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(10),
        }
    }
}

/// How walking an operation ended.
enum Walk {
    /// Every page done.
    Done,
    /// Asked to stop.
    Cancelled,
    /// Another server holds it now, or this one stops.
    Left,
}

impl Coordinator {
    /// Creates a bulk operation (or returns the one its request id names,
    /// with false) and wakes this server's bulk loop.
    pub async fn start_bulk_operation(
        &self,
        request: BulkRequest,
    ) -> Result<(BulkOperationRow, bool), CoordinatorError> {
        let params = request
            .migration
            .as_ref()
            .map_or_else(|| serde_json::json!({}), Migration::to_params);
        let new = NewBulkOperation {
            namespace: &request.namespace,
            id: Uuid::now_v7(),
            kind: request.kind.as_str(),
            filter: &request.filter,
            reason: &request.reason,
            params: &params,
            request_id: request.request_id.as_deref(),
            created_by: &request.actor,
        };
        let (op, created) = bulk::insert_bulk_operation(self.store.pool(), &new).await?;
        if created {
            self.bulk_wake.notify_one();
        }
        Ok((op, created))
    }

    /// An operation of the namespace.
    pub async fn get_bulk_operation(
        &self,
        namespace: &str,
        id: Uuid,
    ) -> Result<BulkOperationRow, CoordinatorError> {
        bulk::get_bulk_operation(self.store.pool(), namespace, id)
            .await?
            .ok_or_else(|| CoordinatorError::BulkOperationNotFound(id.to_string()))
    }

    /// One page of the namespace's operations, newest first.
    pub async fn list_bulk_operations(
        &self,
        namespace: &str,
        cursor: Option<(DateTime<Utc>, Uuid)>,
        limit: i64,
    ) -> Result<Vec<BulkOperationRow>, CoordinatorError> {
        Ok(bulk::list_bulk_operations(self.store.pool(), namespace, cursor, limit).await?)
    }

    /// Asks an operation to stop after the run it is on.
    pub async fn cancel_bulk_operation(
        &self,
        namespace: &str,
        id: Uuid,
    ) -> Result<BulkOperationRow, CoordinatorError> {
        match bulk::request_cancel(self.store.pool(), namespace, id).await? {
            CancelRequest::Marked(op) => {
                if op.has_ended() {
                    metrics::bulk_operation_ended(&op.kind, &op.status);
                }
                Ok(*op)
            }
            CancelRequest::Ended(op) if op.status == bulk::CANCELLED => Ok(*op),
            CancelRequest::Ended(op) => Err(CoordinatorError::BulkOperationEnded {
                id: id.to_string(),
                status: op.status,
            }),
            CancelRequest::NotFound => Err(CoordinatorError::BulkOperationNotFound(id.to_string())),
        }
    }

    /// Works on bulk operations until `shutdown` flips: claims one whose
    /// lease lapsed and walks it to its end, else waits for a wake-up (an
    /// operation created on this server) or `poll_interval`.
    pub async fn run_bulk_loop(self, config: BulkConfig, mut shutdown: watch::Receiver<bool>) {
        let owner = format!("bulk-{}", Uuid::new_v4());
        while !*shutdown.borrow() {
            match bulk::claim_bulk_operation(self.store.pool(), &owner, config.lease).await {
                Ok(Some(op)) => {
                    if let Err(error) = self.work(&op, &owner, &config, &shutdown).await {
                        tracing::warn!(%error, operation_id = %op.id, "bulk operation");
                        self.pause_between(&config.poll_interval, &mut shutdown)
                            .await;
                    }
                    continue;
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "bulk claim"),
            }
            tokio::select! {
                () = tokio::time::sleep(config.poll_interval) => {},
                () = self.bulk_wake.notified() => {},
                _ = shutdown.changed() => {},
            }
        }
    }

    async fn pause_between(&self, pause: &Duration, shutdown: &mut watch::Receiver<bool>) {
        tokio::select! {
            () = tokio::time::sleep(*pause) => {},
            _ = shutdown.changed() => {},
        }
    }

    /// Walks a claimed operation and ends it, unless it was lost or this
    /// server stops (then its lease is released for another to resume).
    async fn work(
        &self,
        op: &BulkOperationRow,
        owner: &str,
        config: &BulkConfig,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<(), CoordinatorError> {
        let Some(kind) = BulkKind::parse(&op.kind) else {
            return self
                .end(op, owner, bulk::FAILED, Some("unknown kind"))
                .await;
        };
        tracing::info!(operation_id = %op.id, kind = op.kind, "bulk operation claimed");
        match self.walk(op, kind, owner, config, shutdown).await? {
            Walk::Done => self.end(op, owner, bulk::SUCCEEDED, None).await,
            Walk::Cancelled => self.end(op, owner, bulk::CANCELLED, None).await,
            Walk::Left => {
                if *shutdown.borrow() {
                    bulk::release_lease(self.store.pool(), op.id, owner).await?;
                }
                Ok(())
            }
        }
    }

    async fn end(
        &self,
        op: &BulkOperationRow,
        owner: &str,
        status: &str,
        error: Option<&str>,
    ) -> Result<(), CoordinatorError> {
        if let Some(done) = bulk::finish(self.store.pool(), op.id, owner, status, error).await? {
            metrics::bulk_operation_ended(&done.kind, &done.status);
            tracing::info!(
                operation_id = %done.id,
                status = done.status,
                matched = done.matched,
                succeeded = done.succeeded,
                skipped = done.skipped,
                failed = done.failed,
                "bulk operation ended"
            );
        }
        Ok(())
    }

    async fn walk(
        &self,
        op: &BulkOperationRow,
        kind: BulkKind,
        owner: &str,
        config: &BulkConfig,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<Walk, CoordinatorError> {
        let mut cursor = op.cursor;
        let mut shutdown = shutdown.clone();
        loop {
            match bulk::renew_lease(self.store.pool(), op.id, owner, config.lease).await? {
                Hold::Held => {}
                Hold::CancelRequested => return Ok(Walk::Cancelled),
                Hold::Lost => return Ok(Walk::Left),
            }
            let page = bulk::next_runs(self.store.pool(), op, cursor, config.batch_size).await?;
            if page.is_empty() {
                return Ok(Walk::Done);
            }
            for run in page {
                if *shutdown.borrow() {
                    return Ok(Walk::Left);
                }
                if !self.act(op, kind, owner, config, run).await? {
                    // lost or asked to stop: the next renewal says which
                    return match bulk::renew_lease(self.store.pool(), op.id, owner, config.lease)
                        .await?
                    {
                        Hold::CancelRequested => Ok(Walk::Cancelled),
                        Hold::Held | Hold::Lost => Ok(Walk::Left),
                    };
                }
                cursor = Some(run);
            }
            self.pause_between(&config.batch_pause, &mut shutdown).await;
        }
    }

    /// Acts on one run and counts it; false when the operation is no longer
    /// this server's to count (nothing was changed then).
    async fn act(
        &self,
        op: &BulkOperationRow,
        kind: BulkKind,
        owner: &str,
        config: &BulkConfig,
        run: (DateTime<Utc>, Uuid),
    ) -> Result<bool, CoordinatorError> {
        let step = BulkStep {
            operation_id: op.id,
            owner,
            lease: config.lease,
            run,
        };
        let outcome = match self.act_on_run(op, kind, &step).await {
            Ok(FlowChange::Changed) => {
                metrics::bulk_run(&op.kind, "succeeded");
                return Ok(true);
            }
            Ok(FlowChange::Unchanged)
            | Err(CoordinatorError::WrongRunStatus { .. } | CoordinatorError::RunNotFound(_)) => {
                RunOutcome::Skipped
            }
            Err(CoordinatorError::RunNotMigrated { why, .. }) => RunOutcome::Failed(why),
            Err(CoordinatorError::BulkOperationReleased(_)) => return Ok(false),
            Err(CoordinatorError::Store(error)) if is_transient(&error) => {
                return Err(CoordinatorError::Store(error));
            }
            Err(error) => RunOutcome::Failed(error.to_string()),
        };
        metrics::bulk_run(
            &op.kind,
            if outcome == RunOutcome::Skipped {
                "skipped"
            } else {
                "failed"
            },
        );
        let mut tx = self.store.begin().await?;
        if !bulk::record_run(&mut tx, op.id, owner, config.lease, run, &outcome).await? {
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn act_on_run(
        &self,
        op: &BulkOperationRow,
        kind: BulkKind,
        step: &BulkStep<'_>,
    ) -> Result<FlowChange, CoordinatorError> {
        let namespace = Some(op.namespace.as_str());
        let run_id = step.run.1;
        let actor = op.created_by.as_str();
        match kind {
            BulkKind::Cancel => {
                let reason = if op.reason.is_empty() {
                    "cancelled"
                } else {
                    &op.reason
                };
                self.cancel_run_step(namespace, run_id, reason, actor, Some(step))
                    .await?;
                Ok(FlowChange::Changed)
            }
            BulkKind::Retry => {
                self.retry_run_step(namespace, run_id, actor, Some(step))
                    .await?;
                Ok(FlowChange::Changed)
            }
            BulkKind::Pause => {
                self.pause_run_step(namespace, run_id, &op.reason, actor, Some(step))
                    .await
            }
            BulkKind::Resume => {
                self.resume_run_step(namespace, run_id, actor, Some(step))
                    .await
            }
            BulkKind::Migrate => {
                let Some(migration) = Migration::from_params(&op.params) else {
                    return Err(CoordinatorError::Corrupt(format!(
                        "bulk operation {}: a migration without a target version",
                        op.id
                    )));
                };
                self.migrate_run_step(&op.namespace, run_id, &migration, actor, step)
                    .await
            }
        }
    }
}

/// A database that is slow or away: the run is left for a later attempt
/// (the operation pauses and resumes from its cursor) rather than counted
/// as failed.
fn is_transient(error: &StoreError) -> bool {
    error.is_timeout()
        || matches!(
            error,
            StoreError::Unreachable(_)
                | StoreError::Database(
                    sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed
                )
        )
}
