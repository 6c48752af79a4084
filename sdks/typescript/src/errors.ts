// The SDK's errors: ComposerError for every failed call (with its google.rpc details decoded),
// RunFailedError for a run that ended badly, TaskError / NonRetryableError for handlers.
import { Code, ConnectError } from "@connectrpc/connect";
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";

import type { Run } from "./models.js";

/** The gRPC status codes, by their canonical names. */
export type StatusCode =
  | "OK"
  | "CANCELLED"
  | "UNKNOWN"
  | "INVALID_ARGUMENT"
  | "DEADLINE_EXCEEDED"
  | "NOT_FOUND"
  | "ALREADY_EXISTS"
  | "PERMISSION_DENIED"
  | "RESOURCE_EXHAUSTED"
  | "FAILED_PRECONDITION"
  | "ABORTED"
  | "OUT_OF_RANGE"
  | "UNIMPLEMENTED"
  | "INTERNAL"
  | "UNAVAILABLE"
  | "DATA_LOSS"
  | "UNAUTHENTICATED";

const CODE_NAMES: readonly StatusCode[] = [
  "OK",
  "CANCELLED",
  "UNKNOWN",
  "INVALID_ARGUMENT",
  "DEADLINE_EXCEEDED",
  "NOT_FOUND",
  "ALREADY_EXISTS",
  "PERMISSION_DENIED",
  "RESOURCE_EXHAUSTED",
  "FAILED_PRECONDITION",
  "ABORTED",
  "OUT_OF_RANGE",
  "UNIMPLEMENTED",
  "INTERNAL",
  "UNAVAILABLE",
  "DATA_LOSS",
  "UNAUTHENTICATED",
];

/** The ErrorInfo reason of a heartbeat or report made with a stale lease. */
export const LEASE_LOST = "LEASE_LOST";
/** The ErrorInfo reasons of a RESOURCE_EXHAUSTED that a busy server answers: try again later. */
const BUSY_REASONS: ReadonlySet<string> = new Set(["QUOTA_EXCEEDED", "CPU_POOL_BUSY"]);

/** One problem with one field of a request, from `google.rpc.BadRequest`. */
export interface FieldViolation {
  /** The path of the offending field, e.g. `nodes[3].retry.max_attempts`. */
  field: string;
  /** What is wrong with it. */
  description: string;
  /** A machine-readable reason, when the server gives one. */
  reason: string;
}

/** What a {@link ComposerError} is built from. */
export interface ComposerErrorInit {
  fieldViolations?: readonly FieldViolation[];
  reason?: string;
  domain?: string;
  metadata?: Record<string, string>;
  retryAfterMs?: number;
  cause?: unknown;
}

/**
 * A failed call to the Composer server. `code` is the gRPC status code's name, `rawMessage` the
 * server's message; `fieldViolations` (from `google.rpc.BadRequest`) and `reason`, `domain`,
 * `metadata` (from `google.rpc.ErrorInfo`) and `retryAfterMs` (from `google.rpc.RetryInfo`) come
 * from the `grpc-status-details-bin` trailer. The `message` shows all of it. Test the code with the
 * guards: {@link isNotFound}, {@link isLeaseLost}, {@link isServerBusy}...
 */
export class ComposerError extends Error {
  override name = "ComposerError";
  readonly code: StatusCode;
  readonly rawMessage: string;
  readonly fieldViolations: readonly FieldViolation[];
  readonly reason: string;
  readonly domain: string;
  readonly metadata: Readonly<Record<string, string>>;
  /** How long the server asks the caller to wait before trying again, when it says. */
  readonly retryAfterMs: number | undefined;

  constructor(code: StatusCode, message: string, init: ComposerErrorInit = {}) {
    const violations = init.fieldViolations ?? [];
    let text = `${code}: ${message}`;
    if (init.reason) text += ` [${init.reason}]`;
    for (const v of violations) text += `\n  - ${v.field ? `${v.field}: ${v.description}` : v.description}`;
    super(text, init.cause === undefined ? undefined : { cause: init.cause });
    this.code = code;
    this.rawMessage = message;
    this.fieldViolations = violations;
    this.reason = init.reason ?? "";
    this.domain = init.domain ?? "";
    this.metadata = init.metadata ?? {};
    this.retryAfterMs = init.retryAfterMs;
  }

  /** True for transient failures that the same call may retry (UNAVAILABLE, DEADLINE_EXCEEDED). */
  get retryable(): boolean {
    return this.code === "UNAVAILABLE" || this.code === "DEADLINE_EXCEEDED";
  }
}

function hasCode(error: unknown, code: StatusCode): error is ComposerError {
  return error instanceof ComposerError && error.code === code;
}

