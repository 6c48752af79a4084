"""Server addresses: host:port, http://host:port and https://host:port, given or from
COMPOSER_ADDRESS; a malformed one fails when the client or worker is made, naming the forms."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from composer import Client, InvalidAddressError, SyncClient, Worker
from composer._connection import Address, parse_address, resolve_address, resolve_tls, resolve_token


@pytest.mark.parametrize(
    ("text", "target", "tls"),
    [
        ("127.0.0.1:7070", "127.0.0.1:7070", False),
        ("localhost:7070", "localhost:7070", False),
        ("http://127.0.0.1:7070", "127.0.0.1:7070", False),
        ("http://127.0.0.1:7070/", "127.0.0.1:7070", False),
        ("HTTPS://composer.example.com:8443", "composer.example.com:8443", True),
        ("https://composer.example.com", "composer.example.com:443", True),
        ("http://composer.internal", "composer.internal:80", False),
        ("[::1]:7070", "[::1]:7070", False),
        ("https://[2001:db8::1]:7070", "[2001:db8::1]:7070", True),
    ],
)
def test_the_three_forms_parse(text: str, target: str, tls: bool) -> None:
    address = parse_address(text)
    assert (address.target, address.tls) == (target, tls)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("localhost", "no port"),
        ("grpc://127.0.0.1:7070", "unknown scheme 'grpc'"),
        ("http://127.0.0.1:7070/api", "no path"),
        ("127.0.0.1:port", "not a host:port"),
        ("127.0.0.1:70700", "out of range"),
        ("127.0.0.1:0", "out of range"),
        (" 127.0.0.1:7070", "not a host:port"),
        ("http://", "not a host:port"),
        ("user@host:7070", "not a host:port"),
    ],
)
def test_a_malformed_address_is_refused_with_the_forms_named(text: str, why: str) -> None:
    with pytest.raises(InvalidAddressError) as refused:
        parse_address(text)
    message = str(refused.value)
    assert why in message and repr(text) in message
    assert "host:port, http://host:port (plaintext) or https://host:port (TLS)" in message


def test_without_an_address_composer_address_is_read_then_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPOSER_ADDRESS", raising=False)
    assert resolve_address(None) == Address("127.0.0.1:7070", False)
    monkeypatch.setenv("COMPOSER_ADDRESS", "https://composer.example.com:9000")
    assert resolve_address(None) == Address("composer.example.com:9000", True, "https")
    assert resolve_address("") == Address("composer.example.com:9000", True, "https")
    # an explicit address wins over the environment
    assert resolve_address("10.0.0.1:7070") == Address("10.0.0.1:7070", False)
    monkeypatch.setenv("COMPOSER_ADDRESS", "composer:x")
    with pytest.raises(InvalidAddressError, match="from COMPOSER_ADDRESS"):
        resolve_address(None)


def test_the_token_is_the_given_one_else_composer_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPOSER_TOKEN", "from-env")
    assert resolve_token(None) == "from-env"
    assert resolve_token("given") == "given"
    assert resolve_token("") is None  # an empty token sends none
    monkeypatch.delenv("COMPOSER_TOKEN")
    assert resolve_token(None) is None


def test_tls_follows_the_scheme_and_a_contradiction_is_refused() -> None:
    assert resolve_tls(parse_address("https://h:1"), None) is True
    assert resolve_tls(parse_address("http://h:1"), None) is False
    assert resolve_tls(parse_address("h:1"), None) is False
    assert resolve_tls(parse_address("h:1"), True) is True
    credentials = grpc.ssl_channel_credentials()
    assert resolve_tls(parse_address("https://h:1"), credentials) is credentials
    with pytest.raises(InvalidAddressError, match="use https://"):
        resolve_tls(parse_address("http://h:1"), True)
    with pytest.raises(InvalidAddressError, match="use http://"):
        resolve_tls(parse_address("https://h:1"), False)


def test_clients_and_workers_refuse_a_malformed_address_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidAddressError):
        Worker("ftp://127.0.0.1:7070")
    with pytest.raises(InvalidAddressError):
        SyncClient("127.0.0.1")

    async def make_client() -> None:
        with pytest.raises(InvalidAddressError):
            Client("http://127.0.0.1:7070/v1")

    asyncio.run(make_client())
    monkeypatch.setenv("COMPOSER_ADDRESS", "http://127.0.0.1:7171")
    assert Worker().address == "127.0.0.1:7171"
    with SyncClient() as client:
        assert client._client._conn.address == "127.0.0.1:7171"
