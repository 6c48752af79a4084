//! One run's step in a bulk operation (decision 0019), recorded by the
//! single-run paths (cancel, retry, pause, resume) that the bulk loop calls.

use std::time::Duration;

use chrono::{DateTime, Utc};
use composer_store::bulk::{self, RunOutcome};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::error::CoordinatorError;

/// One run's action as part of an operation: the single-run paths record
/// it inside their own transaction, after their status check, so the run's
/// change, the count and the cursor commit together or not at all.
pub(crate) struct BulkStep<'a> {
    pub(crate) operation_id: Uuid,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    pub(crate) run: (DateTime<Utc>, Uuid),
}

impl BulkStep<'_> {
    /// Counts the run as done; BulkOperationReleased when this server no
    /// longer holds the operation (the caller's transaction then rolls back).
    pub(crate) async fn record(&self, conn: &mut PgConnection) -> Result<(), CoordinatorError> {
        let held = bulk::record_run(
            conn,
            self.operation_id,
            self.owner,
            self.lease,
            self.run,
            &RunOutcome::Succeeded,
        )
        .await?;
        if held {
            Ok(())
        } else {
            Err(CoordinatorError::BulkOperationReleased(
                self.operation_id.to_string(),
            ))
        }
    }
}
