// The real server for the integration tests: a fresh database per test process (dropped after),
// `composer serve` on a free loopback port with --auth-secret (and a temporary --secrets-key-file
// and --blob-store), tokens minted by `composer token`.
// Needs COMPOSER_TEST_DATABASE_URL and COMPOSER_TEST_REDIS_URL (scripts/with-services.sh) and the
// binary COMPOSER_BIN (default <repo>/target/debug/composer).
import assert from "node:assert/strict";
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, appendFileSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer as createNetServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";

import { Backoff, Client, Worker, type Run, type WorkerOptions } from "../../src/index.js";

const HERE = dirname(fileURLToPath(import.meta.url));
/** sdks/typescript (tests run from dist-test/test/integration). */
export const PACKAGE = resolve(HERE, "..", "..", "..");
export const REPO = resolve(PACKAGE, "..", "..");
export const BINARY = process.env["COMPOSER_BIN"] ?? join(REPO, "target", "debug", "composer");
export const AUTH_SECRET = "typescript-sdk-integration-secret-0123456789abcdef";
export const FAST = new Backoff({ initialMs: 50, maximumMs: 1_000 });

/** A short random hex suffix for names. */
export function hex(n = 8): string {
  return randomBytes(n).toString("hex").slice(0, n);
}

/** A token for `roles`, minted by the composer binary itself. */
export function mintToken(roles: string[], options: { namespace?: string; subject?: string; secret?: string } = {}): string {
  return execFileSync(
    BINARY,
    ["token", "--sub", options.subject ?? "ts-tests", "--ns", options.namespace ?? "default", "--role", roles.join(","), "--ttl", "2h"],
    { env: { ...process.env, COMPOSER_AUTH_SECRET: options.secret ?? AUTH_SECRET }, encoding: "utf8" },
  ).trim();
}

function psql(url: string, sql: string): void {
  execFileSync("psql", [url, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], { stdio: ["ignore", "ignore", "pipe"] });
}

function withDatabase(url: string, name: string): string {
  const u = new URL(url);
  u.pathname = `/${name}`;
  return u.toString();
}

