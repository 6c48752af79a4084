// The client's replayRun, checkWorkflowVersion and migrateRuns against a fake WorkflowService and
// RunService: request shapes, a recorded run read from `composer run history -o json`, the paging
// and summing of a check, the typed answers, and the arguments refused before any call.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { Code } from "@connectrpc/connect";

import {
  ComposerClient,
  isInvalidArgument,
  type BulkOperation,
  type RunReplay,
  type WorkflowVersionCheck,
} from "../../src/index.js";
import { RunStatus } from "../../src/gen/composer/v1/common_pb.js";
import { BulkOperationKind, BulkOperationStatus } from "../../src/gen/composer/v1/run_service_pb.js";
import { CheckScope, ReplayVerdict } from "../../src/gen/composer/v1/workflow_service_pb.js";
import { badRequest, FakeServer, wireError } from "./fake.js";

/** The repository root (tests run from sdks/typescript/dist-test/test/unit). */
const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..", "..");
/** A run of `order` (A -> B -> C) waiting in B, as `composer run history RUN_ID -o json` wrote it. */
const FIXTURE = resolve(REPO, "tests", "fixtures", "replay", "order-waiting-in-b.history.json");
const FIXTURE_RUN_ID = "01a24a4f-f8a8-72a9-b54a-0bca93fd712a";

const V2 = `name: order
nodes:
  - { id: A, type: TASK, queue: replay, task: a }
  - { id: B, type: TASK, queue: replay, task: b, input: { amount: "\${nodes.A.output.amount}" } }
  - { id: C, type: TASK, queue: replay, task: c }
  - { id: D, type: TASK, queue: replay, task: d }
edges:
  - { from: A, to: B }
  - { from: B, to: C }
  - { from: C, to: D }
`;

function clientOf(fake: FakeServer): ComposerClient {
  return new ComposerClient({ transport: fake, token: "t0ken" });
}

/** A wire RunReplay of `verdict` for run `runId`. */
function wireReplay(runId: string, verdict: ReplayVerdict, overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return { runId, workflowVersion: 1, status: RunStatus.RUNNING, verdict, events: 4, ...overrides };
}

const COMPATIBLE_ANSWER = {
  replay: wireReplay(FIXTURE_RUN_ID, ReplayVerdict.COMPATIBLE, {
    differences: [{ kind: "node_added", nodeId: "D", message: "node D is new" }],
  }),
};

test("replayRun by runId sends the run, the source and the node mapping, and types the verdict", async () => {
  const fake = new FakeServer({
    ReplayRun: () => ({
      replay: wireReplay("run-1", ReplayVerdict.INCOMPATIBLE, {
        workflowVersion: 3,
        status: RunStatus.PAUSED,
        events: 7,
        divergence: { rule: "node_changed", nodeId: "B", sequence: 4n, message: "node B's task is b2, the run started b" },
      }),
    }),
  });
  const replay: RunReplay = await clientOf(fake).replayRun({ runId: "run-1", source: V2, nodeMapping: { B: "B2" } });

  const [sent] = fake.requests("ReplayRun");
  assert.deepEqual(sent.recorded, { case: "runId", value: "run-1" });
  assert.equal(sent.source, V2);
  assert.equal(sent.version, 0);
  assert.deepEqual(sent.nodeMapping, { B: "B2" });
  assert.equal(fake.headers("ReplayRun")[0]!.get("authorization"), "Bearer t0ken");

  assert.deepEqual(replay, {
    runId: "run-1",
    workflowVersion: 3,
    status: "PAUSED",
    verdict: "INCOMPATIBLE",
    divergence: { rule: "node_changed", nodeId: "B", sequence: 4, message: "node B's task is b2, the run started b" },
    differences: [],
    unreplayableReason: "",
    events: 7,
  });
});

test("replayRun against a registered version, or an object definition sent as JSON", async () => {
  const fake = new FakeServer({ ReplayRun: () => COMPATIBLE_ANSWER });
  const client = clientOf(fake);
  const replay = await client.replayRun({ runId: "run-1", version: 2 });
  await client.replayRun({ runId: "run-1", source: { name: "order", nodes: [] } });

  const [byVersion, byObject] = fake.requests("ReplayRun");
  assert.equal(byVersion.version, 2);
  assert.equal(byVersion.source, "");
  assert.deepEqual(byVersion.nodeMapping, {});
  assert.deepEqual(JSON.parse(byObject.source), { name: "order", nodes: [] });
  assert.equal(byObject.version, 0);

  assert.equal(replay.verdict, "COMPATIBLE");
  assert.equal(replay.divergence, null);
  assert.deepEqual(replay.differences, [{ kind: "node_added", nodeId: "D", message: "node D is new" }]);
});

