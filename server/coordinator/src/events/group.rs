//! Group commit: StartRuns and worker reports of different runs that
//! arrive at this server together are applied in one Postgres transaction
//! (docs/decisions/0023-group-commit.md).
//!
//! Each item (one StartRun, or one run's batch of reports) is still
//! decided on its own run. An item that fails aborts the transaction: the
//! others are applied again as a group without it, and it goes on its own
//! after their commit, so it never fails the others. Nobody is answered
//! before the commit.
//!
//! Gathering never waits while nothing is being applied: the first item
//! at an idle server goes at once, alone. Items that arrive while groups
//! are in flight wait for the next group, which waits at most the window
//! (or until it is full) before it begins.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, Ordering},
};
use std::time::Duration;

use composer_engine::Event;
use composer_store::{
    group_write,
    runs::{self, FencedReports, RunRow},
};
use tokio::sync::{Notify, oneshot};
use uuid::Uuid;

use crate::{
    Coordinator,
    dispatch::hand_off::{ArmHandOff, ArmsOf, Handed},
    error::CoordinatorError,
    events::apply::{Applied, RunTxn},
    events::reports::{QueueKey, QueuedReport, ReportAnswer, ReportPlan},
    payloads::ReferFailed,
    workflows::LoadedWorkflow,
};

/// Items one group holds at most: bounds one transaction's locks, and the
/// work redone when one of its items fails.
pub const MAX_GROUP_ITEMS: usize = 64;

/// Groups one server applies at once at most, each on its own connection.
pub const MAX_GROUPS_IN_FLIGHT: usize = 16;

/// A run to insert with its first event, as the one-statement StartRun
/// writes it.
pub(crate) struct NewStart {
    pub(crate) run: RunRow,
    pub(crate) workflow: Arc<LoadedWorkflow>,
    pub(crate) only_if_latest: bool,
    pub(crate) actor: String,
}

/// One item of a group.
pub(crate) enum GroupItem {
    /// A batch of one run's reports; each report is answered through its
    /// own sender, then `done` tells the run's queue to go on.
    Reports {
        queue: QueueKey,
        batch: Vec<QueuedReport>,
        done: oneshot::Sender<()>,
    },
    /// A StartRun.
    Start {
        start: Box<NewStart>,
        answer: oneshot::Sender<Result<Applied, CoordinatorError>>,
    },
}

/// The order items take their locks in, the same in every group, so two
/// groups never wait for each other in a circle: idempotency keys first
/// (a StartRun's insert waits on another transaction's row of its key),
/// then runs by id.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum LockOrder<'a> {
    Key(&'a str, &'a str),
    Run(Uuid),
}

impl GroupItem {
    /// The namespace whose run the item changes.
    fn namespace(&self) -> &str {
        match self {
            GroupItem::Reports { queue, .. } => &queue.1.namespace,
            GroupItem::Start { start, .. } => &start.run.namespace,
        }
    }

    fn lock_order(&self) -> LockOrder<'_> {
        match self {
            GroupItem::Reports { queue, .. } => LockOrder::Run(queue.0),
            GroupItem::Start { start, .. } => LockOrder::Key(
                &start.run.namespace,
                start.run.idempotency_key.as_deref().unwrap_or_default(),
            ),
        }
    }
}

/// What became of an item inside the group's transaction.
enum Outcome {
    Reports(Vec<ReportAnswer>, Applied),
    Start(Applied),
}

impl Outcome {
    /// The tasks its events armed, to publish after the commit.
    fn outbox(&mut self) -> &mut Vec<composer_store::tasks::OutboxMessage> {
        &mut self.applied().outbox
    }

    fn applied(&mut self) -> &mut Applied {
        match self {
            Outcome::Reports(_, applied) | Outcome::Start(applied) => applied,
        }
    }
}

/// Why a group's transaction committed nothing.
enum GroupFailed {
    /// This item's statements failed: the others go again without it.
    Item(usize, CoordinatorError),
    /// The statement that wrote several runs failed: which run's part
    /// failed is unknown, so the group goes again with a write per run.
    SharedWrite(CoordinatorError),
    /// The group's own statements failed (`BEGIN`, `COMMIT`).
    Group(CoordinatorError),
}

