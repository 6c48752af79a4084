"""An in-process fake of the server's WorkerService, ServerService and BlobService, for the unit tests.

It keeps the lease protocol of worker_service.proto in memory (fencing by
(task_id, attempt, lease_token), LEASE_LOST in a google.rpc.ErrorInfo,
cancel_requested on Heartbeat, an applied report answered OK again) and lets
a test inject failures. Its BlobService gives presigned URLs when
``FakeServer.blob_urls`` is set and a :class:`FakeStore` (a loopback HTTP
server standing for the blob store) serves them. It is not the server: the
integration tests run the same behaviours against the real one.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import google.rpc.error_details_pb2 as error_details_pb2
import google.rpc.status_pb2 as status_pb2
from google.protobuf import any_pb2, duration_pb2

from composer._values import to_value
from composer.v1 import (
    blob_service_pb2,
    blob_service_pb2_grpc,
    server_service_pb2,
    server_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)


def status_trailer(code: grpc.StatusCode, message: str, *details: Any) -> tuple[tuple[str, bytes], ...]:
    """The grpc-status-details-bin trailer carrying a google.rpc.Status with ``details``."""
    status = status_pb2.Status(code=code.value[0], message=message)
    for detail in details:
        packed = any_pb2.Any()
        packed.Pack(detail)
        status.details.append(packed)
    return (("grpc-status-details-bin", status.SerializeToString()),)


@dataclass(frozen=True)
class Refusal:
    """A status with ``google.rpc`` details that a fake method answers instead of serving a call."""

    code: grpc.StatusCode
    message: str
    details: tuple[Any, ...] = ()

    async def abort(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        trailer = status_trailer(self.code, self.message, *self.details)
        await context.abort(self.code, self.message, trailing_metadata=trailer)


def busy(reason: str = "QUOTA_EXCEEDED", retry_after: float | None = None) -> Refusal:
    """The server's RESOURCE_EXHAUSTED for a busy server: ErrorInfo ``reason`` (QUOTA_EXCEEDED or
    CPU_POOL_BUSY), and RetryInfo when ``retry_after`` (seconds) is given."""
    details: list[Any] = [error_details_pb2.ErrorInfo(reason=reason, domain="composer.dev")]
    if retry_after is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(retry_after * 1e9))
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    return Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, f"injected {reason}", tuple(details))


async def injected(state: FakeServer, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    """Answers the call with the next failure injected for ``method``, if any."""
    if state.inject[method]:
        failure = state.inject[method].pop(0)
        if isinstance(failure, Refusal):
            await failure.abort(context)
        else:
            await context.abort(failure, f"injected {failure.name}")


@dataclass
class Lease:
    task: worker_service_pb2.Task
    cancel_requested: bool = False
    cancel_reason: str = ""


@dataclass
class FakeServer:
    """The fake's state; tests read and steer it."""

    lease_seconds: float = 3.0
    receipt_seconds: float | None = None
    """The first lease of a poll that asks to confirm receipt (the server's --lease-receipt-timeout)."""
    pending: asyncio.Queue[worker_service_pb2.Task] = field(default_factory=asyncio.Queue)
    leases: dict[str, Lease] = field(default_factory=dict)
    completed: dict[str, worker_service_pb2.CompleteTaskRequest] = field(default_factory=dict)
    failed: dict[str, worker_service_pb2.FailTaskRequest] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    heartbeat_times: list[float] = field(default_factory=list)
    """When each Heartbeat arrived (time.monotonic())."""
    inject: dict[str, list[grpc.StatusCode | Refusal]] = field(default_factory=lambda: defaultdict(list))
    """Failures each method (PollTasks, Heartbeat, CompleteTask, FailTask, UploadBlob) answers, in turn."""
    polls: int = 0
    report_metadata: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    """The gRPC metadata of each CompleteTask and FailTask, by (method, task_id)."""
    on_report: Callable[[str, str], None] | None = None
    """Called with (method, task_id) as each CompleteTask and FailTask arrives."""
    payload_offload_bytes: int = 0
    """What GetServerInfo answers as the offload threshold (0: never offload)."""
    server_info_calls: int = 0
    """How many GetServerInfo calls arrived."""
    blobs: dict[str, bytes] = field(default_factory=dict)
    """The blob store, by sha256."""
    upload_chunks: list[list[int]] = field(default_factory=list)
    """The chunk sizes of each UploadBlob stream."""
    downloads: list[tuple[str, int]] = field(default_factory=list)
    """Each DownloadBlob call, as (sha256, offset)."""
    break_downloads: int = 0
    """How many of the next DownloadBlob streams break with UNAVAILABLE after their first chunk."""
    download_chunk_bytes: int = 1 << 20
    """The chunk size of DownloadBlob streams."""
    max_blob_bytes: int = 0
    """A larger upload is refused with RESOURCE_EXHAUSTED, naming ``data`` in a BadRequest (0: no limit)."""
    blob_urls: bool = False
    """What GetServerInfo answers as ``blob_urls``; without it (or without ``url_base``) the URL calls
    answer FAILED_PRECONDITION, as the server's do."""
    url_base: str | None = None
    """Where the presigned URLs point, ``http://127.0.0.1:<port>`` (a :class:`FakeStore` sets it)."""
    url_calls: list[str] = field(default_factory=list)
    """Each GetBlobUrl, StartBlobUpload and FinishBlobUpload call, by method name."""
    url_uploads: dict[str, bytes | None] = field(default_factory=dict)
    """The uploads StartBlobUpload began, by upload id: the bytes PUT to its URL (None: nothing yet)."""
    http_requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    """Each HTTP request the FakeStore got: (method, path without the query, headers)."""
    http_failures: int = 0
    """How many of the next HTTP requests the FakeStore answers 403."""

    def put_blob(self, value: Any) -> dict[str, Any]:
        """Stores ``value``'s compact JSON as a blob; returns its reference object."""
        data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        sha256 = hashlib.sha256(data).hexdigest()
        self.blobs[sha256] = data
        return {"$blob": {"sha256": sha256, "size": len(data), "head": blob_head(data)}}

    def add_task(
        self,
        task_name: str,
        input: Any = None,
        *,
        queue: str = "q",
        attempt: int = 1,
        task_id: str | None = None,
        trace_context: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> str:
        task = worker_service_pb2.Task(
            task_id=task_id or uuid.uuid4().hex,
            attempt=attempt,
            run_id="run-" + uuid.uuid4().hex[:6],
            node_id=task_name,
            workflow_name="wf",
            workflow_version=1,
            queue=queue,
            task_name=task_name,
            namespace="default",
            trace_context=trace_context or {},
            secrets=secrets or {},
        )
        if input is not None:
            task.input.CopyFrom(to_value(input))
        self.pending.put_nowait(task)
        return task.task_id

    def expire(self, task_id: str) -> None:
        """Takes the lease away, as the server's lease recovery does."""
        self.leases.pop(task_id, None)

    def cancel(self, task_id: str, reason: str = "") -> None:
        """Marks the task's run cancelled: the next heartbeat answers cancel_requested (and ``reason``)."""
        self.leases[task_id].cancel_requested = True
        self.leases[task_id].cancel_reason = reason

    def count(self, method: str, task_id: str | None = None) -> int:
        return sum(1 for m, r in self.calls if m == method and (task_id is None or r.task_id == task_id))


class _Worker(worker_service_pb2_grpc.WorkerServiceServicer):
    def __init__(self, state: FakeServer) -> None:
        self.state = state

    async def _check(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Lease:
        lease = self.state.leases.get(request.task_id)
        if lease is None or lease.task.attempt != request.attempt or lease.task.lease_token != request.lease_token:
            info = error_details_pb2.ErrorInfo(reason="LEASE_LOST", domain="composer.dev")
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the lease is no longer this worker's",
                trailing_metadata=status_trailer(grpc.StatusCode.FAILED_PRECONDITION, "lease lost", info),
            )
        assert lease is not None
        return lease

    async def PollTasks(self, request: Any, context: Any) -> worker_service_pb2.PollTasksResponse:
        self.state.calls.append(("PollTasks", request))
        self.state.polls += 1
        await injected(self.state, "PollTasks", context)
        tasks: list[worker_service_pb2.Task] = []
        try:
            first = await asyncio.wait_for(self.state.pending.get(), request.wait.ToTimedelta().total_seconds())
            tasks.append(first)
        except asyncio.TimeoutError:
            return worker_service_pb2.PollTasksResponse()
        while len(tasks) < max(request.max_tasks, 1) and not self.state.pending.empty():
            tasks.append(self.state.pending.get_nowait())
        for task in tasks:
            if task.queue not in request.queues:
                raise AssertionError(f"task on queue {task.queue} polled from {list(request.queues)}")
            task.lease_token = uuid.uuid4().hex
            task.lease_duration.FromMilliseconds(int(self.state.lease_seconds * 1000))
            first_lease = self.state.lease_seconds
            if request.confirm_receipt and self.state.receipt_seconds is not None:
                first_lease = self.state.receipt_seconds
            task.lease_expire_time.FromNanoseconds(time.time_ns() + int(first_lease * 1e9))
            self.state.leases[task.task_id] = Lease(task)
        return worker_service_pb2.PollTasksResponse(tasks=tasks)

    async def Heartbeat(self, request: Any, context: Any) -> worker_service_pb2.HeartbeatResponse:
        self.state.calls.append(("Heartbeat", request))
        self.state.heartbeat_times.append(time.monotonic())
        await injected(self.state, "Heartbeat", context)
        lease = await self._check(request, context)
        return worker_service_pb2.HeartbeatResponse(
            cancel_requested=lease.cancel_requested, cancel_reason=lease.cancel_reason
        )

    def _see_report(self, method: str, request: Any, context: Any) -> None:
        self.state.calls.append((method, request))
        self.state.report_metadata[(method, request.task_id)] = dict(context.invocation_metadata())
        if self.state.on_report is not None:
            self.state.on_report(method, request.task_id)

    async def CompleteTask(self, request: Any, context: Any) -> worker_service_pb2.CompleteTaskResponse:
        self._see_report("CompleteTask", request, context)
        await injected(self.state, "CompleteTask", context)
        if self.state.completed.get(request.task_id) == request:
            return worker_service_pb2.CompleteTaskResponse()
        await self._check(request, context)
        self.state.completed[request.task_id] = request
        self.state.leases.pop(request.task_id)
        return worker_service_pb2.CompleteTaskResponse()

    async def FailTask(self, request: Any, context: Any) -> worker_service_pb2.FailTaskResponse:
        self._see_report("FailTask", request, context)
        await injected(self.state, "FailTask", context)
        if self.state.failed.get(request.task_id) == request:
            return worker_service_pb2.FailTaskResponse()
        await self._check(request, context)
        self.state.failed[request.task_id] = request
        self.state.leases.pop(request.task_id)
        return worker_service_pb2.FailTaskResponse()


class _ServerInfo(server_service_pb2_grpc.ServerServiceServicer):
    def __init__(self, state: FakeServer) -> None:
        self.state = state

    async def GetServerInfo(self, request: Any, context: Any) -> server_service_pb2.GetServerInfoResponse:
        self.state.server_info_calls += 1
        return server_service_pb2.GetServerInfoResponse(
            server_version="fake",
            protocol_version="1.0",
            payload_offload_bytes=self.state.payload_offload_bytes,
            max_payload_bytes=1 << 30,
            max_message_bytes=4 << 20,
            blob_urls=self.state.blob_urls,
        )


BLOB_CHUNK = 1 << 20
"""BlobService's largest chunk."""


def blob_head(data: bytes) -> str:
    """A blob's head: its first 256 bytes at most, cut at a character boundary."""
    return data[:256].decode("utf-8", errors="ignore") if len(data) > 256 else data.decode()


class _Blobs(blob_service_pb2_grpc.BlobServiceServicer):
    """BlobService as blob_service.proto says: chunks of at most 1 MiB (INVALID_ARGUMENT naming
    ``data`` otherwise), RESOURCE_EXHAUSTED past the limit (a BadRequest naming ``data``, as the
    server's), NOT_FOUND for an unknown digest, the size in the first chunk of a download."""

    def __init__(self, state: FakeServer) -> None:
        self.state = state

    async def UploadBlob(self, request_iterator: Any, context: Any) -> blob_service_pb2.UploadBlobResponse:
        sizes: list[int] = []
        data = bytearray()
        async for chunk in request_iterator:
            if len(chunk.data) > BLOB_CHUNK:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"data: a chunk of {len(chunk.data)} bytes")
            sizes.append(len(chunk.data))
            data += chunk.data
        self.state.upload_chunks.append(sizes)
        await injected(self.state, "UploadBlob", context)
        if 0 < self.state.max_blob_bytes < len(data):
            message = f"data: {len(data)} bytes pass the payload limit"
            violation = error_details_pb2.BadRequest.FieldViolation(field="data", description=message)
            limit = error_details_pb2.BadRequest(field_violations=[violation])
            await Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, message, (limit,)).abort(context)
        sha256 = hashlib.sha256(data).hexdigest()
        self.state.blobs[sha256] = bytes(data)
        blob = blob_service_pb2.BlobRef(sha256=sha256, size=len(data), head=blob_head(bytes(data)))
        return blob_service_pb2.UploadBlobResponse(blob=blob)

    async def DownloadBlob(self, request: Any, context: Any) -> Any:
        self.state.downloads.append((request.sha256, request.offset))
        await injected(self.state, "DownloadBlob", context)
        data = self.state.blobs.get(request.sha256)
        if data is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no blob {request.sha256}")
        assert data is not None
        breaking = self.state.break_downloads > 0
        if breaking:
            self.state.break_downloads -= 1
        step = self.state.download_chunk_bytes
        for index, start in enumerate(range(request.offset, len(data), step)):
            if breaking and index == 1:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "injected break")
            yield blob_service_pb2.DownloadBlobResponse(data=data[start : start + step], size=len(data) if index == 0 else 0)

    async def _url_call(self, method: str, context: Any) -> str:
        """Records a URL call and answers its injected failure, or FAILED_PRECONDITION when no URLs are
        given; the base of the URLs otherwise."""
        self.state.url_calls.append(method)
        await injected(self.state, method, context)
        if not self.state.blob_urls or self.state.url_base is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this server gives no blob URLs")
        assert self.state.url_base is not None
        return self.state.url_base

    async def GetBlobUrl(self, request: Any, context: Any) -> blob_service_pb2.GetBlobUrlResponse:
        base = await self._url_call("GetBlobUrl", context)
        data = self.state.blobs.get(request.sha256)
        if data is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no blob {request.sha256}")
        assert data is not None
        url = f"{base}/blobs/{request.sha256}?{URL_SIGNATURE}"
        answer = blob_service_pb2.GetBlobUrlResponse(url=url, size=len(data))
        answer.expires_at.FromSeconds(int(time.time()) + 300)
        return answer

    async def StartBlobUpload(self, request: Any, context: Any) -> blob_service_pb2.StartBlobUploadResponse:
        base = await self._url_call("StartBlobUpload", context)
        upload_id = uuid.uuid4().hex
        self.state.url_uploads[upload_id] = None
        url = f"{base}/uploads/{upload_id}?{URL_SIGNATURE}"
        answer = blob_service_pb2.StartBlobUploadResponse(upload_id=upload_id, url=url)
        answer.expires_at.FromSeconds(int(time.time()) + 300)
        return answer

    async def FinishBlobUpload(self, request: Any, context: Any) -> blob_service_pb2.FinishBlobUploadResponse:
        await self._url_call("FinishBlobUpload", context)
        data = self.state.url_uploads.pop(request.upload_id, None)
        if data is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no upload {request.upload_id} with bytes")
        assert data is not None
        sha256 = hashlib.sha256(data).hexdigest()
        self.state.blobs[sha256] = data
        blob = blob_service_pb2.BlobRef(sha256=sha256, size=len(data), head=blob_head(data))
        return blob_service_pb2.FinishBlobUploadResponse(blob=blob)


