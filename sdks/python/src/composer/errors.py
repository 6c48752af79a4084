"""Typed exceptions of the Composer SDK.

Every failed RPC surfaces as a :class:`ComposerError` subclass chosen by its
gRPC status code. The server's ``google.rpc`` details (sent in the
``grpc-status-details-bin`` trailer) are decoded onto the exception:
``field_violations`` from ``google.rpc.BadRequest`` (one per problem of an
invalid workflow or request, each with its path), ``reason`` / ``domain`` /
``metadata`` from ``google.rpc.ErrorInfo`` and ``retry_after`` from
``google.rpc.RetryInfo``.

Handlers raise :class:`TaskError` or :class:`NonRetryableError` to choose the
code and retryability of a failed task; any other exception is a retryable
failure whose code is the exception's class name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
import google.rpc.error_details_pb2 as error_details_pb2
import google.rpc.status_pb2 as status_pb2

STATUS_DETAILS_KEY = "grpc-status-details-bin"
"""The trailer that carries the serialized ``google.rpc.Status``."""

LEASE_LOST = "LEASE_LOST"
"""The ErrorInfo reason of a report or heartbeat made with a stale lease."""

QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
"""The ErrorInfo reason of a RESOURCE_EXHAUSTED for a call over one of its namespace's quotas."""

CPU_POOL_BUSY = "CPU_POOL_BUSY"
"""The ErrorInfo reason of a RESOURCE_EXHAUSTED for a request the server's CPU pool had no room for."""

BUSY_REASONS = frozenset({QUOTA_EXCEEDED, CPU_POOL_BUSY})
"""The ErrorInfo reasons that make a RESOURCE_EXHAUSTED a busy server rather than a value too large."""


@dataclass(frozen=True)
class FieldViolation:
    """One problem with one field of a request, from ``google.rpc.BadRequest``."""

    field: str
    """The path of the offending field, e.g. ``nodes[3].retry.max_attempts``."""
    description: str
    """What is wrong with it."""
    reason: str = ""
    """A machine-readable reason, when the server gives one."""

    def __str__(self) -> str:
        return f"{self.field}: {self.description}" if self.field else self.description


class ComposerError(Exception):
    """A failed call to the Composer server.

    ``code`` is the gRPC status code, ``message`` the server's message;
    ``field_violations``, ``reason``, ``domain``, ``metadata`` and
    ``retry_after`` (seconds; None when the server named no delay) come from
    the status details when the server sent them.
    """

    code: grpc.StatusCode

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        field_violations: Iterable[FieldViolation] = (),
        reason: str = "",
        domain: str = "",
        metadata: Mapping[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.field_violations: tuple[FieldViolation, ...] = tuple(field_violations)
        self.reason = reason
        self.domain = domain
        self.metadata: dict[str, str] = dict(metadata or {})
        self.retry_after = retry_after
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.code.name}: {self.message}"
        if self.reason:
            text += f" [{self.reason}]"
        for violation in self.field_violations:
            text += f"\n  - {violation}"
        return text

    @property
    def retryable(self) -> bool:
        """True for transient failures that the same call may retry (UNAVAILABLE, DEADLINE_EXCEEDED)."""
        return self.code in TRANSIENT_CODES

    @property
    def busy(self) -> bool:
        """True for a RESOURCE_EXHAUSTED that says the server is busy (a quota used up, the CPU pool
        full): the same call may pass after ``retry_after``. Any other RESOURCE_EXHAUSTED is for good,
        e.g. a payload over the server's limit (which names its field in ``field_violations``)."""
        return self.code == grpc.StatusCode.RESOURCE_EXHAUSTED and self.reason in BUSY_REASONS


class InvalidArgumentError(ComposerError):
    """INVALID_ARGUMENT: the request (e.g. a workflow definition or a run's input) is invalid;
    ``field_violations`` lists each problem."""


class NotFoundError(ComposerError):
    """NOT_FOUND: the workflow, version or run does not exist (in the caller's namespace)."""


class AlreadyExistsError(ComposerError):
    """ALREADY_EXISTS."""


class FailedPreconditionError(ComposerError):
    """FAILED_PRECONDITION: the call does not fit the object's state (e.g. cancelling a finished run)."""


class LeaseLostError(FailedPreconditionError):
    """FAILED_PRECONDITION with reason LEASE_LOST: the task's lease is no longer this worker's.

    The worker stops the work and never retries the call nor reports the attempt again.
    """


class ResourceExhaustedError(ComposerError):
    """RESOURCE_EXHAUSTED: a payload exceeds the server's limit, or the server is busy (``busy``: a
    quota is used up or the CPU pool is full; ``retry_after`` says when to call again)."""


class PermissionDeniedError(ComposerError):
    """PERMISSION_DENIED: the token's roles or queues do not allow the call."""


class UnauthenticatedError(ComposerError):
    """UNAUTHENTICATED: no token, or an invalid one."""


class UnavailableError(ComposerError):
    """UNAVAILABLE: the server cannot be reached or is shutting down; transient."""


class DeadlineExceededError(ComposerError):
    """DEADLINE_EXCEEDED: the call's deadline passed; transient."""


class UnimplementedError(ComposerError):
    """UNIMPLEMENTED: the server does not have this RPC (an older server?)."""


TRANSIENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""The codes a worker retries with the same lease token."""

_BY_CODE: dict[grpc.StatusCode, type[ComposerError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
}


def _trailer_bytes(trailing: Any) -> bytes | None:
    if not trailing:
        return None
    for key, value in trailing:
        if key == STATUS_DETAILS_KEY:
            return value if isinstance(value, bytes) else str(value).encode()
    return None


def from_status(code: grpc.StatusCode, message: str, status_details: bytes | None) -> ComposerError:
    """Builds the typed exception for a status code, a message and an optional serialized
    ``google.rpc.Status`` (the ``grpc-status-details-bin`` trailer)."""
    violations: list[FieldViolation] = []
    reason = domain = ""
    metadata: dict[str, str] = {}
    retry_after: float | None = None
    if status_details:
        status = status_pb2.Status()
        try:
            status.ParseFromString(status_details)
        except DecodeError:
            status.Clear()
        if status.message and not message:
            message = status.message
        for detail in status.details:
            if detail.TypeName() == "google.rpc.BadRequest":
                bad_request = error_details_pb2.BadRequest()
                detail.Unpack(bad_request)
                violations.extend(
                    FieldViolation(v.field, v.description, v.reason) for v in bad_request.field_violations
                )
            elif detail.TypeName() == "google.rpc.ErrorInfo":
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
            elif detail.TypeName() == "google.rpc.RetryInfo":
                retry_info = error_details_pb2.RetryInfo()
                detail.Unpack(retry_info)
                if retry_info.HasField("retry_delay"):
                    retry_after = max(retry_info.retry_delay.ToNanoseconds() / 1e9, 0.0)
    cls = _BY_CODE.get(code, ComposerError)
    if code == grpc.StatusCode.FAILED_PRECONDITION and reason == LEASE_LOST:
        cls = LeaseLostError
    return cls(
        code,
        message,
        field_violations=violations,
        reason=reason,
        domain=domain,
        metadata=metadata,
        retry_after=retry_after,
    )


def from_rpc_error(error: grpc.RpcError) -> ComposerError:
    """Converts a ``grpc.RpcError`` (sync or ``grpc.aio``) into its typed :class:`ComposerError`."""
    code_fn = getattr(error, "code", None)
    code = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    details_fn = getattr(error, "details", None)
    message = details_fn() if callable(details_fn) else str(error)
    trailing_fn = getattr(error, "trailing_metadata", None)
    trailing = trailing_fn() if callable(trailing_fn) else None
    converted = from_status(code, message or "", _trailer_bytes(trailing))
    converted.__cause__ = error
    return converted


class InvalidAddressError(ValueError):
    """A server address that is none of ``host:port``, ``http://host:port`` (plaintext) and
    ``https://host:port`` (TLS), raised when a Client or Worker is made with it."""


class RunFailedError(Exception):
    """A run ended FAILED or CANCELLED while the caller waited for its output.

    ``run`` is the final run; ``code`` and ``message`` say why (a cancelled
    run: ``CANCELLED`` and the reason given to ``cancel_run``).
    """

    def __init__(self, run: Any) -> None:
        self.run = run
        error = run.error
        cancelled = run.status.value == "CANCELLED"
        self.code: str = error.code if error is not None and error.code else ("CANCELLED" if cancelled else "UNKNOWN")
        """The run's error code: ``CANCELLED`` for a cancelled run, else the failure's (TIMEOUT, the node's ...)."""
        self.message: str = error.message if error is not None and error.message else ""
        """The run's error message: for a cancelled run the reason given to ``cancel_run``."""
        self.node_id: str = error.node_id if error is not None else ""
        """The node whose failure failed the run; empty for run-level errors."""
        if self.message:
            why = f"{self.code}: {self.message}"
        elif cancelled:
            why = f"{self.code}: no reason given"
        else:
            why = f"{self.code}: no error recorded"
        if self.node_id:
            why += f" (node {self.node_id})"
        super().__init__(f"run {run.run_id} ended {run.status.value}: {why}")


class TaskError(Exception):
    """Raised by a handler to fail its task with a chosen ``code``, ``retryable`` flag and ``details``.

    ``code`` is matched against the node's ``retry.non_retryable`` list and is
    readable by error edges as ``nodes.<id>.error.code``.
    """

    def __init__(self, message: str, *, code: str = "TASK_ERROR", retryable: bool = True, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retryable = retryable
        self.details = details


class NonRetryableError(TaskError):
    """Raised by a handler to fail its node at once, whatever the node's retry policy says."""

    def __init__(self, message: str, *, code: str = "NON_RETRYABLE", details: Any = None) -> None:
        super().__init__(message, code=code, retryable=False, details=details)


__all__ = [
    "BUSY_REASONS",
    "CPU_POOL_BUSY",
    "LEASE_LOST",
    "QUOTA_EXCEEDED",
    "STATUS_DETAILS_KEY",
    "TRANSIENT_CODES",
    "AlreadyExistsError",
    "ComposerError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "FieldViolation",
    "InvalidAddressError",
    "InvalidArgumentError",
    "LeaseLostError",
    "NonRetryableError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "RunFailedError",
    "TaskError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "from_rpc_error",
    "from_status",
]
