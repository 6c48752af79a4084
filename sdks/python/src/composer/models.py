"""Plain-Python views of the server's messages, as the Client returns them.

Payloads (inputs, outputs, details) are JSON values (``dict``, ``list``,
``str``, numbers, ``bool``, ``None``); times are timezone-aware ``datetime``
(``None`` when unset). Each view keeps the protobuf message it came from in
``raw``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from composer.v1 import (
    blob_service_pb2,
    common_pb2,
    queue_service_pb2,
    run_service_pb2,
    schedule_service_pb2,
    secret_service_pb2,
    workflow_service_pb2,
)

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
    PAUSED = "PAUSED"
    """Paused by pause_run: dispatches no task and fires no timer until resume_run."""
    QUEUED = "QUEUED"
    """Waiting for a slot of its workflow's concurrency key (``concurrency_key``); no node has started.

    It starts (RUNNING) when a run of the key ends and hands it the slot, oldest first.
    """
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
    priority: int = 3
    """Dispatch priority, 1 (lowest) to 5 (highest); start_run's, or a child's parent's."""
    concurrency_key: str = ""
    """The value of its workflow's ``concurrency.key`` for its input; empty when the workflow has none."""
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
            priority=message.priority,
            concurrency_key=message.concurrency_key,
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
class WorkflowSummary:
    """A workflow name with its latest version, as list_workflows gives it."""

    name: str
    """The workflow's name."""
    latest_version: int
    """Its highest registered version."""
    namespace: str
    """The namespace it belongs to."""
    description: str
    """The latest version's description."""
    update_time: datetime | None
    """When the latest version was registered."""

    @classmethod
    def from_proto(cls, message: common_pb2.WorkflowSummary) -> WorkflowSummary:
        """Builds the view of a ``composer.v1.WorkflowSummary``."""
        return cls(
            name=message.name,
            latest_version=message.latest_version,
            namespace=message.namespace,
            description=message.description,
            update_time=_time(message, "update_time"),
        )


class RunCounts(dict[RunStatus, int]):
    """How many matching runs are in each status (a dict), and ``more``.

    ``more`` is True when the server stopped counting at its limit (100,000
    matching runs): each count is then a floor.
    """

    more: bool = False


def run_counts_from_proto(message: run_service_pb2.CountRunsResponse) -> RunCounts:
    """Every status a run can have (UNSPECIFIED aside) with how many runs are in it, 0 where none."""
    counts = RunCounts({status: 0 for status in RunStatus if status is not RunStatus.UNSPECIFIED})
    for entry in message.counts:
        status = RunStatus.from_proto(entry.status)
        counts[status] = counts.get(status, 0) + entry.count
    counts.more = message.more
    return counts


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


class OverlapPolicy(enum.Enum):
    """What a schedule's fire does while the run of its previous fire still runs."""

    SKIP = "SKIP"
    """Start nothing; the fire counts in ``skipped_count`` (the default)."""
    BUFFER_ONE = "BUFFER_ONE"
    """Keep this one fire and start it when the previous run ends; further fires meanwhile are skipped."""
    ALLOW_ALL = "ALLOW_ALL"
    """Start anyway: runs may overlap."""
    CANCEL_PREVIOUS = "CANCEL_PREVIOUS"
    """Cancel the previous run, then start."""
    UNSPECIFIED = "UNSPECIFIED"
    """Never sent by the server."""

    def to_proto(self) -> int:
        """The ``composer.v1.OverlapPolicy`` number of this policy."""
        return int(schedule_service_pb2.OverlapPolicy.Value(f"OVERLAP_POLICY_{self.value}"))

    @classmethod
    def from_proto(cls, number: int) -> OverlapPolicy:
        """The policy for a ``composer.v1.OverlapPolicy`` number (UNSPECIFIED for unknown ones)."""
        try:
            return cls(schedule_service_pb2.OverlapPolicy.Name(number).removeprefix("OVERLAP_POLICY_"))
        except ValueError:
            return cls.UNSPECIFIED


