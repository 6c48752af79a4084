"""The Client's own logic against an in-process fake RunService: requests it builds, paging,
WatchRun reconnects, waiting with a timeout, failed runs, and the sync facade."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

import grpc
import pytest

from composer import Client, RunFailedError, RunStatus, SyncClient
from composer._values import from_value, to_value
from composer.v1 import common_pb2, run_service_pb2, run_service_pb2_grpc


def make_run(run_id: str, status: Any, output: Any = None) -> common_pb2.Run:
    run = common_pb2.Run(run_id=run_id, workflow_name="wf", workflow_version=2, status=status)
    if output is not None:
        run.output.CopyFrom(to_value(output))
    if status == common_pb2.RUN_STATUS_FAILED:
        run.error.code, run.error.message, run.error.node_id = "DECLINED", "card declined", "charge"
    run.nodes.add(node_id="charge", node_type="TASK", status=common_pb2.NODE_STATUS_COMPLETED, attempt=2)
    run.create_time.FromDatetime(datetime(2026, 1, 2, 3, 4, 5))
    return run


class FakeRuns(run_service_pb2_grpc.RunServiceServicer):
    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.watch_calls = 0
        self.total = 5

    async def StartRun(self, request: Any, context: Any) -> run_service_pb2.StartRunResponse:
        self.requests.append(request)
        return run_service_pb2.StartRunResponse(run=make_run("r-1", common_pb2.RUN_STATUS_RUNNING), created=not request.idempotency_key)

    async def ListRuns(self, request: Any, context: Any) -> run_service_pb2.ListRunsResponse:
        self.requests.append(request)
        start = int(request.page_token or 0)
        end = min(start + request.page_size, self.total)
        runs = [make_run(f"r-{i}", common_pb2.RUN_STATUS_COMPLETED) for i in range(start, end)]
        return run_service_pb2.ListRunsResponse(runs=runs, next_page_token=str(end) if end < self.total else "")

    async def WatchRun(self, request: Any, context: Any) -> Any:
        self.watch_calls += 1
        run_id = request.run_id
        if run_id == "forever":
            yield run_service_pb2.WatchRunResponse(run=make_run(run_id, common_pb2.RUN_STATUS_RUNNING))
            await asyncio.sleep(60)
            return
        if run_id == "failed":
            yield run_service_pb2.WatchRunResponse(run=make_run(run_id, common_pb2.RUN_STATUS_FAILED))
            return
        yield run_service_pb2.WatchRunResponse(run=make_run(run_id, common_pb2.RUN_STATUS_RUNNING))
        if self.watch_calls == 1:  # the first stream breaks: the client must watch again
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server going away")
        yield run_service_pb2.WatchRunResponse(run=make_run(run_id, common_pb2.RUN_STATUS_COMPLETED, {"total": 3}))


async def start(fake: FakeRuns) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    run_service_pb2_grpc.add_RunServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_requests_paging_watching_and_waiting() -> None:
    async def main() -> None:
        fake = FakeRuns()
        server, address = await start(fake)
        try:
            async with Client(address) as client:
                run = await client.start_run("wf", {"a": [1, 2]}, idempotency_key="k-1", labels={"team": "x"}, version=2)
                sent = fake.requests[-1]
                assert (sent.workflow_name, sent.version, sent.idempotency_key, dict(sent.labels)) == ("wf", 2, "k-1", {"team": "x"})
                assert from_value(sent.input) == {"a": [1, 2]}
                assert run.created is False and run.status is RunStatus.RUNNING
                assert run.create_time == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
                node = run.node("charge")
                assert node is not None and node.attempt == 2

                after = datetime(2026, 1, 1, tzinfo=timezone.utc)
                listed = [r.run_id async for r in client.list_runs(workflow="wf", statuses=[RunStatus.COMPLETED], created_after=after, page_size=2)]
                assert listed == [f"r-{i}" for i in range(5)]
                pages = [r for r in fake.requests if isinstance(r, run_service_pb2.ListRunsRequest)]
                assert [p.page_token for p in pages] == ["", "2", "4"]
                assert list(pages[0].statuses) == [common_pb2.RUN_STATUS_COMPLETED]
                assert pages[0].create_time_after.ToDatetime(tzinfo=timezone.utc) == after

                assert await client.wait_for_result("r-9", timeout=10) == {"total": 3}
                assert fake.watch_calls == 2  # reconnected after UNAVAILABLE

                with pytest.raises(RunFailedError) as failed:
                    await client.wait_for_result("failed", timeout=10)
                assert failed.value.run.status is RunStatus.FAILED
                assert "DECLINED: card declined (node charge)" in str(failed.value)

                with pytest.raises(TimeoutError):
                    await client.wait_for_result("forever", timeout=0.5)

                with pytest.raises(ValueError):
                    await client.send_event("approval", run_id="r", correlation_key="k")
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_the_sync_facade_iterates_and_waits() -> None:
    async def serve_forever(ready: asyncio.Future[str], done: asyncio.Event) -> None:
        server, address = await start(FakeRuns())
        ready.set_result(address)
        await done.wait()
        await server.stop(None)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[str] = loop.create_future()
        done = asyncio.Event()
        serving = asyncio.create_task(serve_forever(ready, done))
        address = await ready

        def script() -> None:
            with SyncClient(address) as client:
                assert [r.run_id for r in client.list_runs(page_size=3)] == [f"r-{i}" for i in range(5)]
                assert client.wait_for_result("r-1", timeout=10) == {"total": 3}

        await asyncio.to_thread(script)
        done.set()
        await serving

    asyncio.run(main())
