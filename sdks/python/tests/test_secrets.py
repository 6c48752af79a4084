"""The Client's secret calls against an in-process fake SecretService: the requests they build,
the typed Secret they return, paging, error decoding, and that a secret's value shows up in no
view, no error, no traceback frame and no log record."""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import datetime, timezone
from typing import Any

import google.rpc.error_details_pb2 as error_details_pb2
import grpc
import pytest
from _fakes import status_trailer

from composer import (
    Client,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    Secret,
    SyncClient,
)
from composer.v1 import secret_service_pb2, secret_service_pb2_grpc

FIRST_SET = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
LAST_SET = datetime(2026, 3, 5, 6, 7, 8, tzinfo=timezone.utc)
NAME_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

# A module constant, not a local: the frames of this file are left out of the searches below,
# and the value must not hide in a test's own local variables either.
VALUE = "s3cr3t-Value-that-must-stay-hidden"


class FakeSecrets(secret_service_pb2_grpc.SecretServiceServicer):
    """Keeps each secret's version and times (never its value), and refuses as the server does:
    a bad name or an empty value naming the field, an unknown name NOT_FOUND, no key
    FAILED_PRECONDITION, a reader's token PERMISSION_DENIED."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.secrets: dict[str, secret_service_pb2.Secret] = {}
        self.has_key = True

    async def _refuse(self, context: Any, request: Any) -> None:
        metadata = dict(context.invocation_metadata())
        if metadata.get("authorization") == "Bearer reader":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "role reader may not call SecretService")
        if not self.has_key:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this server has no secrets key-encryption key")
        name = getattr(request, "name", None)
        if name is not None and not NAME_RULE.match(name):
            await invalid(context, "name", "must be 1 to 64 characters from A-Z a-z 0-9 _ . -")

    async def SetSecret(self, request: Any, context: Any) -> secret_service_pb2.SetSecretResponse:
        self.requests.append(request)
        await self._refuse(context, request)
        if not request.value:
            await invalid(context, "value", "must not be empty")
        secret = self.secrets.get(request.name)
        if secret is None:
            secret = secret_service_pb2.Secret(name=request.name)
            secret.create_time.FromDatetime(FIRST_SET)
            self.secrets[request.name] = secret
        secret.version += 1
        secret.update_time.FromDatetime(LAST_SET)
        secret.updated_by = "ci"
        return secret_service_pb2.SetSecretResponse(secret=secret)

    async def ListSecrets(self, request: Any, context: Any) -> secret_service_pb2.ListSecretsResponse:
        self.requests.append(request)
        await self._refuse(context, request)
        ordered = [self.secrets[n] for n in sorted(self.secrets)]
        start = int(request.page_token or 0)
        end = min(start + (request.page_size or 100), len(ordered))
        return secret_service_pb2.ListSecretsResponse(
            secrets=ordered[start:end], next_page_token=str(end) if end < len(ordered) else ""
        )

    async def DeleteSecret(self, request: Any, context: Any) -> secret_service_pb2.DeleteSecretResponse:
        self.requests.append(request)
        await self._refuse(context, request)
        if self.secrets.pop(request.name, None) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no secret {request.name}")
        return secret_service_pb2.DeleteSecretResponse()


async def invalid(context: Any, field: str, description: str) -> None:
    violation = error_details_pb2.BadRequest.FieldViolation(field=field, description=description)
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"invalid {field}",
        trailing_metadata=status_trailer(
            grpc.StatusCode.INVALID_ARGUMENT, f"invalid {field}", error_details_pb2.BadRequest(field_violations=[violation])
        ),
    )


async def start(fake: FakeSecrets) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    secret_service_pb2_grpc.add_SecretServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def serve(test: Any, token: str = "operator") -> None:
    """Runs ``test(client, fake)`` against a fresh fake."""

    async def main() -> None:
        fake = FakeSecrets()
        server, address = await start(fake)
        try:
            async with Client(address, token=token) as client:
                await test(client, fake)
        finally:
            await server.stop(None)

    asyncio.run(main())


def reachable_text(error: BaseException) -> str:
    """All an error reporter could show of ``error``: its text, repr and attributes, and the local
    variables of every frame of its traceback and of every error chained to it (this file's
    frames left out)."""
    parts: list[str] = []
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        parts += [str(current), repr(current), repr(current.args), repr(vars(current))]
        frame = current.__traceback__
        while frame is not None:
            if frame.tb_frame.f_code.co_filename != __file__:
                parts += [f"{name}={local!r}" for name, local in frame.tb_frame.f_locals.items()]
            frame = frame.tb_next
        pending += [current.__context__, current.__cause__]
    return "\n".join(parts)


def test_set_secret_sends_the_name_and_the_value_and_returns_the_secret_without_it() -> None:
    async def test(client: Client, fake: FakeSecrets) -> None:
        first = await client.set_secret("stripe-key", VALUE)
        sent = fake.requests[-1]
        assert isinstance(sent, secret_service_pb2.SetSecretRequest)
        assert (sent.name, sent.value) == ("stripe-key", VALUE.encode())
        assert isinstance(first, Secret)
        assert (first.name, first.version, first.updated_by) == ("stripe-key", 1, "ci")
        assert (first.create_time, first.update_time) == (FIRST_SET, LAST_SET)
        assert first.raw.name == "stripe-key"

        # bytes go as they are (any bytes, not only text); each set is a new version.
        raw = b"\x00\xffbinary"
        second = await client.set_secret("stripe-key", raw)
        assert fake.requests[-1].value == raw
        assert second.version == 2 and second.create_time == FIRST_SET

        for shown in (repr(first), str(first), repr(second), str(second.raw), repr(vars(second))):
            assert VALUE not in shown and "binary" not in shown

    serve(test)


def test_a_value_of_another_type_is_refused_before_any_call_naming_only_the_type() -> None:
    async def test(client: Client, fake: FakeSecrets) -> None:
        with pytest.raises(TypeError) as caught:
            await client.set_secret("k", bytearray(VALUE.encode()))  # type: ignore[arg-type]
        assert "bytearray" in str(caught.value)
        assert VALUE not in reachable_text(caught.value)
        with pytest.raises(ValueError) as unencodable:
            await client.set_secret("k", VALUE + "\ud800")
        assert "UTF-8" in str(unencodable.value)
        assert VALUE not in reachable_text(unencodable.value)
        assert fake.requests == []

    serve(test)


def test_refusals_are_typed_and_carry_no_trace_of_the_value(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def test(client: Client, fake: FakeSecrets) -> None:
        with pytest.raises(InvalidArgumentError) as bad_name:
            await client.set_secret("not a name!", VALUE)
        assert [v.field for v in bad_name.value.field_violations] == ["name"]
        assert VALUE not in reachable_text(bad_name.value)

        with pytest.raises(InvalidArgumentError) as empty:
            await client.set_secret("empty", "")
        assert [v.field for v in empty.value.field_violations] == ["value"]

        fake.has_key = False
        with pytest.raises(FailedPreconditionError) as no_key:
            await client.set_secret("stripe-key", VALUE)
        assert VALUE not in reachable_text(no_key.value)
        with pytest.raises(FailedPreconditionError):
            [s async for s in client.list_secrets()]

    serve(test)

    async def as_reader(client: Client, fake: FakeSecrets) -> None:
        with pytest.raises(PermissionDeniedError) as denied:
            await client.set_secret("stripe-key", VALUE.encode())
        assert VALUE not in reachable_text(denied.value)
        with pytest.raises(PermissionDeniedError):
            await client.delete_secret("stripe-key")

    serve(as_reader, token="reader")
    assert VALUE not in caplog.text


def test_list_secrets_pages_through_every_secret() -> None:
    async def test(client: Client, fake: FakeSecrets) -> None:
        for name in ("s4", "s2", "s0", "s3", "s1"):
            await client.set_secret(name, VALUE)
        listed = [secret async for secret in client.list_secrets(page_size=2)]
        assert [s.name for s in listed] == [f"s{i}" for i in range(5)]
        assert all(s.version == 1 and s.update_time == LAST_SET for s in listed)
        pages = [r for r in fake.requests if isinstance(r, secret_service_pb2.ListSecretsRequest)]
        assert [(p.page_size, p.page_token) for p in pages] == [(2, ""), (2, "2"), (2, "4")]
        assert VALUE not in repr(listed)

        # The default page size is the other lists'.
        assert [s.name async for s in client.list_secrets()] == [f"s{i}" for i in range(5)]
        assert fake.requests[-1].page_size == 100

    serve(test)


def test_delete_secret_names_it_and_a_missing_one_is_not_found() -> None:
    async def test(client: Client, fake: FakeSecrets) -> None:
        await client.set_secret("stripe-key", VALUE)
        await client.delete_secret("stripe-key")
        assert fake.requests[-1] == secret_service_pb2.DeleteSecretRequest(name="stripe-key")
        assert [s async for s in client.list_secrets()] == []
        with pytest.raises(NotFoundError):
            await client.delete_secret("stripe-key")
        with pytest.raises(InvalidArgumentError) as bad:
            await client.delete_secret("bad name")
        assert [v.field for v in bad.value.field_violations] == ["name"]

    serve(test)


def test_the_sync_facade_runs_the_secret_calls() -> None:
    async def serve_forever(fake: FakeSecrets, ready: asyncio.Future[str], done: asyncio.Event) -> None:
        server, address = await start(fake)
        ready.set_result(address)
        await done.wait()
        await server.stop(None)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[str] = loop.create_future()
        done = asyncio.Event()
        fake = FakeSecrets()
        serving = asyncio.create_task(serve_forever(fake, ready, done))
        address = await ready

        def script() -> None:
            with SyncClient(address, token="operator") as client:
                assert client.set_secret("stripe-key", VALUE).version == 1
                assert client.set_secret("stripe-key", VALUE.encode()).version == 2
                client.set_secret("other", VALUE)
                listed = list(client.list_secrets(page_size=1))
                assert [(s.name, s.version) for s in listed] == [("other", 1), ("stripe-key", 2)]
                with pytest.raises(InvalidArgumentError) as bad:
                    client.set_secret("not a name!", VALUE)
                assert [v.field for v in bad.value.field_violations] == ["name"]
                assert VALUE not in reachable_text(bad.value)
                with pytest.raises(TypeError) as wrong_type:
                    client.set_secret("k", 42)  # type: ignore[arg-type]
                assert "int" in str(wrong_type.value)
                client.delete_secret("stripe-key")
                with pytest.raises(NotFoundError):
                    client.delete_secret("stripe-key")

        await asyncio.to_thread(script)
        done.set()
        await serving

    asyncio.run(main())
