"""The SDK conformance behaviours (tests/conformance/README.md), against the real server.

Each test is named after its number (C1 ... C19). They start `composer serve`
(conftest.py) and pass once the server behaves as the protos' comments say.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import grpc
import pytest
from _support import FAST, POLL_WAIT, Recorder, WorkerProcess, final, history_types, one_task, serving, three_step, until
from conftest import ServerProcess

from composer import (
    AlreadyExistsError,
    BulkOperationKind,
    BulkOperationStatus,
    Client,
    FailedPreconditionError,
    InvalidArgumentError,
    LeaseLostError,
    NodeStatus,
    NonRetryableError,
    NotFoundError,
    OverlapPolicy,
    QueueRateLimit,
    RunFailedError,
    RunFilter,
    RunStatus,
    ScheduleFireOutcome,
    SyncClient,
    TaskContext,
    Worker,
)
from composer.errors import from_rpc_error
from composer.v1 import worker_service_pb2, worker_service_pb2_grpc


def run(coroutine: Any) -> None:
    asyncio.run(asyncio.wait_for(coroutine, 240))


def test_c01_a_worker_completes_a_three_step_workflow_and_the_client_gets_its_output(server: ServerProcess, names: str) -> None:
    async def main() -> None:
        worker = Worker(server.address, slots=2, backoff=FAST, poll_wait=POLL_WAIT)
        seen: list[tuple[str, int, str]] = []

        @worker.task(f"steps_{names}", "add_one")
        async def add_one(ctx: TaskContext) -> dict[str, Any]:
            seen.append((ctx.node_id, ctx.attempt, ctx.workflow_name))
            return {"x": ctx.input["x"] + 1}

        @worker.task(f"steps_{names}", "double")
        def double(ctx: TaskContext) -> dict[str, Any]:  # a sync handler, in the thread pool
            seen.append((ctx.node_id, ctx.attempt, ctx.workflow_name))
            return {"x": ctx.input["x"] * 2}

        @worker.task(f"steps_{names}", "describe")
        async def describe(ctx: TaskContext) -> dict[str, Any]:
            seen.append((ctx.node_id, ctx.attempt, ctx.workflow_name))
            return {"value": ctx.input["x"], "run": ctx.run_id}

        async with Client(server.address) as client, serving(worker):
            registered = await client.register_workflow(three_step(names))
            assert registered.name == f"three_step_{names}" and registered.version == 1 and registered.created
            run_ = await client.start_run(registered.name, {"x": 4})
            output = await client.wait_for_result(run_.run_id, timeout=60)
            assert output == {"result": {"value": 10, "run": run_.run_id}}
            done = await client.get_run(run_.run_id)
            assert done.status is RunStatus.COMPLETED
            assert [(n.node_id, n.node_type, n.status, n.attempt) for n in sorted(done.nodes, key=lambda n: n.node_id)] == [
                ("a", "TASK", NodeStatus.COMPLETED, 1),
                ("b", "TASK", NodeStatus.COMPLETED, 1),
                ("c", "TASK", NodeStatus.COMPLETED, 1),
            ]
        assert seen == [("a", 1, registered.name), ("b", 1, registered.name), ("c", 1, registered.name)]
        assert worker.stats.completed == 3

    run(main())


def test_c02_slots_bound_concurrency_and_every_task_finishes(server: ServerProcess, names: str) -> None:
    async def main() -> None:
        queue = f"slow_{names}"
        worker = Worker(server.address, slots=4, backoff=FAST, poll_wait=POLL_WAIT)
        lock = threading.Lock()
        running = peak = 0

        @worker.task(queue, "slow")
        async def slow(ctx: TaskContext) -> int:
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)
            try:
                await asyncio.sleep(1.0)
            finally:
                with lock:
                    running -= 1
            return int(ctx.input["n"])

        async with Client(server.address) as client:
            await client.register_workflow(one_task(f"slow_{names}", queue, "slow", extra='input: { n: "${input.n}" }'))
            runs = [await client.start_run(f"slow_{names}", {"n": n}) for n in range(20)]
            started = time.monotonic()
            async with serving(worker):
                outputs = await asyncio.gather(*(client.wait_for_result(r.run_id, timeout=90) for r in runs))
            elapsed = time.monotonic() - started
        assert outputs == [{"result": n} for n in range(20)]
        assert peak == 4, peak
        assert worker.max_concurrency_seen == 4
        assert elapsed >= 5.0  # 20 tasks of 1 s, 4 at a time

    run(main())


def test_c03_heartbeats_keep_a_task_alive_past_its_lease(server: ServerProcess, names: str) -> None:
    async def main() -> None:
        queue = f"hb_{names}"
        worker = Worker(server.address, slots=1, backoff=FAST, poll_wait=POLL_WAIT)
        attempts: list[int] = []

        @worker.task(queue, "long")
        async def long(ctx: TaskContext) -> str:
            attempts.append(ctx.attempt)
            await asyncio.sleep(7.0)  # 3.5 leases of 2 s
            return "survived"

        async with Client(server.address) as client, serving(worker):
            await client.register_workflow(
                one_task(f"hb_{names}", queue, "long", extra="heartbeat_timeout: 2s\nretry: { max_attempts: 3 }")
            )
            started = await client.start_run(f"hb_{names}")
            assert await client.wait_for_result(started.run_id, timeout=60) == {"result": "survived"}
            history = await history_types(client, started.run_id)
        assert attempts == [1]
        assert not any("expired" in event.lower() for event in history), history
        assert worker.stats.lease_lost == 0

    run(main())


def test_c04_a_task_whose_run_is_cancelled_sees_its_cancellation(server: ServerProcess, names: str) -> None:
    async def main() -> None:
        queue = f"cancel_{names}"
        worker = Worker(server.address, slots=2, backoff=FAST, poll_wait=POLL_WAIT)
        started = asyncio.Event()
        reasons: list[str] = []

        @worker.task(queue, "wait")
        async def wait(ctx: TaskContext) -> str:
            started.set()
            try:
                await asyncio.sleep(120)
            except asyncio.CancelledError:  # an async handler is cancelled at its await
                reasons.append(f"{ctx.cancel_kind}: {ctx.cancel_reason}")
                raise
            return "unreachable"

        async with Client(server.address) as client, serving(worker):
            await client.register_workflow(one_task(f"cancel_{names}", queue, "wait", extra="heartbeat_timeout: 3s"))
            begun = await client.start_run(f"cancel_{names}")
            await asyncio.wait_for(started.wait(), 30)
            cancelled_at = time.monotonic()
            await client.cancel_run(begun.run_id, reason="conformance C4")
            await until(lambda: bool(reasons), 15, "the handler to see the cancellation")
            seen_after = time.monotonic() - cancelled_at
            ended = await final(client, begun.run_id)
            with pytest.raises(FailedPreconditionError):
                await client.cancel_run(begun.run_id)
            with pytest.raises(RunFailedError) as failed:
                await client.wait_for_result(begun.run_id, timeout=10)
        # the handler sees CancelRun's reason; the run's error is CANCELLED with it
        assert reasons == ["run cancelled: conformance C4"]
        assert seen_after < 3.0  # within one heartbeat interval (a third of 3 s) plus slack
        assert ended.status is RunStatus.CANCELLED
        assert failed.value.run.status is RunStatus.CANCELLED
        assert (failed.value.code, failed.value.message) == ("CANCELLED", "conformance C4")
        assert worker.stats.completed == 0 and worker.stats.failed == 0 and worker.stats.cancelled == 1

    run(main())


def test_c05_a_worker_killed_mid_task_has_its_task_run_again_as_attempt_2(server: ServerProcess, names: str) -> None:
    async def main() -> None:
        queue = f"kill_{names}"
        first = WorkerProcess(server.address, queue, slots=1, seconds=120)
        second: WorkerProcess | None = None
        try:
            async with Client(server.address) as client:
                await client.register_workflow(
                    one_task(f"kill_{names}", queue, "slow", extra="heartbeat_timeout: 2s\nretry: { max_attempts: 3, initial_interval: 100ms }")
                )
                started = await client.start_run(f"kill_{names}")
                (began,) = await first.wait_for("started")
                assert began["attempt"] == 1 and began["run_id"] == started.run_id
                # Killed once its lease is confirmed: before that the task would come back as attempt 1 (C15).
                await first.wait_for("heartbeat")
                first.process.send_signal(signal.SIGKILL)
                first.process.wait()
                second = WorkerProcess(server.address, queue, slots=1, seconds=120)
                output = await client.wait_for_result(started.run_id, timeout=90)
                (again,) = await second.wait_for("finished")
                node = (await client.get_run(started.run_id)).node("work")
        finally:
            first.kill()
            if second is not None:
                second.kill()
        assert again["task_id"] == began["task_id"] and again["attempt"] == 2
        assert output == {"result": {"pid": second.process.pid, "attempt": 2}}
        assert node is not None and node.attempt == 2 and node.status is NodeStatus.COMPLETED

    run(main())


def test_c06_a_late_report_after_the_lease_was_lost_is_refused_and_not_retried(server: ServerProcess, names: str) -> None:
    async def main() -> None:
        queue = f"late_{names}"
        recorder = Recorder()
        # No heartbeats (interval far past the lease): the first attempt's lease expires.
        worker = Worker(
            server.address, slots=2, backoff=FAST, poll_wait=POLL_WAIT, heartbeat_interval=3600, interceptors=[recorder]
        )
        second_done = asyncio.Event()

        @worker.task(queue, "late")
        async def late(ctx: TaskContext) -> dict[str, int]:
            if ctx.attempt == 1:
                await second_done.wait()  # report only after attempt 2 completed
                await asyncio.sleep(0.5)
            else:
                second_done.set()
            return {"attempt": ctx.attempt}

        async with Client(server.address) as client, serving(worker):
            await client.register_workflow(
                one_task(f"late_{names}", queue, "late", extra="heartbeat_timeout: 2s\nretry: { max_attempts: 3, initial_interval: 100ms }")
            )
            started = await client.start_run(f"late_{names}")
            assert await client.wait_for_result(started.run_id, timeout=90) == {"result": {"attempt": 2}}
            await until(lambda: worker.stats.lease_lost >= 1, 30, "the late report to be refused")
            await asyncio.sleep(1.0)  # time in which a retry would show
        completes = recorder.requests("CompleteTask")
        by_attempt = {a: [r for r in completes if r.attempt == a] for a in (1, 2)}
        assert len(by_attempt[1]) == 1, "the refused report must not be sent again"
        assert len(by_attempt[2]) == 1
        assert worker.stats.report_retries == 0

        # The server's answer itself: the stale report once more, sent raw.
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                token = os.environ["COMPOSER_TOKEN"]
                await stub.CompleteTask(by_attempt[1][0], timeout=10, metadata=(("authorization", f"Bearer {token}"),))
        error = from_rpc_error(refused.value)
        assert isinstance(error, LeaseLostError)
        assert error.code is grpc.StatusCode.FAILED_PRECONDITION and error.reason == "LEASE_LOST"

    run(main())


def test_c07_a_server_restart_under_a_running_worker(own_server: ServerProcess, names: str) -> None:
    async def main() -> None:
        queue = f"restart_{names}"
        worker = Worker(own_server.address, slots=2, backoff=FAST, poll_wait=POLL_WAIT)
        release = threading.Event()

        @worker.task(queue, "step")
        def step(ctx: TaskContext) -> dict[str, Any]:
            if ctx.input.get("hold"):
                release.wait(60)
            return {"attempt": ctx.attempt, "n": ctx.input["n"]}

        async with Client(own_server.address) as client, serving(worker):
            await client.register_workflow(
                one_task(f"restart_{names}", queue, "step", extra='heartbeat_timeout: 10s\ninput: "${input}"')
            )
            before = await client.start_run(f"restart_{names}", {"n": 1})
            assert await client.wait_for_result(before.run_id, timeout=30) == {"result": {"attempt": 1, "n": 1}}
            held = await client.start_run(f"restart_{names}", {"n": 2, "hold": True})
            await until(lambda: worker.in_flight == 1, 30, "the held task to start")
            await asyncio.to_thread(own_server.restart)
            release.set()  # its report meets a server that just came back (or is still coming back)
            after = await client.start_run(f"restart_{names}", {"n": 3})
            results = await asyncio.gather(
                client.wait_for_result(held.run_id, timeout=90), client.wait_for_result(after.run_id, timeout=90)
            )
        assert results[0]["result"]["n"] == 2 and results[1]["result"]["n"] == 3
        assert worker.stats.poll_errors >= 1  # it did see the server go away, and came back by itself

    run(main())


def test_c08_sigterm_drains_in_flight_tasks_and_polls_nothing_new(server: ServerProcess, names: str) -> None:
    async def main() -> None:
        queue = f"term_{names}"
        process = WorkerProcess(server.address, queue, slots=2, seconds=3.0, drain=30.0)
        try:
            async with Client(server.address) as client:
                await client.register_workflow(one_task(f"term_{names}", queue, "slow", extra="heartbeat_timeout: 2s"))
                await process.wait_for("ready")
                runs = [await client.start_run(f"term_{names}") for _ in range(2)]
                await process.wait_for("started", 2)
                process.process.send_signal(signal.SIGTERM)
                # Both slots are busy, so no poll is waiting: a run started now must not reach this worker.
                late = await client.start_run(f"term_{names}")
                exit_code = await asyncio.to_thread(process.process.wait, 60)
                outputs = [await client.wait_for_result(r.run_id, timeout=10) for r in runs]
                late_node = (await client.get_run(late.run_id)).node("work")
                # Another worker takes the late run as its first attempt.
                other = Worker(server.address, backoff=FAST, poll_wait=POLL_WAIT)

                @other.task(queue, "slow")
                async def quick(ctx: TaskContext) -> dict[str, int]:
                    return {"pid": 0, "attempt": ctx.attempt}

                async with serving(other):
                    late_output = await client.wait_for_result(late.run_id, timeout=60)
        finally:
            process.kill()
        assert exit_code == 0
        assert [o["result"]["pid"] for o in outputs] == [process.process.pid] * 2
        assert len(process.seen("finished")) == 2 and process.seen("exited")[0]["completed"] == 2
        assert process.seen("exited")[0]["polled"] == 2
        assert late_node is None or late_node.status is not NodeStatus.COMPLETED
        assert late_output == {"result": {"pid": 0, "attempt": 1}}

    run(main())


def test_c09_non_retryable_error_fails_at_once_a_plain_exception_is_retried(server: ServerProcess, names: str) -> None:
    async def main() -> None:
        queue = f"fail_{names}"
        worker = Worker(server.address, slots=4, backoff=FAST, poll_wait=POLL_WAIT)
        calls: dict[str, list[int]] = {"final": [], "flaky": [], "broken": []}

        @worker.task(queue, "final")
        async def final_(ctx: TaskContext) -> None:
            calls["final"].append(ctx.attempt)
            raise NonRetryableError("card declined", code="DECLINED")

        @worker.task(queue, "flaky")
        def flaky(ctx: TaskContext) -> str:
            calls["flaky"].append(ctx.attempt)
            if ctx.attempt < 3:
                raise ConnectionError("try again")
            return "third time lucky"

        @worker.task(queue, "broken")
        async def broken(ctx: TaskContext) -> None:
            calls["broken"].append(ctx.attempt)
            raise ValueError("always")

        retry = "retry: { max_attempts: 3, initial_interval: 100ms, backoff: 1.0 }"
        async with Client(server.address) as client, serving(worker):
            for task in calls:
                await client.register_workflow(one_task(f"{task}_{names}", queue, task, extra=retry))
            runs = {task: await client.start_run(f"{task}_{names}") for task in calls}
            ended = {task: await final(client, r.run_id, 60) for task, r in runs.items()}
        assert calls == {"final": [1], "flaky": [1, 2, 3], "broken": [1, 2, 3]}
        assert ended["final"].status is RunStatus.FAILED
        node = ended["final"].node("work")
        assert node is not None and node.attempt == 1 and node.error is not None and node.error.code == "DECLINED"
        assert ended["flaky"].status is RunStatus.COMPLETED and ended["flaky"].output == {"result": "third time lucky"}
        broken_node = ended["broken"].node("work")
        assert ended["broken"].status is RunStatus.FAILED
        assert broken_node is not None and broken_node.attempt == 3
        assert broken_node.error is not None and broken_node.error.code == "ValueError"
        # Failure.details carries what FailTask reported (common.proto), here the stack trace.
        assert broken_node.error.details is not None, "the server dropped FailTask.details from the node's error"
        assert "Traceback" in broken_node.error.details["traceback"]

    run(main())


def test_c10_a_python_code_node_runs_and_an_endless_snippet_is_stopped(server: ServerProcess, names: str) -> None:
    async def main() -> None:
        worker = Worker(server.address, slots=2, backoff=FAST, poll_wait=POLL_WAIT)
        worker.serve_code(time_limit=2.0)
        workflow = f"""
