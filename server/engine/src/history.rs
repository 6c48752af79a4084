//! The one list of history event types: what the server records in a run's
//! history (`GetRunHistory`, `WatchRun`). The proto comment of
//! `HistoryEvent.event_type` and `docs/history.md` list the same names; a
//! test holds them to this list.

/// What a history event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryEventType {
    /// the run was started (by StartRun, or by a parent's SUB_WORKFLOW or MAP node).
    RunStarted,
    /// a node became ready and started its attempt (for a TASK: the task was created and dispatched).
    NodeStarted,
    /// a worker held this attempt's lease.
    TaskLeased,
    /// the attempt's lease ended without a heartbeat or report (`details.
    LeaseExpired,
    /// the node's attempt succeeded.
    NodeCompleted,
    /// one attempt failed.
    AttemptFailed,
    /// a next attempt is due after `details.
    RetryScheduled,
    /// the node failed for good (no attempts left, or not retryable).
    NodeFailed,
    /// the node will not run: its branch was not taken.
    NodeSkipped,
    /// a WAIT node's timer fired.
    WaitElapsed,
    /// a WAIT_FOR_EVENT node got its event (`details.
    EventReceived,
    /// an event arrived for the run before any node waited for it.
    EventStored,
    /// an event or report arrived that the run no longer needed (`details.
    EventIgnored,
    /// a branch arrived at a JOIN that had already decided.
    ArrivalIgnored,
    /// an expression failed at run time.
    ExpressionError,
    /// CancelRun was called.
    CancelRequestedBy,
    /// the cancellation was applied to the run.
    CancelRequested,
    /// RetryRun was called.
    RetryRequestedBy,
    /// the run was reopened from its failed nodes.
    RunRetried,
    /// the run failed and compensations run, in reverse order.
    CompensationStarted,
    /// one compensation node started.
    CompensationNodeStarted,
    /// every compensation finished.
    CompensationCompleted,
    /// a compensation failed.
    CompensationFailed,
    /// the run ended COMPLETED.
    RunCompleted,
    /// the run ended FAILED.
    RunFailed,
    /// the run ended CANCELLED.
    RunCancelled,
    /// PauseRun paused the run.
    RunPaused,
    /// ResumeRun resumed the run.
    RunResumed,
    /// MigrateRuns moved the run to another version of its workflow.
    RunMigrated,
}

impl HistoryEventType {
    /// Every type, in the order the documentation lists them.
    pub const ALL: [Self; 29] = [
        Self::RunStarted,
        Self::NodeStarted,
        Self::TaskLeased,
        Self::LeaseExpired,
        Self::NodeCompleted,
        Self::AttemptFailed,
        Self::RetryScheduled,
        Self::NodeFailed,
        Self::NodeSkipped,
        Self::WaitElapsed,
        Self::EventReceived,
        Self::EventStored,
        Self::EventIgnored,
        Self::ArrivalIgnored,
        Self::ExpressionError,
        Self::CancelRequestedBy,
        Self::CancelRequested,
        Self::RetryRequestedBy,
        Self::RunRetried,
        Self::CompensationStarted,
        Self::CompensationNodeStarted,
        Self::CompensationCompleted,
        Self::CompensationFailed,
        Self::RunCompleted,
        Self::RunFailed,
        Self::RunCancelled,
        Self::RunPaused,
        Self::RunResumed,
        Self::RunMigrated,
    ];

