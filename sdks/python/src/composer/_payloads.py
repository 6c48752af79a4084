"""Large payloads: references to the blob store, and moving their bytes (docs/payloads.md).

A value whose compact JSON text is longer than the server's offload threshold
(``GetServerInfoResponse.payload_offload_bytes``; 0 = never) is kept in the
blob store, and the places that carry values carry a **reference** instead:
the JSON object ``{"$blob": {"sha256": ..., "size": ..., "head": ...}}``. An
object whose only key is ``$blob`` is a reference, at any depth of a value.

This module is what the Client and the Worker share: the reference walk, the
threshold test, and the two BlobService streams over a :class:`Connection`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import grpc

from composer.v1 import blob_service_pb2

from ._connection import Connection
from .backoff import Backoff
from .errors import ComposerError, from_rpc_error
from .models import BlobRef

BLOB_KEY = "$blob"
"""The one key of a reference object."""

CHUNK_BYTES = 1 << 20
"""The most bytes one UploadBlob request carries (BlobService: chunks of at most 1 MiB)."""

DOWNLOAD_RETRIES = 3
"""How many times a download broken by UNAVAILABLE or DEADLINE_EXCEEDED goes on from where it stopped."""

PARALLEL_DOWNLOADS = 4
"""How many blobs resolve_payload downloads at once."""

_RESUME = Backoff(initial=0.1, maximum=2.0)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def is_reference(value: Any) -> bool:
    """True for a reference: a mapping whose only key is ``$blob``."""
    return isinstance(value, Mapping) and len(value) == 1 and BLOB_KEY in value


def reference_sha256(value: Mapping[str, Any], path: str = "$") -> str:
    """The ``sha256`` a reference names; ValueError (naming ``path``) when it names none."""
    inner = value[BLOB_KEY]
    sha256 = inner.get("sha256") if isinstance(inner, Mapping) else None
    if not isinstance(sha256, str) or not _SHA256.match(sha256):
        raise ValueError(f"{path}: a $blob reference names no sha256 (64 lowercase hex digits): {inner!r:.200}")
    return sha256


def references(value: Any, path: str = "$") -> Iterator[tuple[str, str]]:
    """Every reference in ``value`` at any depth, as ``(path, sha256)``, in document order.

    The walk does not look inside a reference. ValueError when a ``$blob``
    object names no valid sha256.
    """
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if is_reference(item):
            yield where, reference_sha256(item, where)
        elif isinstance(item, Mapping):
            stack.extend((f"{where}.{key}", child) for key, child in reversed(list(item.items())))
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{where}[{index}]", child) for index, child in reversed(list(enumerate(item))))


def has_references(value: Any) -> bool:
    """True when ``value`` holds a reference anywhere; ValueError when a ``$blob`` object names no sha256."""
    return next(references(value), None) is not None


def compact_json(value: Any) -> bytes:
    """The compact JSON text of ``value`` as UTF-8, as the server measures and stores it
    (``separators=(",", ":")``, non-ASCII characters as they are).

    TypeError for what is not JSON, ValueError for NaN and infinities (as
    :func:`composer._values.to_value`).
    """
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def oversized_json(value: Any, threshold: int) -> bytes | None:
    """The compact JSON of ``value`` when it is longer than ``threshold`` bytes, else None
    (the value goes inline). A threshold of 0 or less offloads nothing (nothing is serialised)."""
    if threshold <= 0 or value is None:
        return None
    text = compact_json(value)
    return text if len(text) > threshold else None


def upload_requests(data: bytes, chunk_bytes: int = CHUNK_BYTES) -> Iterator[blob_service_pb2.UploadBlobRequest]:
    """The UploadBlob stream of ``data``: chunks of at most ``chunk_bytes`` (one empty chunk for no bytes)."""
    if chunk_bytes < 1:
        raise ValueError("a chunk holds at least one byte")
    view = memoryview(data)
    if not view:
        yield blob_service_pb2.UploadBlobRequest(data=b"")
        return
    for start in range(0, len(view), chunk_bytes):
        yield blob_service_pb2.UploadBlobRequest(data=bytes(view[start : start + chunk_bytes]))


async def upload(
    conn: Connection, data: bytes, *, timeout: float | None, wait_for_ready: bool = False
) -> BlobRef:
    """Streams ``data`` to BlobService.UploadBlob; returns the stored blob's reference.

    ``timeout`` bounds the whole stream. ComposerError as the server answers
    (RESOURCE_EXHAUSTED past its ``--max-payload-bytes``, or when it is busy:
    see :attr:`ComposerError.busy`). The server keeps the
    bytes as they are and reads them as JSON only when an expression looks
    inside (a blob that is not JSON reads as null there).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"upload_blob takes bytes (the JSON text of a value), not {type(data).__name__}")

    async def stream() -> AsyncIterator[blob_service_pb2.UploadBlobRequest]:
        for request in upload_requests(bytes(data)):
            yield request

    try:
        response: blob_service_pb2.UploadBlobResponse = await conn.blobs.UploadBlob(
            stream(), metadata=conn.metadata, timeout=timeout, wait_for_ready=wait_for_ready
        )
    except grpc.RpcError as error:
        raise from_rpc_error(error) from None
    return BlobRef.from_proto(response.blob)