class ScheduleFireOutcome(enum.Enum):
    """How one fire of a schedule went."""

    STARTED = "STARTED"
    """A run started (``run_id``)."""
    SKIPPED = "SKIPPED"
    """The overlap policy skipped it."""
    BUFFERED = "BUFFERED"
    """Kept until the previous run ends (BUFFER_ONE); its start is a fire of its own."""
    FAILED = "FAILED"
    """No run could start; the schedule's ``last_error`` says why."""
    UNSPECIFIED = "UNSPECIFIED"
    """Never sent by the server."""

    @classmethod
    def from_proto(cls, number: int) -> ScheduleFireOutcome:
        """The outcome for a ``composer.v1.ScheduleFireOutcome`` number (UNSPECIFIED for unknown ones)."""
        try:
            return cls(schedule_service_pb2.ScheduleFireOutcome.Name(number).removeprefix("SCHEDULE_FIRE_OUTCOME_"))
        except ValueError:
            return cls.UNSPECIFIED


def _duration(message: Any, name: str) -> timedelta | None:
    if not message.HasField(name):
        return None
    value: duration_pb2.Duration = getattr(message, name)
    return value.ToTimedelta()


@dataclass(frozen=True)
class ScheduleSpec:
    """When a schedule fires: a cron expression (in ``time_zone``, UTC when empty), or a fixed ``interval``."""

    cron: str = ""
    """5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first; empty with an interval."""
    time_zone: str = ""
    """The IANA time zone ``cron`` is read in; empty: UTC."""
    interval: timedelta | None = None
    """Whole seconds, 1 s to 366 days, counted from the schedule's creation (or last update)."""

    @classmethod
    def from_proto(cls, message: schedule_service_pb2.ScheduleSpec) -> ScheduleSpec:
        """Builds the view of a ``composer.v1.ScheduleSpec``."""
        return cls(message.cron, message.time_zone, _duration(message, "interval"))


@dataclass(frozen=True)
class ScheduleAction:
    """The run a schedule's fire starts."""

    workflow_name: str
    """The workflow."""
    version: int
    """Its version; 0: the latest at each fire."""
    input: Any
    """The run's input."""
    labels: dict[str, str]
    """The run's labels (it also carries ``composer.schedule`` and ``composer.fire_time``)."""

    @classmethod
    def from_proto(cls, message: schedule_service_pb2.ScheduleAction) -> ScheduleAction:
        """Builds the view of a ``composer.v1.ScheduleAction``."""
        return cls(message.workflow_name, message.version, from_optional_field(message, "input"), dict(message.labels))


@dataclass(frozen=True)
class ScheduleFire:
    """One fire of a schedule."""

    fire_time: datetime | None
    """The fire time the spec gave (before jitter)."""
    run_id: str
    """The run it started; empty unless STARTED."""
    outcome: ScheduleFireOutcome
    """How it went."""

    @classmethod
    def from_proto(cls, message: schedule_service_pb2.ScheduleFire) -> ScheduleFire:
        """Builds the view of a ``composer.v1.ScheduleFire``."""
        return cls(_time(message, "fire_time"), message.run_id, ScheduleFireOutcome.from_proto(message.outcome))


