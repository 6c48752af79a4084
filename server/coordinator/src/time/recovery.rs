//! Recovery loops, run in every server and safe with many: each candidate
//! is re-checked under its run's lock, so two servers never apply one
//! timer or one expiry twice.

use std::{sync::Arc, time::Duration};

use composer_engine::{Event, NodeKey, TimerId};
use composer_store::{events, runs, tasks, timers};
use futures::StreamExt;
use tokio::sync::watch;

use crate::{
    Coordinator,
    dispatch::poll_hub::PollHub,
    error::CoordinatorError,
    events::apply::{RunTxn, SYSTEM, seed},
};

/// Periods and batch sizes of the recovery loops.
#[derive(Debug, Clone)]
pub struct RecoveryConfig {
    /// How often to look for due timers when fewer than a batch were due
    /// (the lag a timer may have beyond its time, at most).
    pub timer_interval: Duration,
    /// Timer batches (transactions) in flight at once in one server.
    pub timer_concurrency: usize,
    /// Timers fired per transaction.
    pub timer_batch: usize,
    /// How often to look for expired leases.
    pub lease_interval: Duration,
    /// A task dispatched this long ago and not leased is republished.
    pub lost_dispatch_grace: Duration,
    /// How often to look for lost dispatches and stuck inboxes.
    pub reconcile_interval: Duration,
    /// Candidates per pass.
    pub batch: i64,
    /// Finished runs and history older than this are deleted.
    pub retention: Duration,
    /// How often the blob collector runs (decision 0047).
    pub blob_collect_interval: Duration,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self {
            timer_interval: Duration::from_millis(50),
            timer_concurrency: 8,
            timer_batch: 50,
            lease_interval: Duration::from_millis(500),
            lost_dispatch_grace: Duration::from_secs(15),
            reconcile_interval: Duration::from_secs(2),
            batch: 200,
            retention: Duration::from_secs(30 * 24 * 3600),
            blob_collect_interval: Duration::from_secs(600),
        }
    }
}

impl Coordinator {
    /// Fires many due timers in ONE transaction: one statement locks their
    /// runs (skipping busy ones) and takes the timers, one loads the node
    /// rows every event needs, then each run's events are applied and all
    /// runs written in one statement (decision 0026), and one commit. Returns how many
    /// fired. On an error nothing is fired; the caller falls back to
    /// one transaction per timer, so one bad run cannot hold
    /// back the others.
    pub async fn fire_timers(&self, due: &[timers::DueTimer]) -> Result<usize, CoordinatorError> {
        self.fire_timers_locking(due, runs::RunLocking::SkipBusy)
            .await
    }

    /// Fires the continuation timers a commit just wrote (a wide MAP's next
    /// slice), waiting for a run another transaction holds rather than
    /// leaving the timer to the timer loop's next pass.
    pub(crate) async fn fire_continuations(
        &self,
        due: &[timers::DueTimer],
    ) -> Result<usize, CoordinatorError> {
        self.fire_timers_locking(due, runs::RunLocking::Wait).await
    }

    async fn fire_timers_locking(
        &self,
        due: &[timers::DueTimer],
        locking: runs::RunLocking,
    ) -> Result<usize, CoordinatorError> {
        let pairs: Vec<(uuid::Uuid, String)> =
            due.iter().map(|d| (d.run_id, d.key.clone())).collect();
        let mut tx = self.store.begin().await?;
        let taken = runs::lock_runs_taking_timers(&mut tx, &pairs, locking).await?;
        let fired = taken.len();
        // one RunTxn per run, its timers in order
        let mut by_run: Vec<(runs::RunRow, Vec<TimerId>)> = Vec::new();
        for taken in taken {
            let timer: TimerId = serde_json::from_value(taken.timer)?;
            if timer.kind == composer_engine::TimerKind::EventTimeout
                && let Some(node) = &timer.node
            {
                events::delete_waits(&mut tx, taken.run.id, Some(&node.to_string())).await?;
            }
            match by_run.last_mut() {
                Some((run, timers)) if run.id == taken.run.id => timers.push(timer),
                _ => by_run.push((taken.run, vec![timer])),
            }
        }
        let mut txns = Vec::with_capacity(by_run.len());
        let mut wanted = Vec::new();
        for (run, timers) in by_run {
            let mut txn = RunTxn::new(self, run, &mut tx).await?;
            for timer in timers {
                txn.push(
                    Event::TimerFired {
                        timer,
                        seed: seed(),
                    },
                    SYSTEM,
                );
            }
            let keys = txn.first_queued_keys();
            wanted.extend(keys.iter().map(|k| (txn.run_id(), k.clone())));
            txns.push((txn, keys));
        }
        let mut rows: std::collections::HashMap<uuid::Uuid, Vec<(String, serde_json::Value)>> =
            std::collections::HashMap::new();
        for (run_id, key, state) in runs::load_nodes_of_runs(&mut tx, &wanted).await? {
            rows.entry(run_id).or_default().push((key, state));
        }
        let mut staged = Vec::with_capacity(txns.len());
        for (mut txn, keys) in txns {
            txn.preload(&keys, rows.remove(&txn.run_id()).unwrap_or_default())?;
            txn.stage(&mut tx).await?;
            staged.push(txn);
        }
        let applied = RunTxn::write_together(staged, &mut tx).await?;
        tx.commit().await?;
        for mut applied in applied {
            self.announce(&mut applied).await;
        }
        Ok(fired)
    }

