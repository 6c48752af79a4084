// Versions in the dashboard: the workflow page shows two versions side by side with the nodes added,
// removed and changed marked, and checks the runs in flight against the newer one
// (CheckWorkflowVersion); a run moved to another version (MigrateRuns) says so on its page.
import AxeBuilder from "@axe-core/playwright";
import { expect, test } from "@playwright/test";
import { join } from "node:path";

import { SCREENSHOTS, graphNode, guardPage, hex, openWithToken, useStack } from "./harness";

const stack = useStack();

test("two versions side by side: D marked added, C changed; the run in flight checks compatible", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const name = `versions-${s}`;
  const queue = `nobody-serves-${s}`; // no worker: the run waits in A
  const client = stack.client();
  await client.registerWorkflow(`
name: ${name}
nodes:
  - { id: A, type: TASK, queue: ${queue}, task: a }
  - { id: B, type: TASK, queue: ${queue}, task: b }
  - { id: C, type: TASK, queue: ${queue}, task: c }
edges:
  - { from: A, to: B }
  - { from: B, to: C }
`);
  const run = await client.startRun(name, {});
  await client.registerWorkflow(`
name: ${name}
nodes:
  - { id: A, type: TASK, queue: ${queue}, task: a }
  - { id: B, type: TASK, queue: ${queue}, task: b }
  - { id: C, type: TASK, queue: ${queue}, task: c2 }
  - { id: D, type: TASK, queue: ${queue}, task: d }
edges:
  - { from: A, to: B }
  - { from: B, to: C }
  - { from: C, to: D }
`);

  await openWithToken(page, stack, stack.token("reader"), `/workflows/${name}`);
  const compare = page.getByRole("region", { name: "Compare versions" });
  // by default the newest version against the one before it
  await expect(compare.getByLabel("From version")).toHaveValue("1");
  await expect(compare.getByLabel("To version")).toHaveValue("2");
  await expect(compare.locator(".change-summary")).toHaveText("v1 → v2: nodes 1 added, 0 removed, 1 changed.");

  // the newer side: D added, C changed (its task, and its new edge to D), A and B as they were
  const newer = compare.getByRole("region", { name: "v2 (to)" });
  const newerNodes = newer.getByRole("table", { name: "Nodes of v2" });
  await expect(newerNodes.locator("tr[data-node='D']")).toContainText("+ added");
  await expect(newerNodes.locator("tr[data-node='C']")).toContainText("~ changed task, next");
  await expect(newerNodes.locator("tr[data-node='A']")).toContainText("unchanged");
  await expect(newerNodes.locator("tr[data-node='B']")).toContainText("unchanged");
  await expect(newer.locator("svg.graph g.node[data-node='D']")).toHaveAttribute("aria-label", "TASK D: added");
  await expect(newer.locator("svg.graph g.node[data-node='D'] .state")).toHaveText("+ added");
  await expect(newer.locator("svg.graph g.node[data-node='C']")).toHaveAttribute("aria-label", "TASK C: changed");
  await expect(newer.locator("svg.graph g.node[data-node='A']")).toHaveAttribute("aria-label", "TASK A: unchanged");
  // the older side has no D; its C is the one that changed
  const older = compare.getByRole("region", { name: "v1 (from)" });
  await expect(older.locator("svg.graph g.node")).toHaveCount(3);
  await expect(older.getByRole("table", { name: "Nodes of v1" }).locator("tr[data-node='C']")).toContainText("~ changed");
  // what changed, field by field
  const changes = compare.getByRole("list", { name: "Changes from v1 to v2" });
  await expect(changes.locator("li[data-node='C']")).toContainText("task: c → c2");
  await expect(changes.locator("li[data-node='C']")).toContainText("next: (none) → D");
  await expect(changes.locator("li[data-node='D']")).toContainText(`+ added D TASK ${queue} / d`);
  await expect(changes.locator("li[data-node='A']")).toHaveCount(0);

  // the other way round: D is removed going from v2 to v1 (the pick lives in the address)
  await compare.getByLabel("From version").selectOption("2");
  await compare.getByLabel("To version").selectOption("1");
  await expect(compare.locator(".change-summary")).toHaveText("v2 → v1: nodes 0 added, 1 removed, 1 changed.");
  await expect(compare.getByRole("region", { name: "v2 (from)" }).locator("svg.graph g.node[data-node='D']")).toHaveAttribute("aria-label", "TASK D: removed");
  expect(new URL(page.url()).searchParams.get("from")).toBe("2");
  await expect(page.getByRole("button", { name: "Check runs in flight against v1" })).toBeVisible();
  await compare.getByLabel("From version").selectOption("1");
  await compare.getByLabel("To version").selectOption("2");

  // the check: the run waits in A, which v2 leaves as it was; C and D come later
  await page.getByRole("button", { name: "Check runs in flight against v2" }).click();
  const verdicts = page.getByRole("list", { name: "Runs by verdict" });
  await expect(page.getByText("Checked 1 run in flight against v2.")).toBeVisible();
  await expect(verdicts.locator("[data-verdict='COMPATIBLE'] .count-value")).toHaveText("1");
  for (const verdict of ["IDENTICAL", "INCOMPATIBLE", "UNREPLAYABLE"]) {
    await expect(verdicts.locator(`[data-verdict='${verdict}'] .count-value`)).toHaveText("0");
  }
  const row = page.getByRole("table", { name: "Runs in flight that are not identical under v2" }).locator(`tr[data-run='${run.runId}']`);
  await expect(row).toHaveAttribute("data-verdict", "COMPATIBLE");
  await expect(row).toContainText("v1");
  await expect(row).toContainText("compatible");
  await expect(row).toContainText("node_added D");
  await expect(row).toContainText("node_changed C");
  await page.screenshot({ path: join(SCREENSHOTS, "versions-compared.png"), fullPage: true });

  const axe = await new AxeBuilder({ page }).analyze();
  const serious = axe.violations.filter((v) => v.impact === "serious" || v.impact === "critical").map((v) => `${v.id}: ${v.help}`);
  expect(serious).toEqual([]);

  // the run id opens the run
  await row.getByRole("link", { name: run.runId }).click();
  await expect(page).toHaveURL(new RegExp(`/runs/${run.runId}$`));
  await expect(page.locator(".run-header .facts")).toContainText(`${name} v1`);
  check();
});

