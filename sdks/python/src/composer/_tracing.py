"""OpenTelemetry tracing of task attempts and run starts.

It needs ``opentelemetry-api`` (``pip install composer-sdk[otel]``); without
it, nothing here does anything. A run is one trace across the server and its
workers: the worker's span of each handler continues the server's lease span,
whose W3C context the task carries (``Task.trace_context``), and the
attempt's report carries the handler span's context back; the client's
StartRun carries its caller's. The context always travels as W3C
TraceContext, whatever propagator the application set globally: it is what
the server reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from composer.v1 import worker_service_pb2

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _w3c: TraceContextTextMapPropagator | None = TraceContextTextMapPropagator()
except ImportError:  # the otel extra is not installed: no tracing
    _w3c = None

TRACER_NAME = "composer"
"""The instrumentation name of the handler spans."""

Metadata = tuple[tuple[str, str], ...]


def get_tracer(tracer_provider: trace.TracerProvider | None = None) -> trace.Tracer | None:
    """The tracer of the handler spans (``tracer_provider``'s, else the global one); None without OpenTelemetry."""
    if _w3c is None:
        return None
    return trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)


def caller_metadata() -> Metadata:
    """The W3C context of the caller's current span as gRPC metadata; empty without one."""
    if _w3c is None:
        return ()
    carrier: dict[str, str] = {}
    _w3c.inject(carrier)
    return tuple(carrier.items())


class HandlerSpan:
    """The span of one attempt's handler, a child of the lease span the task carries.

    Without a tracer (no OpenTelemetry) every method does nothing.
    """

    def __init__(self, task: worker_service_pb2.Task, tracer: trace.Tracer | None) -> None:
        self.report_metadata: Metadata = ()
        """The span's W3C context for the attempt's reports: none unless the span is recorded
        (a no-op tracer's span would only echo the lease span back)."""
        self._span: trace.Span | None = None
        self._context: otel_context.Context | None = None
        if tracer is None or _w3c is None:
            return
        parent = _w3c.extract(dict(task.trace_context))
        self._span = tracer.start_span(
            f"task {task.task_name}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "composer.run_id": task.run_id,
                "composer.task_id": task.task_id,
                "composer.node_id": task.node_id,
                "composer.attempt": task.attempt,
                "composer.queue": task.queue,
                "composer.workflow_name": task.workflow_name,
                "composer.namespace": task.namespace,
            },
        )
        self._context = trace.set_span_in_context(self._span, parent)
        if self._span.is_recording():
            carrier: dict[str, str] = {}
            _w3c.inject(carrier, context=self._context)
            self.report_metadata = tuple(carrier.items())

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """Makes the span current: a task or a context copied inside runs with it."""
        if self._context is None:
            yield
            return
        token = otel_context.attach(self._context)
        try:
            yield
        finally:
            otel_context.detach(token)

    def end(self, failure: str | None = None, error: BaseException | None = None) -> None:
        """Ends the span (once): status OK without ``failure``, else ERROR described by it,
        with ``error`` recorded."""
        span, self._span = self._span, None
        if span is None:
            return
        if failure is None:
            span.set_status(trace.Status(trace.StatusCode.OK))
        else:
            if error is not None:
                span.record_exception(error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, failure))
        span.end()