    /// Fires due timers one transaction each (the fallback of a batch).
    async fn fire_one_by_one(&self, due: &[timers::DueTimer]) -> usize {
        let mut fired = 0;
        for timer in due {
            match self.fire_timers(std::slice::from_ref(timer)).await {
                Ok(count) => fired += count,
                Err(error) => {
                    tracing::warn!(run_id = %timer.run_id, key = %timer.key, %error, "timer not fired")
                }
            }
        }
        fired
    }

    /// Expires one lease, if it is still leased and past its deadline.
    pub async fn expire_lease(
        &self,
        lease: &tasks::ExpiredLease,
    ) -> Result<bool, CoordinatorError> {
        let mut tx = self.store.begin().await?;
        let Some(run) = runs::lock_run(&mut tx, None, lease.run_id).await? else {
            return Ok(false);
        };
        let Some((holder, end)) =
            tasks::expire_lease(&mut tx, lease.task_id, lease.attempt).await?
        else {
            return Ok(false);
        };
        let lost_deliveries = match end {
            tasks::LeaseEnd::Silent => None,
            tasks::LeaseEnd::WorkerLost { deliveries } => Some(deliveries),
        };
        let node: NodeKey = lease.node_key.parse().map_err(|_| {
            CoordinatorError::Corrupt(format!("task node key {:?}", lease.node_key))
        })?;
        let mut txn = RunTxn::new(self, run, &mut tx).await?;
        txn.push_lease_end(
            Event::LeaseExpired {
                node,
                attempt: u32::try_from(lease.attempt).unwrap_or_default(),
                lost_deliveries,
                seed: seed(),
            },
            SYSTEM,
            holder,
        );
        txn.commit(tx).await?;
        // counted once committed: a rolled-back expiry spent nothing
        if lost_deliveries.is_some() {
            crate::observe::metrics::worker_lost(&lease.namespace, &lease.queue);
        }
        Ok(true)
    }

    /// One pass of the blob collector, its outcome logged.
    async fn collect_blobs_logged(&self) {
        match self
            .collect_blobs(chrono::Utc::now(), crate::payloads::BLOB_GRACE)
            .await
        {
            Ok(pass) if pass == crate::payloads::CollectorPass::default() => {}
            Ok(pass) => {
                crate::observe::metrics::recovery("reconcile", "blobs", pass.blobs_deleted as u64);
                tracing::info!(
                    refs_dropped = pass.refs_dropped,
                    blobs_deleted = pass.blobs_deleted,
                    uploads_deleted = pass.uploads_deleted,
                    "blob collector"
                );
            }
            Err(error) => tracing::warn!(%error, "blob collector pass"),
        }
    }

    /// Deletes finished runs older than `retention` (in batches) and drops
    /// history partitions older than that. Returns (runs, partitions).
    pub async fn apply_retention(
        &self,
        retention: Duration,
        batch: i64,
    ) -> Result<(u64, i32), CoordinatorError> {
        let age = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
        let cutoff = chrono::Utc::now() - age;
        let mut runs_deleted = 0;
        loop {
            let deleted = runs::delete_finished_runs(self.store.pool(), cutoff, batch).await?;
            runs_deleted += deleted;
            if deleted < u64::try_from(batch).unwrap_or(0) {
                break;
            }
        }
        let partitions = runs::drop_old_history(self.store.pool(), cutoff).await?;
        if runs_deleted > 0 || partitions > 0 {
            tracing::info!(runs_deleted, partitions, "retention");
        }
        Ok((runs_deleted, partitions))
    }

    /// Fires due timers until `shutdown` flips: each pass takes the earliest
    /// due ones and fires them in batches of `timer_batch` per transaction,
    /// `timer_concurrency` batches at once, so a burst of due timers costs
    /// a few round trips per timer and does not queue behind one
    /// connection.
    pub async fn run_timer_loop(self, config: RecoveryConfig, mut shutdown: watch::Receiver<bool>) {
        let pass = config.timer_batch.max(1) * config.timer_concurrency.max(1);
        let pass_limit = i64::try_from(pass).unwrap_or(i64::MAX);
        while !*shutdown.borrow() {
            let fired = match timers::due_timers(self.store.pool(), pass_limit).await {
                Ok(due) => {
                    let coordinator = &self;
                    let fired = std::sync::atomic::AtomicUsize::new(0);
                    let fired_ref = &fired;
                    futures::stream::iter(due.chunks(config.timer_batch.max(1)))
                        .for_each_concurrent(config.timer_concurrency, |chunk| async move {
                            let count = match coordinator.fire_timers(chunk).await {
                                Ok(count) => count,
                                Err(error) => {
                                    tracing::warn!(%error, "timer batch failed; firing one by one");
                                    coordinator.fire_one_by_one(chunk).await
                                }
                            };
                            fired_ref.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
                        })
                        .await;
                    let fired = fired.into_inner();
                    crate::observe::metrics::recovery("timers", "fired", fired as u64);
                    fired
                }
                Err(error) => {
                    tracing::warn!(%error, "timer loop");
                    0
                }
            };
            if fired < pass {
                sleep_or_stop(config.timer_interval, &mut shutdown).await;
            }
        }
    }

