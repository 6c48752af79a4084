//! Traces: one per run, from StartRun (under the caller's `traceparent`)
//! through each event transaction, dispatch and lease, to the worker's
//! handler and its report (docs/operations.md, "Traces").
//!
//! Spans are `tracing` spans of target [`TARGET`], bridged to OpenTelemetry
//! by the layer the server installs when `COMPOSER_OTLP_ENDPOINT` is set
//! (which then calls [`enable`]). Until then every function here returns
//! at once, and nothing is stored: a run's and a task's `traceparent`
//! columns stay NULL.
//!
//! Where each span hangs:
//! - `StartRun` (server): under the caller's traceparent, or a new trace.
//!   It is the run's root: its traceparent is stored on the run.
//! - `run.events` (one per event transaction): under the run's root.
//! - `task.dispatch` (producer, publishing a task the transaction armed)
//!   and `task.lease` (leasing it to a worker): under the transaction that
//!   armed the task, whose traceparent is stored on the task row.
//! - the worker's handler span: under `task.lease`, whose traceparent the
//!   leased `Task` carries.
//! - `CompleteTask` / `FailTask` (server): under the handler span the
//!   report names in its `traceparent` metadata when that span is of the
//!   task's trace, else under `task.lease`'s parent.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::{
    Context,
    trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState},
};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of every span here: the server's OpenTelemetry
/// layer exports this target and no other.
pub const TARGET: &str = "composer::trace";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns traces on, for the rest of the process: call once the layer that
/// exports them is installed.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// True once [`enable`] was called.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The length of a version-00 W3C traceparent: `00-<32 hex>-<16 hex>-<2 hex>`.
pub const TRACEPARENT_LEN: usize = 55;

/// Parses a version-00 W3C traceparent. Anything else (another version, bad
/// hex, an all-zero id) is None: as the W3C spec says, the receiver then
/// starts a new trace.
pub fn parse_traceparent(text: &str) -> Option<SpanContext> {
    if text.len() != TRACEPARENT_LEN || !text.is_ascii() {
        return None;
    }
    let mut parts = text.split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let lower_hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if ![trace, span, flags].into_iter().all(lower_hex) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    ))
}

/// The version-00 traceparent of a span context; None when it is invalid.
pub fn format_traceparent(context: &SpanContext) -> Option<String> {
    if !context.is_valid() {
        return None;
    }
    Some(format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    ))
}

/// The traceparent of a span this module opened; None when traces are off.
pub fn traceparent(span: &Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    format_traceparent(span.context().span().span_context())
}

/// Opens a span named `name` of OpenTelemetry kind `kind` under `parent` (a
/// traceparent; None or unparsable: a new trace). Span::none() when traces
/// are off.
fn open(name: &'static str, kind: &'static str, parent: Option<&str>) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(target: TARGET, "composer", otel.name = name, otel.kind = kind);
    if let Some(parent) = parent.and_then(parse_traceparent) {
        // the span was just made, so its parent can still be set
        let _ = span.set_parent(Context::new().with_remote_span_context(parent));
    }
    span
}

/// Sets a string attribute, when the span is exported.
pub fn attribute(span: &Span, key: &'static str, value: impl Into<String>) {
    if !span.is_disabled() {
        span.set_attribute(key, value.into());
    }
}

/// The span of a StartRun: the run's root, under the caller's traceparent.
pub fn start_run(caller: Option<&str>, namespace: &str, workflow: &str) -> Span {
    let span = open("StartRun", "server", caller);
    attribute(&span, "composer.namespace", namespace);
    attribute(&span, "composer.workflow_name", workflow);
    span
}

/// The span of one event transaction on a run, under the run's root.
pub fn run_events(run_traceparent: Option<&str>, run_id: &impl std::fmt::Display) -> Span {
    if run_traceparent.is_none() {
        return Span::none();
    }
    let span = open("run.events", "internal", run_traceparent);
    attribute(&span, "composer.run_id", run_id.to_string());
    span
}

/// The span of publishing the tasks a transaction armed, under it.
pub fn dispatch(armed_by: &Span, tasks: usize) -> Span {
    if armed_by.is_disabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        parent: armed_by,
        "composer",
        otel.name = "task.dispatch",
        otel.kind = "producer"
    );
    span.set_attribute("composer.tasks", i64::try_from(tasks).unwrap_or(i64::MAX));
    span
}

/// The span of leasing a task, under the transaction that armed it.
pub fn lease(armed_by: Option<&str>, task_id: &str, queue: &str, worker_id: &str) -> Span {
    if armed_by.is_none() {
        return Span::none();
    }
    let span = open("task.lease", "internal", armed_by);
    attribute(&span, "composer.task_id", task_id);
    attribute(&span, "composer.queue", queue);
    attribute(&span, "composer.worker_id", worker_id);
    span
}

/// The span of a worker's report: under the worker's handler span when the
/// report names one of the task's trace, else under `task_trace` (the
/// lease's span, or the run's root on a server that did not lease it). A
/// worker cannot graft a server span into another trace. No task trace:
/// no span.
pub fn report(name: &'static str, worker: Option<&str>, task_trace: Option<&str>) -> Span {
    let Some(task) = task_trace.and_then(parse_traceparent) else {
        return Span::none();
    };
    let parent = worker
        .filter(|w| parse_traceparent(w).is_some_and(|w| w.trace_id() == task.trace_id()))
        .or(task_trace);
    open(name, "server", parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_w3c_traceparent_round_trips() {
        let parsed = parse_traceparent(GOOD).expect("valid");
        assert_eq!(
            parsed.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert!(parsed.is_sampled());
        assert_eq!(format_traceparent(&parsed).as_deref(), Some(GOOD));
    }

    #[test]
    fn anything_but_a_version_00_traceparent_starts_a_new_trace() {
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn with_traces_off_no_span_is_opened() {
        // nothing in this test process calls enable()
        assert!(start_run(Some(GOOD), "ns", "wf").is_disabled());
        assert!(run_events(Some(GOOD), &"run").is_disabled());
        assert!(lease(Some(GOOD), "t", "q", "w").is_disabled());
        assert!(report("CompleteTask", Some(GOOD), Some(GOOD)).is_disabled());
        assert_eq!(traceparent(&Span::none()), None);
    }
}
