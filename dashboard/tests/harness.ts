// The real server for the dashboard tests: a fresh database per test file, `composer serve` on a
// free loopback port (which also serves dashboard/dist at `/`), tokens minted by `composer token`,
// and Node workers of the TypeScript SDK. Needs COMPOSER_TEST_DATABASE_URL and
// COMPOSER_TEST_REDIS_URL (scripts/with-services.sh) and COMPOSER_BIN (default target/debug/composer).
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { Backoff, Client, Worker, type WorkerOptions } from "@composer-dev/composer";
import { expect, test, type Page } from "@playwright/test";

const HERE = dirname(fileURLToPath(import.meta.url));
export const DASHBOARD = resolve(HERE, "..");
const REPO = resolve(DASHBOARD, "..");
const BINARY = process.env["COMPOSER_BIN"] ?? join(REPO, "target", "debug", "composer");
const AUTH_SECRET = "dashboard-tests-secret-0123456789abcdef-0123456789";
/** Where the tests write the screenshots the README shows. */
export const SCREENSHOTS = join(DASHBOARD, "screenshots");

export function hex(n = 8): string {
  return randomBytes(n).toString("hex").slice(0, n);
}

function psql(url: string, sql: string): void {
  execFileSync("psql", [url, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], { stdio: ["ignore", "ignore", "pipe"] });
}

function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      probe.close(() => (typeof address === "object" && address ? resolvePort(address.port) : reject(new Error("no port"))));
    });
  });
}

export interface TokenOptions {
  namespace?: string;
  subject?: string;
  ttl?: string;
}

/** How a Stack's server is set up beyond its command-line arguments. */
export interface StackOptions {
  /** Give the server a fresh key-encryption key (`composer secret new-key`), so secrets can be kept. */
  secretsKey?: boolean;
}

/** One `composer serve` with its own database. */
export class Stack {
  /** `http://127.0.0.1:<port>`: the dashboard and grpc-web. */
  url = "";
  /** `127.0.0.1:<port>`: gRPC for the Node SDK. */
  address = "";
  private server: ChildProcess | undefined;
  private database = "";
  /** Made by start(): Playwright also loads each spec (and so builds its Stack) only to list its tests. */
  private logPath = "";
  private readonly clients: Client[] = [];
  private readonly workers: { worker: Worker; served: Promise<void> }[] = [];

  constructor(
    private readonly extraArgs: string[] = [],
    private readonly options: StackOptions = {},
  ) {}

