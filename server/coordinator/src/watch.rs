//! Run-change notifications for WatchRun: one LISTEN connection per server,
//! fanned out to every watcher in it. A watcher also polls now and then, so
//! a lost notification only delays it.

use std::time::Duration;

use composer_store::{Store, runs::RUN_CHANNEL};
use sqlx::postgres::PgListener;
use tokio::sync::{broadcast, watch};
use uuid::Uuid;

/// Broadcasts the id of every run that changed.
#[derive(Clone)]
pub struct RunChanges {
    sender: broadcast::Sender<Uuid>,
}

impl RunChanges {
    /// A broadcaster with no listener yet.
    pub fn new() -> Self {
        Self {
            sender: broadcast::channel(4096).0,
        }
    }

    /// Subscribes to changes.
    pub fn subscribe(&self) -> broadcast::Receiver<Uuid> {
        self.sender.subscribe()
    }

    /// Listens to Postgres until `shutdown` flips, reconnecting on failure.
    pub async fn run(self, store: Store, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            let listener = async {
                let mut listener = PgListener::connect_with(store.pool()).await?;
                listener.listen(RUN_CHANNEL).await?;
                Ok::<_, sqlx::Error>(listener)
            };
            let mut listener = match listener.await {
                Ok(listener) => listener,
                Err(error) => {
                    tracing::warn!(%error, "run change listener");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            loop {
                tokio::select! {
                    received = listener.recv() => match received {
                        Ok(note) => {
                            if let Ok(run_id) = Uuid::parse_str(note.payload()) {
                                let _ = self.sender.send(run_id);
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%error, "run change listener lost");
                            break;
                        }
                    },
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}

impl Default for RunChanges {
    fn default() -> Self {
        Self::new()
    }
}
