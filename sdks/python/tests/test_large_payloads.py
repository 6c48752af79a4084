"""Large payloads (C23 locally): the reference walk, the offload threshold, upload chunking and
resuming downloads, the Client's start_run / send_event / wait_for_result, and the Worker's input
resolution and output offloading, against the in-process fakes of tests/_fakes.py; and (C24
locally) the same through presigned URLs served by a loopback HTTP server, with their two
fallbacks to the streams."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
import pytest
from _fakes import URL_SIGNATURE, FakeServer, FakeStore, blob_head, busy, start_fake

from composer import (
    Backoff,
    BlobRef,
    Client,
    NotFoundError,
    ResourceExhaustedError,
    SyncClient,
    TaskContext,
    Worker,
)
from composer import _payloads
from composer._values import from_value, to_value
from composer.v1 import common_pb2, run_service_pb2, run_service_pb2_grpc

MIB = 1 << 20
FAST = Backoff(initial=0.01, maximum=0.05)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def ref(sha256: str, size: int = 10, head: str = "{") -> dict[str, Any]:
    return {"$blob": {"sha256": sha256, "size": size, "head": head}}


# --- the reference walk ---------------------------------------------------


def test_references_are_found_at_any_depth_in_document_order_and_not_looked_into() -> None:
    a, b, c = digest("a"), digest("b"), digest("c")
    value = {
        "first": ref(a),
        "list": [1, {"deep": [ref(b)]}, ref(a)],
        "not a reference": {"$blob": ref(c), "other": 1},
        "plain": {"$blobs": 1},
    }
    assert list(_payloads.references(value)) == [
        ("$.first", a),
        ("$.list[1].deep[0]", b),
        ("$.list[2]", a),
        ('$.not a reference.$blob', c),
    ]
    assert _payloads.is_reference(ref(a)) and not _payloads.is_reference({"$blob": {}, "x": 1})
    assert _payloads.has_references(value) and not _payloads.has_references({"a": [1, "$blob", {"b": None}]})
    assert list(_payloads.references(ref(a))) == [("$", a)]


def test_a_blob_object_that_names_no_digest_is_refused_naming_its_path() -> None:
    for bad in ({"$blob": "abc"}, {"$blob": {"sha256": "ABC"}}, {"$blob": {"size": 3}}, {"$blob": {"sha256": "A" * 64}}):
        with pytest.raises(ValueError, match=r"\$\.x\[0\]: a \$blob reference names no sha256"):
            list(_payloads.references({"x": [bad]}))


def test_resolve_downloads_each_digest_once_and_gives_independent_copies() -> None:
    big = {"doc": "x" * 1000, "n": 7}
    inner_text = json.dumps({"inner": True}, separators=(",", ":"))
    outer = {"wraps": ref(digest(inner_text)), "k": [1, 2]}
    outer_text = json.dumps(outer, separators=(",", ":"))
    big_text = json.dumps(big, separators=(",", ":"))
    store = {digest(big_text): big_text.encode(), digest(inner_text): inner_text.encode(), digest(outer_text): outer_text.encode()}
    fetched: list[str] = []

    async def fetch(sha256: str) -> bytes:
        fetched.append(sha256)
        return store[sha256]

    value = {"a": ref(digest(big_text)), "b": [ref(digest(big_text))], "c": ref(digest(outer_text)), "d": "kept"}
    before = json.dumps(value)
    resolved = asyncio.run(_payloads.resolve(value, fetch))
    assert resolved == {"a": big, "b": [big], "c": {"wraps": {"inner": True}, "k": [1, 2]}, "d": "kept"}
    assert sorted(fetched) == sorted(set(fetched)) and len(fetched) == 3  # each digest once, nested one too
    assert resolved["a"] is not resolved["b"][0]  # parsed anew for each place
    assert json.dumps(value) == before  # the input is untouched

    # A value without references comes back equal (a copy); no download.
    fetched.clear()
    plain = {"x": [1, {"y": None}]}
    copy = asyncio.run(_payloads.resolve(plain, fetch))
    assert copy == plain and copy is not plain and fetched == []

    # A blob that is not JSON is named with its path.
    store[digest("junk")] = b"not json"
    with pytest.raises(ValueError, match=r"\$\.z: blob .* is not JSON"):
        asyncio.run(_payloads.resolve({"z": ref(digest("junk"))}, fetch))


# --- the threshold and the chunks ---------------------------------------------


def test_the_threshold_compares_the_compact_utf8_json_and_zero_offloads_nothing() -> None:
    value = {"a": [1, 2], "b": "é"}
    text = _payloads.compact_json(value)
    assert text == '{"a":[1,2],"b":"é"}'.encode()  # no spaces, non-ASCII as UTF-8 (2 bytes)
    assert len(text) == 20
    assert _payloads.oversized_json(value, 0) is None
    assert _payloads.oversized_json(value, 20) is None  # "longer than": equal stays inline
    assert _payloads.oversized_json(value, 19) == text
    assert _payloads.oversized_json(None, 1) is None
    with pytest.raises(TypeError):
        _payloads.oversized_json({"s": {1, 2}}, 1)
    with pytest.raises(ValueError):
        _payloads.oversized_json({"f": float("nan")}, 1)


def test_uploads_go_in_chunks_of_at_most_one_mib() -> None:
    data = b"x" * (2 * MIB + MIB // 2)
    chunks = list(_payloads.upload_requests(data))
    assert [len(c.data) for c in chunks] == [MIB, MIB, MIB // 2]
    assert b"".join(c.data for c in chunks) == data
    assert [len(c.data) for c in _payloads.upload_requests(b"x" * MIB)] == [MIB]
    assert [c.data for c in _payloads.upload_requests(b"")] == [b""]
    assert [len(c.data) for c in _payloads.upload_requests(b"12345", chunk_bytes=2)] == [2, 2, 1]


def test_blob_ref_is_the_reference_object_and_back() -> None:
    blob = BlobRef(sha256=digest("a"), size=12, head='{"doc"')
    assert blob.reference() == ref(digest("a"), 12, '{"doc"')
    assert BlobRef.from_reference(blob.reference()) == blob
    with pytest.raises(ValueError, match="not a reference"):
        BlobRef.from_reference({"$blob": {"sha256": digest("a")}, "x": 1})


# --- the Client -------------------------------------------------------------


class FakeRuns(run_service_pb2_grpc.RunServiceServicer):
    """Records StartRun and SendEvent; runs have the ``output`` a test sets."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.output: Any = None

    def _run(self, run_id: str, status: int) -> common_pb2.Run:
        run = common_pb2.Run(run_id=run_id, workflow_name="wf", status=status)  # type: ignore[arg-type]
        if self.output is not None:
            run.output.CopyFrom(to_value(self.output))
        return run

    async def StartRun(self, request: Any, context: Any) -> run_service_pb2.StartRunResponse:
        self.requests.append(request)
        return run_service_pb2.StartRunResponse(run=self._run("r-1", common_pb2.RUN_STATUS_RUNNING), created=True)

    async def SendEvent(self, request: Any, context: Any) -> run_service_pb2.SendEventResponse:
        self.requests.append(request)
        return run_service_pb2.SendEventResponse()

    async def GetRun(self, request: Any, context: Any) -> run_service_pb2.GetRunResponse:
        return run_service_pb2.GetRunResponse(run=self._run(request.run_id, common_pb2.RUN_STATUS_COMPLETED))

    async def WatchRun(self, request: Any, context: Any) -> Any:
        yield run_service_pb2.WatchRunResponse(run=self._run(request.run_id, common_pb2.RUN_STATUS_COMPLETED))