test("a run moved to another version says so in its history, and its page follows the new version", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const name = `moving-${s}`;
  const served = `moving-${s}`;
  const unserved = `nobody-serves-${s}`; // the run waits in B
  stack.worker((w) => w.task(served, "a", async () => ({ done: "a" })));
  const client = stack.client();
  await client.registerWorkflow(`
name: ${name}
nodes:
  - { id: A, type: TASK, queue: ${served}, task: a }
  - { id: B, type: TASK, queue: ${unserved}, task: b }
edges:
  - { from: A, to: B }
`);
  const run = await client.startRun(name, {});
  // v2 calls A "first" and adds C after B
  await client.registerWorkflow(`
name: ${name}
nodes:
  - { id: first, type: TASK, queue: ${served}, task: a }
  - { id: B, type: TASK, queue: ${unserved}, task: b }
  - { id: C, type: TASK, queue: ${unserved}, task: c }
edges:
  - { from: first, to: B }
  - { from: B, to: C }
`);

  await openWithToken(page, stack, stack.token("reader"), `/runs/${run.runId}`);
  const facts = page.locator(".run-header .facts");
  await expect(facts).toContainText(`${name} v1`);
  await expect(graphNode(page, "A")).toHaveAttribute("data-status", "COMPLETED");
  await expect(graphNode(page, "B")).toHaveAttribute("data-status", /SCHEDULED|RUNNING/);
  await expect(facts).not.toContainText("moved from");

  // A has settled, so the move may rename it
  const reloads: string[] = [];
  page.on("framenavigated", (frame) => frame === page.mainFrame() && reloads.push(frame.url()));
  const started = await client.raw.runs.migrateRuns({ filter: { workflowName: name }, targetVersion: 2, nodeMapping: { A: "first" } }, client.callOptions());
  const operation = await client.waitBulkOperation(started.operation?.operationId ?? "", { timeoutMs: 30_000 });
  expect([operation.status, operation.succeeded, operation.failed], JSON.stringify(operation.failures)).toEqual(["SUCCEEDED", 1, 0]);

  // live, without a reload: the history line, the version in the header, the new graph
  const moved = page.locator(".timeline li[data-event='run_migrated']");
  await expect(moved).toHaveCount(1);
  await expect(moved).toContainText("moved from v1 to v2, renaming A → first");
  await expect(facts).toContainText(`${name} v2`);
  await expect(facts).toContainText("(moved from v1)");
  await expect(page.getByRole("link", { name: `${name} v2` })).toHaveAttribute("href", `/workflows/${name}?version=2`);
  await expect(graphNode(page, "first")).toHaveAttribute("data-status", "COMPLETED");
  await expect(graphNode(page, "B")).toHaveAttribute("data-status", /SCHEDULED|RUNNING/);
  await expect(graphNode(page, "C")).toHaveAttribute("data-status", "NOT_STARTED");
  await expect(graphNode(page, "A")).toHaveCount(0);
  // entries written before the move keep the old id and say the new one; the node's detail finds them
  const completedA = page.locator(".timeline li[data-event='node_completed']").first();
  await expect(completedA.locator(".mono").first()).toHaveText("A");
  await expect(completedA).toContainText("(now first)");
  await graphNode(page, "first").click();
  await expect(page.getByRole("complementary").locator("table.attempts")).toContainText("node_completed");
  expect(reloads, "the page follows the move without reloading").toEqual([]);
  check();
});
