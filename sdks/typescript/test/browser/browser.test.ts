// The /web entry point in a real browser: headless Chromium loads a page from a loopback origin
// the server allows (--cors-origins), starts a run and streams WatchRun to its end over grpc-web;
// the same page from an origin not on the list is refused.
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import { existsSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { build } from "esbuild";
import { chromium, type Browser } from "playwright-core";

import { Client, isBlobReference } from "../../src/index.js";
import { PACKAGE, ServerProcess, backingServices, hex, mintToken, oneTask, serving, worker as makeWorker } from "../integration/harness.js";

const CHROMIUM = process.env["CHROMIUM_PATH"] ?? "/usr/bin/chromium";

let services: ReturnType<typeof backingServices>;
let server: ServerProcess;
let allowed: Server;
let other: Server;
let browser: Browser;
let bundle = "";

function listen(html: string): Promise<Server> {
  const s = createServer((request, response) => {
    if (request.url?.startsWith("/page.js")) {
      response.writeHead(200, { "content-type": "text/javascript" }).end(bundle);
    } else {
      response.writeHead(200, { "content-type": "text/html" }).end(html);
    }
  });
  return new Promise((resolve) => s.listen(0, "127.0.0.1", () => resolve(s)));
}

const origin = (s: Server): string => `http://127.0.0.1:${(s.address() as AddressInfo).port}`;

before(async () => {
  const result = await build({
    entryPoints: [join(PACKAGE, "test", "browser", "page.ts")],
    bundle: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    write: false,
    logLevel: "error",
  });
  bundle = result.outputFiles[0]?.text ?? "";
  assert.ok(!bundle.includes("node:http2"), "the web bundle must not pull in Node modules");
  const html = '<!doctype html><meta charset="utf-8"><title>composer web test</title><script type="module" src="/page.js"></script>';
  allowed = await listen(html);
  other = await listen(html);
  services = backingServices();
  process.env["COMPOSER_TOKEN"] = mintToken(["admin"]);
  server = new ServerProcess(services.databaseUrl, services.redisUrl, ["--cors-origins", origin(allowed)]);
  await server.start();
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: apt-get install -y chromium`);
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
});

after(async () => {
  await browser?.close();
  allowed?.close();
  other?.close();
  await server?.stop();
  services?.drop();
});

async function load(pageOrigin: string, query: Record<string, string>): Promise<Record<string, unknown>> {
  const page = await browser.newPage();
  const errors: string[] = [];
  page.on("console", (m) => errors.push(m.text()));
  try {
    await page.goto(`${pageOrigin}/?${new URLSearchParams(query).toString()}`);
    await page.waitForFunction(() => window.composerResult !== undefined, undefined, { timeout: 60_000 });
    return (await page.evaluate(() => window.composerResult)) as Record<string, unknown>;
  } catch (error) {
    throw new Error(`${String(error)}\nbrowser console:\n${errors.join("\n")}`);
  } finally {
    await page.close();
  }
}

test("browser: a page from an allowed origin starts a run and watches it to the end over grpc-web", { timeout: 120_000 }, async () => {
  const s = hex();
  const queue = `web-${s}`;
  const worker = makeWorker(server.address, { slots: 2 });
  worker.task(queue, "slow_double", async (ctx) => {
    await new Promise((r) => setTimeout(r, 500));
    return { x: ctx.input.x * 2 };
  });
  const client = new Client({ address: server.address });
  try {
    await client.registerWorkflow(oneTask(queue, queue, "slow_double", 'input: { x: "${input.x}" }'));
    const result = await serving(worker, () =>
      load(origin(allowed), { server: `http://${server.address}`, token: process.env["COMPOSER_TOKEN"] ?? "", workflow: queue }),
    );
    assert.equal(result["ok"], true, JSON.stringify(result));
    assert.equal(result["created"], true);
    assert.deepEqual(result["output"], { result: { x: 40 } });
    const statuses = result["statuses"] as string[];
    assert.equal(statuses.at(-1), "COMPLETED");
    assert.ok(statuses.length >= 2 && statuses[0] === "RUNNING", `snapshots: ${statuses.join(",")}`);
    // common.proto documents RunCompleted; the server records run_completed: either passes.
    assert.ok((result["history"] as string[]).some((t) => /^run_?completed$/i.test(t)), JSON.stringify(result["history"]));
    const run = await client.getRun(String(result["runId"]));
    assert.deepEqual(run.labels, { from: "browser" });
  } finally {
    client.close();
  }
});

test("browser: a bad token from an allowed origin is refused UNAUTHENTICATED", { timeout: 60_000 }, async () => {
  const result = await load(origin(allowed), { server: `http://${server.address}`, token: "not-a-token", mode: "info" });
  assert.equal(result["ok"], false);
  assert.equal(result["unauthenticated"], true, JSON.stringify(result));
});

test("browser: the same page from an origin not on the allow-list is refused", { timeout: 60_000 }, async () => {
  const good = await load(origin(allowed), { server: `http://${server.address}`, token: process.env["COMPOSER_TOKEN"] ?? "", mode: "info" });
  assert.deepEqual(good, { ok: true, protocolVersion: good["protocolVersion"] });
  const refused = await load(origin(other), { server: `http://${server.address}`, token: process.env["COMPOSER_TOKEN"] ?? "", mode: "info" });
  assert.equal(refused["ok"], false, JSON.stringify(refused));
  assert.match(String(refused["error"]), /fetch|network|cors/i);
});

test("browser: downloadBlob and resolvePayload stream over grpc-web; uploadBlob cannot, and a large input goes inline", { timeout: 60_000 }, async () => {
  const s = hex();
  const client = new Client({ address: server.address });
  try {
    const value = { doc: "b".repeat(70_000), n: s };
    const ref = await client.uploadBlob(new TextEncoder().encode(JSON.stringify(value)));
    const name = `web-blob-${s}`;
    // No worker serves this queue: the run waits, its input as stored.
    await client.registerWorkflow(oneTask(name, name, "never"));
    const result = await load(origin(allowed), {
      server: `http://${server.address}`,
      token: process.env["COMPOSER_TOKEN"] ?? "",
      mode: "blob",
      sha256: ref.sha256,
      workflow: name,
    });
    assert.equal(result["ok"], true, JSON.stringify(result).slice(0, 500));
    assert.equal(result["size"], ref.size);
    assert.deepEqual(JSON.parse(String(result["text"])), value);
    assert.deepEqual(result["resolved"], { wrapped: value });
    assert.equal(result["upload"], "UNIMPLEMENTED");
    // The browser sent the 100 KB input inline; the server offloaded it.
    const big = await client.getRun(String(result["bigRunId"]));
    assert.ok(isBlobReference(big.input), JSON.stringify(big.input).slice(0, 300));
    assert.deepEqual(await client.resolvePayload(big.input), { doc: "w".repeat(100_000) });
    await client.cancelRun(big.runId, "test over");
  } finally {
    client.close();
  }
});
