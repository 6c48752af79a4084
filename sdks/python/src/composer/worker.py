"""The Worker: runs task handlers for the tasks a server leases to it.

A worker in ten lines::

    from composer import Worker, TaskContext, NonRetryableError

    worker = Worker(slots=8)   # COMPOSER_ADDRESS, else 127.0.0.1:7070; or Worker("http://host:port")

    @worker.task("inventory", "reserve_stock")
    async def reserve_stock(ctx: TaskContext) -> dict[str, object]:
        if ctx.input["sku"] == "":
            raise NonRetryableError("no sku", code="BAD_SKU")
        return {"reserved": True, "task": ctx.task_id}

    worker.run()  # until SIGTERM / SIGINT, then drains

The worker never shows a lease to the handler. It long-polls its queues with
as many tasks as it has free slots, confirms the receipt of each task still
running a third of the way to its first, short expiry with an early heartbeat
(so a poll answer lost on the way costs no attempt), heartbeats each running
task at a third of its lease, tells the handler when the run was cancelled or
the lease lost (``ctx.cancelled``; an async handler is also cancelled),
reports the outcome with the lease token, retries a report that met
UNAVAILABLE, DEADLINE_EXCEEDED or a busy server (a RESOURCE_EXHAUSTED for a
quota or the CPU pool, after its RetryInfo delay) with the same token, and
treats a LEASE_LOST answer as final.
On shutdown it stops polling, drains in-flight tasks within ``drain_timeout``,
and only then stops heartbeating.

Handlers never see blob references (docs/payloads.md): the worker replaces
every reference in a task's input with the value it names before the handler
runs, and uploads an output whose compact JSON is longer than the server's
``payload_offload_bytes``, reporting its reference; when the server gives
presigned URLs (``blob_urls``) those bytes move straight to and from its blob
store. An output the server
refuses for its size fails the attempt with ``OUTPUT_TOO_LARGE`` (not
retryable); one it cannot take now (unreachable, or busy until the report
deadline) with ``OUTPUT_UPLOAD_FAILED``, retryable.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging
import os
import signal
import socket
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf import duration_pb2, struct_pb2

from composer.v1 import server_service_pb2, worker_service_pb2

from . import _payloads, _tracing
from ._code_handler import make_handler
from ._connection import Connection, resolve_address, resolve_tls
from ._values import to_value
from .backoff import Backoff
from .errors import ComposerError, LeaseLostError, ResourceExhaustedError, TaskError, UnimplementedError
from .models import BlobRef
from .task_context import (
    CANCEL_LEASE_LOST,
    CANCEL_RUN_CANCELLED,
    CANCEL_SHUTDOWN,
    Handler,
    TaskCancelled,
    TaskContext,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

log = logging.getLogger("composer.worker")

H = TypeVar("H", bound=Handler)

DEFAULT_LEASE = 30.0
"""The lease length assumed when a task does not carry one (the language's default heartbeat_timeout)."""

MAX_POLL_TASKS = 100
"""The most tasks one PollTasks may ask for."""

SKEWED_FIRST_HEARTBEAT = 0.5
"""The first heartbeat's delay when the task's first expiry looks wrong (clocks apart)."""

_MAX_MESSAGE = 4_000
_MAX_TRACEBACK = 32_000


class Slots:
    """Counts the tasks a worker runs against its concurrency limit.

    Only the poll loop takes slots (never more than :attr:`free`, which it asks
    the server for); each task gives its slot back when its report is done.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a worker needs at least one slot")
        self.capacity = capacity
        """The concurrency limit."""
        self._used = 0
        self._changed = asyncio.Event()
        self.high_water = 0
        """The most slots ever used at once."""

    @property
    def used(self) -> int:
        """Slots taken now."""
        return self._used

    @property
    def free(self) -> int:
        """Slots free now."""
        return self.capacity - self._used

    def acquire(self, count: int = 1) -> None:
        """Takes ``count`` free slots; raises RuntimeError if fewer are free."""
        if count > self.free:
            raise RuntimeError(f"asked for {count} slots with {self.free} free")
        self._used += count
        self.high_water = max(self.high_water, self._used)
        self._notify()

    def release(self) -> None:
        """Gives one slot back."""
        if self._used <= 0:
            raise RuntimeError("release without acquire")
        self._used -= 1
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_free(self) -> int:
        """Waits until at least one slot is free; returns how many are."""
        while self.free <= 0:
            await self._changed.wait()
        return self.free

    async def wait_idle(self) -> None:
        """Waits until no slot is taken."""
        while self._used > 0:
            await self._changed.wait()


@dataclasses.dataclass
class WorkerStats:
    """What a worker did since it started (for logs, tests and metrics)."""

    polled: int = 0
    """Tasks leased to this worker."""
    completed: int = 0
    """Attempts reported complete (applied by the server)."""
    failed: int = 0
    """Attempts reported failed (applied by the server)."""
    lease_lost: int = 0
    """Attempts dropped because the server said the lease was lost."""
    cancelled: int = 0
    """Attempts stopped because their run was cancelled."""
    report_retries: int = 0
    """Reports sent again after UNAVAILABLE, DEADLINE_EXCEEDED or a busy server."""
    poll_errors: int = 0
    """PollTasks calls that failed."""


@dataclasses.dataclass(frozen=True)
class _Outcome:
    output: struct_pb2.Value | None = None
    failure: TaskError | None = None
    error: BaseException | None = None
    """The exception behind ``failure``, if one was raised."""


class Worker:
    """Serves task handlers on one or more queues of a Composer server.

    ``address``: ``host:port``, ``http://host:port`` (plaintext) or
    ``https://host:port`` (TLS); default ``COMPOSER_ADDRESS``, else
    127.0.0.1:7070 (a malformed one raises InvalidAddressError at once).
    ``token``: the bearer token (default ``COMPOSER_TOKEN``).
    ``queues``: queues to poll besides those named in :meth:`task`.
    ``slots``: how many tasks run at once. ``drain_timeout``: how long a
    graceful stop waits for in-flight tasks. ``poll_wait``: the long-poll
    wait. ``heartbeat_interval``: overrides the default of a third of each
    task's lease (tests use it); the first heartbeat comes sooner when the
    first, short lease must be confirmed before it ends. ``interceptors``:
    ``grpc.aio`` client interceptors for every call. ``tracer_provider``: the
    OpenTelemetry provider of the handlers' spans (default: the global one;
    see the README's "Tracing").
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        queues: Iterable[str] = (),
        slots: int = 10,
        token: str | None = None,
        tls: bool | grpc.ChannelCredentials | None = None,
        worker_id: str | None = None,
        poll_wait: float = 20.0,
        drain_timeout: float = 30.0,
        report_timeout: float = 300.0,
        heartbeat_interval: float | None = None,
        backoff: Backoff | None = None,
        interceptors: Iterable[Any] = (),
        check_server: bool = True,
        logger: logging.Logger | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self._address = resolve_address(address)
        resolve_tls(self._address, tls)  # a contradiction fails here, not at serve()
        self.address = self._address.target
        """The server's ``host:port``."""
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        """This process's id, recorded by the server as the lease owner."""
        self.stats = WorkerStats()
        """Counters of what the worker did."""
        self._queues: list[str] = list(dict.fromkeys(queues))
        self._capacity = slots
        self._token = token
        self._tls = tls
        self._poll_wait = poll_wait
        self._drain_timeout = drain_timeout
        self._report_timeout = report_timeout
        self._heartbeat_interval = heartbeat_interval
        self._backoff = backoff or Backoff(initial=0.2, maximum=5.0)
        self._interceptors = list(interceptors)
        self._check_server = check_server
        self._log = logger or log
        self._tracer_provider = tracer_provider
        self._tracer: Tracer | None = None
        self._handlers: dict[tuple[str | None, str | None], Handler] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._force_stop: asyncio.Event | None = None
        self._slots: Slots | None = None
        self._running: dict[asyncio.Task[None], TaskContext] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._conn: Connection | None = None
        self._serving = False
        self._pending_stop = False
        self._offload_bytes: int | None = None
        """The server's payload_offload_bytes, from the protocol check (or asked when an output is ready)."""
        self._blob_urls = _payloads.BlobUrls()
        """Whether blobs move through presigned URLs (the server's blob_urls, until it refuses one)."""

    # --- registration -----------------------------------------------------

    def task(self, queue: str | None = None, name: str | None = None) -> Callable[[H], H]:
        """Decorator: registers the handler of task ``name`` on ``queue``, which is then polled:
        ``@worker.task("orders", "charge")`` (or ``queue=``, ``name=``), the order of Go's
        ``Handle(queue, task, h)`` and TypeScript's ``task(queue, name, h)``.

        ``queue=None`` (``@worker.task(name="charge")``) serves that task name on
        every polled queue.
        """
        task_name = _task_name(name)

        def register(handler: H) -> H:
            self.register(queue, task_name, handler)
            return handler

        return register

    def register(self, queue: str | None, name: str, handler: Handler) -> None:
        """Registers ``handler`` for task ``name`` on ``queue`` (see :meth:`task`)."""
        name = _task_name(name)
        if queue is not None and not queue:
            raise ValueError("a queue name is not empty (None: every polled queue)")
        key = (queue, name)
        if key in self._handlers:
            raise ValueError(f"task {name!r} already has a handler" + (f" on queue {queue!r}" if queue else ""))
        self._handlers[key] = handler
        if queue is not None and queue not in self._queues:
            self._queues.append(queue)

    def handle_queue(self, queue: str, handler: Handler) -> None:
        """Registers ``handler`` for every task of ``queue`` that no handler claims by name."""
        self.register_default(queue, handler)

    def register_default(self, queue: str, handler: Handler) -> None:
        """Same as :meth:`handle_queue`."""
        key = (queue, None)
        if key in self._handlers:
            raise ValueError(f"queue {queue!r} already has a default handler")
        self._handlers[key] = handler
        if queue not in self._queues:
            self._queues.append(queue)

    def serve_code(
        self,
        *,
        queue: str = "code.python",
        time_limit: float | None = None,
        memory_limit: int | None = None,
        allow_network: bool = False,
    ) -> None:
        """Makes this worker a Python code runner: it serves CODE nodes (``queue`` ``code.python``).

        See :mod:`composer.code_runner` for the snippet convention, limits and
        sandbox; raises ``SandboxUnavailable`` where snippets cannot be
        isolated and ``allow_network`` is false.
        """
        handler = make_handler(time_limit=time_limit, memory_limit=memory_limit, allow_network=allow_network)
        self.handle_queue(queue, handler)

    @property
    def queues(self) -> list[str]:
        """The queues this worker polls."""
        return list(self._queues)

    @property
    def in_flight(self) -> int:
        """Tasks running now."""
        return len(self._running)

    @property
    def max_concurrency_seen(self) -> int:
        """The most tasks that ever ran at once in this worker."""
        return self._slots.high_water if self._slots else 0

    def _handler_for(self, task: worker_service_pb2.Task) -> Handler | None:
        for key in ((task.queue, task.task_name), (None, task.task_name), (task.queue, None)):
            handler = self._handlers.get(key)
            if handler is not None:
                return handler
        return None

    # --- life cycle -------------------------------------------------------

    def run(self) -> None:
        """Serves until SIGTERM or SIGINT, then stops gracefully (blocking; for a worker's ``main``).

        A second signal stops waiting for the drain.
        """
        asyncio.run(self._serve_with_signals())

    async def _serve_with_signals(self) -> None:
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, self.stop)
        try:
            await self.serve()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    def stop(self) -> None:
        """Asks the worker to stop: stop polling, drain in-flight tasks, then stop heartbeating.

        Safe from any thread and from signal handlers; a second call stops
        waiting for the drain.
        """
        loop, requested, force = self._loop, self._stop_requested, self._force_stop
        if loop is None or requested is None or force is None:
            self._pending_stop = True
            return

        def apply() -> None:
            if requested.is_set():
                self._log.warning("stopping at once: in-flight tasks are failed as WORKER_SHUTDOWN")
                force.set()
            else:
                self._log.info(
                    "stopping: no new polls; draining %d in-flight tasks (up to %.0f s); stop again to force",
                    len(self._running),
                    self._drain_timeout,
                )
            requested.set()

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            apply()
        else:
            loop.call_soon_threadsafe(apply)

    async def serve(self) -> None:
        """Serves until :meth:`stop` is called (or the task running it is cancelled)."""
        if self._serving:
            raise RuntimeError("this worker is already serving")
        if not self._queues:
            raise ValueError("the worker has no queue to poll: register a handler with a queue, or pass queues=")
        self._serving = True
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        self._force_stop = asyncio.Event()
        if self._pending_stop:
            self._pending_stop = False
            self._stop_requested.set()
        self._slots = Slots(self._capacity)
        self._executor = concurrent.futures.ThreadPoolExecutor(self._capacity, thread_name_prefix="composer-task")
        self._conn = Connection(self._address, token=self._token, tls=self._tls, interceptors=self._interceptors)
        self._tracer = _tracing.get_tracer(self._tracer_provider)
        poller: asyncio.Task[None] | None = None
        try:
            if self._check_server:
                await self._wait_for_server()
            self._log.info(
                "worker %s polling %s with %d slots", self.worker_id, ",".join(self._queues), self._capacity
            )
            poller = asyncio.create_task(self._poll_loop(), name="composer-poll")
            await _first_of(asyncio.shield(poller), self._stop_requested.wait())
        finally:
            # 1. Stop polling: no new poll starts. A poll already waiting may
            # return tasks whose leases the server has recorded; cancelling it
            # would strand them until their leases expire (a lost attempt), so
            # it may finish, and its tasks run and drain. A second stop cancels it.
            if not self._stop_requested.is_set():
                # Cancelled, or the poll loop died: no graceful drain is asked for.
                self._stop_requested.set()
                self._force_stop.set()
            poll_error: BaseException | None = None
            if poller is not None:
                if not poller.done():
                    await _first_of(asyncio.shield(poller), self._force_stop.wait())
                poller.cancel()
                try:
                    await poller
                except asyncio.CancelledError:
                    pass
                except Exception as error:  # noqa: BLE001 - re-raised after the cleanup
                    poll_error = error
            # 2. Drain: in-flight tasks finish and report, heartbeats still running.
            await self._drain()
            # 3. Only now stop heartbeating and close.
            self._executor.shutdown(wait=False, cancel_futures=True)
            await self._conn.close()
            self._serving = False
            self._log.info("worker %s stopped", self.worker_id)
            if poll_error is not None:
                raise poll_error

    async def _wait_for_server(self) -> None:
        assert self._conn is not None and self._stop_requested is not None
        failures = 0
        while not self._stop_requested.is_set():
            try:
                info = await self._conn.check_protocol()
                self._learn_server(info)
                return
            except ComposerError as error:
                if not error.retryable:
                    raise
                failures += 1
                self._log.warning("server %s not reachable yet (%s); retrying", self.address, error.code.name)
                await self._sleep_unless_stopped(self._backoff.delay(failures))

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        assert self._stop_requested is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_requested.wait(), seconds)

    async def _drain(self) -> None:
        assert self._force_stop is not None
        if not self._running:
            return
        self._log.info("draining %d in-flight tasks (up to %.1f s)", len(self._running), self._drain_timeout)
        everything = asyncio.ensure_future(asyncio.wait(set(self._running)))
        force = asyncio.ensure_future(self._force_stop.wait())
        await asyncio.wait({everything, force}, timeout=self._drain_timeout, return_when=asyncio.FIRST_COMPLETED)
        everything.cancel()
        force.cancel()
        unfinished = [runner for runner in self._running if not runner.done()]
        if unfinished:
            self._log.warning("%d tasks did not finish within the drain; failing them as retryable", len(unfinished))
            for runner in unfinished:
                self._running[runner]._cancel(CANCEL_SHUTDOWN)
                runner.cancel()
            await asyncio.wait(unfinished, timeout=10.0)

    # --- polling ----------------------------------------------------------

    async def _poll_loop(self) -> None:
        assert self._conn is not None and self._slots is not None and self._stop_requested is not None
        failures = 0
        wait = duration_pb2.Duration()
        wait.FromMilliseconds(int(self._poll_wait * 1000))
        stop = self._stop_requested
        while not stop.is_set():
            if self._slots.free <= 0:
                await _first_of(self._slots.wait_free(), stop.wait())
                continue
            free = self._slots.free
            # confirm_receipt: a poll answer lost on the way costs no attempt (decision 0012);
            # the first heartbeat confirms (see first_heartbeat_delay).
            request = worker_service_pb2.PollTasksRequest(
                worker_id=self.worker_id,
                queues=self._queues,
                max_tasks=min(free, MAX_POLL_TASKS),
                wait=wait,
                confirm_receipt=True,
            )
            try:
                response: worker_service_pb2.PollTasksResponse = await self._conn.unary(
                    self._conn.workers.PollTasks, request, timeout=self._poll_wait + 5.0
                )
            except ComposerError as error:
                failures += 1
                self.stats.poll_errors += 1
                delay = self._backoff.delay(failures)
                level = logging.DEBUG if error.retryable and failures == 1 else logging.WARNING
                self._log.log(level, "poll failed (%s: %s); again in %.2f s", error.code.name, error.message, delay)
                await self._sleep_unless_stopped(delay)
                continue
            failures = 0
            for task in response.tasks:
                self.stats.polled += 1
                if self._slots.free > 0:
                    self._slots.acquire()
                else:  # The server gave more than asked: run it anyway, the lease is ours.
                    self._log.error("server leased more tasks than free slots (%d)", self._capacity)
                    self._slots._used += 1
                self._start(task)

    def _start(self, task: worker_service_pb2.Task) -> None:
        assert self._loop is not None
        ctx = TaskContext(task, self._log, self._loop)
        # The values now live in ctx.secrets alone (whose repr names them only): the Task
        # message, kept for the reports, must not show them when printed or logged.
        task.ClearField("secrets")
        interval = self._heartbeat_interval_of(task)
        first_beat = first_heartbeat_delay(task, interval, time.time())
        runner = asyncio.create_task(
            self._execute(task, ctx, interval, first_beat), name=f"composer-task-{task.task_id}-{task.attempt}"
        )
        self._running[runner] = ctx

    def _heartbeat_interval_of(self, task: worker_service_pb2.Task) -> float:
        """The configured interval, else a third of the task's lease."""
        lease = task.lease_duration.ToTimedelta().total_seconds() if task.HasField("lease_duration") else DEFAULT_LEASE
        return self._heartbeat_interval or max(lease / 3.0, 0.05)

    # --- one task ---------------------------------------------------------

    async def _execute(self, task: worker_service_pb2.Task, ctx: TaskContext, interval: float, first_beat: float) -> None:
        assert self._slots is not None
        finished = asyncio.Event()
        handler_box: list[asyncio.Future[Any]] = []
        heartbeat = asyncio.create_task(self._heartbeat_loop(task, ctx, finished, handler_box, interval, first_beat))
        span = _tracing.HandlerSpan(task, self._tracer)
        try:
            outcome = await self._run_handler(task, ctx, handler_box, span)
            if outcome is None:
                span.end(ctx.cancel_kind or "cancelled")
                return
            # The span ends before the report goes out: an exporter has it by the time the run ends.
            failure = outcome.failure
            span.end(None if failure is None else f"{failure.code}: {failure.message}", outcome.error)
            await self._report(task, ctx, outcome, span.report_metadata)
        except asyncio.CancelledError:
            span.end(ctx.cancel_kind or "cancelled")
            if ctx.cancel_kind == CANCEL_SHUTDOWN:
                # The drain timed out: give the attempt back so it runs again soon.
                shutdown = TaskError("the worker stopped before the task finished", code="WORKER_SHUTDOWN")
                with contextlib.suppress(ComposerError, asyncio.TimeoutError):
                    await asyncio.wait_for(self._send_fail(task, shutdown, metadata=span.report_metadata), 5.0)
            raise
        finally:
            finished.set()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            self._slots.release()
            self._running.pop(asyncio.current_task(), None)  # type: ignore[arg-type]

    async def _run_handler(
        self,
        task: worker_service_pb2.Task,
        ctx: TaskContext,
        handler_box: list[asyncio.Future[Any]],
        span: _tracing.HandlerSpan,
    ) -> _Outcome | None:
        """Runs the handler with its span current; None when the task was cancelled (no report is due)."""
        assert self._loop is not None and self._executor is not None
        handler = self._handler_for(task)
        if handler is None:
            ctx.logger.error("no handler for task %r on queue %r", task.task_name, task.queue)
            return _Outcome(failure=TaskError(f"this worker has no handler for task {task.task_name!r}", code="UNKNOWN_TASK"))
        unresolved = await self._resolve_input(ctx, handler_box)
        if ctx.cancelled:
            self._stopped(ctx)
            return None
        if unresolved is not None:
            return unresolved
        with span.current():  # the handler's task or thread copies the context, span included
            if _is_async(handler):
                future: asyncio.Future[Any] = asyncio.ensure_future(handler(ctx))
            else:
                call = functools.partial(contextvars.copy_context().run, handler, ctx)
                future = self._loop.run_in_executor(self._executor, call)
        handler_box.append(future)
        try:
            await asyncio.wait({future})
        except asyncio.CancelledError:
            future.cancel()
            raise
        if ctx.cancelled:
            if not future.cancelled():
                future.exception()  # mark retrieved
            self._stopped(ctx)
            return None
        if future.cancelled():
            return _Outcome(failure=TaskError("the handler was cancelled", code="CANCELLED"))
        error = future.exception()
        if error is None:
            result = future.result()
            if inspect.isawaitable(result):  # a sync function that returned a coroutine
                with span.current():
                    result = await result
            return await self._output(ctx, result)
        if isinstance(error, TaskError):
            return _Outcome(failure=error, error=error)
        tb = "".join(traceback.format_exception(error))
        ctx.logger.warning("handler raised %s: %s", type(error).__name__, error)
        failure = TaskError(
            str(error) or type(error).__name__,
            code=type(error).__name__,
            details={"type": type(error).__name__, "traceback": tb[-_MAX_TRACEBACK:]},
        )
        return _Outcome(failure=failure, error=error)

    def _stopped(self, ctx: TaskContext) -> None:
        """Counts and logs a task stopped by a cancellation (nothing is reported for it)."""
        if ctx.cancel_kind == CANCEL_RUN_CANCELLED:
            self.stats.cancelled += 1
        ctx.logger.info("task stopped (%s); not reporting", ctx.cancel_reason)

    async def _resolve_input(self, ctx: TaskContext, handler_box: list[asyncio.Future[Any]]) -> _Outcome | None:
        """Replaces every blob reference in ``ctx.input`` with the value it names (downloaded).

        None when the input is ready (or the task was stopped meanwhile: the
        downloads are cancelled with it); else the failure to report: a
        retryable ``INPUT_UNAVAILABLE`` when the server could not be reached or was busy,
        a non-retryable one when a blob is missing or the input holds a bad
        reference.
        """
        assert self._conn is not None
        try:
            if not _payloads.has_references(ctx.input):
                return None
        except ValueError as bad:
            return _input_failure(bad, retryable=False)
        conn = self._conn

        async def fetch(sha256: str) -> bytes:
            # (inside the downloads, which a lost lease or a cancelled run stops)
            await self._ask_server(ctx, "its streams carry the input's blobs")
            return await _payloads.download(conn, sha256, timeout=self._report_timeout, urls=self._blob_urls)

        resolving = asyncio.ensure_future(_payloads.resolve(ctx.input, fetch))
        handler_box.append(resolving)  # a lost lease or a cancelled run stops the downloads too
        try:
            await asyncio.wait({resolving})
        except asyncio.CancelledError:
            resolving.cancel()
            raise
        if resolving.cancelled():
            return None if ctx.cancelled else _Outcome(failure=TaskError("the input's download was cancelled", code="CANCELLED"))
        error = resolving.exception()
        if error is None:
            ctx.input = resolving.result()
            return None
        if ctx.cancelled:
            return None
        if isinstance(error, ComposerError):
            ctx.logger.warning("could not download the input's blobs: %s", error)
            # a busy server (a quota, the CPU pool) may serve the next attempt
            return _input_failure(error, retryable=error.retryable or error.busy)
        if isinstance(error, ValueError):
            return _input_failure(error, retryable=False)
        raise error

    async def _output(self, ctx: TaskContext, result: Any) -> _Outcome:
        """The outcome of a handler's ``result``: the output inline, or the reference of its upload when
        its compact JSON is longer than the server's threshold; INVALID_OUTPUT when it is not JSON, else
        the failure of an upload the server would not take (see :func:`_output_refused`)."""
        try:
            text = _payloads.oversized_json(result, await self._offload_threshold(ctx))
            output = to_value(result) if text is None else None
        except (TypeError, ValueError) as not_json:
            failure = TaskError(f"the handler's output is not JSON: {not_json}", code="INVALID_OUTPUT", retryable=False)
            return _Outcome(failure=failure, error=not_json)
        if output is not None:
            return _Outcome(output=output)
        assert text is not None
        try:
            blob = await self._upload_with_retries(ctx, text)
        except ComposerError as error:
            return _Outcome(failure=_output_refused(error), error=error)
        ctx.logger.debug("output of %d bytes reported as blob %s", blob.size, blob.sha256)
        return _Outcome(output=to_value(blob.reference()))

    async def _upload_with_retries(self, ctx: TaskContext, data: bytes) -> BlobRef:
        """Uploads an output, again after a failure worth repeating (see :meth:`_retry_delay`) until the
        report deadline (content addressing makes a repeated upload harmless)."""
        assert self._conn is not None
        failures = 0
        deadline = time.monotonic() + self._report_timeout
        while True:
            try:
                return await _payloads.upload(self._conn, data, timeout=self._report_timeout, urls=self._blob_urls)
            except ComposerError as error:
                failures += 1
                delay = self._retry_delay(error, failures)
                if delay is None or time.monotonic() >= deadline:
                    raise
                ctx.logger.info("output upload failed (%s); again in %.2f s", error.code.name, delay)
                await asyncio.sleep(delay)

    async def _offload_threshold(self, ctx: TaskContext) -> int:
        """The server's ``payload_offload_bytes``: from the protocol check, else asked once now. A
        server that cannot be asked gets the output inline (it offloads one itself if it must)."""
        await self._ask_server(ctx, "output sent inline")
        return self._offload_bytes or 0

    def _learn_server(self, info: server_service_pb2.GetServerInfoResponse) -> None:
        """Keeps what GetServerInfo says of payloads: the offload threshold, whether blob URLs are given."""
        self._offload_bytes = max(info.payload_offload_bytes, 0)
        self._blob_urls.offered(info.blob_urls)

    async def _ask_server(self, ctx: TaskContext, otherwise: str) -> None:
        """Asks GetServerInfo once when the protocol check did not (see :meth:`_learn_server`); a server
        without it offloads nothing and gives no URL. One that cannot be asked now is logged with
        ``otherwise`` (what is done instead) and asked again next time."""
        assert self._conn is not None
        if self._offload_bytes is not None:
            return
        try:
            info: server_service_pb2.GetServerInfoResponse = await self._conn.unary(
                self._conn.server.GetServerInfo, server_service_pb2.GetServerInfoRequest(), timeout=10.0
            )
        except UnimplementedError:
            self._offload_bytes = 0
            return
        except ComposerError as error:
            ctx.logger.warning("could not ask the server for its payload settings (%s); %s", error, otherwise)
            return
        self._learn_server(info)

    async def _heartbeat_loop(
        self,
        task: worker_service_pb2.Task,
        ctx: TaskContext,
        finished: asyncio.Event,
        handler_box: list[asyncio.Future[Any]],
        interval: float,
        first_beat: float,
    ) -> None:
        """Heartbeats the task: first after ``first_beat`` (it confirms receipt), then every ``interval``."""
        assert self._conn is not None
        request = worker_service_pb2.HeartbeatRequest(task_id=task.task_id, attempt=task.attempt, lease_token=task.lease_token)
        failures = 0
        delay = first_beat
        while True:
            await asyncio.sleep(delay)
            delay = interval
            try:
                response: worker_service_pb2.HeartbeatResponse = await self._conn.unary(
                    self._conn.workers.Heartbeat, request, timeout=max(interval, 1.0)
                )
            except LeaseLostError:
                if finished.is_set():
                    return
                self.stats.lease_lost += 1
                ctx.logger.warning("lease lost; stopping the task, it will not be reported")
                self._cancel_handler(ctx, CANCEL_LEASE_LOST, handler_box)
                return
            except ComposerError as error:
                failures += 1
                delay = min(self._backoff.delay(failures), interval)
                ctx.logger.log(
                    logging.DEBUG if error.retryable else logging.WARNING,
                    "heartbeat failed (%s: %s); retrying",
                    error.code.name,
                    error.message,
                )
                continue
            failures = 0
            if response.cancel_requested and not finished.is_set():
                ctx.logger.info("run cancelled (%s); stopping the task", response.cancel_reason or "no reason given")
                self._cancel_handler(ctx, CANCEL_RUN_CANCELLED, handler_box, response.cancel_reason)
                return

    def _cancel_handler(
        self, ctx: TaskContext, kind: str, handler_box: list[asyncio.Future[Any]], reason: str = ""
    ) -> None:
        if ctx._cancel(kind, reason):
            for future in handler_box:
                # An async handler is cancelled at its next await; a sync one sees ctx.cancelled.
                if isinstance(future, asyncio.Task):
                    future.cancel()

    # --- reports ----------------------------------------------------------

    async def _report(
        self, task: worker_service_pb2.Task, ctx: TaskContext, outcome: _Outcome, metadata: _tracing.Metadata
    ) -> None:
        """Reports the outcome; ``metadata`` (the handler span's trace context) goes with each call.

        A CompleteTask refused with RESOURCE_EXHAUSTED fails the attempt as its output's upload would
        (:func:`_output_refused`): OUTPUT_TOO_LARGE for the payload limit, OUTPUT_UPLOAD_FAILED,
        retryable, for a server still busy at the report deadline, so that the attempt ends now with a
        code that says why rather than when its lease runs out. Any other report error is logged and
        the lease left to expire (the server then retries the attempt).
        """
        assert self._conn is not None
        if outcome.failure is None:
            request = worker_service_pb2.CompleteTaskRequest(
                task_id=task.task_id, attempt=task.attempt, lease_token=task.lease_token, output=outcome.output
            )
            try:
                if await self._send_with_retries(ctx, self._conn.workers.CompleteTask, request, metadata):
                    self.stats.completed += 1
                    ctx.logger.debug("completed")
            except ResourceExhaustedError as error:
                await self._report_failure(task, ctx, _output_refused(error), metadata)
            except ComposerError as error:
                ctx.logger.error("could not report completion (%s); the lease will expire", error)
            return
        await self._report_failure(task, ctx, outcome.failure, metadata)

    async def _report_failure(
        self, task: worker_service_pb2.Task, ctx: TaskContext, failure: TaskError, metadata: _tracing.Metadata
    ) -> None:
        try:
            if await self._send_fail(task, failure, ctx, metadata):
                self.stats.failed += 1
                ctx.logger.info("failed with %s (retryable=%s): %s", failure.code, failure.retryable, failure.message)
        except ComposerError as error:
            ctx.logger.error("could not report failure (%s); the lease will expire", error)

    async def _send_fail(
        self,
        task: worker_service_pb2.Task,
        failure: TaskError,
        ctx: TaskContext | None = None,
        metadata: _tracing.Metadata = (),
    ) -> bool:
        assert self._conn is not None
        request = worker_service_pb2.FailTaskRequest(
            task_id=task.task_id,
            attempt=task.attempt,
            lease_token=task.lease_token,
            error_code=failure.code,
            message=failure.message[:_MAX_MESSAGE],
            retryable=failure.retryable,
        )
        if failure.details is not None:
            try:
                request.details.CopyFrom(to_value(failure.details))
            except (TypeError, ValueError):
                request.details.CopyFrom(to_value({"repr": repr(failure.details)[:_MAX_MESSAGE]}))
        if ctx is None:
            await self._conn.unary(self._conn.workers.FailTask, request, timeout=5.0, metadata=metadata)
            return True
        return await self._send_with_retries(ctx, self._conn.workers.FailTask, request, metadata)

    async def _send_with_retries(self, ctx: TaskContext, method: Any, request: Any, metadata: _tracing.Metadata) -> bool:
        """Sends a report, again with the same lease token after a failure worth repeating (see
        :meth:`_retry_delay`) until the report deadline.

        Returns False when the lease was lost (the report is dropped, never retried).
        """
        assert self._conn is not None
        failures = 0
        deadline = time.monotonic() + self._report_timeout
        while True:
            try:
                await self._conn.unary(method, request, timeout=10.0, metadata=metadata)
                return True
            except LeaseLostError:
                self.stats.lease_lost += 1
                ctx._cancel(CANCEL_LEASE_LOST)
                ctx.logger.warning("report refused: the lease was lost; dropping it (not retried)")
                return False
            except ComposerError as error:
                failures += 1
                delay = self._retry_delay(error, failures)
                if delay is None or time.monotonic() >= deadline:
                    raise
                self.stats.report_retries += 1
                ctx.logger.info("report failed (%s); sending it again in %.2f s", error.code.name, delay)
                await asyncio.sleep(delay)

    def _retry_delay(self, error: ComposerError, failures: int) -> float | None:
        """How long to wait before making a call again after its ``failures``-th failure, ``error``: the
        server's RetryInfo delay, else the worker's backoff; None when repeating it cannot help (neither
        a transient failure nor a busy server)."""
        if not (error.retryable or error.busy):
            return None
        # A zero delay counts as none: calls repeated at once would only add to a busy server's load.
        return error.retry_after or self._backoff.delay(failures)