name: code_{names}
nodes:
  - id: compute
    type: CODE
    language: python
    code: |
      total = sum(item["price"] * item["qty"] for item in input["items"])
      {{"total": total, "count": len(input["items"])}}
    input: "${{input}}"
output: {{ result: "${{nodes.compute.output}}" }}
"""
        endless = f"""
name: endless_{names}
nodes:
  - id: spin
    type: CODE
    language: python
    code: |
      while True:
          pass
    retry: {{ max_attempts: 3, initial_interval: 100ms }}
"""
        async with Client(server.address) as client, serving(worker):
            await client.register_workflow(workflow)
            await client.register_workflow(endless)
            ok = await client.start_run(f"code_{names}", {"items": [{"price": 2.5, "qty": 2}, {"price": 1, "qty": 3}]})
            assert await client.wait_for_result(ok.run_id, timeout=60) == {"result": {"total": 8, "count": 2}}
            started = time.monotonic()
            spin = await client.start_run(f"endless_{names}")
            ended = await final(client, spin.run_id, 60)
            elapsed = time.monotonic() - started
        assert ended.status is RunStatus.FAILED
        node = ended.node("spin")
        assert node is not None and node.error is not None
        assert node.error.code == "TIMEOUT" and node.attempt == 1  # non-retryable: no second attempt
        assert "time limit" in node.error.message
        assert elapsed < 30

    run(main())


def test_c11_a_bad_workflow_raises_an_error_listing_each_field_violation(server: ServerProcess, names: str) -> None:
    bad = f"""