  async start(): Promise<void> {
    const admin = process.env["COMPOSER_TEST_DATABASE_URL"];
    const redis = process.env["COMPOSER_TEST_REDIS_URL"];
    if (!admin || !redis) throw new Error("COMPOSER_TEST_DATABASE_URL and COMPOSER_TEST_REDIS_URL are not set: run scripts/test-dashboard.sh");
    if (!existsSync(BINARY)) throw new Error(`${BINARY} is missing: set COMPOSER_BIN`);
    this.logPath = join(mkdtempSync(join(tmpdir(), "composer-dashboard-")), "server.log");
    this.database = `composer_dashboard_${hex(12)}`;
    psql(admin, `CREATE DATABASE "${this.database}"`);
    const databaseUrl = new URL(admin);
    databaseUrl.pathname = `/${this.database}`;
    const port = await freePort();
    this.address = `127.0.0.1:${port}`;
    this.url = `http://${this.address}`;
    const child = spawn(
      BINARY,
      [
        "serve",
        "--listen",
        this.address,
        "--database-url",
        databaseUrl.toString(),
        "--redis-url",
        redis,
        "--auth-secret",
        AUTH_SECRET,
        // no --cors-origins: with tokens required, the page's calls to its own origin pass
        // the build under test, whatever the binary embedded
        "--dashboard-dir",
        join(DASHBOARD, "dist"),
        "--log-format",
        "json",
        ...(this.options.secretsKey ? ["--secrets-key-file", this.writeSecretsKey()] : []),
        ...this.extraArgs,
      ],
      { stdio: ["ignore", "ignore", "pipe"] },
    );
    this.server = child;
    await new Promise<void>((resolveStart, reject) => {
      const timer = setTimeout(() => reject(new Error(`the server did not listen within 60 s:\n${this.tail()}`)), 60_000);
      createInterface({ input: child.stderr as NodeJS.ReadableStream }).on("line", (line) => {
        appendFileSync(this.logPath, `${line}\n`);
        if (line.includes('"listening"')) {
          clearTimeout(timer);
          resolveStart();
        }
      });
      child.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`the server exited (${code}) before listening:\n${this.tail()}`));
      });
    });
  }

  /** A new key-encryption key in a file only this user reads, next to the server's log. */
  private writeSecretsKey(): string {
    const key = execFileSync(BINARY, ["secret", "new-key"], { encoding: "utf8" }).trim();
    const path = join(dirname(this.logPath), "secrets.key");
    writeFileSync(path, `${key}\n`, { mode: 0o600 });
    return path;
  }

  tail(): string {
    try {
      return readFileSync(this.logPath, "utf8").slice(-4000);
    } catch {
      return "";
    }
  }

  /** A token for `roles` (comma-separated), minted by the composer binary itself. */
  token(roles: string, options: TokenOptions = {}): string {
    return execFileSync(
      BINARY,
      ["token", "--sub", options.subject ?? `dashboard-${roles}`, "--ns", options.namespace ?? "default", "--role", roles, "--ttl", options.ttl ?? "2h"],
      { env: { ...process.env, COMPOSER_AUTH_SECRET: AUTH_SECRET }, encoding: "utf8" },
    ).trim();
  }

  /** Runs the `composer` admin CLI against this server with `token`, `input` on its stdin; its stdout. */
  cli(args: string[], token: string, input = ""): string {
    const env = { ...process.env, COMPOSER_ADDRESS: `http://${this.address}`, COMPOSER_TOKEN: token };
    return execFileSync(BINARY, args, { env, input, encoding: "utf8" });
  }

  /** A Node SDK client over gRPC, as an admin of `default` unless given a token. */
  client(token = this.token("admin")): Client {
    const client = new Client({ address: this.address, token });
    this.clients.push(client);
    return client;
  }

  /** A Node SDK worker, serving in the background until stop(); `setup` registers its tasks. */
  worker(setup: (worker: Worker) => void, options: WorkerOptions & { namespace?: string } = {}): Worker {
    const worker = new Worker({
      address: this.address,
      token: this.token("worker", { namespace: options.namespace ?? "default" }),
      backoff: new Backoff({ initialMs: 50, maximumMs: 1_000 }),
      pollWaitMs: 2_000,
      slots: 4,
      ...options,
    });
    setup(worker);
    const served = worker.serve().catch((error: unknown) => console.error("worker stopped:", error));
    this.workers.push({ worker, served });
    return worker;
  }

  async stop(): Promise<void> {
    for (const { worker } of this.workers) worker.stop();
    await Promise.race([Promise.all(this.workers.map((w) => w.served)), new Promise((r) => setTimeout(r, 10_000))]);
    for (const client of this.clients) client.close();
    const child = this.server;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((r) => child.once("exit", () => r()));
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
      await exited;
      clearTimeout(timer);
    }
    const admin = process.env["COMPOSER_TEST_DATABASE_URL"];
    if (admin && this.database) {
      try {
        psql(admin, `DROP DATABASE IF EXISTS "${this.database}" WITH (FORCE)`);
      } catch {
        // best effort: the with-services folder goes away anyway
      }
    }
    // the server's log and secrets key: every test file starts a Stack
    if (this.logPath) rmSync(dirname(this.logPath), { recursive: true, force: true });
  }
}

/** Starts a Stack before this file's tests and stops it after them. */
export function useStack(extraArgs: string[] = [], options: StackOptions = {}): Stack {
  const stack = new Stack(extraArgs, options);
  test.beforeAll(async () => {
    test.setTimeout(120_000);
    await stack.start();
  });
  test.afterAll(async () => {
    test.setTimeout(60_000);
    await stack.stop();
  });
  return stack;
}

/**
 * Fails the test on anything the page should never do: an uncaught error, or a Content-Security-
 * Policy violation (reported both as a console error and as a DOM event).
 */
export function guardPage(page: Page): () => void {
  const problems: string[] = [];
  page.on("pageerror", (error) => problems.push(`uncaught: ${error.message}`));
  page.on("console", (message) => {
    if (message.type() === "error" && /content security policy/i.test(message.text())) problems.push(`CSP: ${message.text()}`);
  });
  void page.addInitScript(() => {
    document.addEventListener("securitypolicyviolation", (e) => console.error(`Content Security Policy violation: ${e.violatedDirective} ${e.blockedURI}`));
  });
  return () => expect(problems, problems.join("\n")).toEqual([]);
}

/** Opens the dashboard logged in through the URL fragment (as `make dev` links it). */
export async function openWithToken(page: Page, stack: Stack, token: string, path = "/runs"): Promise<void> {
  await page.goto(`${stack.url}${path}#token=${token}`);
  await expect(page.getByRole("navigation", { name: "Main" })).toBeVisible();
}

/** A gate a worker task waits on, so a test can look at a run mid-flight. */
export function gate(): { wait: Promise<void>; open: () => void } {
  let open = (): void => {};
  const wait = new Promise<void>((r) => (open = r));
  return { wait, open };
}

/** The node of the run graph, by id. */
export function graphNode(page: Page, nodeId: string) {
  return page.locator(`svg.graph g.node[data-node="${nodeId}"]`);
}
