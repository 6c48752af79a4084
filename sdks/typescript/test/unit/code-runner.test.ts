// The JavaScript code runner's contract and limits (no server): the output convention, TIMEOUT,
// MEMORY_LIMIT, CODE_ERROR with stack and stderr, and each refusal.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { runSnippet } from "../../src/index.js";
import { snippetProcess } from "../../src/code-runner.js";

const PROBE = `
const fs = require("node:fs");
const code = (f) => { try { f(); return "ok"; } catch (e) { return e.code || e.name; } };
process.stdout.write(JSON.stringify({
  env: JSON.stringify(Object.keys(process.env)),
  writeOwnFolder: code(() => fs.writeFileSync("scratch.txt", "x")),
  writeElsewhere: code(() => fs.writeFileSync(require("node:os").tmpdir() + "/composer-probe-escape.txt", "x")),
  readPasswd: code(() => fs.readFileSync("/etc/passwd")),
  spawn: code(() => require("node:child_process").execSync("id")),
  binding: code(() => process.binding("fs")),
  codeFromStrings: code(() => new Function("return 1")()),
}));
`;

const LIMITS = { timeLimitMs: 2_000, memoryLimitMb: 64 };

describe("code runner", { concurrency: 2 }, () => {
  test("the output is `result` if assigned, else the completion value, else null", async () => {
    assert.deepEqual((await runSnippet("input.a + 1", { a: 1 }, LIMITS)).output, 2);
    assert.deepEqual((await runSnippet("let result = { doubled: input.a * 2 }; 'ignored'", { a: 4 }, LIMITS)).output, { doubled: 8 });
    assert.deepEqual((await runSnippet("var result; result = [1, 2]", null, LIMITS)).output, [1, 2]);
    assert.deepEqual((await runSnippet("const x = 1;", null, LIMITS)).output, null);
    assert.deepEqual((await runSnippet("(async () => input.items.length)()", { items: [1, 2, 3] }, LIMITS)).output, 3);
    const logged = await runSnippet("console.log('hello', { a: 1 }); 7", null, LIMITS);
    assert.equal(logged.output, 7);
    assert.equal(logged.stderr, 'hello {"a":1}\n');
  });

  test("an endless loop stops at the time limit with TIMEOUT, non-retryable", async () => {
    for (const code of ["while (true) {}", "(async () => { for (;;) await null; })()"]) {
      const started = Date.now();
      const r = await runSnippet(code, null, { ...LIMITS, timeLimitMs: 1_000 });
      assert.equal(r.code, "TIMEOUT", code);
      assert.equal(r.retryable, false);
      assert.match(r.message, /time limit of 1 s/);
      assert.ok(Date.now() - started < 5_000);
    }
  });

  test("unbounded allocation gets MEMORY_LIMIT, non-retryable", async () => {
    for (const code of [
      "const a = []; for (;;) a.push(new Array(100000).fill(Math.random()))",
      "const a = []; for (;;) a.push(new Uint8Array(1e7).fill(1))",
    ]) {
      const r = await runSnippet(code, null, LIMITS);
      assert.equal(r.code, "MEMORY_LIMIT", `${code}: ${r.code} ${r.message}`);
      assert.equal(r.retryable, false);
      assert.match(r.message, /memory limit of 64 MiB/);
    }
  });

  test("an exception is CODE_ERROR with its stack and the stderr tail, retryable", async () => {
    const r = await runSnippet("console.log('before'); function f() { throw new TypeError('bad input') }\nf()", null, LIMITS);
    assert.equal(r.code, "CODE_ERROR");
    assert.equal(r.retryable, true);
    assert.equal(r.message, "TypeError: bad input");
    assert.match(r.details?.stack ?? "", /TypeError: bad input\n\s+at f \(snippet\.js:1/);
    assert.equal(r.details?.stderr, "before\n");
    const thrown = await runSnippet("throw 'a string'", null, LIMITS);
    assert.equal(thrown.code, "CODE_ERROR");
    assert.match(thrown.message, /non-Error value: a string/);
  });

  test("a result that is not JSON is INVALID_OUTPUT, non-retryable", async () => {
    for (const code of ["() => 1", "NaN", "let result = new Map()", "1n"]) {
      const r = await runSnippet(code, null, LIMITS);
      assert.equal(r.code, "INVALID_OUTPUT", code);
      assert.equal(r.retryable, false);
    }
  });

  const refusals: [string, string, RegExp][] = [
    ["reading /etc/passwd", "require('fs').readFileSync('/etc/passwd', 'utf8')", /require\('fs'\) is refused: .*no file system/],
    ["importing fs", "import('node:fs').then((fs) => fs.readFileSync('/etc/passwd', 'utf8'))", /import\(\) is refused/],
    ["opening a socket", "require('net').connect(80, '127.0.0.1')", /require\('net'\) is refused: .*network/],
    ["fetching", "fetch('http://127.0.0.1:9/')", /fetch is refused: a code snippet has no network/],
    ["spawning a process", "require('child_process').execSync('id')", /require\('child_process'\) is refused: .*child processes/],
    ["reading process.env", "process.env.COMPOSER_TOKEN", /process is refused: .*no environment variables/],
    ["escaping through a constructor", "this.constructor.constructor('return process')().env", /Code generation from strings disallowed/],
    ["escaping through the input", "input.constructor.constructor('return process')()", /Code generation from strings disallowed/],
    ["escaping through a caught error", "(async () => { try { await import('fs') } catch (e) { return e.constructor.constructor('return process')().env } })()", /Code generation from strings disallowed/],
    ["eval", "eval('1 + 1')", /Code generation from strings disallowed/],
    ["timers", "setTimeout(() => 1, 10)", /setTimeout is refused/],
  ];
  for (const [what, code, message] of refusals) {
    test(`refuses ${what} with CODE_ERROR naming what was refused`, async () => {
      const r = await runSnippet(code, { a: 1 }, LIMITS);
      assert.equal(r.code, "CODE_ERROR", `${r.code}: ${r.message}`);
      assert.match(r.message, message);
    });
  }

  test("the snippet's process has an empty environment and may write only in its own folder, which is removed", async () => {
    // The process layer under the vm, probed with the runner's own command line and a probe
    // program in place of the runner's: what even an escaped snippet would find.
    process.env["COMPOSER_TOKEN"] = "canary-secret";
    const folder = mkdtempSync(join(tmpdir(), "composer-js-probe-"));
    try {
      const how = snippetProcess(folder, 64);
      const args = [...how.args];
      args[args.indexOf("-e") + 1] = PROBE;
      const out = execFileSync(how.command, args, { cwd: how.options.cwd, env: how.options.env, encoding: "utf8" });
      const probe = JSON.parse(out) as Record<string, string>;
      assert.deepEqual(probe, {
        env: "[]",
        writeOwnFolder: "ok",
        writeElsewhere: "ERR_ACCESS_DENIED",
        readPasswd: "ERR_ACCESS_DENIED",
        spawn: "ERR_ACCESS_DENIED",
        binding: "ERR_ACCESS_DENIED",
        codeFromStrings: "EvalError",
      });
    } finally {
      rmSync(folder, { recursive: true, force: true });
      delete process.env["COMPOSER_TOKEN"];
    }
    const before = new Set(readdirSync(tmpdir()).filter((n) => n.startsWith("composer-js-")));
    await runSnippet("1", null, LIMITS);
    assert.deepEqual(readdirSync(tmpdir()).filter((n) => n.startsWith("composer-js-") && !before.has(n)), []);
  });
});
