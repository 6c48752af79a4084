"""The Client's bulk operations against an in-process fake RunService: the requests they build,
the typed operation they return, error decoding, paging, and wait_bulk_operation's polling."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

import google.rpc.error_details_pb2 as error_details_pb2
import grpc
import pytest
from _fakes import status_trailer

from composer import (
    BulkOperationKind,
    BulkOperationStatus,
    Client,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    RunFilter,
    RunStatus,
    SyncClient,
)
from composer.v1 import common_pb2, run_service_pb2, run_service_pb2_grpc

CREATED = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)


def make_operation(
    operation_id: str, kind: Any, status: Any, *, matched: int = 0, succeeded: int = 0, skipped: int = 0, failed: int = 0
) -> run_service_pb2.BulkOperation:
    operation = run_service_pb2.BulkOperation(
        operation_id=operation_id,
        namespace="default",
        kind=kind,
        status=status,
        created_by="tester",
        matched=matched,
        succeeded=succeeded,
        skipped=skipped,
        failed=failed,
    )
    operation.create_time.FromDatetime(CREATED)
    return operation


class FakeBulkRuns(run_service_pb2_grpc.RunServiceServicer):
    """Answers the bulk RPCs from a script: ``polls_until_done`` RUNNING answers before SUCCEEDED."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.polls: dict[str, int] = {}
        self.polls_until_done = 3
        self.unavailable_once = {"flaky"}
        self.total = 5

    def _check_filter(self, request: Any, context: Any) -> Any:
        if request.filter.workflow_version and not request.filter.workflow_name:
            violation = error_details_pb2.BadRequest.FieldViolation(
                field="filter.workflow_version", description="needs filter.workflow_name"
            )
            return context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "bad filter",
                trailing_metadata=status_trailer(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "bad filter",
                    error_details_pb2.BadRequest(field_violations=[violation]),
                ),
            )
        if request.filter == run_service_pb2.RunFilter() and not getattr(request, "all", False):
            return context.abort(grpc.StatusCode.FAILED_PRECONDITION, "an empty filter needs all")
        return None

    async def _started(self, request: Any, context: Any, kind: Any) -> run_service_pb2.BulkOperation:
        self.requests.append(request)
        refusal = self._check_filter(request, context)
        if refusal is not None:
            await refusal
        operation = make_operation("op-" + (request.request_id or "new"), kind, run_service_pb2.BULK_OPERATION_STATUS_PENDING)
        operation.filter.CopyFrom(request.filter)
        operation.reason = getattr(request, "reason", "")
        return operation

    async def BulkCancelRuns(self, request: Any, context: Any) -> run_service_pb2.BulkCancelRunsResponse:
        operation = await self._started(request, context, run_service_pb2.BULK_OPERATION_KIND_CANCEL)
        return run_service_pb2.BulkCancelRunsResponse(operation=operation, created=True)

    async def BulkRetryRuns(self, request: Any, context: Any) -> run_service_pb2.BulkRetryRunsResponse:
        operation = await self._started(request, context, run_service_pb2.BULK_OPERATION_KIND_RETRY)
        return run_service_pb2.BulkRetryRunsResponse(operation=operation, created=request.request_id != "again")

    async def BulkPauseRuns(self, request: Any, context: Any) -> run_service_pb2.BulkPauseRunsResponse:
        operation = await self._started(request, context, run_service_pb2.BULK_OPERATION_KIND_PAUSE)
        return run_service_pb2.BulkPauseRunsResponse(operation=operation, created=True)

    async def BulkResumeRuns(self, request: Any, context: Any) -> run_service_pb2.BulkResumeRunsResponse:
        operation = await self._started(request, context, run_service_pb2.BULK_OPERATION_KIND_RESUME)
        return run_service_pb2.BulkResumeRunsResponse(operation=operation, created=True)

    async def MigrateRuns(self, request: Any, context: Any) -> run_service_pb2.MigrateRunsResponse:
        operation = await self._started(request, context, run_service_pb2.BULK_OPERATION_KIND_MIGRATE)
        operation.target_version = request.target_version
        operation.node_mapping.update(request.node_mapping)
        return run_service_pb2.MigrateRunsResponse(operation=operation, created=request.request_id != "again")

    async def GetBulkOperation(self, request: Any, context: Any) -> run_service_pb2.GetBulkOperationResponse:
        self.requests.append(request)
        operation_id = request.operation_id
        if operation_id == "missing":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such bulk operation")
        if operation_id in self.unavailable_once:
            self.unavailable_once.discard(operation_id)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server going away")
        polls = self.polls[operation_id] = self.polls.get(operation_id, 0) + 1
        kind = run_service_pb2.BULK_OPERATION_KIND_RETRY
        if operation_id == "stuck" or polls < self.polls_until_done:
            operation = make_operation(operation_id, kind, run_service_pb2.BULK_OPERATION_STATUS_RUNNING, matched=8, succeeded=polls)
            return run_service_pb2.GetBulkOperationResponse(operation=operation)
        operation = make_operation(
            operation_id, kind, run_service_pb2.BULK_OPERATION_STATUS_SUCCEEDED, matched=8, succeeded=5, skipped=2, failed=1
        )
        operation.failures.add(run_id="r-7", message="run is being cancelled")
        operation.end_time.FromDatetime(CREATED)
        return run_service_pb2.GetBulkOperationResponse(operation=operation)

    async def ListBulkOperations(self, request: Any, context: Any) -> run_service_pb2.ListBulkOperationsResponse:
        self.requests.append(request)
        start = int(request.page_token or 0)
        end = min(start + request.page_size, self.total)
        operations = [
            make_operation(f"op-{i}", run_service_pb2.BULK_OPERATION_KIND_CANCEL, run_service_pb2.BULK_OPERATION_STATUS_SUCCEEDED)
            for i in range(start, end)
        ]
        return run_service_pb2.ListBulkOperationsResponse(
            operations=operations, next_page_token=str(end) if end < self.total else ""
        )

    async def CancelBulkOperation(self, request: Any, context: Any) -> run_service_pb2.CancelBulkOperationResponse:
        self.requests.append(request)
        if request.operation_id == "ended":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the bulk operation already ended")
        operation = make_operation(
            request.operation_id, run_service_pb2.BULK_OPERATION_KIND_CANCEL, run_service_pb2.BULK_OPERATION_STATUS_CANCELLED
        )
        return run_service_pb2.CancelBulkOperationResponse(operation=operation)


