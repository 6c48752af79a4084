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

use std::collections::HashSet;

use composer_store::tasks::{self, LeasedTask, OutboxMessage};
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
        let candidates = candidates_for(outboxes, &namespace, &queue, poll.want);
        let leased = tasks::lease_armed_tasks(
            conn,
            &candidates,
            &poll.worker_id,
            &namespace,
            &queue,
            poll.receipt,
        )
        .await?;
        let leased_ids: HashSet<(Uuid, i32)> = leased.iter().map(|t| (t.id, t.attempt)).collect();
        for outbox in outboxes.iter_mut() {
            outbox.retain(|m| !leased_ids.contains(&(m.task_id, m.attempt)));
        }
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
