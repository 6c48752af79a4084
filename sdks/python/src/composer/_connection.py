"""The gRPC channel and stubs shared by the Client and the Worker."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from composer.v1 import (
    blob_service_pb2_grpc,
    queue_service_pb2_grpc,
    run_service_pb2_grpc,
    schedule_service_pb2_grpc,
    secret_service_pb2_grpc,
    server_service_pb2,
    server_service_pb2_grpc,
    worker_service_pb2_grpc,
    workflow_service_pb2_grpc,
)

from .errors import FailedPreconditionError, InvalidAddressError, from_rpc_error

PROTOCOL_MAJOR = 1
"""The protocol major version this SDK speaks (GetServerInfo's ``protocol_version``)."""
PROTOCOL_MINOR = 0
"""The lowest protocol minor version this SDK needs."""

DEFAULT_ADDRESS = "127.0.0.1:7070"
"""Where ``composer serve`` and ``composer dev`` listen by default."""

ADDRESS_ENV = "COMPOSER_ADDRESS"
"""The environment variable read when no address is given."""

TOKEN_ENV = "COMPOSER_TOKEN"
"""The environment variable read when no token is given."""

_ADDRESS_FORMS = "host:port, http://host:port (plaintext) or https://host:port (TLS)"
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>[0-9]+))?$")


@dataclass(frozen=True)
class Address:
    """Where a server is: the gRPC target (``host:port``) and whether to speak TLS to it."""

    target: str
    """``host:port``, as gRPC dials it."""
    tls: bool
    """True for ``https://`` addresses."""
    scheme: str = ""
    """``http``, ``https``, or empty for a bare ``host:port``."""


def parse_address(text: str, *, source: str = "address") -> Address:
    """Parses ``host:port``, ``http://host:port`` or ``https://host:port``.

    A URL without a port means 80 or 443; a bare host needs its port (the
    server's is not a web default). ``source`` names where the text came
    from in the error. Raises :class:`InvalidAddressError`.
    """

    def invalid(why: str) -> InvalidAddressError:
        return InvalidAddressError(f"invalid Composer {source} {text!r}: {why}; expected {_ADDRESS_FORMS}")

    scheme, separator, rest = text.partition("://")
    if not separator:
        scheme, rest = "", text
    elif scheme.lower() not in ("http", "https"):
        raise invalid(f"unknown scheme {scheme!r}")
    tls = scheme.lower() == "https"
    if separator:
        rest = rest.rstrip("/")
        if "/" in rest or "?" in rest or "#" in rest:
            raise invalid("a server address has no path")
    match = _HOST_PORT.match(rest)
    if match is None:
        raise invalid("not a host:port")
    port = match.group("port")
    if port is None:
        if not separator:
            raise invalid("no port")
        port = "443" if tls else "80"
    if not 0 < int(port) < 65536:
        raise invalid(f"port {port} is out of range")
    return Address(f"{match.group('host')}:{int(port)}", tls, scheme.lower() if separator else "")


def resolve_address(address: str | None) -> Address:
    """The address given, else ``COMPOSER_ADDRESS``, else :data:`DEFAULT_ADDRESS`, parsed."""
    if address:
        return parse_address(address)
    from_env = os.environ.get(ADDRESS_ENV, "").strip()
    if from_env:
        return parse_address(from_env, source=f"address (from {ADDRESS_ENV})")
    return parse_address(DEFAULT_ADDRESS)


def resolve_token(token: str | None) -> str | None:
    """The token given (an empty one means none), else ``COMPOSER_TOKEN``'s, as the CLI reads it."""
    chosen = token if token is not None else os.environ.get(TOKEN_ENV)
    return chosen or None


def resolve_tls(address: Address, tls: bool | grpc.ChannelCredentials | None) -> bool | grpc.ChannelCredentials:
    """The TLS setting: ``tls`` when given, else the address's scheme (a bare ``host:port`` is plaintext).

    An ``http://`` address with TLS asked for, or an ``https://`` one with
    ``tls=False``, contradicts itself: InvalidAddressError.
    """
    if tls is None:
        return address.tls
    if address.scheme == "http" and tls is not False:
        raise InvalidAddressError(f"http://{address.target} is plaintext but TLS was asked for: use https://")
    if address.scheme == "https" and tls is False:
        raise InvalidAddressError(f"https://{address.target} is TLS but tls=False was given: use http://")
    return tls


def check_protocol_version(version: str, where: str = "the server") -> None:
    """Raises FailedPreconditionError unless this SDK speaks ``version`` (``<major>.<minor>``)."""
    major, _, minor = version.partition(".")
    ok = major.isdigit() and (minor or "0").isdigit()
    if ok:
        ok = int(major) == PROTOCOL_MAJOR and int(minor or "0") >= PROTOCOL_MINOR
    if not ok:
        raise FailedPreconditionError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{where} speaks protocol {version!r}; this SDK needs {PROTOCOL_MAJOR}.x with x >= {PROTOCOL_MINOR}",
        )


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
        address: str | Address | None = None,
        *,
        token: str | None = None,
        tls: bool | grpc.ChannelCredentials | None = None,
        interceptors: Sequence[Any] = (),
    ) -> None:
        where = address if isinstance(address, Address) else resolve_address(address)
        self.address = where.target
        chain = list(interceptors) or None
        tls = resolve_tls(where, tls)
        if tls is False:
            self.channel = grpc.aio.insecure_channel(where.target, options=_CHANNEL_OPTIONS, interceptors=chain)
        else:
            credentials = grpc.ssl_channel_credentials() if tls is True else tls
            self.channel = grpc.aio.secure_channel(
                where.target, credentials, options=_CHANNEL_OPTIONS, interceptors=chain
            )
        token = resolve_token(token)
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self.workflows = workflow_service_pb2_grpc.WorkflowServiceStub(self.channel)
        self.runs = run_service_pb2_grpc.RunServiceStub(self.channel)
        self.schedules = schedule_service_pb2_grpc.ScheduleServiceStub(self.channel)
        self.queues = queue_service_pb2_grpc.QueueServiceStub(self.channel)
        self.secrets = secret_service_pb2_grpc.SecretServiceStub(self.channel)
        self.blobs = blob_service_pb2_grpc.BlobServiceStub(self.channel)
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
        check_protocol_version(info.protocol_version, f"server {self.address}")
        return info

    async def close(self) -> None:
        """Closes the channel, cancelling calls still running."""
        await self.channel.close()
