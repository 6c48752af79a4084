// The page is safe and usable: the CSP header, payloads as text, accessibility (axe) and keyboard
// navigation; and the runs list: counts by status, filters, search, paging, QUEUED runs.
import AxeBuilder from "@axe-core/playwright";
import { expect, test, type Page } from "@playwright/test";
import { join } from "node:path";

import { SCREENSHOTS, graphNode, guardPage, hex, openWithToken, useStack } from "./harness";

const stack = useStack();

async function seriousViolations(page: Page): Promise<string[]> {
  const result = await new AxeBuilder({ page }).analyze();
  return result.violations
    .filter((v) => v.impact === "serious" || v.impact === "critical")
    .map((v) => `${v.id} (${v.impact}): ${v.help} — ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`);
}

test("the dashboard is served with the Content-Security-Policy, and client-side routes load index.html", async ({ request }) => {
  const home = await request.get(`${stack.url}/`);
  expect(home.status()).toBe(200);
  const csp = home.headers()["content-security-policy"] ?? "";
  for (const directive of ["default-src 'self'", "script-src 'self'", "style-src 'self'", "object-src 'none'", "frame-ancestors 'none'"]) {
    expect(csp).toContain(directive);
  }
  const html = await home.text();
  expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/); // no inline script
  expect(html).not.toContain("<style");
  const deep = await request.get(`${stack.url}/runs/00000000-0000-0000-0000-000000000000`);
  expect(deep.status()).toBe(200);
  expect(await deep.text()).toBe(html);
});

test("a payload carrying HTML is shown as text: no dialog, no request, no element", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const hostile = `<img src=x onerror="alert('xss')"><script>alert('xss')</script>`;
  stack.worker((w) => w.task(`evil-${s}`, "echo", async () => ({ html: hostile })));
  const client = stack.client();
  await client.registerWorkflow(`
name: evil-${s}
nodes:
  - { id: echo, type: TASK, queue: evil-${s}, task: echo }
output: "\${nodes.echo.output}"
`);
  const run = await client.startRun(`evil-${s}`, { note: hostile }, { labels: { kind: "hostile" } });
  await client.waitForRun(run.runId, { timeoutMs: 30_000 });

  const dialogs: string[] = [];
  const stray: string[] = [];
  page.on("dialog", (d) => (dialogs.push(d.message()), void d.dismiss()));
  page.on("request", (r) => {
    if (new URL(r.url()).pathname === "/x") stray.push(r.url());
  });
  await openWithToken(page, stack, stack.token("reader"), `/runs/${run.runId}`);
  await expect(page.locator("#run-title .badge")).toHaveText("completed");
  await expect(page.locator(".run-header .facts")).not.toContainText("Concurrency key"); // a run without a key shows none
  await graphNode(page, "echo").click();
  await expect(page.getByLabel("Node output")).toContainText(`<img src=x onerror=\\"alert('xss')\\">`);
  await expect(page.getByLabel("Run input")).toContainText("<script>alert('xss')</script>");
  await expect(page.locator("main img")).toHaveCount(0);
  await expect(page.locator("main script")).toHaveCount(0);
  expect(dialogs).toEqual([]);
  expect(stray).toEqual([]);
  check();
});

