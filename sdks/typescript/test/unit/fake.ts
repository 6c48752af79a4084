// A fake WorkerService + ServerService transport for the worker's local behaviours (L1-L6): it
// answers each call from a script of the test's own and records every request.
import { createHash, randomUUID } from "node:crypto";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";

import { create, type DescMessage, type DescMethodStreaming, type DescMethodUnary, type MessageInitShape } from "@bufbuild/protobuf";
import { BinaryWriter } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, createRouterTransport, type StreamResponse, type Transport, type UnaryResponse } from "@connectrpc/connect";

import { BlobService } from "../../src/gen/composer/v1/blob_service_pb.js";
import type { Task } from "../../src/gen/composer/v1/worker_service_pb.js";

export type Answer = (request: any, signal: AbortSignal | undefined) => unknown; // eslint-disable-line @typescript-eslint/no-explicit-any

/** Encodes a google.rpc.ErrorInfo as the server sends it. */
export function errorInfo(reason: string, domain = "composer.dev", metadata: Record<string, string> = {}): Uint8Array {
  const w = new BinaryWriter();
  w.tag(1, 2).string(reason);
  w.tag(2, 2).string(domain);
  for (const [k, v] of Object.entries(metadata)) {
    const entry = new BinaryWriter().tag(1, 2).string(k).tag(2, 2).string(v).finish();
    w.tag(3, 2).bytes(entry);
  }
  return w.finish();
}

/** Encodes a google.rpc.BadRequest with `violations` [field, description]. */
export function badRequest(violations: [string, string][]): Uint8Array {
  const w = new BinaryWriter();
  for (const [field, description] of violations) {
    w.tag(1, 2).bytes(new BinaryWriter().tag(1, 2).string(field).tag(2, 2).string(description).finish());
  }
  return w.finish();
}

/** Encodes a google.rpc.QuotaFailure with one violation. */
export function quotaFailure(subject: string, description: string): Uint8Array {
  const violation = new BinaryWriter().tag(1, 2).string(subject).tag(2, 2).string(description).finish();
  return new BinaryWriter().tag(1, 2).bytes(violation).finish();
}

/** Encodes a google.rpc.RetryInfo whose retry_delay (a google.protobuf.Duration) is `ms`. */
export function retryInfo(ms: number): Uint8Array {
  const delay = new BinaryWriter().tag(1, 0).int64(Math.floor(ms / 1000)).tag(2, 0).int32((ms % 1000) * 1e6).finish();
  return new BinaryWriter().tag(1, 2).bytes(delay).finish();
}

/** A ConnectError as the transport would decode it from the wire. */
export function wireError(code: Code, message: string, details: { type: string; value: Uint8Array }[] = []): ConnectError {
  const error = new ConnectError(message, code);
  error.details = details;
  return error;
}

export const leaseLost = (): ConnectError =>
  wireError(Code.FailedPrecondition, "the lease is no longer yours", [{ type: "google.rpc.ErrorInfo", value: errorInfo("LEASE_LOST") }]);

export const unavailable = (): ConnectError => wireError(Code.Unavailable, "server restarting");

/** RESOURCE_EXHAUSTED over the namespace's quota, as the server sends it: QuotaFailure, RetryInfo, ErrorInfo. */
export const quotaExceeded = (retryMs: number): ConnectError =>
  wireError(Code.ResourceExhausted, `namespace default is over its writes quota; retry in ${retryMs} ms`, [
    { type: "google.rpc.QuotaFailure", value: quotaFailure("namespace:default", "writes: 100 per second") },
    { type: "google.rpc.RetryInfo", value: retryInfo(retryMs) },
    { type: "google.rpc.ErrorInfo", value: errorInfo("QUOTA_EXCEEDED", "composer.dev", { quota: "writes" }) },
  ]);

/** RESOURCE_EXHAUSTED of a busy CPU pool: ErrorInfo CPU_POOL_BUSY, and RetryInfo when `retryMs` is given. */
export const cpuPoolBusy = (retryMs?: number): ConnectError =>
  wireError(Code.ResourceExhausted, "the CPU pool is busy", [
    ...(retryMs === undefined ? [] : [{ type: "google.rpc.RetryInfo", value: retryInfo(retryMs) }]),
    { type: "google.rpc.ErrorInfo", value: errorInfo("CPU_POOL_BUSY") },
  ]);

/** RESOURCE_EXHAUSTED of a payload over the server's limit: a BadRequest naming the field, no ErrorInfo. */
export const payloadTooLarge = (field: string): ConnectError =>
  wireError(Code.ResourceExhausted, "the payload is over --max-payload-bytes", [
    { type: "google.rpc.BadRequest", value: badRequest([[field, "5242880 bytes, over the limit of 1048576"]]) },
  ]);

export function task(overrides: Partial<Task> = {}): MessageInitShape<typeof import("../../src/gen/composer/v1/worker_service_pb.js").TaskSchema> {
  return {
    taskId: "t-1",
    attempt: 1,
    leaseToken: "lease-1",
    leaseDuration: { seconds: 3n, nanos: 0 },
    runId: "run-1",
    nodeId: "work",
    workflowName: "wf",
    workflowVersion: 1,
    queue: "q",
    taskName: "t",
    namespace: "default",
    ...(overrides as object),
  };
}

