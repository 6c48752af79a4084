// What a token may see and do: a reader gets no action button anywhere, a namespace's token never
// sees another namespace's runs, an admin switches namespace, an expired token goes back to login.
import { expect, test } from "@playwright/test";
import { NonRetryableError } from "@composer-dev/composer";

import { graphNode, guardPage, hex, openWithToken, useStack } from "./harness";

// no clock leeway: a token with a 2 s lifetime is refused 2 s after it was minted
const stack = useStack(["--auth-leeway", "0s"]);

const workflow = (name: string, queue: string): string => `
name: ${name}
nodes:
  - { id: step, type: TASK, queue: ${queue}, task: step }
  - { id: approval, type: WAIT_FOR_EVENT, event: approved }
edges:
  - { from: step, to: approval }
`;

test("a reader sees runs, graphs and history but no action button", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  stack.worker((w) => {
    w.task(`q-${s}`, "step", async () => ({ ok: true }));
    w.task(`q-${s}`, "boom", async () => {
      throw new NonRetryableError("boom");
    });
  });
  const client = stack.client();
  await client.registerWorkflow(workflow(`readonly-${s}`, `q-${s}`));
  const waiting = await client.startRun(`readonly-${s}`, {});
  await client.registerWorkflow(`
name: failing-${s}
nodes:
  - { id: boom, type: TASK, queue: q-${s}, task: boom }
`);
  const failed = await client.startRun(`failing-${s}`, {});

  await openWithToken(page, stack, stack.token("reader"), `/runs/${waiting.runId}`);
  await expect(graphNode(page, "approval")).toHaveAttribute("data-status", "WAITING");
  await expect(page.getByRole("region", { name: "Actions" })).toHaveCount(0);
  await expect(page.getByRole("button", { name: /cancel|retry|send event/i })).toHaveCount(0);

  await page.getByRole("link", { name: `readonly-${s} v1` }).click();
  await expect(page.getByLabel(`Source of readonly-${s} v1`)).toContainText("WAIT_FOR_EVENT");
  await expect(page.getByRole("button", { name: "Start run" })).toHaveCount(0);

  // the same run, for an operator: every action it may take is there
  const operator = await page.context().newPage();
  await openWithToken(operator, stack, stack.token("operator"), `/runs/${waiting.runId}`);
  await expect(operator.getByRole("button", { name: "Cancel run" })).toBeVisible();
  await expect(operator.getByRole("button", { name: "Send event" })).toBeVisible();
  await operator.close();

  // the failed run: no retry for a reader, in the run page or the failed view
  await expect.poll(async () => (await client.getRun(failed.runId)).status, { timeout: 30_000 }).toBe("FAILED");
  await page.goto(`${stack.url}/runs/${failed.runId}`);
  await expect(page.locator("#run-title .badge")).toHaveText("failed");
  await expect(page.getByRole("button", { name: /retry/i })).toHaveCount(0);
  await page.getByRole("link", { name: "Failed", exact: true }).click();
  await expect(page.locator(`tr[data-run="${failed.runId}"]`)).toBeVisible();
  await expect(page.getByRole("button", { name: /retry selected/i })).toHaveCount(0);
  await expect(page.getByRole("checkbox")).toHaveCount(1); // only the "Live" switch
  check();
});

test("a namespace's token never shows another namespace's runs; an admin switches namespace", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const inA = stack.client(stack.token("admin", { namespace: `a-${s}` }));
  const inB = stack.client(stack.token("admin", { namespace: `b-${s}` }));
  await inA.registerWorkflow(workflow(`alpha-${s}`, `qa-${s}`));
  await inB.registerWorkflow(workflow(`beta-${s}`, `qb-${s}`));
  const runA = await inA.startRun(`alpha-${s}`, {}, { idempotencyKey: `key-a-${s}` });
  const runB = await inB.startRun(`beta-${s}`, {}, { idempotencyKey: `key-b-${s}` });

  await openWithToken(page, stack, stack.token("operator", { namespace: `a-${s}` }), "/runs");
  await expect(page.getByText(`namespace a-${s}`)).toBeVisible();
  await expect(page.locator(`tr[data-run="${runA.runId}"]`)).toBeVisible();
  await expect(page.locator(`tr[data-run="${runB.runId}"]`)).toHaveCount(0);
  await expect(page.getByRole("textbox", { name: "Namespace" })).toHaveCount(0);
  // searching for B's run by id finds nothing, and its page is not found
  await page.getByLabel("Run id or idempotency key").fill(runB.runId);
  await page.getByRole("button", { name: "Apply" }).click();
  await expect(page.getByText("No runs match these filters.")).toBeVisible();
  await page.goto(`${stack.url}/runs/${runB.runId}`);
  await expect(page.getByRole("alert")).toContainText("NOT_FOUND");
  await page.getByRole("link", { name: "Workflows" }).click();
  await expect(page.getByRole("link", { name: `alpha-${s}` })).toBeVisible();
  await expect(page.getByRole("link", { name: `beta-${s}` })).toHaveCount(0);

  // an admin of A looks at B
  await page.getByRole("button", { name: "Log out" }).click();
  await openWithToken(page, stack, stack.token("admin", { namespace: `a-${s}` }), "/runs");
  await expect(page.locator(`tr[data-run="${runA.runId}"]`)).toBeVisible();
  await page.getByRole("textbox", { name: "Namespace" }).fill(`b-${s}`);
  await page.getByRole("button", { name: "Switch" }).click();
  await expect(page.locator(`tr[data-run="${runB.runId}"]`)).toBeVisible();
  await expect(page.locator(`tr[data-run="${runA.runId}"]`)).toHaveCount(0);
  await page.locator(`tr[data-run="${runB.runId}"] a.run-link`).click();
  await expect(graphNode(page, "step")).toBeVisible();
  check();
});

test("an expired token sends the user back to the login screen with a clear message", async ({ page }) => {
  const check = guardPage(page);
  await openWithToken(page, stack, stack.token("reader", { ttl: "2s" }), "/runs");
  // the token is taken out of the address bar at once
  expect(new URL(page.url()).hash).toBe("");
  // live refresh calls the server every few seconds; once the token expires it answers UNAUTHENTICATED
  await expect(page.getByRole("alert")).toContainText(/no longer accepts your token/, { timeout: 20_000 });
  await expect(page.getByLabel("Token")).toBeVisible();
  expect(await page.evaluate(() => sessionStorage.getItem("composer.token"))).toBeNull();
  // an already-expired token is refused at the door
  await page.getByLabel("Token").fill(stack.token("reader", { ttl: "1s" }));
  await page.waitForTimeout(1_500);
  await page.getByRole("button", { name: "Log in" }).click();
  await expect(page.getByText(/^This token expired at/)).toBeVisible();
  check();
});
