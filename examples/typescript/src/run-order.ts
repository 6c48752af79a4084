// One command: start the order worker, register order.yaml, run an order, approve it, print the output.
//
//   composer dev                  # in another terminal (or already running)
//   npm start                     # in examples/typescript, after npm install && npm run build
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";

import { Client } from "@composer-dev/composer";

import { worker } from "./workers.js";

const client = new Client(); // COMPOSER_ADDRESS (default 127.0.0.1:7070), COMPOSER_TOKEN
const serving = worker.serve();
try {
  const workflow = await client.registerWorkflow(await readFile(new URL("../order.yaml", import.meta.url), "utf8"));
  console.log(`registered ${workflow.name} v${workflow.version}`);
  const orderId = `A-${randomBytes(3).toString("hex")}`;
  const run = await client.startRun(workflow.name, { order_id: orderId, amount: 12.5, sku: "BOOK-1" }, { idempotencyKey: orderId });
  console.log(`started run ${run.runId} for order ${orderId}`);
  // An event sent before the run reaches its WAIT_FOR_EVENT is kept until it does.
  await client.sendEvent("approval", { ok: true }, { runId: run.runId });
  console.log("sent approval");
  const output = await client.waitForResult(run.runId, { timeoutMs: 60_000 });
  console.log(JSON.stringify(output, null, 2));
} finally {
  worker.stop();
  await serving;
  client.close();
}
