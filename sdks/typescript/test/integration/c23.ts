// C23's run (tests/conformance/README.md), shared by payloads.test.ts (the server's blob store a
// folder: the bytes go through BlobService's streams) and blob-urls.test.ts (C24: a bucket that
// signs URLs, the bytes go straight to and from it). Each run acts in a namespace of its own.
import assert from "node:assert/strict";

import type { Interceptor } from "@connectrpc/connect";

import { Client, isBlobReference, isNotFound, type BlobReference, type Json } from "../../src/index.js";
import type { StartRunRequest } from "../../src/gen/composer/v1/run_service_pb.js";
import type { CompleteTaskRequest } from "../../src/gen/composer/v1/worker_service_pb.js";
import { fromValue } from "../../src/values.js";
import { hex, mintToken, serving, worker as makeWorker } from "./harness.js";

/** Records each call by method name, and each unary request. */
export class Recorder {
  readonly calls: { method: string; message: unknown }[] = [];
  readonly interceptor: Interceptor = (next) => async (request) => {
    this.calls.push({ method: request.method.name, message: request.stream ? undefined : request.message });
    return next(request);
  };
  count(method: string): number {
    return this.calls.filter((c) => c.method === method).length;
  }
  requests<T>(method: string): T[] {
    return this.calls.filter((c) => c.method === method).map((c) => c.message as T);
  }
}

/** A client of `address` in `namespace` (admin), its calls recorded by `recorder`. */
export function clientIn(address: string, namespace: string, recorder?: Recorder): Client {
  return new Client({
    address,
    token: mintToken(["admin"], { namespace }),
    ...(recorder ? { interceptors: [recorder.interceptor] } : {}),
  });
}

/** The `$blob` of a reference, with its checks. */
export function refOf(value: Json, what: string): BlobReference["$blob"] {
  assert.ok(isBlobReference(value), `${what} is not a reference: ${JSON.stringify(value)?.slice(0, 300)}`);
  const ref = (value as unknown as BlobReference).$blob;
  assert.match(ref.sha256, /^[0-9a-f]{64}$/, what);
  return ref;
}

/**
 * The calls that move a blob's bytes: through the streams (`UploadBlob`, `DownloadBlob`) or, where
 * the server gives presigned URLs, through them (`FinishBlobUpload` ends an upload, `GetBlobUrl`
 * starts a download).
 */
export interface BlobCalls {
  upload: "UploadBlob" | "FinishBlobUpload";
  download: "DownloadBlob" | "GetBlobUrl";
}

export const STREAMS: BlobCalls = { upload: "UploadBlob", download: "DownloadBlob" };
export const URLS: BlobCalls = { upload: "FinishBlobUpload", download: "GetBlobUrl" };

/**
 * A run of `a → b` started with a 150 KB input: `a` sees it whole and returns 200 KB, `b` sees that
 * whole and returns its doc's length; the result is `{"a": 200000, "b": 200000}`, getRun shows the
 * references, downloadBlob gives the input back, another namespace gets NOT_FOUND, a small input
 * stays inline. The client's and the worker's blob calls are checked to be `calls`'.
 */
