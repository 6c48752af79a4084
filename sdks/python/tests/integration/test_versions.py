"""replay_run, check_workflow_version and migrate_runs against the real server (docs/versions.md).

Each test registers `order_<names>` v1 (A → B → C, TASK nodes), lets a worker
finish A so the run waits in B (B's queue has no worker yet), then registers
the changes under test: D appended after C (compatible with a run in B) and
B's task renamed (incompatible: B already started with the old task).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from _support import FAST, POLL_WAIT, history_types, serving
from conftest import BINARY, REPO, ServerProcess

from composer import (
    BulkOperationKind,
    BulkOperationStatus,
    CheckScope,
    Client,
    NodeStatus,
    ReplayVerdict,
    Run,
    RunFilter,
    RunStatus,
    TaskContext,
    Worker,
)

FIXTURE = REPO / "tests" / "fixtures" / "replay" / "order-waiting-in-b.history.json"


def run(coroutine: Any) -> None:
    asyncio.run(asyncio.wait_for(coroutine, 240))


def order(names: str, *, b_task: str = "b", b_id: str = "B", with_d: bool = False) -> str:
    """`order_<names>`: A on the first queue, the rest on the second; ``with_d`` appends D after C."""
    first, rest = f"first_{names}", f"rest_{names}"
    d_node = f"  - {{ id: D, type: TASK, queue: {rest}, task: d }}\n" if with_d else ""
    d_edge = "  - { from: C, to: D }\n" if with_d else ""
    return (
        f"name: order_{names}\n"
        "nodes:\n"
        f"  - {{ id: A, type: TASK, queue: {first}, task: a }}\n"
        f"  - {{ id: {b_id}, type: TASK, queue: {rest}, task: {b_task}, "
        'input: { amount: "${nodes.A.output.amount}" } }\n'
        f"  - {{ id: C, type: TASK, queue: {rest}, task: c }}\n"
        f"{d_node}"
        "edges:\n"
        f"  - {{ from: A, to: {b_id} }}\n"
        f"  - {{ from: {b_id}, to: C }}\n"
        f"{d_edge}"
    )


def first_worker(server: ServerProcess, names: str) -> Worker:
    """Serves A only: a run it works on goes on to B and waits there."""
    worker = Worker(server.address, slots=2, backoff=FAST, poll_wait=POLL_WAIT)

    @worker.task(f"first_{names}", "a")
    async def a(ctx: TaskContext) -> dict[str, Any]:
        return {"amount": 30}

    return worker


def rest_worker(server: ServerProcess, names: str, seen: list[str]) -> Worker:
    """Serves B, C and D, noting each node it ran."""
    worker = Worker(server.address, slots=2, backoff=FAST, poll_wait=POLL_WAIT)

    async def step(ctx: TaskContext) -> dict[str, Any]:
        seen.append(ctx.node_id)
        return {"node": ctx.node_id}

    for task in ("b", "c", "d"):
        worker.task(f"rest_{names}", task)(step)
    return worker


async def waiting_in_b(client: Client, run_id: str, timeout: float = 30.0) -> Run:
    """The run once A completed and B started (and, with no worker on B's queue, waits)."""
    deadline = time.monotonic() + timeout
    while True:
        current = await client.get_run(run_id)
        a, b = current.node("A"), current.node("B")
        if a is not None and a.status is NodeStatus.COMPLETED and b is not None:
            assert current.status is RunStatus.RUNNING
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} did not reach B within {timeout} s: {current.nodes}")
        await asyncio.sleep(0.05)


@asynccontextmanager
async def runs_waiting_in_b(server: ServerProcess, names: str, count: int) -> AsyncIterator[tuple[Client, list[str]]]:
    """v1 registered and ``count`` runs of it waiting in B (A served for the block)."""
    async with Client(server.address) as client, serving(first_worker(server, names)):
        registered = await client.register_workflow(order(names))
        assert registered.version == 1
        run_ids = [(await client.start_run(registered.name, {"customer": f"c-{i}"})).run_id for i in range(count)]
        for run_id in run_ids:
            await waiting_in_b(client, run_id)
        yield client, run_ids


