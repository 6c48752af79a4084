// replayRun and checkWorkflowVersion against the real server (docs/versions.md): runs of a v1
// (A -> B -> C) waiting in B, replayed online and offline against a v2 that appends D (compatible)
// and a v3 that renames B's task (incompatible), and checked in flight and completed.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { Client } from "../../src/index.js";
import {
  BINARY,
  REPO,
  ServerProcess,
  backingServices,
  mintToken,
  orderSource,
  registerVersions,
  runsWaitingInB,
  serving,
  worker as makeWorker,
} from "./harness.js";

let services: ReturnType<typeof backingServices>;
let server: ServerProcess;
let adminToken: string;

before(async () => {
  services = backingServices();
  adminToken = mintToken(["admin"]);
  process.env["COMPOSER_TOKEN"] = adminToken;
  server = new ServerProcess(services.databaseUrl, services.redisUrl);
  await server.start();
});

after(async () => {
  await server?.stop();
  services?.drop();
});

/** What `composer run history RUN_ID -o json` writes for the run, by the CLI itself. */
function cliHistory(runId: string): string {
  return execFileSync(BINARY, ["run", "history", runId, "-o", "json", "--address", `http://${server.address}`], {
    env: { ...process.env, COMPOSER_TOKEN: adminToken },
    encoding: "utf8",
  });
}

