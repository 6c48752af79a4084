"""A worker run as its own process by the integration tests (SIGKILL and SIGTERM scenarios).

    python worker_process.py ADDRESS QUEUE SLOTS SECONDS [DRAIN_TIMEOUT]

Serves task ``slow`` on QUEUE: prints ``{"event": "started", ...}`` as a JSON
line when a task starts, sleeps SECONDS (or returns at once on attempt >= 2),
returns ``{"pid": <pid>, "attempt": <n>}`` and prints ``finished``; prints
``heartbeat`` after each heartbeat the server accepted (the first confirms the
lease). On SIGTERM it stops gracefully (Worker.run) and prints ``exited``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import grpc

from composer import TaskContext, Worker


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class HeartbeatEvents(grpc.aio.UnaryUnaryClientInterceptor):
    """Prints ``heartbeat`` once the server accepted a Heartbeat."""

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(details, request)
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if method.endswith("/Heartbeat"):
            try:
                await call
            except grpc.aio.AioRpcError:
                return call
            emit("heartbeat", task_id=request.task_id, attempt=request.attempt)
        return call


def main() -> None:
    address, queue, slots, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    drain = float(sys.argv[5]) if len(sys.argv) > 5 else 30.0
    # Short polls, as in the tests' own workers (_support.POLL_WAIT): a stopping worker lets its
    # poll answer first.
    worker = Worker(address, slots=slots, drain_timeout=drain, poll_wait=1.0, interceptors=[HeartbeatEvents()])

    @worker.task(queue, "slow")
    async def slow(ctx: TaskContext) -> dict[str, int]:
        emit("started", task_id=ctx.task_id, attempt=ctx.attempt, run_id=ctx.run_id)
        if ctx.attempt == 1:
            await asyncio.sleep(seconds)
        emit("finished", task_id=ctx.task_id, attempt=ctx.attempt, run_id=ctx.run_id)
        return {"pid": os.getpid(), "attempt": ctx.attempt}

    emit("ready", worker_id=worker.worker_id)
    worker.run()
    emit("exited", completed=worker.stats.completed, polled=worker.stats.polled)


if __name__ == "__main__":
    main()
