"""replay_run and check_workflow_version against an in-process fake WorkflowService: the requests
they build (a run named or given whole, the new definition), the typed verdicts they return, the
paging and summing of a check, and the arguments refused before any call."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import google.rpc.error_details_pb2 as error_details_pb2
import grpc
import pytest
from _fakes import status_trailer
from google.protobuf import json_format

from composer import (
    CheckScope,
    Client,
    InvalidArgumentError,
    NotFoundError,
    ReplayDifference,
    ReplayDivergence,
    ReplayVerdict,
    RunStatus,
    SyncClient,
    WorkflowVersionCheck,
)
from composer.v1 import common_pb2, workflow_service_pb2, workflow_service_pb2_grpc

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "replay" / "order-waiting-in-b.history.json"
FIXTURE_RUN_ID = "01a24a4f-f8a8-72a9-b54a-0bca93fd712a"

V2 = """
name: order
nodes:
  - { id: A, type: TASK, queue: replay, task: a }
  - { id: B, type: TASK, queue: replay, task: b }
  - { id: C, type: TASK, queue: replay, task: c }
  - { id: D, type: TASK, queue: replay, task: d }
edges:
  - { from: A, to: B }
  - { from: B, to: C }
  - { from: C, to: D }
"""

VERDICT_CYCLE = (
    workflow_service_pb2.REPLAY_VERDICT_IDENTICAL,
    workflow_service_pb2.REPLAY_VERDICT_COMPATIBLE,
    workflow_service_pb2.REPLAY_VERDICT_INCOMPATIBLE,
    workflow_service_pb2.REPLAY_VERDICT_UNREPLAYABLE,
)


def fake_replay(run_id: str, verdict: Any) -> workflow_service_pb2.RunReplay:
    """A RunReplay as the server writes one for ``verdict``."""
    replay = workflow_service_pb2.RunReplay(
        run_id=run_id, workflow_version=1, status=common_pb2.RUN_STATUS_RUNNING, verdict=verdict, events=4
    )
    if verdict == workflow_service_pb2.REPLAY_VERDICT_COMPATIBLE:
        replay.differences.add(kind="node_added", node_id="D", message="D is new")
    if verdict == workflow_service_pb2.REPLAY_VERDICT_INCOMPATIBLE:
        replay.divergence.CopyFrom(
            workflow_service_pb2.ReplayDivergence(rule="node_changed", node_id="B", sequence=4, message="task b is b2")
        )
    if verdict == workflow_service_pb2.REPLAY_VERDICT_UNREPLAYABLE:
        replay.unreplayable_reason = "entry 3 is not what the definition decides"
    return replay


class FakeWorkflows(workflow_service_pb2_grpc.WorkflowServiceServicer):
    """Answers ReplayRun with ``verdict`` and pages CheckWorkflowVersion over ``total`` runs, whose
    verdicts cycle IDENTICAL, COMPATIBLE, INCOMPATIBLE, UNREPLAYABLE (run ``r-<index>``, newest first)."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.verdict: Any = workflow_service_pb2.REPLAY_VERDICT_COMPATIBLE
        self.total = 5

    async def ReplayRun(self, request: Any, context: Any) -> workflow_service_pb2.ReplayRunResponse:
        self.requests.append(request)
        if request.run_id == "missing":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such run")
        if request.source.startswith("not a workflow"):
            violation = error_details_pb2.BadRequest.FieldViolation(field="source", description="not a definition")
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "invalid definition",
                trailing_metadata=status_trailer(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "invalid definition",
                    error_details_pb2.BadRequest(field_violations=[violation]),
                ),
            )
        run_id = request.run_id or request.history.run.run_id
        return workflow_service_pb2.ReplayRunResponse(replay=fake_replay(run_id, self.verdict))

    async def CheckWorkflowVersion(
        self, request: Any, context: Any
    ) -> workflow_service_pb2.CheckWorkflowVersionResponse:
        self.requests.append(request)
        start = int(request.page_token or 0)
        end = min(start + (request.page_size or 200), self.total)
        page = workflow_service_pb2.CheckWorkflowVersionResponse(
            checked=end - start, next_page_token=str(end) if end < self.total else ""
        )
        for index in range(start, end):
            verdict = VERDICT_CYCLE[index % len(VERDICT_CYCLE)]
            count = workflow_service_pb2.ReplayVerdict.Name(verdict).removeprefix("REPLAY_VERDICT_").lower()
            setattr(page, count, getattr(page, count) + 1)
            if verdict != workflow_service_pb2.REPLAY_VERDICT_IDENTICAL:
                page.runs.append(fake_replay(f"r-{index}", verdict))
        return page


