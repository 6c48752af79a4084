"""What a task handler gets and is: :class:`TaskContext` and the ``Handler`` type.

Both the :class:`~composer.worker.Worker` and the code runner's handler
(:mod:`composer.code_runner`) build on these, so they live below both.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from datetime import datetime, timezone
from typing import Any

from composer.v1 import worker_service_pb2

from ._values import from_optional_field

Handler = Callable[["TaskContext"], Any]
"""A task handler: takes a :class:`TaskContext`, returns a JSON-able output
(``async def`` handlers run on the worker's event loop, plain ``def`` handlers
in its thread pool)."""

CANCEL_RUN_CANCELLED = "run cancelled"
"""``TaskContext.cancel_kind`` when a heartbeat answered that the run was cancelled (also the
``cancel_reason`` when the server gave no reason)."""
CANCEL_LEASE_LOST = "lease lost"
"""``TaskContext.cancel_kind`` (and ``cancel_reason``) when the server said the lease is no longer this worker's."""
CANCEL_SHUTDOWN = "worker shutdown"
"""``TaskContext.cancel_kind`` (and ``cancel_reason``) when the worker stopped before the task finished draining."""


class TaskCancelled(Exception):
    """Raised by :meth:`TaskContext.raise_if_cancelled` once the task was cancelled."""


class _TaskLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes each message with the task it is about and adds the ids as record attributes."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return f"[{extra['node_id']}#{extra['attempt']} run {extra['run_id']}] {msg}", kwargs


class TaskSecrets(Mapping[str, str]):
    """The values of the secrets a CODE node declares, by name (docs/secrets.md).

    The server fills them only for a code runner's queue (``code.python``,
    ``code.javascript``) and only with the names the node lists: every other
    task's mapping is empty. Its ``repr`` and ``str`` name the secrets and
    never show a value, so logging a context, or this mapping, shows none.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values: dict[str, str] = dict(values or {})

    def __getitem__(self, name: str) -> str:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"TaskSecrets({sorted(self._values)!r})"

    __str__ = __repr__


class TaskContext:
    """What a handler gets: the task's identity, its input, a cancellation signal and a logger.

    ``task_id`` is stable across attempts: use it as the idempotency key of the
    step's own side effects.
    """

    def __init__(self, task: worker_service_pb2.Task, logger: logging.Logger, loop: asyncio.AbstractEventLoop) -> None:
        self.task_id: str = task.task_id
        """The task's id, the same for every attempt."""
        self.attempt: int = task.attempt
        """This attempt, from 1."""
        self.run_id: str = task.run_id
        """The run the task belongs to."""
        self.node_id: str = task.node_id
        """The node (or ``<map id>[<index>]``) the task executes."""
        self.workflow_name: str = task.workflow_name
        """The workflow the run executes."""
        self.workflow_version: int = task.workflow_version
        """The version the run is pinned to."""
        self.namespace: str = task.namespace
        """The run's namespace."""
        self.queue: str = task.queue
        """The queue the task came from."""
        self.task_name: str = task.task_name
        """The task name (the node's ``task``)."""
        self.input: Any = from_optional_field(task, "input")
        """The node's rendered input, as JSON; the worker replaces the blob references it holds with
        their values before the handler runs (docs/payloads.md)."""
        self.secrets: TaskSecrets = TaskSecrets(task.secrets)
        """A CODE task's secret values by name, for the code runner (empty for every other task)."""
        self.deadline: datetime | None = (
            task.attempt_deadline.ToDatetime(tzinfo=timezone.utc) if task.HasField("attempt_deadline") else None
        )
        """The attempt must finish by this time (the node's ``timeout``), if set."""
        self.cancel_event: threading.Event = threading.Event()
        """Set when the task is cancelled; a sync handler may poll it or ``wait()`` on it."""
        self.cancel_kind: str | None = None
        """What stopped the task, once something did: ``run cancelled``, ``lease lost`` or ``worker shutdown``."""
        self.cancel_reason: str | None = None
        """Why the task was stopped, once it was: for a cancelled run the reason given to
        ``cancel_run`` (or the server's own, e.g. a run timeout), ``run cancelled`` when there
        was none; otherwise the same as :attr:`cancel_kind`."""
        self.logger: logging.LoggerAdapter[logging.Logger] = _TaskLogger(
            logger,
            {"task_id": self.task_id, "attempt": self.attempt, "run_id": self.run_id, "node_id": self.node_id},
        )
        """A logger whose records carry the task's ids."""
        self._async_cancel = asyncio.Event()
        self._loop = loop

    def __repr__(self) -> str:
        # Names the task, and its secrets by name only.
        return (
            f"TaskContext(task_id={self.task_id!r}, attempt={self.attempt}, run_id={self.run_id!r}, "
            f"node_id={self.node_id!r}, queue={self.queue!r}, secrets={sorted(self.secrets)!r})"
        )

    @property
    def cancelled(self) -> bool:
        """True once the run was cancelled, the lease lost, or the worker is shutting down past its drain."""
        return self.cancel_event.is_set()

    async def wait_cancelled(self) -> str:
        """Waits (in an async handler) until the task is cancelled; returns the reason."""
        await self._async_cancel.wait()
        return self.cancel_reason or ""

    def raise_if_cancelled(self) -> None:
        """Raises :class:`TaskCancelled` if the task was cancelled: a checkpoint for long sync loops."""
        if self.cancelled:
            raise TaskCancelled(self.cancel_reason or "cancelled")

    def _cancel(self, kind: str, reason: str = "") -> bool:
        """Marks the task cancelled (in the worker's loop) by ``kind``, because of ``reason`` (default:
        the kind); False if it already was."""
        if self.cancel_event.is_set():
            return False
        self.cancel_kind = kind
        self.cancel_reason = reason or kind
        self.cancel_event.set()
        self._async_cancel.set()
        return True


__all__ = [
    "CANCEL_LEASE_LOST",
    "CANCEL_RUN_CANCELLED",
    "CANCEL_SHUTDOWN",
    "Handler",
    "TaskCancelled",
    "TaskContext",
    "TaskSecrets",
]
