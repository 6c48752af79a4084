"""The Client's queue rate limits against an in-process fake QueueService (the requests they build,
the typed limit they return, error decoding, paging), and a run's QUEUED status and concurrency key."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

import google.rpc.error_details_pb2 as error_details_pb2
import grpc
import pytest
from _fakes import status_trailer

from composer import Client, InvalidArgumentError, NotFoundError, QueueRateLimit, Run, RunStatus, SyncClient
from composer.v1 import (
    common_pb2,
    queue_service_pb2,
    queue_service_pb2_grpc,
    run_service_pb2,
    run_service_pb2_grpc,
)

SET = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
CHANGED = datetime(2026, 3, 5, 6, 7, 8, tzinfo=timezone.utc)


class FakeQueues(queue_service_pb2_grpc.QueueServiceServicer):
    """Keeps limits in memory, fills the defaults the server fills, and refuses a burst under the rate."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.limits: dict[str, queue_service_pb2.QueueRateLimit] = {}

    async def SetQueueRateLimit(self, request: Any, context: Any) -> queue_service_pb2.SetQueueRateLimitResponse:
        self.requests.append(request)
        limit = queue_service_pb2.QueueRateLimit()
        limit.CopyFrom(request.limit)
        if limit.burst == 0:
            limit.burst = int(-(-limit.per_second // 1))
        if limit.burst < limit.per_second:
            violation = error_details_pb2.BadRequest.FieldViolation(
                field="limit.burst", description="must be at least per_second rounded up"
            )
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "bad limit",
                trailing_metadata=status_trailer(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "bad limit",
                    error_details_pb2.BadRequest(field_violations=[violation]),
                ),
            )
        if limit.per_key_per_second and not limit.per_key_burst:
            limit.per_key_burst = int(-(-limit.per_key_per_second // 1))
        limit.create_time.FromDatetime(SET)
        limit.update_time.FromDatetime(CHANGED)
        self.limits[limit.queue] = limit
        return queue_service_pb2.SetQueueRateLimitResponse(limit=limit)

    async def GetQueueRateLimit(self, request: Any, context: Any) -> queue_service_pb2.GetQueueRateLimitResponse:
        self.requests.append(request)
        if request.queue not in self.limits:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"queue {request.queue} has no rate limit")
        return queue_service_pb2.GetQueueRateLimitResponse(limit=self.limits[request.queue])

    async def ListQueueRateLimits(self, request: Any, context: Any) -> queue_service_pb2.ListQueueRateLimitsResponse:
        self.requests.append(request)
        ordered = [self.limits[q] for q in sorted(self.limits)]
        start = int(request.page_token or 0)
        end = min(start + (request.page_size or 100), len(ordered))
        return queue_service_pb2.ListQueueRateLimitsResponse(
            limits=ordered[start:end], next_page_token=str(end) if end < len(ordered) else ""
        )

    async def DeleteQueueRateLimit(
        self, request: Any, context: Any
    ) -> queue_service_pb2.DeleteQueueRateLimitResponse:
        self.requests.append(request)
        if self.limits.pop(request.queue, None) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"queue {request.queue} has no rate limit")
        return queue_service_pb2.DeleteQueueRateLimitResponse()


class FakeRuns(run_service_pb2_grpc.RunServiceServicer):
    """Answers StartRun with a QUEUED run of the input's key, GetRun with one of no key."""

    async def StartRun(self, request: Any, context: Any) -> run_service_pb2.StartRunResponse:
        run = common_pb2.Run(
            run_id="r-2", workflow_name=request.workflow_name, status=common_pb2.RUN_STATUS_QUEUED, concurrency_key="c-42"
        )
        return run_service_pb2.StartRunResponse(run=run, created=True)

    async def GetRun(self, request: Any, context: Any) -> run_service_pb2.GetRunResponse:
        return run_service_pb2.GetRunResponse(run=common_pb2.Run(run_id=request.run_id, status=common_pb2.RUN_STATUS_RUNNING))


async def start(queues: FakeQueues) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    queue_service_pb2_grpc.add_QueueServiceServicer_to_server(queues, server)
    run_service_pb2_grpc.add_RunServiceServicer_to_server(FakeRuns(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def serve(test: Any) -> None:
    """Runs ``test(client, fake)`` against a fresh fake."""

    async def main() -> None:
        fake = FakeQueues()
        server, address = await start(fake)
        try:
            async with Client(address) as client:
                await test(client, fake)
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_set_sends_every_field_and_returns_the_limit_as_stored() -> None:
    async def test(client: Client, fake: FakeQueues) -> None:
        limit = await client.set_queue_rate_limit("emails", 2.5, burst=4, per_key_per_second=0.5, per_key_burst=2)
        sent = fake.requests[-1]
        assert isinstance(sent, queue_service_pb2.SetQueueRateLimitRequest)
        assert (sent.limit.queue, sent.limit.per_second, sent.limit.burst) == ("emails", 2.5, 4)
        assert (sent.limit.per_key_per_second, sent.limit.per_key_burst) == (0.5, 2)
        assert not sent.limit.HasField("create_time") and not sent.limit.HasField("update_time")
        assert isinstance(limit, QueueRateLimit)
        assert (limit.queue, limit.per_second, limit.burst, limit.per_key_per_second, limit.per_key_burst) == (
            "emails", 2.5, 4, 0.5, 2,
        )
        assert (limit.create_time, limit.update_time) == (SET, CHANGED)
        assert limit.raw.queue == "emails"

        # Unset fields go as 0; the server fills the defaults.
        defaults = await client.set_queue_rate_limit("crm", per_key_per_second=5)
        sent = fake.requests[-1]
        assert (sent.limit.per_second, sent.limit.burst, sent.limit.per_key_burst) == (0.0, 0, 0)
        assert (defaults.per_second, defaults.burst, defaults.per_key_per_second, defaults.per_key_burst) == (0.0, 0, 5.0, 5)

        got = await client.get_queue_rate_limit("emails")
        assert fake.requests[-1] == queue_service_pb2.GetQueueRateLimitRequest(queue="emails")
        assert got == limit  # the same view (raw is not compared)

    serve(test)


def test_queue_errors_are_typed_with_their_field_violations() -> None:
    async def test(client: Client, fake: FakeQueues) -> None:
        with pytest.raises(InvalidArgumentError) as caught:
            await client.set_queue_rate_limit("emails", 5, burst=2)
        assert [v.field for v in caught.value.field_violations] == ["limit.burst"]
        with pytest.raises(NotFoundError):
            await client.get_queue_rate_limit("emails")
        await client.set_queue_rate_limit("emails", 1)
        await client.delete_queue_rate_limit("emails")
        assert fake.requests[-1] == queue_service_pb2.DeleteQueueRateLimitRequest(queue="emails")
        with pytest.raises(NotFoundError):
            await client.delete_queue_rate_limit("emails")
        with pytest.raises(NotFoundError):
            await client.get_queue_rate_limit("emails")

    serve(test)


def test_list_queue_rate_limits_pages_through_every_limit() -> None:
    async def test(client: Client, fake: FakeQueues) -> None:
        for name in ("q4", "q2", "q0", "q3", "q1"):
            await client.set_queue_rate_limit(name, 1)
        listed = [limit.queue async for limit in client.list_queue_rate_limits(page_size=2)]
        assert listed == [f"q{i}" for i in range(5)]
        pages = [r for r in fake.requests if isinstance(r, queue_service_pb2.ListQueueRateLimitsRequest)]
        assert [(p.page_size, p.page_token) for p in pages] == [(2, ""), (2, "2"), (2, "4")]

    serve(test)


def test_a_run_reads_queued_and_its_concurrency_key() -> None:
    assert RunStatus.from_proto(common_pb2.RUN_STATUS_QUEUED) is RunStatus.QUEUED
    assert RunStatus.QUEUED.to_proto() == common_pb2.RUN_STATUS_QUEUED
    assert not RunStatus.QUEUED.is_final
    queued = Run.from_proto(common_pb2.Run(run_id="r", status=common_pb2.RUN_STATUS_QUEUED, concurrency_key="k"))
    assert queued.status is RunStatus.QUEUED and queued.concurrency_key == "k"
    assert Run.from_proto(common_pb2.Run(run_id="r")).concurrency_key == ""

    async def test(client: Client, fake: FakeQueues) -> None:
        started = await client.start_run("sync-customer", {"customer": "c-42"})
        assert started.status is RunStatus.QUEUED and started.concurrency_key == "c-42"
        running = await client.get_run("r-1")
        assert running.status is RunStatus.RUNNING and running.concurrency_key == ""

    serve(test)


def test_the_sync_facade_runs_the_queue_calls() -> None:
    async def serve_forever(ready: asyncio.Future[str], done: asyncio.Event) -> None:
        server, address = await start(FakeQueues())
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
                limit = client.set_queue_rate_limit("emails", 2, burst=3, per_key_per_second=1, per_key_burst=1)
                assert (limit.per_second, limit.burst, limit.per_key_per_second, limit.per_key_burst) == (2, 3, 1, 1)
                assert client.get_queue_rate_limit("emails").burst == 3
                client.set_queue_rate_limit("sms", 1)
                assert [x.queue for x in client.list_queue_rate_limits(page_size=1)] == ["emails", "sms"]
                client.delete_queue_rate_limit("emails")
                with pytest.raises(NotFoundError):
                    client.get_queue_rate_limit("emails")
                with pytest.raises(InvalidArgumentError):
                    client.set_queue_rate_limit("emails", 5, burst=2)
                assert client.start_run("wf").status is RunStatus.QUEUED

        await asyncio.to_thread(script)
        done.set()
        await serving

    asyncio.run(main())