async def start(fake: FakeWorkflows) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    workflow_service_pb2_grpc.add_WorkflowServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def serve(test: Any) -> None:
    """Runs ``test(client, fake)`` against a fresh fake."""

    async def main() -> None:
        fake = FakeWorkflows()
        server, address = await start(fake)
        try:
            async with Client(address) as client:
                await test(client, fake)
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_replay_run_by_id_sends_the_new_definition_and_returns_the_typed_verdict(tmp_path: Path) -> None:
    async def test(client: Client, fake: FakeWorkflows) -> None:
        replay = await client.replay_run("r-1", version=3, node_mapping={"B": "B2"})
        sent = fake.requests[-1]
        assert isinstance(sent, workflow_service_pb2.ReplayRunRequest)
        assert sent.WhichOneof("recorded") == "run_id" and sent.run_id == "r-1"
        assert (sent.source, sent.version, dict(sent.node_mapping)) == ("", 3, {"B": "B2"})
        assert replay.verdict is ReplayVerdict.COMPATIBLE and replay.divergence is None
        assert replay.differences == (ReplayDifference("node_added", "D", "D is new"),)
        assert (replay.run_id, replay.workflow_version, replay.status, replay.events) == ("r-1", 1, RunStatus.RUNNING, 4)
        assert replay.raw.run_id == "r-1"

        # The source as register_workflow takes it: text, a file, a dict.
        fake.verdict = workflow_service_pb2.REPLAY_VERDICT_INCOMPATIBLE
        replay = await client.replay_run("r-1", source=V2)
        assert (fake.requests[-1].source, fake.requests[-1].version) == (V2, 0)
        assert replay.verdict is ReplayVerdict.INCOMPATIBLE and replay.differences == ()
        assert replay.divergence == ReplayDivergence("node_changed", "B", 4, "task b is b2")
        file = tmp_path / "order-v2.yaml"
        file.write_text(V2)
        await client.replay_run("r-1", source=file)
        assert fake.requests[-1].source == V2
        await client.replay_run("r-1", source={"name": "order", "nodes": []})
        assert json.loads(fake.requests[-1].source) == {"name": "order", "nodes": []}

        fake.verdict = workflow_service_pb2.REPLAY_VERDICT_UNREPLAYABLE
        replay = await client.replay_run("r-1", version=2)
        assert replay.verdict is ReplayVerdict.UNREPLAYABLE
        assert replay.unreplayable_reason == "entry 3 is not what the definition decides"

    serve(test)


def test_replay_run_errors_are_typed() -> None:
    async def test(client: Client, fake: FakeWorkflows) -> None:
        with pytest.raises(NotFoundError):
            await client.replay_run("missing", version=2)
        with pytest.raises(InvalidArgumentError) as caught:
            await client.replay_run("r-1", source="not a workflow")
        assert [v.field for v in caught.value.field_violations] == ["source"]

    serve(test)


