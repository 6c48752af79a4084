// Large payloads (docs/payloads.md): a run's 150 KB input is offloaded to the blob store and the
// run carries a reference in its place. The run page shows the reference as a block (size, digest,
// first bytes) wherever it stands, whole or nested, and downloads the value through BlobService;
// the value itself is never put in the page. A failed download reads inline.
import AxeBuilder from "@axe-core/playwright";
import { expect, test } from "@playwright/test";
import { readFileSync } from "node:fs";

import { graphNode, guardPage, hex, openWithToken, useStack } from "./harness";

const stack = useStack();

test("an offloaded run input shows as size, digest and first bytes, downloads whole, and is never inlined", async ({ page }) => {
  const check = guardPage(page);
  const s = hex();
  const queue = `docs-${s}`;
  const name = `measure-${s}`;
  stack.worker((w) =>
    // workers get the value itself, never the reference
    w.task(queue, "measure", async (ctx) => ({ n: ctx.input.n, length: String(ctx.input.doc).length })),
  );
  const client = stack.client();
  await client.registerWorkflow(`
name: ${name}
nodes:
  - { id: measure, type: TASK, queue: ${queue}, task: measure }
output: { n: "\${nodes.measure.output.n}", length: "\${nodes.measure.output.length}", original: "\${input}" }
`);
  const input = { doc: "x".repeat(150_000), n: 7 };
  const started = await client.startRun(name, input);
  expect((await client.waitForRun(started.runId, { timeoutMs: 30_000 })).status).toBe("COMPLETED");
  // the run holds a reference in place of its input
  const stored = (await client.getRun(started.runId)).input as { $blob?: { sha256: string; size: number } };
  const ref = stored.$blob;
  expect(ref, "the run's input is a reference").toBeTruthy();
  const sha256 = ref?.sha256 ?? "";
  const short = sha256.slice(0, 12);
  expect(ref?.size).toBe(Buffer.byteLength(JSON.stringify(input)));

  await openWithToken(page, stack, stack.token("reader", { subject: "ada" }), `/runs/${started.runId}`);
  await expect(page.locator("#run-title .badge")).toHaveText("completed");

  // the run's input: the reference block alone
  const runInput = page.getByLabel("Run input");
  const block = runInput.locator(`.blob-ref[data-blob="${sha256}"]`);
  await expect(block.locator(".blob-meta")).toHaveText(`blob · 146.5 KiB · sha256 ${short}…`);
  await expect(block.locator(".blob-head-text")).toHaveText(/^\{"doc":"x{10,}/);
  await expect(block.locator(".blob-head")).toContainText("first bytes:");
  await expect(block.locator(".blob-head")).toHaveText(/…$/);

  // the run's output: plain JSON around the reference `${input}` passed along
  const runOutput = page.getByLabel("Run output");
  await expect(runOutput).toContainText('"length": 150000');
  await expect(runOutput).toContainText('"original": blob · 146.5 KiB');
  await expect(runOutput.locator(`.blob-ref[data-blob="${sha256}"]`)).toHaveCount(1);

  // the node's input as the worker got it is the same reference, in the node's detail
  await graphNode(page, "measure").click();
  const detail = page.getByRole("complementary");
  await expect(detail.getByLabel("Node input as the worker got it").locator(`.blob-ref[data-blob="${sha256}"] .blob-meta`)).toContainText("146.5 KiB");
  await expect(detail.getByLabel("Node output")).toContainText('"n": 7');

  // the history's details show references inline too
  await expect(page.locator(`.timeline .blob-ref[data-blob="${sha256}"]`).first()).toBeVisible();

  // download: the file is the value's JSON text, named after its digest
  const [download] = await Promise.all([page.waitForEvent("download"), block.getByRole("button", { name: `Download blob ${short}` }).click()]);
  expect(download.suggestedFilename()).toBe(`${short}.json`);
  const saved = readFileSync(await download.path());
  expect(saved.length).toBe(ref?.size);
  expect(JSON.parse(saved.toString("utf8"))).toEqual(input);
  await expect(block.getByRole("button", { name: `Download blob ${short}` })).toHaveText("Download");

  // a failed download (here the server answering NOT_FOUND) reads inline, the page goes on
  await page.route("**/composer.v1.BlobService/DownloadBlob", (route) =>
    route.fulfill({
      status: 200,
      headers: { "content-type": "application/grpc-web+proto", "grpc-status": "5", "grpc-message": "no such blob" },
      body: "",
    }),
  );
  await block.getByRole("button", { name: `Download blob ${short}` }).click();
  await expect(block.getByRole("alert")).toContainText("NOT_FOUND");
  await page.unroute("**/composer.v1.BlobService/DownloadBlob");
  // the blocks, their buttons and the error pass the accessibility checks the other pages do
  const axe = await new AxeBuilder({ page }).include(".blob-ref").analyze();
  expect(axe.violations.filter((v) => v.impact === "serious" || v.impact === "critical").map((v) => `${v.id}: ${v.help}`)).toEqual([]);
  await expect(page.locator("#run-title .badge")).toHaveText("completed");

  // the value is never in the page: at most the head's few hundred bytes of it
  const html = await page.evaluate(() => document.documentElement.outerHTML);
  expect(html.includes("x".repeat(150_000))).toBe(false);
  expect(html.includes("x".repeat(1_000))).toBe(false);
  check();
});
