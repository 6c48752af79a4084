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

/** What the page received from one API call, as the browser's network events saw it. */
interface Answer {
  url: string;
  bytes: Buffer[];
  /** finished: the whole body arrived; failed: the page cancelled it (leaving a page). */
  end: "open" | "finished" | "failed";
}

/**
 * Every API answer the page receives from now on, read by the browser's own network events:
 * a stream's bytes as they arrive (so one the page leaves before its end still counts), a
 * finished answer's whole body.
 */
async function captureApi(page: Page): Promise<() => Promise<Answer[]>> {
  const cdp = await page.context().newCDPSession(page);
  const answers = new Map<string, Answer>();
  const pending: Promise<unknown>[] = [];
  cdp.on("Network.responseReceived", (event) => {
    if (!event.response.url.includes("/composer.v1.")) return;
    const answer: Answer = { url: event.response.url, bytes: [], end: "open" };
    answers.set(event.requestId, answer);
    if (event.response.url.endsWith("/WatchRun")) {
      pending.push(
        cdp.send("Network.streamResourceContent", { requestId: event.requestId }).then(
          (streamed) => answer.bytes.push(Buffer.from(streamed.bufferedData, "base64")),
          () => {},
        ),
      );
    }
  });
  cdp.on("Network.dataReceived", (event) => {
    if (event.data) answers.get(event.requestId)?.bytes.push(Buffer.from(event.data, "base64"));
  });
  cdp.on("Network.loadingFinished", (event) => {
    const answer = answers.get(event.requestId);
    if (!answer) return;
    answer.end = "finished";
    pending.push(
      cdp.send("Network.getResponseBody", { requestId: event.requestId }).then(
        (got) => answer.bytes.push(Buffer.from(got.body, got.base64Encoded ? "base64" : "utf8")),
        () => {},
      ),
    );
  });
  cdp.on("Network.loadingFailed", (event) => {
    const answer = answers.get(event.requestId);
    if (answer) answer.end = "failed";
  });
  await cdp.send("Network.enable");
  return async () => {
    await Promise.all(pending);
    return [...answers.values()];
  };
}

async function html(page: Page): Promise<string> {
  return page.evaluate(() => document.documentElement.outerHTML);
}

test("a run whose HTTP node used a secret shows the reference and the redaction, never the value, on every page and in every answer", async ({ page }) => {
  const check = guardPage(page);
  const api = await captureApi(page);
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
    await page.goto(`${stack.url}/runs/${ok.runId}`);
    await expect(page.locator("#run-title .badge")).toHaveText("completed");
    await expect(page.getByLabel("Run output")).toContainText('"echoed": "Bearer [secret partner_key]"');
    await graphNode(page, "call").click();
    const detail = page.getByRole("complementary");
    await expect(detail.getByLabel("Node output")).toContainText("[secret partner_key]");
    await expect(detail.getByLabel("Node input as the worker got it")).toContainText("${secrets.partner_key}");
    await expect(page.locator(".timeline li[data-event='run_completed']")).toHaveCount(1);
    seenPages.push(await html(page));

    // the failed run: its error holds the echo, redacted, on its page and in the failed view
    await page.goto(`${stack.url}/runs/${refused.runId}`);
    await expect(page.locator("#run-title .badge")).toHaveText("failed");
    await graphNode(page, "call").click();
    await expect(page.getByRole("group", { name: "Error" })).toContainText("refused: Bearer [secret partner_key]");
    seenPages.push(await html(page));
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
    const answers = await api();
    const paths = answers.map((r) => new URL(r.url).pathname);
    for (const rpc of ["RunService/ListRuns", "RunService/WatchRun", "RunService/GetRunHistory", "WorkflowService/GetWorkflow", "SecretService/ListSecrets"]) {
      expect(paths).toContain(`/composer.v1.${rpc}`);
    }
    const bytes = Buffer.from(value, "utf8");
    const carrying = answers.filter((r) => r.bytes.some((b) => b.includes(bytes) || b.toString("utf8").includes(value))).map((r) => r.url);
    expect(carrying, "answers carrying the value").toEqual([]);
    // an answer is read whole or cancelled by the page; a stream is read as it arrives. The
    // search reads the wire format: the redaction, which travels as text, is found in the
    // history and in the watch streams
    expect(answers.filter((r) => r.end === "open" && !r.url.endsWith("/WatchRun")).map((r) => r.url)).toEqual([]);
    const redaction = Buffer.from("[secret partner_key]", "utf8");
    for (const rpc of ["/GetRunHistory", "/WatchRun"]) {
      expect(answers.some((r) => r.url.endsWith(rpc) && r.bytes.some((b) => b.includes(redaction))), rpc).toBe(true);
    }
  } finally {
    endpoint.server.close();
  }
  check();
});
