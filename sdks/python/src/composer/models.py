"""Plain-Python views of the server's messages, as the Client returns them.

Payloads (inputs, outputs, details) are JSON values (``dict``, ``list``,
``str``, numbers, ``bool``, ``None``); times are timezone-aware ``datetime``
(``None`` when unset). Each view keeps the protobuf message it came from in
``raw``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from google.protobuf import timestamp_pb2

from composer.v1 import common_pb2, run_service_pb2, workflow_service_pb2

from ._values import from_optional_field


class RunStatus(enum.Enum):
    """Where a run is in its life."""

    RUNNING = "RUNNING"
    """Nodes are running, waiting or scheduled."""
    COMPENSATING = "COMPENSATING"
    """Failed or cancelled; compensation nodes are running."""
    COMPLETED = "COMPLETED"
    """Finished with an output."""
    FAILED = "FAILED"
    """A node failure was not handled, or the run timed out."""
    CANCELLED = "CANCELLED"
    """Ended by CancelRun."""
    UNSPECIFIED = "UNSPECIFIED"
    """Never sent by the server."""

    @property
    def is_final(self) -> bool:
        """True for COMPLETED, FAILED and CANCELLED."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)

    def to_proto(self) -> int:
        """The ``composer.v1.RunStatus`` number of this status."""
        return int(common_pb2.RunStatus.Value(f"RUN_STATUS_{self.value}"))

    @classmethod
    def from_proto(cls, number: int) -> RunStatus:
        """The status for a ``composer.v1.RunStatus`` number (UNSPECIFIED for unknown ones)."""
        try:
            return cls(common_pb2.RunStatus.Name(number).removeprefix("RUN_STATUS_"))
        except ValueError:
            return cls.UNSPECIFIED


class NodeStatus(enum.Enum):
    """Where one node (or one MAP element) of a run is."""

    SCHEDULED = "SCHEDULED"
    """Waiting for dispatch or for a retry back-off."""
    RUNNING = "RUNNING"
    """A worker holds the current attempt's lease."""
    WAITING = "WAITING"
    """Waiting on a timer, an event or a child run."""
    COMPLETED = "COMPLETED"
    """Finished with an output."""
    FAILED = "FAILED"
    """Failed after its last attempt."""
    SKIPPED = "SKIPPED"
    """Every incoming edge was skipped."""
    CANCELLED = "CANCELLED"
    """Stopped because the run was cancelled."""
    UNSPECIFIED = "UNSPECIFIED"
    """Never sent by the server."""

    @classmethod
    def from_proto(cls, number: int) -> NodeStatus:
        """The status for a ``composer.v1.NodeStatus`` number (UNSPECIFIED for unknown ones)."""
        try:
            return cls(common_pb2.NodeStatus.Name(number).removeprefix("NODE_STATUS_"))
        except ValueError:
            return cls.UNSPECIFIED


