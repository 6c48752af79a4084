"""Large payloads: references to the blob store, and moving their bytes (docs/payloads.md).

A value whose compact JSON text is longer than the server's offload threshold
(``GetServerInfoResponse.payload_offload_bytes``; 0 = never) is kept in the
blob store, and the places that carry values carry a **reference** instead:
the JSON object ``{"$blob": {"sha256": ..., "size": ..., "head": ...}}``. An
object whose only key is ``$blob`` is a reference, at any depth of a value.

This module is what the Client and the Worker share: the reference walk, the
threshold test, and moving a blob's bytes over a :class:`Connection`: through
presigned URLs when the server gives them (``GetServerInfoResponse.blob_urls``,
see :class:`BlobUrls`), else through BlobService's two streams.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import grpc

from composer.v1 import blob_service_pb2

from ._connection import Connection
from .backoff import Backoff
from .errors import ComposerError, FailedPreconditionError, UnimplementedError, from_rpc_error
from .models import BlobRef

log = logging.getLogger("composer.payloads")

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


class BlobUrls:
    """Whether one client (a Client, or a Worker's connection) moves blob bytes through presigned URLs.

    On once GetServerInfo says ``blob_urls`` (:meth:`offered`); off for good
    once a URL call is answered FAILED_PRECONDITION (the server stopped giving
    URLs) or UNIMPLEMENTED (:meth:`refuse`): the streams from then on.
    """

    def __init__(self) -> None:
        self._offered = False
        self._refused = False

    @property
    def on(self) -> bool:
        """True when an upload or a download goes through a URL first."""
        return self._offered and not self._refused

    def offered(self, blob_urls: bool) -> None:
        """Records what GetServerInfo says (``blob_urls``); a refusal seen before stands."""
        self._offered = bool(blob_urls)

    def refuse(self) -> None:
        """The server gives no URLs any more: the streams from now on."""
        self._refused = True


class _Clock:
    """What is left of a timeout that bounds a whole upload or download (None: no bound)."""

    def __init__(self, timeout: float | None) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        if self._deadline is None:
            return None
        return max(self._deadline - time.monotonic(), 0.001)


class _HttpFailed(Exception):
    """An HTTP request to a presigned URL that failed. Its message never holds the URL (a credential)."""


def _http(method: str, url: str, data: bytes | None, timeout: float | None) -> bytes:
    """One HTTP request to a presigned ``url``; the response's body. _HttpFailed (without the URL in
    it) for anything but a 2xx answer: no redirect is followed, only http and https are spoken."""
    try:
        scheme = urllib.parse.urlsplit(url).scheme.lower()
    except ValueError:
        raise _HttpFailed("a malformed URL") from None
    if scheme not in ("http", "https"):
        raise _HttpFailed("a URL that is not http or https")
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),
        urllib.request.HTTPHandler(),
        urllib.request.HTTPSHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    try:
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Length", str(len(data)))
            # urllib would otherwise send a form's content type.
            request.add_header("Content-Type", "application/octet-stream")
            # Azure's Put Blob needs it; S3 and GCS ignore it.
            request.add_header("x-ms-blob-type", "BlockBlob")
        with opener.open(request, timeout=timeout) as response:
            status = response.status
            body: bytes = response.read()
    except urllib.error.HTTPError as error:
        error.close()
        raise _HttpFailed(f"HTTP {error.code}") from None
    except urllib.error.URLError as error:
        reason = error.reason
        raise _HttpFailed(_os_error(reason) if isinstance(reason, OSError) else "URLError") from None
    except OSError as error:
        raise _HttpFailed(_os_error(error)) from None
    except (ValueError, http.client.HTTPException) as error:
        raise _HttpFailed(type(error).__name__) from None
    if not 200 <= status < 300:
        raise _HttpFailed(f"HTTP {status}")
    return body


def _os_error(error: OSError) -> str:
    """An OSError's class and errno text, which name no URL."""
    return f"{type(error).__name__}: {error.strerror}" if error.strerror else type(error).__name__