test("replayRun offline sends the recorded run that `run history -o json` wrote, as text or parsed", async () => {
  const text = readFileSync(FIXTURE, "utf8");
  const fake = new FakeServer({ ReplayRun: () => COMPATIBLE_ANSWER });
  const client = clientOf(fake);
  const fromText = await client.replayRun({ history: text, source: V2 });
  await client.replayRun({ history: JSON.parse(text) as Record<string, unknown>, version: 2 });

  const [first, second] = fake.requests("ReplayRun");
  assert.equal(fromText.verdict, "COMPATIBLE");
  for (const sent of [first, second]) {
    assert.equal(sent.recorded.case, "history");
    const recorded = sent.recorded.value;
    assert.equal(recorded.run.runId, FIXTURE_RUN_ID);
    assert.equal(recorded.run.workflowName, "order");
    assert.equal(recorded.run.workflowVersion, 1);
    assert.equal(recorded.run.status, RunStatus.RUNNING);
    assert.deepEqual(
      recorded.run.nodes.map((n: { nodeId: string }) => n.nodeId),
      ["A", "B"],
    );
    assert.equal(recorded.workflow.name, "order");
    assert.equal(recorded.workflow.version, 1);
    assert.match(recorded.workflow.source, /^name: order\n/);
    assert.deepEqual(
      recorded.events.map((e: { sequence: bigint; eventType: string; nodeId: string }) => [e.sequence, e.eventType, e.nodeId]),
      [
        [1n, "run_started", ""],
        [2n, "node_started", "A"],
        [3n, "node_completed", "A"],
        [4n, "node_started", "B"],
      ],
    );
    assert.equal(recorded.events[2].details.kind.case, "structValue", "details are carried as JSON");
  }
  assert.equal(first.source, V2);
  assert.equal(second.version, 2);
});

test("replayRun offline ignores keys beside run, workflow and events, and refuses a history it cannot use", async () => {
  const record = JSON.parse(readFileSync(FIXTURE, "utf8")) as Record<string, unknown>;
  const fake = new FakeServer({ ReplayRun: () => COMPATIBLE_ANSWER });
  const client = clientOf(fake);
  await client.replayRun({ history: { ...record, exported_by: "ops", run: { ...(record["run"] as object), added_later: 1 } }, version: 2 });
  assert.equal(fake.requests("ReplayRun").length, 1, "unknown keys are ignored");

  const { run: _run, ...noRun } = record;
  const refused: [unknown, RegExp][] = [
    ["{ not json", /replayRun: the history is not JSON/],
    ["[1, 2]", /the history is not a JSON object/],
    [noRun, /the history has no "run"/],
    [{ ...record, events: {} }, /"events" is not a list/],
    [{ ...record, next_page_token: "1_4" }, /the history is cut short \(next_page_token is set\)/],
    [{ ...record, events: [{ sequence: "not a number" }] }, /the history does not read as a recorded run/],
  ];
  for (const [history, message] of refused) {
    await assert.rejects(
      client.replayRun({ history: history as Record<string, unknown>, version: 2 }),
      (e: unknown) => e instanceof TypeError && message.test(e.message) && /composer run history RUN_ID -o json/.test(e.message),
      String(message),
    );
  }
  assert.equal(fake.requests("ReplayRun").length, 1, "nothing refused was sent");
});

