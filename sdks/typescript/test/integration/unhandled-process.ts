// A worker whose handler leaves a rejection unhandled, run as its own process (node:test fails any
// test whose process sees an unhandled rejection, so this cannot run inside the test process).
//
//   node unhandled-process.js ADDRESS QUEUE
//
// Task `leaky` leaves a rejected promise unhandled and then waits for its signal; task `thrower`
// throws a non-Error value. The worker must fail those attempts and keep serving: task `fine`
// still completes afterwards. Prints {"event": "aborted", reason} when leaky's signal fires.
import { Worker } from "../../src/index.js";

function emit(event: string, fields: Record<string, unknown> = {}): void {
  process.stdout.write(JSON.stringify({ event, ...fields }) + "\n");
}

const [address, queue] = process.argv.slice(2) as [string, string];
const worker = new Worker({ address, slots: 4, pollWaitMs: 2_000, drainTimeoutMs: 5_000 });
worker.task(queue, "leaky", async (ctx) => {
  void Promise.reject(new TypeError("left unhandled"));
  await new Promise<void>((resolve) =>
    ctx.signal.addEventListener("abort", () => {
      emit("aborted", { reason: ctx.cancelReason, attempt: ctx.attempt });
      resolve();
    }),
  );
  return "unreachable";
});
worker.task(queue, "thrower", () => {
  throw { not: "an Error" }; // eslint-disable-line @typescript-eslint/only-throw-error
});
worker.task(queue, "fine", (ctx) => ({ pid: process.pid, attempt: ctx.attempt }));
emit("ready");
await worker.run();
emit("exited", { failed: worker.stats.failed, completed: worker.stats.completed });
process.exit(0);