    /// The type stored as `name`, if one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    /// The name stored and returned as `event_type`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RunStarted => "run_started",
            Self::NodeStarted => "node_started",
            Self::TaskLeased => "task_leased",
            Self::LeaseExpired => "lease_expired",
            Self::NodeCompleted => "node_completed",
            Self::AttemptFailed => "attempt_failed",
            Self::RetryScheduled => "retry_scheduled",
            Self::NodeFailed => "node_failed",
            Self::NodeSkipped => "node_skipped",
            Self::WaitElapsed => "wait_elapsed",
            Self::EventReceived => "event_received",
            Self::EventStored => "event_stored",
            Self::EventIgnored => "event_ignored",
            Self::ArrivalIgnored => "arrival_ignored",
            Self::ExpressionError => "expression_error",
            Self::CancelRequestedBy => "cancel_requested_by",
            Self::CancelRequested => "cancel_requested",
            Self::RetryRequestedBy => "retry_requested_by",
            Self::RunRetried => "run_retried",
            Self::CompensationStarted => "compensation_started",
            Self::CompensationNodeStarted => "compensation_node_started",
            Self::CompensationCompleted => "compensation_completed",
            Self::CompensationFailed => "compensation_failed",
            Self::RunCompleted => "run_completed",
            Self::RunFailed => "run_failed",
            Self::RunCancelled => "run_cancelled",
            Self::RunPaused => "run_paused",
            Self::RunResumed => "run_resumed",
            Self::RunMigrated => "run_migrated",
        }
    }

    /// What it means, as `docs/history.md` says it.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::RunStarted => {
                "the run was started (by StartRun, or by a parent's SUB_WORKFLOW or MAP node)"
            }
            Self::NodeStarted => {
                "a node became ready and started its attempt (for a TASK: the task was created and dispatched)"
            }
            Self::TaskLeased => {
                "a worker held this attempt's lease; `details.worker_id` names it. Written with the attempt's outcome (its report or its expiry), not when the lease is taken, so leasing stays one statement; and only when that outcome writes no entry of its own (a report the run no longer needed): otherwise the outcome entry (`node_completed`, `attempt_failed`, `lease_expired`) carries `details.worker_id`, one row per attempt"
            }
            Self::LeaseExpired => {
                "the attempt's lease ended without a heartbeat or report (`details.worker_id`); the attempt fails with LEASE_EXPIRED and is retried by the node's policy. With `details.worker_lost` the worker never confirmed receipt of any of the attempt's `details.deliveries`: the attempt fails with WORKER_LOST"
            }
            Self::NodeCompleted => {
                "the node's attempt succeeded; `details.output` is its output; for a TASK, `details.worker_id` the worker that ran it"
            }
            Self::AttemptFailed => "one attempt failed; `details.code`, `message`, `retryable`",
            Self::RetryScheduled => "a next attempt is due after `details.delay_ms`",
            Self::NodeFailed => "the node failed for good (no attempts left, or not retryable)",
            Self::NodeSkipped => "the node will not run: its branch was not taken",
            Self::WaitElapsed => "a WAIT node's timer fired",
            Self::EventReceived => "a WAIT_FOR_EVENT node got its event (`details.name`)",
            Self::EventStored => {
                "an event arrived for the run before any node waited for it; it is kept for the first that does"
            }
            Self::EventIgnored => {
                "an event or report arrived that the run no longer needed (`details.reason`)"
            }
            Self::ArrivalIgnored => "a branch arrived at a JOIN that had already decided",
            Self::ExpressionError => "an expression failed at run time; the node fails",
            Self::CancelRequestedBy => {
                "CancelRun was called; the actor is the caller, `details.reason` why"
            }
            Self::CancelRequested => "the cancellation was applied to the run",
            Self::RetryRequestedBy => {
                "RetryRun was called; the actor is the caller (`queued_for_key` in the details when the run waits QUEUED for a slot of its concurrency key)"
            }
            Self::RunRetried => "the run was reopened from its failed nodes",
            Self::CompensationStarted => "the run failed and compensations run, in reverse order",
            Self::CompensationNodeStarted => "one compensation node started",
            Self::CompensationCompleted => "every compensation finished",
            Self::CompensationFailed => "a compensation failed",
            Self::RunCompleted => "the run ended COMPLETED; `details.output`",
            Self::RunFailed => "the run ended FAILED; `details` is the error",
            Self::RunCancelled => {
                "the run ended CANCELLED (`reason` in the details: the CancelRun reason, or which concurrency key cancelled it)"
            }
            Self::RunPaused => {
                "PauseRun paused the run; the actor is the caller, `details.reason` why, `details.held_tasks` how many dispatched tasks were taken back"
            }
            Self::RunResumed => {
                "ResumeRun resumed the run; the actor is the caller, `details.released_tasks` how many held tasks were dispatched"
            }
            Self::RunMigrated => {
                "MigrateRuns moved the run to another version of its workflow (`details.from_version`, `details.to_version`, `details.node_mapping` of renamed node ids, `details.verdict` of the replay that allowed it, `details.operation_id`); entries before it name the nodes by their old ids"
            }
        }
    }
}

impl std::fmt::Display for HistoryEventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
