// The SDK conformance behaviours (tests/conformance/README.md) against the real server.
// Each test is named after its number: c01 ... c19.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";

import { createClient, type Interceptor } from "@connectrpc/connect";

import {
  Client,
  ComposerError,
  NonRetryableError,
  RunFailedError,
  TaskCancelledError,
  TimeoutError,
  createNodeTransport,
  isAlreadyExists,
  isFailedPrecondition,
  isInvalidArgument,
  isLeaseLost,
  isNotFound,
  isPermissionDenied,
  isUnauthenticated,
  toComposerError,
  type BulkOperation,
  type CancelKind,
  type HistoryEvent,
  type Run,
} from "../../src/index.js";
import { WorkerService, type CompleteTaskRequest, type PollTasksRequest } from "../../src/gen/composer/v1/worker_service_pb.js";
import {
  ServerProcess,
  WorkerProcess,
  backingServices,
  final,
  hex,
  historyTypes,
  mintToken,
  oneTask,
  serving,
  threeStep,
  until,
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
  const started = Date.now();
  await server?.stop();
  services?.drop();
  console.error(`# server stopped and database dropped in ${Date.now() - started} ms`);
  if (process.env["TS_DEBUG_HANDLES"]) {
    setTimeout(() => {
      const handles = (process as unknown as { _getActiveHandles(): unknown[] })._getActiveHandles();
      console.error("# handles:", handles.map((h) => (h as { constructor: { name: string } }).constructor.name + " " + String((h as { remoteAddress?: string; remotePort?: number }).remotePort ?? "")).join(", "));
    }, 2_000).unref();
  }
});

function newClient(address = server.address): Client {
  return new Client({ address });
}

/** Records every unary request a worker sends, by method name. */
class Recorder {
  readonly calls: { method: string; message: unknown }[] = [];
  readonly interceptor: Interceptor = (next) => async (request) => {
    if (!request.stream) this.calls.push({ method: request.method.name, message: request.message });
    return next(request);
  };
  requests<T>(method: string): T[] {
    return this.calls.filter((c) => c.method === method).map((c) => c.message as T);
  }
}

