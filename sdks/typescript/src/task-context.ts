// What a task handler gets and is: the TaskContext, the Handler type, and why a task's signal fired.
// Both the Worker and the code runner's handler (code-runner.ts) build on these, so they live below
// both.
import { inspect } from "node:util";

/** What made a task's `ctx.signal` fire (`ctx.cancelKind`). */
export type CancelKind = "run cancelled" | "lease lost" | "attempt deadline" | "worker shutdown" | "attempt failed";
/** A heartbeat answered that the run was cancelled. Nothing is reported. */
export const CANCEL_RUN_CANCELLED: CancelKind = "run cancelled";
/** The server said the lease is no longer this worker's. Nothing is reported. */
export const CANCEL_LEASE_LOST: CancelKind = "lease lost";
/** The attempt's deadline (the node's `timeout`) passed; the attempt is failed with TIMEOUT. */
export const CANCEL_ATTEMPT_DEADLINE: CancelKind = "attempt deadline";
/** The worker stopped before the task finished draining; failed with WORKER_SHUTDOWN (retryable). */
export const CANCEL_SHUTDOWN: CancelKind = "worker shutdown";
/** The attempt was already failed (an unhandled rejection inside the handler); stop the rest. */
export const CANCEL_ATTEMPT_FAILED: CancelKind = "attempt failed";

/**
 * The `reason` of an aborted `ctx.signal`. `kind` says what fired it; `reason` is the text of
 * `ctx.cancelReason`: for a cancelled run the reason given to CancelRun (or the server's own, e.g.
 * a run timeout), else the kind.
 */
export class TaskCancelledError extends Error {
  override name = "TaskCancelledError";
  readonly kind: CancelKind;
  readonly reason: string;
  constructor(kind: CancelKind, reason: string = kind) {
    super(reason === kind ? `task cancelled: ${kind}` : `task cancelled: ${kind}: ${reason}`);
    this.kind = kind;
    this.reason = reason;
  }
}

/** Where the worker logs; `console` fits. */
export interface Logger {
  debug(message: string, ...args: unknown[]): void;
  info(message: string, ...args: unknown[]): void;
  warn(message: string, ...args: unknown[]): void;
  error(message: string, ...args: unknown[]): void;
}

/**
 * The secret values the server handed with a task: those a CODE node declares (`secrets: [NAME]`),
 * for the code runner; empty for every other task. Printing it in any way (`util.inspect`,
 * `console.log`, `String()`, `JSON.stringify`) shows the names only, never a value.
 */
export class TaskSecrets {
  // A private field: util.inspect and JSON.stringify never see it.
  readonly #values: ReadonlyMap<string, string>;

  constructor(values: Readonly<Record<string, string>> = {}) {
    this.#values = new Map(Object.entries(values));
  }

  /** The names held, sorted. */
  get names(): string[] {
    return [...this.#values.keys()].sort();
  }

  get size(): number {
    return this.#values.size;
  }

  has(name: string): boolean {
    return this.#values.has(name);
  }

  /** The value of secret `name`, if the server handed one. */
  get(name: string): string | undefined {
    return this.#values.get(name);
  }

  toJSON(): { names: string[] } {
    return { names: this.names };
  }

  toString(): string {
    return `TaskSecrets(${this.names.join(", ")})`;
  }

  [inspect.custom](): string {
    return this.toString();
  }
}

/** What a handler gets: the task's identity, its input, a cancellation signal and a logger. */
export interface TaskContext {
  /** The task's id, the same for every attempt: the idempotency key of the step's side effects. */
  readonly taskId: string;
  /** This attempt, from 1. */
  readonly attempt: number;
  readonly runId: string;
  /** The node (or `<map id>[<index>]`) the task executes. */
  readonly nodeId: string;
  readonly workflowName: string;
  readonly workflowVersion: number;
  readonly namespace: string;
  readonly queue: string;
  readonly taskName: string;
  /** The node's rendered input, as JSON. */
  readonly input: any; // eslint-disable-line @typescript-eslint/no-explicit-any -- JSON of the workflow's making
  /**
   * The values of the secrets the task's CODE node declares, as the server handed them with this
   * attempt (empty for any other task). They show only their names when printed.
   */
  readonly secrets: TaskSecrets;
  /** The attempt must finish by this time (the node's `timeout`), if set. */
  readonly deadline: Date | undefined;
  /**
   * Aborted when the run is cancelled, the lease is lost, the attempt's deadline passes, or the
   * worker stops past its drain; `signal.reason` is a {@link TaskCancelledError} naming why. Pass it
   * to `fetch`, timers and anything else that takes a signal.
   */
  readonly signal: AbortSignal;
  /** What made the signal fire, once it did: `run cancelled`, `lease lost`, ... ({@link CancelKind}). */
  readonly cancelKind: CancelKind | undefined;
  /**
   * Why the signal fired, once it did: for a cancelled run the server's reason (the one given to
   * CancelRun, or the server's own such as a run timeout; `run cancelled` when it sent none), else
   * the kind (`lease lost`, `attempt deadline`, `worker shutdown`, `attempt failed`).
   */
  readonly cancelReason: string | undefined;
  /** A logger whose lines name the task. */
  readonly logger: Logger;
  /** Throws the signal's reason if it fired: a checkpoint for long loops. */
  throwIfCancelled(): void;
}

/** A task handler: takes the context, returns (or resolves to) a JSON output. */
export type Handler = (ctx: TaskContext) => unknown;