def with_client(
    test: Callable[[Client, FakeServer, FakeRuns], Coroutine[Any, Any, None]],
    *,
    offload: int = 100,
    state: FakeServer | None = None,
) -> None:
    async def main() -> None:
        nonlocal state
        if state is None:
            state = FakeServer(payload_offload_bytes=offload)
        runs = FakeRuns()
        server, address = await start_fake(
            state, also=lambda s: run_service_pb2_grpc.add_RunServiceServicer_to_server(runs, s)
        )
        try:
            async with Client(address) as client:
                await asyncio.wait_for(test(client, state, runs), 30)
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_upload_blob_streams_chunks_and_download_blob_gives_the_bytes_back() -> None:
    async def test(client: Client, state: FakeServer, runs: FakeRuns) -> None:
        data = json.dumps({"doc": "y" * (2 * MIB + 10)}).encode()
        blob = await client.upload_blob(data)
        assert state.upload_chunks == [[MIB, MIB, len(data) - 2 * MIB]]
        assert (blob.sha256, blob.size) == (hashlib.sha256(data).hexdigest(), len(data))
        assert blob.head.startswith('{"doc"') and len(blob.head.encode()) <= 256
        assert await client.download_blob(blob.sha256) == data

        # A stream that breaks goes on from where it stopped.
        state.download_chunk_bytes = 1000
        state.downloads.clear()
        state.break_downloads = 1
        assert await client.download_blob(blob.sha256) == data
        assert state.downloads == [(blob.sha256, 0), (blob.sha256, 1000)]

        with pytest.raises(NotFoundError):
            await client.download_blob(digest("nothing stored"))
        with pytest.raises(ValueError, match="64 lowercase hex"):
            await client.download_blob("../etc/passwd")
        state.max_blob_bytes = 10
        with pytest.raises(ResourceExhaustedError):
            await client.upload_blob(b'"more than ten bytes"')
        with pytest.raises(TypeError):
            await client.upload_blob("text")  # type: ignore[arg-type]

    with_client(test)