test("runs list: counts by status, filters, search, paging, keyboard navigation and live refresh", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const client = stack.client();
  await client.registerWorkflow(`
name: list-${s}
nodes:
  - { id: hold, type: WAIT_FOR_EVENT, event: go }
`);
  await client.registerWorkflow(`
name: list-${s}
description: the second version
nodes:
  - { id: hold, type: WAIT_FOR_EVENT, event: go }
  - { id: after, type: WAIT, duration: 1s }
edges:
  - { from: hold, to: after }
`);
  const v1: string[] = [];
  for (let i = 0; i < 12; i++) {
    const run = await client.startRun(`list-${s}`, { i }, { version: 1, idempotencyKey: `order-${s}-${String(i).padStart(2, "0")}`, labels: { team: i % 2 ? "red" : "blue" } });
    v1.push(run.runId);
  }
  const latest = await client.startRun(`list-${s}`, {}, { idempotencyKey: `other-${s}` });
  const cancelled = v1[0] ?? "";
  await client.cancelRun(cancelled, "test");

  await openWithToken(page, stack, stack.token("reader"), `/runs?workflow=list-${s}`);
  const counts = page.getByRole("list", { name: "Runs by status" });
  await expect(counts.locator("[data-count='RUNNING'] .count-value")).toHaveText("12");
  await expect(counts.locator("[data-count='CANCELLED'] .count-value")).toHaveText("1");
  const rows = page.locator("table.runs tbody tr");
  await expect(rows).toHaveCount(13);
  await page.screenshot({ path: join(SCREENSHOTS, "runs-list.png"), fullPage: true });

  // a count filters by its status
  await counts.locator("[data-count='CANCELLED']").click();
  await expect(rows).toHaveCount(1);
  await expect(rows.first()).toHaveAttribute("data-run", cancelled);
  await counts.getByRole("button", { name: /^all/ }).click();

  // label, version and search filters (the filters live in the address)
  await page.getByLabel("Labels").fill("team=red");
  await page.getByRole("button", { name: "Apply" }).click();
  await expect(rows).toHaveCount(6);
  expect(new URL(page.url()).searchParams.get("labels")).toBe("team=red");
  await page.getByRole("button", { name: "Clear" }).click();
  await page.goto(`${stack.url}/runs?workflow=list-${s}&version=2`);
  await expect(rows).toHaveCount(1);
  await expect(rows.first()).toHaveAttribute("data-run", latest.runId);
  await page.getByLabel("Run id or idempotency key").fill(`order-${s}-1`);
  await page.getByLabel("Version").fill("");
  await page.getByRole("button", { name: "Apply" }).click();
  await expect(rows).toHaveCount(2); // a key prefix: order-…-10 and order-…-11
  await page.getByLabel("Run id or idempotency key").fill(v1[5] ?? "");
  await page.getByRole("button", { name: "Apply" }).click();
  await expect(rows).toHaveCount(1);
  await page.getByRole("button", { name: "Clear" }).click();

  // paging: 10 per page
  await page.goto(`${stack.url}/runs?workflow=list-${s}`);
  await page.getByLabel("Per page").selectOption("10");
  await expect(rows).toHaveCount(10);
  await expect(rows.first()).toHaveAttribute("data-run", latest.runId);
  await page.getByRole("button", { name: "Next page" }).click();
  await expect(rows).toHaveCount(3);
  await expect(rows.last()).toHaveAttribute("data-run", cancelled);
  await expect(page.getByRole("button", { name: "Next page" })).toBeDisabled();
  await page.getByRole("button", { name: "Previous page" }).click();
  await expect(rows).toHaveCount(10);

  // keyboard: arrow keys walk the rows, Enter opens the run
  await rows.first().locator("a.run-link").focus();
  await page.keyboard.press("ArrowDown");
  await page.keyboard.press("ArrowDown");
  await expect(rows.nth(2).locator("a.run-link")).toBeFocused();
  await page.keyboard.press("ArrowUp");
  await expect(rows.nth(1).locator("a.run-link")).toBeFocused();
  const target = await rows.nth(1).getAttribute("data-run");
  await page.keyboard.press("Enter");
  await expect(page).toHaveURL(new RegExp(`/runs/${target}$`));

  // live: a run started elsewhere appears without a reload
  await page.goto(`${stack.url}/runs?workflow=list-${s}`);
  await expect(rows).toHaveCount(13);
  const fresh = await client.startRun(`list-${s}`, {});
  await expect(page.locator(`tr[data-run="${fresh.runId}"]`)).toBeVisible({ timeout: 10_000 });
  check();
});

