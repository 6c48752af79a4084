"""The gRPC channel and stubs shared by the Client and the Worker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import os
import grpc

from composer.v1 import (
    queue_service_pb2_grpc,
    run_service_pb2_grpc,
    schedule_service_pb2_grpc,
    server_service_pb2,
    server_service_pb2_grpc,
    worker_service_pb2_grpc,
    workflow_service_pb2_grpc,
)

from .errors import ComposerError, from_rpc_error

PROTOCOL_MAJOR = 1
"""The protocol major version this SDK speaks (GetServerInfo's ``protocol_version``)."""
PROTOCOL_MINOR = 0
"""The lowest protocol minor version this SDK needs."""

DEFAULT_ADDRESS = "127.0.0.1:7070"
"""Where ``composer serve`` and ``composer dev`` listen by default."""

_CHANNEL_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    # Reconnect quickly after a server restart.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
)


class Connection:
    """One ``grpc.aio`` channel to a server, its stubs and the call metadata (the bearer token)."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        token: str | None = None,
        tls: bool | grpc.ChannelCredentials = False,
        interceptors: Sequence[Any] = (),
    ) -> None:
        self.address = address
        chain = list(interceptors) or None
        if tls is False:
            self.channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS, interceptors=chain)
        else:
            credentials = grpc.ssl_channel_credentials() if tls is True else tls
            self.channel = grpc.aio.secure_channel(address, credentials, options=_CHANNEL_OPTIONS, interceptors=chain)
        # an explicit token wins; otherwise the environment's, as for the CLI
        token = token if token is not None else os.environ.get("COMPOSER_TOKEN") or None
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self.workflows = workflow_service_pb2_grpc.WorkflowServiceStub(self.channel)
        self.runs = run_service_pb2_grpc.RunServiceStub(self.channel)
        self.schedules = schedule_service_pb2_grpc.ScheduleServiceStub(self.channel)
        self.queues = queue_service_pb2_grpc.QueueServiceStub(self.channel)
        self.workers = worker_service_pb2_grpc.WorkerServiceStub(self.channel)
        self.server = server_service_pb2_grpc.ServerServiceStub(self.channel)

    async def unary(
        self,
        method: Any,
        request: Any,
        *,
        timeout: float | None = 30.0,
        wait_for_ready: bool = False,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> Any:
        """Calls a unary RPC with the connection's metadata and ``metadata``; raises a typed
        ComposerError on failure.

        With ``wait_for_ready`` the call waits (within ``timeout``) for an
        unreachable server to come back instead of failing UNAVAILABLE at once.
        """
        try:
            return await method(
                request, metadata=self.metadata + tuple(metadata), timeout=timeout, wait_for_ready=wait_for_ready
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    async def check_protocol(self) -> server_service_pb2.GetServerInfoResponse:
        """Asks the server for its protocol version and raises if this SDK cannot speak it."""
        info: server_service_pb2.GetServerInfoResponse = await self.unary(
            self.server.GetServerInfo, server_service_pb2.GetServerInfoRequest(), timeout=10.0
        )
        major, _, minor = info.protocol_version.partition(".")
        try:
            ok = int(major) == PROTOCOL_MAJOR and int(minor or 0) >= PROTOCOL_MINOR
        except ValueError:
            ok = False
        if not ok:
            raise ComposerError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"server {self.address} speaks protocol {info.protocol_version!r}; "
                f"this SDK needs {PROTOCOL_MAJOR}.x with x >= {PROTOCOL_MINOR}",
            )
        return info

    async def close(self) -> None:
        """Closes the channel, cancelling calls still running."""
        await self.channel.close()
