"""set_secret, list_secrets and delete_secret against the real server (docs/secrets.md).

The session's servers are given a secrets key (conftest.py, ``secrets_key_file``). Each test
acts in a namespace of its own (a token minted for it), so the namespace's list holds only what
the test set.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from conftest import ServerProcess, mint_token

from composer import (
    Client,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    Secret,
    SyncClient,
)
from composer.v1 import secret_service_pb2


def run(coroutine: Any) -> None:
    asyncio.run(asyncio.wait_for(coroutine, 120))


def test_a_secret_is_set_twice_listed_without_its_value_and_deleted(server: ServerProcess, names: str) -> None:
    namespace, subject = f"secrets-{names}", f"ops-{names}"
    operator = mint_token("operator", namespace=namespace, subject=subject)
    name = f"stripe-key-{names}"
    value = f"sk_live_{uuid.uuid4().hex}"

    async def main() -> None:
        async with Client(server.address, token=operator) as client:
            first = await client.set_secret(name, value)
            assert isinstance(first, Secret)
            assert (first.name, first.version, first.updated_by) == (name, 1, subject), first
            assert first.create_time is not None and first.update_time is not None

            second = await client.set_secret(name, (value + "-rotated").encode())
            assert (second.name, second.version, second.updated_by) == (name, 2, subject), second
            assert second.create_time == first.create_time
            assert second.update_time is not None and second.update_time >= first.update_time

            listed = [secret async for secret in client.list_secrets(page_size=1)]
            assert [(s.name, s.version, s.create_time, s.update_time) for s in listed] == [
                (name, 2, second.create_time, second.update_time)
            ], listed
            # The answer on the wire, unknown fields and all, carries no value.
            answer: secret_service_pb2.ListSecretsResponse = await client._conn.unary(
                client._conn.secrets.ListSecrets, secret_service_pb2.ListSecretsRequest()
            )
            assert [s.name for s in answer.secrets] == [name]
            for shown in (answer.SerializeToString(), repr(listed).encode(), repr(answer).encode()):
                assert value.encode() not in shown

            await client.delete_secret(name)
            assert [s async for s in client.list_secrets()] == []
            with pytest.raises(NotFoundError):
                await client.delete_secret(name)

            with pytest.raises(InvalidArgumentError) as bad_name:
                await client.set_secret("not a name!", value)
            assert "name" in [v.field for v in bad_name.value.field_violations], bad_name.value
            assert value not in str(bad_name.value)
            with pytest.raises(InvalidArgumentError) as empty:
                await client.set_secret(name, b"")
            assert "value" in [v.field for v in empty.value.field_violations], empty.value

    run(main())

    # The sync facade: the same calls, blocking.
    with SyncClient(server.address, token=operator) as sync:
        assert sync.set_secret(name, value).version == 1  # a deleted secret starts again at 1
        assert [(s.name, s.version) for s in sync.list_secrets()] == [(name, 1)]
        sync.delete_secret(name)
        assert list(sync.list_secrets()) == []
        with pytest.raises(NotFoundError):
            sync.delete_secret(name)

    assert value not in server.log_path.read_text(errors="replace"), "the server logged the value"


def test_a_reader_may_not_touch_secrets_and_another_namespace_sees_none(server: ServerProcess, names: str) -> None:
    namespace = f"secrets-{names}"
    name = f"db-password-{names}"

    async def main() -> None:
        async with Client(server.address, token=mint_token("operator", namespace=namespace)) as operator:
            await operator.set_secret(name, "hunter2")
        async with Client(server.address, token=mint_token("reader", namespace=namespace)) as reader:
            with pytest.raises(PermissionDeniedError):
                await reader.set_secret(name, "overwritten")
            with pytest.raises(PermissionDeniedError):
                [s async for s in reader.list_secrets()]
            with pytest.raises(PermissionDeniedError):
                await reader.delete_secret(name)
        other = mint_token("operator", namespace=f"other-{names}")
        async with Client(server.address, token=other) as elsewhere:
            assert [s async for s in elsewhere.list_secrets()] == []
            with pytest.raises(NotFoundError):
                await elsewhere.delete_secret(name)
        async with Client(server.address, token=mint_token("operator", namespace=namespace)) as operator:
            assert [(s.name, s.version) async for s in operator.list_secrets()] == [(name, 1)]

    run(main())


def test_a_server_without_a_secrets_key_refuses_with_failed_precondition(keyless_server: ServerProcess, names: str) -> None:
    async def main() -> None:
        token = mint_token("operator", namespace=f"keyless-{names}")
        async with Client(keyless_server.address, token=token) as client:
            with pytest.raises(FailedPreconditionError) as refused:
                await client.set_secret(f"k-{names}", "value")
            assert "secrets" in refused.value.message, refused.value

    run(main())
