// What a task handler gets and is: the TaskContext, the Handler type, and why a task's signal fired.
// Both the Worker and the code runner's handler (code-runner.ts) build on these, so they live below
// both.

/** Why a task's `ctx.signal` fired. */
export type CancelReason = "run cancelled" | "lease lost" | "attempt deadline" | "worker shutdown" | "attempt failed";
/** A heartbeat answered that the run was cancelled. Nothing is reported. */
export const CANCEL_RUN_CANCELLED: CancelReason = "run cancelled";
/** The server said the lease is no longer this worker's. Nothing is reported. */
export const CANCEL_LEASE_LOST: CancelReason = "lease lost";
/** The attempt's deadline (the node's `timeout`) passed; the attempt is failed with TIMEOUT. */
export const CANCEL_ATTEMPT_DEADLINE: CancelReason = "attempt deadline";
/** The worker stopped before the task finished draining; failed with WORKER_SHUTDOWN (retryable). */
export const CANCEL_SHUTDOWN: CancelReason = "worker shutdown";
/** The attempt was already failed (an unhandled rejection inside the handler); stop the rest. */
export const CANCEL_ATTEMPT_FAILED: CancelReason = "attempt failed";

/** The `reason` of an aborted `ctx.signal`. */
export class TaskCancelledError extends Error {
  override name = "TaskCancelledError";
  readonly reason: CancelReason;
  constructor(reason: CancelReason) {
    super(`task cancelled: ${reason}`);
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
  /** The attempt must finish by this time (the node's `timeout`), if set. */
  readonly deadline: Date | undefined;
  /**
   * Aborted when the run is cancelled, the lease is lost, the attempt's deadline passes, or the
   * worker stops past its drain; `signal.reason` is a {@link TaskCancelledError} naming why. Pass it
   * to `fetch`, timers and anything else that takes a signal.
   */
  readonly signal: AbortSignal;
  /** Why the signal fired, once it did. */
  readonly cancelReason: CancelReason | undefined;
  /** A logger whose lines name the task. */
  readonly logger: Logger;
  /** Throws the signal's reason if it fired: a checkpoint for long loops. */
  throwIfCancelled(): void;
}

/** A task handler: takes the context, returns (or resolves to) a JSON output. */
export type Handler = (ctx: TaskContext) => unknown;