def test_start_run_and_send_event_offload_only_what_passes_the_threshold() -> None:
    async def test(client: Client, state: FakeServer, runs: FakeRuns) -> None:
        small = {"doc": "s" * 50}
        big = {"doc": "b" * 200, "n": 7}
        await client.start_run("wf", small)
        assert from_value(runs.requests[-1].input) == small
        assert state.blobs == {}

        await client.start_run("wf", big)
        sent = from_value(runs.requests[-1].input)
        text = json.dumps(big, separators=(",", ":")).encode()
        assert sent == ref(hashlib.sha256(text).hexdigest(), len(text), text.decode())
        assert state.blobs[sent["$blob"]["sha256"]] == text

        await client.send_event("paid", big, run_id="r-1")
        assert from_value(runs.requests[-1].payload) == sent  # the same bytes, the same blob
        await client.send_event("paid", [1, 2], correlation_key="k")
        assert from_value(runs.requests[-1].payload) == [1, 2]
        await client.start_run("wf")  # no input: nothing to measure
        assert not runs.requests[-1].HasField("input")

        assert state.server_info_calls == 1  # asked once, kept
        assert len(state.upload_chunks) == 2

    with_client(test)


def test_a_server_that_offloads_nothing_gets_every_value_inline() -> None:
    async def test(client: Client, state: FakeServer, runs: FakeRuns) -> None:
        big = {"doc": "b" * 5000}
        await client.start_run("wf", big)
        await client.send_event("e", big, run_id="r-1")
        assert from_value(runs.requests[0].input) == big and from_value(runs.requests[1].payload) == big
        assert state.upload_chunks == [] and state.server_info_calls == 1
        assert (await client.server_info()).payload_offload_bytes == 0

    with_client(test, offload=0)


