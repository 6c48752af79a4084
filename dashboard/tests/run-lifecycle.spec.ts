// The main path: log in by pasting a token, start a run from the workflow page (its input checked
// against the schema first), watch the graph turn green live, open a node and read its output.
import { expect, test } from "@playwright/test";
import { join } from "node:path";

import { SCREENSHOTS, gate, graphNode, guardPage, hex, useStack } from "./harness";

const stack = useStack();

test("log in, start a run from the UI, watch every node turn green live, read a node's output", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const name = `order-${s}`;
  const queue = `shop-${s}`;
  const held = gate();
  stack.worker((w) => {
    w.task(queue, "charge", async (ctx) => ({ charged: ctx.input.amount, receipt: `R-${ctx.input.order}` }));
    w.task(queue, "pack", async () => {
      await held.wait; // the test looks at the graph mid-flight first
      return { box: "small" };
    });
    w.task(queue, "label", async () => ({ label: "L-1" }));
    w.task(queue, "ship", async (ctx) => ({ shipped: true, parts: Object.keys(ctx.input) }));
  });
  await stack.client().registerWorkflow(`
name: ${name}
description: charge, then pack and label in parallel, then ship
input_schema:
  type: object
  required: [order, amount]
  properties:
    order: { type: string }
    amount: { type: number, minimum: 1 }
nodes:
  - { id: charge, type: TASK, queue: ${queue}, task: charge, input: { order: "\${input.order}", amount: "\${input.amount}" } }
  - { id: split, type: FORK }
  - { id: pack, type: TASK, queue: ${queue}, task: pack }
  - { id: label, type: TASK, queue: ${queue}, task: label }
  - { id: both, type: JOIN }
  - { id: ship, type: TASK, queue: ${queue}, task: ship, input: "\${nodes.both.output}" }
edges:
  - { from: charge, to: split }
  - { from: split, to: pack }
  - { from: split, to: label }
  - { from: pack, to: both }
  - { from: label, to: both }
  - { from: both, to: ship }
output: "\${nodes.ship.output}"
`);

  // log in by pasting a token
  await page.goto(stack.url);
  await page.getByLabel("Token").fill(stack.token("operator", { subject: "ada" }));
  await page.getByRole("button", { name: "Log in" }).click();
  await expect(page.getByText("ada · operator")).toBeVisible();

  // the workflow page: source, graph, start form
  await page.getByRole("link", { name: "Workflows" }).click();
  await page.getByRole("link", { name }).click();
  await expect(page.getByRole("heading", { name: new RegExp(name) })).toBeVisible();
  await expect(page.getByLabel(`Source of ${name} v1`)).toContainText("charge, then pack and label");
  await expect(page.locator("svg.graph g.node")).toHaveCount(6);

  // an input that breaks the schema is refused in the page, before any call
  await page.getByLabel(/Input \(JSON\)/).fill('{"order": "A-1", "amount": 0}');
  await page.getByRole("button", { name: "Start run" }).click();
  await expect(page.getByRole("alert")).toContainText("input.amount must be at least 1");
  await page.getByLabel(/Input \(JSON\)/).fill('{"amount": 12}');
  await page.getByRole("button", { name: "Start run" }).click();
  await expect(page.getByRole("alert")).toContainText("input.order is required");
  await page.getByLabel(/Input \(JSON\)/).fill('{"order": "A-1", "amount": 12}');
  await page.getByRole("button", { name: "Start run" }).click();

  // the run page, live: charge done, pack held by the worker
  await expect(page).toHaveURL(/\/runs\/[0-9a-f-]{36}$/);
  await expect(graphNode(page, "charge")).toHaveAttribute("data-status", "COMPLETED");
  await expect(graphNode(page, "label")).toHaveAttribute("data-status", "COMPLETED");
  await expect(graphNode(page, "pack")).toHaveAttribute("data-status", "RUNNING");
  await expect(graphNode(page, "ship")).toHaveAttribute("data-status", "NOT_STARTED");
  await page.screenshot({ path: join(SCREENSHOTS, "run-graph-mid-flight.png"), fullPage: true });

  const reloads: string[] = [];
  page.on("framenavigated", (frame) => frame === page.mainFrame() && reloads.push(frame.url()));
  held.open();
  for (const node of ["charge", "split", "pack", "label", "both", "ship"]) {
    await expect(graphNode(page, node)).toHaveAttribute("data-status", "COMPLETED");
  }
  await expect(page.locator("#run-title .badge")).toHaveText("completed");
  expect(reloads, "the graph updates without reloading the page").toEqual([]);

  // a node's detail: its output, and who reported it (the worker token's subject)
  await graphNode(page, "charge").click();
  const detail = page.getByRole("complementary");
  await expect(detail.getByRole("heading", { name: "TASK charge" })).toBeVisible();
  await expect(detail.getByLabel("Node output")).toContainText('"receipt": "R-A-1"');
  await expect(detail.getByLabel("Node output")).toContainText('"charged": 12');
  await expect(detail.locator(".facts")).toContainText("Reported bydashboard-worker");
  // the input as the worker got it (templates rendered), and the worker's id
  await expect(detail.getByLabel("Node input as the worker got it")).toContainText('"order": "A-1"');
  await expect(detail.getByLabel("Node input as the worker got it")).toContainText('"amount": 12');
  await expect(detail.locator(".facts")).toContainText("Worker");
  await page.screenshot({ path: join(SCREENSHOTS, "node-detail.png"), fullPage: true });

  // keyboard: a node opens with Enter
  await graphNode(page, "ship").focus();
  await page.keyboard.press("Enter");
  await expect(detail.getByLabel("Node output")).toContainText('"shipped": true');

  // the run's output and its history
  await expect(page.getByLabel("Run output")).toContainText('"shipped": true');
  await expect(page.locator(".timeline li[data-event='run_completed']")).toHaveCount(1);
  await expect(page.locator(".timeline li[data-event='run_started']")).toContainText("by ada");
  check();
});
