// The client's queue rate limits against a fake QueueService (request mapping, the typed
// QueueRateLimit, error decoding, paging) and the run model's QUEUED status and concurrency key.
import assert from "node:assert/strict";
import { test } from "node:test";

import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";

import { ComposerClient, isFinalStatus, isInvalidArgument, isNotFound, type QueueRateLimit } from "../../src/index.js";
import { RunStatus } from "../../src/gen/composer/v1/common_pb.js";
import { badRequest, FakeServer, wireError } from "./fake.js";

const CREATED = new Date("2030-01-02T03:04:05.000Z");
const UPDATED = new Date("2030-01-03T04:05:06.000Z");

function clientOf(fake: FakeServer): ComposerClient {
  return new ComposerClient({ transport: fake, token: "t0ken" });
}

function wireLimit(queue: string, overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    queue,
    perSecond: 2,
    burst: 2,
    perKeyPerSecond: 0.5,
    perKeyBurst: 1,
    createTime: timestampFromDate(CREATED),
    updateTime: timestampFromDate(UPDATED),
    ...overrides,
  };
}

test("setQueueRateLimit sends every field of the limit and types the stored answer", async () => {
  const fake = new FakeServer({
    SetQueueRateLimit: (request) => ({ limit: { ...request.limit, burst: request.limit.burst || 3, createTime: timestampFromDate(CREATED), updateTime: timestampFromDate(UPDATED) } }),
  });
  const client = clientOf(fake);
  const limit: QueueRateLimit = await client.setQueueRateLimit("emails", { perSecond: 2.5, burst: 4, perKeyPerSecond: 0.5, perKeyBurst: 2 });

  const [sent] = fake.requests("SetQueueRateLimit");
  assert.equal(sent.limit.queue, "emails");
  assert.equal(sent.limit.perSecond, 2.5);
  assert.equal(sent.limit.burst, 4);
  assert.equal(sent.limit.perKeyPerSecond, 0.5);
  assert.equal(sent.limit.perKeyBurst, 2);
  assert.equal(sent.limit.createTime, undefined, "the times are the server's");
  assert.equal(fake.headers("SetQueueRateLimit")[0]!.get("authorization"), "Bearer t0ken");
  assert.deepEqual(limit, { queue: "emails", perSecond: 2.5, burst: 4, perKeyPerSecond: 0.5, perKeyBurst: 2, createTime: CREATED, updateTime: UPDATED });

  // Fields left out go as 0: the server fills in the bursts.
  const defaulted = await client.setQueueRateLimit("partner-api", { perSecond: 0.5 });
  const second = fake.requests("SetQueueRateLimit")[1];
  assert.deepEqual([second.limit.queue, second.limit.perSecond, second.limit.burst, second.limit.perKeyPerSecond, second.limit.perKeyBurst], ["partner-api", 0.5, 0, 0, 0]);
  assert.equal(defaulted.burst, 3);
});

test("getQueueRateLimit and deleteQueueRateLimit name the queue; NOT_FOUND decodes", async () => {
  const limits = new Map([["emails", wireLimit("emails")]]);
  const fake = new FakeServer({
    GetQueueRateLimit: (request) => {
      const limit = limits.get(request.queue);
      if (!limit) throw wireError(Code.NotFound, `queue ${request.queue} has no rate limit`);
      return { limit };
    },
    DeleteQueueRateLimit: (request) => {
      if (!limits.delete(request.queue)) throw wireError(Code.NotFound, `queue ${request.queue} has no rate limit`);
      return {};
    },
  });
  const client = clientOf(fake);
  const got = await client.getQueueRateLimit("emails");
  assert.deepEqual(got, { queue: "emails", perSecond: 2, burst: 2, perKeyPerSecond: 0.5, perKeyBurst: 1, createTime: CREATED, updateTime: UPDATED });
  assert.equal(await client.deleteQueueRateLimit("emails"), undefined);
  assert.deepEqual(fake.requests("DeleteQueueRateLimit").map((r) => r.queue), ["emails"]);
  assert.ok(isNotFound(await client.getQueueRateLimit("emails").catch((e: unknown) => e)));
  assert.ok(isNotFound(await client.deleteQueueRateLimit("emails").catch((e: unknown) => e)));
  assert.deepEqual(fake.requests("GetQueueRateLimit").map((r) => r.queue), ["emails", "emails"]);
});

