// The worker's local behaviours against a fake WorkerService (tests/conformance/README.md L1-L6),
// and what the real server cannot be made to do on cue.
import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import { describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Code } from "@connectrpc/connect";

import { Backoff, NonRetryableError, Slots, TaskCancelledError, TaskError, Worker, type Handler } from "../../src/index.js";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";

import { firstHeartbeatDelayMs } from "../../src/worker.js";
import { FakeServer, cpuPoolBusy, leaseLost, payloadTooLarge, quotaExceeded, task, unavailable, wireError } from "./fake.js";

const QUIET = { debug() {}, info() {}, warn() {}, error() {} };
const FAST = new Backoff({ initialMs: 10, maximumMs: 50 });

/** Serves one task (or more) on a fake until `done()` holds, then stops the worker. */
async function serveOn(fake: FakeServer, handler: Handler, done: () => boolean, options: Record<string, unknown> = {}): Promise<Worker> {
  const worker = new Worker({ transport: fake, slots: 2, backoff: FAST, logger: QUIET, pollWaitMs: 100, ...options });
  worker.task("q", "t", handler);
  const served = worker.serve();
  const deadline = Date.now() + 10_000;
  while (!done() && Date.now() < deadline) await sleep(10);
  worker.stop();
  await served;
  assert.ok(done(), "the scenario did not finish within 10 s");
  return worker;
}

