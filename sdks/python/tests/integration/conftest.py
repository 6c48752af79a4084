"""Fixtures that run the real Composer server for the SDK's integration tests.

Needs ``COMPOSER_TEST_DATABASE_URL`` (an admin URL of a Postgres: a fresh
database is created for the session and dropped after) and
``COMPOSER_TEST_REDIS_URL``, as ``scripts/with-services.sh`` exports them, and
the binary ``target/debug/composer`` (or ``COMPOSER_BIN``). From the repo root::

    scripts/with-services.sh .tools/venv-sdk-python/bin/python -m pytest sdks/python/tests/integration

The tests run on two processes (pytest.ini): each process has its own
session database and server, and they share the one Redis (every test's
queues have names of their own).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

REPO = Path(__file__).resolve().parents[4]
BINARY = Path(os.environ.get("COMPOSER_BIN", REPO / "target" / "debug" / "composer"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.integration)


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def _psql(admin_url: str, sql: str) -> None:
    psql = shutil.which("psql")
    if psql is None:
        pytest.fail("psql is not on PATH: it is needed to create the test database")
    subprocess.run([psql, admin_url, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], check=True, capture_output=True)


# The servers under test check tokens; the session's token comes from
# `composer token` signed with this secret and reaches every Client and
# Worker (and worker subprocesses) through COMPOSER_TOKEN.
AUTH_SECRET = "python-sdk-integration-secret-0123456789abcdef"


def mint_token(*roles: str, namespace: str = "default", subject: str = "python-tests") -> str:
    """A token for ``roles``, minted by the composer binary itself."""
    result = subprocess.run(
        [str(BINARY), "token", "--sub", subject, "--ns", namespace, "--role", ",".join(roles), "--ttl", "2h"],
        env={**os.environ, "COMPOSER_AUTH_SECRET": AUTH_SECRET},
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip()


@pytest.fixture(scope="session", autouse=True)
def session_token() -> Iterator[str]:
    """Puts an admin token in COMPOSER_TOKEN for the whole session."""
    token = mint_token("admin")
    previous = os.environ.get("COMPOSER_TOKEN")
    os.environ["COMPOSER_TOKEN"] = token
    try:
        yield token
    finally:
        if previous is None:
            os.environ.pop("COMPOSER_TOKEN", None)
        else:
            os.environ["COMPOSER_TOKEN"] = previous


def write_secrets_key(path: Path) -> Path:
    """Writes a fresh key-encryption key for `composer serve --secrets-key-file` (64 hex digits,
    as `composer secret new-key` prints), readable by its owner only."""
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


class ServerProcess:
    """One `composer serve` process; restartable on the same port. ``extra_args`` are added to `serve`;
    ``secrets_key_file`` is its `--secrets-key-file` (None: a server with no secrets key);
    ``blob_store`` its `--blob-store`, a folder (the session's: the tests write nowhere else), or a
    bucket's URL (``s3://...``, with its `--blob-store-option`s in ``extra_args``)."""

    def __init__(
        self,
        database_url: str,
        redis_url: str,
        log_path: Path,
        extra_args: Sequence[str] = (),
        *,
        blob_store: Path | str,
        secrets_key_file: Path | None = None,
    ) -> None:
        self.database_url = database_url
        self.redis_url = redis_url
        self.log_path = log_path
        self.blob_store = blob_store
        self.extra_args = ["--blob-store", str(blob_store), *extra_args]
        if secrets_key_file is not None:
            self.extra_args += ["--secrets-key-file", str(secrets_key_file)]
        self.address = ""
        self.process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def start(self, port: int = 0, timeout: float = 60.0) -> str:
        """Starts the server (on ``port``, 0 for a free one) and waits for its `listening` line."""
        if not BINARY.exists():
            pytest.fail(f"{BINARY} is missing: run `cargo build -p composer-cli` (scripts/with-services.sh does)")
        self.process = subprocess.Popen(
            [
                str(BINARY),
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--log-format",
                "json",
                "--database-url",
                self.database_url,
                "--redis-url",
                self.redis_url,
                "--auth-secret",
                AUTH_SECRET,
                # No load balancer to leave: a stop or restart need not keep answering for 1 s.
                "--drain-delay",
                "0s",
                *self.extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        ready = threading.Event()
        found: list[str] = []
        process = self.process

        def read() -> None:
            assert process.stderr is not None
            with self.log_path.open("ab") as log:
                for line in process.stderr:
                    log.write(line)
                    log.flush()
                    if not ready.is_set():
                        try:
                            record = json.loads(line)
                        except ValueError:
                            continue
                        fields = record.get("fields", record) if isinstance(record, dict) else {}
                        message = fields.get("message", record.get("message") if isinstance(record, dict) else None)
                        addr = fields.get("addr", record.get("addr") if isinstance(record, dict) else None)
                        if message == "listening" and addr:
                            found.append(str(addr))
                            ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(timeout) or not found:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-4000:]
            pytest.fail(f"the server did not start listening within {timeout} s; its log:\n{tail}")
        self.address = found[0]
        return self.address

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return int(self.address.rsplit(":", 1)[1])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Stops the server (SIGTERM, then SIGKILL after ``timeout``)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self._reader is not None:
            self._reader.join(5)

    def restart(self, sig: int = signal.SIGTERM) -> None:
        """Stops the server and starts it again on the same port."""
        port = self.port
        self.stop(sig)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.start(port)
                return
            except pytest.fail.Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


@pytest.fixture(scope="session")
def backing_services() -> Iterator[tuple[str, str]]:
    """A fresh database for the session (dropped after) and the Redis URL."""
    admin = os.environ.get("COMPOSER_TEST_DATABASE_URL")
    redis = os.environ.get("COMPOSER_TEST_REDIS_URL")
    if not admin or not redis:
        pytest.fail(
            "COMPOSER_TEST_DATABASE_URL and COMPOSER_TEST_REDIS_URL are not set; run through "
            "scripts/with-services.sh (see tests/integration/conftest.py)"
        )
    name = f"composer_sdk_py_{uuid.uuid4().hex[:12]}"
    _psql(admin, f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(admin, name), redis
    finally:
        try:
            _psql(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except subprocess.CalledProcessError:
            pass


@pytest.fixture(scope="session")
def secrets_key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's secrets key: every server of the session's database is given the same one, as
    the data keys it stores are wrapped under it."""
    return write_secrets_key(tmp_path_factory.mktemp("secrets") / "kek.hex")


@pytest.fixture(scope="session")
def blob_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's blob store, a temporary folder: every server of the session's database is given
    it (`--blob-store`), as the references that database holds name blobs kept there."""
    return tmp_path_factory.mktemp("blobs")


@pytest.fixture(scope="session")
def server(
    backing_services: tuple[str, str],
    secrets_key_file: Path,
    blob_store: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """The server shared by the session's tests (each test uses its own workflow and queue names)."""
    database_url, redis_url = backing_services
    process = ServerProcess(
        database_url,
        redis_url,
        tmp_path_factory.mktemp("server") / "server.log",
        blob_store=blob_store,
        secrets_key_file=secrets_key_file,
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture()
def own_server(
    backing_services: tuple[str, str], secrets_key_file: Path, blob_store: Path, tmp_path: Path
) -> Iterator[ServerProcess]:
    """A server of the test's own, for tests that stop or restart it (same database as the session's)."""
    database_url, redis_url = backing_services
    process = ServerProcess(
        database_url, redis_url, tmp_path / "own-server.log", blob_store=blob_store, secrets_key_file=secrets_key_file
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture()
def short_receipt_server(
    backing_services: tuple[str, str], secrets_key_file: Path, blob_store: Path, tmp_path: Path
) -> Iterator[ServerProcess]:
    """A server of the test's own whose unconfirmed leases last 2 s (``--lease-receipt-timeout 2s``)."""
    database_url, redis_url = backing_services
    process = ServerProcess(
        database_url,
        redis_url,
        tmp_path / "receipt-server.log",
        ["--lease-receipt-timeout", "2s"],
        blob_store=blob_store,
        secrets_key_file=secrets_key_file,
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture()
def keyless_server(backing_services: tuple[str, str], blob_store: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of the test's own given no secrets key (same database as the session's)."""
    database_url, redis_url = backing_services
    process = ServerProcess(database_url, redis_url, tmp_path / "keyless-server.log", blob_store=blob_store)
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture()
def names() -> Iterator[str]:
    """A unique suffix for the test's workflow and queue names."""
    yield uuid.uuid4().hex[:8]