/// The items waiting for a group and the groups under way.
#[derive(Default)]
struct Waiting {
    items: VecDeque<GroupItem>,
    /// Tasks taking and applying groups.
    leaders: usize,
    /// Of those, the ones inside a transaction now.
    applying: usize,
    /// Groups inside a transaction now, by namespace (none: absent).
    applying_by_namespace: HashMap<String, usize>,
}

impl Waiting {
    fn begin(&mut self, namespace: &str) {
        self.applying += 1;
        *self
            .applying_by_namespace
            .entry(namespace.to_owned())
            .or_default() += 1;
    }

    fn end(&mut self, namespace: &str) {
        self.applying -= 1;
        if let Some(count) = self.applying_by_namespace.get_mut(namespace) {
            *count -= 1;
            if *count == 0 {
                self.applying_by_namespace.remove(namespace);
            }
        }
    }
}

/// The gathering of items into groups.
pub(crate) struct GroupCommit {
    waiting: Mutex<Waiting>,
    full: Notify,
    window: Duration,
    max_items: usize,
    /// Groups applied at once, each on its own connection.
    in_flight: usize,
    /// Groups of more than one item begun, and the items in them.
    groups: AtomicU64,
    grouped_items: AtomicU64,
    shared_writes: AtomicU64,
}

/// How much was grouped since the server started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupCommitStats {
    /// Transactions that held more than one item.
    pub groups: u64,
    /// The items in them.
    pub items: u64,
    /// Runs written by a statement shared with other runs (decision 0026).
    pub shared_writes: u64,
}

impl GroupCommit {
    /// Groups of at most `max_items` gathered for at most `window` while
    /// another group is under way; a zero window or a group of one: off.
    pub(crate) fn new(window: Duration, max_items: usize, in_flight: usize) -> Self {
        Self {
            waiting: Mutex::default(),
            full: Notify::new(),
            window,
            max_items: max_items.clamp(1, MAX_GROUP_ITEMS),
            in_flight: in_flight.clamp(1, MAX_GROUPS_IN_FLIGHT),
            groups: AtomicU64::new(0),
            grouped_items: AtomicU64::new(0),
            shared_writes: AtomicU64::new(0),
        }
    }