def test_wait_for_result_resolves_the_output_and_get_run_shows_references() -> None:
    async def test(client: Client, state: FakeServer, runs: FakeRuns) -> None:
        doc = {"doc": "z" * 300}
        reference = state.put_blob(doc)
        runs.output = {"a": reference, "b": [reference], "n": 1}
        assert await client.wait_for_result("r-1", timeout=10) == {"a": doc, "b": [doc], "n": 1}
        assert len(state.downloads) == 1  # one distinct blob, one download
        assert (await client.get_run("r-1")).output == runs.output
        assert await client.resolve_payload(runs.output) == {"a": doc, "b": [doc], "n": 1}

    with_client(test)


def test_the_sync_facade_moves_blobs_too() -> None:
    async def main() -> None:
        state = FakeServer(payload_offload_bytes=10)
        server, address = await start_fake(state)

        def script() -> None:
            with SyncClient(address) as client:
                blob = client.upload_blob(b'{"k":"v"}')
                assert client.download_blob(blob.sha256) == b'{"k":"v"}'
                assert client.resolve_payload({"x": blob.reference()}) == {"x": {"k": "v"}}

        try:
            await asyncio.to_thread(script)
        finally:
            await server.stop(None)

    asyncio.run(main())


# --- the Worker ---------------------------------------------------------------


def with_worker(
    test: Callable[[FakeServer, Worker], Coroutine[Any, Any, None]],
    *,
    offload: int = 100,
    check_server: bool = True,
    report_timeout: float = 300.0,
    state: FakeServer | None = None,
) -> None:
    async def main() -> None:
        nonlocal state
        if state is None:
            state = FakeServer(payload_offload_bytes=offload)
        server, address = await start_fake(state)
        worker = Worker(
            address,
            queues=["q"],
            backoff=FAST,
            poll_wait=0.3,
            check_server=check_server,
            report_timeout=report_timeout,
        )
        serving = asyncio.create_task(worker.serve())
        try:
            await asyncio.wait_for(test(state, worker), 30)
        finally:
            worker.stop()
            await asyncio.wait_for(serving, 15)
            await server.stop(None)

    asyncio.run(main())


async def reported(state: FakeServer, task_id: str) -> Any:
    while task_id not in state.completed and task_id not in state.failed:
        await asyncio.sleep(0.01)
    return state.completed.get(task_id) or state.failed[task_id]


def test_handlers_see_resolved_inputs_and_large_outputs_are_reported_as_references() -> None:
    seen: list[Any] = []

    async def test(state: FakeServer, worker: Worker) -> None:
        doc = {"doc": "d" * 500, "n": 7}
        reference = state.put_blob(doc)

        @worker.task("q", "echo")
        def echo(ctx: TaskContext) -> Any:
            seen.append(ctx.input)
            return ctx.input

        big = await reported(state, state.add_task("echo", {"whole": reference, "list": [reference, 1]}))
        assert seen[-1] == {"whole": doc, "list": [doc, 1]}
        output = from_value(big.output)
        text = json.dumps(seen[-1], separators=(",", ":")).encode()
        assert output == ref(hashlib.sha256(text).hexdigest(), len(text), blob_head(text))
        assert state.blobs[output["$blob"]["sha256"]] == text
        assert len(state.downloads) == 1  # one distinct blob

        small = await reported(state, state.add_task("echo", {"n": 1}))
        assert from_value(small.output) == {"n": 1}
        # The threshold came from the protocol check: no second GetServerInfo.
        assert state.server_info_calls == 1

    with_worker(test)


def test_a_worker_without_the_protocol_check_asks_for_the_threshold_once() -> None:
    async def test(state: FakeServer, worker: Worker) -> None:
        @worker.task("q", "big")
        async def big(ctx: TaskContext) -> Any:
            return {"doc": "x" * 50}

        first = await reported(state, state.add_task("big"))
        second = await reported(state, state.add_task("big"))
        assert "$blob" in from_value(first.output) and "$blob" in from_value(second.output)
        assert state.server_info_calls == 1

    with_worker(test, offload=10, check_server=False)


