//! When the answer to a report has left the server (decision 0034): a
//! task handed straight to a waiting poll is sent only after the answers
//! to the reports of the transaction that leased it, so that a worker is
//! told a step is done before it sees the step's successor. The transport
//! holds an [`AnswerInFlight`] until the report's answer is written and
//! drops it then; the coordinator waits on the matching [`AnswerSent`].

use std::time::Duration;

use tokio::sync::oneshot;

/// Longest a handed task waits for its reports' answers to be written: a
/// worker that does not read its connection must not hold another's task.
pub const MOST_WAIT: Duration = Duration::from_millis(200);

/// A pair: the transport keeps the first until the answer is written.
pub fn signal() -> (AnswerInFlight, AnswerSent) {
    let (in_flight, sent) = oneshot::channel();
    (
        AnswerInFlight {
            _held: std::sync::Arc::new(in_flight),
        },
        AnswerSent(sent),
    )
}

/// Held while a report's answer is being written; dropping the last clone
/// says it has been (cloneable so it can ride in a response's extensions).
#[derive(Clone, Debug)]
pub struct AnswerInFlight {
    _held: std::sync::Arc<oneshot::Sender<()>>,
}

/// Resolves once the matching [`AnswerInFlight`] is dropped.
#[derive(Debug)]
pub struct AnswerSent(oneshot::Receiver<()>);

impl AnswerSent {
    /// True once the answer is written (without waiting).
    pub fn is_written_now(&mut self) -> bool {
        matches!(self.0.try_recv(), Err(oneshot::error::TryRecvError::Closed))
    }

    /// Waits until every answer is written, or [`MOST_WAIT`] at most.
    pub(crate) async fn all(answers: Vec<AnswerSent>) {
        if answers.is_empty() {
            return;
        }
        let written = async {
            for answer in answers {
                // the sender is never used: only its drop is the signal
                let _ = answer.0.await;
            }
        };
        let _ = tokio::time::timeout(MOST_WAIT, written).await;
    }
}
