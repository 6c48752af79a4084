// The client's bulk operations against a fake RunService: request mapping, the typed
// BulkOperation, error decoding, paging, and waitBulkOperation's polling and timeout.
import assert from "node:assert/strict";
import { test } from "node:test";

import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";

import {
  ComposerClient,
  TimeoutError,
  isBulkOperationDone,
  isFailedPrecondition,
  isInvalidArgument,
  isNotFound,
  type BulkOperation,
} from "../../src/index.js";
import { BulkOperationKind, BulkOperationStatus } from "../../src/gen/composer/v1/run_service_pb.js";
import { RunStatus } from "../../src/gen/composer/v1/common_pb.js";
import { badRequest, FakeServer, unavailable, wireError } from "./fake.js";

const CREATED = new Date("2030-01-02T03:04:05.000Z");

/** A wire BulkOperation with `status` and counts. */
function wireOperation(status: BulkOperationStatus, overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    operationId: "op-1",
    namespace: "default",
    kind: BulkOperationKind.RETRY,
    status,
    filter: { labels: { batch: "b1" } },
    matched: 8n,
    succeeded: 6n,
    skipped: 2n,
    failed: 0n,
    createdBy: "ops",
    createTime: timestampFromDate(CREATED),
    updateTime: timestampFromDate(CREATED),
    ...overrides,
  };
}

function clientOf(fake: FakeServer): ComposerClient {
  return new ComposerClient({ transport: fake, token: "t0ken" });
}

test("bulkCancelRuns sends the whole filter, all, reason and request id, and types the answer", async () => {
  const fake = new FakeServer({
    BulkCancelRuns: (request) => ({
      created: true,
      operation: wireOperation(BulkOperationStatus.PENDING, {
        kind: BulkOperationKind.CANCEL,
        filter: request.filter,
        reason: request.reason,
        matched: 0n,
        succeeded: 0n,
        skipped: 0n,
        failures: [{ runId: "r-9", message: "gone" }],
      }),
    }),
  });
  const client = clientOf(fake);
  const after = new Date("2030-01-01T00:00:00.000Z");
  const before = new Date("2030-01-03T00:00:00.000Z");
  const filter = {
    workflow: "order",
    workflowVersion: 2,
    statuses: ["RUNNING", "PAUSED"] as const,
    labels: { batch: "b1" },
    createdAfter: after,
    createdBefore: before,
    parentRunId: "parent-1",
    search: "A-17",
  };
  const operation = await client.bulkCancelRuns(filter, { reason: "outage", requestId: "req-1", all: true });

  const [sent] = fake.requests("BulkCancelRuns");
  assert.equal(sent.filter.workflowName, "order");
  assert.equal(sent.filter.workflowVersion, 2);
  assert.deepEqual(sent.filter.statuses, [RunStatus.RUNNING, RunStatus.PAUSED]);
  assert.deepEqual(sent.filter.labels, { batch: "b1" });
  assert.equal(sent.filter.createTimeAfter.seconds, BigInt(after.getTime() / 1000));
  assert.equal(sent.filter.createTimeBefore.seconds, BigInt(before.getTime() / 1000));
  assert.equal(sent.filter.parentRunId, "parent-1");
  assert.equal(sent.filter.search, "A-17");
  assert.equal(sent.all, true);
  assert.equal(sent.reason, "outage");
  assert.equal(sent.requestId, "req-1");
  assert.equal(fake.headers("BulkCancelRuns")[0]!.get("authorization"), "Bearer t0ken");

  assert.equal(operation.operationId, "op-1");
  assert.equal(operation.kind, "CANCEL");
  assert.equal(operation.status, "PENDING");
  assert.equal(operation.created, true);
  assert.equal(operation.reason, "outage");
  assert.deepEqual(operation.filter, filter, "the filter comes back as it was given");
  assert.deepEqual(operation.failures, [{ runId: "r-9", message: "gone" }]);
  assert.equal(operation.createdBy, "ops");
  assert.deepEqual(operation.createTime, CREATED);
  assert.equal(operation.endTime, null);
  assert.equal(operation.error, "");
  assert.ok(!isBulkOperationDone(operation.status));
});