def test_replay_run_offline_sends_the_recorded_history_as_a_path_text_or_dict() -> None:
    text = FIXTURE.read_text()
    as_dict = json.loads(text)
    assert "next_page_token" in as_dict  # a key RecordedRun lacks: passed over

    async def test(client: Client, fake: FakeWorkflows) -> None:
        for history in (FIXTURE, text, as_dict):
            replay = await client.replay_run(history=history, source=V2)
            sent = fake.requests[-1]
            assert sent.WhichOneof("recorded") == "history" and sent.source == V2
            recorded = sent.history
            assert recorded.run.run_id == FIXTURE_RUN_ID and replay.run_id == FIXTURE_RUN_ID
            assert recorded.run.status == common_pb2.RUN_STATUS_RUNNING
            assert [n.node_id for n in recorded.run.nodes] == ["A", "B"]
            assert recorded.run.nodes[0].status == common_pb2.NODE_STATUS_COMPLETED
            assert json_format.MessageToDict(recorded.run.nodes[0].output) == {"amount": 30}
            assert (recorded.workflow.name, recorded.workflow.version) == ("order", 1)
            assert recorded.workflow.source.startswith("name: order\n")
            assert [e.event_type for e in recorded.events][:3] == ["run_started", "node_started", "node_completed"]
            assert [e.sequence for e in recorded.events] == [1, 2, 3, 4]
            assert json_format.MessageToDict(recorded.events[0].details) == {"input": {"customer": "c-1"}}
        assert len(fake.requests) == 3

    serve(test)


def test_a_history_that_is_not_a_whole_recorded_run_is_refused_before_any_call(tmp_path: Path) -> None:
    recorded = json.loads(FIXTURE.read_text())

    async def test(client: Client, fake: FakeWorkflows) -> None:
        with pytest.raises(ValueError, match="cut short"):
            await client.replay_run(history={**recorded, "next_page_token": "100"}, version=2)
        without_events = {k: v for k, v in recorded.items() if k != "events"}
        with pytest.raises(ValueError, match="no 'events'"):
            await client.replay_run(history=without_events, version=2)
        with pytest.raises(ValueError, match="pathlib.Path"):
            await client.replay_run(history="run.json", version=2)  # a str is the JSON, not a file name
        with pytest.raises(ValueError, match="not a JSON object"):
            await client.replay_run(history="[1, 2]", version=2)
        with pytest.raises(ValueError, match="not a recorded run"):
            await client.replay_run(history={**recorded, "run": 5}, version=2)
        broken = tmp_path / "broken.json"
        broken.write_text("{")
        with pytest.raises(ValueError, match="broken.json is not JSON"):
            await client.replay_run(history=broken, version=2)
        with pytest.raises(TypeError):
            await client.replay_run(history=42, version=2)  # type: ignore[arg-type]
        assert fake.requests == []

    serve(test)


def test_bad_arguments_raise_value_error_before_any_call() -> None:
    async def test(client: Client, fake: FakeWorkflows) -> None:
        with pytest.raises(ValueError, match="exactly one of run_id and history"):
            await client.replay_run(version=2)
        with pytest.raises(ValueError, match="exactly one of run_id and history"):
            await client.replay_run("r-1", history=FIXTURE, version=2)
        with pytest.raises(ValueError, match="exactly one of run_id and history"):
            await client.replay_run("", version=2)
        with pytest.raises(ValueError, match="needs the new definition"):
            await client.replay_run("r-1")
        with pytest.raises(ValueError, match="not both"):
            await client.replay_run("r-1", source=V2, version=2)
        with pytest.raises(ValueError, match="version must be positive"):
            await client.replay_run("r-1", version=0)
        with pytest.raises(ValueError, match="source is empty"):
            await client.replay_run("r-1", source="  \n")

        with pytest.raises(ValueError, match="needs the new definition"):
            await client.check_workflow_version("order")
        with pytest.raises(ValueError, match="not both"):
            await client.check_workflow_version("order", source=V2, version=2)
        with pytest.raises(ValueError, match="name"):
            await client.check_workflow_version("", version=2)
        with pytest.raises(ValueError, match="limit"):
            await client.check_workflow_version("order", version=2, scope=CheckScope.COMPLETED, limit=0)
        with pytest.raises(ValueError, match="COMPLETED only"):
            await client.check_workflow_version("order", version=2, limit=5)
        with pytest.raises(ValueError, match="page_size"):
            await client.check_workflow_version("order", version=2, page_size=0)
        assert fake.requests == []

    serve(test)


