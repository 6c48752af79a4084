"""The Client's own logic against an in-process fake RunService: requests it builds, paging,
WatchRun reconnects, waiting with a timeout, failed runs, and the sync facade."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

import grpc
import pytest

from composer import Client, FailedPreconditionError, NotFoundError, RunFailedError, RunStatus, SyncClient
from composer._values import from_value, to_value
from composer.v1 import (
    common_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
    server_service_pb2,
    server_service_pb2_grpc,
    workflow_service_pb2,
    workflow_service_pb2_grpc,
)


def make_run(run_id: str, status: Any, output: Any = None) -> common_pb2.Run:
    run = common_pb2.Run(run_id=run_id, workflow_name="wf", workflow_version=2, status=status)
    if output is not None:
        run.output.CopyFrom(to_value(output))
    if status == common_pb2.RUN_STATUS_FAILED:
        run.error.code, run.error.message, run.error.node_id = "DECLINED", "card declined", "charge"
    if status == common_pb2.RUN_STATUS_CANCELLED and run_id == "cancelled":
        run.error.code, run.error.message = "CANCELLED", "customer changed their mind"
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
        if run_id.startswith("cancelled"):
            yield run_service_pb2.WatchRunResponse(run=make_run(run_id, common_pb2.RUN_STATUS_CANCELLED))
            return
        yield run_service_pb2.WatchRunResponse(run=make_run(run_id, common_pb2.RUN_STATUS_RUNNING))
        if self.watch_calls == 1:  # the first stream breaks: the client must watch again
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server going away")
        yield run_service_pb2.WatchRunResponse(run=make_run(run_id, common_pb2.RUN_STATUS_COMPLETED, {"total": 3}))


    async def CountRuns(self, request: Any, context: Any) -> run_service_pb2.CountRunsResponse:
        self.requests.append(request)
        return run_service_pb2.CountRunsResponse(
            counts=[
                run_service_pb2.RunStatusCount(status=common_pb2.RUN_STATUS_RUNNING, count=4),
                run_service_pb2.RunStatusCount(status=common_pb2.RUN_STATUS_FAILED, count=2),
            ],
            more=True,
        )


class FakeWorkflows(workflow_service_pb2_grpc.WorkflowServiceServicer):
    """Workflows wf-0 .. wf-4, each with versions 1-3."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def ListWorkflows(self, request: Any, context: Any) -> workflow_service_pb2.ListWorkflowsResponse:
        self.requests.append(request)
        names = [f"wf-{i}" for i in range(5) if f"wf-{i}".startswith(request.name_prefix)]
        start = int(request.page_token or 0)
        end = min(start + request.page_size, len(names))
        page = [
            common_pb2.WorkflowSummary(name=name, latest_version=3, namespace="default", description=f"about {name}")
            for name in names[start:end]
        ]
        return workflow_service_pb2.ListWorkflowsResponse(workflows=page, next_page_token=str(end) if end < len(names) else "")

    async def ListWorkflowVersions(self, request: Any, context: Any) -> workflow_service_pb2.ListWorkflowVersionsResponse:
        self.requests.append(request)
        if request.name != "wf-1":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"workflow {request.name} not found")
        start = int(request.page_token or 0)
        end = min(start + request.page_size, 3)
        versions = [common_pb2.WorkflowVersion(name="wf-1", version=3 - i) for i in range(start, end)]
        return workflow_service_pb2.ListWorkflowVersionsResponse(versions=versions, next_page_token=str(end) if end < 3 else "")


class FakeServerInfo(server_service_pb2_grpc.ServerServiceServicer):
    def __init__(self) -> None:
        self.protocol_version = "1.0"

    async def GetServerInfo(self, request: Any, context: Any) -> server_service_pb2.GetServerInfoResponse:
        return server_service_pb2.GetServerInfoResponse(server_version="fake", protocol_version=self.protocol_version)