@dataclass(frozen=True)
class Schedule:
    """A schedule that starts runs on a timetable, with its state (docs/schedules.md)."""

    schedule_id: str
    """The id, unique in the namespace."""
    namespace: str
    """The namespace it belongs to."""
    spec: ScheduleSpec
    """When it fires."""
    action: ScheduleAction
    """What a fire starts."""
    overlap_policy: OverlapPolicy
    """What a fire does while the previous run still runs."""
    catch_up_window: timedelta | None
    """How late a missed fire may still start."""
    jitter: timedelta | None
    """The most a fire's start is delayed past its fire time."""
    paused: bool
    """True while paused."""
    note: str
    """The note of the last pause or resume."""
    recent_fires: tuple[ScheduleFire, ...]
    """The last fires, newest first (at most 10)."""
    next_fire_times: tuple[datetime, ...]
    """The next fire times (at most 10; none while paused)."""
    fired_count: int
    """Fires that started a run."""
    skipped_count: int
    """Fires the overlap policy skipped."""
    missed_count: int
    """Fires older than the catch-up window when the scheduler reached them, never started."""
    last_error: str
    """Why the last fire started no run; empty after one that did."""
    buffered_fire_time: datetime | None
    """A fire waiting for the previous run to end (BUFFER_ONE)."""
    create_time: datetime | None
    """When it was created."""
    update_time: datetime | None
    """When it last changed (a fire included)."""
    raw: schedule_service_pb2.Schedule = field(
        default_factory=schedule_service_pb2.Schedule, repr=False, compare=False
    )
    """The message this view was built from."""

    @classmethod
    def from_proto(cls, message: schedule_service_pb2.Schedule) -> Schedule:
        """Builds the view of a ``composer.v1.Schedule``."""
        return cls(
            schedule_id=message.schedule_id,
            namespace=message.namespace,
            spec=ScheduleSpec.from_proto(message.spec),
            action=ScheduleAction.from_proto(message.action),
            overlap_policy=OverlapPolicy.from_proto(message.overlap_policy),
            catch_up_window=_duration(message, "catch_up_window"),
            jitter=_duration(message, "jitter"),
            paused=message.paused,
            note=message.note,
            recent_fires=tuple(ScheduleFire.from_proto(f) for f in message.recent_fires),
            next_fire_times=tuple(t.ToDatetime(tzinfo=timezone.utc) for t in message.next_fire_times),
            fired_count=message.fired_count,
            skipped_count=message.skipped_count,
            missed_count=message.missed_count,
            last_error=message.last_error,
            buffered_fire_time=_time(message, "buffered_fire_time"),
            create_time=_time(message, "create_time"),
            update_time=_time(message, "update_time"),
            raw=message,
        )


@dataclass(frozen=True)
class RunFilter:
    """Which runs a bulk operation acts on: ListRuns' filters, all of which a run must match.

    An empty filter matches nothing unless the bulk call says ``all=True``
    (every run of the namespace). Bad values are checked as list_runs checks
    them (InvalidArgumentError naming ``filter.<field>``, e.g. a
    ``workflow_version`` without a ``workflow_name``).
    """

    workflow_name: str = ""
    """Only runs of this workflow."""
    workflow_version: int = 0
    """Only runs of this version of ``workflow_name`` (which it requires); 0: any version."""
    statuses: Sequence[RunStatus] = ()
    """Only runs in one of these statuses."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Only runs carrying all of these labels with these values."""
    create_time_after: datetime | None = None
    """Only runs created at or after this time."""
    create_time_before: datetime | None = None
    """Only runs created before this time."""
    parent_run_id: str = ""
    """Only child runs of this run."""
    search: str = ""
    """Only the run whose id this is, and runs whose idempotency key starts with it."""

    def __post_init__(self) -> None:
        # Copies, so that a filter equals the one read back from an operation
        # and a caller's later change to its list or dict does not reach it.
        object.__setattr__(self, "statuses", tuple(self.statuses))
        object.__setattr__(self, "labels", dict(self.labels))

    def to_proto(self) -> run_service_pb2.RunFilter:
        """The ``composer.v1.RunFilter`` of this filter."""
        message = run_service_pb2.RunFilter(
            workflow_name=self.workflow_name,
            workflow_version=self.workflow_version,
            statuses=[s.to_proto() for s in self.statuses],  # type: ignore[misc]
            labels=dict(self.labels),
            parent_run_id=self.parent_run_id,
            search=self.search,
        )
        if self.create_time_after is not None:
            message.create_time_after.FromDatetime(self.create_time_after)
        if self.create_time_before is not None:
            message.create_time_before.FromDatetime(self.create_time_before)
        return message

    @classmethod
    def from_proto(cls, message: run_service_pb2.RunFilter) -> RunFilter:
        """Builds the view of a ``composer.v1.RunFilter``."""
        return cls(
            workflow_name=message.workflow_name,
            workflow_version=message.workflow_version,
            statuses=tuple(RunStatus.from_proto(s) for s in message.statuses),
            labels=dict(message.labels),
            create_time_after=_time(message, "create_time_after"),
            create_time_before=_time(message, "create_time_before"),
            parent_run_id=message.parent_run_id,
            search=message.search,
        )


