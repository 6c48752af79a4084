"""The Client: register workflows, start and steer runs, send events, wait for results.

:class:`Client` is asynchronous (``grpc.aio``); :class:`SyncClient` offers the
same methods, blocking, for scripts and notebooks::

    async with Client("http://127.0.0.1:7070") as client:   # or COMPOSER_ADDRESS
        await client.register_workflow(Path("order.yaml"))
        run = await client.start_run("order", {"order_id": "A-17"}, idempotency_key="A-17")
        output = await client.wait_for_result(run.run_id, timeout=60)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Coroutine, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc

from google.protobuf import duration_pb2, json_format, struct_pb2

from composer.v1 import (
    queue_service_pb2,
    run_service_pb2,
    schedule_service_pb2,
    secret_service_pb2,
    server_service_pb2,
    workflow_service_pb2,
)

from . import _payloads, _tracing
from ._connection import Connection, check_protocol_version
from ._values import to_value
from .backoff import Backoff
from .errors import ComposerError, RunFailedError, UnimplementedError, from_rpc_error
from .models import (
    BlobRef,
    BulkOperation,
    CheckScope,
    EventDelivery,
    HistoryEvent,
    OverlapPolicy,
    QueueRateLimit,
    Run,
    RunFilter,
    RunReplay,
    RunCounts,
    RunStatus,
    Schedule,
    ScheduleFire,
    Secret,
    ServerInfo,
    ValidationProblem,
    WorkflowSummary,
    WorkflowVersion,
    WorkflowVersionCheck,
    run_counts_from_proto,
)

T = TypeVar("T")

log = logging.getLogger("composer.client")

Seconds = float | timedelta
"""A duration: seconds (``float``) or a ``timedelta``."""


def _duration(value: Seconds) -> duration_pb2.Duration:
    message = duration_pb2.Duration()
    message.FromTimedelta(value if isinstance(value, timedelta) else timedelta(seconds=value))
    return message


def _schedule_parts(
    workflow: str,
    input: Any,
    *,
    cron: str | None,
    time_zone: str | None,
    interval: Seconds | None,
    version: int,
    labels: Mapping[str, str] | None,
) -> tuple[schedule_service_pb2.ScheduleSpec, schedule_service_pb2.ScheduleAction]:
    """The spec and action messages of create_schedule and update_schedule."""
    spec = schedule_service_pb2.ScheduleSpec(cron=cron or "", time_zone=time_zone or "")
    if interval is not None:
        spec.interval.CopyFrom(_duration(interval))
    action = schedule_service_pb2.ScheduleAction(workflow_name=workflow, version=version, labels=dict(labels or {}))
    if input is not None:
        action.input.CopyFrom(to_value(input))
    return spec, action


_BULK_POLL = Backoff(initial=0.1, maximum=2.0)
"""The delays between wait_bulk_operation's polls."""


def _run_filter(value: RunFilter | None) -> run_service_pb2.RunFilter:
    """The filter message of a bulk call; None is the empty filter (which needs ``all``)."""
    return (value or RunFilter()).to_proto()


SecretValue = str | bytes
"""A secret's value: ``bytes`` as they are, or text (``str``), sent as UTF-8."""