test("replayRun refuses arguments that do not name one run and one definition, before any call", async () => {
  const fake = new FakeServer({ ReplayRun: () => COMPATIBLE_ANSWER });
  const client = clientOf(fake);
  const history = readFileSync(FIXTURE, "utf8");
  const bad: [unknown, RegExp][] = [
    [{ source: V2 }, /replayRun needs exactly one of runId and history/],
    [{ runId: "run-1", history, source: V2 }, /replayRun needs exactly one of runId and history/],
    [{ runId: "", source: V2 }, /runId is empty/],
    [{ runId: "run-1" }, /replayRun needs exactly one of source and version/],
    [{ runId: "run-1", source: V2, version: 2 }, /replayRun needs exactly one of source and version/],
    [{ runId: "run-1", version: 0 }, /version must be a registered version \(a positive integer\), not 0/],
    [{ runId: "run-1", version: 1.5 }, /not 1\.5/],
    [{ runId: "run-1", source: "  \n" }, /source is empty/],
    [{ runId: "run-1", source: 42 }, /a workflow is YAML or JSON text, or an object/],
    [{ runId: "run-1", version: 2, nodeMapping: { B: 7 } }, /nodeMapping maps "B" to 7/],
    [{ runId: "run-1", version: 2, nodeMapping: [["B", "B2"]] }, /nodeMapping is an object/],
  ];
  for (const [options, message] of bad) {
    await assert.rejects(
      client.replayRun(options as Parameters<ComposerClient["replayRun"]>[0]),
      (e: unknown) => e instanceof TypeError && message.test(e.message),
      `${JSON.stringify(options).slice(0, 80)}: ${String(message)}`,
    );
  }
  assert.equal(fake.calls.length, 0);
});

test("replayRun decodes the server's errors, an invalid source with its field violations", async () => {
  const fake = new FakeServer({
    ReplayRun: () => {
      throw wireError(Code.InvalidArgument, "invalid definition", [
        { type: "google.rpc.BadRequest", value: badRequest([["nodes[1].task", "is empty"]]) },
      ]);
    },
  });
  const error = await clientOf(fake).replayRun({ runId: "run-1", source: "name: order\nnodes: []\n" }).catch((e: unknown) => e);
  assert.ok(isInvalidArgument(error), String(error));
  assert.deepEqual(error.fieldViolations.map((v) => v.field), ["nodes[1].task"]);
});

test("checkWorkflowVersion pages through every run in flight and sums the verdicts", async () => {
  const pages: Record<string, Record<string, unknown>> = {
    "": {
      checked: 3,
      identical: 1,
      compatible: 1,
      incompatible: 1,
      runs: [
        wireReplay("r-5", ReplayVerdict.COMPATIBLE, { differences: [{ kind: "node_added", nodeId: "D", message: "new" }] }),
        wireReplay("r-4", ReplayVerdict.INCOMPATIBLE, { divergence: { rule: "node_changed", nodeId: "B", sequence: 4n, message: "task" } }),
      ],
      nextPageToken: "p2",
    },
    p2: {
      checked: 3,
      identical: 2,
      unreplayable: 1,
      runs: [wireReplay("r-2", ReplayVerdict.UNREPLAYABLE, { unreplayableReason: "the history is cut short", status: RunStatus.PAUSED })],
      nextPageToken: "p3",
    },
    p3: { checked: 1, identical: 1, nextPageToken: "" },
  };
  const fake = new FakeServer({ CheckWorkflowVersion: (request) => pages[request.pageToken] });
  const check: WorkflowVersionCheck = await clientOf(fake).checkWorkflowVersion("order", { source: V2, nodeMapping: { B: "B2" }, pageSize: 3 });

  assert.deepEqual(
    { ...check, runs: check.runs.map((r) => [r.runId, r.verdict]) },
    {
      checked: 7,
      identical: 4,
      compatible: 1,
      incompatible: 1,
      unreplayable: 1,
      runs: [
        ["r-5", "COMPATIBLE"],
        ["r-4", "INCOMPATIBLE"],
        ["r-2", "UNREPLAYABLE"],
      ],
    },
  );
  assert.deepEqual(check.runs[1]!.divergence, { rule: "node_changed", nodeId: "B", sequence: 4, message: "task" });
  assert.equal(check.runs[2]!.unreplayableReason, "the history is cut short");
  assert.equal(check.runs[2]!.status, "PAUSED");
  const sent = fake.requests("CheckWorkflowVersion");
  assert.deepEqual(
    sent.map((r) => [r.name, r.source, r.version, r.nodeMapping, r.scope, r.pageSize, r.pageToken]),
    [
      ["order", V2, 0, { B: "B2" }, CheckScope.IN_FLIGHT, 3, ""],
      ["order", V2, 0, { B: "B2" }, CheckScope.IN_FLIGHT, 3, "p2"],
      ["order", V2, 0, { B: "B2" }, CheckScope.IN_FLIGHT, 3, "p3"],
    ],
  );
});

