// migrateRuns against the real server (docs/versions.md): a run of v1 (A -> B -> C) waiting in B
// moves to a v2 that appends D and goes on there to run D; a run a v3 cannot continue (B's task
// renamed) is counted failed with its divergence and stays on v1.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Client } from "../../src/index.js";
import {
  ServerProcess,
  backingServices,
  historyTypes,
  mintToken,
  registerVersions,
  runsWaitingInB,
  serving,
  worker as makeWorker,
  type Queues,
} from "./harness.js";

let services: ReturnType<typeof backingServices>;
let server: ServerProcess;

before(async () => {
  services = backingServices();
  process.env["COMPOSER_TOKEN"] = mintToken(["admin"]);
  server = new ServerProcess(services.databaseUrl, services.redisUrl);
  await server.start();
});

after(async () => {
  await server?.stop();
  services?.drop();
});

/** A worker of every task B, C and D might be (on the queue no worker served while the runs waited). */
function restWorker(queues: Queues, ran: string[]) {
  const worker = makeWorker(server.address, { slots: 2 });
  for (const task of ["b", "b_renamed", "c", "d"]) {
    worker.task(queues.rest, task, (ctx) => {
      ran.push(`${ctx.nodeId}:${task}:v${ctx.workflowVersion}`);
      return { ran: task };
    });
  }
  return worker;
}

describe("migrate", { timeout: 300_000 }, () => {
  test("migrateRuns moves a run waiting in B to the version that appends D, where it runs D", async () => {
    const client = new Client({ address: server.address });
    try {
      const { name, queues } = await registerVersions(client, "migrate");
      const [runId] = await runsWaitingInB(server.address, client, name, queues, 1);

      const started = await client.migrateRuns({ workflow: name }, 2, { requestId: `deploy-${name}` });
      assert.equal(started.kind, "MIGRATE");
      assert.equal(started.targetVersion, 2);
      assert.equal(started.created, true);
      assert.equal(started.filter.workflow, name);
      const again = await client.migrateRuns({ workflow: name }, 2, { requestId: `deploy-${name}` });
      assert.equal(again.operationId, started.operationId, "the same request id gives the same operation");
      assert.equal(again.created, false);

      const done = await client.waitBulkOperation(started.operationId, { timeoutMs: 60_000 });
      assert.equal(done.status, "SUCCEEDED", JSON.stringify(done));
      assert.equal(done.kind, "MIGRATE");
      assert.equal(done.targetVersion, 2);
      assert.deepEqual([done.matched, done.succeeded, done.skipped, done.failed], [1, 1, 0, 0], JSON.stringify(done));
      assert.deepEqual(done.failures, []);
      assert.equal((await client.getRun(runId!)).workflowVersion, 2);

      const ran: string[] = [];
      const finished = await serving(restWorker(queues, ran), () => client.waitForRun(runId!, { timeoutMs: 60_000 }));
      assert.equal(finished.status, "COMPLETED", JSON.stringify(finished.error));
      assert.equal(finished.workflowVersion, 2);
      assert.deepEqual(ran, ["B:b:v2", "C:c:v2", "D:d:v2"]);
      assert.deepEqual(
        finished.nodes.map((n) => [n.nodeId, n.status]).sort(),
        [
          ["A", "COMPLETED"],
          ["B", "COMPLETED"],
          ["C", "COMPLETED"],
          ["D", "COMPLETED"],
        ],
      );
      const history = await historyTypes(client, runId!);
      assert.ok(history.includes("run_migrated"), history.join(","));
      assert.ok(history.indexOf("run_migrated") < history.lastIndexOf("node_completed"), history.join(","));
    } finally {
      client.close();
    }
  });

  test("migrateRuns counts a run the target cannot continue as failed, with its divergence, and leaves it on its version", async () => {
    const client = new Client({ address: server.address });
    try {
      const { name, queues } = await registerVersions(client, "migrate-no");
      const [runId] = await runsWaitingInB(server.address, client, name, queues, 1);

      const started = await client.migrateRuns({ workflow: name, statuses: ["RUNNING"] }, 3);
      const done = await client.waitBulkOperation(started.operationId, { timeoutMs: 60_000 });
      assert.equal(done.status, "SUCCEEDED", JSON.stringify(done));
      assert.deepEqual([done.matched, done.succeeded, done.failed], [1, 0, 1], JSON.stringify(done));
      assert.equal(done.failures.length, 1);
      assert.equal(done.failures[0]!.runId, runId);
      assert.match(done.failures[0]!.message, /node_changed/);

      const ran: string[] = [];
      const finished = await serving(restWorker(queues, ran), () => client.waitForRun(runId!, { timeoutMs: 60_000 }));
      assert.equal(finished.status, "COMPLETED");
      assert.equal(finished.workflowVersion, 1);
      assert.deepEqual(ran, ["B:b:v1", "C:c:v1"]);
      assert.ok(!(await historyTypes(client, runId!)).includes("run_migrated"));
    } finally {
      client.close();
    }
  });
});