def test_with_offloading_off_outputs_stay_inline() -> None:
    async def test(state: FakeServer, worker: Worker) -> None:
        @worker.task("q", "big")
        async def big(ctx: TaskContext) -> Any:
            return {"doc": "x" * 5000}

        done = await reported(state, state.add_task("big"))
        assert from_value(done.output) == {"doc": "x" * 5000}
        assert state.upload_chunks == []

    with_worker(test, offload=0)


def test_an_input_naming_a_missing_blob_or_no_digest_fails_without_running_the_handler() -> None:
    ran: list[Any] = []

    async def test(state: FakeServer, worker: Worker) -> None:
        @worker.task("q", "t")
        def handler(ctx: TaskContext) -> Any:
            ran.append(ctx.input)
            return None

        missing = await reported(state, state.add_task("t", {"x": ref(digest("never stored"))}))
        assert (missing.error_code, missing.retryable) == ("INPUT_UNAVAILABLE", False)
        assert "NOT_FOUND" in missing.message
        bad = await reported(state, state.add_task("t", {"x": {"$blob": {"sha256": "nope"}}}))
        assert (bad.error_code, bad.retryable) == ("INPUT_UNAVAILABLE", False)
        assert "$.x" in bad.message
        assert ran == []

    with_worker(test)


def test_a_transient_download_failure_is_a_retryable_failure() -> None:
    async def test(state: FakeServer, worker: Worker) -> None:
        reference = state.put_blob({"doc": "q" * 3000})
        state.download_chunk_bytes = 100
        state.break_downloads = 10  # more breaks than the download resumes

        @worker.task("q", "t")
        def handler(ctx: TaskContext) -> Any:
            return None

        failed = await reported(state, state.add_task("t", reference))
        assert (failed.error_code, failed.retryable) == ("INPUT_UNAVAILABLE", True)
        assert "UNAVAILABLE" in failed.message

    with_worker(test)


def test_an_input_download_refused_by_a_busy_server_is_a_retryable_failure() -> None:
    async def test(state: FakeServer, worker: Worker) -> None:
        reference = state.put_blob({"doc": "q" * 3000})
        state.inject["DownloadBlob"] += [busy("QUOTA_EXCEEDED", retry_after=0.02)]
        ran: list[Any] = []

        @worker.task("q", "t")
        def handler(ctx: TaskContext) -> Any:
            ran.append(ctx.input)

        failed = await reported(state, state.add_task("t", reference))
        assert (failed.error_code, failed.retryable) == ("INPUT_UNAVAILABLE", True)
        assert "QUOTA_EXCEEDED" in failed.message
        assert ran == []

    with_worker(test)


def test_an_output_the_server_refuses_for_its_size_fails_as_output_too_large() -> None:
    """L3 and L6: the payload limit's RESOURCE_EXHAUSTED (a BadRequest naming ``data``, no ErrorInfo)
    fails the attempt for good, without a second upload."""

    async def test(state: FakeServer, worker: Worker) -> None:
        state.max_blob_bytes = 1000

        @worker.task("q", "huge")
        async def huge(ctx: TaskContext) -> Any:
            return {"doc": "h" * 5000}

        failed = await reported(state, state.add_task("huge"))
        assert (failed.error_code, failed.retryable) == ("OUTPUT_TOO_LARGE", False)
        assert "payload limit" in failed.message
        assert len(state.upload_chunks) == 1

    with_worker(test)