export async function c23Run(address: string, calls: BlobCalls): Promise<void> {
  const s = hex();
  const namespace = `c23-${s}`;
  const queue = `c23-${s}`;
  const name = `c23-${s}`;
  const made = new Recorder();
  const client = clientIn(address, namespace, made);
  const elsewhere = clientIn(address, `c23-other-${s}`);
  const reports = new Recorder();
  const worker = makeWorker(address, { token: mintToken(["admin"], { namespace }), slots: 2, interceptors: [reports.interceptor] });
  const input = { doc: "d".repeat(150_000), n: 7 };
  const aOutput = { doc: "o".repeat(200_000), n: 7 };
  const seenByA: unknown[] = [];
  const seenByB: unknown[] = [];
  worker.task(queue, "a", (ctx) => {
    seenByA.push(ctx.input);
    return { doc: "o".repeat(200_000), n: ctx.input.n };
  });
  worker.task(queue, "b", (ctx) => {
    seenByB.push(ctx.input);
    return ctx.input.doc.length;
  });
  const unused = calls.upload === "UploadBlob" ? ["StartBlobUpload", "FinishBlobUpload", "GetBlobUrl"] : ["UploadBlob", "DownloadBlob"];
  try {
    const info = await client.serverInfo();
    assert.ok(info.payloadOffloadBytes > 0 && info.payloadOffloadBytes < 150_000, JSON.stringify(info));
    assert.equal(info.blobUrls, calls === URLS, JSON.stringify(info));
    await client.registerWorkflow(`
name: ${name}
nodes:
  - { id: a, type: TASK, queue: ${queue}, task: a }
  - { id: b, type: TASK, queue: ${queue}, task: b, input: "\${nodes.a.output}" }
edges:
  - { from: a, to: b }
output: { a: "\${size(nodes.a.output.doc)}", b: "\${nodes.b.output}" }
`);
    await serving(worker, async () => {
      const run = await client.startRun(name, input);
      // The client uploaded the input and sent its reference.
      assert.equal(made.count(calls.upload), 1);
      const started = made.requests<StartRunRequest>("StartRun");
      refOf(fromValue(started[0]?.input), "StartRun's input");

      assert.deepEqual(await client.waitForResult(run.runId, { timeoutMs: 120_000 }), { a: 200_000, b: 200_000 });

      // Handlers saw whole values, never a reference.
      assert.equal(seenByA.length, 1);
      assert.deepEqual(seenByA[0], input);
      assert.equal(seenByB.length, 1);
      assert.deepEqual(seenByB[0], aOutput);
      // The worker uploaded a's output and reported its reference; b's small one went inline.
      const completes = reports.requests<CompleteTaskRequest>("CompleteTask").map((r) => fromValue(r.output));
      assert.equal(completes.length, 2);
      assert.ok(completes.some((o) => isBlobReference(o)), JSON.stringify(completes).slice(0, 500));
      assert.ok(completes.includes(200_000), JSON.stringify(completes).slice(0, 500));
      assert.equal(reports.count(calls.upload), 1);
      assert.ok(reports.count(calls.download) >= 1, `the worker downloaded ${reports.count(calls.download)} blobs`);

      // getRun shows the stored references.
      const stored = await client.getRun(run.runId);
      assert.equal(stored.status, "COMPLETED");
      const inputRef = refOf(stored.input, "the run's input");
      assert.ok(inputRef.size > 150_000, JSON.stringify(inputRef));
      assert.ok(inputRef.head.startsWith('{"doc"'), inputRef.head);
      const a = stored.nodes.find((n) => n.nodeId === "a");
      const outputRef = refOf(a?.output ?? null, "a's output");
      assert.ok(outputRef.size > 150_000, JSON.stringify(outputRef));
      assert.ok(outputRef.head.startsWith('{"doc"'), outputRef.head);
      assert.deepEqual(stored.output, { a: 200_000, b: 200_000 });
      assert.deepEqual(await client.resolvePayload(a?.output ?? null), aOutput);

      // The input's blob holds the input's JSON; another namespace cannot read it.
      const bytes = await client.downloadBlob(inputRef.sha256);
      assert.equal(bytes.length, inputRef.size);
      assert.deepEqual(JSON.parse(new TextDecoder().decode(bytes)), input);
      const foreign = await elsewhere.downloadBlob(inputRef.sha256).catch((e: unknown) => e);
      assert.ok(isNotFound(foreign), String(foreign));

      // A small input stays inline (and the client uploads nothing).
      const uploads = made.count(calls.upload);
      const small = await client.startRun(name, { doc: "short", n: 1 });
      assert.equal(made.count(calls.upload), uploads);
      assert.deepEqual((await client.getRun(small.runId)).input, { doc: "short", n: 1 });
      assert.deepEqual(await client.waitForResult(small.runId, { timeoutMs: 120_000 }), { a: 200_000, b: 200_000 });

      // The bytes moved only the one way.
      for (const method of unused) {
        assert.equal(made.count(method) + reports.count(method), 0, `${method} was called`);
      }
    });
  } finally {
    client.close();
    elsewhere.close();
  }
}