async def _http_off_loop(method: str, url: str, data: bytes | None, clock: _Clock) -> bytes:
    """:func:`_http` in a thread (the event loop goes on), within what is left of ``clock``."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(_http, method, url, data, clock.left()), clock.left())
    except asyncio.TimeoutError:
        raise _HttpFailed("timed out") from None


async def _url_call(
    conn: Connection, method: Any, request: Any, urls: BlobUrls, clock: _Clock, wait_for_ready: bool
) -> Any:
    """A BlobService URL call; None when the caller should use the stream instead: the server gives no
    URLs (FAILED_PRECONDITION or UNIMPLEMENTED: ``urls`` is refused for good), or the call met a
    transient failure (the stream resumes and retries on its own). Other failures are raised."""
    try:
        return await conn.unary(method, request, timeout=clock.left(), wait_for_ready=wait_for_ready)
    except (FailedPreconditionError, UnimplementedError) as error:
        urls.refuse()
        log.info("the server gives no blob URLs (%s); blobs go through its streams from now on", error.code.name)
        return None
    except ComposerError as error:
        if not error.retryable:
            raise
        log.info("a blob URL call failed (%s); this transfer goes through the server's stream", error.code.name)
        return None


async def _upload_through_url(
    conn: Connection, data: bytes, urls: BlobUrls, clock: _Clock, wait_for_ready: bool
) -> BlobRef | None:
    """StartBlobUpload, one PUT of ``data`` to its URL, FinishBlobUpload: the stored blob's reference,
    or None when the upload is to go through the stream (see :func:`_url_call`; a failed PUT)."""
    started: blob_service_pb2.StartBlobUploadResponse | None = await _url_call(
        conn, conn.blobs.StartBlobUpload, blob_service_pb2.StartBlobUploadRequest(), urls, clock, wait_for_ready
    )
    if started is None:
        return None
    try:
        await _http_off_loop("PUT", started.url, data, clock)
    except _HttpFailed as failure:
        log.warning(
            "the PUT of %d bytes to a blob URL failed (%s); this upload goes through the server's stream",
            len(data),
            failure,
        )
        return None
    finished: blob_service_pb2.FinishBlobUploadResponse | None = await _url_call(
        conn,
        conn.blobs.FinishBlobUpload,
        blob_service_pb2.FinishBlobUploadRequest(upload_id=started.upload_id),
        urls,
        clock,
        wait_for_ready,
    )
    if finished is None:
        return None
    log.debug("blob %s of %d bytes uploaded through a URL", finished.blob.sha256, finished.blob.size)
    return BlobRef.from_proto(finished.blob)


async def upload(
    conn: Connection,
    data: bytes,
    *,
    timeout: float | None,
    wait_for_ready: bool = False,
    urls: BlobUrls | None = None,
) -> BlobRef:
    """Stores ``data`` as a blob; returns the stored blob's reference.

    With ``urls`` on, the bytes go straight to the blob store: StartBlobUpload,
    one HTTP PUT to its URL, FinishBlobUpload. A PUT that fails (the store
    unreachable from here, a non-2xx answer) sends this upload through the
    stream instead; a URL call answered FAILED_PRECONDITION turns ``urls`` off
    for good. Otherwise (or then) the bytes are streamed to BlobService.UploadBlob.

    ``timeout`` bounds the whole upload. ComposerError as the server answers
    (RESOURCE_EXHAUSTED past its ``--max-payload-bytes``, or when it is busy:
    see :attr:`ComposerError.busy`). The server keeps the
    bytes as they are and reads them as JSON only when an expression looks
    inside (a blob that is not JSON reads as null there).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"upload_blob takes bytes (the JSON text of a value), not {type(data).__name__}")
    data = bytes(data)
    clock = _Clock(timeout)
    if urls is not None and urls.on:
        blob = await _upload_through_url(conn, data, urls, clock, wait_for_ready)
        if blob is not None:
            return blob

    async def stream() -> AsyncIterator[blob_service_pb2.UploadBlobRequest]:
        for request in upload_requests(data):
            yield request

    try:
        response: blob_service_pb2.UploadBlobResponse = await conn.blobs.UploadBlob(
            stream(), metadata=conn.metadata, timeout=clock.left(), wait_for_ready=wait_for_ready
        )
    except grpc.RpcError as error:
        raise from_rpc_error(error) from None
    return BlobRef.from_proto(response.blob)


