// The JavaScript code runner: serves CODE nodes (queue `code.javascript`), each snippet in a child
// `node` process with a heap limit, a time limit, an empty environment, its own temporary folder
// and no file system, network, child processes or modules, inside Linux namespaces (no network,
// private /tmp, own PID namespace) as the user nobody when the runner is root. See the README for
// what a snippet can reach, and docs/decisions/0011-snippet-sandbox.md.
import { spawn, spawnSync } from "node:child_process";
import { accessSync, constants as fsConstants, statSync, realpathSync } from "node:fs";
import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { delimiter, join, sep } from "node:path";

import { CHILD_SOURCE } from "./code-child.js";
import { NonRetryableError, TaskError } from "./errors.js";
import type { Handler, TaskContext } from "./task-context.js";
import type { Json } from "./values.js";

/** How long a snippet may run by default (ms). */
export const DEFAULT_TIME_LIMIT_MS = 30_000;
/** The snippet's V8 heap limit by default (MiB). */
export const DEFAULT_MEMORY_LIMIT_MB = 256;
const STDERR_TAIL = 8_000;
/** Memory a node process needs besides the snippet's heap, before the resident-size watchdog kills it (MiB). */
const RSS_ALLOWANCE_MB = 192;
/** The unprivileged user (and group) a root runner's snippets run as. */
const NOBODY = 65534;
const NAMESPACES = ["--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private"];

/** Options of the code runner. */
export interface CodeRunnerOptions {
  /** ms a snippet may run (default 30 s, and never past the attempt's deadline). */
  timeLimitMs?: number;
  /** The snippet's heap limit in MiB (default 256). */
  memoryLimitMb?: number;
  /** The `node` binary for the child (default: this one if the user nobody can read it, else /usr/bin/node). */
  nodePath?: string;
  /**
   * Start even where the kernel gives no namespaces (`unshare` fails): snippets then get only an
   * empty environment and a temporary folder of their own, and CAN reach the network.
   */
  allowNetworkInSnippets?: boolean;
  /** The sandbox to run snippets in (default: {@link detectSandbox}, once). */
  sandbox?: Sandbox;
}

/** The kernel gives this runner no namespaces, and snippets were not allowed the network. */
export class SandboxUnavailable extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SandboxUnavailable";
  }
}

/**
 * How snippets are isolated on this machine (see {@link detectSandbox}). `root`: namespaces and
 * the user nobody; `userns`: the same namespaces inside a user namespace (the runner is not root);
 * `none`: an empty environment and a temporary working folder only (`--allow-network-in-snippets`).
 */
export interface Sandbox {
  mode: "root" | "userns" | "none";
  /** The node binary snippets run with: one the snippet's user can read. */
  node: string;
  /** Absolute paths of the tools the launcher uses (unused in mode `none`). */
  tools: { unshare: string; sh: string; mount: string; setpriv: string; prlimit: string };
}

/** Where `name` is on PATH (or in the usual system folders), else `/usr/bin/<name>`. */
function which(name: string): string {
  const folders = [...(process.env["PATH"] ?? "").split(delimiter), "/usr/bin", "/bin", "/usr/sbin", "/sbin"];
  for (const folder of folders) {
    if (!folder) continue;
    const candidate = join(folder, name);
    try {
      accessSync(candidate, fsConstants.X_OK);
      return candidate;
    } catch {
      // next
    }
  }
  return `/usr/bin/${name}`;
}

/** True when every folder above `path` may be searched, and the path read, by any user. */
function worldReadable(path: string): boolean {
  let real: string;
  try {
    real = realpathSync(path);
  } catch {
    return false;
  }
  const parts = real.split(sep);
  for (let depth = 2; depth <= parts.length; depth++) {
    const here = parts.slice(0, depth).join(sep) || sep;
    try {
      const st = statSync(here);
      if (!(st.mode & 0o004) || (st.isDirectory() && !(st.mode & 0o001))) return false;
    } catch {
      return false;
    }
  }
  return true;
}

/** A node binary the user nobody can read and run (for the root mode). */
function snippetNode(mode: Sandbox["mode"], nodePath?: string): string | undefined {
  if (nodePath) return nodePath;
  if (mode !== "root") return process.execPath;
  return [process.execPath, "/usr/bin/node", "/usr/local/bin/node"].find((c) => worldReadable(c));
}

