"""The Worker's logic against an in-process fake of the WorkerService (tests/_fakes.py):
slots, heartbeats, cancellation, lease-safe reports, retries of transient
failures, failure mapping and graceful shutdown. The conformance numbers
(tests/conformance/README.md) are those the integration tests prove against
the real server."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc
import pytest
from _fakes import FakeServer, busy, start_fake

from composer import Backoff, NonRetryableError, TaskContext, TaskError, TaskSecrets, Worker
from composer._values import from_value
from composer.v1 import worker_service_pb2
from composer.worker import CANCEL_LEASE_LOST, CANCEL_RUN_CANCELLED, first_heartbeat_delay

FAST = Backoff(initial=0.01, maximum=0.05)


def run(
    test: Callable[[FakeServer, str], Coroutine[Any, Any, None]],
    lease_seconds: float = 3.0,
    receipt_seconds: float | None = None,
) -> None:
    async def main() -> None:
        state = FakeServer(lease_seconds=lease_seconds, receipt_seconds=receipt_seconds)
        server, address = await start_fake(state)
        try:
            await asyncio.wait_for(test(state, address), 30)
        finally:
            await server.stop(None)

    asyncio.run(main())


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def make_worker(address: str, **kwargs: Any) -> Worker:
    kwargs.setdefault("backoff", FAST)
    kwargs.setdefault("poll_wait", 0.3)
    return Worker(address, queues=["q"], **kwargs)


async def serving(worker: Worker, body: Callable[[], Awaitable[None]]) -> None:
    serve = asyncio.create_task(worker.serve())
    try:
        await body()
    finally:
        worker.stop()
        await asyncio.wait_for(serve, 15)


def test_slots_bound_concurrency_and_every_task_completes() -> None:
    """C2 locally: 4 slots, 20 slow tasks (async and sync mixed): never more than 4 at once, all complete."""

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address, slots=4)
        lock = threading.Lock()
        running = 0
        peak = 0

        def enter() -> None:
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)

        def leave() -> None:
            nonlocal running
            with lock:
                running -= 1

        @worker.task(name="slow_async")
        async def slow_async(ctx: TaskContext) -> dict[str, Any]:
            enter()
            try:
                await asyncio.sleep(0.1)
            finally:
                leave()
            return {"n": ctx.input["n"]}

        @worker.task(name="slow_sync")
        def slow_sync(ctx: TaskContext) -> dict[str, Any]:
            enter()
            try:
                time.sleep(0.1)
            finally:
                leave()
            return {"n": ctx.input["n"], "thread": threading.current_thread().name.startswith("composer-task")}

        ids = [state.add_task("slow_async" if n % 2 else "slow_sync", {"n": n}) for n in range(20)]

        async def body() -> None:
            await until(lambda: len(state.completed) == 20)

        await serving(worker, body)
        assert peak == 4
        assert worker.max_concurrency_seen == 4
        for n, task_id in enumerate(ids):
            output = from_value(state.completed[task_id].output)
            assert output["n"] == n
            if n % 2 == 0:
                assert output["thread"] is True
        polls = [r for m, r in state.calls if m == "PollTasks"]
        assert all(1 <= r.max_tasks <= 4 for r in polls)
        assert all(list(r.queues) == ["q"] for r in polls)
        assert worker.stats.completed == 20

    run(test)


def test_heartbeats_keep_the_lease_and_a_cancelled_run_cancels_the_async_handler() -> None:
    """C3 locally: heartbeats at a third of the lease; cancel_requested reaches the handler; no report."""

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address)
        seen: dict[str, Any] = {}

        @worker.task(name="long")
        async def long(ctx: TaskContext) -> None:
            seen["ctx"] = ctx
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                seen["cancelled"] = ctx.cancel_reason
                raise

        task_id = state.add_task("long")

        async def body() -> None:
            await until(lambda: state.count("Heartbeat", task_id) >= 3)
            started = time.monotonic()
            state.cancel(task_id)
            await until(lambda: "cancelled" in seen)
            assert time.monotonic() - started < 0.5

        await serving(worker, body)
        # the server gave no reason: the fixed text stands in
        assert seen["cancelled"] == CANCEL_RUN_CANCELLED
        assert seen["ctx"].cancel_kind == CANCEL_RUN_CANCELLED
        assert seen["ctx"].cancelled
        assert state.count("CompleteTask") == 0 and state.count("FailTask") == 0
        assert worker.stats.cancelled == 1
        beats = [r for m, r in state.calls if m == "Heartbeat"]
        assert {(b.task_id, b.attempt) for b in beats} == {(task_id, 1)}

    run(test, lease_seconds=0.3)


def test_a_cancelled_run_tells_the_handler_the_reason_the_server_gives() -> None:
    """The heartbeat's cancel_reason (CancelRun's reason) is ctx.cancel_reason, in a sync handler too."""

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address)
        seen: dict[str, Any] = {}

        @worker.task(name="long")
        def long(ctx: TaskContext) -> None:
            ctx.cancel_event.wait(30)
            seen["reason"], seen["kind"] = ctx.cancel_reason, ctx.cancel_kind

        task_id = state.add_task("long")

        async def body() -> None:
            await until(lambda: state.count("Heartbeat", task_id) >= 1)
            state.cancel(task_id, "customer changed their mind")
            await until(lambda: "reason" in seen)

        await serving(worker, body)
        assert seen == {"reason": "customer changed their mind", "kind": CANCEL_RUN_CANCELLED}
        assert state.count("CompleteTask") == 0 and state.count("FailTask") == 0
        assert worker.stats.cancelled == 1

    run(test, lease_seconds=0.3)


def test_polls_confirm_receipt_and_the_first_heartbeat_comes_a_third_of_the_way_to_the_first_expiry() -> None:
    """C15 locally: a first lease of 0.6 s is confirmed at about 0.2 s; later beats keep the interval (1 s)."""

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address)
        received: list[float] = []

        @worker.task(name="long")
        async def long(ctx: TaskContext) -> str:
            received.append(time.monotonic())
            await asyncio.sleep(1.5)
            return "done"

        task_id = state.add_task("long")

        async def body() -> None:
            await until(lambda: state.count("CompleteTask", task_id) == 1)

        await serving(worker, body)
        beat_times = state.heartbeat_times
        polls = [r for m, r in state.calls if m == "PollTasks"]
        assert polls and all(r.confirm_receipt for r in polls)
        assert len(beat_times) == 2, beat_times  # at ~0.2 s (confirms) and ~1.2 s (the interval)
        assert beat_times[0] - received[0] < 0.45  # well before the first expiry at 0.6 s
        assert beat_times[1] - beat_times[0] > 0.7  # then the lease's third (1 s), not a third of 0.6 s
        assert worker.stats.completed == 1 and worker.stats.lease_lost == 0

    run(test, lease_seconds=3.0, receipt_seconds=0.6)


def test_a_task_reported_before_its_first_heartbeat_sends_none() -> None:
    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address)
        worker.register(None, "quick", lambda ctx: "done")
        task_id = state.add_task("quick")
        await serving(worker, lambda: until(lambda: state.count("CompleteTask", task_id) == 1))
        await asyncio.sleep(0.5)
        assert state.count("Heartbeat") == 0

    run(test, lease_seconds=3.0, receipt_seconds=2.0)


def test_first_heartbeat_delay() -> None:
    def task(expires_in: float | None) -> worker_service_pb2.Task:
        t = worker_service_pb2.Task(task_id="t")
        if expires_in is not None:
            t.lease_expire_time.FromNanoseconds(int((1_000.0 + expires_in) * 1e9))
        return t

    now = 1_000.0
    assert first_heartbeat_delay(task(None), 10.0, now) == 10.0  # no first expiry: the interval
    assert first_heartbeat_delay(task(6.0), 10.0, now) == pytest.approx(2.0)  # a third of the way
    assert first_heartbeat_delay(task(60.0), 10.0, now) == 10.0  # the interval when sooner
    assert first_heartbeat_delay(task(-3.0), 10.0, now) == 0.5  # already past (clocks apart): soon
    assert first_heartbeat_delay(task(-3.0), 0.2, now) == 0.2


def test_a_sync_handler_sees_the_lost_lease_and_nothing_is_reported() -> None:
    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address)
        reasons: list[str | None] = []

        @worker.task(name="spin")
        def spin(ctx: TaskContext) -> str:
            ctx.cancel_event.wait(20)
            reasons.append(ctx.cancel_reason)
            return "done anyway"

        task_id = state.add_task("spin")

        async def body() -> None:
            await until(lambda: task_id in state.leases)
            state.expire(task_id)
            await until(lambda: bool(reasons))
            await until(lambda: worker.in_flight == 0)

        await serving(worker, body)
        assert reasons == [CANCEL_LEASE_LOST]
        assert state.count("CompleteTask") == 0
        assert worker.stats.lease_lost == 1

    run(test, lease_seconds=0.3)


def test_a_late_report_after_the_lease_was_lost_is_sent_once_and_dropped() -> None:
    """C5 locally: the report meets LEASE_LOST; the SDK does not send it again."""

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address, heartbeat_interval=60.0)
        release = asyncio.Event()

        @worker.task(name="late")
        async def late(ctx: TaskContext) -> str:
            await release.wait()
            return "too late"

        task_id = state.add_task("late")

        async def body() -> None:
            await until(lambda: task_id in state.leases)
            state.expire(task_id)
            release.set()
            await until(lambda: worker.stats.lease_lost == 1)
            await asyncio.sleep(0.2)

        await serving(worker, body)
        assert state.count("CompleteTask", task_id) == 1
        assert state.count("FailTask", task_id) == 0
        assert task_id not in state.completed
        assert worker.stats.completed == 0 and worker.stats.report_retries == 0

    run(test)


def test_transient_report_failures_are_retried_with_the_same_lease_token() -> None:
    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address)

        @worker.task(name="ok")
        async def ok(ctx: TaskContext) -> int:
            return 42

        state.inject["CompleteTask"] += [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED]
        task_id = state.add_task("ok")

        async def body() -> None:
            await until(lambda: task_id in state.completed)

        await serving(worker, body)
        reports = [r for m, r in state.calls if m == "CompleteTask"]
        assert len(reports) == 3
        assert len({(r.task_id, r.attempt, r.lease_token) for r in reports}) == 1
        assert from_value(state.completed[task_id].output) == 42
        assert worker.stats.report_retries == 2 and worker.stats.completed == 1

    run(test)


def test_a_report_refused_by_a_busy_server_is_sent_again_until_the_deadline() -> None:
    """L6 for the completion report: a busy server's CompleteTask is sent again with the same lease
    token; still busy at the report deadline, the attempt fails with OUTPUT_UPLOAD_FAILED, retryable."""

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address, report_timeout=0.3)

        @worker.task(name="ok")
        async def ok(ctx: TaskContext) -> int:
            return 42

        state.inject["CompleteTask"] += [busy("CPU_POOL_BUSY", retry_after=0.01), busy("QUOTA_EXCEEDED")]
        passes = state.add_task("ok")

        async def body() -> None:
            await until(lambda: passes in state.completed)
            state.inject["CompleteTask"] += [busy("QUOTA_EXCEEDED", retry_after=0.02)] * 10_000
            never = state.add_task("ok")
            await until(lambda: never in state.failed)
            failed = state.failed[never]
            assert (failed.error_code, failed.retryable) == ("OUTPUT_UPLOAD_FAILED", True)
            assert "QUOTA_EXCEEDED" in failed.message
            assert state.count("CompleteTask", never) > 1

        await serving(worker, body)
        reports = [r for m, r in state.calls if m == "CompleteTask" and r.task_id == passes]
        assert len(reports) == 3
        assert len({(r.task_id, r.attempt, r.lease_token) for r in reports}) == 1
        assert from_value(state.completed[passes].output) == 42

    run(test)


def test_handler_failures_map_to_codes_and_retryability() -> None:
    """C8 locally: NonRetryableError → retryable=false; a plain exception → retryable, its class as code."""

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address)

        @worker.task(name="final")
        async def final(ctx: TaskContext) -> None:
            raise NonRetryableError("card declined", code="DECLINED", details={"card": "x"})

        @worker.task(name="plain")
        def plain(ctx: TaskContext) -> None:
            raise ValueError("bad amount")

        @worker.task(name="custom")
        async def custom(ctx: TaskContext) -> None:
            raise TaskError("rate limited", code="RATE_LIMITED")

        @worker.task(name="not_json")
        async def not_json(ctx: TaskContext) -> object:
            return {"when": object()}

        ids = {name: state.add_task(name) for name in ["final", "plain", "custom", "not_json", "nobody_serves_this"]}

        async def body() -> None:
            await until(lambda: len(state.failed) == len(ids))

        await serving(worker, body)
        failed = {name: state.failed[task_id] for name, task_id in ids.items()}
        assert (failed["final"].error_code, failed["final"].retryable, failed["final"].message) == ("DECLINED", False, "card declined")
        assert from_value(failed["final"].details) == {"card": "x"}
        assert (failed["plain"].error_code, failed["plain"].retryable) == ("ValueError", True)
        assert "ValueError: bad amount" in from_value(failed["plain"].details)["traceback"]
        assert (failed["custom"].error_code, failed["custom"].retryable) == ("RATE_LIMITED", True)
        assert (failed["not_json"].error_code, failed["not_json"].retryable) == ("INVALID_OUTPUT", False)
        assert failed["nobody_serves_this"].error_code == "UNKNOWN_TASK"
        assert state.count("CompleteTask") == 0

    run(test)


def test_poll_errors_back_off_and_the_worker_recovers() -> None:
    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address)

        @worker.task(name="ok")
        async def ok(ctx: TaskContext) -> str:
            return "fine"

        state.inject["PollTasks"] += [grpc.StatusCode.UNAVAILABLE] * 3 + [grpc.StatusCode.INTERNAL]
        task_id = state.add_task("ok")

        async def body() -> None:
            await until(lambda: task_id in state.completed)

        await serving(worker, body)
        assert worker.stats.poll_errors == 4

    run(test)


def test_stop_drains_in_flight_tasks_and_polls_nothing_new() -> None:
    """C7 locally: stop polling → in-flight tasks finish and report, heartbeating meanwhile → exit."""

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address, slots=4, drain_timeout=10.0)
        started = asyncio.Event()

        @worker.task(name="work")
        async def work(ctx: TaskContext) -> str:
            started.set()
            await asyncio.sleep(0.6)
            return "finished"

        first = [state.add_task("work") for _ in range(2)]
        serve = asyncio.create_task(worker.serve())
        await started.wait()
        await until(lambda: worker.in_flight == 2 and state.polls == 2)  # the next poll is waiting
        polls_before_stop = state.polls
        worker.stop()
        late = state.add_task("work")  # the poll already waiting may take it: then it runs and reports too
        await asyncio.wait_for(serve, 10)
        assert all(task_id in state.completed for task_id in first)
        assert state.polls == polls_before_stop  # no poll started after stop()
        assert late in state.completed or (late not in state.leases and state.pending.qsize() == 1)
        assert state.count("Heartbeat") >= 2  # lease 0.3 s: heartbeats went on during the drain

    run(test, lease_seconds=0.3)


def test_a_drain_that_times_out_gives_the_attempt_back() -> None:
    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address, drain_timeout=0.3)
        reasons: list[str | None] = []

        @worker.task(name="stuck")
        async def stuck(ctx: TaskContext) -> None:
            try:
                await asyncio.sleep(60)
            finally:
                reasons.append(ctx.cancel_reason)

        task_id = state.add_task("stuck")
        serve = asyncio.create_task(worker.serve())
        await until(lambda: worker.in_flight == 1)
        worker.stop()
        await asyncio.wait_for(serve, 10)
        assert reasons == ["worker shutdown"]
        assert state.failed[task_id].error_code == "WORKER_SHUTDOWN"
        assert state.failed[task_id].retryable is True

    run(test)


def test_registration_takes_the_queue_then_the_task_name() -> None:
    worker = Worker("127.0.0.1:1", queues=["a"])

    @worker.task("b", "t")
    def handler(ctx: TaskContext) -> None:
        return None

    @worker.task(queue="c", name="u")
    def other(ctx: TaskContext) -> None:
        return None

    @worker.task(name="anywhere")
    def anywhere(ctx: TaskContext) -> None:
        return None

    assert worker.queues == ["a", "b", "c"]
    assert worker._handlers == {("b", "t"): handler, ("c", "u"): other, (None, "anywhere"): anywhere}
    with pytest.raises(ValueError):
        worker.register("b", "t", handler)
    # the order of before (task name first, queue as a keyword) fails at once, not at the first task
    with pytest.raises(TypeError, match="task name"):
        worker.task("charge")
    with pytest.raises(TypeError):
        worker.task("charge", queue="payments")  # type: ignore[misc]
    with pytest.raises(ValueError):
        Worker("127.0.0.1:1", slots=0)

    async def no_queue() -> None:
        await Worker("127.0.0.1:1").serve()

    with pytest.raises(ValueError, match="no queue"):
        asyncio.run(no_queue())


def test_serve_code_runs_snippets_and_reports_a_timeout_as_final() -> None:
    """C10 locally: the code runner on queue code.python, through the worker."""

    async def test(state: FakeServer, address: str) -> None:
        worker = Worker(address, backoff=FAST, poll_wait=0.3)
        worker.serve_code(time_limit=1.0)
        assert worker.queues == ["code.python"]
        ok = state.add_task("code", {"code": "result = input * 2", "input": 21}, queue="code.python")
        spin = state.add_task("code", {"code": "while True:\n    pass", "input": None}, queue="code.python")
        broken = state.add_task("code", {"code": "1/0", "input": None}, queue="code.python")
        bad = state.add_task("code", {"no_code": True}, queue="code.python")

        async def body() -> None:
            await until(lambda: ok in state.completed and len(state.failed) == 3)

        await serving(worker, body)
        assert from_value(state.completed[ok].output) == 42
        timeout = state.failed[spin]
        assert (timeout.error_code, timeout.retryable) == ("TIMEOUT", False)
        error = state.failed[broken]
        assert (error.error_code, error.retryable, error.message) == ("CODE_ERROR", True, "ZeroDivisionError: division by zero")
        assert "ZeroDivisionError" in from_value(error.details)["traceback"]
        assert (state.failed[bad].error_code, state.failed[bad].retryable) == ("BAD_CODE_INPUT", False)

    run(test)


def test_serve_code_hands_a_snippet_only_its_declared_secrets_and_reports_them_redacted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """docs/secrets.md: the values the server hands with a CODE task reach the snippet's input
    under ``secrets``, only for the names the task declares, and no report or log shows one."""
    caplog.set_level(logging.DEBUG)
    value = f"whsec_{uuid.uuid4().hex}"
    handed = {"k": value}

    async def test(state: FakeServer, address: str) -> None:
        worker = Worker(address, backoff=FAST, poll_wait=0.3)
        worker.serve_code(time_limit=10.0)

        def code_task(code: str, input: Any, *declared: str) -> str:
            task_input: dict[str, Any] = {"code": code, "input": input}
            if declared:
                task_input["secrets"] = list(declared)
            return state.add_task("code", task_input, queue="code.python", secrets=handed)

        echo = code_task(
            "print('using', input['secrets']['k'])\n"
            "{'echo': input['secrets']['k'], 'length': len(input['secrets']['k']), 'n': input['n']}",
            {"n": 1},
            "k",
        )
        absent = code_task("input", None, "k")
        # A server hands values only with a task that declares them; were it to hand them to
        # one that does not, the snippet still gets no secrets key.
        undeclared = code_task("['secrets' in input, input]", {"n": 2})
        raising = code_task("raise RuntimeError('rejected ' + input['secrets']['k'])", {}, "k")
        listed = code_task("input", [1, 2], "k")
        missing = code_task("1", {}, "k", "other")

        async def body() -> None:
            await until(lambda: len(state.completed) == 3 and len(state.failed) == 3)

        await serving(worker, body)
        assert from_value(state.completed[echo].output) == {"echo": "[secret k]", "length": len(value), "n": 1}
        assert from_value(state.completed[absent].output) == {"secrets": {"k": "[secret k]"}}
        assert from_value(state.completed[undeclared].output) == [False, {"n": 2}]
        error = state.failed[raising]
        assert (error.error_code, error.retryable, error.message) == ("CODE_ERROR", True, "RuntimeError: rejected [secret k]")
        assert "RuntimeError: rejected [secret k]" in from_value(error.details)["traceback"]
        refused = state.failed[listed]
        assert (refused.error_code, refused.retryable) == ("SECRETS_NEED_OBJECT_INPUT", False)
        unavailable = state.failed[missing]
        assert (unavailable.error_code, unavailable.retryable) == ("SECRET_UNAVAILABLE", True)
        assert "other" in unavailable.message
        for method, request in state.calls:
            if method in ("CompleteTask", "FailTask"):
                assert value.encode() not in request.SerializeToString(), (method, request)

    run(test)
    assert "using [secret k]" in caplog.text, "the snippet's output is logged, redacted"
    assert value not in caplog.text


def test_a_task_context_names_its_secrets_but_never_shows_their_values() -> None:
    value = f"sk_live_{uuid.uuid4().hex}"
    task = worker_service_pb2.Task(task_id="t1", attempt=2, queue="code.python", secrets={"k": value, "j": "other"})
    plain = worker_service_pb2.Task(task_id="t2", attempt=1, queue="q")

    async def build(of: worker_service_pb2.Task) -> TaskContext:
        return TaskContext(of, logging.getLogger("test"), asyncio.get_running_loop())

    ctx = asyncio.run(build(task))
    assert ctx.secrets["k"] == value and dict(ctx.secrets) == {"j": "other", "k": value}
    assert isinstance(ctx.secrets, TaskSecrets) and len(ctx.secrets) == 2
    assert repr(ctx.secrets) == str(ctx.secrets) == "TaskSecrets(['j', 'k'])"
    for shown in (repr(ctx), str(ctx), repr(vars(ctx)), f"{ctx.secrets}"):
        assert value not in shown, shown
    assert "secrets=['j', 'k']" in repr(ctx)
    with pytest.raises(KeyError, match="missing"):
        ctx.secrets["missing"]
    assert len(asyncio.run(build(plain)).secrets) == 0, "a task handed no secrets has none"


def test_the_worker_keeps_a_tasks_secrets_in_its_context_alone() -> None:
    """Once leased, the Task message the worker keeps for its reports holds no value."""
    value = f"sk_live_{uuid.uuid4().hex}"

    async def test(state: FakeServer, address: str) -> None:
        worker = make_worker(address)
        received: list[str] = []
        kept: list[worker_service_pb2.Task] = []
        execute = worker._execute

        async def recording(task: worker_service_pb2.Task, ctx: TaskContext, interval: float, first_beat: float) -> None:
            kept.append(task)
            await execute(task, ctx, interval, first_beat)

        worker._execute = recording  # type: ignore[method-assign]

        @worker.task("q", "look")
        async def look(ctx: TaskContext) -> None:
            received.append(ctx.secrets["k"])

        state.add_task("look", {}, secrets={"k": value})
        await serving(worker, lambda: until(lambda: len(state.completed) == 1))
        assert received == [value]
        [task] = kept
        assert len(task.secrets) == 0 and value not in str(task)

    run(test)
