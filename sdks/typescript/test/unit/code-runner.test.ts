// The JavaScript code runner's contract and limits (no server): the output convention, TIMEOUT,
// MEMORY_LIMIT, CODE_ERROR with stack and stderr, each refusal, and the OS sandbox under them
// (namespaces, the user nobody, a private /tmp; this machine's CI runs as root).
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { execFile, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes } from "node:crypto";

import { SandboxUnavailable, detectSandbox, runSnippet } from "../../src/index.js";
import { defaultSandbox, snippetProcess, type Sandbox } from "../../src/code-runner.js";

// What even a snippet that escaped the vm would find: a program run with the runner's own command
// line in place of the runner's child program. It reports what each attempt gave (ok or the error
// code), then, when asked, leaves a process tree behind and spins.
const PROBE = String.raw`
const fs = require("node:fs");
const [port, marker, mode] = [Number(process.argv[1]), process.argv[2], process.argv[3]];
const code = (f) => { try { const v = f(); return v === undefined ? "ok" : v; } catch (e) { return e.code || e.name; } };
const report = {
  env: JSON.stringify(Object.keys(process.env)),
  uid: process.getuid(), gid: process.getgid(), groups: JSON.stringify(process.getgroups()),
  cwd: process.cwd(),
  status: code(() => fs.readFileSync("/proc/self/status", "utf8").split("\n").filter((l) => /^(Groups|NoNewPrivs|CapEff|CapPrm|CapBnd)/.test(l)).map((l) => l.replace(/\s+/g, " ").trim()).join(";")),
  interfaces: code(() => JSON.stringify(fs.readFileSync("/proc/net/dev", "utf8").split("\n").slice(2).filter(Boolean).map((l) => l.split(":")[0].trim()))),
  pids: code(() => JSON.stringify(fs.readdirSync("/proc").filter((n) => /^[0-9]+$/.test(n)).length)),
  writeOwnFolder: code(() => fs.writeFileSync("scratch.txt", "x")),
  writeTmp: code(() => fs.writeFileSync("/tmp/" + marker + ".txt", "x")),
  writeRoot: code(() => fs.writeFileSync("/" + marker + ".txt", "x")),
  writeEtc: code(() => fs.writeFileSync("/etc/" + marker + ".txt", "x")),
  writeVarLib: code(() => fs.writeFileSync("/var/lib/" + marker + ".txt", "x")),
  readPasswd: code(() => { fs.readFileSync("/etc/passwd"); }),
  readRoot: code(() => { fs.readdirSync("/root"); }),
  spawn: code(() => { require("node:child_process").execFileSync("/bin/true"); }),
  binding: code(() => { process.binding("fs"); }),
  codeFromStrings: code(() => { new Function("return 1")(); }),
};
const socket = require("node:net").connect(port, "127.0.0.1");
const done = (how) => {
  report.connect = how;
  socket.destroy();
  if (mode.startsWith("tree")) {
    const { spawn } = require("node:child_process");
    // a detached grandchild (its own session and process group) and a shell with children
    spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)", marker], { detached: true, stdio: "ignore" }).unref();
    spawn("/bin/sh", ["-c", "sleep 300 & sleep 300 & wait", marker], { stdio: "ignore" }).unref();
  }
  process.stdout.write(JSON.stringify(report) + "\n");
  if (mode.endsWith("spin")) setInterval(() => {}, 1000);
};
socket.on("connect", () => done("connected"));
socket.on("error", (e) => done(e.code || e.message));
setTimeout(() => done("no answer"), 3000).unref();
`;

/** Runs PROBE with `sandbox`'s command line (`permissionModel: false`: the OS layer alone). */
function probeArgs(sandbox: Sandbox, args: { permissionModel: boolean; port: number; marker: string; mode?: string }) {
  const how = snippetProcess(sandbox, 64, sandbox.mode === "none" ? mkdtempSync(join(tmpdir(), "composer-js-probe-")) : undefined);
  let argv = [...how.args];
  argv[argv.indexOf("-e") + 1] = PROBE;
  argv.push(String(args.port), args.marker, args.mode ?? "");
  if (!args.permissionModel) argv = argv.filter((a) => !/^--(experimental-)?permission$|^--allow-fs-/.test(a));
  return { command: how.command, argv, options: how.options };
}