    /// Offers again the leases whose worker never confirmed receipt, and
    /// expires the others past their deadline.
    pub async fn run_lease_loop(self, config: RecoveryConfig, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            match tasks::return_unconfirmed_leases(self.store.pool(), config.batch).await {
                Ok(0) => {}
                Ok(returned) => {
                    crate::observe::metrics::leases_returned(returned);
                    crate::observe::metrics::recovery("leases", "returned", returned);
                    tracing::info!(
                        returned,
                        "leases never confirmed by their worker offered again"
                    )
                }
                Err(error) => tracing::warn!(%error, "returning unconfirmed leases"),
            }
            match tasks::expired_leases(self.store.pool(), config.batch).await {
                Ok(expired) => {
                    for lease in &expired {
                        match self.expire_lease(lease).await {
                            Ok(true) => {
                                crate::observe::metrics::lease_expired(
                                    &lease.namespace,
                                    &lease.queue,
                                );
                                crate::observe::metrics::recovery("leases", "expired", 1);
                                tracing::info!(task_id = %lease.task_id, attempt = lease.attempt, "lease expired")
                            }
                            Ok(false) => {}
                            Err(error) => {
                                tracing::warn!(task_id = %lease.task_id, %error, "lease not expired")
                            }
                        }
                    }
                }
                Err(error) => tracing::warn!(%error, "lease loop"),
            }
            sleep_or_stop(config.lease_interval, &mut shutdown).await;
        }
    }

    /// Republishes lost dispatches, hands free task slots to tasks left
    /// waiting, applies stuck inboxes, keeps history partitions ahead: so Redis and the hand-offs never drift for long.
    /// Lost dispatches are looked for in the queues `served` polls on.
    pub async fn run_reconcile_loop(
        self,
        config: RecoveryConfig,
        served: Arc<PollHub>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let grace_ms = i64::try_from(config.lost_dispatch_grace.as_millis()).unwrap_or(i64::MAX);
        let mut last_partition_check: Option<tokio::time::Instant> = None;
        let mut last_blob_collect: Option<tokio::time::Instant> = None;
        while !*shutdown.borrow() {
            if last_blob_collect.is_none_or(|at| at.elapsed() > config.blob_collect_interval) {
                last_blob_collect = Some(tokio::time::Instant::now());
                self.collect_blobs_logged().await;
            }
            let queues = served.served_queues();
            match tasks::republish_lost_dispatches(
                self.store.pool(),
                grace_ms,
                config.batch,
                &queues,
            )
            .await
            {
                Ok(0) => {}
                Ok(count) => {
                    crate::observe::metrics::recovery("reconcile", "republished", count);
                    tracing::info!(count, "republished dispatches never leased")
                }
                Err(error) => tracing::warn!(%error, "lost dispatch pass"),
            }
            match tasks::promote_stranded_waiters(self.store.pool(), grace_ms, config.batch).await {
                Ok(0) => {}
                Ok(count) => {
                    crate::observe::metrics::recovery("reconcile", "slots_handed", count as u64);
                    tracing::info!(count, "handed free task slots to tasks left waiting")
                }
                Err(error) => tracing::warn!(%error, "task slot pass"),
            }
            match events::runs_with_inbox(self.store.pool(), config.batch).await {
                Ok(runs) => {
                    crate::observe::metrics::recovery("reconcile", "inboxes", runs.len() as u64);
                    self.after_commit(runs).await
                }
                Err(error) => tracing::warn!(%error, "inbox pass"),
            }
            if last_partition_check.is_none_or(|at| at.elapsed() > Duration::from_secs(3600)) {
                match self.store.ensure_history_partitions(7).await {
                    Ok(_) => last_partition_check = Some(tokio::time::Instant::now()),
                    Err(error) => tracing::warn!(%error, "history partitions"),
                }
                if let Err(error) = self.apply_retention(config.retention, config.batch).await {
                    tracing::warn!(%error, "retention pass");
                }
                match self.sweep_unused_keys(config.batch).await {
                    Ok(swept) if swept.run_keys + swept.task_keys > 0 => {
                        crate::observe::metrics::recovery(
                            "reconcile",
                            "unused_keys",
                            swept.run_keys + swept.task_keys,
                        );
                        tracing::info!(
                            run_keys = swept.run_keys,
                            task_keys = swept.task_keys,
                            "deleted unused concurrency key rows"
                        );
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "unused concurrency key pass"),
                }
            }
            sleep_or_stop(config.reconcile_interval, &mut shutdown).await;
        }
    }
}

async fn sleep_or_stop(period: Duration, shutdown: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep(period) => {},
        _ = shutdown.changed() => {},
    }
}