def test_an_upload_refused_by_a_busy_server_is_sent_again_after_the_retry_delay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """L6: a quota's refusal waits its RetryInfo delay, the CPU pool's (no RetryInfo here) the worker's
    backoff; the third upload passes and the task completes with the reference."""
    caplog.set_level(logging.INFO, logger="composer.worker")

    async def test(state: FakeServer, worker: Worker) -> None:
        state.inject["UploadBlob"] += [busy("QUOTA_EXCEEDED", retry_after=0.03), busy("CPU_POOL_BUSY")]

        @worker.task("q", "big")
        async def big(ctx: TaskContext) -> Any:
            return {"doc": "b" * 500}

        done = await reported(state, state.add_task("big"))
        text = json.dumps({"doc": "b" * 500}, separators=(",", ":")).encode()
        assert from_value(done.output) == ref(hashlib.sha256(text).hexdigest(), len(text), blob_head(text))
        assert len(state.upload_chunks) == 3 and state.failed == {}

    with_worker(test)
    delays = re.findall(r"output upload failed \(RESOURCE_EXHAUSTED\); again in ([0-9.]+) s", caplog.text)
    assert delays[0] == "0.03"  # the server's delay: FAST's first is at most 0.01
    assert float(delays[1]) <= FAST.cap(2)


def test_an_upload_refused_by_a_busy_server_until_the_deadline_fails_retryably() -> None:
    """L6: still busy at the report deadline, the attempt fails with OUTPUT_UPLOAD_FAILED, retryable
    (another attempt may find room), not with OUTPUT_TOO_LARGE."""

    async def test(state: FakeServer, worker: Worker) -> None:
        state.inject["UploadBlob"] += [busy("QUOTA_EXCEEDED", retry_after=0.02)] * 10_000

        @worker.task("q", "big")
        async def big(ctx: TaskContext) -> Any:
            return {"doc": "b" * 500}

        failed = await reported(state, state.add_task("big"))
        assert (failed.error_code, failed.retryable) == ("OUTPUT_UPLOAD_FAILED", True)
        assert "QUOTA_EXCEEDED" in failed.message
        assert len(state.upload_chunks) > 1 and state.completed == {}

    with_worker(test, report_timeout=0.3)


def test_server_info_reports_the_payload_limits() -> None:
    async def test(client: Client, state: FakeServer, runs: FakeRuns) -> None:
        info = await client.server_info()
        assert (info.payload_offload_bytes, info.max_payload_bytes, info.max_message_bytes) == (100, 1 << 30, 4 << 20)

    with_client(test)


# --- presigned URLs (C24) -------------------------------------------------------


def url_server(offload: int = 100) -> FakeServer:
    """A fake server whose GetServerInfo says ``blob_urls``."""
    return FakeServer(payload_offload_bytes=offload, blob_urls=True)