test("a limit without times reads them as null", async () => {
  const fake = new FakeServer({ GetQueueRateLimit: () => ({ limit: { queue: "q", perSecond: 1, burst: 1 } }) });
  const limit = await clientOf(fake).getQueueRateLimit("q");
  assert.equal(limit.createTime, null);
  assert.equal(limit.updateTime, null);
  assert.equal(limit.perKeyPerSecond, 0);
  assert.equal(limit.perKeyBurst, 0);
});

test("setQueueRateLimit's refusal carries its field violations", async () => {
  const fake = new FakeServer({
    SetQueueRateLimit: () => {
      throw wireError(Code.InvalidArgument, "bad rate limit", [
        { type: "google.rpc.BadRequest", value: badRequest([["limit.burst", "must be at least per_second rounded up (5)"]]) },
      ]);
    },
  });
  const error = await clientOf(fake).setQueueRateLimit("q", { perSecond: 5, burst: 2 }).catch((e: unknown) => e);
  assert.ok(isInvalidArgument(error), String(error));
  assert.deepEqual(error.fieldViolations.map((v) => v.field), ["limit.burst"]);
  assert.match(error.message, /limit\.burst/);
});

test("listQueueRateLimits pages through every limit", async () => {
  const fake = new FakeServer({
    ListQueueRateLimits: (request) =>
      request.pageToken === ""
        ? { limits: [wireLimit("a"), wireLimit("b")], nextPageToken: "p2" }
        : { limits: [wireLimit("c", { perKeyPerSecond: 0, perKeyBurst: 0 })], nextPageToken: "" },
  });
  const queues: string[] = [];
  for await (const limit of clientOf(fake).listQueueRateLimits({ pageSize: 2 })) queues.push(limit.queue);
  assert.deepEqual(queues, ["a", "b", "c"]);
  assert.deepEqual(fake.requests("ListQueueRateLimits").map((r) => [r.pageSize, r.pageToken]), [
    [2, ""],
    [2, "p2"],
  ]);
  // The default page size is the other lists'.
  for await (const _ of clientOf(fake).listQueueRateLimits()) break;
  assert.equal(fake.requests("ListQueueRateLimits")[2].pageSize, 100);
});

test("a run reads QUEUED and its concurrency key; a QUEUED filter goes out as wire status 7", async () => {
  const wireRun = (runId: string, status: RunStatus, concurrencyKey: string) => ({ runId, workflowName: "order", status, concurrencyKey, priority: 3 });
  const fake = new FakeServer({
    GetRun: (request) => ({ run: wireRun(request.runId, RunStatus.QUEUED, "customer-7") }),
    StartRun: () => ({ run: wireRun("r-0", RunStatus.RUNNING, ""), created: true }),
    ListRuns: () => ({ runs: [wireRun("r-2", RunStatus.QUEUED, "customer-7")] }),
    BulkCancelRuns: (request) => ({ created: true, operation: { operationId: "op-1", filter: request.filter } }),
  });
  const client = clientOf(fake);
  const queued = await client.getRun("r-1");
  assert.equal(queued.status, "QUEUED");
  assert.equal(queued.concurrencyKey, "customer-7");
  assert.ok(!isFinalStatus(queued.status));
  const plain = await client.startRun("order");
  assert.equal(plain.status, "RUNNING");
  assert.equal(plain.concurrencyKey, "", "a run without a key has an empty one");

  const listed = [];
  for await (const run of client.listRuns({ statuses: ["QUEUED", "RUNNING"] })) listed.push(run);
  assert.deepEqual(listed.map((r) => [r.runId, r.status, r.concurrencyKey]), [["r-2", "QUEUED", "customer-7"]]);
  assert.deepEqual(fake.requests("ListRuns")[0].statuses, [RunStatus.QUEUED, RunStatus.RUNNING]);
  assert.equal(RunStatus.QUEUED, 7);

  const operation = await client.bulkCancelRuns({ statuses: ["QUEUED"] });
  assert.deepEqual(operation.filter, { statuses: ["QUEUED"] }, "a QUEUED filter reads back");
  assert.deepEqual(fake.requests("BulkCancelRuns")[0].filter.statuses, [RunStatus.QUEUED]);
});