async def download(
    conn: Connection, sha256: str, *, timeout: float | None, wait_for_ready: bool = False
) -> bytes:
    """The bytes of the blob ``sha256`` of the caller's namespace, from BlobService.DownloadBlob.

    A stream broken by UNAVAILABLE or DEADLINE_EXCEEDED goes on from the
    offset reached (up to :data:`DOWNLOAD_RETRIES` times). The bytes are
    checked against their size and digest. ValueError for a malformed
    ``sha256``; NotFoundError when the namespace has no such blob.
    """
    if not isinstance(sha256, str) or not _SHA256.match(sha256):
        raise ValueError(f"a blob's sha256 is 64 lowercase hex digits, not {sha256!r:.80}")
    received = bytearray()
    size: int | None = None
    failures = 0
    while True:
        request = blob_service_pb2.DownloadBlobRequest(sha256=sha256, offset=len(received))
        call = conn.blobs.DownloadBlob(request, metadata=conn.metadata, timeout=timeout, wait_for_ready=wait_for_ready)
        try:
            async for chunk in call:
                if size is None and chunk.size:
                    size = chunk.size
                received += chunk.data
            break
        except grpc.RpcError as error:
            converted = from_rpc_error(error)
            failures += 1
            if not converted.retryable or failures > DOWNLOAD_RETRIES:
                raise converted from None
            await asyncio.sleep(_RESUME.delay(failures))
        finally:
            call.cancel()
    data = bytes(received)
    if size is not None and len(data) != size:
        raise ComposerError(
            grpc.StatusCode.DATA_LOSS, f"blob {sha256} is {size} bytes but the download gave {len(data)}"
        )
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ComposerError(grpc.StatusCode.DATA_LOSS, f"the bytes downloaded for blob {sha256} have another digest")
    return data


Fetch = Callable[[str], Awaitable[bytes]]
"""Downloads the bytes of one blob by its sha256."""


async def resolve(value: Any, fetch: Fetch) -> Any:
    """A copy of ``value`` with every reference at any depth replaced by the value it names.

    Each distinct sha256 is fetched once (the references of ``value`` itself
    a few at a time, side by side); a reference met again reuses the bytes,
    parsed anew so no two places share one object. A blob's value may itself
    hold references: they are resolved too. ValueError (naming the path) when
    a ``$blob`` object names no sha256 or a blob's bytes are not JSON.
    """
    digests = list(dict.fromkeys(sha256 for _, sha256 in references(value)))
    cache = dict(zip(digests, await _fetch_all(digests, fetch)))
    return await _resolve(value, fetch, cache, (), "$")


async def _fetch_all(digests: list[str], fetch: Fetch) -> list[bytes]:
    """The bytes of each blob of ``digests``, at most :data:`PARALLEL_DOWNLOADS` at a time; the
    first failure cancels the rest and is raised."""
    if not digests:
        return []
    gate = asyncio.Semaphore(PARALLEL_DOWNLOADS)

    async def one(sha256: str) -> bytes:
        async with gate:
            return await fetch(sha256)

    tasks = [asyncio.ensure_future(one(sha256)) for sha256 in digests]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _resolve(value: Any, fetch: Fetch, cache: dict[str, bytes], inside: tuple[str, ...], path: str) -> Any:
    if is_reference(value):
        sha256 = reference_sha256(value, path)
        if sha256 in inside:
            raise ValueError(f"{path}: blob {sha256} refers to itself")
        if sha256 not in cache:
            cache[sha256] = await fetch(sha256)
        try:
            named = json.loads(cache[sha256])
        except ValueError as error:
            raise ValueError(f"{path}: blob {sha256} is not JSON: {error}") from None
        return await _resolve(named, fetch, cache, (*inside, sha256), path)
    if isinstance(value, Mapping):
        return {key: await _resolve(child, fetch, cache, inside, f"{path}.{key}") for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [await _resolve(child, fetch, cache, inside, f"{path}[{index}]") for index, child in enumerate(value)]
    return value


__all__ = [
    "BLOB_KEY",
    "CHUNK_BYTES",
    "compact_json",
    "download",
    "has_references",
    "is_reference",
    "oversized_json",
    "references",
    "resolve",
    "upload",
    "upload_requests",
]