    fn count(&self, items: usize) {
        self.groups.fetch_add(1, Ordering::Relaxed);
        self.grouped_items
            .fetch_add(u64::try_from(items).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn count_shared(&self, runs: usize) {
        self.shared_writes
            .fetch_add(u64::try_from(runs).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            groups: self.groups.load(Ordering::Relaxed),
            items: self.grouped_items.load(Ordering::Relaxed),
            shared_writes: self.shared_writes.load(Ordering::Relaxed),
        }
    }

    /// False: every item is applied in its own transaction, as before.
    pub(crate) fn is_on(&self) -> bool {
        !self.window.is_zero() && self.max_items > 1
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues an item; true when the caller must start another leader.
    fn push(&self, item: GroupItem) -> bool {
        let mut waiting = self.lock();
        waiting.items.push_back(item);
        if waiting.items.len() >= self.max_items {
            self.full.notify_waiters();
        }
        // a new leader only when every leader is inside a transaction:
        // one gathers at a time
        let start = waiting.leaders < self.in_flight && waiting.leaders == waiting.applying;
        if start {
            waiting.leaders += 1;
        }
        start
    }

    /// Waits for a group's worth of items, while another group is being
    /// applied and for at most the window; at once when none is.
    async fn gather(&self) {
        let deadline = tokio::time::Instant::now() + self.window;
        loop {
            let full = self.full.notified();
            tokio::pin!(full);
            full.as_mut().enable();
            {
                let waiting = self.lock();
                if waiting.applying == 0 || waiting.items.len() >= self.max_items {
                    return;
                }
            }
            if tokio::time::timeout_at(deadline, full).await.is_err() {
                return;
            }
        }
    }

    /// Groups one namespace may have inside transactions at once: half of
    /// them (at least one), so another namespace's item always finds a
    /// leader free within one group's time.
    fn per_namespace(&self) -> usize {
        (self.in_flight / 2).max(1)
    }

    /// The next group: the oldest item of a namespace under its share of
    /// the groups, and the next ones of that namespace; None (and the
    /// leader ends) when nothing such waits: a namespace at its share has
    /// leaders applying, which take its items next. With the group,
    /// whether the caller must start another leader for the items left
    /// waiting.
    fn take(&self, leader: &mut Leader) -> Option<(Vec<GroupItem>, bool)> {
        let mut waiting = self.lock();
        let share = self.per_namespace();
        let first = waiting.items.iter().position(|item| {
            waiting
                .applying_by_namespace
                .get(item.namespace())
                .is_none_or(|applying| *applying < share)
        });
        let Some(first) = first else {
            waiting.leaders -= 1;
            leader.leading = false;
            return None;
        };
        let group = take_one_namespace(
            &mut waiting.items,
            first,
            self.max_items,
            GroupItem::namespace,
        );
        let namespace = group[0].namespace().to_owned();
        waiting.begin(&namespace);
        leader.applying = Some(namespace);
        let another = !waiting.items.is_empty()
            && waiting.leaders < self.in_flight
            && waiting.leaders == waiting.applying;
        if another {
            waiting.leaders += 1;
        }
        Some((group, another))
    }

    fn applied(&self, leader: &mut Leader) {
        if let Some(namespace) = leader.applying.take() {
            self.lock().end(&namespace);
        }
    }
}

/// Takes from `items` the one at `first` and, in order, up to `max` of
/// those after it in its namespace; the others keep their order. One
/// namespace's transaction never holds another's items, so a tenant's
/// costly StartRun (a MAP arming a thousand tasks) never delays another
/// tenant's answer.
fn take_one_namespace<T>(
    items: &mut VecDeque<T>,
    first: usize,
    max: usize,
    namespace: impl Fn(&T) -> &str,
) -> Vec<T> {
    let Some(head) = items.remove(first) else {
        return Vec::new();
    };
    let mut group = vec![head];
    let mut others = VecDeque::with_capacity(items.len());
    for (index, item) in std::mem::take(items).into_iter().enumerate() {
        if index >= first && group.len() < max && namespace(&item) == namespace(&group[0]) {
            group.push(item);
        } else {
            others.push_back(item);
        }
    }
    *items = others;
    group
}

/// A leader's place in the counts, given back even if it panics.
struct Leader {
    group: Arc<GroupCommit>,
    leading: bool,
    /// The namespace of the group it is applying.
    applying: Option<String>,
}

impl Drop for Leader {
    fn drop(&mut self) {
        if !self.leading && self.applying.is_none() {
            return;
        }
        let mut waiting = self.group.lock();
        if self.leading {
            waiting.leaders -= 1;
        }
        if let Some(namespace) = &self.applying {
            waiting.end(namespace);
        }
    }
}

impl Coordinator {
    /// Hands an item to the next group.
    pub(crate) fn submit_to_group(&self, item: GroupItem) {
        if self.group_commit.push(item) {
            self.spawn_leader();
        }
    }

    /// A leader in its own task: a caller that goes away must not strand
    /// a group.
    fn spawn_leader(&self) {
        let coordinator = self.clone();
        tokio::spawn(async move { coordinator.lead_groups().await });
    }

    /// Takes and applies groups until nothing waits.
    async fn lead_groups(&self) {
        let group_commit = Arc::clone(&self.group_commit);
        let mut leader = Leader {
            group: Arc::clone(&group_commit),
            leading: true,
            applying: None,
        };
        loop {
            group_commit.gather().await;
            let Some((items, another)) = group_commit.take(&mut leader) else {
                return;
            };
            if another {
                self.spawn_leader();
            }
            self.apply_group(items).await;
            group_commit.applied(&mut leader);
        }
    }

    /// Applies a group: one transaction; answers after the commit. An item
    /// whose statements fail aborts the transaction: the others are
    /// applied again as a group without it (once; a second failure sends
    /// every item alone), and it goes alone after their commit.
    async fn apply_group(&self, mut items: Vec<GroupItem>) {
        items.sort_by(|a, b| a.lock_order().cmp(&b.lock_order()));
        let mut failed = Vec::new();
        let mut shared_write = true;
        let mut failures = 0;
        while items.len() > 1 {
            self.group_commit.count(items.len());
            match self.group_transaction(&items, shared_write).await {
                Ok((outcomes, handed)) => {
                    self.answer_group(items, outcomes, handed).await;
                    items = Vec::new();
                    break;
                }
                Err(GroupFailed::SharedWrite(error)) if shared_write => {
                    // a write per run again, which names the item that fails
                    tracing::debug!(%error, "a group's shared write failed; again with one per run");
                    shared_write = false;
                }
                Err(GroupFailed::Item(index, error)) if failures == 0 => {
                    tracing::debug!(%error, "group item failed; the others go again without it");
                    failed.push(items.remove(index));
                    failures += 1;
                }
                Err(
                    GroupFailed::Item(_, error)
                    | GroupFailed::Group(error)
                    | GroupFailed::SharedWrite(error),
                ) => {
                    tracing::warn!(%error, items = items.len(), "group transaction failed; items alone");
                    break;
                }
            }
        }
        for item in items.into_iter().chain(failed) {
            self.apply_alone(item).await;
        }
    }

    /// The group's transaction. Err: nothing of it was committed. No
    /// savepoint per item: an item's failure is rare, and redoing the
    /// group then is cheaper than a savepoint round trip and a
    /// subtransaction id for every item of every group (decision 0023).
    ///
    /// StartRuns go first (their idempotency keys sort first); then the
    /// runs of all report batches are locked, fenced and loaded in one
    /// statement, in id order, and each batch is applied in turn. With
    /// `shared_write`, the StartRuns' runs are inserted in one statement
    /// and the batches' runs written in another (decision 0026); without,
    /// each run's write follows its events.
    async fn group_transaction(
        &self,
        items: &[GroupItem],
        shared_write: bool,
    ) -> Result<(Vec<Outcome>, Option<Handed>), GroupFailed> {
        let mut tx = self
            .store
            .begin()
            .await
            .map_err(|e| GroupFailed::Group(e.into()))?;
        let mut outcomes: Vec<Option<Outcome>> = Vec::with_capacity(items.len());
        let mut plans = Vec::new();
        let mut staged = Vec::new();
        // a poll the shared writes lease their tasks to as they arm them
        let mut taken: Option<ArmHandOff> = None;
        for (index, item) in items.iter().enumerate() {
            let item_failed = |error| GroupFailed::Item(index, error);
            match item {
                GroupItem::Start { start, .. } if shared_write => {
                    let txn = self
                        .stage_start(&mut tx, start)
                        .await
                        .map_err(item_failed)?;
                    staged.push(StagedItem {
                        index,
                        answers: None,
                        txn,
                    });
                    outcomes.push(None);
                }
                GroupItem::Start { start, .. } => {
                    let applied = self
                        .insert_start(&mut tx, start)
                        .await
                        .map_err(item_failed)?;
                    outcomes.push(Some(Outcome::Start(applied)));
                }
                GroupItem::Reports { queue, batch, .. } => {
                    let plan = self.plan_reports(queue, batch).await.map_err(item_failed)?;
                    plans.push((index, batch.as_slice(), plan));
                    outcomes.push(None);
                }
            }
        }
        // the StartRuns' keys before the reports' runs: the group's lock order
        self.write_staged(&mut tx, &mut staged, &mut outcomes, &mut taken)
            .await?;
        let found = lock_planned_runs(&mut tx, &plans)
            .await
            .map_err(|e| GroupFailed::Group(e.into()))?;
        for ((index, batch, plan), locked) in plans.iter().zip(found) {
            let item_failed = |error| GroupFailed::Item(*index, error);
            let found = match locked {
                Locked::Now(found) => found.map(|found| *found),
                Locked::Later => {
                    // its run's earlier batch is written before this one loads it
                    self.write_staged(&mut tx, &mut staged, &mut outcomes, &mut taken)
                        .await?;
                    plan.lock_alone(&mut tx)
                        .await
                        .map_err(|error| item_failed(error.into()))?
                }
            };
            let (answers, txn) = self
                .fenced_txn(&mut tx, batch, plan, found)
                .await
                .map_err(item_failed)?;
            let applied = match txn {
                None => crate::events::apply::Applied::default(),
                Some(mut txn) if shared_write => {
                    txn.stage(&mut tx).await.map_err(item_failed)?;
                    staged.push(StagedItem {
                        index: *index,
                        answers: Some(answers),
                        txn,
                    });
                    continue;
                }
                Some(txn) => txn.finish(&mut tx).await.map_err(item_failed)?,
            };
            outcomes[*index] = Some(Outcome::Reports(answers, applied));
        }
        self.write_staged(&mut tx, &mut staged, &mut outcomes, &mut taken)
            .await?;
        let mut outcomes = outcomes
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                GroupFailed::Group(CoordinatorError::Corrupt(
                    "a group item was left without an outcome".to_owned(),
                ))
            })?;
        let handed = match taken {
            Some(mut taken) => {
                for outcome in &mut outcomes {
                    taken.took(std::mem::take(&mut outcome.applied().leased));
                }
                let mut outboxes: Vec<_> = outcomes.iter_mut().map(Outcome::outbox).collect();
                let handed = self
                    .finish_hand_off(&mut tx, taken, &mut outboxes)
                    .await
                    .map_err(GroupFailed::Group)?;
                Some(handed)
            }
            None => {
                let mut outboxes: Vec<_> = outcomes.iter_mut().map(Outcome::outbox).collect();
                self.hand_off(&mut tx, &mut outboxes)
                    .await
                    .map_err(GroupFailed::Group)?
            }
        };
        tx.commit()
            .await
            .map_err(|e| GroupFailed::Group(e.into()))?;
        Ok((outcomes, handed))
    }

    /// Writes the staged items' runs in one statement (as few as
    /// [`group_write`] can): StartRuns' new runs, or report batches' runs,
    /// never both at once. Takes each item's outcome.
    async fn write_staged(
        &self,
        conn: &mut sqlx::PgConnection,
        staged: &mut Vec<StagedItem<'_>>,
        outcomes: &mut [Option<Outcome>],
        taken: &mut Option<ArmHandOff>,
    ) -> Result<(), GroupFailed> {
        if staged.is_empty() {
            return Ok(());
        }
        let runs: Vec<_> = staged.iter().map(|s| s.txn.blobs()).collect();
        self.refer_runs_to_blobs(conn, &runs)
            .await
            .map_err(|failed| match failed {
                ReferFailed::Missing(place, error) => match staged.get(place) {
                    Some(item) => GroupFailed::Item(item.index, error),
                    None => GroupFailed::Group(error),
                },
                ReferFailed::Store(error) => GroupFailed::Group(error),
            })?;
        drop(runs);
        let written = {
            // the poll's worker outlives the arms that lease to it
            let owner: Option<Arc<str>>;
            let mut arms: Vec<_> = staged.iter().map(|s| s.txn.task_arms()).collect();
            {
                let mut handing: Vec<ArmsOf<'_, '_>> = staged
                    .iter()
                    .zip(arms.iter_mut())
                    .map(|(s, arms)| ArmsOf {
                        arms,
                        may_hand_off: s.txn.hands_off_at_arm(),
                        priority: s.txn.priority(),
                    })
                    .collect();
                self.take_poll_for_arms(taken, &handing);
                owner = taken.as_ref().map(ArmHandOff::owner);
                self.mark_hand_off(taken, &mut handing, &owner);
            }
            let writes = staged
                .iter()
                .zip(&arms)
                .map(|(s, arms)| s.txn.event_write(arms))
                .collect::<Result<Vec<_>, _>>()
                .map_err(GroupFailed::Group)?;
            let inserts: Option<Vec<_>> = staged.iter().map(|s| s.txn.run_insert()).collect();
            match inserts {
                Some(inserts) => group_write::insert_runs(conn, &writes, &inserts).await,
                None => group_write::write_events(conn, &writes).await,
            }
            .map_err(|e| GroupFailed::SharedWrite(e.into()))?
        };
        self.group_commit.count_shared(written.shared);
        for (item, written) in staged.drain(..).zip(written.per_write) {
            let applied = item
                .txn
                .conclude(conn, written)
                .await
                .map_err(|error| GroupFailed::Item(item.index, error))?;
            let outcome = match item.answers {
                Some(answers) => Outcome::Reports(answers, applied),
                None => Outcome::Start(applied),
            };
            if let Some(slot) = outcomes.get_mut(item.index) {
                *slot = Some(outcome);
            }
        }
        Ok(())
    }

    /// After the commit: reports are answered before the tasks their
    /// events armed go out (as a run's own batch does), StartRuns after
    /// (as the one-statement start does).
    async fn answer_group(
        &self,
        items: Vec<GroupItem>,
        outcomes: Vec<Outcome>,
        handed: Option<Handed>,
    ) {
        let mut reported: Vec<Applied> = Vec::with_capacity(items.len());
        let mut starts = Vec::new();
        let mut reports_done = Vec::new();
        let mut answers_sent = Vec::new();
        for (item, outcome) in items.into_iter().zip(outcomes) {
            match (item, outcome) {
                (GroupItem::Reports { batch, done, .. }, Outcome::Reports(answers, applied)) => {
                    for (queued, answer) in batch.into_iter().zip(answers) {
                        answers_sent.extend(queued.answer_with(answer));
                    }
                    reported.push(applied);
                    reports_done.push(done);
                }
                (GroupItem::Start { answer, .. }, Outcome::Start(applied)) => {
                    starts.push((answer, applied));
                }
                // items and outcomes are zipped in order: never mixed
                (GroupItem::Reports { .. } | GroupItem::Start { .. }, _) => {}
            }
        }
        self.send_handed(handed, answers_sent);
        let mut to_announce: Vec<&mut Applied> = reported.iter_mut().collect();
        for (_, applied) in &mut starts {
            if applied.created_at.is_some() {
                to_announce.push(applied);
            }
        }
        self.announce_all(to_announce).await;
        for (answer, applied) in starts {
            let _ = answer.send(Ok(applied));
        }
        for done in reports_done {
            let _ = done.send(());
        }
    }

    /// [`announce`](Coordinator::announce) for every item of a group, with
    /// the tasks they armed sent to Redis together.
    async fn announce_all(&self, applied: Vec<&mut Applied>) {
        let mut outbox = Vec::new();
        let mut inbox_runs = Vec::new();
        for applied in applied {
            if applied.span.is_some() {
                // traced: its dispatch span wraps its own publish
                self.announce(applied).await;
                continue;
            }
            applied.counted.record(&applied.status);
            self.run_changed(applied.run_id);
            outbox.append(&mut applied.outbox);
            inbox_runs.append(&mut applied.inbox_runs);
        }
        self.publish(outbox).await;
        self.after_commit(inbox_runs).await;
    }

    /// An item in a transaction of its own, as without group commit.
    async fn apply_alone(&self, item: GroupItem) {
        match item {
            GroupItem::Reports { queue, batch, done } => {
                self.reports_alone(&queue, batch).await;
                let _ = done.send(());
            }
            GroupItem::Start { start, answer } => {
                let _ = answer.send(self.start_alone(&start).await);
            }
        }
    }

    /// The run's insert and first event, in one statement on `conn`;
    /// `created_at` None: not inserted (its idempotency key is taken, or
    /// its version is not the latest any more). Nothing announced yet.
    pub(crate) async fn insert_start(
        &self,
        conn: &mut sqlx::PgConnection,
        start: &NewStart,
    ) -> Result<Applied, CoordinatorError> {
        self.stage_start(conn, start).await?.write_alone(conn).await
    }

    /// A StartRun's first event applied, its run not written yet (it runs
    /// no statement: the caller checked that it writes rows only).
    async fn stage_start(
        &self,
        conn: &mut sqlx::PgConnection,
        start: &NewStart,
    ) -> Result<RunTxn<'_>, CoordinatorError> {
        let mut txn = RunTxn::new_unsaved_run(
            self,
            start.run.clone(),
            Arc::clone(&start.workflow),
            start.only_if_latest,
        )?;
        txn.push(Event::RunStarted, &start.actor);
        txn.stage(conn).await?;
        Ok(txn)
    }