class BulkOperationKind(enum.Enum):
    """What a bulk operation does to each run."""

    CANCEL = "CANCEL"
    """cancel_run on each run."""
    RETRY = "RETRY"
    """retry_run on each run."""
    PAUSE = "PAUSE"
    """pause_run on each run."""
    RESUME = "RESUME"
    """resume_run on each run."""
    MIGRATE = "MIGRATE"
    """Moves each run in flight to ``target_version`` when replay finds it compatible (migrate_runs)."""
    UNSPECIFIED = "UNSPECIFIED"
    """Never sent by the server."""

    @classmethod
    def from_proto(cls, number: int) -> BulkOperationKind:
        """The kind for a ``composer.v1.BulkOperationKind`` number (UNSPECIFIED for unknown ones)."""
        try:
            return cls(run_service_pb2.BulkOperationKind.Name(number).removeprefix("BULK_OPERATION_KIND_"))
        except ValueError:
            return cls.UNSPECIFIED


class BulkOperationStatus(enum.Enum):
    """Where a bulk operation is in its life."""

    PENDING = "PENDING"
    """Created; no server has taken it yet."""
    RUNNING = "RUNNING"
    """A server is working through its runs, one batch at a time."""
    SUCCEEDED = "SUCCEEDED"
    """Every matching run was acted on or skipped."""
    CANCELLED = "CANCELLED"
    """cancel_bulk_operation stopped it."""
    FAILED = "FAILED"
    """It stopped on an error it could not get past (its ``error``)."""
    UNSPECIFIED = "UNSPECIFIED"
    """Never sent by the server."""

    @property
    def is_final(self) -> bool:
        """True for SUCCEEDED, CANCELLED and FAILED."""
        return self in (BulkOperationStatus.SUCCEEDED, BulkOperationStatus.CANCELLED, BulkOperationStatus.FAILED)

    @classmethod
    def from_proto(cls, number: int) -> BulkOperationStatus:
        """The status for a ``composer.v1.BulkOperationStatus`` number (UNSPECIFIED for unknown ones)."""
        try:
            return cls(run_service_pb2.BulkOperationStatus.Name(number).removeprefix("BULK_OPERATION_STATUS_"))
        except ValueError:
            return cls.UNSPECIFIED


@dataclass(frozen=True)
class BulkOperationFailure:
    """One run a bulk operation could not act on."""

    run_id: str
    """The run."""
    message: str
    """Why."""

    @classmethod
    def from_proto(cls, message: run_service_pb2.BulkOperationFailure) -> BulkOperationFailure:
        """Builds the view of a ``composer.v1.BulkOperationFailure``."""
        return cls(message.run_id, message.message)


@dataclass(frozen=True)
class BulkOperation:
    """A long-running action (cancel, retry, pause, resume, migrate) over the runs a filter matches.

    Any server works on it, a batch at a time, and another takes over if that
    server stops. Counts only grow; once it ends, ``matched`` = ``succeeded``
    + ``skipped`` + ``failed`` unless it was cancelled.
    """

    operation_id: str
    """The operation's id."""
    namespace: str
    """The namespace it acts in."""
    kind: BulkOperationKind
    """What it does to each run."""
    status: BulkOperationStatus
    """Where it is."""
    filter: RunFilter
    """The filter it was started with."""
    reason: str
    """The reason given, for cancel and pause."""
    matched: int
    """How many runs matched when it started (runs created before it)."""
    succeeded: int
    """Runs acted on."""
    skipped: int
    """Runs passed over because they were no longer in a status the action applies to
    (for a migration also runs already on the target version, or compensating)."""
    failed: int
    """Runs the action failed on (for a migration: incompatible with the target); the first of them are in
    ``failures``."""
    failures: tuple[BulkOperationFailure, ...]
    """Up to 20 of the runs the action failed on, with why."""
    created_by: str
    """The subject of the token that started it."""
    create_time: datetime | None
    """When it was created."""
    update_time: datetime | None
    """When it last made progress."""
    end_time: datetime | None
    """When it ended; None while it runs."""
    error: str
    """Why it FAILED."""
    target_version: int = 0
    """MIGRATE: the version runs are moved to (0 for the other kinds)."""
    node_mapping: dict[str, str] = field(default_factory=dict)
    """MIGRATE: node ids renamed in the target, recorded id to new id."""
    created: bool | None = None
    """From the bulk_* calls and migrate_runs only: False when the ``request_id`` matched an existing
    operation."""
    raw: run_service_pb2.BulkOperation = field(
        default_factory=run_service_pb2.BulkOperation, repr=False, compare=False
    )
    """The message this view was built from."""

    @classmethod
    def from_proto(cls, message: run_service_pb2.BulkOperation, *, created: bool | None = None) -> BulkOperation:
        """Builds the view of a ``composer.v1.BulkOperation``."""
        return cls(
            operation_id=message.operation_id,
            namespace=message.namespace,
            kind=BulkOperationKind.from_proto(message.kind),
            status=BulkOperationStatus.from_proto(message.status),
            filter=RunFilter.from_proto(message.filter),
            reason=message.reason,
            matched=message.matched,
            succeeded=message.succeeded,
            skipped=message.skipped,
            failed=message.failed,
            failures=tuple(BulkOperationFailure.from_proto(f) for f in message.failures),
            created_by=message.created_by,
            create_time=_time(message, "create_time"),
            update_time=_time(message, "update_time"),
            end_time=_time(message, "end_time"),
            error=message.error,
            target_version=message.target_version,
            node_mapping=dict(message.node_mapping),
            created=created,
            raw=message,
        )


