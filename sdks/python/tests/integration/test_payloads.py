"""C23: large payloads move through the blob store, unseen by handlers (tests/conformance/README.md,
docs/payloads.md), against the real server.

The session's servers keep their blobs in a temporary folder (conftest.py, ``blob_store``) and
offload at their default threshold (64 KiB), which the test reads from GetServerInfo.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from _support import FAST, POLL_WAIT, Recorder, serving
from conftest import ServerProcess, mint_token

from composer import BlobRef, Client, NotFoundError, RunStatus, TaskContext, Worker
from composer._values import from_value
from composer.v1 import run_service_pb2

INPUT_DOC = 150_000
"""The characters of the run input's ``doc``."""
OUTPUT_DOC = 200_000
"""The characters of ``a``'s output's ``doc``."""


def run(coroutine: Any) -> None:
    asyncio.run(asyncio.wait_for(coroutine, 240))


def a_then_b(names: str) -> str:
    """``a`` grows the input's document, ``b`` gets ``a``'s whole output passed along; the output
    reads into ``a``'s (the server reads the blob) and takes ``b``'s."""
    return f"""
name: payloads_{names}
description: conformance C23
nodes:
  - id: a
    type: TASK
    queue: payloads_{names}
    task: grow
    input: "${{input}}"
  - id: b
    type: TASK
    queue: payloads_{names}
    task: measure
    input: "${{nodes.a.output}}"
edges:
  - {{ from: a, to: b }}
output: {{ a: "${{size(nodes.a.output.doc)}}", b: "${{nodes.b.output}}" }}
"""


def assert_reference(value: Any, *, over: int, what: str) -> BlobRef:
    """``value`` is a reference whose size is over ``over`` and whose head starts with ``{"doc"``."""
    assert isinstance(value, dict) and list(value) == ["$blob"], f"{what} is not a reference: {str(value)[:300]}"
    blob = BlobRef.from_reference(value)
    assert blob.size > over, f"{what}: {blob}"
    assert blob.head.startswith('{"doc"'), f"{what}: head {blob.head[:40]!r}"
    assert len(blob.sha256) == 64, f"{what}: {blob}"
    return blob


async def c23_scenario(server: ServerProcess, names: str, *, through_urls: bool = False) -> None:
    """C23's run against ``server``, with every check of C23. ``through_urls`` (C24): the server
    gives presigned URLs, and the worker read ``a``'s and ``b``'s inputs through two and wrote
    ``a``'s output through one."""
    document = "p" * INPUT_DOC
    big_input = {"doc": document, "n": 7}
    seen_by_a: list[Any] = []
    seen_by_b: list[Any] = []

    async def main() -> None:
        recorder = Recorder()
        worker = Worker(server.address, slots=2, backoff=FAST, poll_wait=POLL_WAIT, interceptors=[recorder])

        @worker.task(f"payloads_{names}", "grow")
        def grow(ctx: TaskContext) -> dict[str, Any]:
            seen_by_a.append(ctx.input)
            return {"doc": "q" * OUTPUT_DOC, "n": ctx.input["n"]}

        @worker.task(f"payloads_{names}", "measure")
        async def measure(ctx: TaskContext) -> int:
            seen_by_b.append(ctx.input)
            return len(ctx.input["doc"])

        async with Client(server.address) as client, serving(worker):
            info = await client.server_info()
            assert info.blob_urls == through_urls, info
            assert 0 < info.payload_offload_bytes < INPUT_DOC, info

            # What start_run sends: record the StartRun requests of this client.
            sent: list[run_service_pb2.StartRunRequest] = []
            start_run = client._conn.runs.StartRun

            def recording(request: run_service_pb2.StartRunRequest, **kwargs: Any) -> Any:
                sent.append(request)
                return start_run(request, **kwargs)

            client._conn.runs.StartRun = recording

            registered = await client.register_workflow(a_then_b(names))
            started = await client.start_run(registered.name, big_input)
            # The client uploaded the input and sent its reference, not 150 KB.
            assert_reference(from_value(sent[-1].input), over=INPUT_DOC, what="the StartRun request's input")

            result = await client.wait_for_result(started.run_id, timeout=120)
            assert result == {"a": OUTPUT_DOC, "b": OUTPUT_DOC}, str(result)[:300]

            # The handlers saw whole values, never a reference.
            assert seen_by_a == [big_input], "a did not see the whole input"
            assert len(seen_by_b) == 1 and seen_by_b[0] == {"doc": "q" * OUTPUT_DOC, "n": 7}, "b did not see a's whole output"
            # The worker reported a's output as a reference (it uploaded it) and b's inline.
            reported = [from_value(r.output) for r in recorder.requests("CompleteTask")]
            assert len(reported) == 2, [str(output)[:200] for output in reported]
            assert_reference(reported[0], over=OUTPUT_DOC, what="a's CompleteTask output")
            assert reported[1] == OUTPUT_DOC
            if through_urls:
                assert len(recorder.requests("GetBlobUrl")) == 2, [name for name, _ in recorder.calls]
                assert len(recorder.requests("StartBlobUpload")) == 1
                assert len(recorder.requests("FinishBlobUpload")) == 1

            # get_run shows references as they are stored.
            done = await client.get_run(started.run_id)
            assert done.status is RunStatus.COMPLETED
            input_ref = assert_reference(done.input, over=INPUT_DOC, what="the run's input")
            node_a = done.node("a")
            assert node_a is not None
            assert_reference(node_a.output, over=OUTPUT_DOC, what="a's output")

            # download_blob of the input's reference gives the input's JSON.
            data = await client.download_blob(input_ref.sha256)
            assert len(data) == input_ref.size
            assert json.loads(data) == big_input
            assert await client.resolve_payload(done.input) == big_input

            # A small input stays inline.
            small = await client.start_run(registered.name, {"doc": "small", "n": 1})
            assert small.input == {"doc": "small", "n": 1}
            assert from_value(sent[-1].input) == {"doc": "small", "n": 1}
            assert (await client.get_run(small.run_id)).input == {"doc": "small", "n": 1}
            assert await client.wait_for_result(small.run_id, timeout=120) == {"a": OUTPUT_DOC, "b": OUTPUT_DOC}

            # Another namespace cannot read the blob.
            other = mint_token("admin", namespace=f"elsewhere-{names}")
            async with Client(server.address, token=other) as elsewhere:
                with pytest.raises(NotFoundError):
                    await elsewhere.download_blob(input_ref.sha256)

    await main()


def test_c23_large_payloads_move_through_the_blob_store_unseen_by_handlers(server: ServerProcess, names: str) -> None:
    run(c23_scenario(server, names))