URL_SIGNATURE = "X-Amz-Signature=fake-secret-signature"
"""The query of every URL the fake gives: what a log must never show."""


class FakeStore:
    """The blob store behind the fake's presigned URLs: an HTTP server on a free loopback port (in a
    thread) that answers ``GET /blobs/<sha256>`` from ``state.blobs`` and keeps the body of
    ``PUT /uploads/<upload id>`` for FinishBlobUpload. Sets ``state.url_base``; use it as a context
    manager (it stops at the end)."""

    def __init__(self, state: FakeServer) -> None:
        self.state = state
        store = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _refused(self) -> bool:
                path = self.path.split("?", 1)[0]
                store.state.http_requests.append((self.command, path, dict(self.headers.items())))
                if store.state.http_failures > 0:
                    store.state.http_failures -= 1
                    self.send_error(403, "injected")
                    return True
                if not self.path.endswith("?" + URL_SIGNATURE):
                    self.send_error(403, "no signature")
                    return True
                return False

            def do_GET(self) -> None:
                if self._refused():
                    return
                sha256 = self.path.split("?", 1)[0].removeprefix("/blobs/")
                data = store.state.blobs.get(sha256)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if self._refused():
                    return
                upload_id = self.path.split("?", 1)[0].removeprefix("/uploads/")
                if upload_id not in store.state.url_uploads:
                    self.send_error(404)
                    return
                store.state.url_uploads[upload_id] = body
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeStore:
        self._thread.start()
        self.state.url_base = self.url
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


async def start_fake(
    state: FakeServer, *, also: Callable[[grpc.aio.Server], None] | None = None
) -> tuple[grpc.aio.Server, str]:
    """Starts the fake on a free loopback port; returns the server and its address. ``also`` adds
    more servicers (a test's fake RunService)."""
    server = grpc.aio.server()
    if also is not None:
        also(server)
    worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(_Worker(state), server)
    server_service_pb2_grpc.add_ServerServiceServicer_to_server(_ServerInfo(state), server)
    blob_service_pb2_grpc.add_BlobServiceServicer_to_server(_Blobs(state), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"
