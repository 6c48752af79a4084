// The order example's worker: the payments, inventory and shipping tasks of order.yaml.
// Run alone (`npm run worker`) it serves until Ctrl-C / SIGTERM, then drains; run-order.ts
// starts it in-process for a one-command demo.
import { createHash } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";

import { NonRetryableError, Worker, consoleLogger, type TaskContext } from "@composer-dev/composer";

interface ChargeInput {
  order: string;
  amount: number;
}

// COMPOSER_ADDRESS and COMPOSER_TOKEN are read by the SDK. A stop lets a poll already waiting
// return (its tasks would be stranded otherwise), so a short poll makes the demo exit quickly.
export const worker = new Worker({ slots: 8, pollWaitMs: 2_000, logger: consoleLogger(process.env["COMPOSER_LOG_LEVEL"] ?? "info") });

worker.task("payments", "charge", async (ctx: TaskContext) => {
  const input = ctx.input as ChargeInput;
  if (!(input.amount > 0)) throw new NonRetryableError("amount must be positive", { code: "BAD_AMOUNT" });
  // ctx.taskId is the same for every attempt: the payment provider's idempotency key.
  const id = "ch_" + createHash("sha256").update(ctx.taskId).digest("hex").slice(0, 12);
  ctx.logger.info(`charged ${input.amount} for order ${input.order}`);
  return { id, amount: input.amount };
});

// A plain (sync) function is a handler too.
worker.task("inventory", "reserve_stock", (ctx) => ({ sku: ctx.input.sku, reserved: true, charge: ctx.input.charge_id }));

worker.task("shipping", "ship", async (ctx) => {
  await sleep(200, undefined, { signal: ctx.signal }); // stops at once if the run is cancelled
  return { tracking: `TRK-${ctx.input.order}`, sku: ctx.input.sku };
});

worker.task("payments", "refund", async (ctx) => ({ refunded: ctx.input.charge }));

worker.task("payments", "void", async (ctx) => ({ voided: ctx.input.charge }));

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await worker.run(); // until SIGTERM / SIGINT: stop polling, drain, stop heartbeating
}
