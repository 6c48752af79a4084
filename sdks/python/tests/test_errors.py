"""Error mapping: gRPC status + google.rpc details (grpc-status-details-bin) → typed exceptions,
both from a constructed error and through a real grpc.aio server and the Client."""

from __future__ import annotations

import asyncio
from typing import Any

import google.rpc.error_details_pb2 as error_details_pb2
import grpc
import pytest
from _fakes import Refusal, busy, status_trailer

from composer import (
    Client,
    ComposerError,
    DeadlineExceededError,
    FailedPreconditionError,
    FieldViolation,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    ResourceExhaustedError,
    SyncClient,
    UnavailableError,
)
from composer.errors import from_rpc_error, from_status
from composer.v1 import workflow_service_pb2, workflow_service_pb2_grpc


def bad_request(*violations: tuple[str, str]) -> error_details_pb2.BadRequest:
    request = error_details_pb2.BadRequest()
    for path, description in violations:
        request.field_violations.add(field=path, description=description)
    return request


def test_bad_request_details_become_field_violations() -> None:
    trailer = status_trailer(
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid workflow",
        bad_request(("nodes[3].retry.max_attempts", "must be at least 1"), ("edges[0].to", "unknown node `shp`")),
    )
    error = grpc.aio.AioRpcError(
        grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(*trailer), details="invalid workflow"
    )
    converted = from_rpc_error(error)
    assert isinstance(converted, InvalidArgumentError)
    assert converted.code is grpc.StatusCode.INVALID_ARGUMENT
    assert converted.message == "invalid workflow"
    assert converted.field_violations == (
        FieldViolation("nodes[3].retry.max_attempts", "must be at least 1"),
        FieldViolation("edges[0].to", "unknown node `shp`"),
    )
    assert "nodes[3].retry.max_attempts: must be at least 1" in str(converted)
    assert converted.__cause__ is error
    assert not converted.retryable


def test_lease_lost_error_info_is_its_own_type() -> None:
    info = error_details_pb2.ErrorInfo(reason="LEASE_LOST", domain="composer.dev", metadata={"task_id": "t1"})
    trailer = status_trailer(grpc.StatusCode.FAILED_PRECONDITION, "stale", info)
    converted = from_status(grpc.StatusCode.FAILED_PRECONDITION, "stale lease", trailer[0][1])
    assert isinstance(converted, LeaseLostError) and isinstance(converted, FailedPreconditionError)
    assert (converted.reason, converted.domain, converted.metadata) == ("LEASE_LOST", "composer.dev", {"task_id": "t1"})
    # Another FAILED_PRECONDITION is not a lost lease.
    other = from_status(grpc.StatusCode.FAILED_PRECONDITION, "run already ended", None)
    assert type(other) is FailedPreconditionError


def test_codes_map_to_classes_and_transient_ones_are_retryable() -> None:
    assert isinstance(from_status(grpc.StatusCode.NOT_FOUND, "no run", None), NotFoundError)
    unavailable = from_status(grpc.StatusCode.UNAVAILABLE, "down", None)
    assert isinstance(unavailable, UnavailableError) and unavailable.retryable
    assert from_status(grpc.StatusCode.DEADLINE_EXCEEDED, "", None).retryable
    unknown = from_status(grpc.StatusCode.DATA_LOSS, "?", b"\xff\x00garbage")
    assert type(unknown) is ComposerError and unknown.field_violations == ()


def test_a_busy_server_is_told_from_a_payload_over_the_limit() -> None:
    """L6: QUOTA_EXCEEDED and CPU_POOL_BUSY make a RESOURCE_EXHAUSTED busy, RetryInfo its retry_after;
    the payload limit's RESOURCE_EXHAUSTED (a BadRequest, no ErrorInfo) is not busy."""

    def converted(refusal: Refusal) -> ComposerError:
        trailer = status_trailer(refusal.code, refusal.message, *refusal.details)
        return from_status(refusal.code, refusal.message, trailer[0][1])

    quota = converted(busy("QUOTA_EXCEEDED", retry_after=1.5))
    assert isinstance(quota, ResourceExhaustedError)
    assert (quota.busy, quota.reason, quota.domain, quota.retry_after) == (True, "QUOTA_EXCEEDED", "composer.dev", 1.5)
    assert not quota.retryable  # not a transient failure: the caller waits retry_after first
    cpu = converted(busy("CPU_POOL_BUSY"))
    assert (cpu.busy, cpu.retry_after) == (True, None)

    limit = bad_request(("data", "200000 bytes pass the payload limit"))
    too_large = converted(Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "too large", (limit,)))
    assert isinstance(too_large, ResourceExhaustedError) and not too_large.busy
    assert [v.field for v in too_large.field_violations] == ["data"]
    # The reason alone does not make another code busy.
    unavailable = converted(Refusal(grpc.StatusCode.UNAVAILABLE, "down", busy().details))
    assert not unavailable.busy and unavailable.retryable


class _RejectingWorkflows(workflow_service_pb2_grpc.WorkflowServiceServicer):
    async def RegisterWorkflow(self, request: Any, context: Any) -> workflow_service_pb2.RegisterWorkflowResponse:
        details = bad_request(("nodes[0].type", "unknown node type `TSK`"), ("name", "must not be empty"))
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            "the workflow has 2 problems",
            trailing_metadata=status_trailer(grpc.StatusCode.INVALID_ARGUMENT, "the workflow has 2 problems", details),
        )
        raise AssertionError("unreachable")


async def _serve() -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    workflow_service_pb2_grpc.add_WorkflowServiceServicer_to_server(_RejectingWorkflows(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_client_raises_field_violations_sent_over_the_wire() -> None:
    async def main() -> None:
        server, address = await _serve()
        try:
            async with Client(address) as client:
                with pytest.raises(InvalidArgumentError) as caught:
                    await client.register_workflow({"name": "", "nodes": [{"id": "a", "type": "TSK"}]})
                assert [v.field for v in caught.value.field_violations] == ["nodes[0].type", "name"]
                # An RPC the server does not have is typed too.
                with pytest.raises(ComposerError) as missing:
                    await client.get_run("r1")
                assert missing.value.code is grpc.StatusCode.UNIMPLEMENTED
            # The sync facade raises the same types.
            sync = await asyncio.to_thread(SyncClient, address)
            try:
                with pytest.raises(InvalidArgumentError):
                    await asyncio.to_thread(sync.register_workflow, "name: x\n")
            finally:
                await asyncio.to_thread(sync.close)
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_client_against_no_server_waits_or_fails_fast() -> None:
    async def main() -> None:
        async with Client("127.0.0.1:1", timeout=0.5) as client:  # waits for the server within the deadline
            with pytest.raises(DeadlineExceededError):
                await client.get_run("r1")
        async with Client("127.0.0.1:1", timeout=5.0, wait_for_ready=False) as client:
            with pytest.raises(UnavailableError):
                await client.get_run("r1")

    asyncio.run(main())
