// The Worker: runs task handlers for the tasks a Composer server leases to it.
//
//   const worker = new Worker({ slots: 8 });
//   worker.task("inventory", "reserve_stock", async (ctx) => {
//     if (!ctx.input.sku) throw new NonRetryableError("no sku", { code: "BAD_SKU" });
//     return { reserved: true, task: ctx.taskId };
//   });
//   await worker.run(); // until SIGTERM / SIGINT, then drains
//
// The worker long-polls its queues for as many tasks as it has free slots, confirms the receipt of
// each task still running a third of the way to its first, short expiry with an early heartbeat
// (so a poll answer lost on the way costs no attempt), heartbeats each running task at a third of
// its lease, aborts the handler's `ctx.signal` when the run is cancelled, the lease lost or the
// attempt's deadline passed, reports the outcome with the lease token, sends a report again with
// the same token after UNAVAILABLE / DEADLINE_EXCEEDED or a busy server (RESOURCE_EXHAUSTED with
// QUOTA_EXCEEDED / CPU_POOL_BUSY, after its RetryInfo delay), and treats LEASE_LOST as final.
// Handlers never see blob references: the worker downloads the values a task's input refers to
// before the handler runs, and uploads an output over the server's offload threshold
// (docs/payloads.md). On stop it stops polling, drains in-flight tasks within `drainTimeoutMs`, and
// only then stops heartbeating.
import { AsyncLocalStorage } from "node:async_hooks";
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";

import type { Duration, Timestamp, Value } from "@bufbuild/protobuf/wkt";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { Interceptor, Transport } from "@connectrpc/connect";

import { Backoff } from "./backoff.js";
import { ComposerClient } from "./client.js";
import { makeCodeHandler, type CodeRunnerOptions } from "./code-runner.js";
import { ComposerError, TaskError, isLeaseLost, isResourceExhausted, isServerBusy, toComposerError } from "./errors.js";
import type { Task } from "./gen/composer/v1/worker_service_pb.js";
import {
  CANCEL_ATTEMPT_DEADLINE,
  CANCEL_ATTEMPT_FAILED,
  CANCEL_LEASE_LOST,
  CANCEL_RUN_CANCELLED,
  CANCEL_SHUTDOWN,
  TaskCancelledError,
  TaskSecrets,
  type CancelKind,
  type Handler,
  type Logger,
  type TaskContext,
} from "./task-context.js";
import { HandlerSpan, workerTracing, type Tracing } from "./tracing.js";
import { createNodeTransport, resolveAddress, resolveToken } from "./transport-node.js";
import { blobReference, bytesOverLimit, hasBlobReference } from "./payloads.js";
import { NotJsonError, fromValue, toJsonValue, toValue, valueOfJson, type Json } from "./values.js";

const LEVELS = ["debug", "info", "warn", "error", "silent"] as const;

/** A console logger printing from `level` up (default: `COMPOSER_LOG_LEVEL`, else `warn`), to stderr. */
export function consoleLogger(level: string = process.env["COMPOSER_LOG_LEVEL"] ?? "warn"): Logger {
  const min = Math.max(0, LEVELS.indexOf(level as (typeof LEVELS)[number]));
  const at = (name: (typeof LEVELS)[number]) => (message: string, ...args: unknown[]) => {
    if (LEVELS.indexOf(name) >= min) console.error(`${new Date().toISOString()} ${name.toUpperCase()} composer ${message}`, ...args);
  };
  return { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}

function prefixed(logger: Logger, prefix: string): Logger {
  return {
    debug: (m, ...a) => logger.debug(`${prefix} ${m}`, ...a),
    info: (m, ...a) => logger.info(`${prefix} ${m}`, ...a),
    warn: (m, ...a) => logger.warn(`${prefix} ${m}`, ...a),
    error: (m, ...a) => logger.error(`${prefix} ${m}`, ...a),
  };
}

/** Counters of what a worker did. */
export interface WorkerStats {
  /** Tasks leased to this worker. */
  polled: number;
  /** Attempts reported complete (applied by the server). */
  completed: number;
  /** Attempts reported failed (applied by the server). */
  failed: number;
  /** Attempts dropped because the server said the lease was lost. */
  leaseLost: number;
  /** Attempts stopped because their run was cancelled. */
  cancelled: number;
  /** Reports sent again after UNAVAILABLE, DEADLINE_EXCEEDED or a busy server. */
  reportRetries: number;
  /** PollTasks calls that failed. */
  pollErrors: number;
}

/** Options of {@link Worker}; durations in ms. */
export interface WorkerOptions {
  /**
   * The server: `host:port`, `http://host:port` or `https://host:port` (default `COMPOSER_ADDRESS`,
   * else 127.0.0.1:7070). A malformed one throws a TypeError from the constructor.
   */
  address?: string;
  /** Bearer token (default `COMPOSER_TOKEN`). */
  token?: string;
  /** TLS to a `host:port` address (as `https://host:port`). */
  tls?: boolean;
  /** How many tasks run at once (default 10). */
  slots?: number;
  /** Queues to poll besides those named in {@link Worker.task}. */
  queues?: string[];
  /** This process's id, recorded as the lease owner (default host-pid-random). */
  workerId?: string;
  /** The long-poll wait (default 20 s). */
  pollWaitMs?: number;
  /** How long a graceful stop waits for in-flight tasks (default 30 s). */
  drainTimeoutMs?: number;
  /** How long a report is retried after transient failures (default 300 s). */
  reportTimeoutMs?: number;
  /**
   * Overrides the heartbeat interval (default a third of each task's lease). The first heartbeat
   * comes sooner when the first, short lease must be confirmed before it ends.
   */
  heartbeatIntervalMs?: number;
  /** Back-off of failed polls, heartbeats and reports (default 200 ms .. 5 s, jitter 0.5). */
  backoff?: Backoff;
  /** connect interceptors for every call (tests record calls with one). */
  interceptors?: Interceptor[];
  /** A transport of your own (then address, tls and interceptors are not used). */
  transport?: Transport;
  /** Check the server's protocol version before polling (default true). */
  checkServer?: boolean;
  logger?: Logger;
  /**
   * The OpenTelemetry `TracerProvider` of the handlers' spans (default: the global one). Used only
   * when `@opentelemetry/api` is installed; see the README's "Tracing".
   */
  tracerProvider?: TracerProviderLike;
}

/** What the worker uses of an OpenTelemetry `TracerProvider` (any provider fits). */
export interface TracerProviderLike {
  getTracer(name: string): unknown;
}

/** The most tasks one PollTasks may ask for. */
export const MAX_POLL_TASKS = 100;
const DEFAULT_LEASE_MS = 30_000;
/** The first heartbeat's delay when a task's first expiry is already past by this clock (clocks apart). */
const SKEWED_FIRST_HEARTBEAT_MS = 500;
const MAX_MESSAGE = 4_000;
const MAX_STACK = 32_000;

interface Deferred<T> {
  promise: Promise<T>;
  resolve: (value: T) => void;
  settled: boolean;
}

function deferred<T = void>(): Deferred<T> {
  let resolve!: (value: T) => void;
  const d: Deferred<T> = {
    promise: new Promise<T>((r) => (resolve = r)),
    resolve: (value: T) => {
      d.settled = true;
      resolve(value);
    },
    settled: false,
  };
  return d;
}

/** Sleeps `ms`; resolves false early when `signal` aborts. */
function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", abort);
      resolve(true);
    }, ms);
    function abort(): void {
      clearTimeout(timer);
      resolve(false);
    }
    signal?.addEventListener("abort", abort, { once: true });
  });
}

