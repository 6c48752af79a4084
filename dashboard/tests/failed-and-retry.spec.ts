// The failed view (the dead-letter queue): failing runs land there with their error; once the
// worker is fixed, retry from a run's page and bulk retry from the view resume them and they complete.
import { expect, test } from "@playwright/test";
import { NonRetryableError } from "@composer-dev/composer";
import { join } from "node:path";

import { SCREENSHOTS, graphNode, guardPage, hex, openWithToken, useStack } from "./harness";

const stack = useStack();

test("failing runs appear in the failed view; after the fix, retry from the run page and in bulk completes them", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const queue = `billing-${s}`;
  let fixed = false;
  stack.worker((w) => {
    w.task(queue, "prepare", async (ctx) => ({ prepared: ctx.input.n }));
    w.task(queue, "invoice", async (ctx) => {
      if (!fixed) throw new NonRetryableError("the billing service refused the invoice", { code: "BILLING_DOWN", details: { status: 503, n: ctx.input.n } });
      return { invoiced: ctx.input.n };
    });
  });
  const client = stack.client();
  await client.registerWorkflow(`
name: bill-${s}
nodes:
  - { id: prepare, type: TASK, queue: ${queue}, task: prepare, input: { n: "\${input.n}" } }
  - { id: invoice, type: TASK, queue: ${queue}, task: invoice, input: { n: "\${input.n}" } }
edges:
  - { from: prepare, to: invoice }
output: "\${nodes.invoice.output}"
`);
  const runs = await Promise.all([1, 2, 3].map((n) => client.startRun(`bill-${s}`, { n })));
  await Promise.all(runs.map((r) => client.waitForRun(r.runId, { timeoutMs: 30_000 })));

  await openWithToken(page, stack, stack.token("operator"), "/failed");
  const table = page.getByRole("table", { name: "Failed runs, newest first" });
  for (const run of runs) await expect(table.locator(`tr[data-run="${run.runId}"]`)).toContainText("BILLING_DOWN: the billing service refused the invoice");
  await page.screenshot({ path: join(SCREENSHOTS, "failed-view.png"), fullPage: true });

  fixed = true;
  // one run retried from its own page: its graph turns green live
  await table.locator(`tr[data-run="${runs[0]?.runId}"] a.run-link`).click();
  await graphNode(page, "invoice").click();
  const error = page.getByRole("group", { name: "Error" });
  await expect(error).toContainText("BILLING_DOWN: the billing service refused the invoice");
  await expect(error.getByLabel("Error details")).toContainText('"status": 503');
  await page.getByRole("button", { name: "Retry from failed nodes" }).click();
  await expect(graphNode(page, "invoice")).toHaveAttribute("data-status", "COMPLETED");
  await expect(page.locator("#run-title .badge")).toHaveText("completed");
  await expect(page.getByLabel("Node output")).toContainText('"invoiced": 1');
  await expect(page.locator(".timeline li[data-event='node_failed']")).toHaveCount(1);

  // the other two, together from the failed view
  await page.getByRole("link", { name: "Failed", exact: true }).click();
  await expect(table.locator("tbody tr")).toHaveCount(2);
  await table.getByLabel("Select every run on this page").check();
  await page.getByRole("button", { name: "Retry selected (2)" }).click();
  const results = page.getByRole("list", { name: "Retry results" });
  await expect(results.locator("li.ok")).toHaveCount(2);
  for (const run of runs) {
    const done = await client.waitForRun(run.runId, { timeoutMs: 30_000 });
    expect(done.status).toBe("COMPLETED");
    expect(done.output).toEqual({ invoiced: done.input && (done.input as { n: number }).n });
  }
  await expect(table.locator("tbody tr")).toHaveCount(0);
  check();
});
