// The TypeScript SDK's Worker with no-op handlers, for B1 (bench/loadgen): the twin of
// bench/python_worker.py.
//
//   node bench/ts_worker/worker.mjs HOST:PORT QUEUE SLOTS
//
// Serves step1, step2 and step3 on QUEUE, each returning {}. Prints the number of tasks it
// completed (applied by the server; cumulative, one integer per line) every 50 ms on standard
// output, for the load generator's closed loop. SIGTERM (or SIGINT) stops polling, drains the
// tasks in flight (up to 5 s) and exits 0. Needs the SDK built once:
// `cd sdks/typescript && npm ci && npm run build`. No token unless COMPOSER_TOKEN is set (the
// bench server runs --insecure).
import { Worker } from "../../sdks/typescript/dist/index.js";

const [address, queue, slots] = process.argv.slice(2);
if (!address || !queue || !slots) {
  process.stderr.write("usage: node bench/ts_worker/worker.mjs HOST:PORT QUEUE SLOTS\n");
  process.exit(2);
}
const worker = new Worker({ address, slots: Number(slots), pollWaitMs: 1_000, drainTimeoutMs: 5_000 });
const noop = async () => ({});
for (const name of ["step1", "step2", "step3"]) worker.task(queue, name, noop);

const report = setInterval(() => process.stdout.write(`${worker.stats.completed}\n`), 50);
try {
  await worker.run();
} finally {
  clearInterval(report);
  process.stdout.write(`${worker.stats.completed}\n`);
}
process.exit(0);
