"""Helpers of the integration tests: run a worker beside a test, spawn worker processes, record calls."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from composer import Backoff, Client, Run, RunStatus, Worker

HERE = Path(__file__).resolve().parent
FAST = Backoff(initial=0.05, maximum=1.0)
POLL_WAIT = 1.0
"""The long-poll wait of the tests' workers. A stopping worker lets the poll it has out answer
first (cutting it off could strand tasks the server just leased to it), so at the default
20 s every test would wait up to 20 s more for its worker to stop."""


@asynccontextmanager
async def serving(worker: Worker) -> AsyncIterator[Worker]:
    """Runs ``worker`` in the background for the block, then stops it gracefully."""
    task = asyncio.create_task(worker.serve())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 60)


async def until(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Waits until ``predicate()`` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.05)


async def history_types(client: Client, run_id: str) -> list[str]:
    """The event types of a run's history, oldest first."""
    return [event.event_type async for event in client.get_run_history(run_id)]


async def final(client: Client, run_id: str, timeout: float = 60.0) -> Run:
    """The run once it ended (fails the test after ``timeout``)."""
    run = await client.wait_for_run(run_id, timeout=timeout)
    assert run.status.is_final
    return run


class Recorder(grpc.aio.UnaryUnaryClientInterceptor):
    """A client interceptor that records every unary request a worker sends, by method name."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        self.calls.append((method.rsplit("/", 1)[-1], request))
        return await continuation(details, request)

    def requests(self, method: str) -> list[Any]:
        """The requests sent to ``method`` (e.g. ``CompleteTask``)."""
        return [request for name, request in self.calls if name == method]


class WorkerProcess:
    """tests/integration/worker_process.py in a subprocess, its JSON lines collected."""

    def __init__(self, address: str, queue_name: str, *, slots: int = 2, seconds: float = 30.0, drain: float = 30.0) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "worker_process.py"), address, queue_name, str(slots), str(seconds), str(drain)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.events: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "event" in event:
                self.events.append(event)

    def seen(self, event: str) -> list[dict[str, Any]]:
        """The events of one kind printed so far."""
        return [e for e in self.events if e["event"] == event]

    async def wait_for(self, event: str, count: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Waits until ``count`` events of a kind were printed."""
        try:
            await until(lambda: len(self.seen(event)) >= count, timeout, f"{count} x {event}")
        except AssertionError:
            raise AssertionError(f"worker process output:\n{''.join(self.lines)[-4000:]}") from None
        return self.seen(event)

    def kill(self) -> None:
        """Stops the process however it is (used in teardown)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def three_step(names: str) -> str:
    """A three-step TASK workflow: a → b → c, output from c."""
    return f"""
name: three_step_{names}
description: conformance C1
nodes:
  - id: a
    type: TASK
    queue: steps_{names}
    task: add_one
    input: {{ x: "${{input.x}}" }}
  - id: b
    type: TASK
    queue: steps_{names}
    task: double
    input: {{ x: "${{nodes.a.output.x}}" }}
  - id: c
    type: TASK
    queue: steps_{names}
    task: describe
    input: {{ x: "${{nodes.b.output.x}}" }}
edges:
  - {{ from: a, to: b }}
  - {{ from: b, to: c }}
output: {{ result: "${{nodes.c.output}}" }}
"""


def one_task(name: str, queue_name: str, task: str, *, extra: str = "") -> str:
    """A workflow of one TASK node ``work`` (``extra`` is indented YAML added to the node)."""
    node_extra = "".join(f"    {line}\n" for line in extra.strip().splitlines()) if extra.strip() else ""
    return f"""
name: {name}
nodes:
  - id: work
    type: TASK
    queue: {queue_name}
    task: {task}
{node_extra}output: {{ result: "${{nodes.work.output}}" }}
"""


__all__ = ["RunStatus"]
