// Large payloads (docs/payloads.md, conformance C23) against a fake server: the walk over
// references, the offload threshold of startRun, sendEvent and the worker's outputs, the 1 MiB
// chunks of uploadBlob, downloadBlob's checks and resumption, and the wait that resolves a result.
// Presigned URLs (C24): with a node:http server on 127.0.0.1 playing the blob store, the URL path
// when the server says blobUrls, and its two fallbacks (FAILED_PRECONDITION: the streams from then
// on; a request that fails: the stream for that call).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Code, createRouterTransport, type Transport } from "@connectrpc/connect";

import { Backoff, ComposerClient, Worker, blobReference, isBlobReference, isNotFound, type Handler, type Json, type Logger } from "../../src/index.js";
import { RunStatus } from "../../src/gen/composer/v1/common_pb.js";
import { RunService } from "../../src/gen/composer/v1/run_service_pb.js";
import { BLOB_CHUNK_BYTES, bytesOverLimit, chunksOf, hasBlobReference, referencedBlobs, replaceBlobReferences } from "../../src/payloads.js";
import { fromValue, toValue } from "../../src/values.js";
import { FakeServer, closedPortUrl, headOf, payloadTooLarge, quotaExceeded, task, unavailable, wireError } from "./fake.js";

const QUIET = { debug() {}, info() {}, warn() {}, error() {} };
const FAST = new Backoff({ initialMs: 10, maximumMs: 50 });

function sha(text: string | Uint8Array): string {
  return createHash("sha256").update(text).digest("hex");
}

/** A fake whose GetServerInfo gives `offload` as payloadOffloadBytes. */
function fakeWith(offload: number): FakeServer {
  return new FakeServer({ GetServerInfo: () => ({ serverVersion: "fake", protocolVersion: "1.0", payloadOffloadBytes: BigInt(offload) }) });
}

/** Puts `value`'s compact JSON in the fake's blob store; its reference. */
function stored(fake: FakeServer, value: unknown): Json {
  const data = new TextEncoder().encode(JSON.stringify(value));
  fake.blobs.set(sha(data), data);
  return blobReference({ sha256: sha(data), size: data.length, head: headOf(data) }) as unknown as Json;
}

/** A JSON object whose compact text is exactly `bytes` long: {"d":"xxx..."}. */
function ofLength(bytes: number): { d: string } {
  return { d: "x".repeat(bytes - '{"d":""}'.length) };
}

describe("references", () => {
  const a = "a".repeat(64);
  const b = "b".repeat(64);
  const ref = (sha256: string): Json => ({ $blob: { sha256, size: 10, head: "{" } });

  test("a reference is an object whose only key is $blob", () => {
    assert.ok(isBlobReference({ $blob: { sha256: a, size: 1, head: "" } }));
    assert.ok(!isBlobReference({ $blob: { sha256: a }, other: 1 }));
    assert.ok(!isBlobReference([{ $blob: {} }]));
    assert.ok(!isBlobReference({}));
    assert.ok(!isBlobReference(null));
    assert.ok(!isBlobReference("$blob"));
    assert.ok(!isBlobReference({ blob: {} }));
  });

  test("the walk finds references at any depth, each digest once, and replaces them in a copy", () => {
    const value: Json = { top: ref(a), list: [1, { deep: [ref(b), ref(a)] }], plain: { $blob: "x", also: 2 }, n: null };
    assert.ok(hasBlobReference(value));
    assert.ok(!hasBlobReference({ a: [1, { b: "c" }], $blob: 1, x: 2 }));
    assert.deepEqual(referencedBlobs(value), [a, b]);
    const before = JSON.stringify(value);
    const replaced = replaceBlobReferences(value, new Map<string, Json>([[a, { doc: "A" }], [b, [2]]]));
    assert.deepEqual(replaced, { top: { doc: "A" }, list: [1, { deep: [[2], { doc: "A" }] }], plain: { $blob: "x", also: 2 }, n: null });
    assert.equal(JSON.stringify(value), before, "the value given is left as it was");
    // A digest the map lacks stays a reference.
    assert.deepEqual(replaceBlobReferences([ref(b)], new Map([[a, 1]])), [ref(b)]);
  });

  test("a $blob object that names no blob is refused with its path", () => {
    assert.throws(() => referencedBlobs({ x: [{ $blob: { sha256: "nope" } }] }), (e: unknown) => e instanceof TypeError && /\$\.x\[0\]/.test(e.message));
    assert.throws(() => referencedBlobs({ $blob: 5 }), TypeError);
  });

  test("the threshold: bytes of the compact JSON strictly over the limit; 0 is never", () => {
    assert.equal(bytesOverLimit("x".repeat(100), 100), undefined);
    assert.equal(bytesOverLimit("x".repeat(101), 100)?.length, 101);
    assert.equal(bytesOverLimit("x".repeat(10_000), 0), undefined);
    // 60 characters, 120 bytes of UTF-8: bytes count, not characters.
    assert.equal(bytesOverLimit("é".repeat(60), 100)?.length, 120);
    assert.equal(bytesOverLimit("é".repeat(50), 100), undefined);
    assert.equal(bytesOverLimit("😀".repeat(26), 100)?.length, 104);
  });

  test("data is cut into chunks of at most 1 MiB, views of the bytes", () => {
    const data = new Uint8Array(2.5 * BLOB_CHUNK_BYTES).map((_, i) => i % 251);
    const chunks = [...chunksOf(data)];
    assert.deepEqual(chunks.map((c) => c.length), [BLOB_CHUNK_BYTES, BLOB_CHUNK_BYTES, BLOB_CHUNK_BYTES / 2]);
    assert.deepEqual(Buffer.concat(chunks), Buffer.from(data));
    assert.equal(chunks[1]?.buffer, data.buffer);
    assert.deepEqual([...chunksOf(new Uint8Array(2 * BLOB_CHUNK_BYTES))].map((c) => c.length), [BLOB_CHUNK_BYTES, BLOB_CHUNK_BYTES]);
    assert.deepEqual([...chunksOf(new Uint8Array(0))], []);
    assert.deepEqual([...chunksOf(new Uint8Array(5), 2)].map((c) => c.length), [2, 2, 1]);
  });
});