    /// A StartRun's one statement, autocommitted, then announced. An input
    /// that refers to blobs takes a transaction: the run's references and
    /// the run are committed together (decision 0047).
    pub(crate) async fn start_alone(&self, start: &NewStart) -> Result<Applied, CoordinatorError> {
        let mut applied = if composer_engine::blob::holds_references(&start.run.input) {
            let mut tx = self.store.begin().await?;
            let applied = self.insert_start(&mut tx, start).await?;
            tx.commit().await?;
            applied
        } else {
            let mut conn = self.store.pool().acquire().await?;
            self.insert_start(&mut conn, start).await?
        };
        if applied.created_at.is_some() {
            self.announce(&mut applied).await;
        }
        Ok(applied)
    }

    /// A StartRun through the next group (or alone when group commit is
    /// off); answered once its run is committed.
    pub(crate) async fn start_grouped(&self, start: NewStart) -> Result<Applied, CoordinatorError> {
        if !self.group_commit.is_on() {
            return self.start_alone(&start).await;
        }
        let (answer, answered) = oneshot::channel();
        self.submit_to_group(GroupItem::Start {
            start: Box::new(start),
            answer,
        });
        answered.await.unwrap_or_else(|_| {
            Err(CoordinatorError::Corrupt(
                "the StartRun was dropped unanswered".to_owned(),
            ))
        })
    }

