// Back-off arithmetic, JSON conversion, error decoding and the protocol check: no server.
import assert from "node:assert/strict";
import { test } from "node:test";

import { fromJson, toBinary, toJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";

import {
  Backoff,
  ComposerError,
  NotJsonError,
  RunFailedError,
  checkProtocolVersion,
  fromValue,
  isFailedPrecondition,
  isInvalidArgument,
  isLeaseLost,
  isNotFound,
  isResourceExhausted,
  isServerBusy,
  isUnauthenticated,
  toComposerError,
  toJsonValue,
  toValue,
  type Run,
} from "../../src/index.js";
import { badRequest, cpuPoolBusy, errorInfo, payloadTooLarge, quotaExceeded, retryInfo, wireError } from "./fake.js";

test("backoff grows exponentially to its maximum, with jitter in [cap*(1-jitter), cap]", () => {
  const b = new Backoff({ initialMs: 100, multiplier: 2, maximumMs: 1_000, jitter: 0.5 });
  assert.deepEqual([1, 2, 3, 4, 5, 6, 1000].map((n) => b.cap(n)), [100, 200, 400, 800, 1000, 1000, 1000]);
  assert.equal(b.delay(3, () => 0), 400);
  assert.equal(b.delay(3, () => 0.999999), 400 * (1 - 0.5 * 0.999999));
  for (let i = 0; i < 100; i++) {
    const d = b.delay(2);
    assert.ok(d > 100 && d <= 200);
  }
  assert.throws(() => new Backoff({ initialMs: 0 }), RangeError);
  assert.throws(() => new Backoff({ jitter: 2 }), RangeError);
  assert.throws(() => b.cap(0), RangeError);
});

test("JSON conversion is strict", () => {
  const value = { a: 1, b: [true, null, "x"], c: { d: 2.5 }, skipped: undefined, when: new Date(0) };
  assert.deepEqual(toJsonValue(value), { a: 1, b: [true, null, "x"], c: { d: 2.5 }, when: "1970-01-01T00:00:00.000Z" });
  assert.deepEqual(fromValue(toValue(value)), toJsonValue(value));
  assert.equal(fromValue(toValue(undefined)), null);
  assert.equal(fromValue(undefined), null);
  for (const bad of [NaN, Infinity, 1n, () => 1, Symbol("s"), new Map(), [new Set()]]) {
    assert.throws(() => toJsonValue(bad), NotJsonError, String(bad as unknown));
  }
  const cycle: Record<string, unknown> = {};
  cycle["self"] = cycle;
  assert.throws(() => toJsonValue(cycle), /cycle/);
  const shared = { x: 1 };
  assert.deepEqual(toJsonValue([shared, shared]), [{ x: 1 }, { x: 1 }], "a shared object is not a cycle");
});

test("JSON conversion gives the library's Value and JSON, byte for byte, at any depth", () => {
  let deep: unknown = "leaf";
  for (let i = 0; i < 80; i++) deep = i % 2 ? [deep] : { [`k${i}`]: deep };
  const cases: unknown[] = [
    0, -1.5, 1e300, "", "ünï\u0000code", true, false, [], {}, [null, [null]],
    { __proto__key: 1, nested: { list: [1, "two", { three: 3 }] } },
    JSON.parse('{"__proto__": {"x": 1}, "constructor": 2}'),
    deep,
  ];
  for (const value of cases) {
    const json = toJsonValue(value);
    const ours = toValue(value);
    const library = fromJson(ValueSchema, json);
    assert.deepEqual(toBinary(ValueSchema, ours), toBinary(ValueSchema, library), JSON.stringify(json));
    assert.deepEqual(fromValue(library), toJson(ValueSchema, library));
    assert.deepEqual(fromValue(ours), json);
  }
  assert.ok(Object.hasOwn(fromValue(toValue(cases[11])) as object, "__proto__"), "__proto__ stays an own key");
});

test("a ConnectError becomes a ComposerError with its field violations and ErrorInfo", () => {
  const error = toComposerError(
    wireError(Code.InvalidArgument, "invalid workflow definition", [
      { type: "google.rpc.BadRequest", value: badRequest([["nodes[0].retry.max_attempts", "must be at least 1"], ["edges[0].to", "unknown node 'nowhere'"]]) },
    ]),
  );
  assert.ok(error instanceof ComposerError);
  assert.ok(isInvalidArgument(error));
  assert.equal(error.code, "INVALID_ARGUMENT");
  assert.equal(error.rawMessage, "invalid workflow definition");
  assert.deepEqual(
    error.fieldViolations.map((v) => [v.field, v.description]),
    [
      ["nodes[0].retry.max_attempts", "must be at least 1"],
      ["edges[0].to", "unknown node 'nowhere'"],
    ],
  );
  assert.equal(
    error.message,
    "INVALID_ARGUMENT: invalid workflow definition\n  - nodes[0].retry.max_attempts: must be at least 1\n  - edges[0].to: unknown node 'nowhere'",
  );
  const lost = toComposerError(
    wireError(Code.FailedPrecondition, "stale lease", [{ type: "google.rpc.ErrorInfo", value: errorInfo("LEASE_LOST", "composer.dev", { task_id: "t" }) }]),
  );
  assert.ok(isLeaseLost(lost) && isFailedPrecondition(lost));
  assert.equal(lost.reason, "LEASE_LOST");
  assert.deepEqual(lost.metadata, { task_id: "t" });
  assert.equal(lost.message, "FAILED_PRECONDITION: stale lease [LEASE_LOST]");
  assert.ok(!isLeaseLost(toComposerError(new ConnectError("ended", Code.FailedPrecondition))));
  assert.ok(isNotFound(toComposerError(new ConnectError("no run", Code.NotFound))));
  assert.ok(isUnauthenticated(toComposerError(new ConnectError("no token", Code.Unauthenticated))));
  assert.ok(toComposerError(new ConnectError("x", Code.Unavailable)).retryable);
  assert.ok(toComposerError(new ConnectError("x", Code.DeadlineExceeded)).retryable);
  assert.ok(!toComposerError(new ConnectError("x", Code.Internal)).retryable);
  // a stream a stopping server refused was not processed: as gRPC maps it, UNAVAILABLE
  const refused = Object.assign(new Error("Stream closed with error code NGHTTP2_REFUSED_STREAM"), { code: "ERR_HTTP2_STREAM_ERROR" });
  const wrapped = new ConnectError("Stream closed with error code NGHTTP2_REFUSED_STREAM", Code.Internal, undefined, undefined, refused);
  assert.equal(toComposerError(wrapped).code, "UNAVAILABLE");
  assert.ok(toComposerError(wrapped).retryable);
  assert.equal(toComposerError(new Error("boom")).code, "UNKNOWN");
  const garbage = toComposerError(wireError(Code.InvalidArgument, "x", [{ type: "google.rpc.BadRequest", value: new Uint8Array([0xff, 0xff]) }]));
  assert.deepEqual(garbage.fieldViolations, []);
});

test("a busy server's RESOURCE_EXHAUSTED carries its reason and RetryInfo's delay; the payload limit's is not busy", () => {
  const quota = toComposerError(quotaExceeded(1_500));
  assert.ok(isServerBusy(quota));
  assert.equal(quota.reason, "QUOTA_EXCEEDED");
  assert.equal(quota.domain, "composer.dev");
  assert.equal(quota.retryAfterMs, 1_500);
  assert.ok(!quota.retryable, "retryable stays UNAVAILABLE and DEADLINE_EXCEEDED");
  const cpu = toComposerError(cpuPoolBusy(250));
  assert.ok(isServerBusy(cpu));
  assert.equal(cpu.retryAfterMs, 250);
  assert.equal(toComposerError(cpuPoolBusy()).retryAfterMs, undefined);
  const tooLarge = toComposerError(payloadTooLarge("output"));
  assert.ok(isResourceExhausted(tooLarge));
  assert.equal(isServerBusy(tooLarge), false);
  assert.equal(tooLarge.fieldViolations[0]?.field, "output");
  assert.equal(tooLarge.retryAfterMs, undefined);
  // The same reason under another code is no busy server.
  const other = toComposerError(wireError(Code.Unavailable, "x", [{ type: "google.rpc.ErrorInfo", value: errorInfo("QUOTA_EXCEEDED") }]));
  assert.equal(isServerBusy(other), false);
  // A RetryInfo with no delay gives none; one that does not decode is left out.
  const empty = toComposerError(wireError(Code.ResourceExhausted, "x", [{ type: "google.rpc.RetryInfo", value: new Uint8Array() }]));
  assert.equal(empty.retryAfterMs, undefined);
  const garbage = toComposerError(wireError(Code.ResourceExhausted, "x", [{ type: "google.rpc.RetryInfo", value: new Uint8Array([0x0a, 0x05]) }]));
  assert.equal(garbage.retryAfterMs, undefined);
  assert.equal(toComposerError(wireError(Code.ResourceExhausted, "x", [{ type: "google.rpc.RetryInfo", value: retryInfo(2_000) }])).retryAfterMs, 2_000);
});

test("the protocol check accepts 1.x and refuses other majors", () => {
  checkProtocolVersion("1.0");
  checkProtocolVersion("1.7");
  checkProtocolVersion("1"); // no minor: 1.0
  checkProtocolVersion("1.2.3"); // parts after the minor are not read
  for (const bad of ["2.0", "0.9", "", "one", "1.x", " 1.0", "v1.0", "1..0"]) {
    assert.throws(() => checkProtocolVersion(bad), (e) => isFailedPrecondition(e));
  }
});

test("RunFailedError names the run, its status and its error", () => {
  const run = { runId: "r-1", status: "FAILED", error: { code: "DECLINED", message: "no", nodeId: "charge", details: null } } as Run;
  const error = new RunFailedError(run);
  assert.equal(error.message, "run r-1 ended FAILED: DECLINED: no (node charge)");
  assert.equal(error.run, run);
  assert.equal(error.code, "DECLINED");
  assert.equal(error.reason, "no");
});

test("RunFailedError of a cancelled run carries CANCELLED and the cancel reason, not 'no error recorded'", () => {
  const run = { runId: "r-2", status: "CANCELLED", error: { code: "CANCELLED", message: "customer withdrew", nodeId: "", details: null } } as Run;
  const error = new RunFailedError(run);
  assert.equal(error.message, "run r-2 ended CANCELLED: CANCELLED: customer withdrew");
  assert.deepEqual([error.code, error.reason], ["CANCELLED", "customer withdrew"]);

  // A server that recorded no error for a cancelled run still gives the code.
  const bare = new RunFailedError({ runId: "r-3", status: "CANCELLED", error: null } as Run);
  assert.equal(bare.message, "run r-3 ended CANCELLED: CANCELLED: run cancelled");
  assert.deepEqual([bare.code, bare.reason], ["CANCELLED", "run cancelled"]);
});