describe("worker (local, fake server)", () => {
  test("l01 a report that meets UNAVAILABLE or DEADLINE_EXCEEDED is sent again with the same lease until applied", async () => {
    let completes = 0;
    const fake = new FakeServer({
      CompleteTask: () => {
        completes += 1;
        if (completes === 1) throw unavailable();
        if (completes === 2) throw wireError(Code.DeadlineExceeded, "slow");
        return {};
      },
    });
    fake.tasks.push(task());
    const worker = await serveOn(fake, () => ({ ok: true }), () => worker_done(fake));
    const sent = fake.requests("CompleteTask");
    assert.equal(sent.length, 3);
    for (const r of sent) assert.deepEqual([r.taskId, r.attempt, r.leaseToken], ["t-1", 1, "lease-1"]);
    assert.equal(worker.stats.completed, 1);
    assert.equal(worker.stats.reportRetries, 2);
    assert.equal(fake.requests("FailTask").length, 0);
    function worker_done(f: FakeServer): boolean {
      return completes >= 3 && f.requests("CompleteTask").length === 3;
    }
  });

  test("l02 poll errors back off with jitter and the worker recovers by itself", async () => {
    let polls = 0;
    const fake = new FakeServer();
    fake.answers["PollTasks"] = (request, signal) => {
      polls += 1;
      if (polls <= 4) throw unavailable();
      if (polls === 5) return { tasks: [task()] };
      return fake.poll(request, signal);
    };
    const backoff = new Backoff({ initialMs: 40, maximumMs: 400, jitter: 0.5 });
    const worker = await serveOn(fake, () => "ok", () => fake.requests("CompleteTask").length === 1, { backoff });
    assert.equal(worker.stats.pollErrors, 4);
    assert.equal(worker.stats.completed, 1);
    const at = fake.calls.filter((c) => c.method === "PollTasks").map((c) => c.at);
    const gaps = at.slice(1, 5).map((t, i) => t - (at[i] as number));
    // caps 40, 80, 160, 320 ms; with jitter 0.5 each delay is within [cap/2, cap] (plus scheduling slack)
    [40, 80, 160, 320].forEach((cap, i) => {
      const gap = gaps[i] as number;
      assert.ok(gap >= cap / 2 - 5 && gap <= cap + 250, `gap ${i + 1} was ${gap} ms for a cap of ${cap}`);
    });
  });

  test("l03 an output that is not JSON fails INVALID_OUTPUT, non-retryable", async () => {
    const fake = new FakeServer();
    fake.tasks.push(task());
    await serveOn(fake, () => ({ when: 1n }), () => fake.requests("FailTask").length === 1);
    const [fail] = fake.requests("FailTask");
    assert.equal(fail.errorCode, "INVALID_OUTPUT");
    assert.equal(fail.retryable, false);
    assert.match(fail.message, /bigint/);
    assert.equal(fake.requests("CompleteTask").length, 0);
  });

  test("l03 an output over the payload limit (RESOURCE_EXHAUSTED) fails OUTPUT_TOO_LARGE, non-retryable", async () => {
    const fake = new FakeServer({
      CompleteTask: () => {
        throw wireError(Code.ResourceExhausted, "output of 5 MiB exceeds the payload limit of 1 MiB");
      },
    });
    fake.tasks.push(task());
    await serveOn(fake, () => ({ big: "x".repeat(100) }), () => fake.requests("FailTask").length === 1);
    const [fail] = fake.requests("FailTask");
    assert.equal(fail.errorCode, "OUTPUT_TOO_LARGE");
    assert.equal(fail.retryable, false);
    assert.equal(fake.requests("CompleteTask").length, 1, "not sent again");
  });

  test("l03 a task with no handler fails UNKNOWN_TASK", async () => {
    const fake = new FakeServer();
    fake.tasks.push(task({ taskName: "nobody" }));
    await serveOn(fake, () => "x", () => fake.requests("FailTask").length === 1);
    const [fail] = fake.requests("FailTask");
    assert.equal(fail.errorCode, "UNKNOWN_TASK");
    assert.match(fail.message, /nobody/);
  });

  test("l04 a lost lease seen by a heartbeat aborts the handler's signal and nothing is reported", async () => {
    const fake = new FakeServer({
      Heartbeat: () => {
        throw leaseLost();
      },
    });
    fake.tasks.push(task());
    let reason: unknown;
    let checks = 0;
    const worker = await serveOn(
      fake,
      async (ctx) => {
        // a loop that checks the signal between steps (what a CPU-bound handler does)
        while (!ctx.signal.aborted) {
          checks += 1;
          await sleep(5);
        }
        reason = ctx.signal.reason;
        return "too late";
      },
      () => reason !== undefined,
      { heartbeatIntervalMs: 50 },
    );
    await sleep(50);
    assert.ok(reason instanceof TaskCancelledError);
    assert.equal((reason as TaskCancelledError).reason, "lease lost");
    assert.ok(checks > 1);
    assert.equal(fake.requests("CompleteTask").length, 0);
    assert.equal(fake.requests("FailTask").length, 0);
    assert.equal(fake.requests("Heartbeat").length, 1, "LEASE_LOST is final: no more heartbeats");
    assert.equal(worker.stats.leaseLost, 1);
  });

  test("c04 (local) cancel_requested aborts the signal with 'run cancelled' and nothing is reported", async () => {
    const fake = new FakeServer({ Heartbeat: () => ({ cancelRequested: true }) });
    fake.tasks.push(task());
    let reason: string | undefined;
    const worker = await serveOn(
      fake,
      async (ctx) => {
        await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
        reason = ctx.cancelReason;
        throw ctx.signal.reason;
      },
      () => reason !== undefined,
      { heartbeatIntervalMs: 30 },
    );
    await sleep(30);
    assert.equal(reason, "run cancelled");
    assert.equal(fake.requests("CompleteTask").length + fake.requests("FailTask").length, 0);
    assert.equal(worker.stats.cancelled, 1);
  });

  test("a cancelled run's reason from the heartbeat is ctx.cancelReason and the signal's reason; the kind stays 'run cancelled'", async () => {
    const fake = new FakeServer({ Heartbeat: () => ({ cancelRequested: true, cancelReason: "customer withdrew the order" }) });
    fake.tasks.push(task());
    let seen: { reason: string | undefined; kind: string | undefined; error: unknown } | undefined;
    const worker = await serveOn(
      fake,
      async (ctx) => {
        await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
        seen = { reason: ctx.cancelReason, kind: ctx.cancelKind, error: ctx.signal.reason };
        throw ctx.signal.reason;
      },
      () => seen !== undefined,
      { heartbeatIntervalMs: 30 },
    );
    await sleep(30);
    assert.equal(seen?.reason, "customer withdrew the order");
    assert.equal(seen?.kind, "run cancelled");
    assert.ok(seen?.error instanceof TaskCancelledError);
    assert.equal(seen.error.kind, "run cancelled");
    assert.equal(seen.error.reason, "customer withdrew the order");
    assert.equal(seen.error.message, "task cancelled: run cancelled: customer withdrew the order");
    assert.equal(fake.requests("CompleteTask").length + fake.requests("FailTask").length, 0, "a cancelled run's task reports nothing");
    assert.equal(worker.stats.cancelled, 1);
  });

  test("c15 (local) polls confirm receipt; the first heartbeat comes a third of the way to the first expiry, then the interval", async () => {
    const fake = new FakeServer();
    let receivedAt = 0;
    fake.answers["PollTasks"] = (request, signal) => {
      if (fake.tasks.length === 0 || !request.confirmReceipt) return fake.poll(request, signal);
      receivedAt = Date.now();
      // A first lease of 600 ms (the server's --lease-receipt-timeout); the lease is 3 s (interval 1 s).
      return { tasks: fake.tasks.splice(0).map((t) => ({ ...t, leaseExpireTime: timestampFromMs(receivedAt + 600) })) };
    };
    fake.tasks.push(task());
    const worker = await serveOn(
      fake,
      async () => {
        await sleep(1_500);
        return "done";
      },
      () => fake.requests("CompleteTask").length === 1,
    );
    const polls = fake.requests("PollTasks");
    assert.ok(polls.length > 0 && polls.every((p) => p.confirmReceipt === true), "every poll asks to confirm receipt");
    const beats = fake.calls.filter((c) => c.method === "Heartbeat").map((c) => c.at);
    assert.equal(beats.length, 2, `heartbeats at ${beats.map((b) => b - receivedAt).join(", ")} ms`);
    assert.ok((beats[0] as number) - receivedAt < 450, "the first heartbeat confirms well before the first expiry (600 ms)");
    assert.ok((beats[1] as number) - (beats[0] as number) > 700, "then the lease's third (1 s), not a third of 600 ms");
    assert.equal(worker.stats.completed, 1);
    assert.equal(worker.stats.leaseLost, 0);
  });

  test("a task reported before its first heartbeat sends none", async () => {
    const fake = new FakeServer();
    fake.tasks.push(task({ leaseExpireTime: timestampFromMs(Date.now() + 2_000) } as never));
    await serveOn(fake, () => "done", () => fake.requests("CompleteTask").length === 1);
    await sleep(500);
    assert.equal(fake.requests("Heartbeat").length, 0);
  });

  test("firstHeartbeatDelayMs", () => {
    const now = 1_000_000;
    const expiring = (inMs: number) => ({ leaseExpireTime: timestampFromMs(now + inMs) });
    assert.equal(firstHeartbeatDelayMs({ leaseExpireTime: undefined }, 10_000, now), 10_000, "no first expiry: the interval");
    assert.equal(firstHeartbeatDelayMs(expiring(6_000), 10_000, now), 2_000, "a third of the way");
    assert.equal(firstHeartbeatDelayMs(expiring(60_000), 10_000, now), 10_000, "the interval when sooner");
    assert.equal(firstHeartbeatDelayMs(expiring(-3_000), 10_000, now), 500, "already past (clocks apart): soon");
    assert.equal(firstHeartbeatDelayMs(expiring(-3_000), 200, now), 200, "never later than the interval");
  });

  test("the attempt's deadline aborts the signal and fails the attempt with TIMEOUT", async () => {
    const fake = new FakeServer();
    fake.tasks.push(task({ attemptDeadline: { seconds: BigInt(Math.floor((Date.now() + 200) / 1000)), nanos: ((Date.now() + 200) % 1000) * 1e6 } } as never));
    let reason: string | undefined;
    await serveOn(
      fake,
      async (ctx) => {
        await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
        reason = ctx.cancelReason;
        return "late";
      },
      () => fake.requests("FailTask").length === 1,
    );
    assert.equal(reason, "attempt deadline");
    const [fail] = fake.requests("FailTask");
    assert.equal(fail.errorCode, "TIMEOUT");
    assert.equal(fail.retryable, true);
    assert.equal(fake.requests("CompleteTask").length, 0);
  });

  test("l05 a drain that times out fails the attempts with WORKER_SHUTDOWN, retryable, then stops heartbeating", async () => {
    const fake = new FakeServer();
    fake.tasks.push(task());
    const worker = new Worker({ transport: fake, slots: 1, backoff: FAST, logger: QUIET, pollWaitMs: 100, drainTimeoutMs: 300, heartbeatIntervalMs: 50 });
    let reason: string | undefined;
    let started = false;
    worker.task("q", "t", async (ctx) => {
      started = true;
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
      reason = ctx.cancelReason;
      await sleep(100_000, undefined, { ref: false }); // ignores its signal: the worker must not wait for it
    });
    const served = worker.serve();
    while (!started) await sleep(10);
    const stopAt = Date.now();
    worker.stop();
    await served;
    const tookMs = Date.now() - stopAt;
    assert.ok(tookMs >= 280 && tookMs < 3_000, `stop took ${tookMs} ms`);
    assert.equal(reason, "worker shutdown");
    const [fail] = fake.requests("FailTask");
    assert.equal(fail.errorCode, "WORKER_SHUTDOWN");
    assert.equal(fail.retryable, true);
    const heartbeats = fake.requests("Heartbeat").length;
    assert.ok(heartbeats >= 3, `heartbeats went on during the drain (${heartbeats})`);
    await sleep(200);
    assert.equal(fake.requests("Heartbeat").length, heartbeats, "no heartbeat after the stop");
    const lastPoll = Math.max(...fake.calls.filter((c) => c.method === "PollTasks").map((c) => c.at));
    assert.ok(lastPoll <= stopAt + 150, "no poll started after the stop");
  });

  test("l06 a completion refused by a busy server is sent again after RetryInfo's delay, else the back-off's", async () => {
    let completes = 0;
    const fake = new FakeServer({
      CompleteTask: () => {
        completes += 1;
        if (completes === 1) throw quotaExceeded(30);
        if (completes === 2) throw cpuPoolBusy(); // no RetryInfo: the worker's back-off
        return {};
      },
    });
    fake.tasks.push(task());
    const lines: string[] = [];
    const logger = { debug() {}, info: (m: string) => void lines.push(m), warn() {}, error() {} };
    const backoff = new Backoff({ initialMs: 10, maximumMs: 50, jitter: 0 });
    const worker = await serveOn(fake, () => ({ ok: true }), () => completes === 3, { logger, backoff });
    assert.equal(fake.requests("CompleteTask").length, 3);
    assert.equal(fake.requests("FailTask").length, 0);
    assert.equal(worker.stats.reportRetries, 2);
    // The first wait is the server's 30 ms; the second the back-off's 20 ms after two failures.
    assert.deepEqual(lines.flatMap((l) => /report failed \(RESOURCE_EXHAUSTED\); sending it again in (\d+) ms/.exec(l)?.[1] ?? []), ["30", "20"]);
  });

  test("l06 a completion refused by a busy server until the report deadline fails OUTPUT_UPLOAD_FAILED, retryable", async () => {
    const fake = new FakeServer({
      CompleteTask: () => {
        throw quotaExceeded(20);
      },
    });
    fake.tasks.push(task());
    const worker = await serveOn(fake, () => ({ ok: true }), () => fake.requests("FailTask").length === 1, { reportTimeoutMs: 150 });
    const [fail] = fake.requests("FailTask");
    assert.equal(fail.errorCode, "OUTPUT_UPLOAD_FAILED");
    assert.equal(fail.retryable, true);
    assert.ok(fake.requests("CompleteTask").length > 1, "the completion was sent again before the deadline");
    assert.equal(worker.stats.failed, 1);
  });

  test("l06 a completion over the payload limit (BadRequest, no ErrorInfo) fails OUTPUT_TOO_LARGE, not sent again", async () => {
    const fake = new FakeServer({
      CompleteTask: () => {
        throw payloadTooLarge("output");
      },
    });
    fake.tasks.push(task());
    await serveOn(fake, () => ({ ok: true }), () => fake.requests("FailTask").length === 1);
    const [fail] = fake.requests("FailTask");
    assert.equal(fail.errorCode, "OUTPUT_TOO_LARGE");
    assert.equal(fail.retryable, false);
    assert.equal(fake.requests("CompleteTask").length, 1);
  });

  test("c08 (local) stop: no new poll, in-flight tasks finish and report, heartbeats until the end", async () => {
    const fake = new FakeServer();
    fake.tasks.push(task({ taskId: "a", leaseToken: "la" }), task({ taskId: "b", leaseToken: "lb" }));
    const worker = new Worker({ transport: fake, slots: 2, backoff: FAST, logger: QUIET, pollWaitMs: 100, heartbeatIntervalMs: 40 });
    let running = 0;
    worker.task("q", "t", async (ctx) => {
      running += 1;
      await sleep(300);
      return { id: ctx.taskId };
    });
    const served = worker.serve();
    while (running < 2) await sleep(5);
    const stopAt = Date.now();
    worker.stop();
    await served;
    const completes = fake.requests("CompleteTask");
    assert.deepEqual(completes.map((r) => r.taskId).sort(), ["a", "b"]);
    const polls = fake.calls.filter((c) => c.method === "PollTasks" && c.at > stopAt);
    assert.equal(polls.length, 0, "no poll after the stop");
    const lastHeartbeat = Math.max(...fake.calls.filter((c) => c.method === "Heartbeat").map((c) => c.at));
    const lastComplete = Math.max(...fake.calls.filter((c) => c.method === "CompleteTask").map((c) => c.at));
    assert.ok(lastHeartbeat > stopAt, "heartbeats went on after the stop, while draining");
    assert.ok(lastHeartbeat <= lastComplete + 100, "heartbeats stop once the reports are done");
  });

  test("c02 (local) polls never ask for more than the free slots", async () => {
    const fake = new FakeServer();
    for (let i = 0; i < 7; i++) fake.tasks.push(task({ taskId: `t${i}`, leaseToken: `l${i}` }));
    let peak = 0;
    let running = 0;
    const worker = await serveOn(
      fake,
      async () => {
        running += 1;
        peak = Math.max(peak, running);
        await sleep(40);
        running -= 1;
        return null;
      },
      () => fake.requests("CompleteTask").length === 7,
      { slots: 3 },
    );
    const asked = fake.requests("PollTasks").map((r) => r.maxTasks);
    assert.ok(asked.every((m) => m >= 1 && m <= 3), asked.join(","));
    assert.equal(peak, 3);
    assert.equal(worker.maxConcurrencySeen, 3);
  });

  test("c09 (local) errors become FailTask: TaskError's code, NonRetryableError final, plain errors by name with the stack", async () => {
    const fake = new FakeServer();
    fake.tasks.push(
      task({ taskId: "a", taskName: "declined" }),
      task({ taskId: "b", taskName: "plain" }),
      task({ taskId: "c", taskName: "custom" }),
      task({ taskId: "d", taskName: "string" }),
    );
    const worker = new Worker({ transport: fake, slots: 4, backoff: FAST, logger: QUIET, pollWaitMs: 100 });
    class PaymentGatewayError extends Error {}
    worker.task("q", "declined", () => {
      throw new NonRetryableError("card declined", { code: "DECLINED", details: { card: "visa" } });
    });
    worker.task("q", "plain", async () => {
      throw new TypeError("bad");
    });
    worker.task("q", "custom", () => {
      throw new PaymentGatewayError("gateway down");
    });
    worker.task("q", "string", () => {
      throw "just a string"; // eslint-disable-line @typescript-eslint/only-throw-error
    });
    const served = worker.serve();
    while (fake.requests("FailTask").length < 4) await sleep(10);
    worker.stop();
    await served;
    const byTask = Object.fromEntries(fake.requests("FailTask").map((r) => [r.taskId, r]));
    assert.equal(byTask["a"].errorCode, "DECLINED");
    assert.equal(byTask["a"].retryable, false);
    assert.equal(byTask["b"].errorCode, "TypeError");
    assert.equal(byTask["b"].retryable, true);
    assert.equal(byTask["c"].errorCode, "PaymentGatewayError");
    assert.equal(byTask["d"].errorCode, "NON_ERROR_THROWN");
    assert.equal(byTask["d"].message, "the handler threw a non-Error value: just a string");
    const details = byTask["b"].details.kind.value.fields;
    assert.match(details.stack.kind.value, /TypeError: bad\n\s+at /);
    assert.ok(new TaskError("x").retryable);
  });

  test("c13 (local) a server of another protocol major is refused before polling", async () => {
    const fake = new FakeServer();
    fake.protocolVersion = "2.0";
    const worker = new Worker({ transport: fake, logger: QUIET });
    worker.task("q", "t", () => null);
    await assert.rejects(worker.serve(), /speaks protocol "2\.0"; this SDK needs 1\.x/);
    assert.equal(fake.requests("PollTasks").length, 0);
  });
});

describe("slots", () => {
  test("acquire, release and waitFree", async () => {
    const slots = new Slots(2);
    slots.acquire();
    slots.acquire();
    assert.equal(slots.free, 0);
    assert.throws(() => slots.acquire(), RangeError);
    let freed = false;
    const waiting = slots.waitFree().then(() => (freed = true));
    await sleep(5);
    assert.equal(freed, false);
    slots.release();
    await waiting;
    assert.equal(slots.highWater, 2);
    assert.throws(() => new Slots(0), RangeError);
  });

  test("waitFree leaves no listener on the stop signal once a slot frees", async () => {
    const slots = new Slots(1);
    const stop = new AbortController();
    for (let i = 0; i < 20; i++) {
      slots.acquire();
      const waiting = slots.waitFree(stop.signal);
      slots.release();
      await waiting;
    }
    assert.equal(getEventListeners(stop.signal, "abort").length, 0);
    slots.acquire();
    const waiting = slots.waitFree(stop.signal);
    stop.abort();
    await waiting;
  });
});
