"""Composer's Python SDK: workers and clients for the Composer workflow engine.

- :class:`Worker` serves task handlers (``@worker.task("queue", "task name")``)
  with slots, heartbeats, cancellation, lease-safe reports and graceful
  shutdown; :meth:`Worker.serve_code` makes it a Python code runner.
- :class:`Client` (asyncio) and :class:`SyncClient` register workflows, start,
  list, cancel, retry, pause and resume runs (one by one, or every run a
  :class:`RunFilter` matches in one bulk operation), send events, wait for
  results, replay runs against a new workflow version and migrate them to it,
  manage schedules, set queue rate limits and keep the namespace's secrets.
- Large payloads go through the server's blob store on their own: the client
  and the worker upload values over the server's threshold and send a
  :class:`BlobRef`'s reference, and handlers see plain values
  (``Client.upload_blob``, ``download_blob``, ``resolve_payload``).
- Failed calls raise :class:`ComposerError` subclasses carrying the gRPC code
  and the field violations; handlers raise :class:`NonRetryableError` or
  :class:`TaskError` to control retries.

The generated gRPC modules (``composer.v1``) are the wire layer, not the SDK's
public interface.
"""

from .backoff import Backoff
from .client import Client, SecretValue, SyncClient
from .errors import (
    AlreadyExistsError,
    ComposerError,
    DeadlineExceededError,
    FailedPreconditionError,
    FieldViolation,
    InvalidAddressError,
    InvalidArgumentError,
    LeaseLostError,
    NonRetryableError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    RunFailedError,
    TaskError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from .models import (
    BlobRef,
    BulkOperation,
    BulkOperationFailure,
    BulkOperationKind,
    BulkOperationStatus,
    CheckScope,
    EventDelivery,
    Failure,
    HistoryEvent,
    NodeState,
    NodeStatus,
    OverlapPolicy,
    QueueRateLimit,
    ReplayDifference,
    ReplayDivergence,
    ReplayVerdict,
    Run,
    RunCounts,
    RunFilter,
    RunReplay,
    RunStatus,
    Schedule,
    ScheduleAction,
    ScheduleFire,
    ScheduleFireOutcome,
    ScheduleSpec,
    Secret,
    ServerInfo,
    ValidationProblem,
    WorkflowSummary,
    WorkflowVersion,
    WorkflowVersionCheck,
)
from .task_context import TaskSecrets
from .worker import TaskCancelled, TaskContext, Worker, WorkerStats

__version__ = "0.1.0"

__all__ = [
    "AlreadyExistsError",
    "Backoff",
    "BlobRef",
    "BulkOperation",
    "BulkOperationFailure",
    "BulkOperationKind",
    "BulkOperationStatus",
    "CheckScope",
    "Client",
    "ComposerError",
    "DeadlineExceededError",
    "EventDelivery",
    "FailedPreconditionError",
    "Failure",
    "FieldViolation",
    "HistoryEvent",
    "InvalidAddressError",
    "InvalidArgumentError",
    "LeaseLostError",
    "NodeState",
    "NodeStatus",
    "NonRetryableError",
    "NotFoundError",
    "OverlapPolicy",
    "PermissionDeniedError",
    "QueueRateLimit",
    "ReplayDifference",
    "ReplayDivergence",
    "ReplayVerdict",
    "ResourceExhaustedError",
    "Run",
    "RunFailedError",
    "RunCounts",
    "RunFilter",
    "RunReplay",
    "RunStatus",
    "Schedule",
    "ScheduleAction",
    "ScheduleFire",
    "ScheduleFireOutcome",
    "ScheduleSpec",
    "Secret",
    "SecretValue",
    "ServerInfo",
    "SyncClient",
    "TaskCancelled",
    "TaskContext",
    "TaskError",
    "TaskSecrets",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "ValidationProblem",
    "Worker",
    "WorkerStats",
    "WorkflowSummary",
    "WorkflowVersion",
    "WorkflowVersionCheck",
    "__version__",
]
