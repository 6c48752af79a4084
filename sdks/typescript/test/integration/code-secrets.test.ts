// A CODE node's secrets against the real server and the SDK's JavaScript code runner
// (docs/secrets.md): a secret set with setSecret reaches the snippet that declares it, under
// `input.secrets`, and comes back as `[secret NAME]`; a snippet that declares none gets nothing (its
// runner is handed no value); a declared secret that is not set fails the attempt with
// SECRET_UNAVAILABLE. The namespace is the file's own (a token minted for it).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { format } from "node:util";
import { describe, test } from "node:test";

import type { Interceptor } from "@connectrpc/connect";

import { Client, type Logger } from "../../src/index.js";
import type { PollTasksResponse } from "../../src/gen/composer/v1/worker_service_pb.js";
import { useServer, final, hex, mintToken, serving, worker as makeWorker } from "./harness.js";

const stack = useServer();

/** What the runner was handed with each task, by node: the names in Task.secrets (values kept aside). */
class HandOuts {
  readonly names = new Map<string, string[]>();
  readonly values: string[] = [];
  readonly interceptor: Interceptor = (next) => async (request) => {
    const response = await next(request);
    if (!response.stream && request.method.name === "PollTasks") {
      for (const task of (response.message as unknown as PollTasksResponse).tasks) {
        this.names.set(task.nodeId, Object.keys(task.secrets).sort());
        this.values.push(...Object.values(task.secrets));
      }
    }
    return response;
  };
}

/** A logger keeping every line the worker writes, at every level. */
function keptLines(): { lines: string[]; logger: Logger } {
  const lines: string[] = [];
  const at = (level: string) => (message: string, ...args: unknown[]) => lines.push(`${level} ${format(message, ...args)}`);
  return { lines, logger: { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") } };
}

describe("CODE node secrets (JavaScript code runner)", { timeout: 180_000 }, () => {
  test("a declared secret reaches the snippet and comes back redacted; an undeclared one never reaches it", async () => {
    const s = hex();
    const token = mintToken(["admin"], { namespace: `code-secrets-${s}` });
    const client = new Client({ address: stack.server.address, token });
    const handOuts = new HandOuts();
    const log = keptLines();
    const runner = makeWorker(stack.server.address, { token, slots: 2, interceptors: [handOuts.interceptor], logger: log.logger });
    runner.serveCode({ timeLimitMs: 10_000 });
    const value = `sk_live_${hex(16)}`;
    const workflow = `
name: code-secrets-${s}
nodes:
  - id: sign
    type: CODE
    language: javascript
    secrets: [k]
    input: { payload: "\${input.payload}" }
    code: |
      console.log('signing with', input.secrets.k);
      ({ echo: input.secrets.k, len: input.secrets.k.length, payload: input.payload })
  - id: blind
    type: CODE
    language: javascript
    input: { payload: "\${input.payload}" }
    code: |
      let env;
      try { env = process.env } catch (e) { env = 'refused: ' + e.message }
      ({ has: 'secrets' in input, secrets: input.secrets === undefined ? null : input.secrets, env })
edges:
  - { from: sign, to: blind }
output: { signed: "\${nodes.sign.output}", blind: "\${nodes.blind.output}" }
`;
    try {
      await client.setSecret("k", value);
      await client.registerWorkflow(workflow);
      await serving(runner, async () => {
        const started = await client.startRun(`code-secrets-${s}`, { payload: "p-1" });
        const run = await final(client, started.runId);
        assert.equal(run.status, "COMPLETED", JSON.stringify(run.error ?? run.nodes.map((n) => n.error)));
        const output = run.output as { signed: Record<string, unknown>; blind: Record<string, unknown> };
        assert.deepEqual(output.signed, { echo: "[secret k]", len: value.length, payload: "p-1" });
        assert.equal(output.blind["has"], false);
        assert.equal(output.blind["secrets"], null);
        assert.match(String(output.blind["env"]), /^refused: process is refused/);

        // the task input carries the names only; the runner was handed the value for `sign` alone
        const sign = run.nodes.find((n) => n.nodeId === "sign");
        assert.deepEqual((sign?.input as { secrets?: unknown }).secrets, ["k"]);
        assert.deepEqual(handOuts.names.get("sign"), ["k"]);
        assert.deepEqual(handOuts.names.get("blind"), []);
        assert.deepEqual(handOuts.values, [value]);

        // nowhere to be seen: the run, its history, the runner's log, the server's log
        assert.ok(!JSON.stringify(run).includes(value), "the run shows the value");
        const history: unknown[] = [];
        for await (const event of client.getRunHistory(started.runId)) history.push({ ...event, sequence: String(event.sequence) });
        assert.ok(history.length > 0 && !JSON.stringify(history).includes(value), "the history holds the value");
        assert.ok(log.lines.some((l) => l.includes("signing with [secret k]")), `the snippet's log line, redacted:\n${log.lines.join("\n")}`);
        assert.ok(!log.lines.some((l) => l.includes(value)), `the runner logged the value:\n${log.lines.join("\n")}`);
        assert.ok(!readFileSync(stack.server.logPath, "utf8").includes(value), "the server logged the value");
      });
    } finally {
      client.close();
    }
  });

  test("a declared secret that is not set fails the attempt with SECRET_UNAVAILABLE", async () => {
    const s = hex();
    const token = mintToken(["admin"], { namespace: `code-secrets-unset-${s}` });
    const client = new Client({ address: stack.server.address, token });
    const handOuts = new HandOuts();
    const runner = makeWorker(stack.server.address, { token, slots: 2, interceptors: [handOuts.interceptor], logger: keptLines().logger });
    runner.serveCode({ timeLimitMs: 10_000 });
    const workflow = `
name: code-secrets-unset-${s}
nodes:
  - id: sign
    type: CODE
    language: javascript
    secrets: [never_set]
    retry: { max_attempts: 1 }
    code: |
      ({ ran: true })
`;
    try {
      await client.registerWorkflow(workflow);
      await serving(runner, async () => {
        const started = await client.startRun(`code-secrets-unset-${s}`, {});
        const run = await final(client, started.runId);
        assert.equal(run.status, "FAILED");
        const node = run.nodes.find((n) => n.nodeId === "sign");
        assert.equal(node?.error?.code, "SECRET_UNAVAILABLE", JSON.stringify(node?.error));
        assert.equal(node?.attempt, 1);
        assert.equal(handOuts.names.has("sign"), false, "the snippet's task was never handed to the runner");
      });
    } finally {
      client.close();
    }
  });
});