async def start(
    fake: FakeRuns, workflows: FakeWorkflows | None = None, info: FakeServerInfo | None = None
) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    run_service_pb2_grpc.add_RunServiceServicer_to_server(fake, server)
    workflow_service_pb2_grpc.add_WorkflowServiceServicer_to_server(workflows or FakeWorkflows(), server)
    server_service_pb2_grpc.add_ServerServiceServicer_to_server(info or FakeServerInfo(), server)
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
                assert (failed.value.code, failed.value.message, failed.value.node_id) == ("DECLINED", "card declined", "charge")

                # a cancelled run: the server's CANCELLED error with CancelRun's reason
                with pytest.raises(RunFailedError) as cancelled:
                    await client.wait_for_result("cancelled", timeout=10)
                assert (cancelled.value.code, cancelled.value.message) == ("CANCELLED", "customer changed their mind")
                assert "ended CANCELLED: CANCELLED: customer changed their mind" in str(cancelled.value)
                # a server that records no error still says CANCELLED, not "no error recorded"
                with pytest.raises(RunFailedError) as bare:
                    await client.wait_for_result("cancelled-bare", timeout=10)
                assert (bare.value.code, bare.value.message) == ("CANCELLED", "")
                assert "no error recorded" not in str(bare.value)

                with pytest.raises(TimeoutError):
                    await client.wait_for_result("forever", timeout=0.5)

                with pytest.raises(ValueError):
                    await client.send_event("approval", run_id="r", correlation_key="k")
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_workflow_listings_run_counts_and_the_protocol_check() -> None:
    async def main() -> None:
        runs, workflows, info = FakeRuns(), FakeWorkflows(), FakeServerInfo()
        server, address = await start(runs, workflows, info)
        try:
            async with Client(address) as client:
                summaries = [w async for w in client.list_workflows(page_size=2)]
                assert [w.name for w in summaries] == [f"wf-{i}" for i in range(5)]
                assert (summaries[0].latest_version, summaries[0].description) == (3, "about wf-0")
                assert [r.page_token for r in workflows.requests] == ["", "2", "4"]
                assert [w.name async for w in client.list_workflows(name_prefix="wf-3")] == ["wf-3"]

                versions = [v.version async for v in client.list_workflow_versions("wf-1", page_size=2)]
                assert versions == [3, 2, 1]
                with pytest.raises(NotFoundError):
                    [v async for v in client.list_workflow_versions("nope")]

                after = datetime(2026, 1, 1, tzinfo=timezone.utc)
                counts = await client.count_runs(workflow="wf", version=2, labels={"team": "x"}, created_after=after, search="A-17")
                sent = runs.requests[-1]
                assert isinstance(sent, run_service_pb2.CountRunsRequest)
                assert (sent.workflow_name, sent.workflow_version, dict(sent.labels), sent.search) == ("wf", 2, {"team": "x"}, "A-17")
                assert sent.create_time_after.ToDatetime(tzinfo=timezone.utc) == after
                assert counts[RunStatus.RUNNING] == 4 and counts[RunStatus.FAILED] == 2
                assert counts[RunStatus.COMPLETED] == 0 and sum(counts.values()) == 6
                assert RunStatus.UNSPECIFIED not in counts
                assert counts.more, "the server stopped counting at its limit"

                assert (await client.check_protocol()).protocol_version == "1.0"
                info.protocol_version = "2.0"
                with pytest.raises(FailedPreconditionError, match="speaks protocol '2.0'"):
                    await client.check_protocol()
                info.protocol_version = "1.x"
                with pytest.raises(FailedPreconditionError):
                    await client.check_protocol()
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
                # watch_run: every snapshot until the final one
                assert [r.status for r in client.watch_run("r-2")] == [RunStatus.RUNNING, RunStatus.COMPLETED]
                # leaving early closes the stream instead of waiting for the run to end
                for run in client.watch_run("forever"):
                    assert run.status is RunStatus.RUNNING
                    break
                assert [w.name for w in client.list_workflows(name_prefix="wf-1")] == ["wf-1"]
                assert [v.version for v in client.list_workflow_versions("wf-1")] == [3, 2, 1]
                assert client.count_runs()[RunStatus.RUNNING] == 4
                assert client.check_protocol().server_version == "fake"

        await asyncio.to_thread(script)
        done.set()
        await serving

    asyncio.run(main())
