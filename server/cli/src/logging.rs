//! Logs through `tracing` to standard error: JSON by default, text for people.

use tracing_subscriber::{
    EnvFilter, Layer, Registry, fmt, layer::SubscriberExt, util::SubscriberInitExt,
};

use crate::config::LogFormat;

/// Installs the global subscriber: the log, and the layer that exports
/// traces when there is one. Call once, before anything logs.
pub fn init(
    format: LogFormat,
    filter: &str,
    traces: Option<Box<dyn Layer<Registry> + Send + Sync>>,
) {
    // the trace spans are for the exporter, not the log's line prefixes
    let filter = EnvFilter::try_new(format!(
        "{filter},{}=off",
        composer_coordinator::observe::traces::TARGET
    ))
    .unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(traces);
    // colours only for a terminal, never into a file
    let log = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Json => registry
            .with(log.json().flatten_event(true).with_filter(filter))
            .try_init(),
        LogFormat::Text => registry.with(log.compact().with_filter(filter)).try_init(),
    };
}