class ReplayVerdict(enum.Enum):
    """Whether a new definition could continue a run (docs/versions.md)."""

    IDENTICAL = "IDENTICAL"
    """Every recorded decision the same, and nothing the run has not reached differs."""
    COMPATIBLE = "COMPATIBLE"
    """The same nodes start in the same order with the same work; ``differences`` lists the rest."""
    INCOMPATIBLE = "INCOMPATIBLE"
    """The new definition parts from what the run did: ``divergence`` says where."""
    UNREPLAYABLE = "UNREPLAYABLE"
    """The history is not what the run's own definition decides (cut short, edited, or recorded by
    another engine): ``unreplayable_reason`` says why."""
    UNSPECIFIED = "UNSPECIFIED"
    """Never sent by the server."""

    @classmethod
    def from_proto(cls, number: int) -> ReplayVerdict:
        """The verdict for a ``composer.v1.ReplayVerdict`` number (UNSPECIFIED for unknown ones)."""
        try:
            return cls(workflow_service_pb2.ReplayVerdict.Name(number).removeprefix("REPLAY_VERDICT_"))
        except ValueError:
            return cls.UNSPECIFIED


@dataclass(frozen=True)
class ReplayDivergence:
    """Where a new definition first parts from a run (an INCOMPATIBLE verdict)."""

    rule: str
    """The rule broken, as docs/versions.md names it: ``node_changed``, ``branch_changed``,
    ``waiting_node_removed``, ..."""
    node_id: str
    """The node (its recorded id); empty if none."""
    sequence: int
    """The history entry where it shows; 0 if none."""
    message: str
    """What differs, in words."""

    @classmethod
    def from_proto(cls, message: workflow_service_pb2.ReplayDivergence) -> ReplayDivergence:
        """Builds the view of a ``composer.v1.ReplayDivergence``."""
        return cls(message.rule, message.node_id, message.sequence, message.message)


@dataclass(frozen=True)
class ReplayDifference:
    """One difference that does not stop a run going on (a COMPATIBLE verdict)."""

    kind: str
    """``node_added``, ``node_changed``, ``node_removed``, ``input_differs`` or ``node_renamed``."""
    node_id: str
    """The node."""
    message: str
    """What differs, in words."""

    @classmethod
    def from_proto(cls, message: workflow_service_pb2.ReplayDifference) -> ReplayDifference:
        """Builds the view of a ``composer.v1.ReplayDifference``."""
        return cls(message.kind, message.node_id, message.message)


@dataclass(frozen=True)
class RunReplay:
    """One run's verdict: what a new definition would do with it (replay_run, check_workflow_version)."""

    run_id: str
    """The run."""
    workflow_version: int
    """The version it runs on."""
    status: RunStatus
    """Its status."""
    verdict: ReplayVerdict
    """The verdict."""
    divergence: ReplayDivergence | None
    """Where the new definition parts from the run; set when INCOMPATIBLE."""
    differences: tuple[ReplayDifference, ...]
    """The differences of a COMPATIBLE run (at most 20)."""
    unreplayable_reason: str
    """Why an UNREPLAYABLE run could not be replayed."""
    events: int
    """Events rebuilt from the history and replayed."""
    raw: workflow_service_pb2.RunReplay = field(
        default_factory=workflow_service_pb2.RunReplay, repr=False, compare=False
    )
    """The message this view was built from."""

    @classmethod
    def from_proto(cls, message: workflow_service_pb2.RunReplay) -> RunReplay:
        """Builds the view of a ``composer.v1.RunReplay``."""
        return cls(
            run_id=message.run_id,
            workflow_version=message.workflow_version,
            status=RunStatus.from_proto(message.status),
            verdict=ReplayVerdict.from_proto(message.verdict),
            divergence=ReplayDivergence.from_proto(message.divergence) if message.HasField("divergence") else None,
            differences=tuple(ReplayDifference.from_proto(d) for d in message.differences),
            unreplayable_reason=message.unreplayable_reason,
            events=message.events,
            raw=message,
        )


