"""C24: presigned URLs move blobs straight to and from the store (tests/conformance/README.md,
decision 0056), against the real server.

The test starts its own moto S3 server (``.tools/moto/bin/moto_server``, installed by
scripts/setup.sh) and its own Composer server on a database of its own, keeping its blobs in a
bucket of that moto (which signs URLs, so GetServerInfo says ``blob_urls``) and serving
``/metrics``. C23's run (tests/integration/test_payloads.py) then gives C23's result, and the
server's ``composer_grpc_requests_total`` shows that the bytes went through URLs
(StartBlobUpload, FinishBlobUpload, GetBlobUrl) and never through the streams (UploadBlob,
DownloadBlob).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import FAST, POLL_WAIT, Recorder, serving
from conftest import REPO, ServerProcess, _psql, _with_database, mint_token
from test_payloads import INPUT_DOC, OUTPUT_DOC, a_then_b, assert_reference, run

from composer import Client, NotFoundError, RunStatus, TaskContext, Worker
from composer._values import from_value
from composer.v1 import run_service_pb2

MOTO = Path(os.environ.get("COMPOSER_TEST_MOTO_SERVER", REPO / ".tools" / "moto" / "bin" / "moto_server"))
BUCKET = "composer-python-urls"


def free_port() -> int:
    """A loopback port free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture()