name: bad_{names}
nodes:
  - id: a
    type: TASK
    queue: q
    task: t
    retry: {{ max_attempts: 0 }}
  - id: b
    type: TASK
    queue: q
    task: t
edges:
  - {{ from: a, to: nowhere }}
"""

    async def main() -> None:
        async with Client(server.address) as client:
            with pytest.raises(InvalidArgumentError) as caught:
                await client.register_workflow(bad)
            problems = await client.validate_workflow(bad)
        error = caught.value
        assert error.code is grpc.StatusCode.INVALID_ARGUMENT
        fields = [v.field for v in error.field_violations]
        assert "nodes[0].retry.max_attempts" in fields
        assert any(f.startswith("edges[0]") for f in fields)
        assert all(v.description for v in error.field_violations)
        assert [(p.path, p.message) for p in problems] == [(v.field, v.description) for v in error.field_violations]
        for field in fields:
            assert field in str(error)

    run(main())
    # The sync facade raises the same.
    with SyncClient(server.address) as sync, pytest.raises(InvalidArgumentError) as caught:
        sync.register_workflow(bad)
    assert len(caught.value.field_violations) >= 2


def test_c12_client_runs_idempotency_listing_events_and_retry(server: ServerProcess, names: str) -> None:
    async def main() -> None:
        queue = f"client_{names}"
        worker = Worker(server.address, slots=4, backoff=FAST, poll_wait=POLL_WAIT)
        fail_first = {"on": True}

        @worker.task(queue, "echo")
        async def echo(ctx: TaskContext) -> Any:
            if ctx.input.get("fail") and fail_first["on"]:
                raise NonRetryableError("asked to fail", code="ASKED")
            return ctx.input

        waiting = f"""
