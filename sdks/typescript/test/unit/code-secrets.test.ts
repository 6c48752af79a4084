// Secrets in the JavaScript code runner (docs/secrets.md): a CODE node's declared secrets reach its
// snippet in the input under `secrets` (over the child's stdin, never its environment, command line
// or a file), a snippet that declares none gets none, and every value is replaced by
// `[secret NAME]` in what the runner reports and logs. Snippets run in the real sandbox; the worker
// side runs against the fake WorkerService.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync, readdirSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { format, inspect } from "node:util";

import { Backoff, TaskSecrets, Worker, runSnippet, type Handler, type TaskContext } from "../../src/index.js";
import { fromValue, toValue } from "../../src/values.js";
import { FakeServer, task } from "./fake.js";

const LIMITS = { timeLimitMs: 5_000, memoryLimitMb: 64 };
const FAST = new Backoff({ initialMs: 10, maximumMs: 50 });

/** A value no snippet or runner would write by chance. */
function secretValue(prefix = "sk"): string {
  return `${prefix}_${randomBytes(12).toString("hex")}`;
}

/** Every process under `root` (itself excluded), from the parent ids in /proc/<pid>/stat. */
function descendants(root: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync("/proc").filter((n) => /^[0-9]+$/.test(n))) {
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      // pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after its last ')'
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {
      // gone
    }
  }
  const found: number[] = [];
  const walk = (pid: number): void => {
    for (const child of children.get(pid) ?? []) {
      found.push(child);
      walk(child);
    }
  };
  walk(root);
  return found;
}

/** What /proc shows of `pid`'s environment and command line (empty when it is gone). */
function environmentAndArgs(pid: number): { environ: string; cmdline: string } {
  const read = (what: string): string => {
    try {
      return readFileSync(`/proc/${pid}/${what}`, "utf8");
    } catch {
      return "";
    }
  };
  return { environ: read("environ"), cmdline: read("cmdline") };
}

/** `path` if it is a file holding `needle`, and every such file under it (a few levels down). */
function filesHolding(path: string, needle: string, depth = 2): string[] {
  try {
    const st = statSync(path);
    if (st.isFile()) return st.size < 1 << 20 && readFileSync(path, "utf8").includes(needle) ? [path] : [];
    if (!st.isDirectory() || depth < 0) return [];
    return readdirSync(path).flatMap((name) => filesHolding(join(path, name), needle, depth - 1));
  } catch {
    return []; // gone, or not ours to read
  }
}

