//! Logs through `tracing` to standard error: JSON by default, text for people.

use tracing_subscriber::{EnvFilter, fmt};

use crate::config::LogFormat;

/// Installs the global subscriber. Call once, before anything logs.
pub fn init(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.compact().try_init(),
    };
}