describe("client blobs", () => {
  test("uploadBlob streams 1 MiB chunks with the token and returns the BlobRef", async () => {
    const fake = new FakeServer();
    const client = new ComposerClient({ transport: fake, token: "tok" });
    const data = new TextEncoder().encode(JSON.stringify({ doc: "é".repeat(1_300_000) }));
    const ref = await client.uploadBlob(data);
    assert.deepEqual(ref, { sha256: sha(data), size: data.length, head: headOf(data) });
    assert.equal(typeof ref.size, "number");
    assert.ok(ref.head.startsWith('{"doc":"é'));
    const [upload] = fake.requests("UploadBlob");
    assert.deepEqual(upload.chunks, [BLOB_CHUNK_BYTES, BLOB_CHUNK_BYTES, data.length - 2 * BLOB_CHUNK_BYTES]);
    assert.deepEqual(Buffer.from(upload.data), Buffer.from(data));
    assert.equal(fake.headers("UploadBlob")[0]?.get("authorization"), "Bearer tok");
  });

  test("downloadBlob gathers the chunks, resumes a broken stream where it stopped, checks size and digest", async () => {
    const fake = new FakeServer();
    fake.downloadChunkBytes = 1000;
    const client = new ComposerClient({ transport: fake, token: "tok" });
    const data = new Uint8Array(4_500).map((_, i) => i % 256);
    fake.blobs.set(sha(data), data);
    assert.deepEqual(Buffer.from(await client.downloadBlob(sha(data))), Buffer.from(data));
    assert.equal(fake.headers("DownloadBlob")[0]?.get("authorization"), "Bearer tok");

    fake.breakDownloadAfterChunks = 2;
    assert.deepEqual(Buffer.from(await client.downloadBlob(sha(data))), Buffer.from(data));
    assert.deepEqual(fake.requests("DownloadBlob").slice(1).map((r) => Number(r.offset)), [0, 2000]);

    const missing = await client.downloadBlob("c".repeat(64)).catch((e: unknown) => e);
    assert.ok(isNotFound(missing), String(missing));
    // Bytes that are not what the digest names are refused.
    fake.blobs.set("d".repeat(64), data);
    const wrong = await client.downloadBlob("d".repeat(64)).catch((e: unknown) => e);
    assert.equal((wrong as { code?: string }).code, "DATA_LOSS", String(wrong));
    await assert.rejects(client.downloadBlob("not-a-digest"), TypeError);
  });

  test("resolvePayload replaces every reference at any depth, each blob downloaded once, blobs within blobs too", async () => {
    const fake = new FakeServer();
    const client = new ComposerClient({ transport: fake });
    const big = { doc: "x".repeat(5_000), n: 7 };
    const inner = stored(fake, { part: "inner" });
    const outer = stored(fake, { holds: inner, k: [1, 2] });
    const refBig = stored(fake, big);
    const value = { a: refBig, list: [refBig, { deeper: outer }], keep: { $blob: refBig, x: 1 } };
    const resolved = await client.resolvePayload(value);
    // `keep` is no reference (two keys), but its `$blob` key holds one.
    assert.deepEqual(resolved, { a: big, list: [big, { deeper: { holds: { part: "inner" }, k: [1, 2] } }], keep: { $blob: big, x: 1 } });
    assert.equal(fake.requests("DownloadBlob").length, 3, "three distinct blobs, one download each");
    assert.ok(isBlobReference(value.a), "the value given is unchanged");

    const plain = { a: [1, "b"], c: null };
    const copy = await client.resolvePayload(plain);
    assert.deepEqual(copy, plain);
    assert.notEqual(copy, plain);
    assert.equal(fake.requests("DownloadBlob").length, 3);
  });

  test("startRun and sendEvent upload a value whose compact JSON is over payloadOffloadBytes, asking the server once", async () => {
    const fake = fakeWith(100);
    fake.answers["StartRun"] = () => ({ run: { runId: "r-1", workflowName: "wf" }, created: true });
    fake.answers["SendEvent"] = () => ({ deliveredRunIds: ["r-1"] });
    const client = new ComposerClient({ transport: fake });

    await client.startRun("wf", ofLength(100));
    await client.startRun("wf", ofLength(101));
    await client.startRun("wf", { n: 1 });
    await client.sendEvent("go", ofLength(101), { runId: "r-1" });
    await client.sendEvent("go", ofLength(100), { runId: "r-1" });
    await client.startRun("wf", "é".repeat(60)); // 62 characters of JSON, 122 bytes

    const inputs = fake.requests("StartRun").map((r) => fromValue(r.input));
    assert.deepEqual(inputs[0], ofLength(100));
    assert.ok(isBlobReference(inputs[1]), JSON.stringify(inputs[1]));
    assert.deepEqual(inputs[2], { n: 1 });
    assert.ok(isBlobReference(inputs[3]));
    const payloads = fake.requests("SendEvent").map((r) => fromValue(r.payload));
    assert.ok(isBlobReference(payloads[0]));
    assert.deepEqual(payloads[1], ofLength(100));

    const uploads = fake.requests("UploadBlob").map((u) => Buffer.from(u.data).toString("utf8"));
    assert.deepEqual(uploads, [JSON.stringify(ofLength(101)), JSON.stringify(ofLength(101)), JSON.stringify("é".repeat(60))]);
    const ref = (inputs[1] as { $blob: { sha256: string; size: number; head: string } }).$blob;
    assert.deepEqual(ref, { sha256: sha(JSON.stringify(ofLength(101))), size: 101, head: JSON.stringify(ofLength(101)) });
    assert.equal(fake.requests("GetServerInfo").length, 1, "the threshold is asked once per client");
  });

  test("a threshold of 0 offloads nothing; a failed GetServerInfo is asked again", async () => {
    const fake = fakeWith(0);
    fake.answers["StartRun"] = () => ({ run: { runId: "r-1" }, created: true });
    const client = new ComposerClient({ transport: fake });
    await client.startRun("wf", ofLength(200_000));
    assert.equal(fake.requests("UploadBlob").length, 0);
    assert.deepEqual(fromValue(fake.requests("StartRun")[0].input), ofLength(200_000));

    let asks = 0;
    const flaky = fakeWith(10);
    flaky.answers["GetServerInfo"] = () => {
      asks += 1;
      if (asks === 1) throw unavailable();
      return { protocolVersion: "1.0", payloadOffloadBytes: 10n };
    };
    flaky.answers["StartRun"] = () => ({ run: { runId: "r-1" }, created: true });
    const other = new ComposerClient({ transport: flaky });
    await assert.rejects(other.startRun("wf", ofLength(50)), (e: { code?: string }) => e.code === "UNAVAILABLE");
    await other.startRun("wf", ofLength(50));
    await other.startRun("wf", ofLength(50));
    assert.equal(asks, 2);
    assert.equal(flaky.requests("UploadBlob").length, 2);
  });

  test("a client that cannot stream a request (the browser's) sends values inline and refuses uploadBlob", async () => {
    const fake = fakeWith(10);
    fake.answers["StartRun"] = () => ({ run: { runId: "r-1" }, created: true });
    const client = new ComposerClient({ transport: fake, clientStreaming: false });
    await client.startRun("wf", ofLength(500));
    assert.deepEqual(fromValue(fake.requests("StartRun")[0].input), ofLength(500));
    assert.equal(fake.requests("GetServerInfo").length, 0);
    const refused = await client.uploadBlob(new Uint8Array([123, 125])).catch((e: unknown) => e);
    assert.equal((refused as { code?: string }).code, "UNIMPLEMENTED", String(refused));
    assert.equal(fake.requests("UploadBlob").length, 0);
    // Downloads (a response stream) still work.
    const ref = stored(fake, { ok: true }) as unknown as { $blob: { sha256: string } };
    assert.deepEqual(await client.resolvePayload({ r: ref }), { r: { ok: true } });
  });

  test("waitForResult resolves the output; getRun shows references as stored", async () => {
    const fake = new FakeServer();
    const big = { doc: "y".repeat(3_000) };
    const ref = stored(fake, big);
    const wire = { runId: "r-1", workflowName: "wf", status: RunStatus.COMPLETED, output: toValue({ a: ref, n: 2 }) };
    fake.answers["GetRun"] = () => ({ run: wire });
    const watcher = createRouterTransport(({ service }) => {
      service(RunService, {
        async *watchRun() {
          yield { run: wire };
        },
      });
    });
    const transport: Transport = {
      unary: fake.unary.bind(fake),
      stream: ((method, signal, timeoutMs, header, input) =>
        method.parent.typeName === RunService.typeName
          ? watcher.stream(method, signal, timeoutMs, header, input)
          : fake.stream(method, signal, timeoutMs, header, input)) as Transport["stream"],
    };
    const client = new ComposerClient({ transport });
    assert.deepEqual(await client.waitForResult("r-1"), { a: big, n: 2 });
    assert.deepEqual((await client.getRun("r-1")).output, { a: ref, n: 2 });
    assert.deepEqual((await client.waitForRun("r-1")).output, { a: ref, n: 2 });
  });
});

