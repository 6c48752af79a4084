// A worker run as its own process by the integration tests (SIGKILL and SIGTERM scenarios).
//
//   node worker-process.js ADDRESS QUEUE SLOTS SECONDS [DRAIN_SECONDS]
//
// Serves task `slow` on QUEUE: prints {"event":"started",...} when a task starts, waits SECONDS
// (or returns at once on attempt >= 2), returns {pid, attempt} and prints `finished`; prints
// `heartbeat` after each heartbeat the server accepted (the first confirms the lease). On SIGTERM
// it stops gracefully (worker.run()) and prints `exited`.
import { setTimeout as sleep } from "node:timers/promises";

import type { Interceptor } from "@connectrpc/connect";

import { Worker } from "../../src/index.js";

function emit(event: string, fields: Record<string, unknown> = {}): void {
  process.stdout.write(JSON.stringify({ event, ...fields }) + "\n");
}

/** Prints `heartbeat` once the server accepted a Heartbeat. */
const heartbeatEvents: Interceptor = (next) => async (request) => {
  const response = await next(request);
  if (!request.stream && request.method.name === "Heartbeat") {
    const beat = request.message as unknown as { taskId: string; attempt: number };
    emit("heartbeat", { task_id: beat.taskId, attempt: beat.attempt });
  }
  return response;
};

const [address, queue, slots, seconds, drain] = process.argv.slice(2);
const worker = new Worker({
  address: address as string,
  slots: Number(slots),
  drainTimeoutMs: Number(drain ?? 30) * 1000,
  interceptors: [heartbeatEvents],
});
worker.task(queue as string, "slow", async (ctx) => {
  emit("started", { task_id: ctx.taskId, attempt: ctx.attempt, run_id: ctx.runId });
  if (ctx.attempt === 1) await sleep(Number(seconds) * 1000);
  emit("finished", { task_id: ctx.taskId, attempt: ctx.attempt, run_id: ctx.runId });
  return { pid: process.pid, attempt: ctx.attempt };
});
emit("ready", { worker_id: worker.workerId });
await worker.run();
emit("exited", { completed: worker.stats.completed, polled: worker.stats.polled });
process.exit(0);