function runProbe(sandbox: Sandbox, args: { permissionModel: boolean; port: number; marker: string; mode?: string }): Promise<Record<string, unknown>> {
  const { command, argv, options } = probeArgs(sandbox, args);
  return new Promise((resolve, reject) =>
    execFile(command, argv, { cwd: options.cwd, env: options.env, encoding: "utf8", timeout: 20_000 }, (error, stdout, stderr) => {
      if (error) return reject(new Error(`${error.message}\n${stderr}`));
      resolve(JSON.parse(stdout) as Record<string, unknown>);
    }),
  );
}

/** A server on 127.0.0.1 that counts the connections it gets. */
async function listener(): Promise<{ port: number; accepted: () => number; close: () => void }> {
  let accepted = 0;
  const server = createServer((s) => {
    accepted++;
    s.destroy();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { port: (server.address() as AddressInfo).port, accepted: () => accepted, close: () => server.close() };
}

/** Host processes whose command line contains `marker`. */
function processesWith(marker: string): string[] {
  const found: string[] = [];
  for (const pid of readdirSync("/proc").filter((n) => /^[0-9]+$/.test(n))) {
    try {
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      if (cmdline.includes(marker)) found.push(`${pid}: ${cmdline.replace(/\0/g, " ")}`);
    } catch {
      // gone
    }
  }
  return found;
}

async function eventually(check: () => boolean, ms = 5_000): Promise<boolean> {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (check()) return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return check();
}

const ROOT = process.getuid?.() === 0;
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

});