/** The fake: `answers[method]` is called for each call (default: OK, empty); polls hand out `tasks` once. */
export class FakeServer implements Transport {
  readonly calls: { method: string; message: any; at: number; headers: Headers }[] = []; // eslint-disable-line @typescript-eslint/no-explicit-any
  readonly answers: Record<string, Answer> = {};
  tasks: ReturnType<typeof task>[] = [];
  protocolVersion = "1.0";

  constructor(answers: Record<string, Answer> = {}) {
    Object.assign(this.answers, answers);
  }

  requests(method: string): any[] { // eslint-disable-line @typescript-eslint/no-explicit-any
    return this.calls.filter((c) => c.method === method).map((c) => c.message);
  }

  /** The headers of each call of `method`, in order. */
  headers(method: string): Headers[] {
    return this.calls.filter((c) => c.method === method).map((c) => c.headers);
  }

  async unary<I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    signal: AbortSignal | undefined,
    _timeoutMs: number | undefined,
    header: HeadersInit | undefined,
    input: MessageInitShape<I>,
  ): Promise<UnaryResponse<I, O>> {
    const message = create(method.input, input);
    this.calls.push({ method: method.name, message, at: Date.now(), headers: new Headers(header) });
    let output: unknown;
    const answer = this.answers[method.name];
    if (answer) output = await answer(message, signal);
    else if (method.name === "GetServerInfo") output = { serverVersion: "fake", protocolVersion: this.protocolVersion, blobUrls: this.urlBase !== undefined };
    else if (method.name === "PollTasks") output = await this.poll(message as unknown as { maxTasks: number }, signal);
    else if (method.parent.typeName === BlobService.typeName) output = this.blobUrlCall(method.name, message as unknown as Record<string, string>);
    else output = {};
    return {
      stream: false,
      service: method.parent,
      method,
      header: new Headers(),
      trailer: new Headers(),
      message: create(method.output, (output ?? {}) as MessageInitShape<O>),
    } as UnaryResponse<I, O>;
  }

  /** Hands out queued tasks (at most maxTasks), else waits a little like a long poll. */
  async poll(request: { maxTasks: number }, signal: AbortSignal | undefined): Promise<unknown> {
    if (this.tasks.length > 0) return { tasks: this.tasks.splice(0, request.maxTasks) };
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, 50);
      signal?.addEventListener("abort", () => {
        clearTimeout(timer);
        resolve();
      });
    });
    return { tasks: [] };
  }

  /** The fake's blob store: sha256 to bytes (BlobService's streams, answered in memory). */
  readonly blobs = new Map<string, Uint8Array>();
  /** The most bytes one DownloadBlob message carries (the server's is 1 MiB). */
  downloadChunkBytes = 1 << 20;
  /** When set, the next DownloadBlob breaks (UNAVAILABLE) after this many chunks, once. */
  breakDownloadAfterChunks: number | undefined;
  #blobService: Transport | undefined;

  /**
   * The presigned URLs (C24): the base URL of a node:http server on 127.0.0.1 that plays the blob
   * store (`serveUrls()`), undefined when none runs. While it runs GetServerInfo says `blobUrls`
   * (unless `answers` say otherwise) and GetBlobUrl, StartBlobUpload and FinishBlobUpload answer
   * with its URLs; without it they answer FAILED_PRECONDITION, as a server whose store is a folder.
   */
  urlBase: string | undefined;
  /** What the store was sent by PUT, by upload id. */
  readonly uploads = new Map<string, Uint8Array>();
  /** Every HTTP request the store received. */
  readonly httpRequests: HttpRequestSeen[] = [];
  /** When set, the store answers every request with this status (and no bytes). */
  httpStatus: number | undefined;
  #http: Server | undefined;

  /** Starts the blob store's HTTP server; its base URL. Stop it with `closeUrls()`. */
  async serveUrls(): Promise<string> {
    const server = createServer((request, response) => {
      const chunks: Buffer[] = [];
      request.on("data", (chunk: Buffer) => chunks.push(chunk));
      request.on("end", () => {
        const body = Buffer.concat(chunks);
        const path = (request.url ?? "").split("?")[0] as string;
        this.httpRequests.push({ method: request.method ?? "", path, headers: request.headers, bytes: body.length });
        if (this.httpStatus !== undefined) return void response.writeHead(this.httpStatus).end();
        const [, kind, name] = path.split("/");
        if (request.method === "PUT" && kind === "upload" && name) {
          this.uploads.set(name, body);
          return void response.writeHead(200).end();
        }
        const blob = request.method === "GET" && kind === "blob" && name ? this.blobs.get(name) : undefined;
        if (!blob) return void response.writeHead(404).end("<Error><Code>NoSuchKey</Code></Error>");
        response.writeHead(200, { "content-length": String(blob.length) }).end(Buffer.from(blob));
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    this.#http = server;
    this.urlBase = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    return this.urlBase;
  }

  /** Stops the blob store's HTTP server (URL calls then answer FAILED_PRECONDITION). */
  async closeUrls(): Promise<void> {
    const server = this.#http;
    this.#http = undefined;
    this.urlBase = undefined;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** GetBlobUrl, StartBlobUpload and FinishBlobUpload, answered from the fake's store. */
  blobUrlCall(method: string, request: Record<string, string>): unknown {
    const signature = "X-Amz-Signature=fake-credential";
    if (this.urlBase === undefined) {
      throw new ConnectError("the blob store does not presign URLs (a local folder): use UploadBlob and DownloadBlob", Code.FailedPrecondition);
    }
    if (method === "GetBlobUrl") {
      const data = this.blobs.get(request["sha256"] as string);
      if (!data) throw new ConnectError(`no blob ${request["sha256"]}`, Code.NotFound);
      return { url: `${this.urlBase}/blob/${request["sha256"]}?${signature}`, size: BigInt(data.length) };
    }
    if (method === "StartBlobUpload") {
      const uploadId = randomUUID();
      return { uploadId, url: `${this.urlBase}/upload/${uploadId}?${signature}` };
    }
    if (method === "FinishBlobUpload") {
      const data = this.uploads.get(request["uploadId"] as string);
      if (!data) throw new ConnectError(`no upload ${request["uploadId"]}`, Code.NotFound);
      this.uploads.delete(request["uploadId"] as string);
      const sha256 = createHash("sha256").update(data).digest("hex");
      this.blobs.set(sha256, data);
      return { blob: { sha256, size: BigInt(data.length), head: headOf(data) } };
    }
    throw new ConnectError(`${method} is not faked`, Code.Unimplemented);
  }

  /**
   * BlobService over an in-memory router. UploadBlob is recorded with `message` the list of chunk
   * sizes and `data` the bytes; `answers["UploadBlob"]` (given `{ chunks, data }`) and
   * `answers["DownloadBlob"]` (given the request) may throw to refuse the call.
   */
  stream<I extends DescMessage, O extends DescMessage>(
    method: DescMethodStreaming<I, O>,
    signal: AbortSignal | undefined,
    timeoutMs: number | undefined,
    header: HeadersInit | undefined,
    input: AsyncIterable<MessageInitShape<I>>,
  ): Promise<StreamResponse<I, O>> {
    if (method.parent.typeName !== BlobService.typeName) throw new ConnectError("streams are not faked", Code.Unimplemented);
    const fake = this; // eslint-disable-line @typescript-eslint/no-this-alias
    this.#blobService ??= createRouterTransport(({ service }) => {
      service(BlobService, {
        uploadBlob: async (requests, context) => {
          const chunks: Uint8Array[] = [];
          for await (const request of requests) chunks.push(request.data);
          const data = Buffer.concat(chunks);
          fake.calls.push({ method: "UploadBlob", message: { chunks: chunks.map((c) => c.length), data }, at: Date.now(), headers: context.requestHeader });
          await fake.answers["UploadBlob"]?.({ chunks, data }, context.signal);
          const sha256 = createHash("sha256").update(data).digest("hex");
          fake.blobs.set(sha256, data);
          return { blob: { sha256, size: BigInt(data.length), head: headOf(data) } };
        },
        downloadBlob: async function* (this: void, request, context) {
          fake.calls.push({ method: "DownloadBlob", message: request, at: Date.now(), headers: context.requestHeader });
          await fake.answers["DownloadBlob"]?.(request, context.signal);
          const data = fake.blobs.get(request.sha256);
          if (!data) throw new ConnectError(`no blob ${request.sha256}`, Code.NotFound);
          let first = true;
          let sent = 0;
          for (let at = Number(request.offset); at < data.length || first; at += fake.downloadChunkBytes) {
            if (fake.breakDownloadAfterChunks !== undefined && sent === fake.breakDownloadAfterChunks) {
              fake.breakDownloadAfterChunks = undefined;
              throw new ConnectError("connection reset", Code.Unavailable);
            }
            yield { data: data.subarray(at, at + fake.downloadChunkBytes), size: first ? BigInt(data.length) : 0n };
            first = false;
            sent += 1;
          }
        },
      });
    });
    return this.#blobService.stream(method, signal, timeoutMs, header, input);
  }
}

/** A request the fake's blob store (FakeServer.serveUrls) received over HTTP. */
export interface HttpRequestSeen {
  method: string;
  /** The path, without the query (the signature). */
  path: string;
  headers: IncomingHttpHeaders;
  bytes: number;
}

/** A URL to 127.0.0.1 on a port that was free a moment ago and is closed now: a request to it fails. */
export async function closedPortUrl(path = "/nothing"): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `http://127.0.0.1:${port}${path}?X-Amz-Signature=closed`;
}

/** A blob's head as the server makes it: its first bytes, at most 256, cut at a character boundary. */
export function headOf(data: Uint8Array): string {
  let end = Math.min(256, data.length);
  while (end > 0 && end < data.length && ((data[end] as number) & 0xc0) === 0x80) end--;
  return new TextDecoder().decode(data.subarray(0, end));
}