test("bulkRetryRuns, bulkPauseRuns and bulkResumeRuns map to their RPCs with defaults", async () => {
  const answer = (kind: BulkOperationKind) => () => ({ created: false, operation: wireOperation(BulkOperationStatus.RUNNING, { kind }) });
  const fake = new FakeServer({
    BulkRetryRuns: answer(BulkOperationKind.RETRY),
    BulkPauseRuns: answer(BulkOperationKind.PAUSE),
    BulkResumeRuns: answer(BulkOperationKind.RESUME),
  });
  const client = clientOf(fake);
  const retried = await client.bulkRetryRuns({ labels: { batch: "b1" } });
  const paused = await client.bulkPauseRuns({ workflow: "order" }, { reason: "hold" });
  const resumed = await client.bulkResumeRuns({}, { all: true, requestId: "r-2" });

  assert.deepEqual([retried.kind, paused.kind, resumed.kind], ["RETRY", "PAUSE", "RESUME"]);
  assert.ok([retried, paused, resumed].every((o) => o.created === false && o.status === "RUNNING"));
  assert.deepEqual([retried.matched, retried.succeeded, retried.skipped, retried.failed], [8, 6, 2, 0]);
  const retry = fake.requests("BulkRetryRuns")[0];
  assert.deepEqual(retry.filter.labels, { batch: "b1" });
  assert.equal(retry.filter.workflowName, "");
  assert.deepEqual(retry.filter.statuses, []);
  assert.equal(retry.filter.createTimeAfter, undefined);
  assert.equal(retry.all, false);
  assert.equal(retry.requestId, "");
  const pause = fake.requests("BulkPauseRuns")[0];
  assert.equal(pause.filter.workflowName, "order");
  assert.equal(pause.reason, "hold");
  const resume = fake.requests("BulkResumeRuns")[0];
  assert.equal(resume.all, true);
  assert.equal(resume.requestId, "r-2");
});

test("bulk errors decode into the SDK's errors with their field violations", async () => {
  const fake = new FakeServer({
    BulkRetryRuns: (request) => {
      if (request.filter.workflowVersion && !request.filter.workflowName) {
        throw wireError(Code.InvalidArgument, "bad filter", [
          { type: "google.rpc.BadRequest", value: badRequest([["filter.workflow_version", "needs filter.workflow_name"]]) },
        ]);
      }
      throw wireError(Code.FailedPrecondition, "an empty filter needs all");
    },
    GetBulkOperation: () => {
      throw wireError(Code.NotFound, "no such bulk operation");
    },
    CancelBulkOperation: () => {
      throw wireError(Code.FailedPrecondition, "the operation ended");
    },
  });
  const client = clientOf(fake);
  const bad = await client.bulkRetryRuns({ workflowVersion: 3 }).catch((e: unknown) => e);
  assert.ok(isInvalidArgument(bad), String(bad));
  assert.deepEqual(bad.fieldViolations.map((v) => v.field), ["filter.workflow_version"]);
  assert.ok(isFailedPrecondition(await client.bulkRetryRuns({}).catch((e: unknown) => e)));
  assert.ok(isNotFound(await client.getBulkOperation("nope").catch((e: unknown) => e)));
  assert.ok(isFailedPrecondition(await client.cancelBulkOperation("op-1").catch((e: unknown) => e)));
  assert.deepEqual(fake.requests("CancelBulkOperation").map((r) => r.operationId), ["op-1"]);
});