test("checkWorkflowVersion of the completed runs stops at the limit, asking only for what is left", async () => {
  let page = 0;
  const fake = new FakeServer({
    CheckWorkflowVersion: (request) => {
      page += 1;
      return { checked: request.pageSize, identical: request.pageSize, nextPageToken: `p${page + 1}` };
    },
  });
  const check = await clientOf(fake).checkWorkflowVersion("order", { version: 3, scope: "COMPLETED", limit: 5, pageSize: 2 });

  assert.deepEqual(check, { checked: 5, identical: 5, compatible: 0, incompatible: 0, unreplayable: 0, runs: [] });
  assert.deepEqual(
    fake.requests("CheckWorkflowVersion").map((r) => [r.version, r.source, r.scope, r.pageSize, r.pageToken]),
    [
      [3, "", CheckScope.COMPLETED, 2, ""],
      [3, "", CheckScope.COMPLETED, 2, "p2"],
      [3, "", CheckScope.COMPLETED, 1, "p3"],
    ],
  );
});

test("checkWorkflowVersion asks for 200 runs a page by default and ends on an empty page token", async () => {
  const fake = new FakeServer({ CheckWorkflowVersion: () => ({ checked: 0, nextPageToken: "" }) });
  const check = await clientOf(fake).checkWorkflowVersion("order", { version: 2 });
  assert.deepEqual(check, { checked: 0, identical: 0, compatible: 0, incompatible: 0, unreplayable: 0, runs: [] });
  assert.deepEqual(
    fake.requests("CheckWorkflowVersion").map((r) => [r.scope, r.pageSize]),
    [[CheckScope.IN_FLIGHT, 200]],
  );
});

test("checkWorkflowVersion refuses bad arguments before any call", async () => {
  const fake = new FakeServer();
  const client = clientOf(fake);
  const bad: [string, unknown, RegExp][] = [
    ["", { version: 2 }, /checkWorkflowVersion needs the workflow's name/],
    ["order", {}, /checkWorkflowVersion needs exactly one of source and version/],
    ["order", { source: V2, version: 2 }, /exactly one of source and version/],
    ["order", { version: -1 }, /version must be a registered version/],
    ["order", { version: 2, limit: 10 }, /limit is for the COMPLETED scope; every run in flight is checked/],
    ["order", { version: 2, scope: "COMPLETED", limit: 0 }, /limit must be a positive integer, not 0/],
    ["order", { version: 2, scope: "RUNNING" }, /scope is IN_FLIGHT or COMPLETED, not RUNNING/],
    ["order", { version: 2, pageSize: 0 }, /pageSize must be a positive integer/],
    ["order", { version: 2, nodeMapping: { "": "B" } }, /nodeMapping maps "" to "B"/],
  ];
  for (const [name, options, message] of bad) {
    await assert.rejects(
      client.checkWorkflowVersion(name, options as Parameters<ComposerClient["checkWorkflowVersion"]>[1]),
      (e: unknown) => e instanceof TypeError && message.test(e.message),
      String(message),
    );
  }
  assert.equal(fake.calls.length, 0);
});

/** A wire MIGRATE BulkOperation in `status`. */
function migrateOperation(status: BulkOperationStatus, overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    operationId: "op-7",
    namespace: "default",
    kind: BulkOperationKind.MIGRATE,
    status,
    filter: { workflowName: "order" },
    targetVersion: 2,
    nodeMapping: { B: "B2" },
    matched: 3n,
    createdBy: "ops",
    ...overrides,
  };
}

test("migrateRuns sends the filter, target version, node mapping and request id, and types the operation", async () => {
  const fake = new FakeServer({
    MigrateRuns: (request) => ({
      created: true,
      operation: migrateOperation(BulkOperationStatus.PENDING, { filter: request.filter, targetVersion: request.targetVersion, nodeMapping: request.nodeMapping }),
    }),
  });
  const filter = { workflow: "order", workflowVersion: 1, statuses: ["RUNNING", "PAUSED"] as const, labels: { batch: "b1" } };
  const operation: BulkOperation = await clientOf(fake).migrateRuns(filter, 2, { nodeMapping: { B: "B2" }, requestId: "deploy-42" });

  const [sent] = fake.requests("MigrateRuns");
  assert.equal(sent.filter.workflowName, "order");
  assert.equal(sent.filter.workflowVersion, 1);
  assert.deepEqual(sent.filter.statuses, [RunStatus.RUNNING, RunStatus.PAUSED]);
  assert.deepEqual(sent.filter.labels, { batch: "b1" });
  assert.equal(sent.targetVersion, 2);
  assert.deepEqual(sent.nodeMapping, { B: "B2" });
  assert.equal(sent.requestId, "deploy-42");
  assert.equal(fake.headers("MigrateRuns")[0]!.get("authorization"), "Bearer t0ken");

  assert.equal(operation.kind, "MIGRATE");
  assert.equal(operation.status, "PENDING");
  assert.equal(operation.created, true);
  assert.equal(operation.targetVersion, 2);
  assert.deepEqual(operation.nodeMapping, { B: "B2" });
  assert.deepEqual(operation.filter, filter, "the filter comes back as it was given");
});