function durationMs(d: Duration | undefined): number | undefined {
  if (!d) return undefined;
  return Number(d.seconds) * 1000 + d.nanos / 1e6;
}

function tsDate(t: Timestamp | undefined): Date | undefined {
  return t ? timestampDate(t) : undefined;
}

/**
 * How long after receipt (`nowMs`) the first heartbeat goes out. A task polled with
 * `confirmReceipt` is held only until its first, short `leaseExpireTime` unless a heartbeat
 * confirms it: so the first heartbeat comes a third of the way there, or after `intervalMs` if that
 * is sooner. An expiry already past by this clock (clocks apart) gets a short delay instead.
 */
export function firstHeartbeatDelayMs(task: Pick<Task, "leaseExpireTime">, intervalMs: number, nowMs: number): number {
  const expiry = tsDate(task.leaseExpireTime);
  if (!expiry) return intervalMs;
  const untilExpiry = expiry.getTime() - nowMs;
  if (!(untilExpiry > 0)) return Math.min(SKEWED_FIRST_HEARTBEAT_MS, intervalMs);
  return Math.min(untilExpiry / 3, intervalMs);
}

/** Counts the tasks a worker runs against its limit. Only the poll loop takes slots. */
export class Slots {
  readonly capacity: number;
  #used = 0;
  #waiters: (() => void)[] = [];
  /** The most slots ever used at once. */
  highWater = 0;

  constructor(capacity: number) {
    if (!(capacity >= 1)) throw new RangeError("a worker needs at least one slot");
    this.capacity = capacity;
  }

  get used(): number {
    return this.#used;
  }

  get free(): number {
    return this.capacity - this.#used;
  }

  /** Takes `count` slots; with `force` even when fewer are free (a server that leased too many). */
  acquire(count = 1, force = false): void {
    if (!force && count > this.free) throw new RangeError(`asked for ${count} slots with ${this.free} free`);
    this.#used += count;
    this.highWater = Math.max(this.highWater, this.#used);
    this.#notify();
  }

  release(): void {
    if (this.#used <= 0) throw new RangeError("release without acquire");
    this.#used -= 1;
    this.#notify();
  }

  #notify(): void {
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w();
  }

  /** Resolves once a slot is free (or `signal` aborts). */
  async waitFree(signal?: AbortSignal): Promise<void> {
    while (this.free <= 0 && !signal?.aborted) {
      // the abort listener goes with the wait: one left per wait piles up on a long-lived signal
      let onAbort: (() => void) | undefined;
      await new Promise<void>((resolve) => {
        onAbort = () => resolve();
        this.#waiters.push(resolve);
        signal?.addEventListener("abort", onAbort, { once: true });
      });
      if (onAbort) signal?.removeEventListener("abort", onAbort);
    }
  }
}

// --- attributing unhandled rejections to the task whose handler made the promise -----------------
//
// Node emits `unhandledRejection` in the async context of the rejected promise, so the execution
// the handler ran in (`currentExecution.run`) is the store there: no hook of our own on every
// promise of the process.

const currentExecution = new AsyncLocalStorage<Execution>();
let guardUsers = 0;

function onUnhandledRejection(reason: unknown): void {
  const owner = currentExecution.getStore();
  if (owner && !owner.finished) {
    if (!owner.interrupt.settled) owner.interrupt.resolve({ kind: "crash", error: reason });
    return;
  }
  // Not a handler's: do what Node does by default, unless the program listens itself.
  if (process.listenerCount("unhandledRejection") <= 1) throw reason;
}

function installGuard(): void {
  if (guardUsers++ > 0) return;
  process.on("unhandledRejection", onUnhandledRejection);
}

function removeGuard(): void {
  if (--guardUsers > 0) return;
  process.off("unhandledRejection", onUnhandledRejection);
}

// --- one attempt ---------------------------------------------------------------------------------

class Context implements TaskContext {
  readonly taskId: string;
  readonly attempt: number;
  readonly runId: string;
  readonly nodeId: string;
  readonly workflowName: string;
  readonly workflowVersion: number;
  readonly namespace: string;
  readonly queue: string;
  readonly taskName: string;
  /** The task's input; the worker replaces its blob references with their values before the handler runs. */
  input: any; // eslint-disable-line @typescript-eslint/no-explicit-any
  readonly secrets: TaskSecrets;
  readonly deadline: Date | undefined;
  cancelKind: CancelKind | undefined;
  cancelReason: string | undefined;
  /** Called once, when the attempt is cancelled (the worker's wake-up of the attempt). */
  onCancel: (() => void) | undefined;
  // The logger, the controller and the reason are made when first used: most attempts never
  // log, read their signal or get cancelled.
  readonly #baseLogger: Logger;
  #logger: Logger | undefined;
  #controller: AbortController | undefined;
  #reason: TaskCancelledError | undefined;