// The namespace's PID 1 (run by `sh` as root, or as the mapped root of a user namespace): mounts a
// fresh tmpfs on /tmp, /var/tmp and /dev/shm (the snippet's own folders, gone with the mount
// namespace), enters /tmp, runs the rest of its arguments (setpriv ... prlimit ... node ...) and
// ends with the snippet's status (128 + N for signal N). Its end takes every process left in the
// PID namespace with it; orphans are reparented to it and reaped while it waits.
const LAUNCHER = `set -e
owner=$1; mount=$2; shift 2
for spec in /tmp:64m /var/tmp:16m /dev/shm:16m; do
  dir=\${spec%%:*}; size=\${spec#*:}
  if [ -d "$dir" ]; then "$mount" -t tmpfs -o "nosuid,nodev,noexec,size=$size,mode=0700$owner" tmpfs "$dir"; fi
done
cd /tmp
unset PWD OLDPWD
set +e
"$@"
exit $?
`;

function permissionFlag(): string {
  return process.allowedNodeEnvironmentFlags.has("--permission") ? "--permission" : "--experimental-permission";
}

/** The processes under `pid` (itself included), as far as /proc/<pid>/task/<tid>/children tells. */
async function tree(pid: number, depth = 0): Promise<number[]> {
  const found = [pid];
  if (depth > 8) return found;
  let tasks: string[] = [];
  try {
    tasks = await readdir(`/proc/${pid}/task`);
  } catch {
    return found;
  }
  for (const task of tasks) {
    let children = "";
    try {
      children = await readFile(`/proc/${pid}/task/${task}/children`, "utf8");
    } catch {
      continue;
    }
    for (const child of children.split(" ").filter(Boolean)) found.push(...(await tree(Number(child), depth + 1)));
  }
  return found;
}

async function rssMb(pid: number): Promise<number> {
  let total = 0;
  for (const p of await tree(pid)) {
    try {
      const statm = await readFile(`/proc/${p}/statm`, "utf8");
      total += (Number(statm.split(" ")[1]) * 4096) / (1024 * 1024);
    } catch {
      // gone
    }
  }
  return total;
}

/**
 * How a snippet's child process is started. Always: a `node` with the permission model (it may
 * read and write only its folder; no child processes, workers or native addons), the heap limit,
 * no code generation from strings, an empty environment, and its own process group (so that a kill
 * reaches anything it started). In modes `root` and `userns` that node runs under `unshare` (new
 * network, mount and PID namespaces) behind the launcher above, in a private tmpfs `/tmp` as its
 * folder; in `root` it first becomes nobody (setpriv: uid/gid 65534, no groups, no capabilities,
 * no_new_privs); rlimits: 256 processes (threads count), 64 MiB per file, no core. In mode `none`
 * its folder is `folder` on the host. The program it runs is the argument after `-e`.
 */