test("migrateRuns defaults, and waitBulkOperation waits for its end with the incompatible runs in failures", async () => {
  const answers = [migrateOperation(BulkOperationStatus.RUNNING), migrateOperation(BulkOperationStatus.SUCCEEDED, {
    succeeded: 2n,
    failed: 1n,
    failures: [{ runId: "r-3", message: "incompatible: node_changed at node B" }],
  })];
  const fake = new FakeServer({
    MigrateRuns: () => ({ created: false, operation: migrateOperation(BulkOperationStatus.PENDING, { nodeMapping: {} }) }),
    GetBulkOperation: () => ({ operation: answers.shift() }),
  });
  const client = clientOf(fake);
  const started = await client.migrateRuns({ workflow: "order" }, 2);
  const [sent] = fake.requests("MigrateRuns");
  assert.deepEqual(sent.nodeMapping, {});
  assert.equal(sent.requestId, "");
  assert.equal(started.created, false);
  assert.deepEqual(started.nodeMapping, {});

  const done = await client.waitBulkOperation(started.operationId, { timeoutMs: 10_000, maxPollIntervalMs: 20 });
  assert.equal(done.status, "SUCCEEDED");
  assert.equal(done.kind, "MIGRATE");
  assert.deepEqual([done.matched, done.succeeded, done.failed], [3, 2, 1]);
  assert.deepEqual(done.failures, [{ runId: "r-3", message: "incompatible: node_changed at node B" }]);
  assert.deepEqual(fake.requests("GetBulkOperation").map((r) => r.operationId), ["op-7", "op-7"]);
});

test("the other bulk kinds carry no target version", async () => {
  const fake = new FakeServer({ GetBulkOperation: () => ({ operation: { operationId: "op-1", kind: BulkOperationKind.CANCEL, status: BulkOperationStatus.RUNNING } }) });
  const operation = await clientOf(fake).getBulkOperation("op-1");
  assert.equal(operation.kind, "CANCEL");
  assert.equal(operation.targetVersion, 0);
  assert.deepEqual(operation.nodeMapping, {});
});

test("migrateRuns refuses a filter without a workflow or a bad target version before any call, and decodes the server's refusal", async () => {
  const fake = new FakeServer({
    MigrateRuns: () => {
      throw wireError(Code.InvalidArgument, "no such version", [
        { type: "google.rpc.BadRequest", value: badRequest([["target_version", "order has no version 9"]]) },
      ]);
    },
  });
  const client = clientOf(fake);
  const bad: [unknown, unknown, unknown, RegExp][] = [
    [{ labels: { batch: "b1" } }, 2, {}, /migrateRuns needs filter\.workflow/],
    [{ workflow: "order" }, 0, {}, /targetVersion must be a registered version \(a positive integer\), not 0/],
    [{ workflow: "order" }, 2.5, {}, /not 2\.5/],
    [{ workflow: "order" }, 2, { nodeMapping: { B: "" } }, /nodeMapping maps "B" to ""/],
  ];
  for (const [filter, version, options, message] of bad) {
    await assert.rejects(
      client.migrateRuns(filter as never, version as number, options as never),
      (e: unknown) => e instanceof TypeError && message.test(e.message),
      String(message),
    );
  }
  assert.equal(fake.calls.length, 0);

  const refused = await client.migrateRuns({ workflow: "order" }, 9).catch((e: unknown) => e);
  assert.ok(isInvalidArgument(refused), String(refused));
  assert.deepEqual(refused.fieldViolations.map((v) => v.field), ["target_version"]);
});
