// The Node transport's own unary path (src/grpc-unary-node.ts) against a real HTTP/2 server on
// loopback: what goes out (path, headers, envelope, deadline) and how every kind of answer comes
// back (a message, a status in the trailers or alone in the headers, a reset, a timeout, an abort).
import assert from "node:assert/strict";
import { once } from "node:events";
import { createServer, type Http2Server, type ServerHttp2Stream, type IncomingHttpHeaders } from "node:http2";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

import { HeartbeatRequestSchema, HeartbeatResponseSchema, WorkerService } from "../../src/gen/composer/v1/worker_service_pb.js";
import { createNodeTransport } from "../../src/transport-node.js";

type Answer = (stream: ServerHttp2Stream, headers: IncomingHttpHeaders, body: Buffer) => void;

let server: Http2Server;
let address = "";
const answers = new Map<string, Answer>();
const seen: { headers: IncomingHttpHeaders; body: Buffer }[] = [];

before(async () => {
  server = createServer();
  // the resets and cancels the tests make end streams and sessions with an error: expected here
  server.on("session", (session) => session.on("error", () => {}));
  server.on("stream", (stream, headers) => {
    stream.on("error", () => {});
    const chunks: Buffer[] = [];
    stream.on("data", (chunk: Buffer) => chunks.push(chunk));
    stream.on("end", () => {
      const body = Buffer.concat(chunks);
      seen.push({ headers, body });
      const request = fromBinary(HeartbeatRequestSchema, body.subarray(5));
      (answers.get(request.taskId) ?? ok)(stream, headers, body);
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(() => server.close());

function envelope(bytes: Uint8Array): Buffer {
  const out = Buffer.alloc(5 + bytes.length);
  out.writeUInt32BE(bytes.length, 1);
  out.set(bytes, 5);
  return out;
}

const ok: Answer = (stream) => {
  stream.respond({ ":status": 200, "content-type": "application/grpc+proto", "x-answer": "yes" }, { waitForTrailers: true });
  stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
  stream.end(envelope(toBinary(HeartbeatResponseSchema, create(HeartbeatResponseSchema, { cancelRequested: true }))));
};

type CallOptions = { timeoutMs?: number; signal?: AbortSignal; headers?: Record<string, string>; connect?: boolean };

/** A Heartbeat on the lean path, or (`connect`) on connect's transport: an interceptor sends it there. */
async function heartbeat(taskId: string, options: CallOptions = {}) {
  const { transport, close } = createNodeTransport(address, options.connect ? { interceptors: [(next) => next] } : {});
  try {
    return await transport.unary(WorkerService.method.heartbeat, options.signal, options.timeoutMs, options.headers, { taskId, attempt: 2, leaseToken: "tok" });
  } finally {
    close();
  }
}

/** The code the lean path fails `taskId` with, checked to be connect's transport's code. */
async function failingCode(taskId: string, options: CallOptions = {}): Promise<Code> {
  const lean = await failure(heartbeat(taskId, options));
  const connect = await failure(heartbeat(taskId, { ...options, connect: true }));
  assert.equal(Code[lean.code], Code[connect.code], `${taskId}: ${lean.message} / ${connect.message}`);
  return lean.code;
}

async function failure(call: Promise<unknown>): Promise<ConnectError> {
  try {
    await call;
  } catch (error) {
    assert.ok(error instanceof ConnectError, String(error));
    return error;
  }
  assert.fail("the call succeeded");
}

test("a unary call sends one envelope with its headers and deadline, and reads the answer", async () => {
  const response = await heartbeat("ok", { timeoutMs: 5_000, headers: { Authorization: "Bearer t" } });
  assert.equal(response.message.cancelRequested, true);
  assert.equal(response.header.get("x-answer"), "yes");
  assert.equal(response.trailer.get("grpc-status"), "0");
  const { headers, body } = seen.at(-1) as (typeof seen)[number];
  assert.equal(headers[":path"], "/composer.v1.WorkerService/Heartbeat");
  assert.equal(headers["content-type"], "application/grpc+proto");
  assert.equal(headers["authorization"], "Bearer t");
  assert.equal(headers["grpc-timeout"], "5000m");
  assert.equal(body[0], 0, "not compressed");
  assert.equal(body.readUInt32BE(1), body.length - 5);
  assert.equal(fromBinary(HeartbeatRequestSchema, body.subarray(5)).attempt, 2);
});

test("a status in the trailers is the call's error, with its message and metadata", async () => {
  answers.set("lost", (stream) => {
    stream.respond({ ":status": 200, "content-type": "application/grpc+proto", "x-from": "header" }, { waitForTrailers: true });
    stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": String(Code.FailedPrecondition), "grpc-message": "lease%20lost" }));
    stream.end();
  });
  assert.equal(await failingCode("lost"), Code.FailedPrecondition);
  const error = await failure(heartbeat("lost"));
  assert.equal(error.rawMessage, "lease lost");
  assert.equal(error.metadata.get("x-from"), "header");
});

test("a status alone in the headers (trailers-only) is the call's error", async () => {
  answers.set("only", (stream) => {
    stream.respond({ ":status": 200, "content-type": "application/grpc+proto", "grpc-status": String(Code.NotFound), "grpc-message": "no task" }, { endStream: true });
  });
  assert.equal(await failingCode("only"), Code.NotFound);
  const error = await failure(heartbeat("only"));
  assert.equal(error.rawMessage, "no task");
});

test("an HTTP error, a compressed answer and a missing message are errors, not answers", async () => {
  answers.set("http", (stream) => stream.respond({ ":status": 503 }, { endStream: true }));
  assert.equal(await failingCode("http"), Code.Unavailable);
  answers.set("gzip", (stream) => {
    stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
    stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
    const compressed = envelope(new Uint8Array([1, 2, 3]));
    compressed[0] = 1;
    stream.end(compressed);
  });
  assert.equal(await failingCode("gzip"), Code.Internal);
  answers.set("empty", (stream) => {
    stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
    stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
    stream.end();
  });
  assert.equal(await failingCode("empty"), Code.Unimplemented);
});

test("a reset stream, a deadline and an abort each end the call as on connect's transport", async () => {
  answers.set("reset", (stream) => stream.close(0x7));
  await failingCode("reset");
  answers.set("slow", () => {
    // never answers
  });
  assert.equal(await failingCode("slow", { timeoutMs: 50 }), Code.DeadlineExceeded);
  const controller = new AbortController();
  const call = heartbeat("slow", { signal: controller.signal });
  setTimeout(() => controller.abort(), 50);
  assert.equal((await failure(call)).code, Code.Canceled);
});