export function snippetProcess(sandbox: Sandbox, memoryMb: number, folder = "/tmp") {
  const dir = sandbox.mode === "none" ? folder : "/tmp";
  const node = [
    sandbox.node,
    permissionFlag(),
    `--allow-fs-read=${dir}`,
    `--allow-fs-write=${dir}`,
    `--max-old-space-size=${memoryMb}`,
    "--disallow-code-generation-from-strings",
    "--no-warnings",
    "--experimental-vm-modules",
    "-e",
    CHILD_SOURCE,
  ];
  const stdio = ["pipe", "pipe", "pipe"] as ["pipe", "pipe", "pipe"];
  if (sandbox.mode === "none") {
    return { command: node[0]!, args: node.slice(1), options: { cwd: folder, env: {}, stdio, detached: true } };
  }
  const t = sandbox.tools;
  const limits = [t.prlimit, "--nproc=256", `--fsize=${64 << 20}`, "--core=0", "--"];
  const drop =
    sandbox.mode === "root"
      ? [t.setpriv, `--reuid=${NOBODY}`, `--regid=${NOBODY}`, "--clear-groups", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
      : [t.setpriv, "--no-new-privs"];
  const owner = sandbox.mode === "root" ? `,uid=${NOBODY},gid=${NOBODY}` : "";
  const userns = sandbox.mode === "userns" ? ["--user", "--map-root-user"] : [];
  return {
    command: t.unshare,
    args: [...userns, ...NAMESPACES, t.sh, "-c", LAUNCHER, "composer-snippet", owner, t.mount, ...drop, ...limits, ...node],
    options: { cwd: "/", env: {}, stdio, detached: true },
  };
}

/** True when a trivial snippet runs in `sandbox`. */
function probe(sandbox: Sandbox): boolean {
  const how = snippetProcess(sandbox, 64);
  try {
    const done = spawnSync(how.command, how.args, {
      cwd: how.options.cwd,
      env: {},
      input: JSON.stringify({ code: "6 * 7", input: null, timeLimitMs: 10_000 }),
      encoding: "utf8",
      timeout: 20_000,
      killSignal: "SIGKILL",
    });
    return done.status === 0 && done.stdout.includes('"ok":true') && done.stdout.includes('"output":"42"');
  } catch {
    return false;
  }
}

/**
 * The strongest sandbox this machine gives, checked by running a snippet in it: `root` when the
 * runner is root, else `userns`. Where that fails, throws {@link SandboxUnavailable} unless
 * `allowNetworkInSnippets` (then mode `none`, with a warning). `unshare` is the `unshare` binary
 * (default: found on PATH).
 */
export function detectSandbox(options: { allowNetworkInSnippets?: boolean; nodePath?: string; unshare?: string } = {}): Sandbox {
  const tools = {
    unshare: options.unshare ?? which("unshare"),
    sh: which("sh"),
    mount: which("mount"),
    setpriv: which("setpriv"),
    prlimit: which("prlimit"),
  };
  const mode = process.getuid?.() === 0 ? "root" : "userns";
  const node = snippetNode(mode, options.nodePath);
  let why = "unshare failed";
  if (process.platform !== "linux") why = "this is not Linux";
  else if (!node) why = "no node binary readable by the user nobody was found (tried this one, /usr/bin/node, /usr/local/bin/node)";
  else {
    const sandbox: Sandbox = { mode, node, tools };
    if (probe(sandbox)) return sandbox;
  }
  if (options.allowNetworkInSnippets) {
    process.emitWarning(
      `composer code runner: no namespaces here (${why}): snippets run with an empty environment but CAN reach the network and the runner's files`,
    );
    return { mode: "none", node: options.nodePath ?? process.execPath, tools };
  }
  throw new SandboxUnavailable(
    `this machine gives the code runner no namespaces (${why}), so snippets could reach the network; ` +
      "run the runner as root, enable unprivileged user namespaces, or pass --allow-network-in-snippets",
  );
}

let detected: Sandbox | undefined;

/** The sandbox {@link runSnippet} uses when given none (detected once). */
export function defaultSandbox(): Sandbox {
  detected ??= detectSandbox();
  return detected;
}

/** What running a snippet gave: its output, or a failure code with message and details. */
export interface SnippetResult {
  ok: boolean;
  output: Json;
  /**
   * On failure: CODE_ERROR, TIMEOUT, MEMORY_LIMIT, INVALID_OUTPUT or CODE_CRASHED; with secrets,
   * also SECRETS_NEED_OBJECT_INPUT (see {@link runSnippet}).
   */
  code: string;
  message: string;
  /** On failure: type, message, stack, stderr (tail). */
  details: { type: string; message: string; stack: string; stderr: string } | null;
  /** What the snippet logged with console.*. */
  stderr: string;
  /** True when another attempt may help: CODE_ERROR and CODE_CRASHED. */
  retryable: boolean;
  ms: number;
}

/** The sandbox `options` ask for: theirs, else the one detected once (with their node binary). */
function sandboxFor(options: CodeRunnerOptions): Sandbox {
  if (options.sandbox) return options.sandbox;
  if (options.allowNetworkInSnippets) {
    detected ??= detectSandbox({ allowNetworkInSnippets: true });
  }
  const sandbox = defaultSandbox();
  return options.nodePath ? { ...sandbox, node: options.nodePath } : sandbox;
}

/** What {@link runSnippet} takes besides the runner's options. */
export interface SnippetOptions extends CodeRunnerOptions {
  /** Aborting it kills the snippet's process (and everything it started): CANCELLED. */
  signal?: AbortSignal;
  /**
   * Secret values by name, for a snippet whose node declares secrets: they are put in its input
   * under `secrets` (sent to the child the way the input is, on its stdin: never in its environment,
   * command line or a file) and replaced by `[secret NAME]` in everything the result holds.
   */
  secrets?: Readonly<Record<string, string>>;
}

/**
 * Runs `code` in a sandboxed child process with `input` in scope. The output is the variable
 * `result` if the snippet assigns it, else the script's completion value (the value of its last
 * expression statement; a promise is awaited), else null. Aborting `signal` kills the child (and
 * everything it started). Without `options.sandbox`, the sandbox is detected on first use
 * ({@link defaultSandbox}; throws {@link SandboxUnavailable} where there are no namespaces).
 *
 * With `options.secrets` the snippet's input gets the key `secrets` (name to value): the input must
 * then be an object (null or undefined count as `{}`; a `secrets` key of its own is replaced), else
 * the result is the non-retryable failure SECRETS_NEED_OBJECT_INPUT and nothing runs. Every value
 * is redacted from the output (strings and object keys, at any depth), the message, the
 * details (stack included) and the logged lines.
 */
export async function runSnippet(code: string, input: unknown, options: SnippetOptions = {}): Promise<SnippetResult> {
  const { secrets, ...rest } = options;
  if (secrets === undefined) return runChild(code, input, rest);
  const given = inputWithSecrets(input, secrets);
  if ("refused" in given) return refused(given.refused.code, given.refused.message);
  return redactResult(await runChild(code, given.input, rest), secretRedactor(secrets));
}

/** `input` with `secrets` under the key `secrets` (replacing one it had), or why it cannot take them. */
function inputWithSecrets(
  input: unknown,
  secrets: Readonly<Record<string, string>>,
): { input: Record<string, unknown> } | { refused: { code: string; message: string } } {
  // copied through entries: the values object given may be anything record-like
  const values = Object.fromEntries(Object.entries(secrets));
  if (input === null || input === undefined) return { input: { secrets: values } };
  if (typeof input !== "object" || Array.isArray(input)) {
    const kind = Array.isArray(input) ? "an array" : `a ${typeof input}`;
    return {
      refused: {
        code: "SECRETS_NEED_OBJECT_INPUT",
        message: `the node declares secrets, which the snippet receives in its input under "secrets", but its input is ${kind}, not an object`,
      },
    };
  }
  return { input: { ...(input as Record<string, unknown>), secrets: values } };
}

/** A non-retryable failure found before any snippet ran. */
function refused(code: string, message: string): SnippetResult {
  return { ok: false, output: null, code, message, details: { type: "", message, stack: "", stderr: "" }, stderr: "", retryable: false, ms: 0 };
}

/**
 * A function replacing every value of `secrets` in a text by `[secret NAME]`: longest value first
 * (at each place the longest that matches), in one pass (a placeholder is never searched again), and
 * each value also in its JSON-escaped form, as `JSON.stringify` and `console.log` of an object
 * write it.
 */
export function secretRedactor(secrets: Readonly<Record<string, string>>): (text: string) => string {
  const nameOf = new Map<string, string>();
  for (const [name, value] of Object.entries(secrets)) {
    if (!value) continue;
    for (const form of [value, JSON.stringify(value).slice(1, -1)]) if (!nameOf.has(form)) nameOf.set(form, name);
  }
  if (nameOf.size === 0) return (text) => text;
  const forms = [...nameOf.keys()].sort((a, b) => b.length - a.length);
  // literal alternatives, matched code unit by code unit (no "u": any value, lone surrogates too)
  const pattern = new RegExp(forms.map((f) => f.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")).join("|"), "g");
  return (text) => text.replace(pattern, (found) => `[secret ${nameOf.get(found) ?? "?"}]`);
}

/** `value` with `redact` applied to every string and object key, at any depth. */
export function redactJson<T>(value: T, redact: (text: string) => string): T {
  if (typeof value === "string") return redact(value) as T;
  if (Array.isArray(value)) return value.map((item: unknown) => redactJson(item, redact)) as T;
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [redact(k), redactJson(v, redact)])) as T;
  }
  return value;
}