/** INVALID_ARGUMENT: a bad definition, input or request; `fieldViolations` lists each problem. */
export const isInvalidArgument = (e: unknown): e is ComposerError => hasCode(e, "INVALID_ARGUMENT");
/** NOT_FOUND: the workflow, version or run does not exist (in the caller's namespace). */
export const isNotFound = (e: unknown): e is ComposerError => hasCode(e, "NOT_FOUND");
/** ALREADY_EXISTS. */
export const isAlreadyExists = (e: unknown): e is ComposerError => hasCode(e, "ALREADY_EXISTS");
/** FAILED_PRECONDITION: the call does not fit the object's state (cancelling an ended run...). */
export const isFailedPrecondition = (e: unknown): e is ComposerError => hasCode(e, "FAILED_PRECONDITION");
/** FAILED_PRECONDITION with reason LEASE_LOST: the task's lease is no longer this worker's. */
export const isLeaseLost = (e: unknown): e is ComposerError => hasCode(e, "FAILED_PRECONDITION") && e.reason === LEASE_LOST;
/** RESOURCE_EXHAUSTED: a payload over the server's limit, or a quota used up. */
export const isResourceExhausted = (e: unknown): e is ComposerError => hasCode(e, "RESOURCE_EXHAUSTED");
/**
 * RESOURCE_EXHAUSTED with reason QUOTA_EXCEEDED or CPU_POOL_BUSY: the server is busy, the same call
 * may succeed after `retryAfterMs`. Any other RESOURCE_EXHAUSTED (a payload over the limit) is final.
 */
export const isServerBusy = (e: unknown): e is ComposerError => hasCode(e, "RESOURCE_EXHAUSTED") && BUSY_REASONS.has(e.reason);
/** PERMISSION_DENIED: the token's roles or queues do not allow the call. */
export const isPermissionDenied = (e: unknown): e is ComposerError => hasCode(e, "PERMISSION_DENIED");
/** UNAUTHENTICATED: no token, or an invalid one. */
export const isUnauthenticated = (e: unknown): e is ComposerError => hasCode(e, "UNAUTHENTICATED");
/** UNAVAILABLE: the server cannot be reached or is shutting down; transient. */
export const isUnavailable = (e: unknown): e is ComposerError => hasCode(e, "UNAVAILABLE");
/** DEADLINE_EXCEEDED: the call's deadline passed; transient. */
export const isDeadlineExceeded = (e: unknown): e is ComposerError => hasCode(e, "DEADLINE_EXCEEDED");
/** UNIMPLEMENTED: the server does not have this RPC. */
export const isUnimplemented = (e: unknown): e is ComposerError => hasCode(e, "UNIMPLEMENTED");
/** CANCELLED: the call was cancelled (by its AbortSignal). */
export const isCancelled = (e: unknown): e is ComposerError => hasCode(e, "CANCELLED");
/** INTERNAL. */
export const isInternal = (e: unknown): e is ComposerError => hasCode(e, "INTERNAL");

// --- decoding google.rpc details (wire format, no descriptors needed) ---------------------------

function readStrings(bytes: Uint8Array, fields: Record<number, (text: string) => void>, nested?: Record<number, (b: Uint8Array) => void>): void {
  const reader = new BinaryReader(bytes);
  while (reader.pos < reader.len) {
    const [no, type] = reader.tag();
    if (type === WireType.LengthDelimited && fields[no]) fields[no](reader.string());
    else if (type === WireType.LengthDelimited && nested?.[no]) nested[no](reader.bytes());
    else reader.skip(type);
  }
}

/** Decodes a serialized `google.rpc.BadRequest` into its field violations. */
export function decodeBadRequest(bytes: Uint8Array): FieldViolation[] {
  const out: FieldViolation[] = [];
  readStrings(bytes, {}, {
    1: (violation) => {
      const v: FieldViolation = { field: "", description: "", reason: "" };
      readStrings(violation, { 1: (s) => (v.field = s), 2: (s) => (v.description = s), 3: (s) => (v.reason = s) });
      out.push(v);
    },
  });
  return out;
}

/** Decodes a serialized `google.rpc.ErrorInfo`. */
export function decodeErrorInfo(bytes: Uint8Array): { reason: string; domain: string; metadata: Record<string, string> } {
  const info = { reason: "", domain: "", metadata: {} as Record<string, string> };
  readStrings(bytes, { 1: (s) => (info.reason = s), 2: (s) => (info.domain = s) }, {
    3: (entry) => {
      let key = "";
      let value = "";
      readStrings(entry, { 1: (s) => (key = s), 2: (s) => (value = s) });
      info.metadata[key] = value;
    },
  });
  return info;
}

/** Decodes a serialized `google.rpc.RetryInfo` into its `retry_delay` in ms; undefined when it has none. */
export function decodeRetryInfo(bytes: Uint8Array): number | undefined {
  let delayMs: number | undefined;
  readStrings(bytes, {}, {
    // retry_delay, a google.protobuf.Duration: seconds (1) and nanos (2), both varints.
    1: (duration) => {
      let seconds = 0;
      let nanos = 0;
      const reader = new BinaryReader(duration);
      while (reader.pos < reader.len) {
        const [no, type] = reader.tag();
        if (no === 1 && type === WireType.Varint) seconds = Number(reader.int64());
        else if (no === 2 && type === WireType.Varint) nanos = reader.int32();
        else reader.skip(type);
      }
      delayMs = seconds * 1000 + nanos / 1e6;
    },
  });
  return delayMs;
}

