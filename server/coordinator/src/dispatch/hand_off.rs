//! Direct hand-off (docs/decisions/0034-direct-hand-off.md): a task an
//! event arms, for a queue on which a poll is waiting in this server, is
//! leased to that poll inside the event's own transaction and sent to it
//! after the commit, once the answers to the transaction's reports are
//! written ([`crate::dispatch::answer_sent`]). It never goes through Redis: no XADD,
//! no stream read, no lease transaction of its own.
//!
//! The lease is the same conditional statement a poll's lease runs, so
//! fencing is unchanged; the task is DISPATCHED only inside the
//! transaction. A poll gone by the commit has its leases released, as the
//! poll hub does; a transaction that fails drops the poll, which answers
//! with no task, and its tasks were never leased.
//!
//! A group's shared writes go one better (decision 0051): the poll is taken
//! before the write, and the tasks it will take are written LEASED as they
//! are armed ([`ArmHandOff`]), one row write each instead of an insert and
//! an update. Whatever the shared write could not lease (a run written
//! alone) is leased after it as before.

use std::{collections::HashSet, sync::Arc};

use composer_store::tasks::{self, ArmLease, LeasedTask, OutboxMessage, TaskArm};
use uuid::Uuid;

use crate::{
    Coordinator, dispatch::answer_sent::AnswerSent, dispatch::poll_hub::WaitingPoll,
    error::CoordinatorError,
};

/// Tasks leased to a waiting poll in an event's transaction, to send it
/// once that commits.
pub(crate) struct Handed {
    poll: WaitingPoll,
    tasks: Vec<LeasedTask>,
}

impl Coordinator {
    /// Inside the event's transaction, before its commit: leases tasks it
    /// armed to one poll waiting in this server, taking them out of
    /// `outboxes` (what is left is published as before). One lease
    /// statement at most per transaction, for the first queue with a
    /// waiting poll: the transaction holds its runs' locks meanwhile.
    pub(crate) async fn hand_off(
        &self,
        conn: &mut sqlx::PgConnection,
        outboxes: &mut [&mut Vec<OutboxMessage>],
    ) -> Result<Option<Handed>, CoordinatorError> {
        let Some(polls) = &self.polls else {
            return Ok(None);
        };
        let Some((poll, namespace, queue)) = first_waiting_poll(polls, outboxes) else {
            return Ok(None);
        };
        let room = poll.want;
        let leased = lease_from_outboxes(conn, &poll, &namespace, &queue, room, outboxes).await?;
        Ok(Some(Handed {
            poll,
            tasks: leased,
        }))
    }

    /// After the commit, once the transaction's reports are answered:
    /// sends the leased tasks to their poll when those answers are written
    /// (`answers_sent`), so that a worker learns a step is done before it
    /// sees the next (a poll gone meanwhile has its leases released, as
    /// the poll hub's are). Its own task: the caller goes on publishing.
    pub(crate) fn send_handed(&self, handed: Option<Handed>, answers_sent: Vec<AnswerSent>) {
        let Some(Handed { poll, tasks }) = handed else {
            return;
        };
        if let Some(first) = tasks.first() {
            let count = u64::try_from(tasks.len()).unwrap_or(u64::MAX);
            crate::observe::metrics::tasks_dispatched(&first.namespace, &first.queue, count);
            // armed as surely as the published ones: the same quota
            let quotas = self.config.quotas.of(&first.namespace);
            self.task_rates.spend(
                &first.namespace,
                &quotas,
                tasks.len(),
                std::time::Instant::now(),
            );
        }
        let store = self.store.clone();
        tokio::spawn(async move {
            AnswerSent::all(answers_sent).await;
            poll.deliver(&store, tasks).await;
        });
    }
}

/// A poll taken in a group's transaction for the tasks its shared writes
/// arm: they are written leased to it (decision 0051).
pub(crate) struct ArmHandOff {
    poll: WaitingPoll,
    namespace: String,
    queue: String,
    /// The poll's worker, which the arms borrow for their write.
    owner: Arc<str>,
    /// What it leased so far, in the order written.
    leased: Vec<LeasedTask>,
    /// Tasks marked for it so far (a marked task whose run was gone by
    /// the write was not leased).
    marked: usize,
}

/// One write's arms with what decides whether they may be handed: its run
/// may hand off (not paused, sent by this server) and its priority.
pub(crate) struct ArmsOf<'w, 'a> {
    pub(crate) arms: &'w mut [TaskArm<'a>],
    pub(crate) may_hand_off: bool,
    pub(crate) priority: i16,
}

impl ArmHandOff {
    /// The worker the arms of a write lease to; the caller keeps it while
    /// they are written.
    pub(crate) fn owner(&self) -> Arc<str> {
        Arc::clone(&self.owner)
    }

    /// The tasks a shared write leased to this poll.
    pub(crate) fn took(&mut self, leased: Vec<LeasedTask>) {
        self.leased.extend(leased);
    }
}