function redactResult(result: SnippetResult, redact: (text: string) => string): SnippetResult {
  return {
    ...result,
    output: redactJson(result.output, redact),
    message: redact(result.message),
    details: redactJson(result.details, redact),
    stderr: redact(result.stderr),
  };
}

/** Runs the snippet's child process: {@link runSnippet} without the secrets. */
async function runChild(code: string, input: unknown, options: CodeRunnerOptions & { signal?: AbortSignal }): Promise<SnippetResult> {
  const timeLimitMs = Math.max(1, options.timeLimitMs ?? DEFAULT_TIME_LIMIT_MS);
  const memoryMb = Math.max(16, Math.floor(options.memoryLimitMb ?? DEFAULT_MEMORY_LIMIT_MB));
  const sandbox = sandboxFor(options);
  const started = Date.now();
  // without namespaces, the snippet's folder is one made for it here; else its private /tmp
  const folder = sandbox.mode === "none" ? await mkdtemp(join(tmpdir(), "composer-js-")) : undefined;
  try {
    const how = snippetProcess(sandbox, memoryMb, folder);
    const child = spawn(how.command, how.args, how.options);
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (c: string) => (stdout += c));
    child.stderr.setEncoding("utf8").on("data", (c: string) => {
      stderr += c;
      if (stderr.length > 4 * STDERR_TAIL) stderr = stderr.slice(-2 * STDERR_TAIL);
    });
    child.stdin.on("error", () => {});
    child.stdin.end(JSON.stringify({ code, input: input === undefined ? null : input, timeLimitMs }));
    let killedFor: "TIMEOUT" | "MEMORY_LIMIT" | "CANCELLED" | undefined;
    const kill = (why: typeof killedFor): void => {
      killedFor ??= why;
      try {
        if (child.pid) process.kill(-child.pid, "SIGKILL");
      } catch {
        child.kill("SIGKILL");
      }
    };
    const timer = setTimeout(() => kill("TIMEOUT"), timeLimitMs + 500);
    const watchdog = setInterval(() => {
      if (child.pid) void rssMb(child.pid).then((mb) => mb > memoryMb + RSS_ALLOWANCE_MB && kill("MEMORY_LIMIT"));
    }, 50);
    const onAbort = (): void => kill("CANCELLED");
    options.signal?.addEventListener("abort", onAbort, { once: true });
    const [exitCode, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
      child.on("close", (c, s) => resolve([c, s])),
    );
    clearTimeout(timer);
    clearInterval(watchdog);
    options.signal?.removeEventListener("abort", onAbort);
    const ms = Date.now() - started;
    const tail = stderr.slice(-STDERR_TAIL);
    const failure = (code: string, message: string, type = "", stack = ""): SnippetResult => ({
      ok: false,
      output: null,
      code,
      message,
      details: { type, message, stack, stderr: tail },
      stderr,
      retryable: code === "CODE_ERROR" || code === "CODE_CRASHED",
      ms,
    });
    const timeMessage = `the snippet did not finish within its time limit of ${timeLimitMs / 1000} s`;
    if (killedFor === "CANCELLED") return failure("CANCELLED", "the snippet was stopped: its task was cancelled");
    if (killedFor === "TIMEOUT") return failure("TIMEOUT", timeMessage, "TimeoutError");
    const memoryMessage = `the snippet exceeded its memory limit of ${memoryMb} MiB`;
    if (killedFor === "MEMORY_LIMIT" || /heap out of memory|Reached heap limit|Allocation failed/i.test(stderr)) {
      return failure("MEMORY_LIMIT", memoryMessage, "RangeError");
    }
    let answer: { ok?: boolean; output?: string; code?: string; type?: string; message?: string; stack?: string } | undefined;
    try {
      answer = JSON.parse(stdout.trim().split("\n").pop() ?? "") as typeof answer;
    } catch {
      answer = undefined;
    }
    if (!answer || typeof answer !== "object") {
      // in a namespace, PID 1 reports a snippet killed by signal N as exit code 128 + N
      const why = signal
        ? `signal ${signal}`
        : exitCode !== null && exitCode > 128 && sandbox.mode !== "none"
          ? `signal ${exitCode - 128}`
          : `exit code ${exitCode}`;
      return failure("CODE_CRASHED", `the snippet's process ended without a result (${why})`);
    }
    if (answer.ok) {
      return { ok: true, output: JSON.parse(answer.output ?? "null") as Json, code: "", message: "", details: null, stderr, retryable: false, ms };
    }
    const kind = answer.code ?? "CODE_ERROR";
    if (kind === "TIMEOUT") return failure("TIMEOUT", timeMessage, "TimeoutError");
    if (kind === "CODE_ERROR" && answer.type === "RangeError" && /Array buffer allocation failed|Invalid (typed )?array length/.test(answer.message ?? "")) {
      return failure("MEMORY_LIMIT", `${memoryMessage}: ${answer.message ?? ""}`, "RangeError", answer.stack ?? "");
    }
    const message = kind === "CODE_ERROR" ? `${answer.type ?? "Error"}: ${answer.message ?? ""}` : (answer.message ?? "");
    return failure(kind, message, answer.type ?? "", answer.stack ?? "");
  } finally {
    if (folder) await rm(folder, { recursive: true, force: true });
  }
}