def moto(tmp_path: Path) -> Iterator[str]:
    """A moto S3 server on a free loopback port with the bucket BUCKET; its endpoint. Stopped after."""
    if not MOTO.is_file():
        pytest.fail(f"{MOTO} is missing: run scripts/setup.sh (it installs moto, the S3 API this test uses)")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with (tmp_path / "moto.log").open("wb") as log:
        process = subprocess.Popen(
            [str(MOTO), "-H", "127.0.0.1", "-p", str(port)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                # Making the bucket is also the sign that moto answers.
                make_bucket = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
                with urllib.request.urlopen(make_bucket, timeout=2) as answer:
                    if 200 <= answer.status < 300:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                log_text = (tmp_path / "moto.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"moto did not answer within 30 s; its log:\n{log_text}")
            time.sleep(0.1)
        yield endpoint
    finally:
        stop(process)


@pytest.fixture()
def own_database(backing_services: tuple[str, str]) -> Iterator[str]:
    """A database of the test's own (dropped after): its blob rows name blobs of the bucket only."""
    admin = os.environ["COMPOSER_TEST_DATABASE_URL"]
    name = f"composer_sdk_py_urls_{uuid.uuid4().hex[:12]}"
    _psql(admin, f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(admin, name)
    finally:
        try:
            _psql(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except subprocess.CalledProcessError:
            pass


@pytest.fixture()
def bucket_server(
    moto: str, own_database: str, backing_services: tuple[str, str], tmp_path: Path
) -> Iterator[tuple[ServerProcess, str]]:
    """A server keeping its blobs in the bucket, serving /metrics; the server and the metrics URL."""
    _, redis_url = backing_services
    metrics = f"127.0.0.1:{free_port()}"
    options = {
        "aws_endpoint": moto,
        "aws_allow_http": "true",
        "aws_access_key_id": "test",
        "aws_secret_access_key": "test",
        "aws_region": "us-east-1",
        "aws_virtual_hosted_style_request": "false",
    }
    extra = [arg for key, value in options.items() for arg in ("--blob-store-option", f"{key}={value}")]
    process = ServerProcess(
        own_database,
        redis_url,
        tmp_path / "bucket-server.log",
        [*extra, "--metrics-listen", metrics],
        blob_store=f"s3://{BUCKET}/composer",
    )
    process.start()
    try:
        yield process, f"http://{metrics}/metrics"
    finally:
        process.stop()


_SAMPLE = re.compile(r"^composer_grpc_requests_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_METHOD = re.compile(r'method="(?P<method>[^"]*)"')


def grpc_requests(metrics_url: str) -> dict[str, float]:
    """``composer_grpc_requests_total`` by method name (its last path segment), every code summed."""
    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        sample = _SAMPLE.match(line.strip())
        if sample is None:
            continue
        method = _METHOD.search(sample.group("labels"))
        if method is None:
            continue
        name = method.group("method").rsplit("/", 1)[-1]
        counts[name] = counts.get(name, 0.0) + float(sample.group("value"))
    assert counts, f"no composer_grpc_requests_total sample in:\n{text[:3000]}"
    return counts


def test_c24_presigned_urls_move_blobs_straight_to_and_from_the_store(
    bucket_server: tuple[ServerProcess, str], names: str
) -> None:
    server, metrics_url = bucket_server
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
            assert info.blob_urls, info
            assert 0 < info.payload_offload_bytes < INPUT_DOC, info

            sent: list[run_service_pb2.StartRunRequest] = []
            start_run = client._conn.runs.StartRun

            def recording(request: run_service_pb2.StartRunRequest, **kwargs: Any) -> Any:
                sent.append(request)
                return start_run(request, **kwargs)

            client._conn.runs.StartRun = recording

            registered = await client.register_workflow(a_then_b(names))
            started = await client.start_run(registered.name, big_input)
            assert_reference(from_value(sent[-1].input), over=INPUT_DOC, what="the StartRun request's input")

            result = await client.wait_for_result(started.run_id, timeout=120)
            assert result == {"a": OUTPUT_DOC, "b": OUTPUT_DOC}, str(result)[:300]

            assert seen_by_a == [big_input], "a did not see the whole input"
            assert len(seen_by_b) == 1, "b ran more than once"
            assert seen_by_b[0] == {"doc": "q" * OUTPUT_DOC, "n": 7}, "b did not see a's whole output"
            reported = [from_value(r.output) for r in recorder.requests("CompleteTask")]
            assert len(reported) == 2, [str(output)[:200] for output in reported]
            assert_reference(reported[0], over=OUTPUT_DOC, what="a's CompleteTask output")
            assert reported[1] == OUTPUT_DOC
            # The worker read a's input and b's through URLs and wrote a's output through one.
            assert len(recorder.requests("GetBlobUrl")) == 2, [name for name, _ in recorder.calls]
            assert len(recorder.requests("StartBlobUpload")) == 1
            assert len(recorder.requests("FinishBlobUpload")) == 1

            done = await client.get_run(started.run_id)
            assert done.status is RunStatus.COMPLETED
            input_ref = assert_reference(done.input, over=INPUT_DOC, what="the run's input")
            node_a = done.node("a")
            assert node_a is not None
            assert_reference(node_a.output, over=OUTPUT_DOC, what="a's output")

            data = await client.download_blob(input_ref.sha256)
            assert len(data) == input_ref.size
            assert json.loads(data) == big_input
            assert await client.resolve_payload(done.input) == big_input

            small = await client.start_run(registered.name, {"doc": "small", "n": 1})
            assert small.input == {"doc": "small", "n": 1}
            assert from_value(sent[-1].input) == {"doc": "small", "n": 1}
            assert (await client.get_run(small.run_id)).input == {"doc": "small", "n": 1}
            assert await client.wait_for_result(small.run_id, timeout=120) == {"a": OUTPUT_DOC, "b": OUTPUT_DOC}

            # Another namespace cannot read the blob: GetBlobUrl's NOT_FOUND stays NOT_FOUND.
            other = mint_token("admin", namespace=f"elsewhere-{names}")
            async with Client(server.address, token=other) as elsewhere:
                with pytest.raises(NotFoundError):
                    await elsewhere.download_blob(input_ref.sha256)

    run(main())

    counts = grpc_requests(metrics_url)
    shown = {name: value for name, value in counts.items() if "Blob" in name}
    assert counts.get("StartBlobUpload", 0) > 0, shown
    assert counts.get("FinishBlobUpload", 0) > 0, shown
    assert counts.get("GetBlobUrl", 0) > 0, shown
    assert counts.get("UploadBlob", 0) == 0, shown
    assert counts.get("DownloadBlob", 0) == 0, shown
