//! Blob rows written in groups. Every upload writes its blob's row before
//! publishing the bytes; alone, each row would be a statement and a commit
//! (a WAL flush) of its own. One task writes the rows of the uploads
//! waiting at that moment in one statement, as the group commit does for
//! events, and answers each of them. The rows written lately are
//! remembered: a reference to one of them, coming back in a worker's report
//! a moment later, is known to exist without asking Postgres again.

use std::{
    collections::HashMap,
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use composer_store::{
    StoreError,
    blobs::{self, BlobRow},
};
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

/// Rows written by one statement at most.
const GROUP: usize = 256;

/// How long a written row is taken to exist without asking: the collector
/// spares a row for an hour after its last touch, and a touch leaves a row
/// touched within five minutes as it is; so a reference accepted on this
/// memory is good for 50 minutes at least (55 on a query).
const REMEMBERED: Duration = Duration::from_secs(300);

/// Rows remembered at most (each with its head, about 450 bytes); past it
/// they are forgotten. A worker's report brings a reference back seconds
/// after its upload: a few seconds of uploads are enough to remember.
const REMEMBERED_ROWS: usize = 16_384;

struct Touch {
    namespace: String,
    row: BlobRow,
    done: oneshot::Sender<Result<(), Failed>>,
}

/// Why a group's statement failed, for each of its uploads (the store's
/// error is not `Clone`): too slow, or any other failure.
#[derive(Clone)]
struct Failed {
    timed_out: bool,
    message: String,
}

impl From<Failed> for StoreError {
    fn from(failed: Failed) -> Self {
        if failed.timed_out {
            StoreError::TimedOut
        } else {
            StoreError::Unreachable(failed.message)
        }
    }
}

fn stopped() -> StoreError {
    StoreError::Unreachable("the blob row writer stopped".into())
}

/// The writer of blob rows, started by its first use (a runtime is there
/// then) and ended with the coordinator. Its queue is bounded by the
/// uploads in flight (the `blob_transfers` quota).
#[derive(Default)]
pub(super) struct RowWriter {
    sender: OnceLock<mpsc::UnboundedSender<Touch>>,
    written: Mutex<HashMap<(String, String), (BlobRow, Instant)>>,
}

impl RowWriter {
    /// Writes or touches `row` of `namespace`, in a group with the others
    /// waiting. A failed group fails each of its uploads.
    pub async fn touch(
        &self,
        pool: &PgPool,
        namespace: &str,
        row: BlobRow,
    ) -> Result<(), StoreError> {
        let sender = self.sender.get_or_init(|| start(pool.clone()));
        let (done, answer) = oneshot::channel();
        let touch = Touch {
            namespace: namespace.to_owned(),
            row: row.clone(),
            done,
        };
        let written_at = Instant::now();
        sender.send(touch).map_err(|_| stopped())?;
        answer
            .await
            .map_err(|_| stopped())?
            .map_err(StoreError::from)?;
        self.remember(namespace, row, written_at);
        Ok(())
    }

    /// The row of `sha256` in `namespace` if this server wrote or touched
    /// it lately.
    pub fn written_lately(&self, namespace: &str, sha256: &str) -> Option<BlobRow> {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let key = (namespace.to_owned(), sha256.to_owned());
        match written.get(&key) {
            Some((row, at)) if at.elapsed() < REMEMBERED => Some(row.clone()),
            _ => None,
        }
    }

    /// Forgets a row the collector took (a pass run as of a later time
    /// than the clock's, as tests do, may take one written lately).
    pub fn forget(&self, namespace: &str, sha256: &str) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.remove(&(namespace.to_owned(), sha256.to_owned()));
    }

    fn remember(&self, namespace: &str, row: BlobRow, written_at: Instant) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if written.len() >= REMEMBERED_ROWS {
            written.retain(|_, (_, at)| at.elapsed() < REMEMBERED);
            if written.len() >= REMEMBERED_ROWS {
                written.clear();
            }
        }
        written.insert(
            (namespace.to_owned(), row.sha256.clone()),
            (row, written_at),
        );
    }
}

fn start(pool: PgPool) -> mpsc::UnboundedSender<Touch> {
    let (sender, mut receiver) = mpsc::unbounded_channel::<Touch>();
    tokio::spawn(async move {
        let mut group = Vec::with_capacity(GROUP);
        while receiver.recv_many(&mut group, GROUP).await > 0 {
            write_group(&pool, std::mem::take(&mut group)).await;
        }
    });
    sender
}

async fn write_group(pool: &PgPool, group: Vec<Touch>) {
    let rows: Vec<(String, BlobRow)> = group
        .iter()
        .map(|touch| (touch.namespace.clone(), touch.row.clone()))
        .collect();
    let result = blobs::touch(pool, &rows).await.map_err(|error| Failed {
        timed_out: error.is_timeout(),
        message: error.to_string(),
    });
    for touch in group {
        // an upload that gave up meanwhile no longer listens
        let _ = touch.done.send(result.clone());
    }
}
