//! Concurrency keys (decision 0020): admitting a run under its workflow's
//! `concurrency`, and handing a freed slot to the oldest QUEUED run.
//!
//! Every admission locks the key's slot row; every end of a run holding a
//! slot goes through [`RunTxn`](crate::events::apply)'s stage_write, which releases it
//! and hands it over in the same transaction. The run handed a slot gets its
//! start (or its retry) through its inbox, applied right after commit and
//! by recovery after a crash, as a child run's start is.
//!
//! A key's slot row lives while the key is in use: the release that leaves
//! it with no holder and no waiter deletes it (decision 0037), and
//! [`Coordinator::sweep_unused_keys`] deletes what a release had to leave.

use composer_engine::{Event, OnLimit, RunConcurrency};
use composer_store::{
    concurrency::{self, SlotKey},
    events,
    runs::Admission,
};
use serde_json::Value as Json;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::{
    error::{CoordinatorError, FieldProblem},
    limits::quotas::{Quota, QuotaExceeded, Quotas, Subject},
    workflows::LoadedWorkflow,
};

/// What a run that arrives under a key does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// It took a slot: start it now.
    Start,
    /// The key is full: it waits, QUEUED.
    Queue,
    /// The key is full and the workflow says `cancel_new`: it is created
    /// and cancelled at once, with this reason.
    CancelNew(String),
    /// The key is full and the workflow says `cancel_oldest`: that run is
    /// told to cancel (through its inbox), and this one waits QUEUED for
    /// the slot its end frees.
    Evict(Uuid),
}

/// A run's admission under its key.
#[derive(Debug, Clone)]
pub(crate) struct Admitted {
    pub key: String,
    pub seq: i64,
    pub arrived_at: chrono::DateTime<chrono::Utc>,
    pub max: i32,
    pub outcome: Outcome,
}

impl Admitted {
    /// The columns the run is inserted with.
    pub fn admission(&self) -> Admission<'_> {
        Admission {
            key: &self.key,
            seq: self.seq,
            arrived_at: self.arrived_at,
            max: self.max,
            holds: self.outcome == Outcome::Start,
        }
    }

    /// True when the run waits for a slot.
    pub fn queued(&self) -> bool {
        matches!(self.outcome, Outcome::Queue | Outcome::Evict(_))
    }

    /// The event that starts the run now, if any: RunStarted, or the
    /// cancel of a `cancel_new`.
    pub fn first_event(&self) -> Option<Event> {
        match &self.outcome {
            Outcome::Start => Some(Event::RunStarted),
            Outcome::CancelNew(reason) => Some(Event::CancelRequested {
                reason: reason.clone(),
            }),
            Outcome::Queue | Outcome::Evict(_) => None,
        }
    }

    /// The run told to cancel, if any: apply its inbox after commit.
    pub fn evicted(&self) -> Option<Uuid> {
        match self.outcome {
            Outcome::Evict(run_id) => Some(run_id),
            _ => None,
        }
    }
}

/// The key of a run of `workflow` with `input`; None when the workflow
/// declares no concurrency. A key the input cannot give is a bad input.
pub(crate) fn run_key<'w>(
    workflow: &'w LoadedWorkflow,
    input: &Json,
) -> Result<Option<(String, &'w RunConcurrency)>, CoordinatorError> {
    let Some(concurrency) = workflow.compiled.concurrency() else {
        return Ok(None);
    };
    let key = concurrency.key_of(input).map_err(|e| {
        CoordinatorError::InvalidArgument(vec![FieldProblem {
            field: "input".to_owned(),
            description: e.to_string(),
        }])
    })?;
    Ok(Some((key, concurrency)))
}

/// Admits a run of `workflow_name` under `key`: locks the key's slot row
/// (held to commit) and takes a slot if one is free, else follows
/// `on_limit`. A key not in use yet that would put the namespace over its
/// `concurrency_keys` quota is refused, leaving no row behind.
pub(crate) async fn admit(
    conn: &mut PgConnection,
    namespace: &str,
    workflow_name: &str,
    key: String,
    concurrency: &RunConcurrency,
    quotas: &Quotas,
) -> Result<Admitted, CoordinatorError> {
    let slot = SlotKey {
        namespace,
        workflow_name,
        key: &key,
    };
    let locked = concurrency::lock_slot(conn, slot).await?;
    if locked.created {
        check_key_quota(conn, slot, quotas).await?;
    }
    let max = i32::try_from(concurrency.max).unwrap_or(i32::MAX);
    let outcome = if locked.running < max {
        concurrency::take_slot(conn, slot).await?;
        Outcome::Start
    } else {
        full_key(conn, slot, concurrency).await?
    };
    Ok(Admitted {
        seq: locked.seq,
        arrived_at: locked.arrived_at,
        max,
        outcome,
        key,
    })
}

