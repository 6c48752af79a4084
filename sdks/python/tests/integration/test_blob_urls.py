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

import pytest
from conftest import REPO, ServerProcess, _psql, _with_database
from test_payloads import c23_scenario, run


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
    run(c23_scenario(server, names, through_urls=True))

    counts = grpc_requests(metrics_url)
    shown = {name: value for name, value in counts.items() if "Blob" in name}
    assert counts.get("StartBlobUpload", 0) > 0, shown
    assert counts.get("FinishBlobUpload", 0) > 0, shown
    assert counts.get("GetBlobUrl", 0) > 0, shown
    assert counts.get("UploadBlob", 0) == 0, shown
    assert counts.get("DownloadBlob", 0) == 0, shown
