// C23 (tests/conformance/README.md): large payloads move through the blob store, unseen by
// handlers, against the real server (its --blob-store a temporary folder, from the harness). Each
// test acts in a namespace of its own.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import type { Interceptor } from "@connectrpc/connect";

import { Client, isBlobReference, isNotFound, type BlobReference, type Json } from "../../src/index.js";
import type { CompleteTaskRequest } from "../../src/gen/composer/v1/worker_service_pb.js";
import type { SendEventRequest, StartRunRequest } from "../../src/gen/composer/v1/run_service_pb.js";
import { fromValue } from "../../src/values.js";
import { hex, mintToken, serving, useServer, worker as makeWorker } from "./harness.js";

const stack = useServer();

/** Records each call by method name, and each unary request. */
class Recorder {
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

function clientIn(namespace: string, recorder?: Recorder): Client {
  return new Client({
    address: stack.server.address,
    token: mintToken(["admin"], { namespace }),
    ...(recorder ? { interceptors: [recorder.interceptor] } : {}),
  });
}

/** The `$blob` of a reference, with its checks. */
function refOf(value: Json, what: string): BlobReference["$blob"] {
  assert.ok(isBlobReference(value), `${what} is not a reference: ${JSON.stringify(value)?.slice(0, 300)}`);
  const ref = (value as unknown as BlobReference).$blob;
  assert.match(ref.sha256, /^[0-9a-f]{64}$/, what);
  return ref;
}

describe("payloads", { timeout: 300_000 }, () => {
  test("c23 large payloads move through the blob store, unseen by handlers", async () => {
    const s = hex();
    const namespace = `c23-${s}`;
    const queue = `c23-${s}`;
    const name = `c23-${s}`;
    const calls = new Recorder();
    const client = clientIn(namespace, calls);
    const elsewhere = clientIn(`c23-other-${s}`);
    const reports = new Recorder();
    const worker = makeWorker(stack.server.address, { token: mintToken(["admin"], { namespace }), slots: 2, interceptors: [reports.interceptor] });
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
    try {
      const info = await client.serverInfo();
      assert.ok(info.payloadOffloadBytes > 0 && info.payloadOffloadBytes < 150_000, JSON.stringify(info));
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
        assert.equal(calls.count("UploadBlob"), 1);
        const started = calls.requests<StartRunRequest>("StartRun");
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
        assert.equal(reports.count("UploadBlob"), 1);
        assert.ok(reports.count("DownloadBlob") >= 1, `the worker downloaded ${reports.count("DownloadBlob")} blobs`);

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
        const uploads = calls.count("UploadBlob");
        const small = await client.startRun(name, { doc: "short", n: 1 });
        assert.equal(calls.count("UploadBlob"), uploads);
        assert.deepEqual((await client.getRun(small.runId)).input, { doc: "short", n: 1 });
        assert.deepEqual(await client.waitForResult(small.runId, { timeoutMs: 120_000 }), { a: 200_000, b: 200_000 });
      });
    } finally {
      client.close();
      elsewhere.close();
    }
  });

  test("c23 sendEvent uploads a large payload; uploadBlob of the same bytes gives the same reference", async () => {
    const s = hex();
    const namespace = `c23e-${s}`;
    const name = `c23e-${s}`;
    const calls = new Recorder();
    const client = clientIn(namespace, calls);
    try {
      await client.registerWorkflow(`
name: ${name}
nodes:
  - { id: wait, type: WAIT_FOR_EVENT, event: doc_ready }
output: { size: "\${size(nodes.wait.output.doc)}", got: "\${nodes.wait.output}" }
`);
      const run = await client.startRun(name, {});
      const payload = { doc: "p".repeat(100_000), k: "v" };
      await client.sendEvent("doc_ready", payload, { runId: run.runId });
      const sent = calls.requests<SendEventRequest>("SendEvent");
      const ref = refOf(fromValue(sent[0]?.payload), "SendEvent's payload");
      assert.equal(calls.count("UploadBlob"), 1);
      assert.deepEqual(await client.waitForResult(run.runId, { timeoutMs: 60_000 }), { size: 100_000, got: payload });

      const again = await client.uploadBlob(new TextEncoder().encode(JSON.stringify(payload)));
      assert.deepEqual(again, ref);
    } finally {
      client.close();
    }
  });
});