describe("versions", { timeout: 300_000 }, () => {
  test("replayRun online: the run waiting in B against each version, by version and by source", async () => {
    const client = new Client({ address: server.address });
    try {
      const { name, queues, v2 } = await registerVersions(client, "replay-online");
      const [runId] = await runsWaitingInB(server.address, client, name, queues, 1);

      const same = await client.replayRun({ runId: runId!, version: 1 });
      assert.equal(same.verdict, "IDENTICAL", JSON.stringify(same));
      assert.equal(same.runId, runId);
      assert.equal(same.workflowVersion, 1);
      assert.equal(same.status, "RUNNING");
      assert.ok(same.events > 0, `events replayed: ${same.events}`);

      const appended = await client.replayRun({ runId: runId!, version: 2 });
      assert.equal(appended.verdict, "COMPATIBLE", JSON.stringify(appended));
      assert.equal(appended.divergence, null);
      assert.deepEqual(
        appended.differences.map((d) => [d.kind, d.nodeId]),
        [["node_added", "D"]],
      );
      const bySource = await client.replayRun({ runId: runId!, source: v2 });
      assert.deepEqual(bySource, appended, "the text of v2 answers as v2 does");

      const renamedTask = await client.replayRun({ runId: runId!, version: 3 });
      assert.equal(renamedTask.verdict, "INCOMPATIBLE", JSON.stringify(renamedTask));
      assert.equal(renamedTask.divergence?.rule, "node_changed");
      assert.equal(renamedTask.divergence?.nodeId, "B");
      assert.ok((renamedTask.divergence?.sequence ?? 0) > 0);
      assert.deepEqual(renamedTask.differences, []);

      // B renamed to B2 in the new definition: the mapping carries the run over.
      const renamedNode = orderSource(name, queues).replace("id: B,", "id: B2,").replace("from: A, to: B }", "from: A, to: B2 }").replace("from: B, to: C", "from: B2, to: C");
      const mapped = await client.replayRun({ runId: runId!, source: renamedNode, nodeMapping: { B: "B2" } });
      assert.equal(mapped.verdict, "COMPATIBLE", JSON.stringify(mapped));
      assert.ok(mapped.differences.some((d) => d.kind === "node_renamed"), JSON.stringify(mapped.differences));
      const unmapped = await client.replayRun({ runId: runId!, source: renamedNode });
      assert.equal(unmapped.verdict, "INCOMPATIBLE", JSON.stringify(unmapped));
    } finally {
      client.close();
    }
  });

  test("replayRun offline: the history the CLI wrote, as text and parsed, and the fixture of the repository", async () => {
    const client = new Client({ address: server.address });
    try {
      const { name, queues, v2, v3 } = await registerVersions(client, "replay-offline");
      const [runId] = await runsWaitingInB(server.address, client, name, queues, 1);
      const written = cliHistory(runId!);
      const parsed = JSON.parse(written) as Record<string, unknown>;
      assert.ok("next_page_token" in parsed, "the CLI writes the page token beside the run");

      const compatible = await client.replayRun({ history: written, source: v2 });
      assert.equal(compatible.verdict, "COMPATIBLE", JSON.stringify(compatible));
      assert.equal(compatible.runId, runId);
      assert.deepEqual(
        compatible.differences.map((d) => [d.kind, d.nodeId]),
        [["node_added", "D"]],
      );
      const incompatible = await client.replayRun({ history: parsed, source: v3 });
      assert.equal(incompatible.verdict, "INCOMPATIBLE", JSON.stringify(incompatible));
      assert.equal(incompatible.divergence?.rule, "node_changed");
      assert.equal(incompatible.divergence?.nodeId, "B");
      // The same verdict as online, where the server reads the run itself.
      assert.deepEqual(incompatible, await client.replayRun({ runId: runId!, version: 3 }));

      // A run of a workflow this server has never seen: nothing of it is read.
      const fixture = readFileSync(join(REPO, "tests", "fixtures", "replay", "order-waiting-in-b.history.json"), "utf8");
      const own = (JSON.parse(fixture) as { workflow: { source: string } }).workflow.source;
      const identical = await client.replayRun({ history: fixture, source: own });
      assert.equal(identical.verdict, "IDENTICAL", JSON.stringify(identical));
      assert.equal(identical.runId, "01a24a4f-f8a8-72a9-b54a-0bca93fd712a");
      const withD = `${own.replace("edges:", "  - { id: D, type: TASK, queue: replay, task: d }\nedges:")}  - { from: C, to: D }\n`;
      const fixtureCompatible = await client.replayRun({ history: fixture, source: withD });
      assert.equal(fixtureCompatible.verdict, "COMPATIBLE", `${withD}\n${JSON.stringify(fixtureCompatible)}`);
      assert.deepEqual(
        fixtureCompatible.differences.map((d) => [d.kind, d.nodeId]),
        [["node_added", "D"]],
      );
    } finally {
      client.close();
    }
  });

  test("checkWorkflowVersion counts every run in flight over the pages, and the completed ones up to a limit", async () => {
    const client = new Client({ address: server.address });
    try {
      const { name, queues } = await registerVersions(client, "check");
      // Two runs of v1 that completed ...
      const all = makeWorker(server.address, { slots: 2 });
      all.task(queues.a, "a", () => ({ amount: 30 }));
      for (const task of ["b", "c"]) all.task(queues.rest, task, () => ({ ok: true }));
      const completed = await serving(all, async () => {
        const ids: string[] = [];
        for (let i = 0; i < 2; i++) {
          const run = await client.startRun(name, { customer: `done-${i}` }, { version: 1 });
          assert.equal((await client.waitForRun(run.runId, { timeoutMs: 60_000 })).status, "COMPLETED");
          ids.push(run.runId);
        }
        return ids;
      });
      // ... and three waiting in B.
      const waiting = await runsWaitingInB(server.address, client, name, queues, 3);

      const identical = await client.checkWorkflowVersion(name, { version: 1 });
      assert.deepEqual(identical, { checked: 3, identical: 3, compatible: 0, incompatible: 0, unreplayable: 0, runs: [] });

      const compatible = await client.checkWorkflowVersion(name, { version: 2, pageSize: 2 });
      assert.deepEqual(
        { ...compatible, runs: [] },
        { checked: 3, identical: 0, compatible: 3, incompatible: 0, unreplayable: 0, runs: [] },
        "summed over two pages",
      );
      assert.deepEqual(compatible.runs.map((r) => r.runId).sort(), [...waiting].sort());
      assert.ok(compatible.runs.every((r) => r.verdict === "COMPATIBLE" && r.differences.some((d) => d.kind === "node_added" && d.nodeId === "D")));

      const incompatible = await client.checkWorkflowVersion(name, { version: 3, pageSize: 1 });
      assert.deepEqual(
        { ...incompatible, runs: [] },
        { checked: 3, identical: 0, compatible: 0, incompatible: 3, unreplayable: 0, runs: [] },
        "summed over three pages",
      );
      assert.deepEqual(incompatible.runs.map((r) => r.runId).sort(), [...waiting].sort());
      assert.ok(incompatible.runs.every((r) => r.verdict === "INCOMPATIBLE" && r.divergence?.rule === "node_changed" && r.divergence.nodeId === "B"));

      const done = await client.checkWorkflowVersion(name, { version: 1, scope: "COMPLETED" });
      assert.deepEqual(done, { checked: 2, identical: 2, compatible: 0, incompatible: 0, unreplayable: 0, runs: [] });
      const newest = await client.checkWorkflowVersion(name, { version: 1, scope: "COMPLETED", limit: 1 });
      assert.equal(newest.checked, 1);
      // A completed run that v2 would continue with D is not one v2 could have run.
      const ended = await client.checkWorkflowVersion(name, { version: 2, scope: "COMPLETED", limit: 5, pageSize: 1 });
      assert.equal(ended.checked, 2);
      assert.equal(ended.incompatible, 2, JSON.stringify(ended));
      assert.deepEqual(ended.runs.map((r) => r.runId).sort(), [...completed].sort());
      assert.ok(ended.runs.every((r) => r.status === "COMPLETED"));
    } finally {
      client.close();
    }
  });
});