/**
 * The names a CODE task's input declares in `secrets` (empty when it has none), or undefined when
 * the field is not a list of strings.
 */
function declaredSecrets(task: { secrets?: unknown }): string[] | undefined {
  const names = task.secrets;
  if (names === undefined || names === null) return [];
  if (!Array.isArray(names) || !names.every((n) => typeof n === "string")) return undefined;
  return names as string[];
}

/**
 * The values of the declared `names` among those the server handed with the task; only these
 * reach the snippet. Throws SECRET_UNAVAILABLE (retryable, as the server's own) for a name without
 * a value: the snippet never runs without what it declared.
 */
function declaredValues(names: string[], handed: TaskContext["secrets"]): Record<string, string> {
  const values = new Map<string, string>();
  for (const name of names) {
    const value = handed.get(name);
    if (value === undefined) {
      throw new TaskError(`the node declares secret ${JSON.stringify(name)}, but the server handed no value for it`, {
        code: "SECRET_UNAVAILABLE",
        retryable: true,
      });
    }
    values.set(name, value);
  }
  return Object.fromEntries(values);
}

/** `error` with every secret value taken out of its message and stack (and a TaskError's details). */
function redactedError(error: unknown, redact: (text: string) => string): unknown {
  if (error instanceof TaskError) {
    return new TaskError(redact(error.message), { code: error.code, retryable: error.retryable, details: redactJson(error.details, redact) });
  }
  if (error instanceof Error) {
    error.message = redact(error.message);
    if (error.stack !== undefined) error.stack = redact(error.stack);
  }
  return error;
}