def closed_port_url() -> str:
    """``http://127.0.0.1:<port>`` of a loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def no_url_in(text: str) -> None:
    """A URL is a credential: no log line shows one (its signature, its path)."""
    assert URL_SIGNATURE.split("=")[1] not in text
    assert "/uploads/" not in text and "/blobs/" not in text


def test_with_blob_urls_the_client_moves_blobs_through_presigned_urls(caplog: pytest.LogCaptureFixture) -> None:
    """C24: upload = StartBlobUpload, one PUT (Content-Length set), FinishBlobUpload; download =
    GetBlobUrl, one GET; start_run and wait_for_result go the same way; NOT_FOUND stays NOT_FOUND;
    the streams are never used and no URL is logged."""
    caplog.set_level(logging.DEBUG, logger="composer")
    state = url_server()

    async def test(client: Client, state: FakeServer, runs: FakeRuns) -> None:
        assert (await client.server_info()).blob_urls is True
        data = json.dumps({"doc": "u" * (2 * MIB)}).encode()
        blob = await client.upload_blob(data)
        assert (blob.sha256, blob.size) == (hashlib.sha256(data).hexdigest(), len(data))
        assert blob.head.startswith('{"doc"')
        assert state.url_calls == ["StartBlobUpload", "FinishBlobUpload"]
        [(method, path, headers)] = state.http_requests
        assert (method, path.rsplit("/", 1)[0]) == ("PUT", "/uploads")
        assert headers["Content-Length"] == str(len(data))
        assert state.blobs[blob.sha256] == data

        assert await client.download_blob(blob.sha256) == data
        assert state.url_calls[-1] == "GetBlobUrl"
        assert state.http_requests[-1][:2] == ("GET", f"/blobs/{blob.sha256}")

        # Everything C23 moves goes the same way.
        big = {"doc": "b" * 200, "n": 7}
        await client.start_run("wf", big)
        sent = from_value(runs.requests[-1].input)
        assert state.blobs[sent["$blob"]["sha256"]] == json.dumps(big, separators=(",", ":")).encode()
        runs.output = {"a": sent, "b": [sent]}
        assert await client.wait_for_result("r-1", timeout=10) == {"a": big, "b": [big]}
        assert [m for m, _, _ in state.http_requests] == ["PUT", "GET", "PUT", "GET"]

        with pytest.raises(NotFoundError):
            await client.download_blob(digest("nothing stored"))
        assert state.url_calls[-1] == "GetBlobUrl"

        # The streams were never used.
        assert state.upload_chunks == [] and state.downloads == []

    with FakeStore(state):
        with_client(test, state=state)
    assert "uploaded through a URL" in caplog.text
    no_url_in(caplog.text)


def test_with_blob_urls_a_worker_moves_inputs_and_outputs_through_urls() -> None:
    """C24 in the worker: the input's references are read with GETs, the large output written with a
    PUT and FinishBlobUpload; no stream is used."""
    seen: list[Any] = []
    state = url_server()

    async def test(state: FakeServer, worker: Worker) -> None:
        doc = {"doc": "d" * 500, "n": 7}
        reference = state.put_blob(doc)

        @worker.task("q", "echo")
        def echo(ctx: TaskContext) -> Any:
            seen.append(ctx.input)
            return ctx.input

        done = await reported(state, state.add_task("echo", {"whole": reference, "list": [reference]}))
        assert seen == [{"whole": doc, "list": [doc]}]
        output = from_value(done.output)
        text = json.dumps(seen[0], separators=(",", ":")).encode()
        assert output == ref(hashlib.sha256(text).hexdigest(), len(text), blob_head(text))
        assert state.blobs[output["$blob"]["sha256"]] == text
        assert state.url_calls == ["GetBlobUrl", "StartBlobUpload", "FinishBlobUpload"]
        assert [m for m, _, _ in state.http_requests] == ["GET", "PUT"]
        assert state.upload_chunks == [] and state.downloads == []

    with FakeStore(state):
        with_worker(test, state=state)


def test_a_url_call_refused_with_failed_precondition_sends_every_blob_through_the_streams_from_then_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C24: the server stops giving URLs (FAILED_PRECONDITION): that transfer goes through the stream,
    and so does every later one of that client, even after GetServerInfo says blob_urls again."""
    caplog.set_level(logging.DEBUG, logger="composer")
    state = url_server()
    state.inject["StartBlobUpload"].append(grpc.StatusCode.FAILED_PRECONDITION)

    async def test(client: Client, state: FakeServer, runs: FakeRuns) -> None:
        data = b'{"doc":"refused"}'
        blob = await client.upload_blob(data)
        assert state.url_calls == ["StartBlobUpload"]
        assert state.upload_chunks == [[len(data)]]
        assert blob.sha256 == hashlib.sha256(data).hexdigest()

        assert await client.download_blob(blob.sha256) == data
        await client.upload_blob(b'{"doc":"again"}')
        assert (await client.server_info()).blob_urls is True
        await client.start_run("wf", {"doc": "b" * 200})
        runs.output = state.put_blob({"doc": "o" * 200})
        assert await client.wait_for_result("r-1", timeout=10) == {"doc": "o" * 200}

        assert state.url_calls == ["StartBlobUpload"]  # no URL call after the refusal
        assert len(state.upload_chunks) == 3 and len(state.downloads) == 2
        assert state.http_requests == []

    with FakeStore(state):
        with_client(test, state=state)
    assert "blobs go through its streams from now on" in caplog.text