test("listBulkOperations pages through every operation", async () => {
  const fake = new FakeServer({
    ListBulkOperations: (request) =>
      request.pageToken === ""
        ? { operations: [wireOperation(BulkOperationStatus.SUCCEEDED, { operationId: "op-3" }), wireOperation(BulkOperationStatus.SUCCEEDED, { operationId: "op-2" })], nextPageToken: "p2" }
        : { operations: [wireOperation(BulkOperationStatus.CANCELLED, { operationId: "op-1" })], nextPageToken: "" },
  });
  const ids: string[] = [];
  for await (const operation of clientOf(fake).listBulkOperations({ pageSize: 2 })) ids.push(operation.operationId);
  assert.deepEqual(ids, ["op-3", "op-2", "op-1"]);
  assert.deepEqual(fake.requests("ListBulkOperations").map((r) => [r.pageSize, r.pageToken]), [
    [2, ""],
    [2, "p2"],
  ]);
});

test("waitBulkOperation polls through transient errors until the operation ends", async () => {
  const answers = [
    () => wireOperation(BulkOperationStatus.PENDING),
    () => wireOperation(BulkOperationStatus.RUNNING),
    () => {
      throw unavailable();
    },
    () => wireOperation(BulkOperationStatus.SUCCEEDED, { endTime: timestampFromDate(CREATED) }),
  ];
  const fake = new FakeServer({
    GetBulkOperation: (request) => {
      assert.equal(request.operationId, "op-1");
      return { operation: (answers.shift() ?? (() => assert.fail("polled after the end")))() };
    },
  });
  const done: BulkOperation = await clientOf(fake).waitBulkOperation("op-1", { timeoutMs: 10_000, maxPollIntervalMs: 20 });
  assert.equal(done.status, "SUCCEEDED");
  assert.deepEqual(done.endTime, CREATED);
  assert.equal(fake.requests("GetBulkOperation").length, 4);
});

test("waitBulkOperation returns a CANCELLED or FAILED operation as it is", async () => {
  for (const status of [BulkOperationStatus.CANCELLED, BulkOperationStatus.FAILED]) {
    const fake = new FakeServer({ GetBulkOperation: () => ({ operation: wireOperation(status, { error: "why" }) }) });
    const done = await clientOf(fake).waitBulkOperation("op-1", { timeoutMs: 5_000 });
    assert.equal(done.status, BulkOperationStatus[status]);
    assert.equal(done.error, "why");
  }
});

test("waitBulkOperation gives up with a TimeoutError, also in the middle of a poll", async () => {
  const running = new FakeServer({ GetBulkOperation: () => ({ operation: wireOperation(BulkOperationStatus.RUNNING) }) });
  const started = Date.now();
  const error = await clientOf(running).waitBulkOperation("op-1", { timeoutMs: 300, maxPollIntervalMs: 50 }).catch((e: unknown) => e);
  assert.ok(error instanceof TimeoutError, String(error));
  assert.match(error.message, /bulk operation op-1 did not end within 300 ms/);
  assert.ok(running.requests("GetBulkOperation").length >= 2, "it polled more than once");
  assert.ok(Date.now() - started < 5_000);

  // A poll that hangs is aborted at the deadline.
  const hanging = new FakeServer({
    GetBulkOperation: (_request, signal) => new Promise((_resolve, reject) => signal?.addEventListener("abort", () => reject(signal.reason))),
  });
  const stuck = await clientOf(hanging).waitBulkOperation("op-1", { timeoutMs: 200 }).catch((e: unknown) => e);
  assert.ok(stuck instanceof TimeoutError, String(stuck));
});

test("waitBulkOperation stops at a non-transient error and at the caller's signal", async () => {
  const missing = new FakeServer({
    GetBulkOperation: () => {
      throw wireError(Code.NotFound, "no such bulk operation");
    },
  });
  assert.ok(isNotFound(await clientOf(missing).waitBulkOperation("op-x", { timeoutMs: 5_000 }).catch((e: unknown) => e)));
  assert.equal(missing.requests("GetBulkOperation").length, 1);

  const running = new FakeServer({ GetBulkOperation: () => ({ operation: wireOperation(BulkOperationStatus.RUNNING) }) });
  const controller = new AbortController();
  const reason = new Error("caller gave up");
  setTimeout(() => controller.abort(reason), 100);
  assert.equal(await clientOf(running).waitBulkOperation("op-1", { signal: controller.signal }).catch((e: unknown) => e), reason);
});