async def start(fake: FakeBulkRuns) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    run_service_pb2_grpc.add_RunServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def serve(test: Any) -> None:
    """Runs ``test(client, fake)`` against a fresh fake."""

    async def main() -> None:
        fake = FakeBulkRuns()
        server, address = await start(fake)
        try:
            async with Client(address) as client:
                await test(client, fake)
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_bulk_calls_send_the_filter_and_return_the_typed_operation() -> None:
    async def test(client: Client, fake: FakeBulkRuns) -> None:
        after = datetime(2026, 1, 1, tzinfo=timezone.utc)
        wanted = RunFilter(
            workflow_name="wf",
            workflow_version=2,
            statuses=[RunStatus.RUNNING, RunStatus.PAUSED],
            labels={"suite": "s1"},
            create_time_after=after,
            parent_run_id="parent",
            search="key-",
        )
        cancel = await client.bulk_cancel_runs(wanted, reason="outage", request_id="c-1")
        sent = fake.requests[-1]
        assert isinstance(sent, run_service_pb2.BulkCancelRunsRequest)
        assert (sent.reason, sent.request_id, sent.all) == ("outage", "c-1", False)
        assert (sent.filter.workflow_name, sent.filter.workflow_version, dict(sent.filter.labels)) == ("wf", 2, {"suite": "s1"})
        assert list(sent.filter.statuses) == [common_pb2.RUN_STATUS_RUNNING, common_pb2.RUN_STATUS_PAUSED]
        assert sent.filter.create_time_after.ToDatetime(tzinfo=timezone.utc) == after
        assert not sent.filter.HasField("create_time_before")
        assert (sent.filter.parent_run_id, sent.filter.search) == ("parent", "key-")
        assert cancel.operation_id == "op-c-1" and cancel.created is True
        assert cancel.kind is BulkOperationKind.CANCEL and cancel.status is BulkOperationStatus.PENDING
        assert cancel.reason == "outage" and cancel.created_by == "tester" and cancel.create_time == CREATED
        assert cancel.end_time is None and not cancel.status.is_final
        assert cancel.filter == wanted  # the filter the operation was started with, read back

        retry = await client.bulk_retry_runs(RunFilter(labels={"suite": "s1"}), request_id="again")
        assert retry.kind is BulkOperationKind.RETRY and retry.created is False
        assert fake.requests[-1].request_id == "again"

        pause = await client.bulk_pause_runs(all=True, reason="maintenance")
        sent = fake.requests[-1]
        assert isinstance(sent, run_service_pb2.BulkPauseRunsRequest)
        assert sent.all and sent.filter == run_service_pb2.RunFilter() and sent.reason == "maintenance"
        assert pause.kind is BulkOperationKind.PAUSE and pause.reason == "maintenance"

        resume = await client.bulk_resume_runs(RunFilter(workflow_name="wf"))
        sent = fake.requests[-1]
        assert isinstance(sent, run_service_pb2.BulkResumeRunsRequest)
        assert sent.filter.workflow_name == "wf" and sent.request_id == "" and not sent.all
        assert resume.kind is BulkOperationKind.RESUME

    serve(test)


