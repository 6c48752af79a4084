// Steering a run from the UI: send the event a waiting run expects, and cancel a running run.
import { expect, test } from "@playwright/test";

import { gate, graphNode, guardPage, hex, openWithToken, useStack } from "./harness";

const stack = useStack();

test("a run waiting for an event: the UI offers the event, sends it, and the run completes", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const queue = `approvals-${s}`;
  stack.worker((w) => w.task(queue, "notify", async (ctx) => ({ notified: ctx.input })));
  const client = stack.client();
  await client.registerWorkflow(`
name: approve-${s}
nodes:
  - { id: ask, type: TASK, queue: ${queue}, task: notify }
  - { id: approval, type: WAIT_FOR_EVENT, event: approved }
  - { id: done, type: TASK, queue: ${queue}, task: notify, input: "\${nodes.approval.output}" }
edges:
  - { from: ask, to: approval }
  - { from: approval, to: done }
output: "\${nodes.done.output}"
`);
  const run = await client.startRun(`approve-${s}`, { who: "ada" });
  await openWithToken(page, stack, stack.token("client"), `/runs/${run.runId}`);

  await expect(graphNode(page, "approval")).toHaveAttribute("data-status", "WAITING");
  const form = page.getByRole("form", { name: "Send an event" });
  await expect(form.getByText("Waiting for: approved")).toBeVisible();
  await expect(form.getByLabel("Event")).toHaveValue("approved");
  await form.getByLabel("Payload (JSON)").fill("{ not json");
  await form.getByRole("button", { name: "Send event" }).click();
  await expect(form.getByRole("alert")).toContainText("not valid JSON");
  await form.getByLabel("Payload (JSON)").fill('{"ok": true, "by": "ada"}');
  await form.getByRole("button", { name: "Send event" }).click();
  await expect(page.getByRole("region", { name: "Actions" }).getByRole("status")).toHaveText("Event approved delivered");

  await expect(graphNode(page, "approval")).toHaveAttribute("data-status", "COMPLETED");
  await expect(graphNode(page, "done")).toHaveAttribute("data-status", "COMPLETED");
  await expect(page.locator("#run-title .badge")).toHaveText("completed");
  await expect(page.getByLabel("Run output")).toContainText('"by": "ada"');
  // a client may send events but not cancel or retry
  await expect(page.getByRole("button", { name: "Cancel run" })).toHaveCount(0);
  check();
});

test("cancel a running run from the UI: its nodes show cancelled", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const queue = `slow-${s}`;
  const never = gate();
  stack.worker((w) => {
    w.task(queue, "first", async () => ({ ok: 1 }));
    w.task(queue, "hang", async (ctx) => {
      await Promise.race([never.wait, new Promise((r) => setTimeout(r, 60_000))]);
      return { late: ctx.attempt };
    });
  });
  const client = stack.client();
  await client.registerWorkflow(`
name: cancel-${s}
nodes:
  - { id: first, type: TASK, queue: ${queue}, task: first }
  - { id: split, type: FORK }
  - { id: hang, type: TASK, queue: ${queue}, task: hang }
  - { id: nap, type: WAIT, duration: 1h }
  - { id: after, type: JOIN }
edges:
  - { from: first, to: split }
  - { from: split, to: hang }
  - { from: split, to: nap }
  - { from: hang, to: after }
  - { from: nap, to: after }
`);
  const run = await client.startRun(`cancel-${s}`, {});
  await openWithToken(page, stack, stack.token("operator"), `/runs/${run.runId}`);
  await expect(graphNode(page, "hang")).toHaveAttribute("data-status", "RUNNING");
  await expect(graphNode(page, "nap")).toHaveAttribute("data-status", "WAITING");

  await page.getByRole("button", { name: "Cancel run" }).click();
  await page.getByLabel("Why cancel?").fill("customer changed their mind");
  await page.getByRole("button", { name: "Confirm cancel" }).click();

  await expect(page.locator("#run-title .badge")).toHaveText("cancelled");
  await expect(graphNode(page, "first")).toHaveAttribute("data-status", "COMPLETED");
  await expect(graphNode(page, "hang")).toHaveAttribute("data-status", "CANCELLED");
  await expect(graphNode(page, "nap")).toHaveAttribute("data-status", "CANCELLED");
  await expect(page.locator(".timeline")).toContainText("customer changed their mind");
  await expect(page.getByRole("button", { name: "Cancel run" })).toHaveCount(0);
  never.open();
  check();
});