    /// A batch of one run's reports through the next group; returns once
    /// the group has answered them.
    pub(crate) async fn reports_grouped(&self, queue: &QueueKey, batch: Vec<QueuedReport>) {
        let (done, finished) = oneshot::channel();
        self.submit_to_group(GroupItem::Reports {
            queue: queue.clone(),
            batch,
            done,
        });
        let _ = finished.await;
    }
}

/// Locks, fences and loads the runs of a group's report batches in one
/// statement. A run with two batches in the group (two callers' scopes
/// reporting on it) gets `Later` for its second: that one must be loaded
/// after the first is written, and then finds the run already locked.
async fn lock_planned_runs(
    conn: &mut sqlx::PgConnection,
    plans: &[(usize, &[QueuedReport], ReportPlan)],
) -> Result<Vec<Locked>, composer_store::StoreError> {
    let mut seen = HashSet::with_capacity(plans.len());
    let first: Vec<bool> = plans
        .iter()
        .map(|(_, _, plan)| seen.insert(plan.run_id()))
        .collect();
    let requests: Vec<_> = plans
        .iter()
        .zip(&first)
        .filter(|(_, first)| **first)
        .map(|((_, _, plan), _)| plan.request())
        .collect();
    let mut found = runs::lock_runs_fence_and_load(conn, &requests)
        .await?
        .into_iter();
    Ok(first
        .iter()
        .map(|&first| {
            if first {
                Locked::Now(found.next().flatten().map(Box::new))
            } else {
                Locked::Later
            }
        })
        .collect())
}