/** Serves the fake's tasks with `handler` until `done()` holds, then stops the worker. */
async function serveOn(fake: FakeServer, handler: Handler, done: () => boolean, options: Record<string, unknown> = {}): Promise<Worker> {
  const worker = new Worker({ transport: fake, slots: 2, backoff: FAST, logger: QUIET, pollWaitMs: 100, ...options });
  worker.task("q", "t", handler);
  const served = worker.serve();
  const deadline = Date.now() + 10_000;
  while (!done() && Date.now() < deadline) await sleep(10);
  worker.stop();
  await served;
  assert.ok(done(), "the scenario did not finish within 10 s");
  return worker;
}

/** A logger that keeps every line it is given. */
function recording(lines: string[]): Logger {
  const keep = (message: string): void => void lines.push(message);
  return { debug: keep, info: keep, warn: keep, error: keep };
}

const reported = (fake: FakeServer) => (): boolean => fake.requests("CompleteTask").length + fake.requests("FailTask").length >= 1;

describe("worker blobs", () => {
  test("the handler sees the input's references replaced by their values, each blob downloaded once", async () => {
    const fake = fakeWith(1_000_000);
    const doc = { doc: "z".repeat(10_000), n: 7 };
    const ref = stored(fake, doc);
    fake.tasks.push(task({ input: toValue({ whole: ref, list: [1, { again: ref }] }) }));
    let seen: unknown;
    await serveOn(fake, (ctx) => {
      seen = ctx.input;
      return { n: ctx.input.whole.n };
    }, reported(fake));
    assert.deepEqual(seen, { whole: doc, list: [1, { again: doc }] });
    assert.equal(fake.requests("DownloadBlob").length, 1);
    assert.deepEqual(fromValue(fake.requests("CompleteTask")[0].output), { n: 7 });
    assert.equal(fake.requests("UploadBlob").length, 0);
  });

  test("an output over payloadOffloadBytes is uploaded and reported as its reference; one at the limit goes inline", async () => {
    const fake = fakeWith(100);
    fake.tasks.push(task({ taskId: "big" }), task({ taskId: "small" }));
    await serveOn(fake, (ctx) => (ctx.taskId === "big" ? ofLength(101) : ofLength(100)), () => fake.requests("CompleteTask").length >= 2);
    const outputs = new Map(fake.requests("CompleteTask").map((r) => [r.taskId as string, fromValue(r.output)]));
    const big = outputs.get("big") as { $blob: { sha256: string; size: number; head: string } };
    assert.ok(isBlobReference(big), JSON.stringify(big));
    const text = JSON.stringify(ofLength(101));
    assert.deepEqual(big.$blob, { sha256: sha(text), size: 101, head: text });
    assert.deepEqual(outputs.get("small"), ofLength(100));
    assert.deepEqual(fake.requests("UploadBlob").map((u) => Buffer.from(u.data).toString("utf8")), [text]);
    assert.equal(fake.requests("GetServerInfo").length, 1, "the threshold comes from the protocol check");
  });

  test("with payloadOffloadBytes 0 nothing is uploaded; without the protocol check the threshold is asked once", async () => {
    const never = fakeWith(0);
    never.tasks.push(task());
    await serveOn(never, () => ofLength(300_000), reported(never));
    assert.equal(never.requests("UploadBlob").length, 0);
    assert.deepEqual(fromValue(never.requests("CompleteTask")[0].output), ofLength(300_000));

    const unchecked = fakeWith(50);
    unchecked.tasks.push(task({ taskId: "t-1" }), task({ taskId: "t-2" }));
    await serveOn(unchecked, () => ofLength(60), () => unchecked.requests("CompleteTask").length >= 2, { checkServer: false });
    assert.equal(unchecked.requests("GetServerInfo").length, 1);
    assert.equal(unchecked.requests("UploadBlob").length, 2);
    assert.ok(unchecked.requests("CompleteTask").every((r) => isBlobReference(fromValue(r.output))));
  });

  test("an upload that meets UNAVAILABLE is made again; one over the payload limit fails OUTPUT_TOO_LARGE", async () => {
    const fake = fakeWith(10);
    let uploads = 0;
    fake.answers["UploadBlob"] = () => {
      uploads += 1;
      if (uploads === 1) throw unavailable();
    };
    fake.tasks.push(task());
    await serveOn(fake, () => ofLength(20), reported(fake));
    assert.equal(uploads, 2);
    assert.ok(isBlobReference(fromValue(fake.requests("CompleteTask")[0].output)));

    const tooBig = fakeWith(10);
    tooBig.answers["UploadBlob"] = () => {
      throw wireError(Code.ResourceExhausted, "the payload is over --max-payload-bytes");
    };
    tooBig.tasks.push(task());
    await serveOn(tooBig, () => ofLength(20), reported(tooBig));
    const [failed] = tooBig.requests("FailTask");
    assert.equal(failed.errorCode, "OUTPUT_TOO_LARGE");
    assert.equal(failed.retryable, false);
    assert.equal(tooBig.requests("CompleteTask").length, 0);
  });

  test("l06 an upload refused by a busy server (QUOTA_EXCEEDED) is made again after its RetryInfo delay", async () => {
    const fake = fakeWith(10);
    let uploads = 0;
    fake.answers["UploadBlob"] = () => {
      uploads += 1;
      if (uploads <= 2) throw quotaExceeded(30);
    };
    fake.tasks.push(task());
    const lines: string[] = [];
    await serveOn(fake, () => ofLength(20), reported(fake), { logger: recording(lines) });
    assert.equal(uploads, 3);
    const [completed] = fake.requests("CompleteTask");
    assert.deepEqual(fromValue(completed.output), blobReference({ sha256: sha(JSON.stringify(ofLength(20))), size: 20, head: JSON.stringify(ofLength(20)) }));
    assert.equal(fake.requests("FailTask").length, 0);
    // The waits are the server's 30 ms, not the back-off's (at most 50 ms, jittered).
    assert.deepEqual(lines.flatMap((l) => /output upload failed \(RESOURCE_EXHAUSTED\); again in (\d+) ms/.exec(l)?.[1] ?? []), ["30", "30"]);
  });

  test("l06 an upload refused by a busy server until the report deadline fails OUTPUT_UPLOAD_FAILED, retryable", async () => {
    const fake = fakeWith(10);
    fake.answers["UploadBlob"] = () => {
      throw quotaExceeded(20);
    };
    fake.tasks.push(task());
    await serveOn(fake, () => ofLength(20), reported(fake), { reportTimeoutMs: 150 });
    const [failed] = fake.requests("FailTask");
    assert.equal(failed.errorCode, "OUTPUT_UPLOAD_FAILED");
    assert.equal(failed.retryable, true);
    assert.match(failed.message, /QUOTA_EXCEEDED/);
    assert.ok(fake.requests("UploadBlob").length > 1, "the upload was made again before the deadline");
    assert.equal(fake.requests("CompleteTask").length, 0);
  });

  test("l06 a RESOURCE_EXHAUSTED naming a field in BadRequest (the payload limit) stays OUTPUT_TOO_LARGE, not retried", async () => {
    const fake = fakeWith(10);
    fake.answers["UploadBlob"] = () => {
      throw payloadTooLarge("data");
    };
    fake.tasks.push(task());
    await serveOn(fake, () => ofLength(20), reported(fake));
    const [failed] = fake.requests("FailTask");
    assert.equal(failed.errorCode, "OUTPUT_TOO_LARGE");
    assert.equal(failed.retryable, false);
    assert.equal(fake.requests("UploadBlob").length, 1);
    assert.equal(fake.requests("CompleteTask").length, 0);
  });

  test("an input whose blob is missing fails INPUT_UNAVAILABLE without running the handler; one a busy server refuses, retryable", async () => {
    const fake = fakeWith(100);
    fake.tasks.push(task({ input: toValue({ $blob: { sha256: "e".repeat(64), size: 5, head: "" } }) }));
    let ran = false;
    await serveOn(fake, () => {
      ran = true;
      return 1;
    }, reported(fake));
    assert.equal(ran, false);
    const [failed] = fake.requests("FailTask");
    assert.equal(failed.errorCode, "INPUT_UNAVAILABLE");
    assert.equal(failed.retryable, false);
    assert.match(failed.message, /NOT_FOUND/);

    // A busy server may serve the next attempt.
    const busy = fakeWith(100);
    busy.answers["DownloadBlob"] = () => {
      throw quotaExceeded(20);
    };
    busy.tasks.push(task({ input: toValue(stored(busy, { doc: "z" })) }));
    await serveOn(busy, () => 1, reported(busy));
    const [refused] = busy.requests("FailTask");
    assert.equal(refused.errorCode, "INPUT_UNAVAILABLE");
    assert.equal(refused.retryable, true);
  });
});