impl Coordinator {
    /// Before a shared write: takes a poll waiting in this server for the
    /// first queue the write arms a task of (unless one is taken already),
    /// then marks up to what the poll still wants of that queue's tasks,
    /// highest priority first and in the order armed within one, to be
    /// written leased to `owner` (the poll's [`ArmHandOff::owner`]).
    pub(crate) fn mark_hand_off<'a>(
        &self,
        taken: &mut Option<ArmHandOff>,
        writes: &mut [ArmsOf<'_, 'a>],
        owner: &'a Option<Arc<str>>,
    ) {
        let (Some(handing), Some(owner)) = (taken.as_mut(), owner.as_deref()) else {
            return;
        };
        let mut places: Vec<(i16, usize, usize)> = Vec::new();
        for (w, write) in writes.iter().enumerate() {
            if !write.may_hand_off {
                continue;
            }
            for (a, arm) in write.arms.iter().enumerate() {
                if arm.concurrency.is_none()
                    && arm.namespace == handing.namespace
                    && arm.queue == handing.queue
                {
                    places.push((write.priority, w, a));
                }
            }
        }
        places.sort_by_key(|&(priority, w, a)| (std::cmp::Reverse(priority), w, a));
        let room = handing.poll.want.saturating_sub(handing.marked);
        let receipt_ms = handing
            .poll
            .receipt
            .map(|r| i64::try_from(r.as_millis()).unwrap_or(i64::MAX));
        for &(_, w, a) in places.iter().take(room) {
            writes[w].arms[a].lease_to = Some(ArmLease { owner, receipt_ms });
            handing.marked += 1;
        }
    }

    /// Takes a poll waiting in this server for the first queue, in the
    /// order armed, of the tasks `writes` may hand off, unless one is
    /// taken already.
    pub(crate) fn take_poll_for_arms(
        &self,
        taken: &mut Option<ArmHandOff>,
        writes: &[ArmsOf<'_, '_>],
    ) {
        if taken.is_some() {
            return;
        }
        let Some(polls) = &self.polls else {
            return;
        };
        let mut tried = HashSet::new();
        let arms = writes
            .iter()
            .filter(|w| w.may_hand_off)
            .flat_map(|w| w.arms.iter())
            .filter(|arm| arm.concurrency.is_none());
        for arm in arms {
            if !tried.insert((arm.namespace, arm.queue)) {
                continue;
            }
            if let Some(poll) = polls.take_waiting_poll(arm.namespace, arm.queue) {
                *taken = Some(ArmHandOff {
                    owner: Arc::from(poll.worker_id.as_str()),
                    poll,
                    namespace: arm.namespace.to_owned(),
                    queue: arm.queue.to_owned(),
                    leased: Vec::new(),
                    marked: 0,
                });
                return;
            }
        }
    }

    /// Before the commit of a group whose writes took a poll: leases it
    /// what it still wants of its queue's tasks the writes armed
    /// DISPATCHED (a run written alone), taking them out of `outboxes`.
    pub(crate) async fn finish_hand_off(
        &self,
        conn: &mut sqlx::PgConnection,
        taken: ArmHandOff,
        outboxes: &mut [&mut Vec<OutboxMessage>],
    ) -> Result<Handed, CoordinatorError> {
        let ArmHandOff {
            poll,
            namespace,
            queue,
            mut leased,
            ..
        } = taken;
        let room = poll.want.saturating_sub(leased.len());
        leased.extend(lease_from_outboxes(conn, &poll, &namespace, &queue, room, outboxes).await?);
        Ok(Handed {
            poll,
            tasks: leased,
        })
    }
}

/// Leases `poll` up to `room` of the queue's tasks armed DISPATCHED in
/// `outboxes` (the event's transaction's lease statement), taking them out.
async fn lease_from_outboxes(
    conn: &mut sqlx::PgConnection,
    poll: &WaitingPoll,
    namespace: &str,
    queue: &str,
    room: usize,
    outboxes: &mut [&mut Vec<OutboxMessage>],
) -> Result<Vec<LeasedTask>, CoordinatorError> {
    let candidates = candidates_for(outboxes, namespace, queue, room);
    let leased = tasks::lease_armed_tasks(
        conn,
        &candidates,
        &poll.worker_id,
        namespace,
        queue,
        poll.receipt,
    )
    .await?;
    let ids: HashSet<(Uuid, i32)> = leased.iter().map(|t| (t.id, t.attempt)).collect();
    for outbox in outboxes.iter_mut() {
        outbox.retain(|m| !ids.contains(&(m.task_id, m.attempt)));
    }
    Ok(leased)
}

/// The first queue, in the order the tasks were armed, with a poll
/// waiting in this server that may take them directly.
fn first_waiting_poll(
    polls: &crate::dispatch::poll_hub::PollHub,
    outboxes: &[&mut Vec<OutboxMessage>],
) -> Option<(WaitingPoll, String, String)> {
    let mut tried = HashSet::new();
    for message in outboxes.iter().flat_map(|o| o.iter()) {
        // a message with an outbox row is the enqueuer's to delete once sent
        if message.outbox_id.is_some() || !tried.insert((&message.namespace, &message.queue)) {
            continue;
        }
        if let Some(poll) = polls.take_waiting_poll(&message.namespace, &message.queue) {
            return Some((poll, message.namespace.clone(), message.queue.clone()));
        }
    }
    None
}

/// Up to `want` of the queue's armed tasks, highest priority first and in
/// the order they were armed within one.
fn candidates_for(
    outboxes: &[&mut Vec<OutboxMessage>],
    namespace: &str,
    queue: &str,
    want: usize,
) -> Vec<(Uuid, i32)> {
    let mut matching: Vec<&OutboxMessage> = outboxes
        .iter()
        .flat_map(|o| o.iter())
        .filter(|m| m.outbox_id.is_none() && m.namespace == namespace && m.queue == queue)
        .collect();
    matching.sort_by_key(|m| std::cmp::Reverse(m.priority));
    matching
        .into_iter()
        .take(want)
        .map(|m| (m.task_id, m.attempt))
        .collect()
}