/**
 * The {@link ComposerError} for anything a call threw: a ConnectError (its code, message and
 * details), an AbortError (CANCELLED), or anything else (UNKNOWN). A ComposerError is returned as is.
 */
export function toComposerError(error: unknown): ComposerError {
  if (error instanceof ComposerError) return error;
  const connect = ConnectError.from(error);
  // gRPC maps an HTTP/2 REFUSED_STREAM (a stopping server refused it, unprocessed) to
  // UNAVAILABLE; connect-node reports INTERNAL, which would make it look permanent.
  const code = refusedStream(error) ? "UNAVAILABLE" : (CODE_NAMES[connect.code] ?? "UNKNOWN");
  const init: ComposerErrorInit = { cause: error };
  const violations: FieldViolation[] = [];
  for (const detail of connect.details) {
    if (!("type" in detail)) continue;
    try {
      if (detail.type === "google.rpc.BadRequest") violations.push(...decodeBadRequest(detail.value));
      else if (detail.type === "google.rpc.ErrorInfo") Object.assign(init, decodeErrorInfo(detail.value));
      else if (detail.type === "google.rpc.RetryInfo") init.retryAfterMs = decodeRetryInfo(detail.value);
    } catch {
      // A detail that does not decode is left out.
    }
  }
  if (violations.length > 0) init.fieldViolations = violations;
  return new ComposerError(code, connect.rawMessage, init);
}

/** Whether an error, or one of its causes, is an HTTP/2 stream the server refused. */
function refusedStream(error: unknown): boolean {
  for (let e = error, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth += 1) {
    if ((e as { code?: unknown }).code === "ERR_HTTP2_STREAM_ERROR" && e.message.includes("NGHTTP2_REFUSED_STREAM")) return true;
  }
  return false;
}

/** The numeric code of a status name (for tests and interop). */
export function statusNumber(code: StatusCode): Code {
  return CODE_NAMES.indexOf(code) as Code;
}

/** A run ended FAILED or CANCELLED while the caller waited for its output; `run` is the final run. */
export class RunFailedError extends Error {
  override name = "RunFailedError";
  readonly run: Run;
  /**
   * The run's error code: its `error.code` (a cancelled run's is `CANCELLED`, also from a server
   * that recorded no error for it); `UNKNOWN` when a failed run carries none.
   */
  readonly code: string;
  /** The run's error message: for a cancelled run the reason given to CancelRun (or the server's own). */
  readonly reason: string;

  constructor(run: Run) {
    const error = run.error;
    const cancelled = run.status === "CANCELLED";
    const code = error?.code || (cancelled ? "CANCELLED" : "UNKNOWN");
    const reason = error?.message || (cancelled ? "run cancelled" : "no error recorded");
    let why = `${code}: ${reason}`;
    if (error?.nodeId) why += ` (node ${error.nodeId})`;
    super(`run ${run.runId} ended ${run.status}: ${why}`);
    this.run = run;
    this.code = code;
    this.reason = reason;
  }
}

/** Waiting for a run (`waitForRun`, `waitForResult`) or a bulk operation (`waitBulkOperation`) took longer than its `timeoutMs`. */
export class TimeoutError extends Error {
  override name = "TimeoutError";
}

/** Options of {@link TaskError}. */
export interface TaskErrorOptions {
  /** A short machine-readable code (default `TASK_ERROR`), matched against `retry.non_retryable`. */
  code?: string;
  /** False makes the failure final at once (default true: the node's retry policy decides). */
  retryable?: boolean;
  /** Structured details (JSON), readable as the node's `error.details`. */
  details?: unknown;
  cause?: unknown;
}

/**
 * Thrown by a handler to fail its task with a chosen `code`, `retryable` flag and `details`.
 * `code` is matched against the node's `retry.non_retryable` list and readable by error edges.
 */
export class TaskError extends Error {
  override name = "TaskError";
  readonly code: string;
  readonly retryable: boolean;
  readonly details: unknown;

  constructor(message: string, options: TaskErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = options.code ?? "TASK_ERROR";
    this.retryable = options.retryable ?? true;
    this.details = options.details;
  }
}

/** Thrown by a handler to fail its node at once, whatever the retry policy says (default code `NON_RETRYABLE`). */
export class NonRetryableError extends TaskError {
  override name = "NonRetryableError";

  constructor(message: string, options: Omit<TaskErrorOptions, "retryable"> = {}) {
    super(message, { ...options, code: options.code ?? "NON_RETRYABLE", retryable: false });
  }
}