test("a run QUEUED behind its concurrency key shows as queued in the list, its counts and its page, and may be cancelled", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const client = stack.client();
  await client.registerWorkflow(`
name: keyed-${s}
concurrency: { key: "input.k", max: 1 }
nodes:
  - { id: hold, type: WAIT_FOR_EVENT, event: go }
`);
  const key = `customer-${s}`;
  const first = await client.startRun(`keyed-${s}`, { k: key });
  const second = await client.startRun(`keyed-${s}`, { k: key });
  expect([first.status, second.status]).toEqual(["RUNNING", "QUEUED"]);

  await openWithToken(page, stack, stack.token("reader"), `/runs?workflow=keyed-${s}`);
  const counts = page.getByRole("list", { name: "Runs by status" });
  await expect(counts.locator("[data-count='QUEUED'] .count-value")).toHaveText("1");
  await expect(counts.locator("[data-count='RUNNING'] .count-value")).toHaveText("1");
  const rows = page.locator("table.runs tbody tr");
  await expect(rows).toHaveCount(2);
  await expect(page.locator(`tr[data-run="${second.runId}"] .badge`)).toHaveText("queued");
  await expect(page.locator(`tr[data-run="${first.runId}"] .badge`)).toHaveText("running");

  // the QUEUED count and the status filter both find it
  await counts.locator("[data-count='QUEUED']").click();
  await expect(rows).toHaveCount(1);
  await expect(rows.first()).toHaveAttribute("data-run", second.runId);
  await page.goto(`${stack.url}/runs?workflow=keyed-${s}`);
  await page.getByLabel("Status", { exact: true }).selectOption("QUEUED");
  await page.getByRole("button", { name: "Apply" }).click();
  await expect(rows).toHaveCount(1);
  await expect(rows.first()).toHaveAttribute("data-run", second.runId);
  expect(new URL(page.url()).searchParams.get("status")).toBe("QUEUED");

  // its page: the badge and the key; it turns running, live, once the first run ends
  await page.goto(`${stack.url}/runs/${second.runId}`);
  await expect(page.locator("#run-title .badge")).toHaveText("queued");
  const facts = page.locator(".run-header .facts");
  await expect(facts).toContainText("Concurrency key");
  await expect(facts).toContainText(key);
  await client.sendEvent("go", {}, { runId: first.runId });
  await expect(page.locator("#run-title .badge")).toHaveText("running", { timeout: 15_000 });
  await expect(facts).toContainText(key);

  // the first run ended with its key still shown
  await page.goto(`${stack.url}/runs/${first.runId}`);
  await expect(page.locator("#run-title .badge")).toHaveText("completed");
  await expect(facts).toContainText(key);

  // an operator may cancel a QUEUED run (it never held a slot)
  const third = await client.startRun(`keyed-${s}`, { k: key });
  expect(third.status).toBe("QUEUED");
  await openWithToken(page, stack, stack.token("operator"), `/runs/${third.runId}`);
  await expect(page.locator("#run-title .badge")).toHaveText("queued");
  await page.getByRole("button", { name: "Cancel run" }).click();
  await page.getByRole("button", { name: "Confirm cancel" }).click();
  await expect(page.locator("#run-title .badge")).toHaveText("cancelled");
  check();
});

test("no serious or critical accessibility violation on the main pages", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const client = stack.client();
  await client.registerWorkflow(`
name: a11y-${s}
input_schema: { type: object }
nodes:
  - { id: pick, type: SWITCH }
  - { id: left, type: WAIT, duration: 1s }
  - { id: right, type: WAIT_FOR_EVENT, event: go }
edges:
  - { from: pick, to: left, when: "input.left == true" }
  - { from: pick, to: right }
`);
  const run = await client.startRun(`a11y-${s}`, { left: true });
  await client.waitForRun(run.runId, { timeoutMs: 30_000 });

  await page.goto(stack.url);
  expect(await seriousViolations(page), "login").toEqual([]);
  await openWithToken(page, stack, stack.token("admin"), "/runs");
  await expect(page.locator("table.runs tbody tr").first()).toBeVisible();
  expect(await seriousViolations(page), "runs").toEqual([]);
  await page.goto(`${stack.url}/failed`);
  await expect(page.getByRole("heading", { name: "Failed runs" })).toBeVisible();
  expect(await seriousViolations(page), "failed").toEqual([]);
  await page.goto(`${stack.url}/runs/${run.runId}`);
  await expect(graphNode(page, "right")).toHaveAttribute("data-status", "SKIPPED");
  await graphNode(page, "left").click();
  await expect(page.getByRole("complementary")).toBeVisible();
  expect(await seriousViolations(page), "run").toEqual([]);
  await page.goto(`${stack.url}/workflows`);
  expect(await seriousViolations(page), "workflows").toEqual([]);
  await page.goto(`${stack.url}/workflows/a11y-${s}`);
  await expect(page.getByRole("button", { name: "Start run" })).toBeVisible();
  expect(await seriousViolations(page), "workflow").toEqual([]);
  check();
});