/**
 * The handler of the code runner (what `worker.serveCode()` registers). Detects the sandbox at
 * once, so a runner that cannot isolate snippets fails here ({@link SandboxUnavailable}), before
 * it polls. A task whose node declares secrets (its input's `secrets`, names) gets their values
 * from `ctx.secrets` into the snippet's input (see {@link runSnippet}); what it reports and logs
 * holds none of them.
 */
export function makeCodeHandler(options: CodeRunnerOptions = {}): Handler {
  const limit = options.timeLimitMs ?? DEFAULT_TIME_LIMIT_MS;
  const sandbox = sandboxFor(options);
  return async (ctx: TaskContext) => {
    const task = ctx.input as { code?: unknown; input?: unknown; secrets?: unknown } | null;
    if (!task || typeof task !== "object" || typeof task.code !== "string") {
      throw new NonRetryableError('a CODE task needs the input {"code": "<snippet>", "input": ...}', { code: "BAD_CODE_INPUT" });
    }
    const names = declaredSecrets(task);
    if (names === undefined) {
      throw new NonRetryableError("a CODE task's \"secrets\" must be a list of secret names", { code: "BAD_CODE_INPUT" });
    }
    const secrets = names.length > 0 ? declaredValues(names, ctx.secrets) : undefined;
    const redact = secretRedactor(secrets ?? {});
    let ms = limit;
    if (ctx.deadline) ms = Math.min(ms, Math.max(1, ctx.deadline.getTime() - Date.now()));
    let result: SnippetResult;
    try {
      result = await runSnippet(task.code, task.input, {
        ...options,
        sandbox,
        timeLimitMs: ms,
        signal: ctx.signal,
        ...(secrets ? { secrets } : {}),
      });
    } catch (error) {
      throw redactedError(error, redact);
    }
    if (result.stderr) ctx.logger.info(`snippet output:\n${result.stderr.slice(-STDERR_TAIL)}`);
    if (result.ok) return result.output;
    throw new TaskError(result.message, { code: result.code, retryable: result.retryable, details: result.details });
  };
}