async def recorded_history(server: ServerProcess, run_id: str, path: Path) -> Path:
    """Writes the run's history as `composer run history RUN_ID -o json` does (COMPOSER_TOKEN set)."""
    process = await asyncio.create_subprocess_exec(
        str(BINARY),
        "run",
        "history",
        run_id,
        "-o",
        "json",
        "--limit",
        "1000",
        "--address",
        f"http://{server.address}",
        env=dict(os.environ),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    path.write_bytes(out)
    return path


def test_replay_run_online_and_offline_tells_compatible_from_incompatible(
    server: ServerProcess, names: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with runs_waiting_in_b(server, names, 1) as (client, [run_id]):
            appended = await client.register_workflow(order(names, with_d=True))
            renamed_task = order(names, b_task="b_renamed")
            assert (await client.register_workflow(renamed_task)).version == 3

            # online, against a registered version
            replay = await client.replay_run(run_id, version=appended.version)
            print("online v2:", replay)
            assert replay.verdict is ReplayVerdict.COMPATIBLE, replay
            assert (replay.run_id, replay.workflow_version, replay.status) == (run_id, 1, RunStatus.RUNNING)
            assert ("node_added", "D") in [(d.kind, d.node_id) for d in replay.differences]
            assert replay.divergence is None and replay.events > 0

            # online, against a definition's text: B already started with task b
            replay = await client.replay_run(run_id, source=renamed_task)
            print("online renamed task:", replay)
            assert replay.verdict is ReplayVerdict.INCOMPATIBLE, replay
            assert replay.divergence is not None
            assert (replay.divergence.rule, replay.divergence.node_id) == ("node_changed", "B")

            assert (await client.replay_run(run_id, version=1)).verdict is ReplayVerdict.IDENTICAL

            # a node renamed, named in node_mapping
            replay = await client.replay_run(run_id, source=order(names, b_id="B2"), node_mapping={"B": "B2"})
            print("online B renamed to B2:", replay)
            assert replay.verdict is ReplayVerdict.COMPATIBLE, replay
            assert ("node_renamed", "B") in [(d.kind, d.node_id) for d in replay.differences]

            # offline, from what `composer run history -o json` wrote
            history = await recorded_history(server, run_id, tmp_path / "run.json")
            replay = await client.replay_run(history=history, version=appended.version)
            assert replay.verdict is ReplayVerdict.COMPATIBLE and replay.run_id == run_id, replay
            replay = await client.replay_run(history=json.loads(history.read_text()), source=renamed_task)
            assert replay.verdict is ReplayVerdict.INCOMPATIBLE, replay
            assert replay.divergence is not None and replay.divergence.rule == "node_changed"
            replay = await client.replay_run(history=history.read_text(), version=1)
            assert replay.verdict is ReplayVerdict.IDENTICAL, replay

    run(main())


def test_replay_run_reads_the_committed_history_fixture(server: ServerProcess) -> None:
    async def main() -> None:
        recorded = json.loads(FIXTURE.read_text())
        own_source = recorded["workflow"]["source"]
        async with Client(server.address) as client:
            replay = await client.replay_run(history=FIXTURE, source=own_source)
            assert replay.verdict is ReplayVerdict.IDENTICAL, replay
            assert replay.run_id == recorded["run"]["run_id"]
            appended = own_source.replace(
                "  - { id: C, type: TASK, queue: replay, task: c }\n",
                "  - { id: C, type: TASK, queue: replay, task: c }\n  - { id: D, type: TASK, queue: replay, task: d }\n",
            ) + "  - { from: C, to: D }\n"
            replay = await client.replay_run(history=recorded, source=appended)
            assert replay.verdict is ReplayVerdict.COMPATIBLE, replay
            assert [(d.kind, d.node_id) for d in replay.differences] == [("node_added", "D")]

    run(main())


def test_check_workflow_version_sums_every_run_in_flight_and_the_completed_ones(
    server: ServerProcess, names: str
) -> None:
    async def main() -> None:
        name = f"order_{names}"
        async with Client(server.address) as client, serving(first_worker(server, names)):
            await client.register_workflow(order(names))
            # two runs that completed, then two that wait in B
            completed: list[str] = []
            async with serving(rest_worker(server, names, [])):
                for i in range(2):
                    started = await client.start_run(name, {"customer": f"done-{i}"})
                    await client.wait_for_result(started.run_id, timeout=60)
                    completed.append(started.run_id)
            in_flight = [(await client.start_run(name, {"customer": f"c-{i}"})).run_id for i in range(2)]
            for run_id in in_flight:
                await waiting_in_b(client, run_id)
            appended = await client.register_workflow(order(names, with_d=True))
            renamed_task = order(names, b_task="b_renamed")

            # one run a call: the pages are summed
            check = await client.check_workflow_version(name, version=appended.version, page_size=1)
            print("in flight against v2:", check)
            assert (check.checked, check.identical, check.compatible, check.incompatible, check.unreplayable) == (
                2,
                0,
                2,
                0,
                0,
            )
            assert sorted(r.run_id for r in check.runs) == sorted(in_flight)
            assert all(r.verdict is ReplayVerdict.COMPATIBLE for r in check.runs)

            check = await client.check_workflow_version(name, source=renamed_task)
            print("in flight against the renamed task:", check)
            assert (check.checked, check.incompatible) == (2, 2)
            assert all(r.divergence is not None and r.divergence.rule == "node_changed" for r in check.runs)

            check = await client.check_workflow_version(name, version=1)
            assert (check.checked, check.identical, check.runs) == (2, 2, ())

            # the completed runs, newest first, and at most `limit` of them
            check = await client.check_workflow_version(name, version=1, scope=CheckScope.COMPLETED, page_size=1)
            assert (check.checked, check.identical) == (2, 2)
            check = await client.check_workflow_version(name, source=renamed_task, scope=CheckScope.COMPLETED, limit=1)
            print("the newest completed run against the renamed task:", check)
            assert (check.checked, check.incompatible) == (1, 1)
            assert [r.run_id for r in check.runs] == [completed[-1]]
            assert check.runs[0].status is RunStatus.COMPLETED

    run(main())


def test_migrate_runs_moves_a_compatible_run_and_leaves_an_incompatible_one(
    server: ServerProcess, names: str
) -> None:
    async def main() -> None:
        name = f"order_{names}"
        async with runs_waiting_in_b(server, names, 1) as (client, [run_id]):
            appended = await client.register_workflow(order(names, with_d=True))
            renamed_task = await client.register_workflow(order(names, b_task="b_renamed"))

            # B already started with task b: the run stays on v1, counted failed with the divergence
            refused = await client.migrate_runs(RunFilter(workflow_name=name), renamed_task.version)
            refused = await client.wait_bulk_operation(refused.operation_id, timeout=60)
            print("migration to the renamed task:", refused)
            assert refused.kind is BulkOperationKind.MIGRATE and refused.status is BulkOperationStatus.SUCCEEDED
            assert (refused.matched, refused.succeeded, refused.failed) == (1, 0, 1)
            assert [f.run_id for f in refused.failures] == [run_id]
            assert "node_changed" in refused.failures[0].message
            assert (await client.get_run(run_id)).workflow_version == 1

            started = await client.migrate_runs(
                RunFilter(workflow_name=name, statuses=[RunStatus.RUNNING]), appended.version, request_id=f"m-{names}"
            )
            assert started.created is True and started.target_version == appended.version
            migrated = await client.wait_bulk_operation(started.operation_id, timeout=60)
            print("migration to v2:", migrated)
            assert migrated.status is BulkOperationStatus.SUCCEEDED
            assert (migrated.matched, migrated.succeeded, migrated.failed) == (1, 1, 0)
            assert migrated.target_version == appended.version
            assert (await client.get_run(run_id)).workflow_version == appended.version

            seen: list[str] = []
            async with serving(rest_worker(server, names, seen)):
                done = await client.wait_for_run(run_id, timeout=60)
            assert done.status is RunStatus.COMPLETED, done
            assert seen == ["B", "C", "D"]
            d = done.node("D")
            assert d is not None and d.status is NodeStatus.COMPLETED
            assert "run_migrated" in await history_types(client, run_id)

    run(main())