/** A fake whose GetServerInfo gives `offload` and `blobUrls`, its blob store serving URLs on 127.0.0.1. */
async function urlFake(offload: number): Promise<FakeServer> {
  const fake = new FakeServer({
    GetServerInfo: () => ({ serverVersion: "fake", protocolVersion: "1.0", payloadOffloadBytes: BigInt(offload), blobUrls: true }),
  });
  await fake.serveUrls();
  return fake;
}

/** The calls of the fake's BlobService, by name, in order. */
function blobCalls(fake: FakeServer): string[] {
  const names = ["UploadBlob", "DownloadBlob", "GetBlobUrl", "StartBlobUpload", "FinishBlobUpload"];
  return fake.calls.map((c) => c.method).filter((m) => names.includes(m));
}

const failedPrecondition = (): Error => wireError(Code.FailedPrecondition, "the blob store does not presign URLs (a local folder): use UploadBlob and DownloadBlob");

describe("presigned URLs (C24)", () => {
  test("c24 with blobUrls, uploads are StartBlobUpload + PUT + FinishBlobUpload and downloads GetBlobUrl + GET; no stream, no token sent to the store", async () => {
    const fake = await urlFake(100);
    fake.answers["StartRun"] = () => ({ run: { runId: "r-1", workflowName: "wf" }, created: true });
    const client = new ComposerClient({ transport: fake, token: "tok" });
    try {
      // startRun's large input goes up through a URL.
      await client.startRun("wf", ofLength(5_000));
      const input = fromValue(fake.requests("StartRun")[0].input) as { $blob: { sha256: string; size: number; head: string } };
      const text = JSON.stringify(ofLength(5_000));
      assert.deepEqual(input, blobReference({ sha256: sha(text), size: 5_000, head: headOf(new TextEncoder().encode(text)) }));
      assert.deepEqual(blobCalls(fake), ["StartBlobUpload", "FinishBlobUpload"]);
      assert.deepEqual(fake.httpRequests.map((r) => [r.method, r.path.split("/")[1], r.bytes]), [["PUT", "upload", 5_000]]);
      assert.equal(fake.requests("FinishBlobUpload")[0].uploadId, fake.httpRequests[0]?.path.split("/")[2], "Finish names the upload PUT to");
      assert.equal(fake.headers("StartBlobUpload")[0]?.get("authorization"), "Bearer tok");
      assert.equal(fake.headers("FinishBlobUpload")[0]?.get("authorization"), "Bearer tok");

      // uploadBlob and downloadBlob, and resolvePayload over them.
      const data = new TextEncoder().encode(JSON.stringify({ doc: "é".repeat(3_000) }));
      const ref = await client.uploadBlob(data);
      assert.deepEqual(ref, { sha256: sha(data), size: data.length, head: headOf(data) });
      assert.deepEqual(Buffer.from(await client.downloadBlob(ref.sha256)), Buffer.from(data));
      assert.deepEqual(await client.resolvePayload({ a: input }), { a: ofLength(5_000) });
      assert.deepEqual(blobCalls(fake), ["StartBlobUpload", "FinishBlobUpload", "StartBlobUpload", "FinishBlobUpload", "GetBlobUrl", "GetBlobUrl"]);
      assert.deepEqual(fake.httpRequests.map((r) => r.method), ["PUT", "PUT", "GET", "GET"]);
      // The store gets the signed URL, never the server's token.
      assert.ok(fake.httpRequests.every((r) => r.headers.authorization === undefined), JSON.stringify(fake.httpRequests.map((r) => r.headers)));

      // NOT_FOUND stays NOT_FOUND, from GetBlobUrl, with no stream tried.
      const missing = await client.downloadBlob("c".repeat(64)).catch((e: unknown) => e);
      assert.ok(isNotFound(missing), String(missing));
      assert.equal(fake.requests("DownloadBlob").length + fake.requests("UploadBlob").length, 0, "no stream was used");
      assert.equal(fake.requests("GetServerInfo").length, 1);
    } finally {
      await fake.closeUrls();
    }
  });

  test("c24 a worker downloads its input's blobs and uploads its output through URLs, and logs no URL", async () => {
    const fake = await urlFake(100);
    try {
      const doc = { doc: "z".repeat(10_000), n: 7 };
      fake.tasks.push(task({ input: toValue({ whole: stored(fake, doc) }) }));
      let seen: unknown;
      const lines: string[] = [];
      await serveOn(fake, (ctx) => {
        seen = ctx.input;
        return { doc: ctx.input.whole.doc, n: 8 };
      }, reported(fake), { logger: recording(lines) });
      assert.deepEqual(seen, { whole: doc });
      const output = fromValue(fake.requests("CompleteTask")[0].output);
      const text = JSON.stringify({ doc: doc.doc, n: 8 });
      assert.deepEqual(output, blobReference({ sha256: sha(text), size: text.length, head: headOf(new TextEncoder().encode(text)) }));
      assert.deepEqual(blobCalls(fake), ["GetBlobUrl", "StartBlobUpload", "FinishBlobUpload"]);
      assert.deepEqual(fake.httpRequests.map((r) => r.method), ["GET", "PUT"]);
      assert.ok(lines.length > 0);
      assert.ok(!lines.some((l) => l.includes("127.0.0.1:" + new URL(fake.urlBase as string).port) || l.includes("Signature")), lines.join("\n"));
    } finally {
      await fake.closeUrls();
    }
  });

  test("c24 a URL call answered FAILED_PRECONDITION sends that call and every later one through the streams", async () => {
    // StartBlobUpload refused: the upload streams, and so does every later download.
    const fake = await urlFake(100);
    try {
      fake.answers["StartBlobUpload"] = () => {
        throw failedPrecondition();
      };
      const client = new ComposerClient({ transport: fake });
      const data = new TextEncoder().encode(JSON.stringify(ofLength(500)));
      const ref = await client.uploadBlob(data);
      assert.deepEqual(ref, { sha256: sha(data), size: 500, head: headOf(data) });
      assert.deepEqual(Buffer.from(await client.downloadBlob(ref.sha256)), Buffer.from(data));
      await client.uploadBlob(data);
      assert.deepEqual(blobCalls(fake), ["StartBlobUpload", "UploadBlob", "DownloadBlob", "UploadBlob"]);
      assert.equal(fake.httpRequests.length, 0);
    } finally {
      await fake.closeUrls();
    }

    // GetBlobUrl refused: the download streams, and so does every later upload.
    const other = await urlFake(100);
    try {
      other.answers["GetBlobUrl"] = () => {
        throw failedPrecondition();
      };
      const client = new ComposerClient({ transport: other });
      const ref = stored(other, { k: "v" }) as unknown as { $blob: { sha256: string } };
      assert.deepEqual(await client.resolvePayload([ref]), [{ k: "v" }]);
      await client.uploadBlob(new TextEncoder().encode('{"x":1}'));
      await client.downloadBlob(ref.$blob.sha256);
      assert.deepEqual(blobCalls(other), ["GetBlobUrl", "DownloadBlob", "UploadBlob", "DownloadBlob"]);
      assert.equal(other.httpRequests.length, 0);
    } finally {
      await other.closeUrls();
    }

    // FinishBlobUpload refused after the PUT: the same bytes stream up, and URLs are done with.
    const third = await urlFake(100);
    try {
      third.answers["FinishBlobUpload"] = () => {
        throw failedPrecondition();
      };
      const client = new ComposerClient({ transport: third });
      const data = new TextEncoder().encode('{"y":2}');
      assert.equal((await client.uploadBlob(data)).sha256, sha(data));
      await client.uploadBlob(data);
      assert.deepEqual(blobCalls(third), ["StartBlobUpload", "FinishBlobUpload", "UploadBlob", "UploadBlob"]);
      assert.deepEqual(third.httpRequests.map((r) => r.method), ["PUT"]);
    } finally {
      await third.closeUrls();
    }

    // A server without the URL calls (UNIMPLEMENTED) is refused the same way.
    const older = await urlFake(100);
    try {
      older.answers["GetBlobUrl"] = () => {
        throw wireError(Code.Unimplemented, "unknown method GetBlobUrl");
      };
      const client = new ComposerClient({ transport: older });
      const ref = stored(older, { k: 1 }) as unknown as { $blob: { sha256: string } };
      await client.downloadBlob(ref.$blob.sha256);
      await client.uploadBlob(new TextEncoder().encode('{"k":1}'));
      assert.deepEqual(blobCalls(older), ["GetBlobUrl", "DownloadBlob", "UploadBlob"]);
    } finally {
      await older.closeUrls();
    }

    // A worker: its first output's upload refused, its next task's input streams down and its
    // output streams up.
    const served = await urlFake(10);
    try {
      served.answers["StartBlobUpload"] = () => {
        throw failedPrecondition();
      };
      served.tasks.push(task({ taskId: "first" }));
      const worker = new Worker({ transport: served, slots: 1, backoff: FAST, logger: QUIET, pollWaitMs: 100 });
      worker.task("q", "t", (ctx) => (ctx.taskId === "first" ? ofLength(50) : ctx.input));
      const serving = worker.serve();
      const completed = async (n: number): Promise<void> => {
        const deadline = Date.now() + 10_000;
        while (served.requests("CompleteTask").length < n && Date.now() < deadline) await sleep(10);
        assert.equal(served.requests("CompleteTask").length, n);
      };
      try {
        await completed(1);
        served.tasks.push(task({ taskId: "second", input: toValue(stored(served, ofLength(60))) }));
        await completed(2);
      } finally {
        worker.stop();
        await serving;
      }
      assert.deepEqual(blobCalls(served), ["StartBlobUpload", "UploadBlob", "DownloadBlob", "UploadBlob"]);
      const outputs = served.requests("CompleteTask").map((r) => fromValue(r.output));
      assert.ok(outputs.every(isBlobReference), JSON.stringify(outputs));
      assert.equal(served.httpRequests.length, 0);
    } finally {
      await served.closeUrls();
    }
  });

  test("c24 a URL whose request fails (a closed port, a status other than 2xx) falls back to the stream for that call only", async () => {
    const fake = await urlFake(100);
    try {
      const client = new ComposerClient({ transport: fake });
      const data = new TextEncoder().encode(JSON.stringify(ofLength(700)));
      const closed = await closedPortUrl();

      // An upload URL on a closed port: this upload streams; the next goes through its URL.
      fake.answers["StartBlobUpload"] = () => ({ uploadId: "u-closed", url: closed });
      const ref = await client.uploadBlob(data);
      assert.deepEqual(ref, { sha256: sha(data), size: 700, head: headOf(data) });
      delete fake.answers["StartBlobUpload"];
      assert.deepEqual(await client.uploadBlob(data), ref);
      assert.deepEqual(blobCalls(fake), ["StartBlobUpload", "UploadBlob", "StartBlobUpload", "FinishBlobUpload"]);

      // A download URL on a closed port: this download streams; the next goes through its URL.
      fake.answers["GetBlobUrl"] = () => ({ url: closed, size: 700n });
      assert.deepEqual(Buffer.from(await client.downloadBlob(ref.sha256)), Buffer.from(data));
      delete fake.answers["GetBlobUrl"];
      assert.deepEqual(Buffer.from(await client.downloadBlob(ref.sha256)), Buffer.from(data));
      assert.deepEqual(blobCalls(fake).slice(4), ["GetBlobUrl", "DownloadBlob", "GetBlobUrl"]);

      // The store answering 403 (an expired signature): the same.
      fake.httpStatus = 403;
      assert.deepEqual(await client.uploadBlob(data), ref);
      assert.deepEqual(Buffer.from(await client.downloadBlob(ref.sha256)), Buffer.from(data));
      fake.httpStatus = undefined;
      assert.deepEqual(Buffer.from(await client.downloadBlob(ref.sha256)), Buffer.from(data));
      assert.deepEqual(blobCalls(fake).slice(7), ["StartBlobUpload", "UploadBlob", "GetBlobUrl", "DownloadBlob", "GetBlobUrl"]);
      assert.deepEqual(fake.httpRequests.map((r) => r.method), ["PUT", "GET", "PUT", "GET", "GET"]);
      assert.equal(fake.requests("FinishBlobUpload").length, 1, "nothing PUT is never finished");

      // Bytes that are not the blob count as a failed request: a GET that gives another blob of the
      // same size, a FinishBlobUpload whose reference names other bytes.
      const other = new TextEncoder().encode(JSON.stringify({ d: "y".repeat(700 - '{"d":""}'.length) }));
      fake.blobs.set(sha(other), other);
      fake.answers["GetBlobUrl"] = () => ({ url: `${fake.urlBase}/blob/${sha(other)}?X-Amz-Signature=x`, size: 700n });
      assert.deepEqual(Buffer.from(await client.downloadBlob(ref.sha256)), Buffer.from(data));
      delete fake.answers["GetBlobUrl"];
      fake.answers["FinishBlobUpload"] = () => ({ blob: { sha256: sha(other), size: 700n, head: "" } });
      assert.deepEqual(await client.uploadBlob(data), ref);
      delete fake.answers["FinishBlobUpload"];
      assert.deepEqual(await client.uploadBlob(data), ref);
      assert.deepEqual(blobCalls(fake).slice(12), ["GetBlobUrl", "DownloadBlob", "StartBlobUpload", "FinishBlobUpload", "UploadBlob", "StartBlobUpload", "FinishBlobUpload"]);
      // Azure's Put Blob needs x-ms-blob-type; every PUT sends it.
      const puts = fake.httpRequests.filter((r) => r.method === "PUT");
      assert.ok(puts.length > 0 && puts.every((r) => r.headers["x-ms-blob-type"] === "BlockBlob"));
    } finally {
      await fake.closeUrls();
    }
  });

  test("c24 a client told not to use URLs (the browser's) never asks for one", async () => {
    const fake = await urlFake(10);
    try {
      const client = new ComposerClient({ transport: fake, blobUrls: false });
      const ref = await client.uploadBlob(new TextEncoder().encode('{"z":3}'));
      await client.downloadBlob(ref.sha256);
      assert.deepEqual(blobCalls(fake), ["UploadBlob", "DownloadBlob"]);
      assert.equal(fake.httpRequests.length, 0);
    } finally {
      await fake.closeUrls();
    }
  });
});