/// A group's item applied and waiting for the shared write of its run.
struct StagedItem<'a> {
    /// Its item in the group.
    index: usize,
    /// A report batch's answers; None: a StartRun.
    answers: Option<Vec<ReportAnswer>>,
    txn: RunTxn<'a>,
}

/// A report batch's run as [`lock_planned_runs`] left it.
enum Locked {
    /// Locked and loaded (None: no such run).
    Now(Option<Box<FencedReports>>),
    /// To lock and load when its turn comes.
    Later,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_holds_the_oldest_items_of_one_namespace_and_leaves_the_rest_in_order() {
        let mut items: VecDeque<(&str, u32)> = [
            ("a", 1),
            ("b", 2),
            ("a", 3),
            ("c", 4),
            ("a", 5),
            ("b", 6),
            ("a", 7),
        ]
        .into();
        let group = take_one_namespace(&mut items, 0, 3, |item| item.0);
        assert_eq!(group, [("a", 1), ("a", 3), ("a", 5)]);
        assert_eq!(
            Vec::from(items.clone()),
            [("b", 2), ("c", 4), ("b", 6), ("a", 7)],
            "the fourth of a waits: the group is full"
        );
        assert_eq!(
            take_one_namespace(&mut items, 1, 3, |item| item.0),
            [("c", 4)]
        );
        assert_eq!(
            take_one_namespace(&mut items, 0, 3, |item| item.0),
            [("b", 2), ("b", 6)]
        );
        assert_eq!(
            take_one_namespace(&mut items, 0, 3, |item| item.0),
            [("a", 7)]
        );
        assert!(take_one_namespace(&mut items, 0, 3, |item| item.0).is_empty());
    }
}