name: waiting_{names}
nodes:
  - id: approval
    type: WAIT_FOR_EVENT
    event: approval
output: {{ approved: "${{nodes.approval.output.ok}}" }}
"""
        async with Client(server.address) as client, serving(worker):
            await client.register_workflow(one_task(f"echo_{names}", queue, "echo", extra='input: "${input}"'))
            again = await client.register_workflow(one_task(f"echo_{names}", queue, "echo", extra='input: "${input}"'))
            assert again.version == 1 and again.created is False
            # Idempotent start.
            key = f"key-{uuid.uuid4()}"
            first = await client.start_run(f"echo_{names}", {"n": 1}, idempotency_key=key, labels={"suite": names})
            repeat = await client.start_run(f"echo_{names}", {"n": 1}, idempotency_key=key, labels={"suite": names})
            assert first.created is True and repeat.created is False and repeat.run_id == first.run_id
            # Listing pages through every run.
            others = [await client.start_run(f"echo_{names}", {"n": n}, labels={"suite": names}) for n in range(2, 6)]
            for r in [first, *others]:
                await client.wait_for_result(r.run_id, timeout=60)
            listed = [r async for r in client.list_runs(workflow=f"echo_{names}", labels={"suite": names}, page_size=2)]
            assert sorted(r.run_id for r in listed) == sorted(r.run_id for r in [first, *others])
            assert all(r.status is RunStatus.COMPLETED for r in listed)
            completed = [r async for r in client.list_runs(workflow=f"echo_{names}", statuses=[RunStatus.FAILED])]
            assert completed == []
            # Typed errors.
            with pytest.raises(NotFoundError):
                await client.get_run(str(uuid.uuid4()))
            with pytest.raises(NotFoundError):
                await client.start_run(f"missing_{names}")
            # Retry of a failed run.
            failing = await client.start_run(f"echo_{names}", {"fail": True})
            assert (await final(client, failing.run_id)).status is RunStatus.FAILED
            with pytest.raises(FailedPreconditionError):
                await client.retry_run(first.run_id)  # not FAILED
            fail_first["on"] = False
            resumed = await client.retry_run(failing.run_id)
            assert resumed.status is RunStatus.RUNNING
            assert await client.wait_for_result(failing.run_id, timeout=60) == {"result": {"fail": True}}
            # Events, and waiting with a timeout.
            await client.register_workflow(waiting)
            waiter = await client.start_run(f"waiting_{names}")
            with pytest.raises(TimeoutError):
                await client.wait_for_result(waiter.run_id, timeout=1.0)
            delivery = await client.send_event("approval", {"ok": True}, run_id=waiter.run_id, request_id="r-1")
            assert delivery.delivered_run_ids in ((waiter.run_id,), ()) and (delivery.delivered_run_ids or delivery.stored)
            assert await client.wait_for_result(waiter.run_id, timeout=30) == {"approved": True}

    run(main())


def test_c13_the_sdk_checks_the_protocol_version(server: ServerProcess) -> None:
    async def main() -> None:
        async with Client(server.address) as client:
            info = await client.server_info()
            assert await client.check_protocol() == info
        major, minor = info.protocol_version.split(".")
        assert major == "1" and int(minor) >= 0 and info.server_version
        with SyncClient(f"http://{server.address}") as sync:
            assert sync.check_protocol() == info

    run(main())


def test_addresses_in_every_form_and_from_composer_address(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """host:port, http://host:port and COMPOSER_ADDRESS reach the same server; a worker too."""

    async def main() -> None:
        for address in (server.address, f"http://{server.address}"):
            async with Client(address) as client:
                assert (await client.server_info()).server_version
        monkeypatch.setenv("COMPOSER_ADDRESS", f"http://{server.address}")
        async with Client() as client:
            assert (await client.server_info()).server_version
        worker = Worker(poll_wait=POLL_WAIT)
        assert worker.address == server.address

    run(main())


