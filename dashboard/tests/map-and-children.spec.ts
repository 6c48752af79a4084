// Nodes that fan out: a MAP opens its items, a SUB_WORKFLOW opens its child run, and the child
// run's page links back to its parent.
import { expect, test } from "@playwright/test";

import { graphNode, guardPage, hex, openWithToken, useStack } from "./harness";

const stack = useStack();

test("a MAP node opens its items; a SUB_WORKFLOW node opens its child run", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const queue = `fan-${s}`;
  stack.worker((w) => {
    w.task(queue, "square", async (ctx) => ({ square: ctx.input.n * ctx.input.n }));
    w.task(queue, "sum", async (ctx) => ({ total: (ctx.input.values as { square: number }[]).reduce((a, v) => a + v.square, 0) }));
  });
  const client = stack.client();
  await client.registerWorkflow(`
name: child-${s}
nodes:
  - { id: sum, type: TASK, queue: ${queue}, task: sum, input: { values: "\${input.values}" } }
output: "\${nodes.sum.output}"
`);
  await client.registerWorkflow(`
name: parent-${s}
nodes:
  - { id: squares, type: MAP, items: input.numbers, concurrency: 2, queue: ${queue}, task: square, input: { n: "\${item}" } }
  - { id: total, type: SUB_WORKFLOW, workflow: child-${s}, input: { values: "\${nodes.squares.output}" } }
edges:
  - { from: squares, to: total }
output: "\${nodes.total.output}"
`);
  const run = await client.startRun(`parent-${s}`, { numbers: [1, 2, 3, 4] });
  await openWithToken(page, stack, stack.token("reader"), `/runs/${run.runId}`);
  await expect(page.locator("#run-title .badge")).toHaveText("completed");
  await expect(graphNode(page, "squares")).toHaveAttribute("data-status", "COMPLETED");
  await expect(graphNode(page, "squares")).toContainText("4/4 items");
  await expect(page.getByLabel("Run output")).toContainText('"total": 30');

  await graphNode(page, "squares").click();
  const detail = page.getByRole("complementary");
  const items = detail.getByRole("table").last();
  await expect(detail.getByRole("heading", { name: "Items (4)" })).toBeVisible();
  await expect(items.locator("tbody tr")).toHaveCount(4);
  await expect(items.locator("tbody tr").nth(3)).toContainText('"square": 16');

  await graphNode(page, "total").click();
  await expect(detail.getByRole("heading", { name: "Child runs" })).toBeVisible();
  const child = detail.locator("ul.children a");
  await expect(child).toHaveCount(1);
  await child.click();
  await expect(page.getByRole("link", { name: `child-${s} v1` })).toBeVisible();
  await expect(page.locator("#run-title .badge")).toHaveText("completed");
  await page.getByRole("link", { name: run.runId }).click();
  await expect(page).toHaveURL(new RegExp(`/runs/${run.runId}$`));
  check();
});