def test_a_server_that_stops_giving_urls_is_seen_on_a_download_too() -> None:
    """C24: GetBlobUrl answered FAILED_PRECONDITION (the server's blob_urls went off): the download
    goes through the stream, and the next upload goes straight to the stream."""
    state = url_server()

    async def test(client: Client, state: FakeServer, runs: FakeRuns) -> None:
        blob = await client.upload_blob(b'{"doc":"first"}')  # through the URL
        assert state.url_calls == ["StartBlobUpload", "FinishBlobUpload"]
        state.blob_urls = False
        assert await client.download_blob(blob.sha256) == b'{"doc":"first"}'
        await client.upload_blob(b'{"doc":"second"}')
        assert state.url_calls == ["StartBlobUpload", "FinishBlobUpload", "GetBlobUrl"]
        assert len(state.downloads) == 1 and len(state.upload_chunks) == 1

    with FakeStore(state):
        with_client(test, state=state)


def test_a_worker_refused_a_url_uses_the_streams_from_then_on() -> None:
    """C24 in the worker: GetBlobUrl answered FAILED_PRECONDITION for the first input; that input and
    everything after (the next task's input, the outputs) go through the streams."""
    seen: list[Any] = []
    state = url_server()
    state.inject["GetBlobUrl"].append(grpc.StatusCode.FAILED_PRECONDITION)

    async def test(state: FakeServer, worker: Worker) -> None:
        doc = {"doc": "d" * 500}
        reference = state.put_blob(doc)

        @worker.task("q", "echo")
        def echo(ctx: TaskContext) -> Any:
            seen.append(ctx.input)
            return ctx.input

        first = await reported(state, state.add_task("echo", reference))
        second = await reported(state, state.add_task("echo", [reference]))
        assert seen == [doc, [doc]]
        assert "$blob" in from_value(first.output) and "$blob" in from_value(second.output)
        assert state.url_calls == ["GetBlobUrl"]
        assert len(state.downloads) == 2 and len(state.upload_chunks) == 2
        assert state.http_requests == []

    with FakeStore(state):
        with_worker(test, state=state)


def test_a_url_whose_http_request_fails_sends_that_transfer_through_the_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C24: a PUT or GET that fails (nothing listens at the URL's port; the store answers 403) sends
    that one transfer through the stream; the next one tries its URL again. No log shows a URL."""
    caplog.set_level(logging.DEBUG, logger="composer")
    state = url_server()

    async def test(client: Client, state: FakeServer, runs: FakeRuns) -> None:
        store_url = state.url_base
        state.url_base = closed_port_url()  # the store unreachable from here
        data = b'{"doc":"unreachable"}'
        blob = await client.upload_blob(data)
        assert blob.sha256 == hashlib.sha256(data).hexdigest() and state.blobs[blob.sha256] == data
        assert state.url_calls == ["StartBlobUpload"]
        assert state.upload_chunks == [[len(data)]]
        assert await client.download_blob(blob.sha256) == data
        assert state.url_calls == ["StartBlobUpload", "GetBlobUrl"]
        assert len(state.downloads) == 1

        # The store answers, but refuses one request: only that transfer takes the stream.
        state.url_base = store_url
        state.http_failures = 1
        other = await client.upload_blob(b'{"doc":"refused once"}')
        assert len(state.upload_chunks) == 2
        assert await client.download_blob(other.sha256) == b'{"doc":"refused once"}'
        assert len(state.downloads) == 1  # through the URL this time
        assert state.url_calls[2:] == ["StartBlobUpload", "GetBlobUrl"]
        assert [(m, p.split("/")[1]) for m, p, _ in state.http_requests] == [("PUT", "uploads"), ("GET", "blobs")]

    with FakeStore(state):
        with_client(test, state=state)
    assert "failed (ConnectionRefusedError" in caplog.text and "failed (HTTP 403)" in caplog.text
    no_url_in(caplog.text)
