// The JavaScript code runner: serves CODE nodes (queue `code.javascript`), each snippet in a child
// `node` process with a heap limit, a time limit, an empty environment, its own temporary folder
// and no file system, network, child processes or modules. See the README for what a snippet can reach.
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { CHILD_SOURCE } from "./code-child.js";
import { NonRetryableError, TaskError } from "./errors.js";
import type { Json } from "./values.js";
import type { Handler, TaskContext } from "./worker.js";

/** How long a snippet may run by default (ms). */
export const DEFAULT_TIME_LIMIT_MS = 30_000;
/** The snippet's V8 heap limit by default (MiB). */
export const DEFAULT_MEMORY_LIMIT_MB = 256;
const STDERR_TAIL = 8_000;
/** Memory a node process needs besides the snippet's heap, before the resident-size watchdog kills it (MiB). */
const RSS_ALLOWANCE_MB = 192;

/** Options of the code runner. */
export interface CodeRunnerOptions {
  /** ms a snippet may run (default 30 s, and never past the attempt's deadline). */
  timeLimitMs?: number;
  /** The snippet's heap limit in MiB (default 256). */
  memoryLimitMb?: number;
  /** The `node` binary for the child (default: this one). */
  nodePath?: string;
}

/** What running a snippet gave: its output, or a failure code with message and details. */
export interface SnippetResult {
  ok: boolean;
  output: Json;
  /** On failure: CODE_ERROR, TIMEOUT, MEMORY_LIMIT, INVALID_OUTPUT or CODE_CRASHED. */
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

function permissionFlag(): string {
  return process.allowedNodeEnvironmentFlags.has("--permission") ? "--permission" : "--experimental-permission";
}

async function rssMb(pid: number): Promise<number> {
  try {
    const statm = await readFile(`/proc/${pid}/statm`, "utf8");
    const pages = Number(statm.split(" ")[1]);
    return (pages * 4096) / (1024 * 1024);
  } catch {
    return 0;
  }
}

/**
 * How a snippet's child process is started: this node with the permission model (it may read and
 * write only `folder`; no child processes, workers or native addons), the heap limit, no code
 * generation from strings, an empty environment, `folder` as its working directory, and its own
 * process group (so that a kill reaches anything it started).
 */
export function snippetProcess(folder: string, memoryMb: number, nodePath?: string) {
  return {
    command: nodePath ?? process.execPath,
    args: [
      permissionFlag(),
      `--allow-fs-read=${folder}`,
      `--allow-fs-write=${folder}`,
      `--max-old-space-size=${memoryMb}`,
      "--disallow-code-generation-from-strings",
      "--no-warnings",
      "--experimental-vm-modules",
      "-e",
      CHILD_SOURCE,
    ],
    options: { cwd: folder, env: {}, stdio: ["pipe", "pipe", "pipe"] as ["pipe", "pipe", "pipe"], detached: true },
  };
}

/**
 * Runs `code` in a child process with `input` in scope. The output is the variable `result` if
 * the snippet assigns it, else the script's completion value (the value of its last expression
 * statement; a promise is awaited), else null. Aborting `signal` kills the child.
 */
export async function runSnippet(
  code: string,
  input: unknown,
  options: CodeRunnerOptions & { signal?: AbortSignal } = {},
): Promise<SnippetResult> {
  const timeLimitMs = Math.max(1, options.timeLimitMs ?? DEFAULT_TIME_LIMIT_MS);
  const memoryMb = Math.max(16, Math.floor(options.memoryLimitMb ?? DEFAULT_MEMORY_LIMIT_MB));
  const started = Date.now();
  const folder = await mkdtemp(join(tmpdir(), "composer-js-"));
  try {
    const how = snippetProcess(folder, memoryMb, options.nodePath);
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
      const why = signal ? `signal ${signal}` : `exit code ${exitCode}`;
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
    await rm(folder, { recursive: true, force: true });
  }
}

/** The handler of the code runner (what `worker.serveCode()` registers). */
export function makeCodeHandler(options: CodeRunnerOptions = {}): Handler {
  const limit = options.timeLimitMs ?? DEFAULT_TIME_LIMIT_MS;
  return async (ctx: TaskContext) => {
    const task = ctx.input as { code?: unknown; input?: unknown } | null;
    if (!task || typeof task !== "object" || typeof task.code !== "string") {
      throw new NonRetryableError('a CODE task needs the input {"code": "<snippet>", "input": ...}', { code: "BAD_CODE_INPUT" });
    }
    let ms = limit;
    if (ctx.deadline) ms = Math.min(ms, Math.max(1, ctx.deadline.getTime() - Date.now()));
    const result = await runSnippet(task.code, task.input, { ...options, timeLimitMs: ms, signal: ctx.signal });
    if (result.stderr) ctx.logger.info(`snippet output:\n${result.stderr.slice(-STDERR_TAIL)}`);
    if (result.ok) return result.output;
    throw new TaskError(result.message, { code: result.code, retryable: result.retryable, details: result.details });
  };
}
