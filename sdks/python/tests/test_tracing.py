"""C16 locally (tests/conformance/README.md): the handler's span continues the
server's lease span that the task carries, is current in the handler, ends
with the attempt's outcome before the report, and the report names it;
StartRun continues the caller's span; without OpenTelemetry nothing is sent."""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Iterator
from typing import Any, cast

import grpc
import pytest
from _fakes import FakeServer
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, SpanKind, StatusCode
from test_worker import make_worker, run, serving, until

from composer import Client, SyncClient, TaskContext, _tracing
from composer.v1 import common_pb2, run_service_pb2, run_service_pb2_grpc
from composer.worker import CANCEL_RUN_CANCELLED

LEASE_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
LEASE_SPAN_ID = "00f067aa0ba902b7"
LEASE_CONTEXT = {"traceparent": f"00-{LEASE_TRACE_ID}-{LEASE_SPAN_ID}-01", "tracestate": "composer=1"}
"""The server's lease span, as Task.trace_context carries it."""


def recording_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def traceparent(span: ReadableSpan | Span) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in exporter.get_finished_spans()}


def test_handler_spans_continue_the_lease_span_and_reports_name_them() -> None:
    provider, exporter = recording_provider()
    user_tracer = provider.get_tracer("user code")
    ended_before_report: dict[str, bool] = {}

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address, tracer_provider=provider)

        @worker.task(name="charge")
        async def charge(ctx: TaskContext) -> dict[str, bool]:
            with user_tracer.start_as_current_span("async user work"):
                await asyncio.sleep(0)
            return {"charged": True}

        @worker.task(name="refund")
        def refund(ctx: TaskContext) -> None:  # a sync handler, in the worker's thread pool
            with user_tracer.start_as_current_span("sync user work"):
                raise ValueError("card declined")

        def on_report(method: str, task_id: str) -> None:
            names = {span.attributes.get("composer.task_id") for span in exporter.get_finished_spans() if span.attributes}
            ended_before_report[task_id] = task_id in names

        state.on_report = on_report
        good = state.add_task("charge", trace_context=LEASE_CONTEXT, task_id="good")
        bad = state.add_task("refund", trace_context=LEASE_CONTEXT, task_id="bad")
        await serving(worker, lambda: until(lambda: good in state.completed and bad in state.failed))
        report_metadata.update(state.report_metadata)

    report_metadata: dict[tuple[str, str], dict[str, str]] = {}
    run(test)
    spans = by_name(exporter)
    good, bad = spans["task charge"], spans["task refund"]
    for span in (good, bad):
        assert span.parent is not None and span.parent.is_remote
        assert (f"{span.context.trace_id:032x}", f"{span.parent.span_id:016x}") == (LEASE_TRACE_ID, LEASE_SPAN_ID)
        assert span.kind is SpanKind.CONSUMER
    assert dict(good.attributes or {}) == {
        "composer.run_id": dict(good.attributes or {})["composer.run_id"],
        "composer.task_id": "good",
        "composer.node_id": "charge",
        "composer.attempt": 1,
        "composer.queue": "q",
        "composer.workflow_name": "wf",
        "composer.namespace": "default",
    }
    assert str((good.attributes or {})["composer.run_id"]).startswith("run-")
    # The handler's own spans (async on the loop, sync in a thread) are children of its span.
    for user_span, handler_span in ((spans["async user work"], good), (spans["sync user work"], bad)):
        assert user_span.parent is not None and user_span.parent.span_id == handler_span.context.span_id
        assert user_span.context.trace_id == handler_span.context.trace_id
    assert good.status.status_code is StatusCode.OK
    assert bad.status.status_code is StatusCode.ERROR
    assert bad.status.description == "ValueError: card declined"
    assert [event.name for event in bad.events] == ["exception"]
    assert (bad.events[0].attributes or {})["exception.type"] == "ValueError"
    # Each report names its handler span (and keeps the lease's tracestate); the span had ended.
    for method, task_id, span in (("CompleteTask", "good", good), ("FailTask", "bad", bad)):
        metadata = report_metadata[(method, task_id)]
        assert metadata.get("traceparent") == traceparent(span)
        assert metadata.get("tracestate") == "composer=1"
    assert ended_before_report == {"good": True, "bad": True}