def test_check_workflow_version_pages_through_every_run_and_sums_the_verdicts() -> None:
    async def test(client: Client, fake: FakeWorkflows) -> None:
        check = await client.check_workflow_version("order", version=2, node_mapping={"B": "B2"}, page_size=2)
        pages = fake.requests
        assert [(p.page_size, p.page_token) for p in pages] == [(2, ""), (2, "2"), (2, "4")]
        for page in pages:
            assert isinstance(page, workflow_service_pb2.CheckWorkflowVersionRequest)
            assert (page.name, page.source, page.version, dict(page.node_mapping)) == ("order", "", 2, {"B": "B2"})
            assert page.scope == workflow_service_pb2.CHECK_SCOPE_IN_FLIGHT
        # r-0 and r-4 identical; r-1 compatible, r-2 incompatible, r-3 unreplayable
        assert (check.checked, check.identical, check.compatible, check.incompatible, check.unreplayable) == (5, 2, 1, 1, 1)
        assert [(r.run_id, r.verdict) for r in check.runs] == [
            ("r-1", ReplayVerdict.COMPATIBLE),
            ("r-2", ReplayVerdict.INCOMPATIBLE),
            ("r-3", ReplayVerdict.UNREPLAYABLE),
        ]
        assert check.runs[1].divergence == ReplayDivergence("node_changed", "B", 4, "task b is b2")
        assert check.counts == {
            ReplayVerdict.IDENTICAL: 2,
            ReplayVerdict.COMPATIBLE: 1,
            ReplayVerdict.INCOMPATIBLE: 1,
            ReplayVerdict.UNREPLAYABLE: 1,
        }

        fake.requests.clear()
        fake.total = 0
        assert await client.check_workflow_version("order", source=V2) == WorkflowVersionCheck()
        assert [(p.page_size, p.source) for p in fake.requests] == [(200, V2)]

    serve(test)


def test_check_workflow_version_stops_at_its_limit() -> None:
    async def test(client: Client, fake: FakeWorkflows) -> None:
        check = await client.check_workflow_version("order", version=2, scope=CheckScope.COMPLETED, limit=3, page_size=2)
        # the second page asks for the one run the limit leaves, and no third is fetched
        assert [(p.page_size, p.page_token) for p in fake.requests] == [(2, ""), (1, "2")]
        assert all(p.scope == workflow_service_pb2.CHECK_SCOPE_COMPLETED for p in fake.requests)
        assert (check.checked, check.identical, check.compatible, check.incompatible) == (3, 1, 1, 1)
        assert [r.run_id for r in check.runs] == ["r-1", "r-2"]

        # a limit above the runs there are ends at the last page
        fake.requests.clear()
        check = await client.check_workflow_version(
            "order", version=2, scope=CheckScope.COMPLETED, limit=10, page_size=4
        )
        assert [(p.page_size, p.page_token) for p in fake.requests] == [(4, ""), (4, "4")]
        assert check.checked == 5

    serve(test)


def test_the_sync_facade_replays_and_checks() -> None:
    async def serve_forever(ready: asyncio.Future[str], done: asyncio.Event) -> None:
        server, address = await start(FakeWorkflows())
        ready.set_result(address)
        await done.wait()
        await server.stop(None)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[str] = loop.create_future()
        done = asyncio.Event()
        serving = asyncio.create_task(serve_forever(ready, done))
        address = await ready

        def script() -> None:
            with SyncClient(address) as client:
                assert client.replay_run("r-1", version=2).verdict is ReplayVerdict.COMPATIBLE
                assert client.replay_run(history=FIXTURE, source=V2).run_id == FIXTURE_RUN_ID
                check = client.check_workflow_version("order", version=2, page_size=2)
                assert (check.checked, check.incompatible) == (5, 1)
                with pytest.raises(ValueError):
                    client.replay_run("r-1")

        await asyncio.to_thread(script)
        done.set()
        await serving

    asyncio.run(main())