describe("conformance", { timeout: 600_000 }, () => {
  test("c01 a worker completes a three-step workflow and the client gets its output", async () => {
    const s = hex();
    const worker = makeWorker(server.address, { slots: 2 });
    const seen: [string, number, string, string][] = [];
    worker.task(`c01-${s}`, "add_one", async (ctx) => {
      seen.push([ctx.nodeId, ctx.attempt, ctx.workflowName, ctx.runId]);
      return { x: ctx.input.x + 1 };
    });
    worker.task(`c01-${s}`, "double", (ctx) => {
      // a sync handler
      seen.push([ctx.nodeId, ctx.attempt, ctx.workflowName, ctx.runId]);
      return { x: ctx.input.x * 2 };
    });
    worker.task(`c01-${s}`, "describe", async (ctx) => {
      seen.push([ctx.nodeId, ctx.attempt, ctx.workflowName, ctx.runId]);
      return { value: ctx.input.x, run: ctx.runId };
    });
    const client = newClient();
    try {
      await serving(worker, async () => {
        const registered = await client.registerWorkflow(threeStep(s));
        assert.equal(registered.name, `c01-${s}`);
        assert.equal(registered.version, 1);
        assert.equal(registered.created, true);
        const run = await client.startRun(registered.name, { x: 4 });
        const output = await client.waitForResult(run.runId, { timeoutMs: 60_000 });
        assert.deepEqual(output, { result: { value: 10, run: run.runId } });
        const done = await client.getRun(run.runId);
        assert.equal(done.status, "COMPLETED");
        assert.deepEqual(
          done.nodes.map((n) => [n.nodeId, n.nodeType, n.status, n.attempt]).sort(),
          [
            ["a", "TASK", "COMPLETED", 1],
            ["b", "TASK", "COMPLETED", 1],
            ["c", "TASK", "COMPLETED", 1],
          ],
        );
        assert.deepEqual(seen, [
          ["a", 1, registered.name, run.runId],
          ["b", 1, registered.name, run.runId],
          ["c", 1, registered.name, run.runId],
        ]);
      });
    } finally {
      client.close();
    }
    assert.equal(worker.stats.completed, 3);
  });

  test("c02 slots bound concurrency and every task finishes", async () => {
    const s = hex();
    const queue = `c02-${s}`;
    const polls: number[] = [];
    let overAsked = 0;
    const recorder: Interceptor = (next) => async (request) => {
      if (request.method.name === "PollTasks") {
        const asked = (request.message as unknown as { maxTasks: number }).maxTasks;
        polls.push(asked);
        if (asked + running > 4) overAsked += 1; // never more than the free slots
      }
      return next(request);
    };
    const worker = makeWorker(server.address, { slots: 4, interceptors: [recorder] });
    let running = 0;
    let peak = 0;
    worker.task(queue, "slow", async (ctx) => {
      running += 1;
      peak = Math.max(peak, running);
      try {
        await sleep(1_000);
      } finally {
        running -= 1;
      }
      return Number(ctx.input.n);
    });
    const client = newClient();
    try {
      await client.registerWorkflow(oneTask(queue, queue, "slow", 'input: { n: "${input.n}" }'));
      const runs: Run[] = [];
      for (let n = 0; n < 20; n++) runs.push(await client.startRun(queue, { n }));
      const started = Date.now();
      const outputs = await serving(worker, () => Promise.all(runs.map((r) => client.waitForResult(r.runId, { timeoutMs: 90_000 }))));
      const elapsed = Date.now() - started;
      assert.deepEqual(outputs, runs.map((_, n) => ({ result: n })));
      assert.equal(peak, 4);
      assert.equal(worker.maxConcurrencySeen, 4);
      assert.ok(elapsed >= 5_000, `20 tasks of 1 s, 4 at a time, took ${elapsed} ms`);
      assert.ok(polls.length > 0 && polls.every((m) => m >= 1 && m <= 4), `max_tasks asked: ${polls.join(",")}`);
      assert.equal(overAsked, 0, "a poll asked for more tasks than free slots");
    } finally {
      client.close();
    }
  });

  test("c03 heartbeats keep a task alive past its lease", async () => {
    const s = hex();
    const queue = `c03-${s}`;
    const worker = makeWorker(server.address, { slots: 1 });
    const attempts: number[] = [];
    worker.task(queue, "long", async (ctx) => {
      attempts.push(ctx.attempt);
      await sleep(7_000); // 3.5 leases of 2 s
      return "survived";
    });
    const client = newClient();
    try {
      await serving(worker, async () => {
        await client.registerWorkflow(oneTask(queue, queue, "long", "heartbeat_timeout: 2s\nretry: { max_attempts: 3 }"));
        const run = await client.startRun(queue);
        assert.deepEqual(await client.waitForResult(run.runId, { timeoutMs: 60_000 }), { result: "survived" });
        const history = await historyTypes(client, run.runId);
        assert.ok(!history.some((t) => t.toLowerCase().includes("expired")), history.join(","));
      });
    } finally {
      client.close();
    }
    assert.deepEqual(attempts, [1]);
    assert.equal(worker.stats.leaseLost, 0);
  });

  test("c04 a task whose run is cancelled sees its cancellation", async () => {
    const s = hex();
    const queue = `c04-${s}`;
    const worker = makeWorker(server.address, { slots: 2 });
    let started = false;
    const reasons: { kind: CancelKind; reason: string; ctxReason: string | undefined }[] = [];
    let cancelledAt = 0;
    let seenAfter = -1;
    worker.task(queue, "wait", async (ctx) => {
      started = true;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 120_000);
        ctx.signal.addEventListener("abort", () => {
          clearTimeout(timer);
          seenAfter = Date.now() - cancelledAt;
          const reason = ctx.signal.reason as TaskCancelledError;
          assert.ok(reason instanceof TaskCancelledError);
          reasons.push({ kind: reason.kind, reason: reason.reason, ctxReason: ctx.cancelReason });
          resolve();
        });
      });
      ctx.throwIfCancelled();
      return "unreachable";
    });
    const client = newClient();
    try {
      await serving(worker, async () => {
        await client.registerWorkflow(oneTask(queue, queue, "wait", "heartbeat_timeout: 3s"));
        const run = await client.startRun(queue);
        await until(() => started, 30_000, "the handler to start");
        cancelledAt = Date.now();
        await client.cancelRun(run.runId, "conformance C4");
        await until(() => reasons.length > 0, 15_000, "the handler to see the cancellation");
        const ended = await final(client, run.runId);
        assert.equal(ended.status, "CANCELLED");
        await assert.rejects(client.cancelRun(run.runId), (e) => isFailedPrecondition(e));
        assert.deepEqual(ended.error && { code: ended.error.code, message: ended.error.message }, { code: "CANCELLED", message: "conformance C4" });
        await assert.rejects(
          client.waitForResult(run.runId, { timeoutMs: 10_000 }),
          (e) => e instanceof RunFailedError && e.run.status === "CANCELLED" && e.code === "CANCELLED" && e.reason === "conformance C4",
        );
      });
    } finally {
      client.close();
    }
    // The handler sees the reason given to CancelRun; the kind says what fired the signal.
    assert.deepEqual(reasons, [{ kind: "run cancelled", reason: "conformance C4", ctxReason: "conformance C4" }]);
    assert.ok(seenAfter >= 0 && seenAfter < 3_000, `seen ${seenAfter} ms after the cancel`);
    assert.equal(worker.stats.completed, 0);
    assert.equal(worker.stats.failed, 0);
    assert.equal(worker.stats.cancelled, 1);
  });

  test("c05 a worker killed mid-task has its task run again as attempt 2", async () => {
    const s = hex();
    const queue = `c05-${s}`;
    const first = new WorkerProcess(server.address, queue, { slots: 1, seconds: 120 });
    let second: WorkerProcess | undefined;
    const client = newClient();
    try {
      await client.registerWorkflow(oneTask(queue, queue, "slow", "heartbeat_timeout: 2s\nretry: { max_attempts: 3, initial_interval: 100ms }"));
      const run = await client.startRun(queue);
      const [began] = await first.waitFor("started");
      assert.equal(began?.["attempt"], 1);
      assert.equal(began?.["run_id"], run.runId);
      // Killed once its lease is confirmed: before that the task would come back as attempt 1 (C15).
      await first.waitFor("heartbeat");
      first.process.kill("SIGKILL");
      await first.exited;
      second = new WorkerProcess(server.address, queue, { slots: 1, seconds: 120 });
      const output = await client.waitForResult(run.runId, { timeoutMs: 90_000 });
      const [again] = await second.waitFor("finished");
      const node = (await client.getRun(run.runId)).nodes.find((n) => n.nodeId === "work");
      assert.equal(again?.["task_id"], began?.["task_id"]);
      assert.equal(again?.["attempt"], 2);
      assert.deepEqual(output, { result: { pid: second.process.pid, attempt: 2 } });
      assert.equal(node?.attempt, 2);
      assert.equal(node?.status, "COMPLETED");
    } finally {
      first.kill();
      second?.kill();
      client.close();
    }
  });

  test("c06 a late report after the lease was lost is refused and not retried", async () => {
    const s = hex();
    const queue = `c06-${s}`;
    const recorder = new Recorder();
    // No heartbeats (interval far past the lease): the first attempt's lease expires.
    const worker = makeWorker(server.address, { slots: 2, heartbeatIntervalMs: 3_600_000, interceptors: [recorder.interceptor] });
    let secondDone = false;
    worker.task(queue, "late", async (ctx) => {
      if (ctx.attempt === 1) {
        await until(() => secondDone, 60_000, "attempt 2");
        await sleep(500);
      } else {
        secondDone = true;
      }
      return { attempt: ctx.attempt };
    });
    const client = newClient();
    try {
      await serving(worker, async () => {
        await client.registerWorkflow(oneTask(queue, queue, "late", "heartbeat_timeout: 2s\nretry: { max_attempts: 3, initial_interval: 100ms }"));
        const run = await client.startRun(queue);
        assert.deepEqual(await client.waitForResult(run.runId, { timeoutMs: 90_000 }), { result: { attempt: 2 } });
        await until(() => worker.stats.leaseLost >= 1, 30_000, "the late report to be refused");
        await sleep(1_000); // time in which a retry would show
      });
      const completes = recorder.requests<CompleteTaskRequest>("CompleteTask");
      const first = completes.filter((r) => r.attempt === 1);
      assert.equal(first.length, 1, "the refused report must not be sent again");
      assert.equal(completes.filter((r) => r.attempt === 2).length, 1);
      assert.equal(recorder.requests("FailTask").length, 0, "no FailTask instead");
      assert.equal(worker.stats.reportRetries, 0);
      // The server's answer itself: the stale report once more, sent raw.
      const { transport, close } = createNodeTransport(server.address);
      try {
        const raw = createClient(WorkerService, transport);
        const error = await raw.completeTask(first[0] as CompleteTaskRequest, { headers: { authorization: `Bearer ${adminToken}` }, timeoutMs: 10_000 }).then(
          () => undefined,
          (e: unknown) => toComposerError(e),
        );
        assert.ok(error instanceof ComposerError);
        assert.ok(isLeaseLost(error));
        assert.equal(error.code, "FAILED_PRECONDITION");
        assert.equal(error.reason, "LEASE_LOST");
      } finally {
        close();
      }
    } finally {
      client.close();
    }
  });

  test("c07 a server restart under a running worker", async () => {
    const s = hex();
    const queue = `c07-${s}`;
    const own = new ServerProcess(services.databaseUrl, services.redisUrl);
    await own.start();
    const worker = makeWorker(own.address, { slots: 2 });
    let release = false;
    worker.task(queue, "step", async (ctx) => {
      if (ctx.input.hold) await until(() => release, 60_000, "release");
      return { attempt: ctx.attempt, n: ctx.input.n };
    });
    const client = newClient(own.address);
    try {
      await serving(worker, async () => {
        await client.registerWorkflow(oneTask(queue, queue, "step", 'heartbeat_timeout: 10s\ninput: "${input}"'));
        const before = await client.startRun(queue, { n: 1 });
        assert.deepEqual(await client.waitForResult(before.runId, { timeoutMs: 30_000 }), { result: { attempt: 1, n: 1 } });
        const held = await client.startRun(queue, { n: 2, hold: true });
        await until(() => worker.inFlight === 1, 30_000, "the held task to start");
        // A watch open across the restart reconnects by itself and still sees the end.
        const snapshots: string[] = [];
        const watched = (async () => {
          for await (const run of client.watchRun(held.runId)) snapshots.push(run.status);
          return snapshots;
        })();
        await until(() => snapshots.length >= 1, 10_000, "the first snapshot");
        // SIGTERM; the server's graceful stop waits for open WatchRun streams (reported to the
        // lead), so it is killed after 5 s here.
        await own.restart(5_000);
        release = true; // its report meets a server that just came back
        const later = await startWithRetry(client, queue, { n: 3 });
        const results = await Promise.all([
          client.waitForResult(held.runId, { timeoutMs: 90_000 }),
          client.waitForResult(later.runId, { timeoutMs: 90_000 }),
        ]);
        assert.equal((await watched).at(-1), "COMPLETED");
        assert.equal((results[0] as { result: { n: number } }).result.n, 2);
        assert.equal((results[1] as { result: { n: number } }).result.n, 3);
      });
    } finally {
      client.close();
      await own.stop();
    }
    assert.ok(worker.stats.pollErrors >= 1, "the worker saw the server go away");
  });

  test("c08 SIGTERM drains in-flight tasks and polls nothing new", async () => {
    const s = hex();
    const queue = `c08-${s}`;
    const proc = new WorkerProcess(server.address, queue, { slots: 2, seconds: 3, drainSeconds: 30 });
    const client = newClient();
    try {
      await client.registerWorkflow(oneTask(queue, queue, "slow", "heartbeat_timeout: 2s"));
      await proc.waitFor("ready");
      const runs = [await client.startRun(queue), await client.startRun(queue)];
      await proc.waitFor("started", 2);
      proc.process.kill("SIGTERM");
      // Both slots are busy, so no poll is waiting: a run started now must not reach this worker.
      const late = await client.startRun(queue);
      const exitCode = await proc.exited;
      const outputs = [];
      for (const r of runs) outputs.push(await client.waitForResult(r.runId, { timeoutMs: 10_000 }));
      const lateNode = (await client.getRun(late.runId)).nodes.find((n) => n.nodeId === "work");
      const other = makeWorker(server.address);
      other.task(queue, "slow", async (ctx) => ({ pid: 0, attempt: ctx.attempt }));
      const lateOutput = await serving(other, () => client.waitForResult(late.runId, { timeoutMs: 60_000 }));
      assert.equal(exitCode, 0);
      assert.deepEqual(outputs.map((o) => (o as { result: { pid: number } }).result.pid), [proc.process.pid, proc.process.pid]);
      assert.equal(proc.seen("finished").length, 2);
      assert.equal(proc.seen("exited")[0]?.["completed"], 2);
      assert.equal(proc.seen("exited")[0]?.["polled"], 2);
      assert.ok(lateNode === undefined || lateNode.status !== "COMPLETED");
      assert.deepEqual(lateOutput, { result: { pid: 0, attempt: 1 } });
    } finally {
      proc.kill();
      client.close();
    }
  });

  test("c09 NonRetryableError fails at once, a plain error is retried per the policy", async () => {
    const s = hex();
    const queue = `c09-${s}`;
    const worker = makeWorker(server.address, { slots: 4 });
    const calls: Record<string, number[]> = { final: [], flaky: [], broken: [] };
    worker.task(queue, "final", async (ctx) => {
      calls["final"]?.push(ctx.attempt);
      throw new NonRetryableError("card declined", { code: "DECLINED" });
    });
    worker.task(queue, "flaky", (ctx) => {
      calls["flaky"]?.push(ctx.attempt);
      if (ctx.attempt < 3) throw new Error("try again");
      return "third time lucky";
    });
    worker.task(queue, "broken", async (ctx) => {
      calls["broken"]?.push(ctx.attempt);
      throw new RangeError("always");
    });
    const retry = "retry: { max_attempts: 3, initial_interval: 100ms, backoff: 1.0 }";
    const client = newClient();
    try {
      const ended = await serving(worker, async () => {
        for (const task of Object.keys(calls)) await client.registerWorkflow(oneTask(`c09-${task}-${s}`, queue, task, retry));
        const runs = await Promise.all(Object.keys(calls).map((task) => client.startRun(`c09-${task}-${s}`)));
        return Promise.all(runs.map((r) => final(client, r.runId)));
      });
      const [finalRun, flaky, broken] = ended;
      assert.deepEqual(calls, { final: [1], flaky: [1, 2, 3], broken: [1, 2, 3] });
      assert.equal(finalRun?.status, "FAILED");
      const finalNode = finalRun?.nodes.find((n) => n.nodeId === "work");
      assert.equal(finalNode?.attempt, 1);
      assert.equal(finalNode?.error?.code, "DECLINED");
      assert.equal(flaky?.status, "COMPLETED");
      assert.deepEqual(flaky?.output, { result: "third time lucky" });
      assert.equal(broken?.status, "FAILED");
      const brokenNode = broken?.nodes.find((n) => n.nodeId === "work");
      assert.equal(brokenNode?.attempt, 3);
      assert.equal(brokenNode?.error?.code, "RangeError");
      const details = brokenNode?.error?.details as { stack?: string } | null;
      assert.ok(details, "the server dropped FailTask.details from the node's error");
      assert.match(details.stack ?? "", /RangeError: always\n\s+at /);
    } finally {
      client.close();
    }
    // An unhandled rejection or a thrown non-Error value fails that attempt, never the process
    // (in a process of its own: node:test fails a test whose process sees an unhandled rejection).
    const proc = new WorkerProcess(server.address, queue, { script: "unhandled-process.js" });
    const other = newClient();
    try {
      await proc.waitFor("ready");
      for (const task of ["leaky", "thrower", "fine"]) await other.registerWorkflow(oneTask(`c09-${task}-${s}`, queue, task, retry));
      const leaky = await final(other, (await other.startRun(`c09-leaky-${s}`)).runId);
      const thrower = await final(other, (await other.startRun(`c09-thrower-${s}`)).runId);
      const fine = await other.startRun(`c09-fine-${s}`);
      assert.deepEqual(await other.waitForResult(fine.runId, { timeoutMs: 30_000 }), { result: { pid: proc.process.pid, attempt: 1 } });
      const leakyNode = leaky.nodes.find((n) => n.nodeId === "work");
      assert.equal(leaky.status, "FAILED");
      assert.equal(leakyNode?.attempt, 3);
      assert.equal(leakyNode?.error?.code, "TypeError");
      assert.equal(leakyNode?.error?.message, "left unhandled");
      assert.equal((leakyNode?.error?.details as { unhandledRejection?: boolean }).unhandledRejection, true);
      assert.deepEqual(proc.seen("aborted").map((e) => e["reason"]), ["attempt failed", "attempt failed", "attempt failed"]);
      const throwerNode = thrower.nodes.find((n) => n.nodeId === "work");
      assert.equal(throwerNode?.error?.code, "NON_ERROR_THROWN");
      assert.equal(throwerNode?.attempt, 3);
      assert.match(throwerNode?.error?.message ?? "", /non-Error value: \{"not":"an Error"\}/);
      assert.equal(proc.process.exitCode, null, "the worker process is still running");
      proc.process.kill("SIGTERM");
      assert.equal(await proc.exited, 0);
    } finally {
      proc.kill();
      other.close();
    }
  });

  test("c10 a JavaScript code node runs and an endless snippet is stopped", async () => {
    const s = hex();
    const worker = makeWorker(server.address, { slots: 2 });
    worker.serveCode({ timeLimitMs: 2_000 });
    const workflow = `
name: c10-code-${s}
nodes:
  - id: compute
    type: CODE
    language: javascript
    code: |
      const total = input.items.reduce((sum, item) => sum + item.price * item.qty, 0);
      ({ total, count: input.items.length })
    input: "\${input}"
output: { result: "\${nodes.compute.output}" }
`;
    const endless = `
name: c10-endless-${s}
nodes:
  - id: spin
    type: CODE
    language: javascript
    code: |
      while (true) {}
    retry: { max_attempts: 3, initial_interval: 100ms }
`;
    const client = newClient();
    try {
      await serving(worker, async () => {
        await client.registerWorkflow(workflow);
        await client.registerWorkflow(endless);
        const ok = await client.startRun(`c10-code-${s}`, { items: [{ price: 2.5, qty: 2 }, { price: 1, qty: 3 }] });
        assert.deepEqual(await client.waitForResult(ok.runId, { timeoutMs: 60_000 }), { result: { total: 8, count: 2 } });
        const started = Date.now();
        const spin = await client.startRun(`c10-endless-${s}`);
        const ended = await final(client, spin.runId);
        const elapsed = Date.now() - started;
        assert.equal(ended.status, "FAILED");
        const node = ended.nodes.find((n) => n.nodeId === "spin");
        assert.equal(node?.error?.code, "TIMEOUT");
        assert.equal(node?.attempt, 1); // non-retryable: no second attempt
        assert.match(node?.error?.message ?? "", /time limit/);
        assert.ok(elapsed < 30_000, `took ${elapsed} ms`);
      });
    } finally {
      client.close();
    }
  });

  test("c11 a bad workflow raises an error listing each field violation", async () => {
    const s = hex();
    const bad = `
name: c11-${s}
nodes:
  - id: a
    type: TASK
    queue: q
    task: t
    retry: { max_attempts: 0 }
  - id: b
    type: TASK
    queue: q
    task: t
edges:
  - { from: a, to: nowhere }
`;
    const client = newClient();
    try {
      const error = await client.registerWorkflow(bad).then(
        () => undefined,
        (e: unknown) => e,
      );
      assert.ok(isInvalidArgument(error), String(error));
      assert.equal(error.code, "INVALID_ARGUMENT");
      const fields = error.fieldViolations.map((v) => v.field);
      assert.ok(fields.includes("nodes[0].retry.max_attempts"), fields.join(","));
      assert.ok(fields.some((f) => f.startsWith("edges[0]")), fields.join(","));
      assert.ok(error.fieldViolations.every((v) => v.description));
      const problems = await client.validateWorkflow(bad);
      assert.deepEqual(
        problems.map((p) => [p.path, p.message]),
        error.fieldViolations.map((v) => [v.field, v.description]),
      );
      for (const field of fields) assert.ok(error.message.includes(field));
    } finally {
      client.close();
    }
  });

  test("c12 the client: idempotent starts, listing, typed errors, retry, events, waiting with a timeout", async () => {
    const s = hex();
    const queue = `c12-${s}`;
    const name = `c12-echo-${s}`;
    const worker = makeWorker(server.address, { slots: 4 });
    let failFirst = true;
    worker.task(queue, "echo", async (ctx) => {
      if (ctx.input?.fail && failFirst) throw new NonRetryableError("asked to fail", { code: "ASKED" });
      return ctx.input;
    });
    const waiting = `
name: c12-waiting-${s}
nodes:
  - id: approval
    type: WAIT_FOR_EVENT
    event: approval
output: { approved: "\${nodes.approval.output.ok}" }
`;
    const client = newClient();
    try {
      await serving(worker, async () => {
        await client.registerWorkflow(oneTask(name, queue, "echo", 'input: "${input}"'));
        const again = await client.registerWorkflow(oneTask(name, queue, "echo", 'input: "${input}"'));
        assert.equal(again.version, 1);
        assert.equal(again.created, false);
        const key = `key-${hex(16)}`;
        const first = await client.startRun(name, { n: 1 }, { idempotencyKey: key, labels: { suite: s } });
        const repeat = await client.startRun(name, { n: 1 }, { idempotencyKey: key, labels: { suite: s } });
        assert.equal(first.created, true);
        assert.equal(repeat.created, false);
        assert.equal(repeat.runId, first.runId);
        const others = [];
        for (let n = 2; n < 6; n++) others.push(await client.startRun(name, { n }, { labels: { suite: s } }));
        for (const r of [first, ...others]) await client.waitForResult(r.runId, { timeoutMs: 60_000 });
        const listed = [];
        for await (const r of client.listRuns({ workflow: name, labels: { suite: s }, pageSize: 2 })) listed.push(r);
        assert.deepEqual(listed.map((r) => r.runId).sort(), [first, ...others].map((r) => r.runId).sort());
        assert.ok(listed.every((r) => r.status === "COMPLETED"));
        const failedOnes = [];
        for await (const r of client.listRuns({ workflow: name, statuses: ["FAILED"] })) failedOnes.push(r);
        assert.deepEqual(failedOnes, []);
        await assert.rejects(client.getRun("3f1b7c1e-0000-4000-8000-000000000000"), (e) => isNotFound(e));
        await assert.rejects(client.startRun(`c12-missing-${s}`), (e) => isNotFound(e));
        const failing = await client.startRun(name, { fail: true });
        assert.equal((await final(client, failing.runId)).status, "FAILED");
        await assert.rejects(client.retryRun(first.runId), (e) => isFailedPrecondition(e));
        failFirst = false;
        const resumed = await client.retryRun(failing.runId);
        assert.equal(resumed.status, "RUNNING");
        assert.deepEqual(await client.waitForResult(failing.runId, { timeoutMs: 60_000 }), { result: { fail: true } });
        await client.registerWorkflow(waiting);
        const waiter = await client.startRun(`c12-waiting-${s}`);
        await assert.rejects(client.waitForResult(waiter.runId, { timeoutMs: 1_000 }), (e) => e instanceof TimeoutError);
        const controller = new AbortController();
        setTimeout(() => controller.abort(new Error("gave up")), 300);
        await assert.rejects(client.waitForResult(waiter.runId, { signal: controller.signal }), /gave up/);
        const delivery = await client.sendEvent("approval", { ok: true }, { runId: waiter.runId, requestId: "r-1" });
        assert.ok(delivery.deliveredRunIds.includes(waiter.runId) || delivery.stored);
        assert.deepEqual(await client.waitForResult(waiter.runId, { timeoutMs: 30_000 }), { approved: true });
        // A correlation key reaches every run waiting on it.
        const keyed = `
name: c12-keyed-${s}
nodes:
  - id: approval
    type: WAIT_FOR_EVENT
    event: approval
    correlation: "\${input.order}"
output: { approved: "\${nodes.approval.output.ok}" }
`;
        await client.registerWorkflow(keyed);
        const order = `o-${s}`;
        const keyedRun = await client.startRun(`c12-keyed-${s}`, { order });
        await until(() => true, 0);
        let delivered: string[] = [];
        const deadline = Date.now() + 20_000;
        while (!delivered.includes(keyedRun.runId) && Date.now() < deadline) {
          const got = await client.sendEvent("approval", { ok: true }, { correlationKey: order, requestId: `k-${Date.now()}` });
          delivered = got.deliveredRunIds;
          if (!delivered.includes(keyedRun.runId)) await sleep(200);
        }
        assert.deepEqual(await client.waitForResult(keyedRun.runId, { timeoutMs: 30_000 }), { approved: true });
        const history: HistoryEvent[] = [];
        for await (const e of client.getRunHistory(keyedRun.runId, { pageSize: 2 })) history.push(e);
        assert.ok(history.length >= 3);
        assert.ok(history.every((e, i) => i === 0 || e.sequence > (history[i - 1]?.sequence ?? 0n)));
      });
    } finally {
      client.close();
    }
  });

  test("c13 the SDK checks the protocol version", async () => {
    const client = newClient();
    try {
      const info = await client.serverInfo();
      const [major, minor] = info.protocolVersion.split(".");
      assert.equal(major, "1");
      assert.ok(Number(minor) >= 0);
      assert.ok(info.serverVersion);
      await client.checkProtocol();
    } finally {
      client.close();
    }
    // A server of another major is refused before any poll: a fake ServerService answering 2.0.
    const { createRouterTransport } = await import("@connectrpc/connect");
    const { ServerService } = await import("../../src/gen/composer/v1/server_service_pb.js");
    let polls = 0;
    const transport = createRouterTransport(({ service }) => {
      service(ServerService, { getServerInfo: () => ({ serverVersion: "9.0.0", protocolVersion: "2.0", features: [] }) });
      service(WorkerService, {
        pollTasks: () => {
          polls += 1;
          return { tasks: [] };
        },
        heartbeat: () => ({}),
        completeTask: () => ({}),
        failTask: () => ({}),
      });
    });
    const worker = makeWorker("fake:1", { transport });
    worker.task("c13", "t", () => null);
    await assert.rejects(worker.serve(), (e) => isFailedPrecondition(e) && /protocol "2\.0"/.test((e as Error).message));
    assert.equal(polls, 0);
  });

  test("c14 tokens come from the argument or COMPOSER_TOKEN and bad ones are refused", async () => {
    const saved = process.env["COMPOSER_TOKEN"];
    try {
      const fromEnv = newClient();
      await fromEnv.serverInfo();
      fromEnv.close();
      delete process.env["COMPOSER_TOKEN"];
      const explicit = new Client({ address: server.address, token: adminToken });
      await explicit.serverInfo();
      explicit.close();
      const none = newClient();
      await assert.rejects(none.serverInfo(), (e) => isUnauthenticated(e));
      none.close();
      const forged = new Client({ address: server.address, token: mintToken(["admin"], { secret: "another-secret-0123456789abcdef-another" }) });
      await assert.rejects(forged.serverInfo(), (e) => isUnauthenticated(e) && e.code === "UNAUTHENTICATED");
      forged.close();
      // A worker token may poll; a client token may not.
      const poll = { workerId: "c14", queues: [`c14-${hex()}`], maxTasks: 1, wait: { seconds: 0n, nanos: 0 } };
      const workerClient = new Client({ address: server.address, token: mintToken(["worker"], { subject: "scoped" }) });
      await workerClient.raw.workers.pollTasks(poll, workerClient.callOptions());
      workerClient.close();
      const plain = new Client({ address: server.address, token: mintToken(["client"]) });
      const refused = await plain.raw.workers.pollTasks(poll, plain.callOptions()).then(
        () => undefined,
        (e: unknown) => toComposerError(e),
      );
      assert.ok(isPermissionDenied(refused), String(refused));
      plain.close();
      // The Worker refuses to start with a bad token: the protocol check fails UNAUTHENTICATED.
      const badWorker = makeWorker(server.address, { token: "not-a-token" });
      badWorker.task("c14", "t", () => null);
      await assert.rejects(badWorker.serve(), (e) => isUnauthenticated(e));
    } finally {
      process.env["COMPOSER_TOKEN"] = saved;
    }
  });

  test("c15 a task running past the first, short lease is confirmed and keeps its lease", async () => {
    const s = hex();
    const queue = `c15-${s}`;
    const own = new ServerProcess(services.databaseUrl, services.redisUrl, ["--lease-receipt-timeout", "2s"]);
    await own.start();
    const recorder = new Recorder();
    const worker = makeWorker(own.address, { slots: 2, interceptors: [recorder.interceptor] });
    const started: string[] = []; // `${runId}#${attempt}`, each time the handler starts
    worker.task(queue, "long", async (ctx) => {
      started.push(`${ctx.runId}#${ctx.attempt}`);
      await sleep(7_000, undefined, { signal: ctx.signal }); // 3.5 first leases of 2 s
      return { attempt: ctx.attempt, run: ctx.runId };
    });
    // heartbeat_timeout 30s: heartbeats at the interval alone (10 s) would all come after the first
    // lease (2 s) ended unconfirmed, and the task would be offered again and again.
    const workflows: [string, number][] = [[queue, 3], [`${queue}-once`, 1]];
    const client = newClient(own.address);
    try {
      await serving(worker, async () => {
        const runs: Run[] = [];
        for (const [name, attempts] of workflows) {
          await client.registerWorkflow(oneTask(name, queue, "long", `heartbeat_timeout: 30s\nretry: { max_attempts: ${attempts} }`));
          runs.push(await client.startRun(name));
        }
        const outputs = await Promise.all(runs.map((r) => client.waitForResult(r.runId, { timeoutMs: 60_000 })));
        assert.deepEqual(outputs, runs.map((r) => ({ result: { attempt: 1, run: r.runId } })));
        for (const r of runs) {
          const node = (await client.getRun(r.runId)).nodes.find((n) => n.nodeId === "work");
          assert.equal(node?.status, "COMPLETED");
          assert.equal(node?.attempt, 1);
          const history = await historyTypes(client, r.runId);
          assert.ok(!history.some((t) => t.toLowerCase().includes("expired")), history.join(","));
        }
        // Each handler ran once: a lease that ended unconfirmed would have offered its task again.
        assert.deepEqual([...started].sort(), runs.map((r) => `${r.runId}#1`).sort());
      });
    } finally {
      client.close();
      await own.stop();
    }
    assert.equal(worker.stats.leaseLost, 0);
    assert.equal(worker.stats.completed, 2);
    const polls = recorder.requests<PollTasksRequest>("PollTasks");
    assert.ok(polls.length > 0 && polls.every((p) => p.confirmReceipt), "the worker must ask to confirm receipt");
  });

  test("c17 schedules fire runs, and a run pauses and resumes", async () => {
    const s = hex();
    const tick = `tick-${s}`;
    const waiting = `paused-${s}`;
    const client = newClient();
    const fieldsOf = (error: unknown): string[] => {
      assert.ok(isInvalidArgument(error), String(error));
      return error.fieldViolations.map((v) => v.field);
    };
    try {
      await client.registerWorkflow(`name: ${tick}\nnodes:\n  - { id: nap, type: WAIT, duration: 1ms }\n`);
      await client.registerWorkflow(
        `name: ${waiting}\nnodes:\n  - { id: go, type: WAIT_FOR_EVENT, event: go }\noutput: { got: "\${nodes.go.output}" }\n`,
      );
      // An interval schedule of 1 s fires a run labelled with its id.
      const sid = `every-second-${s}`;
      const created = await client.createSchedule(sid, tick, { n: 1 }, { intervalMs: 1000, labels: { suite: s }, overlapPolicy: "ALLOW_ALL" });
      assert.equal(created.scheduleId, sid);
      assert.equal(created.spec.intervalMs, 1000);
      assert.deepEqual(created.action.input, { n: 1 });
      assert.equal(created.overlapPolicy, "ALLOW_ALL");
      assert.equal(created.catchUpWindowMs, 60_000);
      assert.ok(!created.paused && created.nextFireTimes.length > 0);
      assert.ok(isAlreadyExists(await client.createSchedule(sid, tick, undefined, { intervalMs: 1000 }).catch((e: unknown) => e)));
      let runs: Run[] = [];
      const deadline = Date.now() + 60_000;
      while (runs.length === 0) {
        assert.ok(Date.now() < deadline, "the schedule started no run within 60 s");
        runs = [];
        for await (const r of client.listRuns({ labels: { "composer.schedule": sid } })) runs.push(r);
        if (runs.length === 0) await sleep(200);
      }
      assert.equal(runs[0]!.labels["suite"], s);
      assert.ok(runs[0]!.labels["composer.fire_time"]);
      assert.equal((await final(client, runs[0]!.runId)).status, "COMPLETED");
      const seen = await client.getSchedule(sid);
      assert.ok(seen.firedCount >= 1);
      assert.ok(seen.recentFires.some((f) => f.outcome === "STARTED" && f.runId));
      const ids: string[] = [];
      for await (const schedule of client.listSchedules({ pageSize: 1 })) ids.push(schedule.scheduleId);
      assert.ok(ids.includes(sid), ids.join(","));

      // Paused: no next fire times and no more fires; a trigger still fires.
      const paused = await client.pauseSchedule(sid, "maintenance");
      assert.ok(paused.paused && paused.note === "maintenance");
      assert.deepEqual(paused.nextFireTimes, []);
      await sleep(1500); // a fire decided before the pause may still land
      const count = (await client.getSchedule(sid)).firedCount;
      await sleep(2500);
      assert.equal((await client.getSchedule(sid)).firedCount, count);
      const fire = await client.triggerSchedule(sid);
      assert.equal(fire.outcome, "STARTED");
      assert.equal((await client.getRun(fire.runId)).labels["composer.schedule"], sid);
      const resumed = await client.resumeSchedule(sid, "back");
      assert.ok(!resumed.paused && resumed.note === "back" && resumed.nextFireTimes.length > 0);

      // Update replaces the definition; the counters stay.
      const updated = await client.updateSchedule(sid, tick, { n: 2 }, { cron: "0 0 1 1 *", timeZone: "Europe/Berlin" });
      assert.equal(updated.spec.cron, "0 0 1 1 *");
      assert.equal(updated.spec.intervalMs, null);
      assert.equal(updated.spec.timeZone, "Europe/Berlin");
      assert.deepEqual(updated.action.input, { n: 2 });
      assert.equal(updated.overlapPolicy, "SKIP");
      assert.ok(updated.firedCount >= count + 1);

      // Errors name the field; a missing id is not found.
      const bad = await client.createSchedule(`bad-${s}`, tick, undefined, { cron: "not a cron" }).catch((e: unknown) => e);
      assert.ok(fieldsOf(bad).includes("spec.cron"));
      assert.ok(isNotFound(await client.getSchedule(`missing-${s}`).catch((e: unknown) => e)));
      await client.deleteSchedule(sid);
      assert.ok(isNotFound(await client.getSchedule(sid).catch((e: unknown) => e)));
      assert.ok(isNotFound(await client.deleteSchedule(sid).catch((e: unknown) => e)));

      // Pause a run waiting on an event; resumed, it completes on the event.
      const run = await client.startRun(waiting, undefined, { priority: 5 });
      assert.equal(run.priority, 5);
      assert.equal(run.status, "RUNNING");
      assert.equal((await client.pauseRun(run.runId, "hold on")).status, "PAUSED");
      assert.equal((await client.getRun(run.runId)).status, "PAUSED");
      const pausedRuns: string[] = [];
      for await (const r of client.listRuns({ workflow: waiting, statuses: ["PAUSED"] })) pausedRuns.push(r.runId);
      assert.deepEqual(pausedRuns, [run.runId]);
      assert.equal((await client.pauseRun(run.runId)).status, "PAUSED");
      assert.equal((await client.resumeRun(run.runId)).status, "RUNNING");
      await client.sendEvent("go", { ok: 1 }, { runId: run.runId });
      assert.deepEqual(await client.waitForResult(run.runId, { timeoutMs: 60_000 }), { got: { ok: 1 } });
      assert.ok(isFailedPrecondition(await client.pauseRun(run.runId).catch((e: unknown) => e)));

      // Priority: the default is 3; 9 is refused naming the field.
      assert.equal((await client.startRun(tick)).priority, 3);
      const tooHigh = await client.startRun(tick, undefined, { priority: 9 }).catch((e: unknown) => e);
      assert.ok(fieldsOf(tooHigh).includes("priority"));
    } finally {
      client.close();
    }
  });

  test("c18 bulk actions act on every matching run", async () => {
    const s = hex();
    const queue = `c18-${s}`;
    const failing = `c18-fail-${s}`;
    const passing = `c18-ok-${s}`;
    const waiting = `c18-wait-${s}`;
    const worker = makeWorker(server.address, { slots: 8 });
    let decline = true;
    worker.task(queue, "charge", () => {
      if (decline) throw new NonRetryableError("card declined", { code: "DECLINED" });
      return { charged: true };
    });
    worker.task(queue, "log", () => ({ logged: true }));
    const client = newClient();
    const settle = (operation: BulkOperation): Promise<BulkOperation> => client.waitBulkOperation(operation.operationId, { timeoutMs: 60_000 });
    const statusesOf = async (runs: Run[]): Promise<string[]> => Promise.all(runs.map(async (r) => (await client.getRun(r.runId, { skipNodes: true })).status));
    try {
      await serving(worker, async () => {
        await client.registerWorkflow(oneTask(failing, queue, "charge"));
        await client.registerWorkflow(oneTask(passing, queue, "log"));
        await client.registerWorkflow(`name: ${waiting}\nnodes:\n  - { id: go, type: WAIT_FOR_EVENT, event: go }\n`);

        // 6 runs fail non-retryably and 2 complete, all with the test's own label.
        const label = { c18: s };
        const failed: Run[] = [];
        for (let i = 0; i < 6; i++) failed.push(await client.startRun(failing, { i }, { labels: label }));
        const completed: Run[] = [];
        for (let i = 0; i < 2; i++) completed.push(await client.startRun(passing, { i }, { labels: label }));
        for (const r of failed) assert.equal((await final(client, r.runId)).status, "FAILED");
        for (const r of completed) assert.equal((await final(client, r.runId)).status, "COMPLETED");

        // One call retries the 6 failed runs; the 2 completed ones are skipped.
        decline = false;
        const requestId = `retry-${s}`;
        const retry = await client.bulkRetryRuns({ labels: label }, { requestId });
        assert.ok(retry.operationId);
        assert.equal(retry.created, true);
        assert.equal(retry.kind, "RETRY");
        assert.deepEqual(retry.filter, { labels: label });
        const retried = await settle(retry);
        assert.equal(retried.status, "SUCCEEDED", JSON.stringify(retried));
        assert.deepEqual([retried.matched, retried.succeeded, retried.skipped, retried.failed], [8, 6, 2, 0]);
        assert.deepEqual(retried.failures, []);
        assert.ok(retried.endTime);
        for (const r of failed) assert.deepEqual(await client.waitForResult(r.runId, { timeoutMs: 60_000 }), { result: { charged: true } });
        const again = await client.bulkRetryRuns({ labels: label }, { requestId });
        assert.equal(again.operationId, retry.operationId);
        assert.equal(again.created, false);

        // 3 runs waiting on an event: paused, resumed and cancelled in bulk.
        const held = { c18w: s };
        const waiters: Run[] = [];
        for (let i = 0; i < 3; i++) waiters.push(await client.startRun(waiting, undefined, { labels: held }));
        const paused = await settle(await client.bulkPauseRuns({ labels: held }, { reason: "maintenance" }));
        assert.equal(paused.kind, "PAUSE");
        assert.equal(paused.reason, "maintenance");
        assert.deepEqual([paused.status, paused.matched, paused.succeeded], ["SUCCEEDED", 3, 3]);
        assert.deepEqual(await statusesOf(waiters), ["PAUSED", "PAUSED", "PAUSED"]);
        const resumed = await settle(await client.bulkResumeRuns({ labels: held }));
        assert.equal(resumed.kind, "RESUME");
        assert.deepEqual([resumed.status, resumed.matched, resumed.succeeded], ["SUCCEEDED", 3, 3]);
        assert.deepEqual(await statusesOf(waiters), ["RUNNING", "RUNNING", "RUNNING"]);
        const cancelled = await settle(await client.bulkCancelRuns({ labels: held }, { reason: "no longer needed" }));
        assert.equal(cancelled.kind, "CANCEL");
        assert.equal(cancelled.reason, "no longer needed");
        assert.deepEqual([cancelled.status, cancelled.matched, cancelled.succeeded], ["SUCCEEDED", 3, 3]);
        assert.deepEqual(await statusesOf(waiters), ["CANCELLED", "CANCELLED", "CANCELLED"]);

        // Listed newest first (paging one at a time).
        const ours = new Set([retry.operationId, paused.operationId, resumed.operationId, cancelled.operationId]);
        const listed: string[] = [];
        for await (const operation of client.listBulkOperations({ pageSize: 1 })) if (ours.has(operation.operationId)) listed.push(operation.operationId);
        assert.deepEqual(listed, [cancelled.operationId, resumed.operationId, paused.operationId, retry.operationId]);

        // Refusals.
        assert.ok(isFailedPrecondition(await client.bulkCancelRuns({}).catch((e: unknown) => e)));
        const badVersion = await client.bulkRetryRuns({ workflowVersion: 1 }).catch((e: unknown) => e);
        assert.ok(isInvalidArgument(badVersion), String(badVersion));
        assert.ok(badVersion.fieldViolations.some((v) => v.field === "filter.workflow_version"), badVersion.message);
        assert.ok(isNotFound(await client.getBulkOperation(randomUUID()).catch((e: unknown) => e)));
        assert.ok(isFailedPrecondition(await client.cancelBulkOperation(cancelled.operationId).catch((e: unknown) => e)));
      });
    } finally {
      client.close();
    }
  });

  test("c19 queue rate limits and queued runs", async () => {
    const s = hex();
    const queue = `c19-${s}`;
    const limited = `c19-limited-${s}`;
    const keyed = `c19-keyed-${s}`;
    const worker = makeWorker(server.address, { slots: 8 });
    worker.task(queue, "work", (ctx) => Number(ctx.input.i));
    const client = newClient();
    try {
      // A limit of 2 per second with a burst of 2, read back and listed.
      const set = await client.setQueueRateLimit(queue, { perSecond: 2, burst: 2 });
      assert.deepEqual([set.queue, set.perSecond, set.burst, set.perKeyPerSecond, set.perKeyBurst], [queue, 2, 2, 0, 0]);
      assert.ok(set.createTime && set.updateTime);
      const got = await client.getQueueRateLimit(queue);
      assert.deepEqual([got.queue, got.perSecond, got.burst], [queue, 2, 2]);
      assert.deepEqual(got.createTime, set.createTime);
      const listed = [];
      for await (const limit of client.listQueueRateLimits({ pageSize: 1 })) if (limit.queue === queue) listed.push(limit);
      assert.deepEqual(listed.map((l) => [l.queue, l.perSecond, l.burst]), [[queue, 2, 2]]);
      await sleep(1_500); // a change reaches every server's dispatch within about a second

      // 6 one-task runs started at once go out 2 at a time: the last ends >= 1.5 s after the first started.
      await serving(worker, async () => {
        await client.registerWorkflow(oneTask(limited, queue, "work", 'input: { i: "${input.i}" }'));
        const runs = await Promise.all([0, 1, 2, 3, 4, 5].map((i) => client.startRun(limited, { i })));
        const ended = await Promise.all(runs.map((r) => final(client, r.runId)));
        for (const [i, run] of ended.entries()) {
          assert.equal(run.status, "COMPLETED", JSON.stringify(run.error));
          assert.deepEqual(run.output, { result: i });
          assert.equal(run.concurrencyKey, "", "a workflow without concurrency gives its runs no key");
        }
        const firstStart = Math.min(...runs.map((r) => r.createTime!.getTime()));
        const lastEnd = Math.max(...ended.map((r) => r.endTime!.getTime()));
        assert.ok(lastEnd - firstStart >= 1_500, `6 runs at 2/s (burst 2) took only ${lastEnd - firstStart} ms`);
      });

      // A burst under the rate is refused naming limit.burst; the limit stays as it was.
      const bad = await client.setQueueRateLimit(queue, { perSecond: 5, burst: 2 }).catch((e: unknown) => e);
      assert.ok(isInvalidArgument(bad), String(bad));
      assert.ok(bad.fieldViolations.some((v) => v.field === "limit.burst"), bad.message);
      assert.equal((await client.getQueueRateLimit(queue)).perSecond, 2);
      await client.deleteQueueRateLimit(queue);
      assert.ok(isNotFound(await client.getQueueRateLimit(queue).catch((e: unknown) => e)));

      // A concurrency key of max 1: the second run of the same key waits QUEUED for the first.
      await client.registerWorkflow(
        `name: ${keyed}\nconcurrency: { key: "input.k", max: 1 }\nnodes:\n  - { id: go, type: WAIT_FOR_EVENT, event: go }\noutput: { got: "\${nodes.go.output}" }\n`,
      );
      const k = `customer-${s}`;
      const first = await client.startRun(keyed, { k });
      const second = await client.startRun(keyed, { k });
      assert.deepEqual([first.status, first.concurrencyKey], ["RUNNING", k]);
      assert.deepEqual([second.status, second.concurrencyKey], ["QUEUED", k]);
      const seen = await client.getRun(second.runId);
      assert.deepEqual([seen.status, seen.concurrencyKey], ["QUEUED", k]);
      assert.deepEqual(seen.nodes.filter((n) => n.status !== "SCHEDULED").map((n) => n.nodeId), [], "a QUEUED run has started no node");
      const queued: string[] = [];
      for await (const r of client.listRuns({ workflow: keyed, statuses: ["QUEUED"] })) queued.push(r.runId);
      assert.deepEqual(queued, [second.runId]);

      // The first completes on its event; the second then runs and completes on its own.
      await client.sendEvent("go", { n: 1 }, { runId: first.runId });
      assert.deepEqual(await client.waitForResult(first.runId, { timeoutMs: 60_000 }), { got: { n: 1 } });
      let next = await client.getRun(second.runId);
      const deadline = Date.now() + 30_000;
      while (next.status === "QUEUED" && Date.now() < deadline) {
        await sleep(100);
        next = await client.getRun(second.runId);
      }
      assert.deepEqual([next.status, next.concurrencyKey], ["RUNNING", k]);
      await client.sendEvent("go", { n: 2 }, { runId: second.runId });
      assert.deepEqual(await client.waitForResult(second.runId, { timeoutMs: 60_000 }), { got: { n: 2 } });
    } finally {
      client.close();
    }
  });
});

async function startWithRetry(client: Client, workflow: string, input: unknown) {
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      return await client.startRun(workflow, input);
    } catch (error) {
      if (!(error instanceof ComposerError) || !error.retryable || Date.now() > deadline) throw error;
      await sleep(200);
    }
  }
}