class CheckScope(enum.Enum):
    """Which runs check_workflow_version replays."""

    IN_FLIGHT = "IN_FLIGHT"
    """The runs in flight: RUNNING, COMPENSATING, PAUSED (of every version)."""
    COMPLETED = "COMPLETED"
    """The runs that completed, newest first."""

    def to_proto(self) -> int:
        """The ``composer.v1.CheckScope`` number of this scope."""
        return int(workflow_service_pb2.CheckScope.Value(f"CHECK_SCOPE_{self.value}"))


@dataclass(frozen=True)
class WorkflowVersionCheck:
    """The verdicts of every run check_workflow_version replayed, summed over the pages it fetched."""

    checked: int = 0
    """Runs replayed."""
    identical: int = 0
    """Of them, identical."""
    compatible: int = 0
    """Compatible."""
    incompatible: int = 0
    """Incompatible."""
    unreplayable: int = 0
    """Not replayable."""
    runs: tuple[RunReplay, ...] = ()
    """Every run that is not identical, with its verdict, newest first."""

    @property
    def counts(self) -> dict[ReplayVerdict, int]:
        """How many runs got each verdict (every verdict present, 0 where none)."""
        return {
            ReplayVerdict.IDENTICAL: self.identical,
            ReplayVerdict.COMPATIBLE: self.compatible,
            ReplayVerdict.INCOMPATIBLE: self.incompatible,
            ReplayVerdict.UNREPLAYABLE: self.unreplayable,
        }


@dataclass(frozen=True)
class QueueRateLimit:
    """How fast a queue's tasks are handed to workers (docs/rate-limits.md).

    Two bounds hold at once: over time at most ``per_second`` tasks a second,
    and in any one-second window at most ``burst``. A task held back stays
    dispatched (not leased, no attempt spent) and goes out as soon as the
    limit allows. The per-key fields bound each distinct ``rate_limit_key``
    of the queue's TASK nodes the same way.
    """

    queue: str
    """The queue."""
    per_second: float
    """Tasks per second over the whole queue (fractions allowed); 0: no queue-wide limit."""
    burst: int
    """The most tasks handed out in any one-second window."""
    per_key_per_second: float = 0.0
    """Tasks per second for each distinct rate-limit key; 0: no per-key limit."""
    per_key_burst: int = 0
    """The most tasks of one key in any one-second window."""
    create_time: datetime | None = None
    """When the limit was first set."""
    update_time: datetime | None = None
    """When it was last changed."""
    raw: queue_service_pb2.QueueRateLimit = field(
        default_factory=queue_service_pb2.QueueRateLimit, repr=False, compare=False
    )
    """The message this view was built from."""

    @classmethod
    def from_proto(cls, message: queue_service_pb2.QueueRateLimit) -> QueueRateLimit:
        """Builds the view of a ``composer.v1.QueueRateLimit``."""
        return cls(
            queue=message.queue,
            per_second=message.per_second,
            burst=message.burst,
            per_key_per_second=message.per_key_per_second,
            per_key_burst=message.per_key_burst,
            create_time=_time(message, "create_time"),
            update_time=_time(message, "update_time"),
            raw=message,
        )


