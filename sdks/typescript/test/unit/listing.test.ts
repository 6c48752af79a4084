// The client's listWorkflows, listWorkflowVersions and countRuns against a fake WorkflowService and
// RunService: request mapping, paging, and the SDK's own shapes of the answers.
import assert from "node:assert/strict";
import { test } from "node:test";

import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";

import { ComposerClient, isInvalidArgument, type RunCounts, type WorkflowSummary, type WorkflowVersion } from "../../src/index.js";
import { RunStatus } from "../../src/gen/composer/v1/common_pb.js";
import { badRequest, FakeServer, wireError } from "./fake.js";

const UPDATED = new Date("2030-01-03T04:05:06.000Z");

function clientOf(fake: FakeServer): ComposerClient {
  return new ComposerClient({ transport: fake, token: "t0ken" });
}

test("listWorkflows sends the prefix and page size, follows page tokens and yields WorkflowSummary", async () => {
  const pages: Record<string, { workflows: unknown[]; nextPageToken: string }> = {
    "": { workflows: [{ namespace: "default", name: "order", latestVersion: 3, description: "orders", updateTime: timestampFromDate(UPDATED) }], nextPageToken: "p2" },
    p2: { workflows: [{ namespace: "default", name: "order-refund", latestVersion: 1, description: "" }], nextPageToken: "" },
  };
  const fake = new FakeServer({ ListWorkflows: (request) => pages[request.pageToken] });
  const seen: WorkflowSummary[] = [];
  for await (const each of clientOf(fake).listWorkflows({ namePrefix: "order", pageSize: 1 })) seen.push(each);

  assert.deepEqual(seen, [
    { namespace: "default", name: "order", latestVersion: 3, description: "orders", updateTime: UPDATED },
    { namespace: "default", name: "order-refund", latestVersion: 1, description: "", updateTime: null },
  ]);
  const sent = fake.requests("ListWorkflows");
  assert.deepEqual(
    sent.map((r) => [r.namePrefix, r.pageSize, r.pageToken]),
    [
      ["order", 1, ""],
      ["order", 1, "p2"],
    ],
  );
  assert.equal(fake.headers("ListWorkflows")[0]!.get("authorization"), "Bearer t0ken");
});

test("listWorkflowVersions names the workflow and yields WorkflowVersion, newest first, page by page", async () => {
  const version = (n: number) => ({ namespace: "default", name: "order", version: n, description: `v${n}`, contentHash: `h${n}` });
  const fake = new FakeServer({
    ListWorkflowVersions: (request) => (request.pageToken === "" ? { versions: [version(2)], nextPageToken: "next" } : { versions: [version(1)], nextPageToken: "" }),
  });
  const seen: WorkflowVersion[] = [];
  for await (const each of clientOf(fake).listWorkflowVersions("order", { pageSize: 1 })) seen.push(each);

  assert.deepEqual(
    seen.map((v) => [v.name, v.version, v.description, v.contentHash, v.source, v.definition]),
    [
      ["order", 2, "v2", "h2", "", null],
      ["order", 1, "v1", "h1", "", null],
    ],
  );
  assert.deepEqual(
    fake.requests("ListWorkflowVersions").map((r) => [r.name, r.pageSize, r.pageToken]),
    [
      ["order", 1, ""],
      ["order", 1, "next"],
    ],
  );
});

test("countRuns sends the filters and answers the total and the count per status", async () => {
  const fake = new FakeServer({
    CountRuns: () => ({
      counts: [
        { status: RunStatus.RUNNING, count: 4n },
        { status: RunStatus.FAILED, count: 2n },
        { status: RunStatus.COMPLETED, count: 10n },
      ],
      more: true,
    }),
  });
  const after = new Date("2030-01-01T00:00:00.000Z");
  const counts: RunCounts = await clientOf(fake).countRuns({
    workflow: "order",
    workflowVersion: 2,
    labels: { batch: "b1" },
    createdAfter: after,
    parentRunId: "parent-1",
    search: "A-17",
  });

  assert.deepEqual(counts, { total: 16, byStatus: { RUNNING: 4, FAILED: 2, COMPLETED: 10 }, more: true });
  const [sent] = fake.requests("CountRuns");
  assert.equal(sent.workflowName, "order");
  assert.equal(sent.workflowVersion, 2);
  assert.deepEqual({ ...sent.labels }, { batch: "b1" });
  assert.equal(sent.createTimeAfter.seconds, BigInt(after.getTime() / 1000));
  assert.equal(sent.createTimeBefore, undefined);
  assert.equal(sent.parentRunId, "parent-1");
  assert.equal(sent.search, "A-17");

  const none = await clientOf(new FakeServer({ CountRuns: () => ({ counts: [] }) })).countRuns();
  assert.deepEqual(none, { total: 0, byStatus: {}, more: false });
});

test("countRuns decodes INVALID_ARGUMENT naming the field", async () => {
  const fake = new FakeServer({
    CountRuns: () => {
      throw wireError(Code.InvalidArgument, "invalid filter", [{ type: "google.rpc.BadRequest", value: badRequest([["workflow_version", "needs workflow_name"]]) }]);
    },
  });
  await assert.rejects(clientOf(fake).countRuns({ workflowVersion: 2 }), (e) => isInvalidArgument(e) && e.fieldViolations[0]?.field === "workflow_version");
});