def test_workflow_listings_run_counts_and_the_sync_watch(server: ServerProcess, names: str) -> None:
    """list_workflows, list_workflow_versions, count_runs and SyncClient.watch_run against the server."""

    async def main() -> None:
        queue = f"lists_{names}"
        name = f"lists_{names}"
        async with Client(server.address) as client:
            first = await client.register_workflow(one_task(name, queue, "step"))
            second = await client.register_workflow(one_task(name, queue, "step", extra="timeout: 30s"))
            assert (first.version, second.version) == (1, 2)
            await client.register_workflow(one_task(f"{name}_other", queue, "step"))

            summaries = [w async for w in client.list_workflows(name_prefix=name, page_size=1)]
            assert [(w.name, w.latest_version) for w in summaries] == [(name, 2), (f"{name}_other", 1)]
            versions = [v.version async for v in client.list_workflow_versions(name, page_size=1)]
            assert versions == [2, 1]
            with pytest.raises(NotFoundError):
                [v async for v in client.list_workflow_versions(f"{name}_missing")]

            runs = [await client.start_run(name) for _ in range(3)]
            await client.cancel_run(runs[0].run_id, "not needed")
            counts = await client.count_runs(workflow=name)
            assert counts[RunStatus.CANCELLED] == 1
            assert counts[RunStatus.RUNNING] + counts[RunStatus.QUEUED] == 2
            assert sum(counts.values()) == 3 and not counts.more
            assert sum((await client.count_runs(workflow=name, version=1)).values()) == 0

        def script() -> list[RunStatus]:
            with SyncClient(server.address) as sync:
                assert [w.name for w in sync.list_workflows(name_prefix=f"{name}_")] == [f"{name}_other"]
                assert sync.count_runs(workflow=name)[RunStatus.CANCELLED] == 1
                # a final run: its one snapshot, then the iterator ends
                return [r.status for r in sync.watch_run(runs[0].run_id)]

        assert await asyncio.to_thread(script) == [RunStatus.CANCELLED]

    run(main())