  constructor(task: Task, logger: Logger) {
    this.taskId = task.taskId;
    this.attempt = task.attempt;
    this.runId = task.runId;
    this.nodeId = task.nodeId;
    this.workflowName = task.workflowName;
    this.workflowVersion = task.workflowVersion;
    this.namespace = task.namespace;
    this.queue = task.queue;
    this.taskName = task.taskName;
    this.input = fromValue(task.input);
    this.secrets = new TaskSecrets(task.secrets);
    this.deadline = tsDate(task.attemptDeadline);
    this.#baseLogger = logger;
  }

  get logger(): Logger {
    return (this.#logger ??= prefixed(this.#baseLogger, `[${this.nodeId}#${this.attempt} run ${this.runId}]`));
  }

  get signal(): AbortSignal {
    if (this.#controller === undefined) {
      this.#controller = new AbortController();
      if (this.#reason !== undefined) this.#controller.abort(this.#reason);
    }
    return this.#controller.signal;
  }

  throwIfCancelled(): void {
    if (this.#reason !== undefined) throw this.#reason;
  }

  /** Aborts the signal for `kind`, with `reason` (default the kind) as its text; false if it already was. */
  cancel(kind: CancelKind, reason: string = kind): boolean {
    if (this.cancelKind !== undefined) return false;
    this.cancelKind = kind;
    this.cancelReason = reason;
    this.#reason = new TaskCancelledError(kind, reason);
    this.#controller?.abort(this.#reason);
    this.onCancel?.();
    return true;
  }
}

/** What ends the wait for a handler early: its cancellation, or a rejection it left unhandled. */
type Interrupt = { kind: "aborted" } | { kind: "crash"; error: unknown };

/** An attempt's heartbeats: a timer until the first is due, then a loop (stopped by `stop`). */
interface Heartbeats {
  timer: NodeJS.Timeout | undefined;
  stop: AbortController | undefined;
  loop: Promise<void> | undefined;
}

function stopHeartbeats(heartbeats: Heartbeats): void {
  if (heartbeats.timer !== undefined) clearTimeout(heartbeats.timer);
  heartbeats.timer = undefined;
  heartbeats.stop?.abort();
}

interface Execution {
  task: Task;
  ctx: Context;
  /** The attempt's heartbeats (stopped with {@link stopHeartbeats}). */
  heartbeats: Heartbeats;
  /** Resolved when the attempt is cancelled, or with the reason of an unhandled rejection made by the handler. */
  interrupt: Deferred<Interrupt>;
  /** Settles when the handler's promise settled; undefined when no handler ran. */
  handlerSettled: Promise<unknown> | undefined;
  /** The handler's span; ended before the report goes out, so an exporter has it when the run ends. */
  span: HandlerSpan;
  /** Resolved when everything about the attempt is done (handler, report, slot). */
  done: Deferred<void>;
  /** True once a report was applied or the attempt was dropped. */
  finished: boolean;
}

/** A handler's output, already JSON, or its failure (with the error behind it, if one was thrown). */
type Outcome = { output: Value } | { failure: TaskError; error?: unknown };

function errorCode(error: Error): string {
  const name = typeof error.name === "string" && error.name ? error.name : "Error";
  if (name !== "Error") return name;
  const ctor = (error as { constructor?: { name?: unknown } }).constructor?.name;
  return typeof ctor === "string" && ctor ? ctor : "Error";
}

function describe(value: unknown): string {
  try {
    return typeof value === "string" ? value : JSON.stringify(value) ?? String(value);
  } catch {
    return Object.prototype.toString.call(value);
  }
}

/** Whether the same call may succeed later: UNAVAILABLE, DEADLINE_EXCEEDED or a busy server. */
function isTransient(error: ComposerError): boolean {
  return error.retryable || isServerBusy(error);
}

/**
 * What a cancelled attempt reports: TIMEOUT when its deadline passed, else nothing (the run was
 * cancelled, the lease lost, the worker stopped).
 */
function cancelledOutcome(ctx: Context): Outcome | undefined {
  if (ctx.cancelKind === CANCEL_ATTEMPT_DEADLINE) {
    const at = ctx.deadline?.toISOString() ?? "its deadline";
    return { failure: new TaskError(`the attempt did not finish by its deadline (${at})`, { code: "TIMEOUT" }) };
  }
  ctx.logger.info(`task stopped (${ctx.cancelReason}); not reporting`);
  return undefined;
}

/** The failure an error thrown by a handler (or a rejection it left unhandled) reports. */
export function failureOf(error: unknown, unhandled = false): TaskError {
  if (error instanceof TaskError) return error;
  if (error instanceof Error) {
    const code = errorCode(error);
    const stack = String(error.stack ?? `${code}: ${error.message}`);
    return new TaskError((error.message || code).slice(0, MAX_MESSAGE), {
      code,
      details: { type: code, message: error.message, stack: stack.slice(-MAX_STACK), ...(unhandled ? { unhandledRejection: true } : {}) },
    });
  }
  const text = describe(error).slice(0, MAX_MESSAGE);
  return new TaskError(`the handler threw a non-Error value: ${text}`, {
    code: "NON_ERROR_THROWN",
    details: { type: typeof error, value: text, ...(unhandled ? { unhandledRejection: true } : {}) },
  });
}

/** Serves task handlers on one or more queues of a Composer server. */
export class Worker {
  readonly address: string;
  readonly workerId: string;
  /** Counters of what the worker did. */
  readonly stats: WorkerStats = { polled: 0, completed: 0, failed: 0, leaseLost: 0, cancelled: 0, reportRetries: 0, pollErrors: 0 };
  readonly #queues: string[];
  readonly #handlers = new Map<string, Handler>();
  readonly #capacity: number;
  readonly #options: WorkerOptions;
  readonly #backoff: Backoff;
  readonly #log: Logger;
  readonly #running = new Set<Execution>();
  #slots: Slots | undefined;
  #client: ComposerClient | undefined;
  #stop = new AbortController();
  #force = new AbortController();
  #serving = false;
  #tracing: Tracing | undefined;
  /** The server's `payloadOffloadBytes` (GetServerInfo at the protocol check, else asked at the first output). */
  #offloadBytes: number | undefined;
  #offloadAsked: Promise<number> | undefined;

  constructor(options: WorkerOptions = {}) {
    const slots = options.slots ?? 10;
    if (!Number.isInteger(slots) || slots < 1) throw new RangeError("slots must be an integer of at least 1");
    this.#options = options;
    this.#capacity = slots;
    // A malformed address throws here, not at the first poll (none is used with a transport).
    this.address = resolveAddress(options.address, options.transport ? undefined : { tls: options.tls ?? false });
    this.workerId = options.workerId ?? `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;
    this.#queues = [...new Set(options.queues ?? [])];
    this.#backoff = options.backoff ?? new Backoff({ initialMs: 200, maximumMs: 5_000 });
    this.#log = options.logger ?? consoleLogger();
  }

  // --- registration ------------------------------------------------------------------------------

  /** Registers the handler of task `name` on `queue` (which is then polled). */
  task(queue: string, name: string, handler: Handler): this {
    const key = `${queue}\u0000${name}`;
    if (this.#handlers.has(key)) throw new Error(`task ${JSON.stringify(name)} already has a handler on queue ${JSON.stringify(queue)}`);
    this.#handlers.set(key, handler);
    if (!this.#queues.includes(queue)) this.#queues.push(queue);
    return this;
  }

  /** Registers `handler` for every task of `queue` that no handler claims by name. */
  handleQueue(queue: string, handler: Handler): this {
    const key = `${queue}\u0000*`;
    if (this.#handlers.has(key)) throw new Error(`queue ${JSON.stringify(queue)} already has a default handler`);
    this.#handlers.set(key, handler);
    if (!this.#queues.includes(queue)) this.#queues.push(queue);
    return this;
  }

  /**
   * Makes this worker a JavaScript code runner: it serves CODE nodes (queue `code.javascript`).
   * See `runSnippet` for the convention and limits.
   */
  serveCode(options: CodeRunnerOptions & { queue?: string } = {}): this {
    return this.handleQueue(options.queue ?? "code.javascript", makeCodeHandler(options));
  }

  /** The queues this worker polls. */
  get queues(): string[] {
    return [...this.#queues];
  }

  /** Tasks running now. */
  get inFlight(): number {
    return this.#running.size;
  }

  /** The most tasks that ever ran at once in this worker. */
  get maxConcurrencySeen(): number {
    return this.#slots?.highWater ?? 0;
  }

  #handlerFor(task: Task): Handler | undefined {
    return this.#handlers.get(`${task.queue}\u0000${task.taskName}`) ?? this.#handlers.get(`${task.queue}\u0000*`);
  }

  // --- life cycle --------------------------------------------------------------------------------

  /**
   * Serves until SIGTERM or SIGINT, then stops gracefully: stop polling, drain, stop heartbeating.
   * A second signal stops waiting for the drain. Resolves when the worker stopped.
   */
  async run(): Promise<void> {
    const onSignal = (): void => this.stop();
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
    try {
      await this.serve();
    } finally {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
    }
  }

  /**
   * Asks the worker to stop: no new poll, in-flight tasks drain within `drainTimeoutMs`, then
   * heartbeats stop. A second call stops waiting for the drain (unfinished attempts are failed as
   * WORKER_SHUTDOWN, retryable).
   */
  stop(): void {
    if (this.#stop.signal.aborted) {
      this.#log.warn("stopping at once: in-flight tasks are failed as WORKER_SHUTDOWN");
      this.#force.abort();
    } else {
      this.#log.info(`stopping: no new polls; draining ${this.#running.size} in-flight tasks`);
    }
    this.#stop.abort();
  }

  /** Serves until {@link stop} is called; rejects if the server cannot be used (bad protocol, ...). */
  async serve(): Promise<void> {
    if (this.#serving) throw new Error("this worker is already serving");
    if (this.#queues.length === 0) throw new Error("the worker has no queue to poll: register a handler, or pass queues");
    this.#serving = true;
    this.#slots = new Slots(this.#capacity);
    let close = (): void => {};
    let transport = this.#options.transport;
    if (!transport) {
      const made = createNodeTransport(this.address, {
        ...(this.#options.tls ? { tls: true } : {}),
        ...(this.#options.interceptors ? { interceptors: this.#options.interceptors } : {}),
      });
      transport = made.transport;
      close = made.close;
    }
    this.#client = new ComposerClient({ transport, token: resolveToken(this.#options.token) });
    this.#offloadBytes = undefined;
    this.#offloadAsked = undefined;
    this.#tracing = await workerTracing(this.#options.tracerProvider);
    installGuard();
    let poller: Promise<void> | undefined;
    let failure: unknown;
    try {
      if (this.#options.checkServer ?? true) await this.#waitForServer();
      if (!this.#stop.signal.aborted) {
        this.#log.info(`worker ${this.workerId} polling ${this.#queues.join(",")} with ${this.#capacity} slots`);
        poller = this.#pollLoop();
        const stopped = new Promise<void>((resolve) => this.#stop.signal.addEventListener("abort", () => resolve(), { once: true }));
        await Promise.race([poller, stopped]);
      }
    } catch (error) {
      failure = error;
    } finally {
      // 1. Stop polling. A poll already waiting may still return tasks whose leases the server
      // recorded; they run and drain (a second stop cancels that poll).
      if (!this.#stop.signal.aborted) {
        this.#stop.abort();
        this.#force.abort();
      }
      if (poller) {
        try {
          await poller;
        } catch (error) {
          failure ??= error;
        }
      }
      // 2. Drain: in-flight tasks finish and report, heartbeating all the while.
      await this.#drain();
      // 3. Only now stop heartbeating (every attempt's loop ended with it) and close.
      close();
      removeGuard();
      this.#serving = false;
      this.#stop = new AbortController();
      this.#force = new AbortController();
      this.#log.info(`worker ${this.workerId} stopped`);
    }
    if (failure !== undefined) throw failure;
  }

  async #waitForServer(): Promise<void> {
    const client = this.#client as ComposerClient;
    let failures = 0;
    while (!this.#stop.signal.aborted) {
      try {
        const info = await client.checkProtocol({ signal: this.#stop.signal });
        this.#offloadBytes = info.payloadOffloadBytes;
        return;
      } catch (error) {
        const converted = toComposerError(error);
        if (this.#stop.signal.aborted) return;
        if (!converted.retryable) throw converted;
        failures += 1;
        this.#log.warn(`server ${this.address} not reachable yet (${converted.code}); retrying`);
        await sleep(this.#backoff.delay(failures), this.#stop.signal);
      }
    }
  }

  async #drain(): Promise<void> {
    if (this.#running.size === 0) return;
    const timeoutMs = this.#options.drainTimeoutMs ?? 30_000;
    this.#log.info(`draining ${this.#running.size} in-flight tasks (up to ${timeoutMs} ms)`);
    const all = Promise.all([...this.#running].map((e) => e.done.promise));
    const forced = new Promise<void>((resolve) => {
      if (this.#force.signal.aborted) resolve();
      this.#force.signal.addEventListener("abort", () => resolve(), { once: true });
    });
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)));
    await Promise.race([all, forced, timedOut]);
    clearTimeout(timer);
    const unfinished = [...this.#running].filter((e) => !e.finished);
    if (unfinished.length === 0) return;
    this.#log.warn(`${unfinished.length} tasks did not finish within the drain; failing them as WORKER_SHUTDOWN (retryable)`);
    await Promise.all(
      unfinished.map(async (execution) => {
        execution.ctx.cancel(CANCEL_SHUTDOWN);
        execution.finished = true;
        stopHeartbeats(execution.heartbeats);
        execution.span.end(CANCEL_SHUTDOWN);
        const failure = new TaskError("the worker stopped before the task finished", { code: "WORKER_SHUTDOWN" });
        try {
          await this.#sendFail(execution.task, failure, { timeoutMs: 5_000, headers: execution.span.reportHeaders });
          this.stats.failed += 1;
        } catch (error) {
          this.#log.warn(`could not fail an unfinished task: ${String(error)}`);
        }
      }),
    );
  }

  // --- polling -----------------------------------------------------------------------------------

  async #pollLoop(): Promise<void> {
    const client = this.#client as ComposerClient;
    const slots = this.#slots as Slots;
    const waitMs = this.#options.pollWaitMs ?? 20_000;
    const wait = { seconds: BigInt(Math.floor(waitMs / 1000)), nanos: (waitMs % 1000) * 1e6 };
    let failures = 0;
    while (!this.#stop.signal.aborted) {
      if (slots.free <= 0) {
        await slots.waitFree(this.#stop.signal);
        continue;
      }
      const free = slots.free;
      let tasks: Task[];
      try {
        // confirmReceipt: a poll answer lost on the way costs no attempt (decision 0012); the first
        // heartbeat confirms (firstHeartbeatDelayMs).
        const response = await client.raw.workers.pollTasks(
          { workerId: this.workerId, queues: this.#queues, maxTasks: Math.min(free, MAX_POLL_TASKS), wait, confirmReceipt: true },
          client.callOptions({ timeoutMs: waitMs + 5_000, signal: this.#force.signal }),
        );
        tasks = response.tasks;
      } catch (error) {
        if (this.#force.signal.aborted) return;
        const converted = toComposerError(error);
        failures += 1;
        this.stats.pollErrors += 1;
        const delay = this.#backoff.delay(failures);
        const line = `poll failed (${converted.code}: ${converted.rawMessage}); again in ${Math.round(delay)} ms`;
        if (converted.retryable && failures === 1) this.#log.debug(line);
        else this.#log.warn(line);
        await sleep(delay, this.#stop.signal);
        continue;
      }
      failures = 0;
      for (const task of tasks) {
        this.stats.polled += 1;
        if (slots.free > 0) slots.acquire();
        else {
          this.#log.error(`the server leased more tasks than free slots (${this.#capacity})`);
          slots.acquire(1, true);
        }
        void this.#execute(task);
      }
    }
  }

  // --- one task ----------------------------------------------------------------------------------

  async #execute(task: Task): Promise<void> {
    const ctx = new Context(task, this.#log);
    // The values live on in ctx.secrets alone, not in the task the worker keeps for its reports.
    task.secrets = {};
    const execution: Execution = {
      ctx,
      task,
      heartbeats: { timer: undefined, stop: undefined, loop: undefined },
      interrupt: deferred<Interrupt>(),
      handlerSettled: undefined,
      span: new HandlerSpan(task, this.#tracing),
      done: deferred(),
      finished: false,
    };
    ctx.onCancel = () => {
      if (!execution.interrupt.settled) execution.interrupt.resolve({ kind: "aborted" });
    };
    this.#running.add(execution);
    this.#startHeartbeats(task, execution);
    let deadlineTimer: NodeJS.Timeout | undefined;
    const untilDeadline = ctx.deadline ? Math.max(0, ctx.deadline.getTime() - Date.now()) : Infinity;
    if (untilDeadline <= 2_147_483_647) {
      // (a timer cannot wait longer than 2^31 - 1 ms; a deadline further away than that is left to the server)
      deadlineTimer = setTimeout(() => ctx.cancel(CANCEL_ATTEMPT_DEADLINE), untilDeadline);
    }
    try {
      const outcome = await this.#runHandler(task, execution);
      if (!outcome) execution.span.end(ctx.cancelKind ?? "cancelled");
      else if ("failure" in outcome) execution.span.end(`${outcome.failure.code}: ${outcome.failure.message}`, outcome.error);
      else execution.span.end();
      if (outcome && !execution.finished) await this.#report(task, execution, outcome);
    } catch (error) {
      ctx.logger.error(`the worker failed on this task: ${String(error)}`);
    } finally {
      clearTimeout(deadlineTimer);
      execution.finished = true;
      stopHeartbeats(execution.heartbeats);
      if (execution.heartbeats.loop) await execution.heartbeats.loop;
      // The slot is free once the handler itself returned, even when its attempt was dropped.
      if (execution.handlerSettled) await execution.handlerSettled;
      this.#running.delete(execution);
      (this.#slots as Slots).release();
      execution.done.resolve();
    }
  }

  /** Runs the handler; undefined when the attempt was cancelled and nothing is to be reported. */
  async #runHandler(task: Task, execution: Execution): Promise<Outcome | undefined> {
    const ctx = execution.ctx;
    const handler = this.#handlerFor(task);
    if (!handler) {
      ctx.logger.error(`no handler for task ${JSON.stringify(task.taskName)} on queue ${JSON.stringify(task.queue)}`);
      return { failure: new TaskError(`this worker has no handler for task ${JSON.stringify(task.taskName)}`, { code: "UNKNOWN_TASK" }) };
    }
    // The handler sees values, never blob references: each blob is downloaded first.
    if (hasBlobReference(ctx.input as Json)) {
      try {
        ctx.input = await (this.#client as ComposerClient).resolvePayload(ctx.input, { signal: ctx.signal });
      } catch (error) {
        if (ctx.cancelKind !== undefined) return cancelledOutcome(ctx);
        const converted = toComposerError(error);
        ctx.logger.warn(`could not read the input's blobs: ${converted.message}`);
        return {
          // A busy server (a quota, the CPU pool) may serve the next attempt.
          failure: new TaskError(`could not read the task's input: ${converted.message}`, { code: "INPUT_UNAVAILABLE", retryable: isTransient(converted) }),
          error,
        };
      }
    }
    // The handler runs with its span active, so the spans it starts are the span's children.
    const result = currentExecution.run(execution, () =>
      execution.span.run(() => {
        try {
          return Promise.resolve(handler(ctx));
        } catch (error) {
          return Promise.reject(error);
        }
      }),
    );
    const settled = result.then(
      (output) => ({ kind: "ok" as const, output }),
      (error: unknown) => ({ kind: "error" as const, error }),
    );
    execution.handlerSettled = settled;
    const first = await Promise.race([settled, execution.interrupt.promise]);
    if (first.kind === "crash") {
      ctx.logger.warn(`the handler left a rejection unhandled: ${describe(first.error instanceof Error ? first.error.message : first.error)}`);
      ctx.cancel(CANCEL_ATTEMPT_FAILED);
      return { failure: failureOf(first.error, true), error: first.error };
    }
    if (first.kind === "aborted" || ctx.cancelKind !== undefined) return cancelledOutcome(ctx);
    if (first.kind === "ok") {
      let json: Json;
      try {
        json = toJsonValue(first.output);
      } catch (error) {
        const why = error instanceof NotJsonError ? error.message : String(error);
        return { failure: new TaskError(`the handler's output is not JSON: ${why}`, { code: "INVALID_OUTPUT", retryable: false }), error };
      }
      return this.#outputOutcome(ctx, json);
    }
    if (!(first.error instanceof TaskError)) {
      ctx.logger.warn(`handler threw ${first.error instanceof Error ? errorCode(first.error) : typeof first.error}: ${first.error instanceof Error ? first.error.message : describe(first.error)}`);
    }
    return { failure: failureOf(first.error), error: first.error };
  }

  /**
   * The outcome of an output: itself, or, when its compact JSON is longer than the server's
   * offload threshold, the reference of the blob it was uploaded to. An upload that meets
   * UNAVAILABLE, DEADLINE_EXCEEDED or a busy server is made again (within `reportTimeoutMs`),
   * then fails the attempt with OUTPUT_UPLOAD_FAILED, retryable; one over the server's payload
   * limit fails it with OUTPUT_TOO_LARGE, as a report would.
   */
  async #outputOutcome(ctx: Context, json: Json): Promise<Outcome | undefined> {
    // Numbers, booleans and null are never long enough to offload.
    if (json === null || typeof json === "number" || typeof json === "boolean") return { output: valueOfJson(json) };
    const client = this.#client as ComposerClient;
    let limit = this.#offloadBytes;
    if (limit === undefined) {
      // No protocol check (checkServer false): asked once, by the first output.
      this.#offloadAsked ??= client.serverInfo().then(
        (info) => (this.#offloadBytes = info.payloadOffloadBytes),
        (error: unknown) => {
          this.#offloadAsked = undefined;
          ctx.logger.warn(`GetServerInfo failed (${String(error)}); this output goes inline`);
          return 0;
        },
      );
      limit = await this.#offloadAsked;
    }
    const bytes = limit > 0 ? bytesOverLimit(JSON.stringify(json), limit) : undefined;
    if (!bytes) return { output: valueOfJson(json) };
    const deadline = Date.now() + (this.#options.reportTimeoutMs ?? 300_000);
    for (let failures = 0; ; ) {
      try {
        const ref = await client.uploadBlob(bytes, { signal: ctx.signal });
        ctx.logger.debug(`output of ${bytes.length} bytes uploaded as blob ${ref.sha256}`);
        return { output: valueOfJson(blobReference(ref) as unknown as Json) };
      } catch (error) {
        if (ctx.cancelKind !== undefined) return cancelledOutcome(ctx);
        const converted = toComposerError(error);
        // A RESOURCE_EXHAUSTED that is no busy server is the payload limit.
        if (converted.code === "RESOURCE_EXHAUSTED" && !isTransient(converted)) {
          return { failure: new TaskError(`output too large: ${converted.rawMessage}`, { code: "OUTPUT_TOO_LARGE", retryable: false }), error };
        }
        failures += 1;
        const delay = this.#retryDelay(converted, failures, deadline);
        if (delay === undefined) {
          return {
            failure: new TaskError(`could not upload the output: ${converted.message}`, { code: "OUTPUT_UPLOAD_FAILED", retryable: isTransient(converted) }),
            error,
          };
        }
        ctx.logger.info(`output upload failed (${converted.code}); again in ${Math.round(delay)} ms`);
        await sleep(delay, ctx.signal);
      }
    }
  }

  /**
   * Heartbeats the task: first a third of the way to its first expiry (it confirms receipt), then
   * every interval. Until the first is due it is only a timer: most attempts end before.
   */
  #startHeartbeats(task: Task, execution: Execution): void {
    const lease = durationMs(task.leaseDuration) ?? DEFAULT_LEASE_MS;
    const interval = this.#options.heartbeatIntervalMs ?? Math.max(lease / 3, 50);
    const heartbeats = execution.heartbeats;
    // Computed at receipt: #execute starts the heartbeats before its first await.
    const first = firstHeartbeatDelayMs(task, interval, Date.now());
    heartbeats.timer = setTimeout(() => {
      heartbeats.timer = undefined;
      heartbeats.stop = new AbortController();
      heartbeats.loop = this.#heartbeatLoop(task, execution, heartbeats.stop.signal, interval);
    }, first);
  }

  /** The heartbeats from the first (due now) on, until `stop` aborts. */
  async #heartbeatLoop(task: Task, execution: Execution, stop: AbortSignal, interval: number): Promise<void> {
    const client = this.#client as ComposerClient;
    const ctx = execution.ctx;
    const request = { taskId: task.taskId, attempt: task.attempt, leaseToken: task.leaseToken };
    let failures = 0;
    let wait: number | undefined; // none before the first: the timer waited
    for (;;) {
      if (wait !== undefined && !(await sleep(wait, stop))) return;
      wait = interval;
      let cancelRequested: boolean;
      let cancelReason: string;
      try {
        const response = await client.raw.workers.heartbeat(request, client.callOptions({ timeoutMs: Math.max(interval, 1_000), signal: stop }));
        cancelRequested = response.cancelRequested;
        cancelReason = response.cancelReason;
      } catch (error) {
        if (stop.aborted) return;
        const converted = toComposerError(error);
        if (isLeaseLost(converted as unknown)) {
          if (execution.finished) return;
          this.stats.leaseLost += 1;
          ctx.logger.warn("lease lost; stopping the task, it will not be reported");
          ctx.cancel(CANCEL_LEASE_LOST);
          return;
        }
        failures += 1;
        wait = Math.min(this.#backoff.delay(failures), interval);
        ctx.logger.debug(`heartbeat failed (${converted.code}: ${converted.rawMessage}); retrying`);
        continue;
      }
      failures = 0;
      if (cancelRequested && !execution.finished) {
        // The server's reason when it gives one (servers before cancel_reason send none).
        const reason = cancelReason || CANCEL_RUN_CANCELLED;
        ctx.logger.info(`run cancelled (${reason}); stopping the task`);
        if (ctx.cancel(CANCEL_RUN_CANCELLED, reason)) this.stats.cancelled += 1;
        return;
      }
    }
  }

  /**
   * How long to wait before making a failed call again: the server's RetryInfo delay when it gives
   * one, else the back-off after `failures` failures. Undefined when the call is not to be made
   * again: its error is not transient, or the next try would come after `deadline`.
   */
  #retryDelay(error: ComposerError, failures: number, deadline: number): number | undefined {
    if (!isTransient(error)) return undefined;
    // A zero delay counts as none: sending again at once would spin until the deadline.
    const delay = error.retryAfterMs || this.#backoff.delay(failures);
    return Date.now() + delay > deadline ? undefined : delay;
  }

  // --- reports -----------------------------------------------------------------------------------

  /** Reports the outcome; every call carries the handler span's trace headers. */
  async #report(task: Task, execution: Execution, outcome: Outcome): Promise<void> {
    const client = this.#client as ComposerClient;
    const ctx = execution.ctx;
    if ("failure" in outcome) return this.#reportFailure(task, execution, outcome.failure);
    try {
      const request = { taskId: task.taskId, attempt: task.attempt, leaseToken: task.leaseToken, output: outcome.output };
      const headers = execution.span.reportHeaders;
      if (await this.#sendWithRetries(ctx, (o) => client.raw.workers.completeTask(request, o), headers)) {
        execution.finished = true;
        this.stats.completed += 1;
        ctx.logger.debug("completed");
      }
    } catch (error) {
      // A server still busy at the report deadline fails the attempt retryable (L6) rather than
      // leaving it to the lease's expiry: the server hears of it now and retries it sooner.
      if (isServerBusy(error)) {
        return this.#reportFailure(
          task,
          execution,
          new TaskError(`could not report the output: ${error.message}`, { code: "OUTPUT_UPLOAD_FAILED", retryable: true }),
        );
      }
      if (isResourceExhausted(error)) {
        return this.#reportFailure(
          task,
          execution,
          new TaskError(`output too large: ${error.rawMessage}`, { code: "OUTPUT_TOO_LARGE", retryable: false }),
        );
      }
      ctx.logger.error(`could not report completion (${String(error)}); the lease will expire`);
    }
  }

  async #reportFailure(task: Task, execution: Execution, failure: TaskError): Promise<void> {
    const ctx = execution.ctx;
    try {
      if (await this.#sendFail(task, failure, { ctx, headers: execution.span.reportHeaders })) {
        execution.finished = true;
        this.stats.failed += 1;
        ctx.logger.info(`failed with ${failure.code} (retryable=${failure.retryable}): ${failure.message}`);
      }
    } catch (error) {
      ctx.logger.error(`could not report failure (${String(error)}); the lease will expire`);
    }
  }

  async #sendFail(task: Task, failure: TaskError, how: { ctx?: Context; timeoutMs?: number; headers?: Record<string, string> }): Promise<boolean> {
    const client = this.#client as ComposerClient;
    let details;
    if (failure.details !== undefined && failure.details !== null) {
      try {
        details = toValue(failure.details);
      } catch {
        details = toValue({ repr: describe(failure.details).slice(0, MAX_MESSAGE) });
      }
    }
    const request = {
      taskId: task.taskId,
      attempt: task.attempt,
      leaseToken: task.leaseToken,
      errorCode: failure.code,
      message: failure.message.slice(0, MAX_MESSAGE),
      retryable: failure.retryable,
      ...(details ? { details } : {}),
    };
    if (!how.ctx) {
      try {
        await client.raw.workers.failTask(request, client.callOptions({ timeoutMs: how.timeoutMs ?? 5_000, headers: how.headers ?? {} }));
      } catch (error) {
        throw toComposerError(error);
      }
      return true;
    }
    return this.#sendWithRetries(how.ctx, (o) => client.raw.workers.failTask(request, o), how.headers ?? {});
  }

  /**
   * Sends a report, again with the same lease token after a transient failure or a busy server
   * (until `reportTimeoutMs`). False when the lease was lost (the report is dropped, never
   * retried); throws other errors.
   */
  async #sendWithRetries(
    ctx: Context,
    send: (options: ReturnType<ComposerClient["callOptions"]>) => Promise<unknown>,
    headers: Record<string, string>,
  ): Promise<boolean> {
    const client = this.#client as ComposerClient;
    const deadline = Date.now() + (this.#options.reportTimeoutMs ?? 300_000);
    let failures = 0;
    for (;;) {
      try {
        await send(client.callOptions({ timeoutMs: 10_000, headers }));
        return true;
      } catch (error) {
        const converted = toComposerError(error);
        if (isLeaseLost(converted as unknown)) {
          this.stats.leaseLost += 1;
          ctx.cancel(CANCEL_LEASE_LOST);
          ctx.logger.warn("report refused: the lease was lost; dropping it (not retried)");
          return false;
        }
        failures += 1;
        const delay = this.#retryDelay(converted, failures, deadline);
        if (delay === undefined) throw converted;
        this.stats.reportRetries += 1;
        ctx.logger.info(`report failed (${converted.code}); sending it again in ${Math.round(delay)} ms`);
        await sleep(delay);
      }
    }
  }
}

export { ComposerError };
export type { Json };
// The task's side of the API, defined below the worker and the code runner, is the worker's too.
export {
  CANCEL_ATTEMPT_DEADLINE,
  CANCEL_ATTEMPT_FAILED,
  CANCEL_LEASE_LOST,
  CANCEL_RUN_CANCELLED,
  CANCEL_SHUTDOWN,
  TaskCancelledError,
  TaskSecrets,
};
export type { CancelKind, Handler, Logger, TaskContext };