/// How soon a run refused a new key may try again: keys free as runs end.
const KEY_QUOTA_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Refuses the key `slot` just created when the namespace now holds more
/// keys than its quota. Counted only for a new key, and at most quota + 1
/// index entries, so keys already in use cost nothing more. Admissions
/// of new keys committing at the same instant may each see the other's
/// row missing: the quota is exceeded by at most the admissions in flight.
async fn check_key_quota(
    conn: &mut PgConnection,
    slot: SlotKey<'_>,
    quotas: &Quotas,
) -> Result<(), CoordinatorError> {
    let cap = i64::from(quotas.concurrency_keys);
    if concurrency::count_keys(conn, slot.namespace, cap).await? <= cap {
        return Ok(());
    }
    concurrency::forget_new_slot(conn, slot).await?;
    Err(QuotaExceeded::counted(
        Quota::ConcurrencyKeys,
        Subject::Namespace(slot.namespace.to_owned()),
        quotas,
        KEY_QUOTA_RETRY,
    )
    .into())
}

/// What a run arriving at a full key does, per `on_limit`.
async fn full_key(
    conn: &mut PgConnection,
    slot: SlotKey<'_>,
    concurrency: &RunConcurrency,
) -> Result<Outcome, CoordinatorError> {
    match concurrency.on_limit {
        OnLimit::Queue => Ok(Outcome::Queue),
        OnLimit::CancelNew => Ok(Outcome::CancelNew(format!(
            "concurrency key {:?} already has {} running runs (on_limit: cancel_new)",
            slot.key, concurrency.max
        ))),
        OnLimit::CancelOldest => {
            let Some(oldest) = concurrency::oldest_holder(conn, slot).await? else {
                // every holder is in an event transaction right now: wait
                // for the slot one of them frees
                return Ok(Outcome::Queue);
            };
            let cancel = Event::CancelRequested {
                reason: format!(
                    "concurrency key {:?}: a newer run took its place (on_limit: cancel_oldest)",
                    slot.key
                ),
            };
            events::push_inbox(conn, oldest, &serde_json::to_value(cancel)?, "concurrency").await?;
            Ok(Outcome::Evict(oldest))
        }
    }
}

/// The event that resumes a run a freed slot was handed to: its start, or
/// for a FAILED run that RetryRun queued, the retry.
pub(crate) async fn resume_event(
    conn: &mut PgConnection,
    handed: &concurrency::HandedOver,
) -> Result<Event, CoordinatorError> {
    if handed.engine_status != "FAILED" {
        return Ok(Event::RunStarted);
    }
    let interrupted = composer_store::runs::interrupted_nodes(conn, handed.run_id)
        .await?
        .iter()
        .filter_map(|k| k.parse().ok())
        .collect();
    Ok(Event::RetryRequested { interrupted })
}

/// Sweeps of unused slot rows one reconcile pass makes at most.
const MAX_SWEEPS_PER_PASS: usize = 50;

impl crate::Coordinator {
    /// Deletes the slot rows of run and TASK node keys no longer in use,
    /// `batch` of each kind at a time until a sweep finds fewer (at most
    /// [`MAX_SWEEPS_PER_PASS`]). Returns how many went.
    pub async fn sweep_unused_keys(
        &self,
        batch: i64,
    ) -> Result<concurrency::Swept, CoordinatorError> {
        let full = u64::try_from(batch).unwrap_or(0);
        let mut total = concurrency::Swept::default();
        for _ in 0..MAX_SWEEPS_PER_PASS {
            let swept = concurrency::sweep_unused_slots(self.store().pool(), batch).await?;
            total.run_keys += swept.run_keys;
            total.task_keys += swept.task_keys;
            if swept.run_keys < full && swept.task_keys < full {
                break;
            }
        }
        Ok(total)
    }
}