def test_c14_tokens_come_from_the_argument_or_composer_token_and_bad_ones_are_refused(
    server: ServerProcess, session_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from composer.errors import PermissionDeniedError, UnauthenticatedError
    from conftest import mint_token

    async def main() -> None:
        async with Client(server.address) as client:  # COMPOSER_TOKEN
            await client.server_info()
        monkeypatch.delenv("COMPOSER_TOKEN")
        async with Client(server.address, token=session_token) as client:
            await client.server_info()
        async with Client(server.address) as client:
            with pytest.raises(UnauthenticatedError):
                await client.server_info()
        forged = session_token[: session_token.rindex(".") + 1] + "c2lnbmF0dXJl"
        async with Client(server.address, token=forged) as client:
            with pytest.raises(UnauthenticatedError) as refused:
                await client.server_info()
            assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
        # a worker token that does not list the queue it polls
        scoped = mint_token("worker", subject="scoped")
        from google.protobuf import duration_pb2

        request = worker_service_pb2.PollTasksRequest(
            worker_id="scoped", queues=["anything"], max_tasks=1, wait=duration_pb2.Duration(seconds=0)
        )
        async with Client(server.address, token=scoped) as client:
            await client._conn.unary(client._conn.workers.PollTasks, request)  # no queue list: any
        async with Client(server.address, token=mint_token("client")) as client:
            with pytest.raises(PermissionDeniedError):
                await client._conn.unary(client._conn.workers.PollTasks, request)

    run(main())


def test_c15_a_task_running_past_the_first_short_lease_is_confirmed_and_keeps_its_lease(
    short_receipt_server: ServerProcess, names: str
) -> None:
    async def main() -> None:
        queue = f"receipt_{names}"
        recorder = Recorder()
        worker = Worker(short_receipt_server.address, slots=2, backoff=FAST, poll_wait=POLL_WAIT, interceptors=[recorder])
        started: list[tuple[str, int]] = []

        @worker.task(queue, "long")
        async def long(ctx: TaskContext) -> dict[str, Any]:
            started.append((ctx.run_id, ctx.attempt))
            await asyncio.sleep(7.0)  # 3.5 first leases of 2 s
            return {"attempt": ctx.attempt, "run": ctx.run_id}

        # heartbeat_timeout 30s: heartbeats at the interval alone (10 s) would all come after the
        # first lease (2 s) ended unconfirmed, and the task would be offered again and again.
        workflows = {f"receipt_{names}": 3, f"receipt_once_{names}": 1}
        async with Client(short_receipt_server.address) as client, serving(worker):
            for name, attempts in workflows.items():
                retry = f"heartbeat_timeout: 30s\nretry: {{ max_attempts: {attempts} }}"
                await client.register_workflow(one_task(name, queue, "long", extra=retry))
            runs = [await client.start_run(name) for name in workflows]
            outputs = await asyncio.gather(*(client.wait_for_result(r.run_id, timeout=60) for r in runs))
            nodes = [(await client.get_run(r.run_id)).node("work") for r in runs]
            histories = [await history_types(client, r.run_id) for r in runs]
        assert outputs == [{"result": {"attempt": 1, "run": r.run_id}} for r in runs]
        for node in nodes:
            assert node is not None and node.status is NodeStatus.COMPLETED and node.attempt == 1
        for history in histories:
            assert not any("expired" in event.lower() for event in history), history
        # Each handler ran once: a lease that ended unconfirmed would have offered its task again.
        assert sorted(started) == sorted((r.run_id, 1) for r in runs)
        assert worker.stats.lease_lost == 0 and worker.stats.completed == 2
        polls = recorder.requests("PollTasks")
        assert polls and all(poll.confirm_receipt for poll in polls), "the worker must ask to confirm receipt"

    run(main())


def test_c17_schedules_fire_runs_and_a_run_pauses_and_resumes(server: ServerProcess, names: str) -> None:
    tick = f"tick_{names}"
    waiting = f"paused_{names}"

    async def main() -> None:
        async with Client(server.address) as client:
            await client.register_workflow(f"name: {tick}\nnodes:\n  - {{ id: nap, type: WAIT, duration: 1ms }}\n")
            await client.register_workflow(
                f"name: {waiting}\nnodes:\n  - {{ id: go, type: WAIT_FOR_EVENT, event: go }}\n"
                'output: { got: "${nodes.go.output}" }\n'
            )
            # An interval schedule of 1 s fires a run labelled with its id.
            sid = f"every-second-{names}"
            created = await client.create_schedule(
                sid, tick, {"n": 1}, interval=1, labels={"suite": names}, overlap_policy=OverlapPolicy.ALLOW_ALL
            )
            assert created.schedule_id == sid and created.spec.interval == timedelta(seconds=1)
            assert created.action.workflow_name == tick and created.action.input == {"n": 1}
            assert created.overlap_policy is OverlapPolicy.ALLOW_ALL and not created.paused
            assert created.next_fire_times and created.catch_up_window == timedelta(seconds=60)
            with pytest.raises(AlreadyExistsError):
                await client.create_schedule(sid, tick, interval=1)

            async def fired() -> list[Any]:
                return [r async for r in client.list_runs(labels={"composer.schedule": sid})]

            deadline = time.monotonic() + 60
            while not (runs := await fired()):
                assert time.monotonic() < deadline, "the schedule started no run within 60 s"
                await asyncio.sleep(0.2)
            assert runs[0].labels["suite"] == names and "composer.fire_time" in runs[0].labels
            assert (await client.wait_for_run(runs[0].run_id, timeout=60)).status is RunStatus.COMPLETED
            seen = await client.get_schedule(sid)
            assert seen.fired_count >= 1
            assert any(f.outcome is ScheduleFireOutcome.STARTED and f.run_id for f in seen.recent_fires)
            assert sid in [s.schedule_id async for s in client.list_schedules(page_size=1)]

            # Paused: no next fire times, and no more fires; a trigger still fires.
            paused = await client.pause_schedule(sid, "maintenance")
            assert paused.paused and paused.note == "maintenance" and paused.next_fire_times == ()
            await asyncio.sleep(1.5)  # a fire decided before the pause may still land
            count = (await client.get_schedule(sid)).fired_count
            await asyncio.sleep(2.5)
            assert (await client.get_schedule(sid)).fired_count == count
            fire = await client.trigger_schedule(sid)
            assert fire.outcome is ScheduleFireOutcome.STARTED and fire.run_id
            assert (await client.get_run(fire.run_id)).labels["composer.schedule"] == sid
            resumed = await client.resume_schedule(sid, "back")
            assert not resumed.paused and resumed.note == "back" and resumed.next_fire_times

            # Update replaces the definition; counters stay.
            updated = await client.update_schedule(sid, tick, {"n": 2}, cron="0 0 1 1 *", time_zone="Europe/Berlin")
            assert updated.spec.cron == "0 0 1 1 *" and updated.spec.interval is None
            assert updated.spec.time_zone == "Europe/Berlin" and updated.action.input == {"n": 2}
            assert updated.fired_count >= count + 1 and updated.overlap_policy is OverlapPolicy.SKIP

            # Errors name the field; a missing id is not found.
            with pytest.raises(InvalidArgumentError) as caught:
                await client.create_schedule(f"bad-{names}", tick, cron="not a cron")
            assert "spec.cron" in [v.field for v in caught.value.field_violations]
            with pytest.raises(NotFoundError):
                await client.get_schedule(f"missing-{names}")
            await client.delete_schedule(sid)
            with pytest.raises(NotFoundError):
                await client.get_schedule(sid)
            with pytest.raises(NotFoundError):
                await client.delete_schedule(sid)

            # Pause a run waiting on an event; resumed, it completes on the event.
            run_ = await client.start_run(waiting, priority=5)
            assert run_.priority == 5 and run_.status is RunStatus.RUNNING
            held = await client.pause_run(run_.run_id, "hold on")
            assert held.status is RunStatus.PAUSED
            assert (await client.get_run(run_.run_id)).status is RunStatus.PAUSED
            assert [r.run_id async for r in client.list_runs(workflow=waiting, statuses=[RunStatus.PAUSED])] == [
                run_.run_id
            ]
            assert (await client.pause_run(run_.run_id)).status is RunStatus.PAUSED  # again: no change
            again = await client.resume_run(run_.run_id)
            assert again.status is RunStatus.RUNNING
            await client.send_event("go", {"ok": 1}, run_id=run_.run_id)
            assert await client.wait_for_result(run_.run_id, timeout=60) == {"got": {"ok": 1}}
            with pytest.raises(FailedPreconditionError):
                await client.pause_run(run_.run_id)

            # Priority: the default is 3, 9 is refused naming the field.
            assert (await client.start_run(tick)).priority == 3
            with pytest.raises(InvalidArgumentError) as caught:
                await client.start_run(tick, priority=9)
            assert "priority" in [v.field for v in caught.value.field_violations]

    run(main())
    with SyncClient(server.address) as sync:
        assert sync.start_run(tick, priority=1).priority == 1
        with pytest.raises(NotFoundError):
            sync.trigger_schedule(f"missing-{names}")


def test_c18_bulk_actions_act_on_every_matching_run(server: ServerProcess, names: str) -> None:
    queue = f"bulk_{names}"
    failing, passing, waiting = f"bulk_fail_{names}", f"bulk_ok_{names}", f"bulk_wait_{names}"
    outage = {"bulk": names}
    parked = {"bulk": f"{names}-wait"}
    retry_request = f"retry-{names}"

    def outage_worker(fixed: bool) -> Worker:
        worker = Worker(server.address, slots=4, backoff=FAST, poll_wait=POLL_WAIT)

        @worker.task(queue, "charge")
        async def charge(ctx: TaskContext) -> str:
            if not fixed:
                raise NonRetryableError("the payment provider is down", code="OUTAGE")
            return "charged"

        @worker.task(queue, "notify")
        async def notify(ctx: TaskContext) -> str:
            return "notified"

        return worker

    async def main() -> tuple[str, str]:
        async with Client(server.address) as client:
            await client.register_workflow(one_task(failing, queue, "charge"))
            await client.register_workflow(one_task(passing, queue, "notify"))
            await client.register_workflow(f"name: {waiting}\nnodes:\n  - {{ id: go, type: WAIT_FOR_EVENT, event: go }}\n")

            # 6 runs fail in the outage, 2 with the same label complete.
            async with serving(outage_worker(fixed=False)):
                failed = [await client.start_run(failing, labels=outage) for _ in range(6)]
                done = [await client.start_run(passing, labels=outage) for _ in range(2)]
                assert [(await final(client, r.run_id)).status for r in failed] == [RunStatus.FAILED] * 6
                assert [(await final(client, r.run_id)).status for r in done] == [RunStatus.COMPLETED] * 2

            # One call retries every FAILED run of the label; the completed ones are skipped.
            started = await client.bulk_retry_runs(RunFilter(labels=outage), request_id=retry_request)
            assert started.operation_id and started.created is True
            assert started.kind is BulkOperationKind.RETRY and started.filter.labels == outage
            retried = await client.wait_bulk_operation(started.operation_id, timeout=60)
            assert retried.status is BulkOperationStatus.SUCCEEDED, retried
            assert (retried.matched, retried.succeeded, retried.skipped, retried.failed) == (8, 6, 2, 0), retried
            assert retried.failures == () and retried.end_time is not None
            assert retried.namespace == "default" and retried.created_by == "python-tests"
            # No worker serves the queue: the retried runs wait, RUNNING, until it is fixed.
            assert [(await client.get_run(r.run_id)).status for r in failed] == [RunStatus.RUNNING] * 6
            async with serving(outage_worker(fixed=True)):
                for r in failed:
                    assert await client.wait_for_result(r.run_id, timeout=60) == {"result": "charged"}
            assert [(await client.get_run(r.run_id)).status for r in done] == [RunStatus.COMPLETED] * 2

            # The same request id returns the same operation and starts nothing.
            repeat = await client.bulk_retry_runs(RunFilter(labels=outage), request_id=retry_request)
            assert repeat.operation_id == started.operation_id and repeat.created is False

            # Pause, resume and cancel 3 runs waiting on an event.
            parked_runs = [await client.start_run(waiting, labels=parked) for _ in range(3)]
            ids = sorted(r.run_id for r in parked_runs)

            async def statuses() -> list[RunStatus]:
                return [(await client.get_run(run_id)).status for run_id in ids]

            paused = await client.bulk_pause_runs(RunFilter(labels=parked), reason="maintenance")
            paused = await client.wait_bulk_operation(paused.operation_id, timeout=60)
            assert paused.kind is BulkOperationKind.PAUSE and paused.reason == "maintenance"
            assert (paused.status, paused.matched, paused.succeeded) == (BulkOperationStatus.SUCCEEDED, 3, 3), paused
            assert await statuses() == [RunStatus.PAUSED] * 3
            listed = [r.run_id async for r in client.list_runs(labels=parked, statuses=[RunStatus.PAUSED])]
            assert sorted(listed) == ids

            resumed = await client.bulk_resume_runs(RunFilter(workflow_name=waiting, labels=parked))
            resumed = await client.wait_bulk_operation(resumed.operation_id, timeout=60)
            assert resumed.kind is BulkOperationKind.RESUME
            assert (resumed.status, resumed.succeeded) == (BulkOperationStatus.SUCCEEDED, 3), resumed
            assert await statuses() == [RunStatus.RUNNING] * 3

            cancelled = await client.bulk_cancel_runs(
                RunFilter(labels=parked, statuses=[RunStatus.RUNNING]), reason="customer left"
            )
            cancelled = await client.wait_bulk_operation(cancelled.operation_id, timeout=60)
            assert cancelled.kind is BulkOperationKind.CANCEL and cancelled.reason == "customer left"
            assert (cancelled.status, cancelled.succeeded) == (BulkOperationStatus.SUCCEEDED, 3), cancelled
            assert cancelled.filter.statuses == (RunStatus.RUNNING,)
            for run_id in ids:
                ended = await client.get_run(run_id)
                assert ended.status is RunStatus.CANCELLED
                cancels = [e async for e in client.get_run_history(run_id) if e.event_type == "run_cancelled"]
                assert [e.details.get("reason") for e in cancels] == ["customer left"], cancels

            # Listed newest first (paging one at a time).
            ours = {started.operation_id, paused.operation_id, resumed.operation_id, cancelled.operation_id}
            order = [op.operation_id async for op in client.list_bulk_operations(page_size=1) if op.operation_id in ours]
            assert order == [cancelled.operation_id, resumed.operation_id, paused.operation_id, started.operation_id]

            # Refusals.
            with pytest.raises(FailedPreconditionError):
                await client.bulk_resume_runs()  # an empty filter without all
            with pytest.raises(InvalidArgumentError) as caught:
                await client.bulk_pause_runs(RunFilter(workflow_version=1, labels=parked))
            assert "filter.workflow_version" in [v.field for v in caught.value.field_violations]
            with pytest.raises(NotFoundError):
                await client.get_bulk_operation(str(uuid.uuid4()))
            with pytest.raises(FailedPreconditionError):
                await client.cancel_bulk_operation(cancelled.operation_id)
            return started.operation_id, cancelled.operation_id

    retry_id, cancel_id = asyncio.run(asyncio.wait_for(main(), 240))

    # The sync facade: the same calls, blocking.
    with SyncClient(server.address) as sync:
        again = sync.bulk_retry_runs(RunFilter(labels=outage), request_id=retry_request)
        assert again.operation_id == retry_id and again.created is False
        assert sync.wait_bulk_operation(retry_id, timeout=30).succeeded == 6
        assert sync.get_bulk_operation(cancel_id).status is BulkOperationStatus.SUCCEEDED
        assert cancel_id in [op.operation_id for op in sync.list_bulk_operations(page_size=2)]
        with pytest.raises(FailedPreconditionError):
            sync.bulk_cancel_runs(RunFilter())
        with pytest.raises(FailedPreconditionError):
            sync.cancel_bulk_operation(retry_id)
        with pytest.raises(NotFoundError):
            sync.get_bulk_operation(str(uuid.uuid4()))


def test_c19_queue_rate_limits_and_queued_runs(server: ServerProcess, names: str) -> None:
    queue = f"rate_{names}"
    limited, keyed = f"rate_limited_{names}", f"rate_keyed_{names}"
    key = f"customer-{names}"

    async def main() -> None:
        async with Client(server.address) as client:
            # A limit of 2 per second with a burst of 2, read back and listed.
            set_ = await client.set_queue_rate_limit(queue, 2, burst=2)
            assert (set_.queue, set_.per_second, set_.burst, set_.per_key_per_second, set_.per_key_burst) == (
                queue, 2.0, 2, 0.0, 0,
            ), set_
            assert set_.create_time is not None and set_.update_time is not None
            got = await client.get_queue_rate_limit(queue)
            assert isinstance(got, QueueRateLimit) and got == set_, (got, set_)
            listed = [limit async for limit in client.list_queue_rate_limits(page_size=1) if limit.queue == queue]
            assert [(x.per_second, x.burst) for x in listed] == [(2.0, 2)], listed
            await asyncio.sleep(1.5)  # a change reaches every server's dispatch within about a second

            # 6 one-task runs started at once go out 2 at a time: the last ends
            # no sooner than 1.5 s after the first started.
            worker = Worker(server.address, slots=8, backoff=FAST, poll_wait=POLL_WAIT)

            @worker.task(queue, "work")
            async def work(ctx: TaskContext) -> Any:
                return ctx.input["i"]

            await client.register_workflow(one_task(limited, queue, "work", extra='input: { i: "${input.i}" }'))
            async with serving(worker):
                started = await asyncio.gather(*(client.start_run(limited, {"i": i}) for i in range(6)))
                ended = [await final(client, r.run_id) for r in started]
            for i, r in enumerate(ended):
                assert r.status is RunStatus.COMPLETED and r.output == {"result": i}, r
                assert r.concurrency_key == ""  # a workflow without concurrency has no key
            first_start = min(r.create_time for r in started if r.create_time is not None)
            last_end = max(r.end_time for r in ended if r.end_time is not None)
            took = (last_end - first_start).total_seconds()
            assert took >= 1.5, f"6 runs at 2/s (burst 2) took only {took:.3f} s from the first start to the last end"

            # A burst under the rate is refused naming limit.burst; the limit stays.
            with pytest.raises(InvalidArgumentError) as caught:
                await client.set_queue_rate_limit(queue, 5, burst=2)
            assert "limit.burst" in [v.field for v in caught.value.field_violations]
            assert (await client.get_queue_rate_limit(queue)).per_second == 2.0
            await client.delete_queue_rate_limit(queue)
            with pytest.raises(NotFoundError):
                await client.get_queue_rate_limit(queue)

            # A concurrency key of max 1: the second run of the same key waits QUEUED for the first.
            await client.register_workflow(
                f"name: {keyed}\nconcurrency: {{ key: \"input.k\", max: 1 }}\n"
                f"nodes:\n  - {{ id: go, type: WAIT_FOR_EVENT, event: go }}\n"
                'output: { got: "${nodes.go.output}" }\n'
            )
            first = await client.start_run(keyed, {"k": key})
            second = await client.start_run(keyed, {"k": key})
            assert (first.status, first.concurrency_key) == (RunStatus.RUNNING, key), first
            assert (second.status, second.concurrency_key) == (RunStatus.QUEUED, key), second
            seen = await client.get_run(second.run_id)
            assert (seen.status, seen.concurrency_key) == (RunStatus.QUEUED, key), seen
            queued = [r.run_id async for r in client.list_runs(workflow=keyed, statuses=[RunStatus.QUEUED])]
            assert queued == [second.run_id]

            # The first completes on its event; the second then runs, and completes on its own.
            await client.send_event("go", {"n": 1}, run_id=first.run_id)
            assert await client.wait_for_result(first.run_id, timeout=60) == {"got": {"n": 1}}
            deadline = time.monotonic() + 30
            while (seen := await client.get_run(second.run_id)).status is RunStatus.QUEUED:
                assert time.monotonic() < deadline, "the second run did not leave QUEUED within 30 s"
                await asyncio.sleep(0.1)
            assert (seen.status, seen.concurrency_key) == (RunStatus.RUNNING, key), seen
            await client.send_event("go", {"n": 2}, run_id=second.run_id)
            assert await client.wait_for_result(second.run_id, timeout=60) == {"got": {"n": 2}}

    run(main())

    # The sync facade: the same calls, blocking.
    with SyncClient(server.address) as sync:
        limit = sync.set_queue_rate_limit(queue, 0.5, per_key_per_second=3, per_key_burst=4)
        assert (limit.per_second, limit.burst, limit.per_key_per_second, limit.per_key_burst) == (0.5, 1, 3.0, 4), limit
        assert sync.get_queue_rate_limit(queue) == limit
        assert queue in [x.queue for x in sync.list_queue_rate_limits(page_size=2)]
        with pytest.raises(InvalidArgumentError) as caught:
            sync.set_queue_rate_limit(queue, 5, burst=2)
        assert "limit.burst" in [v.field for v in caught.value.field_violations]
        sync.delete_queue_rate_limit(queue)
        with pytest.raises(NotFoundError):
            sync.get_queue_rate_limit(queue)
        with pytest.raises(NotFoundError):
            sync.delete_queue_rate_limit(queue)
        third = sync.start_run(keyed, {"k": f"other-{names}"})
        assert (third.status, third.concurrency_key) == (RunStatus.RUNNING, f"other-{names}")
        assert sync.cancel_run(third.run_id).status is RunStatus.CANCELLED
