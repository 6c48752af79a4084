//! The quotas file (`--quotas-file`, decision 0038): read at start (a bad
//! file stops the server before it serves), then read again on SIGHUP and
//! whenever its content changes. A bad file met later is logged and the
//! quotas in force stay.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use composer_coordinator::limits::quotas::{NamespaceQuotas, QuotaTable};
use tokio::sync::watch;

/// How often the file is read to see whether it changed.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// The quotas in force: the file's, or the built-in defaults without one;
/// with a file, a task keeps them in step with it until `stop`.
pub fn start(
    file: Option<&Path>,
    stop: watch::Receiver<bool>,
) -> Result<Arc<NamespaceQuotas>, String> {
    let Some(file) = file else {
        return Ok(Arc::default());
    };
    let text = read(file)?;
    let table = QuotaTable::parse(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    tracing::info!(file = %file.display(), namespaces = table.overridden(), "quotas read");
    let quotas = Arc::new(NamespaceQuotas::new(table));
    tokio::spawn(follow(file.to_owned(), text, Arc::clone(&quotas), stop));
    Ok(quotas)
}

fn read(file: &Path) -> Result<String, String> {
    std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))
}

/// Reads the file again on SIGHUP, and when its content is no longer
/// `loaded` (checked every [`CHECK_EVERY`]; content, not modification
/// time, which may not change within a second).
async fn follow(
    file: PathBuf,
    mut loaded: String,
    quotas: Arc<NamespaceQuotas>,
    mut stop: watch::Receiver<bool>,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(hangup) => Some(hangup),
        Err(error) => {
            tracing::warn!(%error, "no SIGHUP handler; the quotas file is still checked for changes");
            None
        }
    };
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => return,
            Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
            _ = tick.tick() => false,
        };
        let text = match read(&file) {
            Ok(text) => text,
            Err(error) => {
                if forced {
                    tracing::error!(%error, "quotas file not read again; the quotas in force stay");
                }
                continue;
            }
        };
        if !forced && text == loaded {
            continue;
        }
        match QuotaTable::parse(&text) {
            Ok(table) => {
                tracing::info!(
                    file = %file.display(),
                    namespaces = table.overridden(),
                    signal = forced,
                    "quotas read again"
                );
                quotas.replace(table);
            }
            Err(error) => {
                tracing::error!(
                    file = %file.display(),
                    %error,
                    "quotas file invalid; the quotas in force stay"
                );
            }
        }
        // a bad file is reported once, not at every check
        loaded = text;
    }
}