describe("code runner secrets (runSnippet)", { concurrency: 2 }, () => {
  test("the snippet finds the values in its input under `secrets`, beside the node's input", async () => {
    const key = secretValue();
    const r = await runSnippet("({ len: input.secrets.signing_key.length, keys: Object.keys(input), order: input.order })", { order: 7 }, {
      ...LIMITS,
      secrets: { signing_key: key },
    });
    assert.equal(r.ok, true, r.message);
    assert.deepEqual(r.output, { len: key.length, keys: ["order", "secrets"], order: 7 });
    // the value itself is in scope: the snippet can use it
    const used = await runSnippet("input.secrets.signing_key === input.expected", { expected: key }, { ...LIMITS, secrets: { signing_key: key } });
    assert.equal(used.output, true);
  });

  test("a null or absent input becomes an object holding only `secrets`", async () => {
    for (const input of [null, undefined]) {
      const r = await runSnippet("({ keys: Object.keys(input), names: Object.keys(input.secrets) })", input, { ...LIMITS, secrets: { a: "1x", b: "2y" } });
      assert.deepEqual(r.output, { keys: ["secrets"], names: ["a", "b"] }, String(input));
    }
  });

  test("a `secrets` key of the node's own input is replaced by the declared values", async () => {
    const r = await runSnippet("input.secrets", { secrets: { forged: "from the run's input" }, a: 1 }, { ...LIMITS, secrets: { k: "v-1" } });
    assert.deepEqual(r.output, { k: "[secret k]" });
  });

  test("an input that is not an object fails SECRETS_NEED_OBJECT_INPUT, non-retryable, and no snippet runs", async () => {
    for (const input of [[1, 2], "text", 5, true]) {
      const r = await runSnippet("console.log('ran'); 1", input, { ...LIMITS, secrets: { k: secretValue() } });
      assert.equal(r.ok, false);
      assert.equal(r.code, "SECRETS_NEED_OBJECT_INPUT", JSON.stringify(input));
      assert.equal(r.retryable, false);
      assert.match(r.message, /declares secrets.*under "secrets".*not an object/);
      assert.equal(r.stderr, "", "the snippet did not run");
    }
  });

  test("without secrets the input gets no `secrets` key", async () => {
    const r = await runSnippet("({ has: 'secrets' in input, keys: Object.keys(input) })", { a: 1 }, LIMITS);
    assert.deepEqual(r.output, { has: false, keys: ["a"] });
    const bare = await runSnippet("input", null, LIMITS);
    assert.equal(bare.output, null);
  });

  test("every value in the output is redacted: strings and keys at any depth, longest value first", async () => {
    const outer = secretValue("outer");
    const inner = outer.slice(6, 18); // a value inside another: the longer one is replaced whole
    const quoted = `pa"ss\\word-${secretValue()}`; // JSON-escaped when stringified
    const code = `
      const s = input.secrets;
      ({
        echo: s.outer,
        len: s.outer.length,
        both: 'a ' + s.outer + ' b ' + s.inner + ' c',
        nested: [{ ['key-' + s.inner]: ['deep ' + s.quoted] }],
        json: JSON.stringify(s),
      })`;
    const r = await runSnippet(code, {}, { ...LIMITS, secrets: { outer, inner, quoted } });
    assert.equal(r.ok, true, r.message);
    assert.deepEqual(r.output, {
      echo: "[secret outer]",
      len: outer.length,
      both: "a [secret outer] b [secret inner] c",
      nested: [{ "key-[secret inner]": ["deep [secret quoted]"] }],
      json: '{"outer":"[secret outer]","inner":"[secret inner]","quoted":"[secret quoted]"}',
    });
    const text = JSON.stringify(r);
    for (const value of [outer, inner, quoted, JSON.stringify(quoted).slice(1, -1)]) assert.ok(!text.includes(value), `a value is left: ${text}`);
  });

  test("the failure is redacted: message, details, stack and logged lines", async () => {
    const k = secretValue();
    const code = `console.log('using', input.secrets.k, input.secrets);
function sign() { throw new TypeError('bad key ' + input.secrets.k) }
sign()`;
    const r = await runSnippet(code, {}, { ...LIMITS, secrets: { k } });
    assert.equal(r.code, "CODE_ERROR");
    assert.equal(r.message, "TypeError: bad key [secret k]");
    assert.match(String(r.details?.message), /bad key \[secret k\]$/);
    assert.match(r.details?.stack ?? "", /TypeError: bad key \[secret k\]\n\s+at sign \(snippet\.js:2/);
    assert.equal(r.details?.stderr, 'using [secret k] {"k":"[secret k]"}\n');
    assert.equal(r.stderr, 'using [secret k] {"k":"[secret k]"}\n');
    assert.ok(!JSON.stringify(r).includes(k), JSON.stringify(r));
    // a rejected promise and a thrown non-Error, too
    for (const thrown of ["(async () => { throw new Error(input.secrets.k) })()", "throw { key: input.secrets.k }"]) {
      const failed = await runSnippet(thrown, {}, { ...LIMITS, secrets: { k } });
      assert.equal(failed.code, "CODE_ERROR", thrown);
      assert.ok(failed.message.includes("[secret k]"), failed.message);
      assert.ok(!JSON.stringify(failed).includes(k), JSON.stringify(failed));
    }
  });

  test("no value in the child's environment, command line or a file: only on its stdin", async () => {
    const k = secretValue();
    // `process` is refused inside the snippet, and the refusal names no value
    const refused = await runSnippet("process.env", {}, { ...LIMITS, secrets: { k } });
    assert.equal(refused.code, "CODE_ERROR");
    assert.match(refused.message, /process is refused/);
    assert.ok(!JSON.stringify(refused).includes(k));
    // while a snippet holding the value runs, every process under this one shows none of it
    const tmpBefore = new Set(readdirSync(tmpdir()));
    const running = runSnippet("const until = Date.now() + 2500; while (Date.now() < until) {} input.secrets.k.length", {}, {
      ...LIMITS,
      secrets: { k },
    });
    const seen = new Map<number, { environ: string; cmdline: string }>();
    const leaks: string[] = [];
    const deadline = Date.now() + 2_000;
    while (Date.now() < deadline) {
      for (const pid of descendants(process.pid)) {
        const shown = environmentAndArgs(pid);
        if (shown.cmdline) seen.set(pid, shown);
      }
      // what appeared in the temp folder since the test began (a runner without namespaces makes its folder there)
      for (const name of readdirSync(tmpdir()).filter((n) => !tmpBefore.has(n))) leaks.push(...filesHolding(join(tmpdir(), name), k));
      await sleep(100);
    }
    const r = await running;
    assert.equal(r.output, k.length, r.message);
    const snippets = [...seen.values()].filter((p) => p.cmdline.includes("--max-old-space-size"));
    assert.ok(snippets.length > 0, `the snippet's node was seen: ${[...seen.values()].map((p) => p.cmdline.replace(/\0/g, " ").slice(0, 80)).join("; ")}`);
    for (const [pid, shown] of seen) {
      assert.ok(!shown.environ.includes(k), `process ${pid}'s environment holds the value`);
      assert.ok(!shown.cmdline.includes(k), `process ${pid}'s command line holds the value`);
    }
    assert.deepEqual(leaks, [], "no file in the temp folder holds the value");
    assert.deepEqual(readdirSync(tmpdir()).filter((n) => !tmpBefore.has(n) && n.startsWith("composer-js-")), [], "nothing is left behind");
  });
});

// --- through the worker (serveCode) against the fake WorkerService --------------------------------

interface Captured {
  lines: string[];
  logger: { debug: (...a: unknown[]) => void; info: (...a: unknown[]) => void; warn: (...a: unknown[]) => void; error: (...a: unknown[]) => void };
}

/** A logger keeping every line (arguments formatted as console would). */
function capturing(): Captured {
  const lines: string[] = [];
  const at = (level: string) => (message: unknown, ...args: unknown[]) => lines.push(`${level} ${format(message, ...args)}`);
  return { lines, logger: { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") } };
}

/** A CODE task as the server hands it: input {code, input, secrets?} and the values in Task.secrets. */
function codeTask(id: string, input: Record<string, unknown>, secrets: Record<string, string> = {}) {
  return task({ taskId: id, leaseToken: `lease-${id}`, queue: "code.javascript", taskName: "code", input: toValue(input), secrets });
}

/** Serves the fake's tasks with `register` until `reported` tasks were reported. */
async function serveUntil(fake: FakeServer, reported: number, register: (w: Worker) => void, logger: Captured["logger"]): Promise<void> {
  const worker = new Worker({ transport: fake, slots: 4, backoff: FAST, logger, pollWaitMs: 100 });
  register(worker);
  const served = worker.serve();
  const deadline = Date.now() + 30_000;
  const count = (): number => fake.requests("CompleteTask").length + fake.requests("FailTask").length;
  while (count() < reported && Date.now() < deadline) await sleep(20);
  worker.stop();
  await served;
  assert.equal(count(), reported, "every task was reported");
}

describe("code runner secrets (worker.serveCode, fake server)", () => {
  test("declared secrets reach the snippet and come back redacted; undeclared ones never reach it", async () => {
    const k = secretValue();
    const other = secretValue("other");
    const fake = new FakeServer();
    fake.tasks.push(
      codeTask("echo", { code: "console.log('key is', input.secrets.k); ({ echo: input.secrets.k, len: input.secrets.k.length })", input: { x: 1 }, secrets: ["k"] }, { k, other }),
      codeTask("fail", { code: "throw new Error('rejected ' + input.secrets.k)", input: null, secrets: ["k"] }, { k }),
      // a node that declares none gets no `secrets` key, whatever the server sent
      codeTask("none", { code: "({ has: 'secrets' in input, input })", input: { y: 2 } }, { k }),
      codeTask("array", { code: "1", input: [1], secrets: ["k"] }, { k }),
      codeTask("missing", { code: "1", input: {}, secrets: ["k", "absent"] }, { k }),
      codeTask("bad", { code: "1", input: {}, secrets: "k" }, { k }),
    );
    const log = capturing();
    await serveUntil(fake, 6, (w) => w.serveCode(LIMITS), log.logger);

    const completed = new Map(fake.requests("CompleteTask").map((r) => [r.taskId as string, fromValue(r.output)]));
    assert.deepEqual(completed.get("echo"), { echo: "[secret k]", len: k.length });
    assert.deepEqual(completed.get("none"), { has: false, input: { y: 2 } });

    const failed = new Map(fake.requests("FailTask").map((r) => [r.taskId as string, r]));
    const fail = failed.get("fail");
    assert.equal(fail?.errorCode, "CODE_ERROR");
    assert.equal(fail?.message, "Error: rejected [secret k]");
    assert.match(String((fromValue(fail?.details) as { stack: string }).stack), /Error: rejected \[secret k\]\n/);
    assert.deepEqual([failed.get("array")?.errorCode, failed.get("array")?.retryable], ["SECRETS_NEED_OBJECT_INPUT", false]);
    assert.deepEqual([failed.get("missing")?.errorCode, failed.get("missing")?.retryable], ["SECRET_UNAVAILABLE", true]);
    assert.match(failed.get("missing")?.message ?? "", /secret "absent", but the server handed no value/);
    assert.deepEqual([failed.get("bad")?.errorCode, failed.get("bad")?.retryable], ["BAD_CODE_INPUT", false]);

    const reports = JSON.stringify([...fake.requests("CompleteTask"), ...fake.requests("FailTask")].map((r) => ({ ...r, output: fromValue(r.output), details: fromValue(r.details) })));
    for (const value of [k, other]) assert.ok(!reports.includes(value), `a report holds a value: ${reports}`);
    assert.ok(log.lines.some((l) => l.includes("key is [secret k]")), `the snippet's output is logged, redacted: ${log.lines.join("\n")}`);
    for (const value of [k, other]) assert.ok(!log.lines.some((l) => l.includes(value)), `a log line holds a value:\n${log.lines.join("\n")}`);
  });

  test("the task context holds the values but never shows them", async () => {
    const k = secretValue();
    const fake = new FakeServer();
    fake.tasks.push(task({ secrets: { k } }));
    let ctx = undefined as TaskContext | undefined; // (set by the handler: not narrowed to undefined here)
    const handler: Handler = (c) => {
      ctx = c;
      return { ok: true };
    };
    await serveUntil(fake, 1, (w) => w.task("q", "t", handler), capturing().logger);
    assert.ok(ctx);
    assert.ok(ctx.secrets instanceof TaskSecrets);
    assert.equal(ctx.secrets.get("k"), k);
    assert.deepEqual(ctx.secrets.names, ["k"]);
    const shown = [
      inspect(ctx, { depth: Infinity, showHidden: true, getters: true }),
      inspect(ctx, { depth: Infinity, showHidden: true, customInspect: false }),
      inspect(ctx.secrets, { showHidden: true, customInspect: false }),
      format("%o %O %s %j", ctx, ctx, ctx, ctx),
      JSON.stringify(ctx),
      JSON.stringify(ctx.secrets),
      String(ctx.secrets),
      `${ctx.secrets}`,
      JSON.stringify(Object.entries(ctx.secrets)),
      JSON.stringify({ ...ctx.secrets }),
    ];
    for (const text of shown) assert.ok(!text.includes(k), `shows the value: ${text}`);
    assert.equal(String(ctx.secrets), "TaskSecrets(k)");
    assert.equal(JSON.stringify(ctx.secrets), '{"names":["k"]}');
    // a task without secrets has an empty set
    const plain = new TaskSecrets();
    assert.equal(plain.size, 0);
    assert.equal(plain.get("k"), undefined);
  });
});