/** A fresh database for this test process, and the Redis URL; `drop()` removes the database. */
export function backingServices(): { databaseUrl: string; redisUrl: string; drop: () => void } {
  const admin = process.env["COMPOSER_TEST_DATABASE_URL"];
  const redis = process.env["COMPOSER_TEST_REDIS_URL"];
  if (!admin || !redis) {
    throw new Error("COMPOSER_TEST_DATABASE_URL and COMPOSER_TEST_REDIS_URL are not set: run through scripts/with-services.sh");
  }
  if (!existsSync(BINARY)) throw new Error(`${BINARY} is missing: set COMPOSER_BIN or build composer-cli`);
  const name = `composer_sdk_ts_${hex(12)}`;
  psql(admin, `CREATE DATABASE "${name}"`);
  return {
    databaseUrl: withDatabase(admin, name),
    redisUrl: redis,
    drop: () => {
      try {
        psql(admin, `DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
      } catch {
        // best effort
      }
    },
  };
}

let secretsKey: string | undefined;

/**
 * This test process's key-encryption key file for `--secrets-key-file` (64 hex digits, as `composer
 * secret new-key` prints one), made once and removed at exit. Every server of the process gets the
 * same one: servers sharing a database must, as its data keys are wrapped under it.
 */
/**
 * A server on fresh backing services for the calling test file: started before its tests,
 * stopped after them with its database dropped. Read `.server` inside the tests.
 */
export function useServer(): { readonly server: ServerProcess } {
  let services: ReturnType<typeof backingServices> | undefined;
  let server: ServerProcess | undefined;
  before(async () => {
    services = backingServices();
    server = new ServerProcess(services.databaseUrl, services.redisUrl);
    await server.start();
  });
  after(async () => {
    await server?.stop();
    services?.drop();
  });
  return {
    get server(): ServerProcess {
      if (!server) throw new Error("useServer: the server starts in before()");
      return server;
    },
  };
}

export function secretsKeyFile(): string {
  if (secretsKey) return secretsKey;
  const dir = mkdtempSync(join(tmpdir(), "composer-ts-secrets-"));
  process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
  secretsKey = join(dir, "kek.hex");
  writeFileSync(secretsKey, randomBytes(32).toString("hex") + "\n", { mode: 0o600 });
  return secretsKey;
}

let blobStore: string | undefined;

/**
 * This test process's blob store for `--blob-store` (docs/payloads.md): a temporary folder made
 * once and removed at exit, so no test writes outside temporary folders. Every server of the
 * process gets the same one: servers sharing a database must share its blobs.
 */
export function blobStoreDir(): string {
  if (blobStore) return blobStore;
  const dir = mkdtempSync(join(tmpdir(), "composer-ts-blobs-"));
  process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
  blobStore = dir;
  return blobStore;
}

/** The servers' log folders, removed when the test process exits (a server restarts on its log). */
const logFolders: string[] = [];

function logFolder(): string {
  const dir = mkdtempSync(join(tmpdir(), "composer-ts-server-"));
  if (logFolders.length === 0) {
    process.once("exit", () => {
      for (const folder of logFolders) rmSync(folder, { recursive: true, force: true });
    });
  }
  logFolders.push(dir);
  return dir;
}

/** One `composer serve` process; restartable on the same port. */
export class ServerProcess {
  address = "";
  process: ChildProcess | undefined;
  readonly logPath: string;

  /**
   * `options.secretsKey` false: a server given no secrets key (by default it gets
   * {@link secretsKeyFile}). `options.blobStore`: the server's `--blob-store` (by default
   * {@link blobStoreDir}); its `--blob-store-option`s go in `extraArgs`.
   */
  constructor(
    readonly databaseUrl: string,
    readonly redisUrl: string,
    readonly extraArgs: string[] = [],
    readonly options: { secretsKey?: boolean; blobStore?: string } = {},
  ) {
    this.logPath = join(logFolder(), "server.log");
  }

  get port(): number {
    return Number(this.address.split(":").pop());
  }

  async start(port = 0, timeoutMs = 60_000): Promise<string> {
    const child = spawn(
      BINARY,
      [
        "serve",
        "--listen",
        `127.0.0.1:${port}`,
        "--log-format",
        "json",
        "--database-url",
        this.databaseUrl,
        "--redis-url",
        this.redisUrl,
        "--auth-secret",
        AUTH_SECRET,
        ...(this.options.secretsKey === false ? [] : ["--secrets-key-file", secretsKeyFile()]),
        "--blob-store",
        this.options.blobStore ?? blobStoreDir(),
        ...this.extraArgs,
      ],
      { stdio: ["ignore", "ignore", "pipe"] },
    );
    this.process = child;
    const address = await new Promise<string>((resolvePromise, reject) => {
      const timer = setTimeout(() => reject(new Error(`the server did not listen within ${timeoutMs} ms:\n${this.tail()}`)), timeoutMs);
      const lines = createInterface({ input: child.stderr as NodeJS.ReadableStream });
      let found = false;
      lines.on("line", (line) => {
        appendFileSync(this.logPath, line + "\n");
        if (found) return;
        try {
          const record = JSON.parse(line) as Record<string, unknown>;
          const fields = (record["fields"] as Record<string, unknown> | undefined) ?? record;
          const message = fields["message"] ?? record["message"];
          const addr = fields["addr"] ?? record["addr"];
          if (message === "listening" && addr) {
            found = true;
            clearTimeout(timer);
            resolvePromise(String(addr));
          }
        } catch {
          // not JSON
        }
      });
      child.on("exit", (code) => {
        if (!found) {
          clearTimeout(timer);
          reject(new Error(`the server exited (${code}) before listening:\n${this.tail()}`));
        }
      });
    });
    this.address = address;
    return address;
  }

  tail(): string {
    try {
      return readFileSync(this.logPath, "utf8").slice(-4000);
    } catch {
      return "";
    }
  }

  async stop(signal: NodeJS.Signals = "SIGTERM", timeoutMs = 30_000): Promise<void> {
    const child = this.process;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once("exit", () => r()));
    child.kill(signal);
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    await exited;
    clearTimeout(timer);
  }

  async restart(stopTimeoutMs = 30_000): Promise<void> {
    const port = this.port;
    await this.stop("SIGTERM", stopTimeoutMs);
    const deadline = Date.now() + 30_000;
    for (;;) {
      try {
        await this.start(port);
        return;
      } catch (error) {
        if (Date.now() > deadline) throw error;
        await sleep(500);
      }
    }
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Waits until `predicate()` holds. */
export async function until(predicate: () => boolean, timeoutMs = 30_000, what = "condition"): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`${what} not reached within ${timeoutMs} ms`);
    await sleep(50);
  }
}

/** Runs `worker` in the background for `body`, then stops it gracefully. */
export async function serving<T>(worker: Worker, body: () => Promise<T>): Promise<T> {
  const served = worker.serve();
  let failure: unknown;
  served.catch((error: unknown) => (failure = error));
  try {
    return await body();
  } catch (error) {
    throw failure ?? error;
  } finally {
    worker.stop();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([served.catch(() => undefined), new Promise((r) => (timer = setTimeout(r, 60_000)))]);
    clearTimeout(timer);
  }
}

/** A worker with the test defaults (fast back-off). */
export function worker(address: string, options: WorkerOptions = {}): Worker {
  return new Worker({ address, backoff: FAST, pollWaitMs: 2_000, ...options });
}

export async function historyTypes(client: Client, runId: string): Promise<string[]> {
  const types: string[] = [];
  for await (const event of client.getRunHistory(runId)) types.push(event.eventType);
  return types;
}

export async function final(client: Client, runId: string, timeoutMs = 60_000): Promise<Run> {
  return client.waitForRun(runId, { timeoutMs });
}

/** A workflow of one TASK node `work` (`extra` is YAML added to the node, one entry per line). */
export function oneTask(name: string, queue: string, task: string, extra = ""): string {
  const nodeExtra = extra
    .trim()
    .split("\n")
    .filter((l) => l.trim())
    .map((l) => `    ${l}\n`)
    .join("");
  return `
name: ${name}
nodes:
  - id: work
    type: TASK
    queue: ${queue}
    task: ${task}
${nodeExtra}output: { result: "\${nodes.work.output}" }
`;
}

/** A three-step TASK workflow a -> b -> c on one queue, output from c. */
export function threeStep(suffix: string): string {
  return `
name: c01-${suffix}
description: conformance C1
nodes:
  - id: a
    type: TASK
    queue: c01-${suffix}
    task: add_one
    input: { x: "\${input.x}" }
  - id: b
    type: TASK
    queue: c01-${suffix}
    task: double
    input: { x: "\${nodes.a.output.x}" }
  - id: c
    type: TASK
    queue: c01-${suffix}
    task: describe
    input: { x: "\${nodes.b.output.x}" }
edges:
  - { from: a, to: b }
  - { from: b, to: c }
output: { result: "\${nodes.c.output}" }
`;
}

interface ProcessEvent {
  event: string;
  [key: string]: unknown;
}

/** test/integration/worker-process.ts in a child process, its JSON lines collected. */
export class WorkerProcess {
  readonly process: ChildProcess;
  readonly events: ProcessEvent[] = [];
  readonly lines: string[] = [];
  readonly exited: Promise<number | null>;

  constructor(address: string, queue: string, options: { slots?: number; seconds?: number; drainSeconds?: number; script?: string } = {}) {
    this.process = spawn(
      process.execPath,
      [join(HERE, options.script ?? "worker-process.js"), address, queue, String(options.slots ?? 2), String(options.seconds ?? 30), String(options.drainSeconds ?? 30)],
      { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env } },
    );
    const collect = (stream: NodeJS.ReadableStream): void => {
      createInterface({ input: stream }).on("line", (line) => {
        this.lines.push(line);
        try {
          const event = JSON.parse(line) as ProcessEvent;
          if (event && typeof event === "object" && "event" in event) this.events.push(event);
        } catch {
          // a log line
        }
      });
    };
    collect(this.process.stdout as NodeJS.ReadableStream);
    collect(this.process.stderr as NodeJS.ReadableStream);
    this.exited = new Promise((r) => this.process.once("exit", (code) => r(code)));
  }

  seen(event: string): ProcessEvent[] {
    return this.events.filter((e) => e.event === event);
  }

  async waitFor(event: string, count = 1, timeoutMs = 30_000): Promise<ProcessEvent[]> {
    try {
      await until(() => this.seen(event).length >= count, timeoutMs, `${count} x ${event}`);
    } catch {
      throw new Error(`worker process output:\n${this.lines.join("\n").slice(-4000)}`);
    }
    return this.seen(event);
  }

  kill(): void {
    if (this.process.exitCode === null && this.process.signalCode === null) this.process.kill("SIGKILL");
  }
}

// --- versions: an order workflow whose runs wait in B (docs/versions.md) ---

/** The queues of one workflow: A's, and the rest's (no worker serves it while runs wait in B). */
export interface Queues {
  a: string;
  rest: string;
}

/** The order workflow: A -> B -> C, with D after C (`withD`) and B's task named `bTask`. */
export function orderSource(name: string, queues: Queues, options: { withD?: boolean; bTask?: string } = {}): string {
  const d = options.withD ? `  - { id: D, type: TASK, queue: ${queues.rest}, task: d }\n` : "";
  const toD = options.withD ? "  - { from: C, to: D }\n" : "";
  return `name: ${name}
nodes:
  - { id: A, type: TASK, queue: ${queues.a}, task: a }
  - { id: B, type: TASK, queue: ${queues.rest}, task: ${options.bTask ?? "b"}, input: { amount: "\${nodes.A.output.amount}" } }
  - { id: C, type: TASK, queue: ${queues.rest}, task: c }
${d}edges:
  - { from: A, to: B }
  - { from: B, to: C }
${toD}`;
}

/** A workflow registered as v1 (A -> B -> C), v2 (D appended) and v3 (B's task renamed). */
export async function registerVersions(client: Client, prefix: string): Promise<{ name: string; queues: Queues; v1: string; v2: string; v3: string }> {
  const s = hex();
  const name = `${prefix}-${s}`;
  const queues = { a: `${prefix}-a-${s}`, rest: `${prefix}-rest-${s}` };
  const v1 = orderSource(name, queues);
  const v2 = orderSource(name, queues, { withD: true });
  const v3 = orderSource(name, queues, { bTask: "b_renamed" });
  assert.deepEqual(
    [(await client.registerWorkflow(v1)).version, (await client.registerWorkflow(v2)).version, (await client.registerWorkflow(v3)).version],
    [1, 2, 3],
  );
  return { name, queues, v1, v2, v3 };
}

/** Polls the run until node `nodeId` has started. */
export async function waitingIn(client: Client, runId: string, nodeId: string, timeoutMs = 60_000): Promise<Run> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const run = await client.getRun(runId);
    if (run.nodes.some((n) => n.nodeId === nodeId)) return run;
    if (Date.now() > deadline) throw new Error(`run ${runId} did not reach ${nodeId} within ${timeoutMs} ms: ${JSON.stringify(run.nodes)}`);
    await sleep(50);
  }
}

/** Starts `count` runs of v1 and lets a worker of A alone finish A: each run then waits in B. */
export async function runsWaitingInB(address: string, client: Client, name: string, queues: Queues, count: number): Promise<string[]> {
  const onlyA = worker(address, { slots: 2 });
  onlyA.task(queues.a, "a", () => ({ amount: 30 }));
  return serving(onlyA, async () => {
    const ids: string[] = [];
    for (let i = 0; i < count; i++) ids.push((await client.startRun(name, { customer: `c-${i}` }, { version: 1 })).runId);
    for (const id of ids) {
      const run = await waitingIn(client, id, "B");
      assert.equal(run.status, "RUNNING");
      assert.equal(run.nodes.find((n) => n.nodeId === "A")?.status, "COMPLETED");
    }
    return ids;
  });
}

// --- blob stores in a bucket: moto, a real S3 API (decision 0046) ---

/** A loopback port that was free a moment ago. */
export async function freePort(): Promise<number> {
  const server = createNetServer();
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((r) => server.close(() => r()));
  return port;
}

/** `COMPOSER_TEST_MOTO_SERVER`, or the repository's `.tools/moto` (installed by scripts/setup.sh). */
export const MOTO = process.env["COMPOSER_TEST_MOTO_SERVER"] ?? join(REPO, ".tools", "moto", "bin", "moto_server");

/** A moto S3 server on a free loopback port with one bucket; `stop()` ends it. */
export class Moto {
  private constructor(
    readonly process: ChildProcess,
    readonly endpoint: string,
    readonly bucket: string,
  ) {}

  /** Starts moto and makes `bucket` (a PUT of `/<bucket>` that succeeds also says moto is up). */
  static async start(bucket: string, timeoutMs = 30_000): Promise<Moto> {
    if (!existsSync(MOTO)) throw new Error(`${MOTO} is missing: run scripts/setup.sh (it installs moto, the S3 API these tests use)`);
    const port = await freePort();
    const child = spawn(MOTO, ["-H", "127.0.0.1", "-p", String(port)], { stdio: ["ignore", "ignore", "ignore"] });
    const stop = (): void => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    };
    process.once("exit", stop);
    const moto = new Moto(child, `http://127.0.0.1:${port}`, bucket);
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (child.exitCode !== null) throw new Error(`moto_server exited (${child.exitCode}) before answering`);
      try {
        const made = await fetch(`${moto.endpoint}/${bucket}`, { method: "PUT" });
        await made.body?.cancel();
        if (made.ok) return moto;
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) {
        await moto.stop();
        throw new Error(`moto did not answer within ${timeoutMs} ms`);
      }
      await sleep(100);
    }
  }

  /** The server's `--blob-store` in this bucket. */
  get location(): string {
    return `s3://${this.bucket}/composer`;
  }

  /** The server's `--blob-store-option` flags for this moto. */
  serverArgs(): string[] {
    const options = {
      aws_endpoint: this.endpoint,
      aws_allow_http: "true",
      aws_access_key_id: "test",
      aws_secret_access_key: "test",
      aws_region: "us-east-1",
      aws_virtual_hosted_style_request: "false",
    };
    return Object.entries(options).flatMap(([key, value]) => ["--blob-store-option", `${key}=${value}`]);
  }

  async stop(): Promise<void> {
    const child = this.process;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once("exit", () => r()));
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
    await exited;
    clearTimeout(timer);
  }
}

/**
 * The samples of counter `name` in a Prometheus text exposition, as [labels, value] (labels
 * parsed from `name{k="v",...} value`).
 */
export function metricSamples(text: string, name: string): { labels: Record<string, string>; value: number }[] {
  const samples: { labels: Record<string, string>; value: number }[] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith(name + "{") && !line.startsWith(name + " ")) continue;
    const match = /^[^{\s]+(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels: Record<string, string> = {};
    for (const [, key, value] of (match[1] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[key as string] = value as string;
    samples.push({ labels, value: Number(match[2]) });
  }
  return samples;
}
