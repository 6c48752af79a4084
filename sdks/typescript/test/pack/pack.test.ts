// `npm pack` gives a tarball that installs and imports in a fresh folder: both entry points, the
// declaration files (a strict TypeScript program type-checks against them) and the bin. The
// optional peer @opentelemetry/api is not installed there: the worker and the client work without it.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { PACKAGE } from "../integration/harness.js";

test("pack: the tarball installs and imports in a fresh folder", { timeout: 300_000 }, () => {
  const folder = mkdtempSync(join(tmpdir(), "composer-ts-pack-"));
  try {
    const npm = (args: string[], cwd: string): string => execFileSync("npm", args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    npm(["pack", "--pack-destination", folder, "--silent"], PACKAGE);
    const tarball = readdirSync(folder).find((f) => f.endsWith(".tgz"));
    assert.ok(tarball, "npm pack made no tarball");
    const app = join(folder, "app");
    execFileSync("mkdir", ["-p", app]);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
    npm(["install", "--no-audit", "--no-fund", "--prefer-offline", join(folder, tarball), `typescript@${require_ts_version()}`, "@types/node@20"], app);
    writeFileSync(
      join(app, "main.ts"),
      `import { Client, Worker, NonRetryableError, isNotFound, type TaskContext } from "@composer-dev/composer";
import { Client as WebClient } from "@composer-dev/composer/web";
const worker = new Worker({ address: "127.0.0.1:1", slots: 2 });
worker.task("q", "t", async (ctx: TaskContext) => {
  if (!ctx.input) throw new NonRetryableError("no input", { code: "NO_INPUT" });
  return { ok: true, attempt: ctx.attempt };
});
const client = new Client({ address: "127.0.0.1:1" });
const web = new WebClient({ baseUrl: "http://127.0.0.1:1" });
const guard: (e: unknown) => boolean = isNotFound;
// Without @opentelemetry/api: the call still goes out (and finds no server), the worker serves and stops.
const start = await client.startRun("wf", {}, { signal: AbortSignal.timeout(10_000) }).then(() => "started", (e: { code?: string }) => e.code);
const quiet = { debug() {}, info() {}, warn() {}, error() {} };
const serving = new Worker({ address: "127.0.0.1:1", queues: ["q"], logger: quiet });
const served = serving.serve();
setTimeout(() => serving.stop(), 200);
await served;
console.log(JSON.stringify({ worker: worker.queues, client: typeof client.startRun, web: typeof web.watchRun, guard: typeof guard, start }));
client.close();
`,
    );
    writeFileSync(
      join(app, "tsconfig.json"),
      JSON.stringify({ compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, noEmit: false, outDir: "out", types: ["node"] }, files: ["main.ts"] }),
    );
    execFileSync(join(app, "node_modules", ".bin", "tsc"), ["-p", "."], { cwd: app, encoding: "utf8" });
    const out = execFileSync("node", ["out/main.js"], { cwd: app, encoding: "utf8" });
    assert.ok(!existsSync(join(app, "node_modules", "@opentelemetry", "api")), "the optional peer was installed");
    assert.deepEqual(JSON.parse(out), { worker: ["q"], client: "function", web: "function", guard: "function", start: "UNAVAILABLE" });
    const bin = join(app, "node_modules", ".bin", "composer-code-runner-js");
    assert.ok(existsSync(bin));
    assert.match(execFileSync(bin, ["--help"], { encoding: "utf8" }), /Serves JavaScript CODE nodes/);
    const packed = execFileSync("tar", ["-tzf", join(folder, tarball)], { encoding: "utf8" });
    assert.ok(packed.includes("package/dist/web.d.ts") && packed.includes("package/dist/index.d.ts"));
    assert.ok(!packed.includes("package/src/") && !packed.includes("dist-test"), "only dist and the README are packed");
  } finally {
    rmSync(folder, { recursive: true, force: true });
  }
});

function require_ts_version(): string {
  return "5.9.3";
}