def _output_refused(error: ComposerError) -> TaskError:
    """The failure of an attempt whose output the server did not take (its upload, or the
    CompleteTask carrying it): OUTPUT_TOO_LARGE, not retryable, for a RESOURCE_EXHAUSTED that is not
    a busy server (the payload limit); else OUTPUT_UPLOAD_FAILED, retryable when the server was
    unreachable or busy (another attempt may pass)."""
    if isinstance(error, ResourceExhaustedError) and not error.busy:
        return TaskError(f"output too large: {error.message}", code="OUTPUT_TOO_LARGE", retryable=False)
    return TaskError(
        f"could not upload the output: {error}", code="OUTPUT_UPLOAD_FAILED", retryable=error.retryable or error.busy
    )


def _input_failure(error: BaseException, *, retryable: bool) -> _Outcome:
    """The failure of a task whose input's blobs could not be read."""
    failure = TaskError(f"could not read the task's input: {error}", code="INPUT_UNAVAILABLE", retryable=retryable)
    return _Outcome(failure=failure, error=error)


def _task_name(name: str | None) -> str:
    """``name``, checked: registration takes the queue first, then the task name."""
    if not name:
        raise TypeError('a handler needs a task name: @worker.task("<queue>", "<task name>")')
    return name


def first_heartbeat_delay(task: worker_service_pb2.Task, interval: float, now: float) -> float:
    """How long after receipt the first heartbeat goes out (``now``: the wall clock at receipt, in seconds).

    A worker that asks to confirm receipt holds the task only until its first,
    short ``lease_expire_time`` unless a heartbeat confirms it: so the first
    heartbeat comes a third of the way there, or at ``interval`` if that is
    sooner. An expiry already past (clocks apart) gets a short delay instead.
    """
    if not task.HasField("lease_expire_time"):
        return interval
    until_expiry = task.lease_expire_time.ToNanoseconds() / 1e9 - now
    if until_expiry <= 0:
        return min(SKEWED_FIRST_HEARTBEAT, interval)
    return min(until_expiry / 3.0, interval)


async def _first_of(*awaitables: Awaitable[Any]) -> None:
    """Waits until the first of ``awaitables`` is done, then cancels the others."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _is_async(handler: Handler) -> bool:
    target: Any = handler
    while isinstance(target, functools.partial):
        target = target.func
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(getattr(target, "__call__", None))


__all__ = [
    "CANCEL_LEASE_LOST",
    "CANCEL_RUN_CANCELLED",
    "CANCEL_SHUTDOWN",
    "Handler",
    "Slots",
    "TaskCancelled",
    "TaskContext",
    "Worker",
    "WorkerStats",
]

