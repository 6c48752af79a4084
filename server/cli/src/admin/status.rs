//! The run statuses a filter names on the command line (`run list
//! --status`, the bulk commands' `--status`).

use clap::ValueEnum;
use composer_proto::v1::RunStatus;

/// A run status, as `run list --status` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFilter {
    /// RUNNING.
    Running,
    /// COMPENSATING.
    Compensating,
    /// COMPLETED.
    Completed,
    /// FAILED.
    Failed,
    /// CANCELLED.
    Cancelled,
    /// PAUSED.
    Paused,
    /// QUEUED: waiting for a slot of its concurrency key.
    Queued,
}

impl From<StatusFilter> for RunStatus {
    fn from(status: StatusFilter) -> Self {
        match status {
            StatusFilter::Running => RunStatus::Running,
            StatusFilter::Compensating => RunStatus::Compensating,
            StatusFilter::Completed => RunStatus::Completed,
            StatusFilter::Failed => RunStatus::Failed,
            StatusFilter::Cancelled => RunStatus::Cancelled,
            StatusFilter::Paused => RunStatus::Paused,
            StatusFilter::Queued => RunStatus::Queued,
        }
    }
}
