// A run that used a secret, seen through the dashboard: an HTTP node sends the value to a local
// endpoint, which echoes it back in its answer (one run) and in its error (another); the value
// then appears nowhere the dashboard shows or receives, on any page the runs are seen through,
// while the reference `${secrets.partner_key}` and the redaction `[secret partner_key]` do.
import { expect, test, type Page } from "@playwright/test";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";

import { graphNode, guardPage, hex, openWithToken, useStack } from "./harness";

const stack = useStack(["--http-allow-loopback"], { secretsKey: true });

/** A loopback endpoint that echoes the Authorization header: as JSON on /ok, in a 400 on /fail. */
async function echoEndpoint(): Promise<{ url: string; seen: string[]; server: Server }> {
  const seen: string[] = [];
  const server = createServer((request: IncomingMessage, response) => {
    request.resume();
    request.on("end", () => {
      const auth = request.headers.authorization ?? "";
      seen.push(auth);
      if (request.url === "/fail") {
        response.writeHead(400, { "content-type": "text/plain" }).end(`refused: ${auth}`);
        return;
      }
      response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ auth }));
    });
  });
  await new Promise<void>((listening) => server.listen(0, "127.0.0.1", listening));
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, seen, server };
}

function calling(name: string, endpoint: string, path: string): string {
  return `
name: ${name}
nodes:
  - id: call
    type: HTTP
    http:
      method: POST
      url: "${endpoint}/${path}"
      headers: { Authorization: "Bearer \${secrets.partner_key}" }
      body: { note: "sent" }
output: { echoed: "\${nodes.call.output.body.auth}" }
`;
}

/** Every response body the page receives from now on (null when one could not be read). */
function captureResponses(page: Page): () => Promise<{ url: string; body: Buffer | null }[]> {
  const responses: Promise<{ url: string; body: Buffer | null }>[] = [];
  page.on("response", (response) => {
    const url = response.url();
    responses.push(response.body().then((body) => ({ url, body }), () => ({ url, body: null })));
  });
  return () => Promise.all(responses);
}

/** Resolves once a WatchRun answer the page receives from now on has come to its end. */
function watchEnded(page: Page): Promise<unknown> {
  return page.waitForEvent("requestfinished", { predicate: (r) => r.url().endsWith("/composer.v1.RunService/WatchRun"), timeout: 30_000 });
}

async function html(page: Page): Promise<string> {
  return page.evaluate(() => document.documentElement.outerHTML);
}

test("a run whose HTTP node used a secret shows the reference and the redaction, never the value, on every page and in every answer", async ({ page }) => {
  const check = guardPage(page);
  const responses = captureResponses(page);
  const s = hex();
  const namespace = `secret-runs-${s}`;
  const value = `pk_live_${hex(24)}`;
  const operator = stack.token("operator", { namespace, subject: `ops-${s}` });
  stack.cli(["secret", "set", "partner_key"], operator, value);
  const endpoint = await echoEndpoint();
  try {
    const client = stack.client(stack.token("admin", { namespace }));
    await client.registerWorkflow(calling(`partner-${s}`, endpoint.url, "ok"));
    await client.registerWorkflow(calling(`refused-${s}`, endpoint.url, "fail"));
    const ok = await client.startRun(`partner-${s}`, {});
    const refused = await client.startRun(`refused-${s}`, {});
    expect((await client.waitForRun(ok.runId, { timeoutMs: 30_000 })).status).toBe("COMPLETED");
    expect((await client.waitForRun(refused.runId, { timeoutMs: 30_000 })).status).toBe("FAILED");
    // the endpoint got the value itself, both times
    expect(endpoint.seen).toEqual([`Bearer ${value}`, `Bearer ${value}`]);

    const seenPages: string[] = [];
    await openWithToken(page, stack, operator, "/runs");
    await expect(page.locator(`tr[data-run="${ok.runId}"]`)).toBeVisible();
    await expect(page.locator(`tr[data-run="${refused.runId}"]`)).toBeVisible();
    seenPages.push(await html(page));

    // the completed run: its output holds the echo, redacted; the node's input the reference
    // each run page is left once its WatchRun stream ended (after a finished run's snapshot),
    // so that answer too is read whole
    let watched = watchEnded(page);
    await page.goto(`${stack.url}/runs/${ok.runId}`);
    await expect(page.locator("#run-title .badge")).toHaveText("completed");
    await expect(page.getByLabel("Run output")).toContainText('"echoed": "Bearer [secret partner_key]"');
    await graphNode(page, "call").click();
    const detail = page.getByRole("complementary");
    await expect(detail.getByLabel("Node output")).toContainText("[secret partner_key]");
    await expect(detail.getByLabel("Node input as the worker got it")).toContainText("${secrets.partner_key}");
    await expect(page.locator(".timeline li[data-event='run_completed']")).toHaveCount(1);
    seenPages.push(await html(page));
    await watched;

    // the failed run: its error holds the echo, redacted, on its page and in the failed view
    watched = watchEnded(page);
    await page.goto(`${stack.url}/runs/${refused.runId}`);
    await expect(page.locator("#run-title .badge")).toHaveText("failed");
    await graphNode(page, "call").click();
    await expect(page.getByRole("group", { name: "Error" })).toContainText("refused: Bearer [secret partner_key]");
    seenPages.push(await html(page));
    await watched;
    await page.getByRole("link", { name: "Failed", exact: true }).click();
    await expect(page.locator(`tr[data-run="${refused.runId}"]`)).toContainText("[secret partner_key]");
    seenPages.push(await html(page));

    // the workflow's page shows its source, where the reference is written
    await page.goto(`${stack.url}/workflows/partner-${s}`);
    await expect(page.getByLabel(`Source of partner-${s} v1`)).toContainText("${secrets.partner_key}");
    seenPages.push(await html(page));

    // the Secrets page: the name and its version
    await page.getByRole("link", { name: "Secrets" }).click();
    await expect(page.locator('tr[data-secret="partner_key"] td.version')).toHaveText("1");
    seenPages.push(await html(page));

    for (const [i, shown] of seenPages.entries()) expect(shown.includes(value), `page ${i} shows the value`).toBe(false);
    const answers = await responses();
    const paths = answers.map((r) => new URL(r.url).pathname);
    for (const rpc of ["RunService/ListRuns", "RunService/WatchRun", "RunService/GetRunHistory", "WorkflowService/GetWorkflow", "SecretService/ListSecrets"]) {
      expect(paths).toContain(`/composer.v1.${rpc}`);
    }
    const bytes = Buffer.from(value, "utf8");
    const carrying = answers.filter((r) => r.body && (r.body.includes(bytes) || r.body.toString("utf8").includes(value))).map((r) => r.url);
    expect(carrying, "answers carrying the value").toEqual([]);
    // every answer was read whole, and the search reads the wire format: the redaction, which
    // travels as text, is found in what was read
    const api = answers.filter((r) => r.url.includes("/composer.v1."));
    expect(api.filter((r) => r.body === null).map((r) => r.url)).toEqual([]);
    const redaction = Buffer.from("[secret partner_key]", "utf8");
    for (const rpc of ["/GetRunHistory", "/WatchRun"]) {
      expect(api.some((r) => r.url.endsWith(rpc) && r.body?.includes(redaction)), rpc).toBe(true);
    }
  } finally {
    endpoint.server.close();
  }
  check();
});