def test_migrate_runs_sends_the_filter_target_and_mapping_and_returns_the_operation() -> None:
    async def test(client: Client, fake: FakeBulkRuns) -> None:
        wanted = RunFilter(workflow_name="order", statuses=[RunStatus.RUNNING], labels={"region": "eu"})
        migrate = await client.migrate_runs(wanted, 3, node_mapping={"B": "B2"}, request_id="m-1")
        sent = fake.requests[-1]
        assert isinstance(sent, run_service_pb2.MigrateRunsRequest)
        assert (sent.target_version, dict(sent.node_mapping), sent.request_id) == (3, {"B": "B2"}, "m-1")
        assert (sent.filter.workflow_name, dict(sent.filter.labels)) == ("order", {"region": "eu"})
        assert list(sent.filter.statuses) == [common_pb2.RUN_STATUS_RUNNING]
        assert migrate.kind is BulkOperationKind.MIGRATE and migrate.status is BulkOperationStatus.PENDING
        assert (migrate.target_version, migrate.node_mapping) == (3, {"B": "B2"})
        assert migrate.operation_id == "op-m-1" and migrate.created is True and migrate.filter == wanted

        again = await client.migrate_runs(RunFilter(workflow_name="order"), target_version=3, request_id="again")
        assert again.created is False and fake.requests[-1].node_mapping == {}

        # the operation is followed as any other bulk operation
        done = await client.wait_bulk_operation(migrate.operation_id, timeout=30)
        assert done.status is BulkOperationStatus.SUCCEEDED

        # the other kinds carry no target
        cancel = await client.bulk_cancel_runs(RunFilter(workflow_name="order"))
        assert (cancel.target_version, cancel.node_mapping) == (0, {})

    serve(test)


def test_migrate_runs_refuses_bad_arguments_before_any_call() -> None:
    async def test(client: Client, fake: FakeBulkRuns) -> None:
        with pytest.raises(ValueError, match="filter.workflow_name"):
            await client.migrate_runs(RunFilter(statuses=[RunStatus.RUNNING]), 2)
        with pytest.raises(ValueError, match="target_version must be positive"):
            await client.migrate_runs(RunFilter(workflow_name="order"), 0)
        assert fake.requests == []

    serve(test)