def _time(message: Any, name: str) -> datetime | None:
    if not message.HasField(name):
        return None
    stamp: timestamp_pb2.Timestamp = getattr(message, name)
    return stamp.ToDatetime(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Failure:
    """Why a node or a run failed."""

    code: str
    """A short machine-readable code (the worker's, or TIMEOUT, LEASE_EXPIRED, ...)."""
    message: str
    """A human-readable message."""
    node_id: str = ""
    """The failed node; empty for run-level failures."""
    details: Any = None
    """Structured details, e.g. a traceback."""

    @classmethod
    def from_proto(cls, message: common_pb2.Failure) -> Failure:
        """Builds the view of a ``composer.v1.Failure``."""
        return cls(message.code, message.message, message.node_id, from_optional_field(message, "details"))


@dataclass(frozen=True)
class NodeState:
    """The state of one node of a run."""

    node_id: str
    """The node id, or ``<map id>[<index>]`` for a MAP element."""
    node_type: str
    """TASK, HTTP, CODE, ..."""
    status: NodeStatus
    """Where the node is."""
    attempt: int
    """The current or last attempt, from 1 (0 before the first)."""
    output: Any
    """The output once COMPLETED."""
    error: Failure | None
    """The failure once FAILED."""
    start_time: datetime | None
    """When the node first started."""
    end_time: datetime | None
    """When the node reached its final status."""
    input: Any = None
    """For a node a worker runs: the input it gets, templates rendered."""
    worker_id: str = ""
    """The worker that holds (or last held) its task's lease."""
    lease_expire_time: datetime | None = None
    """When the current lease ends; None when the task is not leased."""

    @classmethod
    def from_proto(cls, message: common_pb2.NodeState) -> NodeState:
        """Builds the view of a ``composer.v1.NodeState``."""
        return cls(
            node_id=message.node_id,
            node_type=message.node_type,
            status=NodeStatus.from_proto(message.status),
            attempt=message.attempt,
            output=from_optional_field(message, "output"),
            error=Failure.from_proto(message.error) if message.HasField("error") else None,
            start_time=_time(message, "start_time"),
            end_time=_time(message, "end_time"),
            input=from_optional_field(message, "input"),
            worker_id=message.worker_id,
            lease_expire_time=_time(message, "lease_expire_time"),
        )


@dataclass(frozen=True)
class Run:
    """One execution of a workflow version."""

    run_id: str
    """The run's id (a UUID)."""
    namespace: str
    """The namespace it belongs to."""
    workflow_name: str
    """The workflow it executes."""
    workflow_version: int
    """The version it is pinned to."""
    status: RunStatus
    """Where it is."""
    input: Any
    """The input given to StartRun."""
    output: Any
    """The workflow's evaluated ``output`` once COMPLETED."""
    error: Failure | None
    """Why it failed or was cancelled."""
    labels: dict[str, str]
    """Labels given to StartRun."""
    idempotency_key: str
    """The idempotency key given to StartRun, if any."""
    parent_run_id: str
    """For a child run: its parent."""
    create_time: datetime | None
    """When it was created."""
    update_time: datetime | None
    """When it last changed."""
    end_time: datetime | None
    """When it reached its final status."""
    nodes: tuple[NodeState, ...]
    """Per-node state (empty in list_runs)."""
    created: bool | None = None
    """From start_run only: False when the idempotency key matched an existing run."""
    raw: common_pb2.Run = field(default_factory=common_pb2.Run, repr=False, compare=False)
    """The message this view was built from."""

    def node(self, node_id: str) -> NodeState | None:
        """The state of one node, or None."""
        return next((n for n in self.nodes if n.node_id == node_id), None)

    @classmethod
    def from_proto(cls, message: common_pb2.Run, *, created: bool | None = None) -> Run:
        """Builds the view of a ``composer.v1.Run``."""
        return cls(
            run_id=message.run_id,
            namespace=message.namespace,
            workflow_name=message.workflow_name,
            workflow_version=message.workflow_version,
            status=RunStatus.from_proto(message.status),
            input=from_optional_field(message, "input"),
            output=from_optional_field(message, "output"),
            error=Failure.from_proto(message.error) if message.HasField("error") else None,
            labels=dict(message.labels),
            idempotency_key=message.idempotency_key,
            parent_run_id=message.parent_run_id,
            create_time=_time(message, "create_time"),
            update_time=_time(message, "update_time"),
            end_time=_time(message, "end_time"),
            nodes=tuple(NodeState.from_proto(n) for n in message.nodes),
            created=created,
            raw=message,
        )


@dataclass(frozen=True)
class WorkflowVersion:
    """One registered, immutable version of a workflow."""

    name: str
    """The workflow's name."""
    version: int
    """Its version, from 1."""
    namespace: str
    """The namespace it belongs to."""
    description: str
    """The definition's description."""
    content_hash: str
    """Hex SHA-256 of the canonical definition."""
    source: str
    """The definition as registered (empty in listings)."""
    definition: Any
    """The parsed definition as JSON (None in listings)."""
    create_time: datetime | None
    """When it was registered."""
    created: bool | None = None
    """From register_workflow only: False when identical content was already registered."""

    @classmethod
    def from_proto(cls, message: common_pb2.WorkflowVersion, *, created: bool | None = None) -> WorkflowVersion:
        """Builds the view of a ``composer.v1.WorkflowVersion``."""
        return cls(
            name=message.name,
            version=message.version,
            namespace=message.namespace,
            description=message.description,
            content_hash=message.content_hash,
            source=message.source,
            definition=from_optional_field(message, "definition"),
            create_time=_time(message, "create_time"),
            created=created,
        )


@dataclass(frozen=True)
class ValidationProblem:
    """One problem found in a workflow definition."""

    path: str
    """The path of the offending field, e.g. ``nodes[3].retry.max_attempts``."""
    message: str
    """What is wrong."""

    @classmethod
    def from_proto(cls, message: workflow_service_pb2.ValidationProblem) -> ValidationProblem:
        """Builds the view of a ``composer.v1.ValidationProblem``."""
        return cls(message.path, message.message)


@dataclass(frozen=True)
class HistoryEvent:
    """One entry of a run's history."""

    sequence: int
    """Position in the history, from 1."""
    event_type: str
    """RunStarted, TaskCompleted, LeaseExpired, ..."""
    node_id: str
    """The node it is about, if any."""
    attempt: int
    """The attempt it is about, if any."""
    actor: str
    """Who caused it."""
    details: Any
    """Event-specific details."""
    event_time: datetime | None
    """When it was recorded."""

    @classmethod
    def from_proto(cls, message: common_pb2.HistoryEvent) -> HistoryEvent:
        """Builds the view of a ``composer.v1.HistoryEvent``."""
        return cls(
            sequence=message.sequence,
            event_type=message.event_type,
            node_id=message.node_id,
            attempt=message.attempt,
            actor=message.actor,
            details=from_optional_field(message, "details"),
            event_time=_time(message, "event_time"),
        )


@dataclass(frozen=True)
class EventDelivery:
    """Where a sent event went."""

    delivered_run_ids: tuple[str, ...]
    """Runs whose waiting node consumed the event now."""
    stored: bool
    """True when the event was kept for a wait not reached yet."""

    @classmethod
    def from_proto(cls, message: run_service_pb2.SendEventResponse) -> EventDelivery:
        """Builds the view of a ``composer.v1.SendEventResponse``."""
        return cls(tuple(message.delivered_run_ids), message.stored)


@dataclass(frozen=True)
class ServerInfo:
    """What the server is and speaks."""

    server_version: str
    """The server's release."""
    protocol_version: str
    """The protocol version, ``<major>.<minor>``."""
    features: tuple[str, ...]
    """Optional features, e.g. ``grpc-web``."""


__all__ = [
    "EventDelivery",
    "Failure",
    "HistoryEvent",
    "NodeState",
    "NodeStatus",
    "Run",
    "RunStatus",
    "ServerInfo",
    "ValidationProblem",
    "WorkflowVersion",
]