describe("the code runner's sandbox", { concurrency: 2 }, () => {
  test("a snippet sees no COMPOSER_TOKEN, cannot learn its uid and cannot reach the network from the vm", async () => {
    process.env["COMPOSER_TOKEN"] = "canary-secret";
    try {
      for (const code of ["process.env.COMPOSER_TOKEN", "process.getuid()", "globalThis.process"]) {
        const r = await runSnippet(code, null, LIMITS);
        assert.equal(r.code, "CODE_ERROR", code);
        assert.match(r.message, /process is refused/);
      }
      const seen = await runSnippet("Object.getOwnPropertyNames(globalThis).filter((n) => /token|composer|env/i.test(n))", null, LIMITS);
      assert.deepEqual(seen.output, []);
    } finally {
      delete process.env["COMPOSER_TOKEN"];
    }
  });

  test("the process under the vm (permission model on): empty env, nobody, no network, writes only its /tmp", async () => {
    // what a snippet that escaped the vm would find, with the runner's exact command line
    const sandbox = defaultSandbox();
    assert.equal(sandbox.mode, ROOT ? "root" : "userns");
    const server = await listener();
    const marker = `composer-js-probe-${randomBytes(6).toString("hex")}`;
    process.env["COMPOSER_TOKEN"] = "canary-secret";
    try {
      const probe = await runProbe(sandbox, { permissionModel: true, port: server.port, marker });
      assert.deepEqual(
        { ...probe, status: undefined },
        {
          env: "[]",
          uid: ROOT ? 65534 : 0,
          gid: ROOT ? 65534 : 0,
          groups: ROOT ? "[65534]" : probe["groups"], // node always lists the effective group; see /proc below
          cwd: "/tmp",
          status: undefined,
          interfaces: "ERR_ACCESS_DENIED", // the permission model refuses /proc/net/dev (the OS test below reads it)
          pids: "ERR_ACCESS_DENIED",
          writeOwnFolder: "ok",
          writeTmp: "ok", // its own /tmp: a private tmpfs
          writeRoot: "ERR_ACCESS_DENIED",
          writeEtc: "ERR_ACCESS_DENIED",
          writeVarLib: "ERR_ACCESS_DENIED",
          readPasswd: "ERR_ACCESS_DENIED",
          readRoot: "ERR_ACCESS_DENIED",
          spawn: "ERR_ACCESS_DENIED", // so a snippet cannot start a process tree at all
          binding: "ERR_ACCESS_DENIED",
          codeFromStrings: "EvalError",
          connect: "ENETUNREACH", // Node 20's permission model lets sockets through: the namespace stops them
        },
      );
      assert.equal(server.accepted(), 0);
      assert.ok(!existsSync(join("/tmp", `${marker}.txt`)), "nothing appears in the host's /tmp");
    } finally {
      delete process.env["COMPOSER_TOKEN"];
      server.close();
    }
  });

  test("the OS layer alone (no permission model): nobody, only lo, no loopback, writes only its /tmp", async () => {
    const sandbox = defaultSandbox();
    const server = await listener();
    const marker = `composer-js-probe-${randomBytes(6).toString("hex")}`;
    process.env["COMPOSER_TOKEN"] = "canary-secret";
    const hostTmp = new Set(readdirSync("/tmp"));
    try {
      const probe = await runProbe(sandbox, { permissionModel: false, port: server.port, marker });
      assert.equal(probe["env"], "[]");
      assert.equal(probe["interfaces"], '["lo"]');
      assert.equal(probe["connect"], "ENETUNREACH");
      assert.equal(server.accepted(), 0);
      assert.equal(probe["writeOwnFolder"], "ok");
      assert.equal(probe["writeTmp"], "ok");
      assert.ok(Number(probe["pids"]) <= 3, `its /proc shows only its own processes: ${String(probe["pids"])}`);
      assert.equal(probe["spawn"], "ok"); // without the permission model: see the process-tree test
      if (ROOT) {
        assert.equal(probe["uid"], 65534);
        assert.equal(probe["gid"], 65534);
        assert.equal(probe["groups"], "[65534]"); // node adds the effective group to the (empty) list
        assert.equal(
          probe["status"],
          "Groups:;CapPrm: 0000000000000000;CapEff: 0000000000000000;CapBnd: 0000000000000000;NoNewPrivs: 1",
        );
        for (const key of ["writeRoot", "writeEtc", "writeVarLib", "readRoot"]) assert.equal(probe[key], "EACCES", key);
        assert.equal(probe["readPasswd"], "ok"); // what nobody may read on the machine
      }
      assert.ok(!existsSync(join("/tmp", `${marker}.txt`)), "nothing appears in the host's /tmp");
      assert.ok(!existsSync(`/${marker}.txt`) && !existsSync(`/etc/${marker}.txt`));
      assert.deepEqual(readdirSync("/tmp").filter((n) => !hostTmp.has(n) && n.includes("composer-js")), []);
    } finally {
      delete process.env["COMPOSER_TOKEN"];
      server.close();
    }
  });

  test("a process tree started under the sandbox dies with it, whether it ends or is killed", async () => {
    const sandbox = defaultSandbox();
    const server = await listener();
    try {
      // with the permission model (the runner's command line) there is no tree: spawning is refused
      const refused = await runSnippet("require('child_process').spawn('sleep', ['300'])", null, LIMITS);
      assert.match(refused.message, /require\('child_process'\) is refused/);
      // without it (an escape from both the vm and the permission model): the tree ends with the probe
      const ended = `composer-js-tree-${randomBytes(6).toString("hex")}`;
      const probe = await runProbe(sandbox, { permissionModel: false, port: server.port, marker: ended, mode: "tree" });
      assert.equal(probe["spawn"], "ok");
      assert.ok(await eventually(() => processesWith(ended).length === 0), `left behind: ${processesWith(ended).join("; ")}`);
      // killed as runSnippet kills (the process group) while its tree runs
      const killed = `composer-js-tree-${randomBytes(6).toString("hex")}`;
      const { command, argv, options } = probeArgs(sandbox, { permissionModel: false, port: server.port, marker: killed, mode: "tree-spin" });
      const child = spawn(command, argv, options);
      child.stdin.end();
      await new Promise<void>((resolve) => child.stdout.once("data", () => resolve()));
      assert.ok(await eventually(() => processesWith(killed).length >= 5), `the tree started (unshare, PID 1, the probe, a node, a sh): ${processesWith(killed).join("; ")}`);
      process.kill(-child.pid!, "SIGKILL");
      assert.ok(await eventually(() => processesWith(killed).length === 0), `left behind: ${processesWith(killed).join("; ")}`);
    } finally {
      server.close();
    }
  });

  test("a crash is CODE_CRASHED with the signal, reported through the namespace's PID 1", async () => {
    // the child program killed by a signal: PID 1 ends with 128 + N and the runner says signal N
    const r = await runSnippet("1", null, { ...LIMITS, memoryLimitMb: 16, sandbox: { ...defaultSandbox(), node: "/bin/false" } });
    assert.equal(r.code, "CODE_CRASHED");
    assert.match(r.message, /exit code 1/);
    const sandbox = defaultSandbox();
    const how = snippetProcess(sandbox, 64);
    const argv = [...how.args];
    argv[argv.indexOf("-e") + 1] = "process.kill(process.pid, 'SIGKILL')";
    const status = await new Promise<number | null>((resolve) => {
      const c = spawn(how.command, argv.filter((a) => !/^--(experimental-)?permission$|^--allow-fs-/.test(a)), how.options);
      c.stdin.end();
      c.on("close", (code) => resolve(code));
    });
    assert.equal(status, 128 + 9);
  });

  test("without namespaces the runner refuses to start unless --allow-network-in-snippets", async () => {
    assert.throws(() => detectSandbox({ unshare: "/bin/false" }), (e: unknown) => {
      assert.ok(e instanceof SandboxUnavailable);
      assert.match(e.message, /no namespaces .*--allow-network-in-snippets/);
      return true;
    });
    const none = detectSandbox({ unshare: "/bin/false", allowNetworkInSnippets: true });
    assert.equal(none.mode, "none");
    // then: an empty environment and a temporary folder of its own, removed afterwards
    const before = new Set(readdirSync(tmpdir()).filter((n) => n.startsWith("composer-js-")));
    const r = await runSnippet("input.a + 1", { a: 1 }, { ...LIMITS, sandbox: none });
    assert.equal(r.output, 2);
    assert.deepEqual(readdirSync(tmpdir()).filter((n) => n.startsWith("composer-js-") && !before.has(n)), []);

    // the command: `unshare` made unavailable by a PATH whose unshare is /bin/false
    const bin = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "src", "bin", "code-runner-js.js");
    const fake = mkdtempSync(join(tmpdir(), "composer-js-fakebin-"));
    try {
      symlinkSync("/bin/false", join(fake, "unshare"));
      const env = { ...process.env, PATH: `${fake}:${process.env["PATH"] ?? "/usr/bin:/bin"}`, COMPOSER_ADDRESS: "127.0.0.1:1" };
      const refused = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
        const c = spawn(process.execPath, [bin], { env, stdio: ["ignore", "pipe", "pipe"] });
        let stderr = "";
        c.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
        c.on("close", (code) => resolve({ code, stderr }));
      });
      assert.equal(refused.code, 2, refused.stderr);
      assert.match(refused.stderr, /no namespaces .*--allow-network-in-snippets/);
      const allowed = spawn(process.execPath, [bin, "--allow-network-in-snippets"], { env, stdio: ["ignore", "pipe", "pipe"] });
      let stderr = "";
      allowed.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
      const exit = new Promise<number | null>((resolve) => allowed.on("close", (code) => resolve(code)));
      const early = await Promise.race([exit, new Promise<"running">((r) => setTimeout(() => r("running"), 2_000))]);
      assert.equal(early, "running", `it started and serves: ${stderr}`);
      assert.match(stderr, /CAN reach the network/);
      allowed.kill("SIGTERM");
      await exit;
    } finally {
      rmSync(fake, { recursive: true, force: true });
    }
  });
});