def test_bulk_errors_are_typed_with_their_field_violations() -> None:
    async def test(client: Client, fake: FakeBulkRuns) -> None:
        with pytest.raises(FailedPreconditionError):
            await client.bulk_cancel_runs()
        with pytest.raises(InvalidArgumentError) as caught:
            await client.bulk_retry_runs(RunFilter(workflow_version=3))
        assert [v.field for v in caught.value.field_violations] == ["filter.workflow_version"]
        with pytest.raises(NotFoundError):
            await client.get_bulk_operation("missing")
        with pytest.raises(NotFoundError):
            await client.wait_bulk_operation("missing", timeout=10)
        with pytest.raises(FailedPreconditionError):
            await client.cancel_bulk_operation("ended")
        cancelled = await client.cancel_bulk_operation("op-1")
        assert cancelled.status is BulkOperationStatus.CANCELLED and cancelled.status.is_final

    serve(test)


def test_list_bulk_operations_pages_through_every_operation() -> None:
    async def test(client: Client, fake: FakeBulkRuns) -> None:
        listed = [op.operation_id async for op in client.list_bulk_operations(page_size=2)]
        assert listed == [f"op-{i}" for i in range(5)]
        pages = [r for r in fake.requests if isinstance(r, run_service_pb2.ListBulkOperationsRequest)]
        assert [(p.page_size, p.page_token) for p in pages] == [(2, ""), (2, "2"), (2, "4")]

    serve(test)


def test_wait_bulk_operation_polls_until_it_ends_and_times_out() -> None:
    async def test(client: Client, fake: FakeBulkRuns) -> None:
        done = await client.wait_bulk_operation("op-1", timeout=30)
        assert fake.polls["op-1"] == 3  # two RUNNING answers, then SUCCEEDED
        assert done.status is BulkOperationStatus.SUCCEEDED and done.end_time == CREATED
        assert (done.matched, done.succeeded, done.skipped, done.failed) == (8, 5, 2, 1)
        assert [(f.run_id, f.message) for f in done.failures] == [("r-7", "run is being cancelled")]
        assert done.created is None

        # A poll that meets UNAVAILABLE is made again.
        assert (await client.wait_bulk_operation("flaky", timeout=30)).status is BulkOperationStatus.SUCCEEDED
        assert fake.polls["flaky"] == 3

        with pytest.raises(TimeoutError, match="stuck"):
            await client.wait_bulk_operation("stuck", timeout=0.5)
        assert fake.polls["stuck"] >= 2  # it polled more than once before giving up

    serve(test)


def test_the_sync_facade_runs_the_bulk_calls() -> None:
    async def serve_forever(ready: asyncio.Future[str], done: asyncio.Event) -> None:
        server, address = await start(FakeBulkRuns())
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
                started = client.bulk_retry_runs(RunFilter(labels={"suite": "s"}), request_id="r-1")
                assert started.created is True and started.kind is BulkOperationKind.RETRY
                assert client.bulk_cancel_runs(all=True, reason="r").kind is BulkOperationKind.CANCEL
                assert client.bulk_pause_runs(all=True).kind is BulkOperationKind.PAUSE
                assert client.bulk_resume_runs(all=True).kind is BulkOperationKind.RESUME
                migrate = client.migrate_runs(RunFilter(workflow_name="wf"), 2, node_mapping={"B": "B2"})
                assert migrate.kind is BulkOperationKind.MIGRATE and migrate.target_version == 2
                assert client.wait_bulk_operation(started.operation_id, timeout=30).status is BulkOperationStatus.SUCCEEDED
                assert client.get_bulk_operation(started.operation_id).succeeded == 5
                assert len(list(client.list_bulk_operations(page_size=3))) == 5
                assert client.cancel_bulk_operation("op-9").status is BulkOperationStatus.CANCELLED
                with pytest.raises(TimeoutError):
                    client.wait_bulk_operation("stuck", timeout=0.3)

        await asyncio.to_thread(script)
        done.set()
        await serving

    asyncio.run(main())