def _checked(sha256: str, data: bytes, size: int | None) -> ComposerError | None:
    """DATA_LOSS when ``data`` is not ``size`` bytes long (None: not said) or has another digest."""
    if size is not None and len(data) != size:
        return ComposerError(
            grpc.StatusCode.DATA_LOSS, f"blob {sha256} is {size} bytes but the download gave {len(data)}"
        )
    if hashlib.sha256(data).hexdigest() != sha256:
        return ComposerError(grpc.StatusCode.DATA_LOSS, f"the bytes downloaded for blob {sha256} have another digest")
    return None


async def _download_through_url(
    conn: Connection, sha256: str, urls: BlobUrls, clock: _Clock, wait_for_ready: bool
) -> bytes | None:
    """GetBlobUrl, one GET of its URL: the blob's bytes, checked; None when the download is to go
    through the stream (see :func:`_url_call`; a failed GET, or bytes that are not the blob's).
    NotFoundError when the namespace has no such blob."""
    answer: blob_service_pb2.GetBlobUrlResponse | None = await _url_call(
        conn, conn.blobs.GetBlobUrl, blob_service_pb2.GetBlobUrlRequest(sha256=sha256), urls, clock, wait_for_ready
    )
    if answer is None:
        return None
    try:
        data = await _http_off_loop("GET", answer.url, None, clock)
    except _HttpFailed as failure:
        log.warning(
            "the GET of blob %s from its URL failed (%s); this download goes through the server's stream",
            sha256,
            failure,
        )
        return None
    wrong = _checked(sha256, data, answer.size or None)
    if wrong is not None:
        log.warning("%s (from its URL); this download goes through the server's stream", wrong.message)
        return None
    log.debug("blob %s of %d bytes downloaded through a URL", sha256, len(data))
    return data


async def download(
    conn: Connection,
    sha256: str,
    *,
    timeout: float | None,
    wait_for_ready: bool = False,
    urls: BlobUrls | None = None,
) -> bytes:
    """The bytes of the blob ``sha256`` of the caller's namespace.

    With ``urls`` on, they come straight from the blob store: GetBlobUrl, then
    one HTTP GET of its URL. A GET that fails (or gives other bytes) takes this
    download through the stream instead; a URL call answered
    FAILED_PRECONDITION turns ``urls`` off for good. Otherwise (or then) they
    come from BlobService.DownloadBlob: a stream broken by UNAVAILABLE or
    DEADLINE_EXCEEDED goes on from the offset reached (up to
    :data:`DOWNLOAD_RETRIES` times). ``timeout`` bounds the whole download.
    The bytes are checked against their size and digest. ValueError for a
    malformed ``sha256``; NotFoundError when the namespace has no such blob.
    """
    if not isinstance(sha256, str) or not _SHA256.match(sha256):
        raise ValueError(f"a blob's sha256 is 64 lowercase hex digits, not {sha256!r:.80}")
    clock = _Clock(timeout)
    if urls is not None and urls.on:
        through_url = await _download_through_url(conn, sha256, urls, clock, wait_for_ready)
        if through_url is not None:
            return through_url
    received = bytearray()
    size: int | None = None
    failures = 0
    while True:
        request = blob_service_pb2.DownloadBlobRequest(sha256=sha256, offset=len(received))
        call = conn.blobs.DownloadBlob(
            request, metadata=conn.metadata, timeout=clock.left(), wait_for_ready=wait_for_ready
        )
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
    wrong = _checked(sha256, data, size)
    if wrong is not None:
        raise wrong
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
    "BlobUrls",
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