def test_a_cancelled_attempt_ends_its_span_as_an_error_naming_the_cause() -> None:
    provider, exporter = recording_provider()

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address, tracer_provider=provider, heartbeat_interval=0.05)

        @worker.task(name="wait")
        async def wait(ctx: TaskContext) -> None:
            await ctx.wait_cancelled()

        task_id = state.add_task("wait", trace_context=LEASE_CONTEXT)

        async def body() -> None:
            await until(lambda: task_id in state.leases)
            state.cancel(task_id)
            await until(lambda: worker.stats.cancelled == 1 and worker.in_flight == 0)

        await serving(worker, body)
        assert state.count("CompleteTask") == 0 and state.count("FailTask") == 0

    run(test)
    span = by_name(exporter)["task wait"]
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == CANCEL_RUN_CANCELLED


class _RecordingRuns(run_service_pb2_grpc.RunServiceServicer):
    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []

    async def StartRun(self, request: Any, context: Any) -> run_service_pb2.StartRunResponse:
        self.metadata.append(dict(context.invocation_metadata()))
        run = common_pb2.Run(run_id="r-1", workflow_name=request.workflow_name, status=common_pb2.RUN_STATUS_RUNNING)
        return run_service_pb2.StartRunResponse(run=run, created=True)

    async def SendEvent(self, request: Any, context: Any) -> run_service_pb2.SendEventResponse:
        self.metadata.append(dict(context.invocation_metadata()))
        return run_service_pb2.SendEventResponse()


async def _start_runs() -> tuple[grpc.aio.Server, _RecordingRuns, str]:
    runs = _RecordingRuns()
    server = grpc.aio.server()
    run_service_pb2_grpc.add_RunServiceServicer_to_server(runs, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, runs, f"127.0.0.1:{port}"


def test_start_run_continues_the_callers_trace() -> None:
    provider, _ = recording_provider()
    tracer = provider.get_tracer("app")

    async def main() -> None:
        server, runs, address = await _start_runs()
        try:
            async with Client(address) as client:
                with tracer.start_as_current_span("checkout") as caller:
                    await client.start_run("order")
                    await client.send_event("paid", run_id="r-1")
                await client.start_run("order")
            assert [m.get("traceparent") for m in runs.metadata] == [traceparent(caller), traceparent(caller), None]

            def blocking() -> str:  # the sync facade runs its calls on a loop thread of its own
                with SyncClient(address) as sync_client, tracer.start_as_current_span("script") as script:
                    sync_client.start_run("order")
                return traceparent(script)

            script_parent = await asyncio.to_thread(blocking)
            assert runs.metadata[-1].get("traceparent") == script_parent
        finally:
            await server.stop(None)

    asyncio.run(main())


@pytest.fixture
def without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The SDK as it is without the otel extra: importing opentelemetry fails."""
    monkeypatch.setitem(cast(dict[str, Any], sys.modules), "opentelemetry", None)
    importlib.reload(_tracing)
    yield
    monkeypatch.undo()
    importlib.reload(_tracing)


def test_without_opentelemetry_the_worker_and_client_send_no_trace_context(without_opentelemetry: None) -> None:
    # Made before opentelemetry became unimportable: an application span the SDK must not see.
    provider, exporter = recording_provider()
    tracer = provider.get_tracer("app")
    assert _tracing.get_tracer(provider) is None

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address, tracer_provider=provider)
        worker.register(None, "work", lambda ctx: {"ok": True})
        task_id = state.add_task("work", trace_context=LEASE_CONTEXT)
        await serving(worker, lambda: until(lambda: task_id in state.completed))
        assert "traceparent" not in state.report_metadata[("CompleteTask", task_id)]

        server, runs, runs_address = await _start_runs()
        try:
            async with Client(runs_address) as client:
                with tracer.start_as_current_span("checkout"):
                    await client.start_run("order")
        finally:
            await server.stop(None)
        assert "traceparent" not in runs.metadata[0]

    run(test)
    assert [span.name for span in exporter.get_finished_spans()] == ["checkout"]