@dataclass(frozen=True)
class Secret:
    """A secret of the namespace, as ``${secrets.NAME}`` refers to it (docs/secrets.md).

    It describes the secret and never holds its value: no call returns one.
    """

    name: str
    """The name."""
    version: int
    """The current version: 1 for the first value, one more for each set since."""
    create_time: datetime | None = None
    """When the first version was set."""
    update_time: datetime | None = None
    """When the current version was set."""
    updated_by: str = ""
    """The subject of the token that set the current version."""
    raw: secret_service_pb2.Secret = field(default_factory=secret_service_pb2.Secret, repr=False, compare=False)
    """The message this view was built from."""

    @classmethod
    def from_proto(cls, message: secret_service_pb2.Secret) -> Secret:
        """Builds the view of a ``composer.v1.Secret``."""
        return cls(
            name=message.name,
            version=message.version,
            create_time=_time(message, "create_time"),
            update_time=_time(message, "update_time"),
            updated_by=message.updated_by,
            raw=message,
        )


@dataclass(frozen=True)
class ServerInfo:
    """What the server is and speaks."""

    server_version: str
    """The server's release."""
    protocol_version: str
    """The protocol version, ``<major>.<minor>``."""
    features: tuple[str, ...]
    """Optional features, e.g. ``grpc-web``."""
    payload_offload_bytes: int = 0
    """A value whose compact JSON is longer than this many bytes is kept in the blob store and
    carried as a reference (docs/payloads.md); 0 when the server offloads nothing."""
    max_payload_bytes: int = 0
    """The largest payload the server accepts, inline or as a blob (0: not said)."""
    max_message_bytes: int = 0
    """The largest request message the server decodes (0: not said)."""
    blob_urls: bool = False
    """Whether the server gives presigned URLs for blobs: the SDK then moves large payloads straight
    to and from its blob store (docs/payloads.md)."""


@dataclass(frozen=True)
class BlobRef:
    """A blob of the namespace's blob store, as a reference names it (docs/payloads.md).

    A value larger than the server's ``payload_offload_bytes`` is stored as
    its compact JSON text and carried as the reference
    ``{"$blob": {"sha256": ..., "size": ..., "head": ...}}``
    (:meth:`reference`); ``Client.download_blob(ref.sha256)`` gives its bytes.
    """

    sha256: str
    """The SHA-256 of the blob's bytes, 64 lowercase hex digits."""
    size: int
    """Its length in bytes."""
    head: str = ""
    """Its first bytes (at most 256, cut at a character boundary), for a preview."""
    raw: blob_service_pb2.BlobRef = field(default_factory=blob_service_pb2.BlobRef, repr=False, compare=False)
    """The message this view was built from."""

    def reference(self) -> dict[str, Any]:
        """The reference object to put in a value in the blob's stead: ``{"$blob": {...}}``."""
        return {"$blob": {"sha256": self.sha256, "size": self.size, "head": self.head}}

    @classmethod
    def from_reference(cls, value: Mapping[str, Any]) -> BlobRef:
        """The BlobRef of a reference object (``{"$blob": {...}}``, as ``get_run`` shows one);
        ValueError when ``value`` is not a reference."""
        inner = value.get("$blob") if isinstance(value, Mapping) and len(value) == 1 else None
        if not isinstance(inner, Mapping) or not isinstance(inner.get("sha256"), str):
            raise ValueError(f'not a reference (an object whose only key is "$blob", naming a sha256): {value!r:.200}')
        size = inner.get("size", 0)
        head = inner.get("head", "")
        return cls(
            sha256=inner["sha256"],
            size=int(size) if isinstance(size, (int, float)) else 0,
            head=head if isinstance(head, str) else "",
        )

    @classmethod
    def from_proto(cls, message: blob_service_pb2.BlobRef) -> BlobRef:
        """Builds the view of a ``composer.v1.BlobRef``."""
        return cls(sha256=message.sha256, size=message.size, head=message.head, raw=message)


__all__ = [
    "BlobRef",
    "BulkOperation",
    "BulkOperationFailure",
    "BulkOperationKind",
    "BulkOperationStatus",
    "CheckScope",
    "EventDelivery",
    "Failure",
    "HistoryEvent",
    "NodeState",
    "NodeStatus",
    "OverlapPolicy",
    "QueueRateLimit",
    "ReplayDifference",
    "ReplayDivergence",
    "ReplayVerdict",
    "Run",
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
    "ServerInfo",
    "ValidationProblem",
    "WorkflowSummary",
    "WorkflowVersion",
    "WorkflowVersionCheck",
    "run_counts_from_proto",
]