def _secret_bytes(value: SecretValue) -> bytes:
    """The bytes of a secret's value; an error names the type or a position, never the value."""
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise TypeError(f"a secret's value is str or bytes, not {type(value).__name__}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"a secret's value is not UTF-8 text: the character at index {error.start} cannot be encoded") from None


_SET_SECRET_ERRORS = (ComposerError, TypeError, ValueError)
"""What set_secret raises, each without the frames that held the value (_without_frames)."""


def _without_frames(error: BaseException) -> BaseException:
    """``error`` without its traceback and context: their frames hold a secret's value (the
    request, the argument), which an error reporter that shows local variables, or a caller that
    keeps the error, would otherwise see."""
    error.__context__ = None
    return error.with_traceback(None)


WorkflowSource = str | os.PathLike[str] | Mapping[str, Any]
"""A workflow definition: YAML or JSON text (``str``), a file (``pathlib.Path``), or a dict."""


def workflow_source_text(source: WorkflowSource) -> str:
    """The definition text to send for a workflow given as text, a file path or a dict.

    A ``str`` is the definition itself (YAML or JSON), never a file name: pass
    a ``pathlib.Path`` to read a file. A mapping is sent as JSON (JSON is YAML).
    """
    if isinstance(source, str):
        return source
    if isinstance(source, os.PathLike):
        return Path(source).read_text(encoding="utf-8")
    if isinstance(source, Mapping):
        return json.dumps(source)
    raise TypeError(f"a workflow is YAML text, a pathlib.Path or a dict, not {type(source).__name__}")


RecordedHistory = str | os.PathLike[str] | Mapping[str, Any]
"""A recorded run, what ``composer run history RUN_ID -o json`` writes: that JSON as text (``str``), the
file it was written to (``pathlib.Path``), or the parsed dict."""

_WRITE_HISTORY = "write it with `composer run history RUN_ID -o json`"


def _recorded_run(history: RecordedHistory) -> workflow_service_pb2.RecordedRun:
    """The RecordedRun message of a recorded history; ValueError when it is not one.

    Keys the message does not have (``next_page_token``) are passed over, but a
    set ``next_page_token`` means the history was cut short, and a replay of a
    part would judge the wrong run.
    """
    where = "the history"
    if isinstance(history, str):
        parsed = _json_object(history, where, hint="; a str is the JSON itself: pass a pathlib.Path to read a file")
    elif isinstance(history, os.PathLike):
        where = os.fspath(history)
        parsed = _json_object(Path(history).read_text(encoding="utf-8"), where)
    elif isinstance(history, Mapping):
        parsed = history
    else:
        raise TypeError(f"a recorded history is JSON text, a pathlib.Path or a dict, not {type(history).__name__}")
    missing = [key for key in ("run", "workflow", "events") if key not in parsed]
    if missing:
        raise ValueError(f"{where} has no {', '.join(repr(k) for k in missing)} ({_WRITE_HISTORY})")
    if parsed.get("next_page_token"):
        raise ValueError(
            f"{where} is cut short (next_page_token is set): write it with a --limit above its length"
        )
    try:
        return json_format.ParseDict(dict(parsed), workflow_service_pb2.RecordedRun(), ignore_unknown_fields=True)
    except json_format.ParseError as error:
        raise ValueError(f"{where} is not a recorded run: {error} ({_WRITE_HISTORY})") from None


def _json_object(text: str, where: str, *, hint: str = "") -> Mapping[str, Any]:
    try:
        parsed = json.loads(text)
    except ValueError as error:
        raise ValueError(f"{where} is not JSON: {error}{hint}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{where} is not a JSON object ({_WRITE_HISTORY})")
    return parsed


def _new_definition(call: str, source: WorkflowSource | None, version: int | None) -> tuple[str, int]:
    """The ``source`` and ``version`` fields naming the new definition of a replay: exactly one is given."""
    if source is not None and version is not None:
        raise ValueError(f"{call} takes source or version, not both")
    if source is None:
        if version is None:
            raise ValueError(f"{call} needs the new definition: source (its text) or version (a registered one)")
        if version < 1:
            raise ValueError(f"{call}: version must be positive, not {version}")
        return "", version
    text = workflow_source_text(source)
    if not text.strip():
        raise ValueError(f"{call}: source is empty")
    return text, 0


def _summed_check(pages: list[workflow_service_pb2.CheckWorkflowVersionResponse]) -> WorkflowVersionCheck:
    """The pages of a CheckWorkflowVersion (each counting its own runs alone) added up."""
    return WorkflowVersionCheck(
        checked=sum(page.checked for page in pages),
        identical=sum(page.identical for page in pages),
        compatible=sum(page.compatible for page in pages),
        incompatible=sum(page.incompatible for page in pages),
        unreplayable=sum(page.unreplayable for page in pages),
        runs=tuple(RunReplay.from_proto(run) for page in pages for run in page.runs),
    )


_CHECK_PAGE = 200
"""Runs one CheckWorkflowVersion call replays, by default (the server's own default; at most 500)."""


class Client:
    """An asynchronous client of a Composer server.

    ``address`` is ``host:port`` or ``http://host:port`` (plaintext) or
    ``https://host:port`` (TLS); without one, ``COMPOSER_ADDRESS``, else
    127.0.0.1:7070. A malformed address raises
    :class:`~composer.InvalidAddressError` at once. ``token`` is a bearer JWT
    (``composer token``, or the admin token ``composer dev`` prints; default
    ``COMPOSER_TOKEN``), sent with every call; ``tls`` True (system roots) or
    ``grpc.ChannelCredentials`` for a TLS endpoint (default: as the address says);
    ``timeout`` the deadline of each call in seconds. With ``wait_for_ready``
    (the default) a call made while the server is unreachable (restarting)
    waits for it within its deadline instead of failing UNAVAILABLE at once.
    Use it as an async context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str | None = None,
        tls: bool | grpc.ChannelCredentials | None = None,
        timeout: float = 30.0,
        wait_for_ready: bool = True,
    ) -> None:
        self._conn = Connection(address, token=token, tls=tls)
        self._timeout = timeout
        self._wait_for_ready = wait_for_ready
        self._offload_bytes: int | None = None
        """The server's payload_offload_bytes, once asked (see :meth:`_offload_threshold`)."""
        self._blob_urls = _payloads.BlobUrls()
        """Whether blobs move through presigned URLs (the server's blob_urls, until it refuses one)."""

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connection."""
        await self._conn.close()

    async def _call(self, method: Any, request: Any, metadata: _tracing.Metadata = ()) -> Any:
        return await self._conn.unary(
            method, request, timeout=self._timeout, wait_for_ready=self._wait_for_ready, metadata=metadata
        )

    # --- server -----------------------------------------------------------

    async def server_info(self) -> ServerInfo:
        """The server's version, protocol version, features and payload limits."""
        info: server_service_pb2.GetServerInfoResponse = await self._call(
            self._conn.server.GetServerInfo, server_service_pb2.GetServerInfoRequest()
        )
        self._offload_bytes = max(info.payload_offload_bytes, 0)
        self._blob_urls.offered(info.blob_urls)
        return ServerInfo(
            info.server_version,
            info.protocol_version,
            tuple(info.features),
            payload_offload_bytes=info.payload_offload_bytes,
            max_payload_bytes=info.max_payload_bytes,
            max_message_bytes=info.max_message_bytes,
            blob_urls=info.blob_urls,
        )

    async def check_protocol(self) -> ServerInfo:
        """The server's info, after checking that this SDK speaks its protocol version.

        Raises :class:`~composer.errors.FailedPreconditionError` when it does not.
        """
        info = await self.server_info()
        check_protocol_version(info.protocol_version, f"server {self._conn.address}")
        return info

    # --- workflows --------------------------------------------------------

    async def register_workflow(self, source: WorkflowSource) -> WorkflowVersion:
        """Registers a workflow definition and returns its version.

        Registering content identical to the newest version returns that
        version (``created`` False). An invalid definition raises
        :class:`~composer.errors.InvalidArgumentError` whose
        ``field_violations`` list every problem with its path.
        """
        response: workflow_service_pb2.RegisterWorkflowResponse = await self._call(
            self._conn.workflows.RegisterWorkflow,
            workflow_service_pb2.RegisterWorkflowRequest(source=workflow_source_text(source)),
        )
        return WorkflowVersion.from_proto(response.workflow, created=response.created)

    async def validate_workflow(self, source: WorkflowSource) -> list[ValidationProblem]:
        """Checks a definition as registration would, stores nothing; returns every problem (empty = valid)."""
        response: workflow_service_pb2.ValidateWorkflowResponse = await self._call(
            self._conn.workflows.ValidateWorkflow,
            workflow_service_pb2.ValidateWorkflowRequest(source=workflow_source_text(source)),
        )
        return [ValidationProblem.from_proto(p) for p in response.problems]

    async def get_workflow(self, name: str, version: int = 0) -> WorkflowVersion:
        """One version of a workflow (the latest when ``version`` is 0); NotFoundError if absent."""
        response: workflow_service_pb2.GetWorkflowResponse = await self._call(
            self._conn.workflows.GetWorkflow, workflow_service_pb2.GetWorkflowRequest(name=name, version=version)
        )
        return WorkflowVersion.from_proto(response.workflow)

    async def list_workflows(self, *, name_prefix: str = "", page_size: int = 100) -> AsyncIterator[WorkflowSummary]:
        """Iterates over the namespace's workflows (each with its latest version) by name, fetching
        pages as it goes; only names starting with ``name_prefix`` when given."""
        request = workflow_service_pb2.ListWorkflowsRequest(name_prefix=name_prefix, page_size=page_size)
        async for response in self._pages(self._conn.workflows.ListWorkflows, request):
            for summary in response.workflows:
                yield WorkflowSummary.from_proto(summary)

    async def list_workflow_versions(self, name: str, *, page_size: int = 100) -> AsyncIterator[WorkflowVersion]:
        """Iterates over a workflow's versions, newest first, fetching pages as it goes (``source``
        and ``definition`` are left empty: :meth:`get_workflow` has them); NotFoundError if absent."""
        request = workflow_service_pb2.ListWorkflowVersionsRequest(name=name, page_size=page_size)
        async for response in self._pages(self._conn.workflows.ListWorkflowVersions, request):
            for version in response.versions:
                yield WorkflowVersion.from_proto(version)

    async def _pages(self, method: Any, request: Any) -> AsyncIterator[Any]:
        """The responses of a paged List call, one per page, until the last (``request`` is
        reused, its ``page_token`` moved on each time)."""
        while True:
            response = await self._call(method, request)
            yield response
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    # --- versions and replay ----------------------------------------------

    async def replay_run(
        self,
        run_id: str | None = None,
        *,
        history: RecordedHistory | None = None,
        source: WorkflowSource | None = None,
        version: int | None = None,
        node_mapping: Mapping[str, str] | None = None,
    ) -> RunReplay:
        """Replays one run's recorded history against a new definition and says whether it could
        continue the run (docs/versions.md); nothing is stored.

        The run is named by ``run_id`` (read from the server) or given whole as
        ``history``: what ``composer run history RUN_ID -o json`` writes, as
        JSON text, a ``pathlib.Path`` or a dict (nothing is read then). The new
        definition is ``source`` (as :meth:`register_workflow` takes it) or a
        registered ``version`` of the run's workflow; ``node_mapping`` maps
        node ids renamed in it, recorded id to new id.

        The verdict is IDENTICAL, COMPATIBLE (``differences``), INCOMPATIBLE
        (``divergence``) or UNREPLAYABLE (``unreplayable_reason``: the history
        is not what its own definition decides). Raises ``ValueError`` before
        any call unless exactly one of ``run_id`` and ``history`` and exactly
        one of ``source`` and ``version`` are given, or when ``history`` is not
        a recorded run (or is cut short); InvalidArgumentError for an invalid
        ``source``, NotFoundError for an unknown run or version.
        """
        if (not run_id) == (history is None):
            raise ValueError("replay_run needs exactly one of run_id and history")
        text, number = _new_definition("replay_run", source, version)
        request = workflow_service_pb2.ReplayRunRequest(
            source=text, version=number, node_mapping=dict(node_mapping or {})
        )
        if history is not None:
            request.history.CopyFrom(_recorded_run(history))
        elif run_id:
            request.run_id = run_id
        response: workflow_service_pb2.ReplayRunResponse = await self._call(
            self._conn.workflows.ReplayRun, request
        )
        return RunReplay.from_proto(response.replay)

    async def check_workflow_version(
        self,
        name: str,
        *,
        source: WorkflowSource | None = None,
        version: int | None = None,
        node_mapping: Mapping[str, str] | None = None,
        scope: CheckScope = CheckScope.IN_FLIGHT,
        limit: int | None = None,
        page_size: int = _CHECK_PAGE,
    ) -> WorkflowVersionCheck:
        """Replays the runs of workflow ``name`` (of every version) against a new definition, as
        :meth:`replay_run` does each, and returns the verdicts summed.

        ``scope`` picks the runs: those in flight (RUNNING, COMPENSATING,
        PAUSED; the default) or the COMPLETED ones, newest first; with
        COMPLETED, ``limit`` stops after that many runs (the most recent), as
        ``composer workflow check --completed N`` does (a check of runs in
        flight covers every one of them, so a limit there is refused, as in
        the Go and TypeScript SDKs). The server replays
        ``page_size`` runs a call (at most 500) and this method fetches every
        page, each a call under the client's ``timeout``. The result counts
        each verdict and lists every run that is not identical. Definition
        arguments and their errors as :meth:`replay_run`; ``ValueError`` also
        for an empty ``name`` or a ``limit`` or ``page_size`` below 1.
        """
        if not name:
            raise ValueError("check_workflow_version needs the workflow's name")
        text, number = _new_definition("check_workflow_version", source, version)
        if limit is not None and scope != CheckScope.COMPLETED:
            raise ValueError("check_workflow_version: limit applies to CheckScope.COMPLETED only")
        if limit is not None and limit < 1:
            raise ValueError(f"check_workflow_version: limit must be at least 1, not {limit}")
        if page_size < 1:
            raise ValueError(f"check_workflow_version: page_size must be at least 1, not {page_size}")
        request = workflow_service_pb2.CheckWorkflowVersionRequest(
            name=name,
            source=text,
            version=number,
            node_mapping=dict(node_mapping or {}),
            scope=scope.to_proto(),  # type: ignore[arg-type]
            page_size=page_size,
        )
        pages: list[workflow_service_pb2.CheckWorkflowVersionResponse] = []
        checked = 0
        while limit is None or checked < limit:
            if limit is not None:
                request.page_size = min(page_size, limit - checked)
            page: workflow_service_pb2.CheckWorkflowVersionResponse = await self._call(
                self._conn.workflows.CheckWorkflowVersion, request
            )
            pages.append(page)
            checked += page.checked
            if not page.next_page_token:
                break
            request.page_token = page.next_page_token
        return _summed_check(pages)

    # --- runs -------------------------------------------------------------

    async def start_run(
        self,
        workflow: str,
        input: Any = None,
        *,
        version: int = 0,
        idempotency_key: str | None = None,
        labels: Mapping[str, str] | None = None,
        priority: int = 0,
    ) -> Run:
        """Starts a run of ``workflow`` (its latest version unless ``version``) with a JSON ``input``.

        An input whose compact JSON is longer than the server's
        ``payload_offload_bytes`` is uploaded first (:meth:`upload_blob`) and
        the run is started with its reference (docs/payloads.md).

        With an ``idempotency_key``, a repeated call returns the run the first
        call created, with ``created`` False, and starts nothing. ``priority``
        is 1 (lowest) to 5 (highest), 0 for the default 3: a waiting task of
        a higher-priority run is handed to workers first; outside 0-5 it is an
        InvalidArgumentError naming ``priority``. Called inside
        an OpenTelemetry span, it sends the span's W3C context: the run's trace
        continues the caller's.
        """
        request = run_service_pb2.StartRunRequest(
            workflow_name=workflow,
            version=version,
            idempotency_key=idempotency_key or "",
            labels=dict(labels or {}),
            priority=priority,
        )
        if input is not None:
            request.input.CopyFrom(await self._payload(input))
        response: run_service_pb2.StartRunResponse = await self._call(
            self._conn.runs.StartRun, request, _tracing.caller_metadata()
        )
        return Run.from_proto(response.run, created=response.created)

    async def get_run(self, run_id: str, *, skip_nodes: bool = False) -> Run:
        """A run with its node states (none with ``skip_nodes``, which keeps a
        wide run's poll cheap); NotFoundError if absent."""
        response: run_service_pb2.GetRunResponse = await self._call(
            self._conn.runs.GetRun, run_service_pb2.GetRunRequest(run_id=run_id, skip_nodes=skip_nodes)
        )
        return Run.from_proto(response.run)

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        statuses: Iterable[RunStatus] = (),
        labels: Mapping[str, str] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        parent_run_id: str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[Run]:
        """Iterates over the matching runs, newest first, fetching pages as it goes (no node states)."""
        request = run_service_pb2.ListRunsRequest(
            workflow_name=workflow or "",
            statuses=[s.to_proto() for s in statuses],  # type: ignore[misc]
            labels=dict(labels or {}),
            parent_run_id=parent_run_id or "",
            page_size=page_size,
        )
        if created_after is not None:
            request.create_time_after.FromDatetime(created_after)
        if created_before is not None:
            request.create_time_before.FromDatetime(created_before)
        async for response in self._pages(self._conn.runs.ListRuns, request):
            for run in response.runs:
                yield Run.from_proto(run)

    async def count_runs(
        self,
        *,
        workflow: str | None = None,
        version: int = 0,
        labels: Mapping[str, str] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        parent_run_id: str | None = None,
        search: str | None = None,
    ) -> RunCounts:
        """How many matching runs are in each status (every status present, 0 where none).

        The filters are list_runs' (``version`` needs ``workflow``);
        ``sum(counts.values())`` is the number of matching runs. The server
        counts up to its limit (100,000 matching runs): past it each count is
        a floor, and ``counts.more`` is True.
        """
        request = run_service_pb2.CountRunsRequest(
            workflow_name=workflow or "",
            workflow_version=version,
            labels=dict(labels or {}),
            parent_run_id=parent_run_id or "",
            search=search or "",
        )
        if created_after is not None:
            request.create_time_after.FromDatetime(created_after)
        if created_before is not None:
            request.create_time_before.FromDatetime(created_before)
        response: run_service_pb2.CountRunsResponse = await self._call(self._conn.runs.CountRuns, request)
        return run_counts_from_proto(response)

    async def cancel_run(self, run_id: str, reason: str = "") -> Run:
        """Cancels a running run (its workers see the cancellation at their next heartbeat).

        FailedPreconditionError when the run already ended.
        """
        response: run_service_pb2.CancelRunResponse = await self._call(
            self._conn.runs.CancelRun, run_service_pb2.CancelRunRequest(run_id=run_id, reason=reason)
        )
        return Run.from_proto(response.run)

    async def retry_run(self, run_id: str) -> Run:
        """Resumes a FAILED run from its failed nodes; FailedPreconditionError unless it is FAILED."""
        response: run_service_pb2.RetryRunResponse = await self._call(
            self._conn.runs.RetryRun, run_service_pb2.RetryRunRequest(run_id=run_id)
        )
        return Run.from_proto(response.run)

    async def pause_run(self, run_id: str, reason: str = "") -> Run:
        """Pauses a live run: it dispatches no new task and fires no timer until :meth:`resume_run`.

        Attempts already running finish and their results are applied, but the
        tasks they make ready are held; the run shows PAUSED. Child runs go on.
        Pausing a paused run changes nothing; FailedPreconditionError when the
        run already ended.
        """
        response: run_service_pb2.PauseRunResponse = await self._call(
            self._conn.runs.PauseRun, run_service_pb2.PauseRunRequest(run_id=run_id, reason=reason)
        )
        return Run.from_proto(response.run)

    async def resume_run(self, run_id: str) -> Run:
        """Resumes a paused run: held tasks are dispatched, timers that fell due fire.

        Resuming a run that is not paused changes nothing; FailedPreconditionError
        when the run already ended.
        """
        response: run_service_pb2.ResumeRunResponse = await self._call(
            self._conn.runs.ResumeRun, run_service_pb2.ResumeRunRequest(run_id=run_id)
        )
        return Run.from_proto(response.run)

    async def send_event(
        self,
        event_name: str,
        payload: Any = None,
        *,
        run_id: str | None = None,
        correlation_key: str | None = None,
        request_id: str | None = None,
    ) -> EventDelivery:
        """Sends a named event to one run (``run_id``) or to every run waiting on ``correlation_key``.

        The payload becomes the WAIT_FOR_EVENT node's output. With a
        ``request_id``, a repeated call delivers nothing new. A payload larger
        than the server's ``payload_offload_bytes`` is uploaded first and sent
        as its reference, as :meth:`start_run` does with an input.
        """
        if (run_id is None) == (correlation_key is None):
            raise ValueError("send_event needs exactly one of run_id and correlation_key")
        request = run_service_pb2.SendEventRequest(event_name=event_name, request_id=request_id or "")
        if run_id is not None:
            request.run_id = run_id
        else:
            request.correlation_key = correlation_key or ""
        if payload is not None:
            request.payload.CopyFrom(await self._payload(payload))
        response: run_service_pb2.SendEventResponse = await self._call(
            self._conn.runs.SendEvent, request, _tracing.caller_metadata()
        )
        return EventDelivery.from_proto(response)

    async def get_run_history(self, run_id: str, *, page_size: int = 100) -> AsyncIterator[HistoryEvent]:
        """Iterates over a run's history, oldest first, fetching pages as it goes."""
        request = run_service_pb2.GetRunHistoryRequest(run_id=run_id, page_size=page_size)
        async for response in self._pages(self._conn.runs.GetRunHistory, request):
            for event in response.events:
                yield HistoryEvent.from_proto(event)

    async def watch_run(self, run_id: str) -> AsyncGenerator[Run, None]:
        """Yields the run's snapshots (the current one first, then one per change) until it ends.

        Reconnects by itself when the stream breaks on UNAVAILABLE (the server
        answers a new watch with the current snapshot, so nothing is missed).
        Stop early with ``break`` (or ``contextlib.aclosing``): the stream is closed.
        """
        backoff = Backoff(initial=0.1, maximum=2.0)
        failures = 0
        while True:
            call = self._conn.runs.WatchRun(
                run_service_pb2.WatchRunRequest(run_id=run_id),
                metadata=self._conn.metadata,
                wait_for_ready=self._wait_for_ready,
            )
            try:
                async for response in call:
                    failures = 0
                    run = Run.from_proto(response.run)
                    yield run
                    if run.status.is_final:
                        return
            except grpc.RpcError as error:
                converted = from_rpc_error(error)
                if not converted.retryable:
                    raise converted from None
                log.debug("watch of run %s broke (%s); watching again", run_id, converted.code.name)
            finally:
                call.cancel()
            # The stream broke, or ended without a final snapshot: watch again.
            failures += 1
            await asyncio.sleep(backoff.delay(failures))

    async def wait_for_run(self, run_id: str, *, timeout: float | None = None) -> Run:
        """Waits (over WatchRun) until the run ends and returns it, whatever its final status.

        Raises ``TimeoutError`` when ``timeout`` seconds pass first.
        """
        async def final() -> Run:
            async with contextlib.aclosing(self.watch_run(run_id)) as snapshots:
                async for run in snapshots:
                    if run.status.is_final:
                        return run
            raise ComposerError(grpc.StatusCode.INTERNAL, f"watch of run {run_id} ended without a final status")

        try:
            return await asyncio.wait_for(final(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"run {run_id} did not end within {timeout} s") from None

    async def wait_for_result(self, run_id: str, *, timeout: float | None = None) -> Any:
        """Waits until the run ends and returns its output, every blob reference in it resolved
        (:meth:`resolve_payload`; :meth:`get_run` shows the references as stored).

        Raises :class:`~composer.errors.RunFailedError` (carrying the final
        run) when it ends FAILED or CANCELLED, ``TimeoutError`` after
        ``timeout`` seconds.
        """
        run = await self.wait_for_run(run_id, timeout=timeout)
        if run.status is not RunStatus.COMPLETED:
            raise RunFailedError(run)
        return await self.resolve_payload(run.output)

    async def run_workflow(
        self,
        workflow: str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Starts a run and waits for its output (start_run + wait_for_result)."""
        started = time.monotonic()
        run = await self.start_run(workflow, input, idempotency_key=idempotency_key)
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        return await self.wait_for_result(run.run_id, timeout=left)

    # --- large payloads ---------------------------------------------------

    async def upload_blob(self, data: bytes) -> BlobRef:
        """Stores ``data`` (the JSON text of one value, as UTF-8) in the namespace's blob store and
        returns its :class:`~composer.BlobRef`; ``ref.reference()`` is the object to put in a
        value in its stead (docs/payloads.md).

        When the server gives presigned URLs (``server_info().blob_urls``) the
        bytes go straight to its blob store: StartBlobUpload, one HTTP PUT to the
        URL, FinishBlobUpload; a PUT that fails sends them through the server's
        stream instead, and a server that stops giving URLs (FAILED_PRECONDITION)
        gets the stream from then on. The stream carries chunks of at most
        1 MiB. Uploading bytes already stored returns the same reference. The
        client's ``timeout`` bounds the whole upload. The server keeps the bytes
        as they are (an expression that looks into a blob that is not JSON reads
        null); ResourceExhaustedError past its ``max_payload_bytes``.
        """
        await self._learn_blob_urls()
        return await _payloads.upload(
            self._conn, data, timeout=self._timeout, wait_for_ready=self._wait_for_ready, urls=self._blob_urls
        )

    async def download_blob(self, sha256: str) -> bytes:
        """The bytes of the namespace's blob ``sha256`` (a reference's ``sha256``).

        When the server gives presigned URLs they come straight from its blob
        store (GetBlobUrl, one HTTP GET), else (or when that GET fails) from its
        stream; a stream download broken by UNAVAILABLE goes on from where it
        stopped. The bytes are checked against the digest. ValueError for a
        malformed ``sha256``; NotFoundError when the namespace has no such blob
        (another namespace's blobs are never readable).
        """
        await self._learn_blob_urls()
        return await _payloads.download(
            self._conn, sha256, timeout=self._timeout, wait_for_ready=self._wait_for_ready, urls=self._blob_urls
        )

    async def resolve_payload(self, value: Any) -> Any:
        """A copy of ``value`` with every blob reference at any depth (an object whose only key is
        ``$blob``) replaced by the JSON value it names, as :meth:`get_run` or the history show them.

        Each distinct blob is downloaded once. ValueError (naming the path) when
        a ``$blob`` object names no sha256 or a blob is not JSON; NotFoundError
        as :meth:`download_blob`.
        """
        return await _payloads.resolve(value, self.download_blob)

    async def _payload(self, value: Any) -> struct_pb2.Value:
        """The wire form of a run's input or an event's payload: the value itself, or the reference
        of its upload when its compact JSON is longer than the server's threshold."""
        threshold = await self._offload_threshold()
        text = _payloads.oversized_json(value, threshold)
        if text is None:
            return to_value(value)
        blob = await self.upload_blob(text)
        log.debug("payload of %d bytes sent as blob %s", blob.size, blob.sha256)
        return to_value(blob.reference())

    async def _offload_threshold(self) -> int:
        """The server's ``payload_offload_bytes``, asked once (GetServerInfo) and kept; 0 (never
        offload) for a server without GetServerInfo."""
        if self._offload_bytes is None:
            try:
                await self.server_info()
            except UnimplementedError:
                self._offload_bytes = 0
        assert self._offload_bytes is not None
        return self._offload_bytes

    async def _learn_blob_urls(self) -> None:
        """Asks the server once (with the threshold) whether it gives blob URLs; a server that cannot
        be asked now gets this transfer through its streams (and is asked again next time)."""
        if self._offload_bytes is None:
            try:
                await self._offload_threshold()
            except ComposerError as error:
                log.debug("could not ask the server whether it gives blob URLs (%s)", error.code.name)

    # --- bulk operations --------------------------------------------------

    async def bulk_cancel_runs(
        self,
        filter: RunFilter | None = None,
        *,
        all: bool = False,
        reason: str = "",
        request_id: str | None = None,
    ) -> BulkOperation:
        """Starts a bulk operation that cancels every run ``filter`` matches, as cancel_run would.

        It returns at once with the operation (PENDING or RUNNING); follow it
        with :meth:`wait_bulk_operation` or :meth:`get_bulk_operation`. Runs
        that ended before their turn count as skipped, and only runs created
        before the operation are matched. An empty filter is a
        FailedPreconditionError unless ``all`` (every run of the namespace);
        a bad filter field an InvalidArgumentError naming ``filter.<field>``.
        With a ``request_id``, a repeated call returns the first call's
        operation (``created`` False) and starts nothing.
        """
        request = run_service_pb2.BulkCancelRunsRequest(
            filter=_run_filter(filter), all=all, reason=reason, request_id=request_id or ""
        )
        response: run_service_pb2.BulkCancelRunsResponse = await self._call(self._conn.runs.BulkCancelRuns, request)
        return BulkOperation.from_proto(response.operation, created=response.created)

    async def bulk_retry_runs(
        self, filter: RunFilter | None = None, *, all: bool = False, request_id: str | None = None
    ) -> BulkOperation:
        """Starts a bulk operation that retries every FAILED run ``filter`` matches, as retry_run would.

        A matching run that is not FAILED when its turn comes counts as
        skipped. Filter, ``all`` and ``request_id`` as :meth:`bulk_cancel_runs`.
        """
        request = run_service_pb2.BulkRetryRunsRequest(filter=_run_filter(filter), all=all, request_id=request_id or "")
        response: run_service_pb2.BulkRetryRunsResponse = await self._call(self._conn.runs.BulkRetryRuns, request)
        return BulkOperation.from_proto(response.operation, created=response.created)

    async def bulk_pause_runs(
        self,
        filter: RunFilter | None = None,
        *,
        all: bool = False,
        reason: str = "",
        request_id: str | None = None,
    ) -> BulkOperation:
        """Starts a bulk operation that pauses every live run ``filter`` matches, as pause_run would.

        Filter, ``all`` and ``request_id`` as :meth:`bulk_cancel_runs`.
        """
        request = run_service_pb2.BulkPauseRunsRequest(
            filter=_run_filter(filter), all=all, reason=reason, request_id=request_id or ""
        )
        response: run_service_pb2.BulkPauseRunsResponse = await self._call(self._conn.runs.BulkPauseRuns, request)
        return BulkOperation.from_proto(response.operation, created=response.created)

    async def bulk_resume_runs(
        self, filter: RunFilter | None = None, *, all: bool = False, request_id: str | None = None
    ) -> BulkOperation:
        """Starts a bulk operation that resumes every PAUSED run ``filter`` matches, as resume_run would.

        Filter, ``all`` and ``request_id`` as :meth:`bulk_cancel_runs`.
        """
        request = run_service_pb2.BulkResumeRunsRequest(filter=_run_filter(filter), all=all, request_id=request_id or "")
        response: run_service_pb2.BulkResumeRunsResponse = await self._call(self._conn.runs.BulkResumeRuns, request)
        return BulkOperation.from_proto(response.operation, created=response.created)

    async def migrate_runs(
        self,
        filter: RunFilter,
        target_version: int,
        *,
        node_mapping: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> BulkOperation:
        """Starts a bulk operation that moves every run in flight (RUNNING or PAUSED) of one workflow
        that ``filter`` matches to its version ``target_version`` (docs/versions.md).

        Each run is replayed against the target (as :meth:`replay_run`) and
        moved only if the verdict is IDENTICAL or COMPATIBLE: it records
        ``run_migrated`` in its history and goes on under the target, its
        leased tasks keeping their leases. An incompatible run stays on its
        version and counts as ``failed``, its divergence in ``failures``; a run
        already on the target, ended, or compensating counts as ``skipped``.
        ``node_mapping`` maps node ids renamed in the target, recorded id to new
        id. Follow the operation with :meth:`wait_bulk_operation`; its
        ``kind`` is MIGRATE and it carries ``target_version`` and
        ``node_mapping``. ``request_id`` as :meth:`bulk_cancel_runs`.

        Raises ``ValueError`` before any call when the filter names no
        ``workflow_name`` or ``target_version`` is below 1;
        InvalidArgumentError naming the field when the target is not a
        registered version of the workflow or a filter field is bad.
        """
        if not filter.workflow_name:
            raise ValueError("migrate_runs needs filter.workflow_name: it moves the runs of one workflow")
        if target_version < 1:
            raise ValueError(f"migrate_runs: target_version must be positive, not {target_version}")
        request = run_service_pb2.MigrateRunsRequest(
            filter=filter.to_proto(),
            target_version=target_version,
            node_mapping=dict(node_mapping or {}),
            request_id=request_id or "",
        )
        response: run_service_pb2.MigrateRunsResponse = await self._call(self._conn.runs.MigrateRuns, request)
        return BulkOperation.from_proto(response.operation, created=response.created)

    async def get_bulk_operation(self, operation_id: str) -> BulkOperation:
        """A bulk operation with its progress and counts; NotFoundError if absent."""
        response: run_service_pb2.GetBulkOperationResponse = await self._call(
            self._conn.runs.GetBulkOperation, run_service_pb2.GetBulkOperationRequest(operation_id=operation_id)
        )
        return BulkOperation.from_proto(response.operation)

    async def list_bulk_operations(self, *, page_size: int = 100) -> AsyncIterator[BulkOperation]:
        """Iterates over the namespace's bulk operations, newest first, fetching pages as it goes."""
        request = run_service_pb2.ListBulkOperationsRequest(page_size=page_size)
        async for response in self._pages(self._conn.runs.ListBulkOperations, request):
            for operation in response.operations:
                yield BulkOperation.from_proto(operation)

    async def cancel_bulk_operation(self, operation_id: str) -> BulkOperation:
        """Stops a bulk operation after the run it is on; runs already acted on stay as they are.

        The answer is CANCELLED, or RUNNING until its server sees the request
        (within one batch). Cancelling one already being cancelled is OK; one
        that ended is a FailedPreconditionError.
        """
        response: run_service_pb2.CancelBulkOperationResponse = await self._call(
            self._conn.runs.CancelBulkOperation,
            run_service_pb2.CancelBulkOperationRequest(operation_id=operation_id),
        )
        return BulkOperation.from_proto(response.operation)

    async def wait_bulk_operation(self, operation_id: str, *, timeout: float | None = None) -> BulkOperation:
        """Polls a bulk operation until it ends (SUCCEEDED, CANCELLED or FAILED) and returns it.

        The polls back off from 0.1 s to 2 s; a poll that meets UNAVAILABLE or
        DEADLINE_EXCEEDED is made again. Raises ``TimeoutError`` when
        ``timeout`` seconds pass first, NotFoundError for an unknown id.
        """
        async def ended() -> BulkOperation:
            polls = 0
            while True:
                polls += 1
                try:
                    operation = await self.get_bulk_operation(operation_id)
                    if operation.status.is_final:
                        return operation
                except ComposerError as error:
                    if not error.retryable:
                        raise
                    log.debug("poll of bulk operation %s failed (%s); polling again", operation_id, error.code.name)
                await asyncio.sleep(_BULK_POLL.delay(polls))

        try:
            return await asyncio.wait_for(ended(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"bulk operation {operation_id} did not end within {timeout} s") from None

    # --- schedules --------------------------------------------------------

    async def create_schedule(
        self,
        schedule_id: str,
        workflow: str,
        input: Any = None,
        *,
        cron: str | None = None,
        time_zone: str | None = None,
        interval: Seconds | None = None,
        version: int = 0,
        labels: Mapping[str, str] | None = None,
        overlap_policy: OverlapPolicy = OverlapPolicy.SKIP,
        catch_up_window: Seconds | None = None,
        jitter: Seconds | None = None,
        paused: bool = False,
        note: str = "",
    ) -> Schedule:
        """Creates a schedule that starts runs of ``workflow`` (latest version unless ``version``) with ``input``.

        It fires on ``cron`` (5 fields, or 6 with seconds first, read in
        ``time_zone``, UTC when None) or every ``interval`` (seconds or a
        ``timedelta``, at least 1 s): give exactly one. Each fire's run carries
        ``labels`` plus ``composer.schedule`` (the id) and ``composer.fire_time``,
        and an idempotency key of the schedule and fire time, so one fire
        starts one run however many servers run. ``overlap_policy`` says what
        a fire does while the previous run still runs; ``catch_up_window``
        (1 s to 7 days, default 60 s) how late a missed fire may start;
        ``jitter`` the most a fire's start is delayed. See docs/schedules.md.

        InvalidArgumentError names the field (``spec.cron``, ``spec.time_zone``,
        ``spec.interval``, ``action.input...``); NotFoundError when the workflow
        (or version) does not exist; AlreadyExistsError when the id is taken.
        """
        spec, action = _schedule_parts(
            workflow, input, cron=cron, time_zone=time_zone, interval=interval, version=version, labels=labels
        )
        request = schedule_service_pb2.CreateScheduleRequest(
            schedule_id=schedule_id,
            spec=spec,
            action=action,
            overlap_policy=overlap_policy.to_proto(),  # type: ignore[arg-type]
            paused=paused,
            note=note,
        )
        if catch_up_window is not None:
            request.catch_up_window.CopyFrom(_duration(catch_up_window))
        if jitter is not None:
            request.jitter.CopyFrom(_duration(jitter))
        response: schedule_service_pb2.CreateScheduleResponse = await self._call(
            self._conn.schedules.CreateSchedule, request
        )
        return Schedule.from_proto(response.schedule)

    async def get_schedule(self, schedule_id: str) -> Schedule:
        """A schedule with its recent fires, next fire times and counters; NotFoundError if absent."""
        response: schedule_service_pb2.GetScheduleResponse = await self._call(
            self._conn.schedules.GetSchedule, schedule_service_pb2.GetScheduleRequest(schedule_id=schedule_id)
        )
        return Schedule.from_proto(response.schedule)

    async def list_schedules(self, *, page_size: int = 100) -> AsyncIterator[Schedule]:
        """Iterates over the namespace's schedules by id, fetching pages as it goes."""
        request = schedule_service_pb2.ListSchedulesRequest(page_size=page_size)
        async for response in self._pages(self._conn.schedules.ListSchedules, request):
            for schedule in response.schedules:
                yield Schedule.from_proto(schedule)

    async def update_schedule(
        self,
        schedule_id: str,
        workflow: str,
        input: Any = None,
        *,
        cron: str | None = None,
        time_zone: str | None = None,
        interval: Seconds | None = None,
        version: int = 0,
        labels: Mapping[str, str] | None = None,
        overlap_policy: OverlapPolicy = OverlapPolicy.SKIP,
        catch_up_window: Seconds | None = None,
        jitter: Seconds | None = None,
    ) -> Schedule:
        """Replaces a schedule's definition (the arguments of :meth:`create_schedule`), checked the same way.

        Counters and recent fires stay, paused stays as it was; the next fire
        time is computed anew from now and a buffered fire is dropped.
        NotFoundError when the schedule does not exist.
        """
        spec, action = _schedule_parts(
            workflow, input, cron=cron, time_zone=time_zone, interval=interval, version=version, labels=labels
        )
        request = schedule_service_pb2.UpdateScheduleRequest(
            schedule_id=schedule_id,
            spec=spec,
            action=action,
            overlap_policy=overlap_policy.to_proto(),  # type: ignore[arg-type]
        )
        if catch_up_window is not None:
            request.catch_up_window.CopyFrom(_duration(catch_up_window))
        if jitter is not None:
            request.jitter.CopyFrom(_duration(jitter))
        response: schedule_service_pb2.UpdateScheduleResponse = await self._call(
            self._conn.schedules.UpdateSchedule, request
        )
        return Schedule.from_proto(response.schedule)

    async def pause_schedule(self, schedule_id: str, note: str = "") -> Schedule:
        """Stops a schedule's fires until :meth:`resume_schedule`, keeping ``note`` (why)."""
        response: schedule_service_pb2.PauseScheduleResponse = await self._call(
            self._conn.schedules.PauseSchedule,
            schedule_service_pb2.PauseScheduleRequest(schedule_id=schedule_id, note=note),
        )
        return Schedule.from_proto(response.schedule)

    async def resume_schedule(self, schedule_id: str, note: str = "") -> Schedule:
        """Lets a paused schedule fire again from its first fire time after now.

        Fires that fell in the pause are neither started nor counted as missed.
        """
        response: schedule_service_pb2.ResumeScheduleResponse = await self._call(
            self._conn.schedules.ResumeSchedule,
            schedule_service_pb2.ResumeScheduleRequest(schedule_id=schedule_id, note=note),
        )
        return Schedule.from_proto(response.schedule)

    async def delete_schedule(self, schedule_id: str) -> None:
        """Deletes a schedule (the runs it started stay); NotFoundError if absent."""
        await self._call(
            self._conn.schedules.DeleteSchedule, schedule_service_pb2.DeleteScheduleRequest(schedule_id=schedule_id)
        )

    async def trigger_schedule(self, schedule_id: str) -> ScheduleFire:
        """Fires a schedule now, paused or not, under its overlap policy, and returns the fire.

        A fire whose run could not start has outcome FAILED and the reason in
        the schedule's ``last_error``.
        """
        response: schedule_service_pb2.TriggerScheduleResponse = await self._call(
            self._conn.schedules.TriggerSchedule, schedule_service_pb2.TriggerScheduleRequest(schedule_id=schedule_id)
        )
        return ScheduleFire.from_proto(response.fire)

    # --- queues -----------------------------------------------------------

    async def set_queue_rate_limit(
        self,
        queue: str,
        per_second: float = 0.0,
        *,
        burst: int = 0,
        per_key_per_second: float = 0.0,
        per_key_burst: int = 0,
    ) -> QueueRateLimit:
        """Creates or replaces ``queue``'s rate limit and returns it as stored (docs/rate-limits.md).

        ``per_second`` bounds the whole queue (fractions allowed, 0: no
        queue-wide limit), ``burst`` the tasks handed out in any one-second
        window (0: ``per_second`` rounded up); ``per_key_per_second`` and
        ``per_key_burst`` do the same for each distinct ``rate_limit_key``.
        Every server applies it within about a second. InvalidArgumentError
        names the field (``limit.queue``, ``limit.per_second``, ``limit.burst``
        under the rate, ...); ResourceExhaustedError when the namespace
        already holds 1,000 limits.
        """
        limit = queue_service_pb2.QueueRateLimit(
            queue=queue,
            per_second=per_second,
            burst=burst,
            per_key_per_second=per_key_per_second,
            per_key_burst=per_key_burst,
        )
        response: queue_service_pb2.SetQueueRateLimitResponse = await self._call(
            self._conn.queues.SetQueueRateLimit, queue_service_pb2.SetQueueRateLimitRequest(limit=limit)
        )
        return QueueRateLimit.from_proto(response.limit)

    async def get_queue_rate_limit(self, queue: str) -> QueueRateLimit:
        """A queue's rate limit; NotFoundError when the queue has none."""
        response: queue_service_pb2.GetQueueRateLimitResponse = await self._call(
            self._conn.queues.GetQueueRateLimit, queue_service_pb2.GetQueueRateLimitRequest(queue=queue)
        )
        return QueueRateLimit.from_proto(response.limit)

    async def list_queue_rate_limits(self, *, page_size: int = 100) -> AsyncIterator[QueueRateLimit]:
        """Iterates over the namespace's rate limits by queue name, fetching pages as it goes."""
        request = queue_service_pb2.ListQueueRateLimitsRequest(page_size=page_size)
        async for response in self._pages(self._conn.queues.ListQueueRateLimits, request):
            for limit in response.limits:
                yield QueueRateLimit.from_proto(limit)

    async def delete_queue_rate_limit(self, queue: str) -> None:
        """Removes a queue's rate limit (its tasks go out unlimited within about a second); NotFoundError if absent."""
        await self._call(
            self._conn.queues.DeleteQueueRateLimit, queue_service_pb2.DeleteQueueRateLimitRequest(queue=queue)
        )

    # --- secrets ----------------------------------------------------------

    async def set_secret(self, name: str, value: SecretValue) -> Secret:
        """Stores a new version of the secret ``name`` and returns it, without its value
        (docs/secrets.md): version 1 at first, one more at each set; a run's node uses the version
        current when it executes, as ``${secrets.NAME}``.

        ``value`` is 1 byte to 64 KiB; a ``str`` goes as UTF-8. No call returns it, the client
        neither logs it nor puts it in an error, and keeps nothing of it after the call.
        InvalidArgumentError names the field (``name`` breaking the name rule, ``value`` empty or
        too long); ResourceExhaustedError when the namespace holds 1,000 secrets and ``name`` is
        new; FailedPreconditionError when the server was given no secrets key
        (``--secrets-key-file``); PermissionDeniedError unless the token is an operator's or an
        admin's.
        """
        request = secret_service_pb2.SetSecretRequest(name=name)
        try:
            request.value = _secret_bytes(value)
            response: secret_service_pb2.SetSecretResponse = await self._call(self._conn.secrets.SetSecret, request)
        except _SET_SECRET_ERRORS as error:
            raise _without_frames(error) from None
        finally:
            # This frame outlives the call in an error's traceback: it keeps neither.
            request.Clear()
            value = b""
        return Secret.from_proto(response.secret)

    async def list_secrets(self, *, page_size: int = 100) -> AsyncIterator[Secret]:
        """Iterates over the namespace's secrets by name (names, versions and times, never values),
        fetching pages as it goes."""
        request = secret_service_pb2.ListSecretsRequest(page_size=page_size)
        async for response in self._pages(self._conn.secrets.ListSecrets, request):
            for secret in response.secrets:
                yield Secret.from_proto(secret)

    async def delete_secret(self, name: str) -> None:
        """Removes a secret and every version of it: a node that names it afterwards fails with
        SECRET_NOT_FOUND. NotFoundError when there is none."""
        await self._call(self._conn.secrets.DeleteSecret, secret_service_pb2.DeleteSecretRequest(name=name))


class _LoopThread:
    """A private event loop in a daemon thread, which the sync facade submits coroutines to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="composer-client", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stop(self) -> None:
        # gRPC leaves a task per finished call that resolves a moment later:
        # let those end (cancel what is left) so closing the loop never warns
        # "Task was destroyed but it is pending!" at the user's exit.
        try:
            self.run(_settle_pending_tasks())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()


async def _settle_pending_tasks() -> None:
    """Waits briefly for the loop's other tasks, then cancels the rest."""
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks() if task is not current]
    if not pending:
        return
    _, still_pending = await asyncio.wait(pending, timeout=1.0)
    for task in still_pending:
        task.cancel()
    await asyncio.gather(*still_pending, return_exceptions=True)


class SyncClient:
    """The blocking facade of :class:`Client`, for scripts: same methods, same arguments.

    It runs its own event loop in a background thread, so it also works where
    a loop is already running (a notebook). Use it as a context manager, or
    call :meth:`close`. Iterating methods return ordinary iterators.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str | None = None,
        tls: bool | grpc.ChannelCredentials | None = None,
        timeout: float = 30.0,
        wait_for_ready: bool = True,
    ) -> None:
        self._loop = _LoopThread()

        async def make() -> Client:
            return Client(address, token=token, tls=tls, timeout=timeout, wait_for_ready=wait_for_ready)

        try:
            self._client = self._loop.run(make())
        except BaseException:
            # A malformed address: no thread is left behind.
            self._loop.stop()
            raise

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection and stops the background loop."""
        self._loop.run(self._client.close())
        self._loop.stop()

    def _iterate(self, iterator: AsyncIterator[T]) -> Iterator[T]:
        async def step() -> tuple[bool, T | None]:
            try:
                return True, await iterator.__anext__()
            except StopAsyncIteration:
                return False, None

        async def close() -> None:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()

        finished = False
        try:
            while True:
                more, item = self._loop.run(step())
                if not more:
                    finished = True
                    return
                yield item  # type: ignore[misc]
        finally:
            # A caller that stops early (break, an exception) closes the stream or the paging.
            if not finished and self._loop.loop.is_running():
                self._loop.run(close())

    def _run(self, awaitable: Awaitable[T]) -> T:
        async def wrap() -> T:
            return await awaitable

        return self._loop.run(wrap())

    def server_info(self) -> ServerInfo:
        """See :meth:`Client.server_info`."""
        return self._run(self._client.server_info())

    def check_protocol(self) -> ServerInfo:
        """See :meth:`Client.check_protocol`."""
        return self._run(self._client.check_protocol())

    def register_workflow(self, source: WorkflowSource) -> WorkflowVersion:
        """See :meth:`Client.register_workflow`."""
        return self._run(self._client.register_workflow(source))

    def validate_workflow(self, source: WorkflowSource) -> list[ValidationProblem]:
        """See :meth:`Client.validate_workflow`."""
        return self._run(self._client.validate_workflow(source))

    def get_workflow(self, name: str, version: int = 0) -> WorkflowVersion:
        """See :meth:`Client.get_workflow`."""
        return self._run(self._client.get_workflow(name, version))

    def list_workflows(self, *, name_prefix: str = "", page_size: int = 100) -> Iterator[WorkflowSummary]:
        """See :meth:`Client.list_workflows`."""
        return self._iterate(self._client.list_workflows(name_prefix=name_prefix, page_size=page_size))

    def list_workflow_versions(self, name: str, *, page_size: int = 100) -> Iterator[WorkflowVersion]:
        """See :meth:`Client.list_workflow_versions`."""
        return self._iterate(self._client.list_workflow_versions(name, page_size=page_size))

    def replay_run(
        self,
        run_id: str | None = None,
        *,
        history: RecordedHistory | None = None,
        source: WorkflowSource | None = None,
        version: int | None = None,
        node_mapping: Mapping[str, str] | None = None,
    ) -> RunReplay:
        """See :meth:`Client.replay_run`."""
        return self._run(
            self._client.replay_run(
                run_id, history=history, source=source, version=version, node_mapping=node_mapping
            )
        )

    def check_workflow_version(
        self,
        name: str,
        *,
        source: WorkflowSource | None = None,
        version: int | None = None,
        node_mapping: Mapping[str, str] | None = None,
        scope: CheckScope = CheckScope.IN_FLIGHT,
        limit: int | None = None,
        page_size: int = _CHECK_PAGE,
    ) -> WorkflowVersionCheck:
        """See :meth:`Client.check_workflow_version`."""
        return self._run(
            self._client.check_workflow_version(
                name,
                source=source,
                version=version,
                node_mapping=node_mapping,
                scope=scope,
                limit=limit,
                page_size=page_size,
            )
        )

    def start_run(
        self,
        workflow: str,
        input: Any = None,
        *,
        version: int = 0,
        idempotency_key: str | None = None,
        labels: Mapping[str, str] | None = None,
        priority: int = 0,
    ) -> Run:
        """See :meth:`Client.start_run`."""
        return self._run(
            self._client.start_run(
                workflow, input, version=version, idempotency_key=idempotency_key, labels=labels, priority=priority
            )
        )

    def get_run(self, run_id: str, *, skip_nodes: bool = False) -> Run:
        """See :meth:`Client.get_run`."""
        return self._run(self._client.get_run(run_id, skip_nodes=skip_nodes))

    def list_runs(
        self,
        *,
        workflow: str | None = None,
        statuses: Iterable[RunStatus] = (),
        labels: Mapping[str, str] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        parent_run_id: str | None = None,
        page_size: int = 100,
    ) -> Iterator[Run]:
        """See :meth:`Client.list_runs`."""
        return self._iterate(
            self._client.list_runs(
                workflow=workflow,
                statuses=statuses,
                labels=labels,
                created_after=created_after,
                created_before=created_before,
                parent_run_id=parent_run_id,
                page_size=page_size,
            )
        )

    def count_runs(
        self,
        *,
        workflow: str | None = None,
        version: int = 0,
        labels: Mapping[str, str] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        parent_run_id: str | None = None,
        search: str | None = None,
    ) -> RunCounts:
        """See :meth:`Client.count_runs`."""
        return self._run(
            self._client.count_runs(
                workflow=workflow,
                version=version,
                labels=labels,
                created_after=created_after,
                created_before=created_before,
                parent_run_id=parent_run_id,
                search=search,
            )
        )

    def cancel_run(self, run_id: str, reason: str = "") -> Run:
        """See :meth:`Client.cancel_run`."""
        return self._run(self._client.cancel_run(run_id, reason))

    def retry_run(self, run_id: str) -> Run:
        """See :meth:`Client.retry_run`."""
        return self._run(self._client.retry_run(run_id))

    def pause_run(self, run_id: str, reason: str = "") -> Run:
        """See :meth:`Client.pause_run`."""
        return self._run(self._client.pause_run(run_id, reason))

    def resume_run(self, run_id: str) -> Run:
        """See :meth:`Client.resume_run`."""
        return self._run(self._client.resume_run(run_id))

    def send_event(
        self,
        event_name: str,
        payload: Any = None,
        *,
        run_id: str | None = None,
        correlation_key: str | None = None,
        request_id: str | None = None,
    ) -> EventDelivery:
        """See :meth:`Client.send_event`."""
        return self._run(
            self._client.send_event(
                event_name, payload, run_id=run_id, correlation_key=correlation_key, request_id=request_id
            )
        )

    def get_run_history(self, run_id: str, *, page_size: int = 100) -> Iterator[HistoryEvent]:
        """See :meth:`Client.get_run_history`."""
        return self._iterate(self._client.get_run_history(run_id, page_size=page_size))

    def watch_run(self, run_id: str) -> Iterator[Run]:
        """See :meth:`Client.watch_run`: the run's snapshots until it ends; stop early with ``break``."""
        return self._iterate(self._client.watch_run(run_id))

    def wait_for_run(self, run_id: str, *, timeout: float | None = None) -> Run:
        """See :meth:`Client.wait_for_run`."""
        return self._run(self._client.wait_for_run(run_id, timeout=timeout))

    def wait_for_result(self, run_id: str, *, timeout: float | None = None) -> Any:
        """See :meth:`Client.wait_for_result`."""
        return self._run(self._client.wait_for_result(run_id, timeout=timeout))

    def run_workflow(
        self, workflow: str, input: Any = None, *, idempotency_key: str | None = None, timeout: float | None = None
    ) -> Any:
        """See :meth:`Client.run_workflow`."""
        return self._run(
            self._client.run_workflow(workflow, input, idempotency_key=idempotency_key, timeout=timeout)
        )

    def bulk_cancel_runs(
        self,
        filter: RunFilter | None = None,
        *,
        all: bool = False,
        reason: str = "",
        request_id: str | None = None,
    ) -> BulkOperation:
        """See :meth:`Client.bulk_cancel_runs`."""
        return self._run(self._client.bulk_cancel_runs(filter, all=all, reason=reason, request_id=request_id))

    def bulk_retry_runs(
        self, filter: RunFilter | None = None, *, all: bool = False, request_id: str | None = None
    ) -> BulkOperation:
        """See :meth:`Client.bulk_retry_runs`."""
        return self._run(self._client.bulk_retry_runs(filter, all=all, request_id=request_id))

    def bulk_pause_runs(
        self,
        filter: RunFilter | None = None,
        *,
        all: bool = False,
        reason: str = "",
        request_id: str | None = None,
    ) -> BulkOperation:
        """See :meth:`Client.bulk_pause_runs`."""
        return self._run(self._client.bulk_pause_runs(filter, all=all, reason=reason, request_id=request_id))

    def bulk_resume_runs(
        self, filter: RunFilter | None = None, *, all: bool = False, request_id: str | None = None
    ) -> BulkOperation:
        """See :meth:`Client.bulk_resume_runs`."""
        return self._run(self._client.bulk_resume_runs(filter, all=all, request_id=request_id))

    def migrate_runs(
        self,
        filter: RunFilter,
        target_version: int,
        *,
        node_mapping: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> BulkOperation:
        """See :meth:`Client.migrate_runs`."""
        return self._run(
            self._client.migrate_runs(filter, target_version, node_mapping=node_mapping, request_id=request_id)
        )

    def get_bulk_operation(self, operation_id: str) -> BulkOperation:
        """See :meth:`Client.get_bulk_operation`."""
        return self._run(self._client.get_bulk_operation(operation_id))

    def list_bulk_operations(self, *, page_size: int = 100) -> Iterator[BulkOperation]:
        """See :meth:`Client.list_bulk_operations`."""
        return self._iterate(self._client.list_bulk_operations(page_size=page_size))

    def cancel_bulk_operation(self, operation_id: str) -> BulkOperation:
        """See :meth:`Client.cancel_bulk_operation`."""
        return self._run(self._client.cancel_bulk_operation(operation_id))

    def wait_bulk_operation(self, operation_id: str, *, timeout: float | None = None) -> BulkOperation:
        """See :meth:`Client.wait_bulk_operation`."""
        return self._run(self._client.wait_bulk_operation(operation_id, timeout=timeout))

    def create_schedule(
        self,
        schedule_id: str,
        workflow: str,
        input: Any = None,
        *,
        cron: str | None = None,
        time_zone: str | None = None,
        interval: Seconds | None = None,
        version: int = 0,
        labels: Mapping[str, str] | None = None,
        overlap_policy: OverlapPolicy = OverlapPolicy.SKIP,
        catch_up_window: Seconds | None = None,
        jitter: Seconds | None = None,
        paused: bool = False,
        note: str = "",
    ) -> Schedule:
        """See :meth:`Client.create_schedule`."""
        return self._run(
            self._client.create_schedule(
                schedule_id,
                workflow,
                input,
                cron=cron,
                time_zone=time_zone,
                interval=interval,
                version=version,
                labels=labels,
                overlap_policy=overlap_policy,
                catch_up_window=catch_up_window,
                jitter=jitter,
                paused=paused,
                note=note,
            )
        )

    def get_schedule(self, schedule_id: str) -> Schedule:
        """See :meth:`Client.get_schedule`."""
        return self._run(self._client.get_schedule(schedule_id))

    def list_schedules(self, *, page_size: int = 100) -> Iterator[Schedule]:
        """See :meth:`Client.list_schedules`."""
        return self._iterate(self._client.list_schedules(page_size=page_size))

    def update_schedule(
        self,
        schedule_id: str,
        workflow: str,
        input: Any = None,
        *,
        cron: str | None = None,
        time_zone: str | None = None,
        interval: Seconds | None = None,
        version: int = 0,
        labels: Mapping[str, str] | None = None,
        overlap_policy: OverlapPolicy = OverlapPolicy.SKIP,
        catch_up_window: Seconds | None = None,
        jitter: Seconds | None = None,
    ) -> Schedule:
        """See :meth:`Client.update_schedule`."""
        return self._run(
            self._client.update_schedule(
                schedule_id,
                workflow,
                input,
                cron=cron,
                time_zone=time_zone,
                interval=interval,
                version=version,
                labels=labels,
                overlap_policy=overlap_policy,
                catch_up_window=catch_up_window,
                jitter=jitter,
            )
        )

    def pause_schedule(self, schedule_id: str, note: str = "") -> Schedule:
        """See :meth:`Client.pause_schedule`."""
        return self._run(self._client.pause_schedule(schedule_id, note))

    def resume_schedule(self, schedule_id: str, note: str = "") -> Schedule:
        """See :meth:`Client.resume_schedule`."""
        return self._run(self._client.resume_schedule(schedule_id, note))

    def delete_schedule(self, schedule_id: str) -> None:
        """See :meth:`Client.delete_schedule`."""
        self._run(self._client.delete_schedule(schedule_id))

    def trigger_schedule(self, schedule_id: str) -> ScheduleFire:
        """See :meth:`Client.trigger_schedule`."""
        return self._run(self._client.trigger_schedule(schedule_id))

    def set_queue_rate_limit(
        self,
        queue: str,
        per_second: float = 0.0,
        *,
        burst: int = 0,
        per_key_per_second: float = 0.0,
        per_key_burst: int = 0,
    ) -> QueueRateLimit:
        """See :meth:`Client.set_queue_rate_limit`."""
        return self._run(
            self._client.set_queue_rate_limit(
                queue, per_second, burst=burst, per_key_per_second=per_key_per_second, per_key_burst=per_key_burst
            )
        )

    def get_queue_rate_limit(self, queue: str) -> QueueRateLimit:
        """See :meth:`Client.get_queue_rate_limit`."""
        return self._run(self._client.get_queue_rate_limit(queue))

    def list_queue_rate_limits(self, *, page_size: int = 100) -> Iterator[QueueRateLimit]:
        """See :meth:`Client.list_queue_rate_limits`."""
        return self._iterate(self._client.list_queue_rate_limits(page_size=page_size))

    def delete_queue_rate_limit(self, queue: str) -> None:
        """See :meth:`Client.delete_queue_rate_limit`."""
        self._run(self._client.delete_queue_rate_limit(queue))

    def set_secret(self, name: str, value: SecretValue) -> Secret:
        """See :meth:`Client.set_secret`."""
        try:
            return self._run(self._client.set_secret(name, value))
        except _SET_SECRET_ERRORS as error:
            raise _without_frames(error) from None
        finally:
            value = b""  # this frame outlives the call in an error's traceback

    def list_secrets(self, *, page_size: int = 100) -> Iterator[Secret]:
        """See :meth:`Client.list_secrets`."""
        return self._iterate(self._client.list_secrets(page_size=page_size))

    def delete_secret(self, name: str) -> None:
        """See :meth:`Client.delete_secret`."""
        self._run(self._client.delete_secret(name))

    def upload_blob(self, data: bytes) -> BlobRef:
        """See :meth:`Client.upload_blob`."""
        return self._run(self._client.upload_blob(data))

    def download_blob(self, sha256: str) -> bytes:
        """See :meth:`Client.download_blob`."""
        return self._run(self._client.download_blob(sha256))

    def resolve_payload(self, value: Any) -> Any:
        """See :meth:`Client.resolve_payload`."""
        return self._run(self._client.resolve_payload(value))


__all__ = ["Client", "RecordedHistory", "SecretValue", "SyncClient", "WorkflowSource", "workflow_source_text"]
