// The Client: one implementation over any connect Transport (gRPC in Node, grpc-web in browsers).
import { create, fromJson, type JsonValue } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromDate, type Value } from "@bufbuild/protobuf/wkt";
import { createClient, type CallOptions, type Client as ConnectClient, type Transport } from "@connectrpc/connect";

import { Backoff } from "./backoff.js";
import { ComposerError, RunFailedError, TimeoutError, toComposerError } from "./errors.js";
import { BlobService } from "./gen/composer/v1/blob_service_pb.js";
import { QueueService } from "./gen/composer/v1/queue_service_pb.js";
import { RunService, SendEventRequestSchema } from "./gen/composer/v1/run_service_pb.js";
import { ScheduleService } from "./gen/composer/v1/schedule_service_pb.js";
import { SecretService } from "./gen/composer/v1/secret_service_pb.js";
import { ServerService } from "./gen/composer/v1/server_service_pb.js";
import { WorkerService } from "./gen/composer/v1/worker_service_pb.js";
import {
  CheckScope as WireCheckScope,
  RecordedRunSchema,
  ReplayRunRequestSchema,
  WorkflowService,
  type RecordedRun as WireRecordedRun,
} from "./gen/composer/v1/workflow_service_pb.js";
import {
  addCheckPage,
  bulkOperationFromWire,
  deliveryFromWire,
  fireFromWire,
  historyFromWire,
  isBulkOperationDone,
  isFinalStatus,
  overlapPolicyToWire,
  problemFromWire,
  queueRateLimitFromWire,
  runCountsFromWire,
  runFilterToWire,
  runFromWire,
  runReplayFromWire,
  runStatusToWire,
  scheduleFromWire,
  secretFromWire,
  serverInfoFromWire,
  workflowFromWire,
  workflowSummaryFromWire,
  type BlobRef,
  type BulkOperation,
  type CheckScope,
  type EventDelivery,
  type HistoryEvent,
  type OverlapPolicy,
  type QueueRateLimit,
  type Run,
  type RunCounts,
  type RunFilter,
  type RunReplay,
  type RunStatus,
  type Schedule,
  type ScheduleFire,
  type Secret,
  type ServerInfo,
  type ValidationProblem,
  type WorkflowSummary,
  type WorkflowVersion,
  type WorkflowVersionCheck,
} from "./models.js";
import {
  blobReference,
  bytesOverLimit,
  downloadBytes,
  downloadThroughUrl,
  resolveBlobReferences,
  uploadBytes,
  uploadThroughUrl,
} from "./payloads.js";
import { toJsonValue, toValue, valueOfJson, type Json } from "./values.js";

/** The protocol major version this SDK speaks (GetServerInfo's `protocol_version`). */
export const PROTOCOL_MAJOR = 1;
/** The lowest protocol minor version this SDK needs. */
export const PROTOCOL_MINOR = 0;

/** Options every Client takes. */
export interface BaseClientOptions {
  /** A bearer JWT sent with every call (`composer token`, or the admin token `composer dev` prints). */
  token?: string | undefined;
  /** The deadline of each unary call in ms (default 30 s). */
  timeoutMs?: number;
}

/** Options of the transport-agnostic client. */
export interface ClientOptions extends BaseClientOptions {
  /** The connect transport: `createGrpcTransport` (Node) or `createGrpcWebTransport` (browser). */
  transport: Transport;
  /**
   * Headers naming the caller's trace (W3C `traceparent`, `tracestate`), sent with StartRun and
   * SendEvent; the Node Client gives the active OpenTelemetry span's.
   */
  traceHeaders?: () => Promise<Record<string, string>>;
  /**
   * Whether the transport can stream a request (default true; gRPC can, grpc-web in a browser
   * cannot). Without it {@link ComposerClient.uploadBlob} fails with UNIMPLEMENTED and startRun /
   * sendEvent send a large input or payload inline, for the server to offload.
   */
  clientStreaming?: boolean;
  /**
   * Whether blobs may move through the presigned URLs of a server whose GetServerInfo says
   * `blobUrls` (default true; the browser Client: false, see web.ts). Then uploadBlob is
   * StartBlobUpload, one HTTP PUT and FinishBlobUpload, and downloadBlob GetBlobUrl and one HTTP
   * GET, both with the global `fetch`.
   */
  blobUrls?: boolean;
}

/** A workflow definition: YAML or JSON text, or an object sent as JSON. */
export type WorkflowSource = string | Record<string, unknown>;

/** Options of {@link ComposerClient.startRun}. */
export interface StartRunOptions {
  /** The version to run; 0 or absent: the latest. */
  version?: number;
  /** A repeated start with the same key returns the same run (`created` false) and starts nothing. */
  idempotencyKey?: string;
  /** Labels, for filtering in listRuns. */
  labels?: Record<string, string>;
  /**
   * Dispatch priority, 1 (lowest) to 5 (highest); 0 or absent: the default, 3. A waiting task of a
   * higher-priority run is handed to workers first; outside 0-5 INVALID_ARGUMENT naming `priority`.
   */
  priority?: number;
  signal?: AbortSignal;
}

/** The definition of {@link ComposerClient.createSchedule} and {@link ComposerClient.updateSchedule}. */
export interface ScheduleOptions {
  /** A cron expression (5 fields, or 6 with seconds first); give exactly one of `cron` and `intervalMs`. */
  cron?: string;
  /** The IANA time zone `cron` is read in (default UTC). */
  timeZone?: string;
  /** A fixed interval in ms: whole seconds, 1 s to 366 days. */
  intervalMs?: number;
  /** The workflow version a fire starts; 0 or absent: the latest at each fire. */
  version?: number;
  /** The runs' labels (a run also carries `composer.schedule` and `composer.fire_time`). */
  labels?: Record<string, string>;
  /** What a fire does while the previous run still runs (default SKIP). */
  overlapPolicy?: OverlapPolicy;
  /** How late a missed fire may start, in ms: 1 s to 7 days (default 60 s). */
  catchUpWindowMs?: number;
  /** The most a fire's start is delayed, in ms (default none). */
  jitterMs?: number;
  signal?: AbortSignal;
}

/** Options of {@link ComposerClient.createSchedule}. */
export interface CreateScheduleOptions extends ScheduleOptions {
  /** Create it paused. */
  paused?: boolean;
  /** A note (why it is paused). */
  note?: string;
}

function scheduleParts(scheduleId: string, workflow: string, input: unknown, options: ScheduleOptions) {
  return {
    scheduleId,
    spec: {
      cron: options.cron ?? "",
      timeZone: options.timeZone ?? "",
      ...(options.intervalMs === undefined ? {} : { interval: durationFromMs(options.intervalMs) }),
    },
    action: {
      workflowName: workflow,
      version: options.version ?? 0,
      labels: { ...options.labels },
      ...(input === undefined ? {} : { input: toValue(input) }),
    },
    overlapPolicy: overlapPolicyToWire(options.overlapPolicy ?? "SKIP"),
    ...(options.catchUpWindowMs === undefined ? {} : { catchUpWindow: durationFromMs(options.catchUpWindowMs) }),
    ...(options.jitterMs === undefined ? {} : { jitter: durationFromMs(options.jitterMs) }),
  };
}

function bulkParts(filter: RunFilter, options: BulkRunsOptions) {
  return { filter: runFilterToWire(filter), all: options.all ?? false, requestId: options.requestId ?? "" };
}

/** A secret's value for {@link ComposerClient.setSecret}: bytes as they are, or text, sent as UTF-8. */
export type SecretValue = string | Uint8Array;

/** The bytes of a secret's value; a TypeError names the type or a position, never the value. */
function secretBytes(value: SecretValue): Uint8Array {
  if (value instanceof Uint8Array) return value;
  if (typeof value === "string") {
    // TextEncoder would turn a lone surrogate into U+FFFD: a different secret, set silently.
    const lone = /[\uD800-\uDFFF]/u.exec(value);
    if (lone) throw new TypeError(`a secret's value is not UTF-8 text: the character at index ${lone.index} cannot be encoded`);
    return new TextEncoder().encode(value);
  }
  const kind = value === null ? "null" : typeof value === "object" ? ((value as object).constructor?.name ?? "object") : typeof value;
  throw new TypeError(`a secret's value is a string or a Uint8Array, not ${kind}`);
}

/** The limit of {@link ComposerClient.setQueueRateLimit} (docs/rate-limits.md); set at least one rate. */
export interface QueueRateLimitOptions {
  /** Tasks per second over the whole queue, fractions allowed (0.5: one every two seconds); 0 or absent: none. */
  perSecond?: number;
  /** The most tasks in any one-second window; 0 or absent: `perSecond` rounded up. */
  burst?: number;
  /** Tasks per second for each distinct rate-limit key; 0 or absent: none. */
  perKeyPerSecond?: number;
  /** The most tasks of one key in any one-second window; 0 or absent: `perKeyPerSecond` rounded up. */
  perKeyBurst?: number;
  signal?: AbortSignal;
}

/** Filters of {@link ComposerClient.listRuns}. */
export interface ListRunsOptions {
  workflow?: string;
  /** Only runs of this version of `workflow` (which it requires); 0 or absent: any version. */
  workflowVersion?: number;
  statuses?: readonly RunStatus[];
  labels?: Record<string, string>;
  createdAfter?: Date;
  createdBefore?: Date;
  parentRunId?: string;
  /** Only the run whose id this is, and runs whose idempotency key starts with it. */
  search?: string;
  /** Runs fetched per call (default 100). */
  pageSize?: number;
  signal?: AbortSignal;
}

/** Filters of {@link ComposerClient.countRuns}: those of listRuns but statuses (it counts per status). */
export interface CountRunsOptions extends Omit<RunFilter, "statuses"> {
  signal?: AbortSignal;
}

/** Options of {@link ComposerClient.listWorkflows}. */
export interface ListWorkflowsOptions {
  /** Only workflows whose name starts with this. */
  namePrefix?: string;
  /** Workflows fetched per call (default 100). */
  pageSize?: number;
  signal?: AbortSignal;
}

/** Where {@link ComposerClient.sendEvent} sends an event: exactly one of `runId` and `correlationKey`. */
export type SendEventOptions = ({ runId: string; correlationKey?: undefined } | { correlationKey: string; runId?: undefined }) & {
  /** A repeated call with the same id delivers nothing new. */
  requestId?: string;
  signal?: AbortSignal;
};

/** Options of {@link ComposerClient.bulkRetryRuns} and {@link ComposerClient.bulkResumeRuns}. */
export interface BulkRunsOptions {
  /** Act on every run of the namespace when the filter is empty (else FAILED_PRECONDITION). */
  all?: boolean;
  /** A repeated call with the same id returns the operation the first created (`created` false). */
  requestId?: string;
  signal?: AbortSignal;
}

/** Options of {@link ComposerClient.bulkCancelRuns} and {@link ComposerClient.bulkPauseRuns}. */
export interface BulkRunsWithReasonOptions extends BulkRunsOptions {
  /** Why, recorded in each run's history (and for a cancel, in its error). */
  reason?: string;
}

/** Options of {@link ComposerClient.migrateRuns}. */
export interface MigrateRunsOptions {
  /** Node ids renamed in the target version: recorded id to new id (at most 1,000). */
  nodeMapping?: Record<string, string>;
  /** A repeated call with the same id returns the operation the first created (`created` false). */
  requestId?: string;
  signal?: AbortSignal;
}

/**
 * The new definition runs are replayed against (docs/versions.md): its text (`source`, YAML or JSON,
 * or an object sent as JSON) or a registered `version` of the run's workflow, exactly one.
 */
export type ReplayDefinition = ({ source: WorkflowSource; version?: undefined } | { version: number; source?: undefined }) & {
  /** Node ids renamed in the new definition: recorded id to new id (at most 1,000). */
  nodeMapping?: Record<string, string>;
  signal?: AbortSignal;
};

/**
 * A run as recorded, what `composer run history RUN_ID -o json` writes (an object with `run`,
 * `workflow` and `events`, in the proto's JSON names; other keys are ignored): the parsed JSON or
 * its text.
 */
export type RecordedRunJson = string | Record<string, unknown>;

/**
 * Options of {@link ComposerClient.replayRun}: the run, exactly one of `runId` (read from the
 * server) and `history` (given whole; the server reads nothing of the run), and the new definition.
 */
export type ReplayRunOptions = ({ runId: string; history?: undefined } | { history: RecordedRunJson; runId?: undefined }) & ReplayDefinition;

/** Options of {@link ComposerClient.checkWorkflowVersion}: the new definition and which runs. */
export type CheckWorkflowVersionOptions = ReplayDefinition & {
  /** The runs in flight (default: RUNNING, COMPENSATING, PAUSED) or the completed ones, newest first. */
  scope?: CheckScope;
  /** COMPLETED only: replay at most this many runs, the newest (default: every one). */
  limit?: number;
  /** Runs the server replays per call (default 200; it caps it at 500). */
  pageSize?: number;
};

/** Options of {@link ComposerClient.waitBulkOperation}. */
export interface WaitBulkOperationOptions extends WaitOptions {
  /** The longest pause between two polls in ms (default 1 s; the first polls come sooner). */
  maxPollIntervalMs?: number;
}

/** Options of waiting for a run. */
export interface WaitOptions {
  /** Give up after this many ms with a {@link TimeoutError}. */
  timeoutMs?: number;
  /** Give up when this signal aborts (with its reason). */
  signal?: AbortSignal;
}

function text(source: WorkflowSource): string {
  if (typeof source === "string") return source;
  if (source !== null && typeof source === "object") return JSON.stringify(source);
  throw new TypeError("a workflow is YAML or JSON text, or an object");
}

/** Runs one CheckWorkflowVersion call replays unless told otherwise (the server's default). */
const CHECK_PAGE_SIZE = 200;

function isPositiveInteger(n: unknown): n is number {
  return typeof n === "number" && Number.isInteger(n) && n > 0;
}

/** The wire `node_mapping` of `mapping`, checked: an object of node id to node id. */
function nodeMappingOf(call: string, mapping: Record<string, string> | undefined): Record<string, string> {
  if (mapping === undefined) return {};
  if (mapping === null || typeof mapping !== "object" || Array.isArray(mapping)) {
    throw new TypeError(`${call}: nodeMapping is an object of recorded node id to new node id`);
  }
  for (const [from, to] of Object.entries(mapping)) {
    if (from === "" || typeof to !== "string" || to === "") {
      throw new TypeError(`${call}: nodeMapping maps ${JSON.stringify(from)} to ${JSON.stringify(to)}; both must be node ids`);
    }
  }
  return { ...mapping };
}

/** The wire `source`, `version` and `node_mapping` of a replay's new definition, checked. */
function definitionParts(call: string, definition: ReplayDefinition): { source: string; version: number; nodeMapping: Record<string, string> } {
  const hasSource = definition.source !== undefined;
  const hasVersion = definition.version !== undefined;
  if (hasSource === hasVersion) throw new TypeError(`${call} needs exactly one of source and version`);
  if (hasVersion && !isPositiveInteger(definition.version)) {
    throw new TypeError(`${call}: version must be a registered version (a positive integer), not ${String(definition.version)}`);
  }
  const source = hasSource ? text(definition.source as WorkflowSource) : "";
  if (hasSource && source.trim() === "") throw new TypeError(`${call}: source is empty`);
  return { source, version: definition.version ?? 0, nodeMapping: nodeMappingOf(call, definition.nodeMapping) };
}

/**
 * The RecordedRun of what `composer run history RUN_ID -o json` wrote. Keys beside `run`, `workflow`
 * and `events` are ignored, but a history cut short (a `next_page_token` left) is refused: its
 * replay would judge a run that did less than the real one.
 */
function recordedRunOf(history: RecordedRunJson): WireRecordedRun {
  const bad = (what: string): TypeError =>
    new TypeError(`replayRun: the history ${what} (write it with \`composer run history RUN_ID -o json\`)`);
  let json: unknown = history;
  if (typeof history === "string") {
    try {
      json = JSON.parse(history);
    } catch (error) {
      throw bad(`is not JSON: ${(error as Error).message}`);
    }
  }
  if (json === null || typeof json !== "object" || Array.isArray(json)) throw bad("is not a JSON object");
  const record = json as Record<string, unknown>;
  for (const part of ["run", "workflow", "events"]) if (record[part] === undefined) throw bad(`has no "${part}"`);
  if (!Array.isArray(record["events"])) throw bad(`"events" is not a list`);
  const token = record["next_page_token"] ?? record["nextPageToken"];
  if (typeof token === "string" && token !== "") throw bad("is cut short (next_page_token is set): write it with a --limit above its length");
  try {
    return fromJson(RecordedRunSchema, record as JsonValue, { ignoreUnknownFields: true });
  } catch (error) {
    throw bad(`does not read as a recorded run: ${(error as Error).message}`);
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(done, ms);
    function done(): void {
      signal?.removeEventListener("abort", abort);
      resolve();
    }
    function abort(): void {
      clearTimeout(timer);
      reject(signal?.reason);
    }
    signal?.addEventListener("abort", abort, { once: true });
  });
}

/**
 * Checks a server's `protocol_version` (GetServerInfo) against what this SDK speaks. The version is
 * split on "."; the first part (major) and the second (minor, "0" when absent) must be ASCII
 * digits, the major must equal {@link PROTOCOL_MAJOR} and the minor be at least
 * {@link PROTOCOL_MINOR}; parts after the second are ignored ("1", "1.0", "1.7", "1.2.3" pass; "",
 * "2.0", "0.9", "1.x", "v1.0" fail). Otherwise it throws a ComposerError FAILED_PRECONDITION
 * `<where> speaks protocol "<version>"; this SDK needs 1.x with x >= 0`.
 */
export function checkProtocolVersion(version: string, where = "the server"): void {
  const [major, minor = "0"] = version.split(".");
  const ok = /^\d+$/.test(major ?? "") && /^\d+$/.test(minor) && Number(major) === PROTOCOL_MAJOR && Number(minor) >= PROTOCOL_MINOR;
  if (!ok) {
    throw new ComposerError(
      "FAILED_PRECONDITION",
      `${where} speaks protocol ${JSON.stringify(version)}; this SDK needs ${PROTOCOL_MAJOR}.x with x >= ${PROTOCOL_MINOR}`,
    );
  }
}

/**
 * A client of a Composer server over any connect transport. The Node entry point's `Client` and
 * the `/web` entry point's `Client` are this class with their transport made for them.
 */
export class ComposerClient {
  /** The raw connect clients of the services (the wire layer), for what the SDK does not wrap. */
  readonly raw: {
    workflows: ConnectClient<typeof WorkflowService>;
    runs: ConnectClient<typeof RunService>;
    schedules: ConnectClient<typeof ScheduleService>;
    queues: ConnectClient<typeof QueueService>;
    secrets: ConnectClient<typeof SecretService>;
    workers: ConnectClient<typeof WorkerService>;
    server: ConnectClient<typeof ServerService>;
    blobs: ConnectClient<typeof BlobService>;
  };
  readonly transport: Transport;
  readonly #headers: Record<string, string>;
  readonly #timeoutMs: number;
  readonly #traceHeaders: () => Promise<Record<string, string>>;
  readonly #clientStreaming: boolean;
  /** The server's info, fetched once (GetServerInfo) for its offload threshold and `blobUrls`. */
  #serverInfo: Promise<ServerInfo> | undefined;
  /**
   * Whether blobs may go through presigned URLs: the `blobUrls` option, turned off for good when a
   * URL call is answered FAILED_PRECONDITION (the server stopped giving them) or UNIMPLEMENTED.
   */
  #blobUrls: boolean;

  constructor(options: ClientOptions) {
    this.transport = options.transport;
    this.#traceHeaders = options.traceHeaders ?? (() => Promise.resolve({}));
    this.#headers = options.token ? { authorization: `Bearer ${options.token}` } : {};
    this.#timeoutMs = options.timeoutMs ?? 30_000;
    this.#clientStreaming = options.clientStreaming ?? true;
    this.#blobUrls = options.blobUrls ?? true;
    this.raw = {
      workflows: createClient(WorkflowService, this.transport),
      runs: createClient(RunService, this.transport),
      schedules: createClient(ScheduleService, this.transport),
      queues: createClient(QueueService, this.transport),
      secrets: createClient(SecretService, this.transport),
      workers: createClient(WorkerService, this.transport),
      server: createClient(ServerService, this.transport),
      blobs: createClient(BlobService, this.transport),
    };
  }

  /** Closes the connection where the transport has one (the Node client); a no-op otherwise. */
  close(): void {}

  /** The call options of every call: the token header and the deadline. */
  callOptions(extra: CallOptions = {}): CallOptions {
    return { timeoutMs: this.#timeoutMs, ...extra, headers: { ...this.#headers, ...(extra.headers as Record<string, string> | undefined) } };
  }

  async #call<T>(call: (options: CallOptions) => Promise<T>, signal?: AbortSignal, headers?: Record<string, string>): Promise<T> {
    try {
      return await call(this.callOptions({ ...(signal ? { signal } : {}), ...(headers ? { headers } : {}) }));
    } catch (error) {
      throw toComposerError(error);
    }
  }

  // --- server ----------------------------------------------------------------------------------

  /**
   * The server's version, protocol version, features and payload limits. The client keeps the
   * answer for its offload threshold (startRun and sendEvent ask once, if nothing asked before).
   */
  async serverInfo(options: { signal?: AbortSignal } = {}): Promise<ServerInfo> {
    const info = serverInfoFromWire(await this.#call((o) => this.raw.server.getServerInfo({}, o), options.signal));
    this.#serverInfo = Promise.resolve(info);
    return info;
  }

  /** The server's info, asked once per client (a failed ask is asked again next time). */
  #info(signal?: AbortSignal): Promise<ServerInfo> {
    if (!this.#serverInfo) {
      const asked = this.serverInfo(signal ? { signal } : {});
      this.#serverInfo = asked;
      asked.catch(() => {
        if (this.#serverInfo === asked) this.#serverInfo = undefined;
      });
    }
    return this.#serverInfo;
  }

  /** The server's `payloadOffloadBytes`, asked once per client. */
  async #offloadBytes(signal?: AbortSignal): Promise<number> {
    return (await this.#info(signal)).payloadOffloadBytes;
  }

  /**
   * Whether a blob moves through a presigned URL: this client may, no URL call was refused, and
   * the server says `blobUrls`. A GetServerInfo that fails leaves the call on the stream (whose
   * own error, if the server is down, is the one to report).
   */
  async #viaUrls(signal: AbortSignal | undefined): Promise<boolean> {
    if (!this.#blobUrls) return false;
    try {
      return (await this.#info(signal)).blobUrls && this.#blobUrls;
    } catch {
      return false;
    }
  }

  /**
   * The wire value of an input or payload: its reference, uploaded first, when its compact JSON is
   * longer than the server's offload threshold; else the value itself. A client that cannot stream
   * a request (the browser's) sends it inline: the server offloads it, if the request fits.
   */
  async #payload(value: unknown, signal: AbortSignal | undefined): Promise<Value> {
    const json = toJsonValue(value);
    // A number, a boolean or null is never long enough to offload.
    if (!this.#clientStreaming || json === null || typeof json === "number" || typeof json === "boolean") return valueOfJson(json);
    const limit = await this.#offloadBytes(signal);
    const bytes = limit > 0 ? bytesOverLimit(JSON.stringify(json), limit) : undefined;
    if (!bytes) return valueOfJson(json);
    const ref = await this.uploadBlob(bytes, signal ? { signal } : {});
    return valueOfJson(blobReference(ref) as unknown as Json);
  }

  // --- blobs -----------------------------------------------------------------------------------

  /**
   * Stores `data`, the UTF-8 bytes of one JSON value, in the blob store of the caller's namespace
   * (BlobService, streamed in chunks of 1 MiB) and returns the blob's reference; the same bytes
   * again return the same reference. Put `{"$blob": ref}` in a value in their stead
   * (`blobReference(ref)`). When the server gives presigned URLs (GetServerInfo's `blobUrls`) the
   * bytes go straight to its store: StartBlobUpload, one HTTP PUT, FinishBlobUpload (C24; a PUT
   * that fails falls back to the stream for this call, a FAILED_PRECONDITION to the streams for
   * good). INVALID_ARGUMENT naming `data` when the bytes are not JSON; RESOURCE_EXHAUSTED above
   * the server's `maxPayloadBytes`. Over grpc-web (the browser Client), which cannot stream a
   * request, it throws UNIMPLEMENTED. The call has no deadline: pass a signal.
   */
  async uploadBlob(data: Uint8Array, options: { signal?: AbortSignal } = {}): Promise<BlobRef> {
    if (!this.#clientStreaming) {
      throw new ComposerError(
        "UNIMPLEMENTED",
        "uploadBlob streams its request, which grpc-web in a browser cannot do: send the value inline (the server offloads it) or upload from Node",
      );
    }
    const stream = this.#streamOptions(options.signal);
    if (await this.#viaUrls(options.signal)) {
      const signal = options.signal ? { signal: options.signal } : {};
      const uploaded = await uploadThroughUrl(this.raw.blobs, data, this.callOptions(signal), stream);
      if (typeof uploaded !== "string") return uploaded;
      if (uploaded === "refused") this.#blobUrls = false;
    }
    return uploadBytes(this.raw.blobs, data, stream);
  }

  /**
   * The bytes of the blob `sha256` of the caller's namespace (BlobService, streamed; a stream
   * broken by a transient error is taken up again where it stopped), checked against its size and
   * digest. When the server gives presigned URLs (GetServerInfo's `blobUrls`) they come straight
   * from its store: GetBlobUrl, one HTTP GET (C24; a GET that fails falls back to the stream for
   * this call, a FAILED_PRECONDITION to the streams for good). NOT_FOUND when the namespace has no
   * such blob. No deadline: pass a signal.
   */
  async downloadBlob(sha256: string, options: { signal?: AbortSignal } = {}): Promise<Uint8Array> {
    if (await this.#viaUrls(options.signal)) {
      const signal = options.signal ? { signal: options.signal } : {};
      const downloaded = await downloadThroughUrl(this.raw.blobs, sha256, this.callOptions(signal));
      if (typeof downloaded !== "string") return downloaded;
      if (downloaded === "refused") this.#blobUrls = false;
    }
    return downloadBytes(this.raw.blobs, sha256, this.#streamOptions(options.signal));
  }

  /**
   * A copy of `value` with every reference (an object whose only key is `$blob`), at any depth,
   * replaced by the value of the blob it names: what getRun, the history or a run's output show
   * of an offloaded value. Each distinct blob is downloaded once.
   */
  async resolvePayload(value: unknown, options: { signal?: AbortSignal } = {}): Promise<Json> {
    return resolveBlobReferences(toJsonValue(value), (sha256) => this.downloadBlob(sha256, options));
  }

  /** The options of a blob stream: the token, no deadline (a blob's size has no bound here). */
  #streamOptions(signal: AbortSignal | undefined): CallOptions {
    return { headers: { ...this.#headers }, ...(signal ? { signal } : {}) };
  }

  /**
   * Calls GetServerInfo and checks its `protocol_version` with {@link checkProtocolVersion}: returns
   * the ServerInfo, throws FAILED_PRECONDITION when this SDK cannot speak it (and the call's own
   * error, e.g. UNAVAILABLE or UNAUTHENTICATED, when the call fails). Features are not checked.
   */
  async checkProtocol(options: { signal?: AbortSignal } = {}): Promise<ServerInfo> {
    const info = await this.serverInfo(options);
    checkProtocolVersion(info.protocolVersion);
    return info;
  }

  // --- workflows -------------------------------------------------------------------------------

  /**
   * Registers a definition and returns its version. Identical content to the newest version returns
   * that version with `created` false. An invalid one throws INVALID_ARGUMENT with `fieldViolations`.
   */
  async registerWorkflow(source: WorkflowSource, options: { signal?: AbortSignal } = {}): Promise<WorkflowVersion> {
    const r = await this.#call((o) => this.raw.workflows.registerWorkflow({ source: text(source) }, o), options.signal);
    return workflowFromWire(r.workflow, r.created);
  }

  /** Checks a definition as registration would, stores nothing; returns every problem (empty: valid). */
  async validateWorkflow(source: WorkflowSource, options: { signal?: AbortSignal } = {}): Promise<ValidationProblem[]> {
    const r = await this.#call((o) => this.raw.workflows.validateWorkflow({ source: text(source) }, o), options.signal);
    return r.problems.map(problemFromWire);
  }

  /** One version of a workflow (the latest when `version` is 0); NOT_FOUND if absent. */
  async getWorkflow(name: string, version = 0, options: { signal?: AbortSignal } = {}): Promise<WorkflowVersion> {
    const r = await this.#call((o) => this.raw.workflows.getWorkflow({ name, version }, o), options.signal);
    return workflowFromWire(r.workflow);
  }

  /** The namespace's workflows by name, each with its latest version, fetched a page at a time as the loop goes. */
  async *listWorkflows(options: ListWorkflowsOptions = {}): AsyncGenerator<WorkflowSummary, void, undefined> {
    let pageToken = "";
    for (;;) {
      const request = { pageSize: options.pageSize ?? 100, pageToken, namePrefix: options.namePrefix ?? "" };
      const r = await this.#call((o) => this.raw.workflows.listWorkflows(request, o), options.signal);
      for (const workflow of r.workflows) yield workflowSummaryFromWire(workflow);
      if (!r.nextPageToken) return;
      pageToken = r.nextPageToken;
    }
  }

  /**
   * The versions of workflow `name`, newest first, fetched a page at a time as the loop goes.
   * Their `source` is empty and `definition` null: {@link getWorkflow} returns them.
   */
  async *listWorkflowVersions(name: string, options: { pageSize?: number; signal?: AbortSignal } = {}): AsyncGenerator<WorkflowVersion, void, undefined> {
    let pageToken = "";
    for (;;) {
      const request = { name, pageSize: options.pageSize ?? 100, pageToken };
      const r = await this.#call((o) => this.raw.workflows.listWorkflowVersions(request, o), options.signal);
      for (const version of r.versions) yield workflowFromWire(version);
      if (!r.nextPageToken) return;
      pageToken = r.nextPageToken;
    }
  }

  /**
   * Replays one run's recorded history against a new definition and says whether that definition
   * could continue the run (docs/versions.md): IDENTICAL, COMPATIBLE with its `differences`,
   * INCOMPATIBLE with the first `divergence`, or UNREPLAYABLE (the history is not what the run's own
   * definition decides) with the reason. The run is named (`runId`) or given whole (`history`, what
   * `composer run history RUN_ID -o json` writes, parsed or as text); the definition is `source` or
   * a registered `version` of the run's workflow, with `nodeMapping` for renamed nodes. Nothing is
   * stored. Arguments that do not name exactly one run and one definition throw a TypeError before
   * any call; an invalid `source` is INVALID_ARGUMENT with `fieldViolations`, as registerWorkflow;
   * an unknown run or version NOT_FOUND.
   */
  async replayRun(options: ReplayRunOptions): Promise<RunReplay> {
    const hasRun = options.runId !== undefined;
    const hasHistory = options.history !== undefined;
    if (hasRun === hasHistory) throw new TypeError("replayRun needs exactly one of runId and history");
    if (hasRun && (typeof options.runId !== "string" || options.runId === "")) throw new TypeError("replayRun: runId is empty");
    const definition = definitionParts("replayRun", options);
    const recorded = hasRun
      ? { case: "runId" as const, value: options.runId as string }
      : { case: "history" as const, value: recordedRunOf(options.history as RecordedRunJson) };
    const request = create(ReplayRunRequestSchema, { recorded, ...definition });
    const r = await this.#call((o) => this.raw.workflows.replayRun(request, o), options.signal);
    return runReplayFromWire(r.replay);
  }

  /**
   * Replays the runs of workflow `name` (of every version) against a new definition, as
   * {@link replayRun} does each: the runs in flight (RUNNING, COMPENSATING, PAUSED), or with
   * `scope` COMPLETED the completed ones, the newest first and at most `limit` of them. The server
   * replays a page of runs per call (in the caller's namespace's share of its CPU); this pages
   * through all of them and returns the verdicts counted over every page, with every run that is not
   * IDENTICAL. Bad arguments (not exactly one of `source` and `version`, a `limit` with the runs in
   * flight) throw a TypeError before any call.
   */
  async checkWorkflowVersion(name: string, options: CheckWorkflowVersionOptions): Promise<WorkflowVersionCheck> {
    if (typeof name !== "string" || name === "") throw new TypeError("checkWorkflowVersion needs the workflow's name");
    const definition = definitionParts("checkWorkflowVersion", options);
    const scope = options.scope ?? "IN_FLIGHT";
    if (scope !== "IN_FLIGHT" && scope !== "COMPLETED") throw new TypeError(`checkWorkflowVersion: scope is IN_FLIGHT or COMPLETED, not ${String(scope)}`);
    const limit = options.limit;
    if (limit !== undefined && scope !== "COMPLETED") {
      throw new TypeError("checkWorkflowVersion: limit is for the COMPLETED scope; every run in flight is checked");
    }
    if (limit !== undefined && !isPositiveInteger(limit)) throw new TypeError(`checkWorkflowVersion: limit must be a positive integer, not ${String(limit)}`);
    const pageSize = options.pageSize ?? CHECK_PAGE_SIZE;
    if (!isPositiveInteger(pageSize)) throw new TypeError(`checkWorkflowVersion: pageSize must be a positive integer, not ${String(pageSize)}`);
    const wireScope = scope === "COMPLETED" ? WireCheckScope.COMPLETED : WireCheckScope.IN_FLIGHT;
    const check: WorkflowVersionCheck = { checked: 0, identical: 0, compatible: 0, incompatible: 0, unreplayable: 0, runs: [] };
    let pageToken = "";
    for (;;) {
      const size = limit === undefined ? pageSize : Math.min(pageSize, limit - check.checked);
      if (size <= 0) return check;
      const request = { name, ...definition, scope: wireScope, pageSize: size, pageToken };
      const r = await this.#call((o) => this.raw.workflows.checkWorkflowVersion(request, o), options.signal);
      addCheckPage(check, r);
      if (!r.nextPageToken) return check;
      pageToken = r.nextPageToken;
    }
  }

  // --- runs ------------------------------------------------------------------------------------

  /**
   * Starts a run of `workflow` with a JSON `input`; with an idempotency key a repeat returns the same
   * run. In Node, called with an OpenTelemetry span active, it sends the span's W3C context: the
   * run's trace continues the caller's.
   */
  async startRun(workflow: string, input?: unknown, options: StartRunOptions = {}): Promise<Run> {
    const request = {
      workflowName: workflow,
      version: options.version ?? 0,
      idempotencyKey: options.idempotencyKey ?? "",
      labels: { ...options.labels },
      priority: options.priority ?? 0,
      ...(input === undefined ? {} : { input: await this.#payload(input, options.signal) }),
    };
    const r = await this.#call((o) => this.raw.runs.startRun(request, o), options.signal, await this.#traceHeaders());
    return runFromWire(r.run, r.created);
  }

  /** A run with its node states (none with `skipNodes`); NOT_FOUND if absent. */
  async getRun(runId: string, options: { skipNodes?: boolean; signal?: AbortSignal } = {}): Promise<Run> {
    const r = await this.#call((o) => this.raw.runs.getRun({ runId, skipNodes: options.skipNodes ?? false }, o), options.signal);
    return runFromWire(r.run);
  }

  /** The matching runs, newest first, fetched a page at a time as the loop goes (no node states). */
  async *listRuns(options: ListRunsOptions = {}): AsyncGenerator<Run, void, undefined> {
    let pageToken = "";
    for (;;) {
      const request = {
        workflowName: options.workflow ?? "",
        workflowVersion: options.workflowVersion ?? 0,
        statuses: (options.statuses ?? []).map(runStatusToWire),
        labels: { ...options.labels },
        parentRunId: options.parentRunId ?? "",
        search: options.search ?? "",
        pageSize: options.pageSize ?? 100,
        pageToken,
        ...(options.createdAfter ? { createTimeAfter: timestampFromDate(options.createdAfter) } : {}),
        ...(options.createdBefore ? { createTimeBefore: timestampFromDate(options.createdBefore) } : {}),
      };
      const r = await this.#call((o) => this.raw.runs.listRuns(request, o), options.signal);
      for (const run of r.runs) yield runFromWire(run);
      if (!r.nextPageToken) return;
      pageToken = r.nextPageToken;
    }
  }

  /**
   * How many runs match the filters (those of listRuns but statuses), in all and per status,
   * counted by the server in one call. INVALID_ARGUMENT names a bad filter field. The server counts
   * up to its limit (100,000 matching runs): past it each count is a floor, and `more` is set.
   */
  async countRuns(filter: CountRunsOptions = {}): Promise<RunCounts> {
    const wire = runFilterToWire(filter);
    const request = {
      workflowName: wire.workflowName,
      workflowVersion: wire.workflowVersion,
      labels: wire.labels,
      parentRunId: wire.parentRunId,
      search: wire.search,
      ...(wire.createTimeAfter ? { createTimeAfter: wire.createTimeAfter } : {}),
      ...(wire.createTimeBefore ? { createTimeBefore: wire.createTimeBefore } : {}),
    };
    const r = await this.#call((o) => this.raw.runs.countRuns(request, o), filter.signal);
    return runCountsFromWire(r.counts, r.more);
  }

  /**
   * Cancels a live run with `reason` (its workers see it at their next heartbeat, as
   * `ctx.cancelReason`; the run's error becomes CANCELLED with the reason). FAILED_PRECONDITION if
   * it ended.
   */
  async cancelRun(runId: string, reason = "", options: { signal?: AbortSignal } = {}): Promise<Run> {
    const r = await this.#call((o) => this.raw.runs.cancelRun({ runId, reason }, o), options.signal);
    return runFromWire(r.run);
  }

  /** Resumes a FAILED run from its failed nodes; FAILED_PRECONDITION unless it is FAILED. */
  async retryRun(runId: string, options: { signal?: AbortSignal } = {}): Promise<Run> {
    const r = await this.#call((o) => this.raw.runs.retryRun({ runId }, o), options.signal);
    return runFromWire(r.run);
  }

  /**
   * Pauses a live run: it dispatches no new task and fires no timer until {@link resumeRun}.
   * Attempts already running finish and their results are applied, but the tasks they make ready
   * are held; the run shows PAUSED. Child runs go on. Pausing a paused run changes nothing;
   * FAILED_PRECONDITION when the run ended.
   */
  async pauseRun(runId: string, reason = "", options: { signal?: AbortSignal } = {}): Promise<Run> {
    const r = await this.#call((o) => this.raw.runs.pauseRun({ runId, reason }, o), options.signal);
    return runFromWire(r.run);
  }

  /**
   * Resumes a paused run: held tasks are dispatched, timers that fell due fire. Resuming a run that
   * is not paused changes nothing; FAILED_PRECONDITION when it ended.
   */
  async resumeRun(runId: string, options: { signal?: AbortSignal } = {}): Promise<Run> {
    const r = await this.#call((o) => this.raw.runs.resumeRun({ runId }, o), options.signal);
    return runFromWire(r.run);
  }

  // --- bulk operations ---------------------------------------------------------------------------

  /**
   * Starts a bulk operation that cancels every run `filter` matches (as cancelRun, each run in its
   * own transaction; runs that ended before their turn are skipped) and returns it, PENDING or
   * RUNNING: {@link waitBulkOperation} waits for its end. Only runs created before the call are
   * matched. A bad filter is INVALID_ARGUMENT naming `filter.<field>`; an empty filter is
   * FAILED_PRECONDITION unless `all`. With a `requestId`, a repeat returns the same operation with
   * `created` false.
   */
  async bulkCancelRuns(filter: RunFilter, options: BulkRunsWithReasonOptions = {}): Promise<BulkOperation> {
    const request = { ...bulkParts(filter, options), reason: options.reason ?? "" };
    const r = await this.#call((o) => this.raw.runs.bulkCancelRuns(request, o), options.signal);
    return bulkOperationFromWire(r.operation, r.created);
  }

  /** As {@link bulkCancelRuns}, retrying every FAILED run the filter matches (others are skipped). */
  async bulkRetryRuns(filter: RunFilter, options: BulkRunsOptions = {}): Promise<BulkOperation> {
    const request = bulkParts(filter, options);
    const r = await this.#call((o) => this.raw.runs.bulkRetryRuns(request, o), options.signal);
    return bulkOperationFromWire(r.operation, r.created);
  }

  /** As {@link bulkCancelRuns}, pausing every live run the filter matches (as pauseRun). */
  async bulkPauseRuns(filter: RunFilter, options: BulkRunsWithReasonOptions = {}): Promise<BulkOperation> {
    const request = { ...bulkParts(filter, options), reason: options.reason ?? "" };
    const r = await this.#call((o) => this.raw.runs.bulkPauseRuns(request, o), options.signal);
    return bulkOperationFromWire(r.operation, r.created);
  }

  /** As {@link bulkCancelRuns}, resuming every PAUSED run the filter matches (as resumeRun). */
  async bulkResumeRuns(filter: RunFilter, options: BulkRunsOptions = {}): Promise<BulkOperation> {
    const request = bulkParts(filter, options);
    const r = await this.#call((o) => this.raw.runs.bulkResumeRuns(request, o), options.signal);
    return bulkOperationFromWire(r.operation, r.created);
  }

  /**
   * Starts a bulk operation that moves every run in flight (RUNNING or PAUSED) of `filter.workflow`
   * matching the filter to its version `targetVersion` (docs/versions.md), and returns it as
   * {@link bulkCancelRuns} does; {@link waitBulkOperation} waits for its end. Each run is replayed
   * against the target and moved only if it is IDENTICAL or COMPATIBLE: it records `run_migrated`
   * and goes on under the target. An INCOMPATIBLE run is counted `failed`, its divergence in
   * `failures`, and stays on its version; a run already on the target, ended or compensating is
   * skipped. `nodeMapping` names renamed nodes. A filter without `workflow` or a `targetVersion`
   * that is not a positive integer throws a TypeError before any call; a version that is not
   * registered is INVALID_ARGUMENT naming `target_version`.
   */
  async migrateRuns(filter: RunFilter, targetVersion: number, options: MigrateRunsOptions = {}): Promise<BulkOperation> {
    if (!filter?.workflow) throw new TypeError("migrateRuns needs filter.workflow: runs move between versions of one workflow");
    if (!isPositiveInteger(targetVersion)) {
      throw new TypeError(`migrateRuns: targetVersion must be a registered version (a positive integer), not ${String(targetVersion)}`);
    }
    const request = {
      filter: runFilterToWire(filter),
      targetVersion,
      nodeMapping: nodeMappingOf("migrateRuns", options.nodeMapping),
      requestId: options.requestId ?? "",
    };
    const r = await this.#call((o) => this.raw.runs.migrateRuns(request, o), options.signal);
    return bulkOperationFromWire(r.operation, r.created);
  }

  /** A bulk operation with its progress and counts; NOT_FOUND if absent. */
  async getBulkOperation(operationId: string, options: { signal?: AbortSignal } = {}): Promise<BulkOperation> {
    const r = await this.#call((o) => this.raw.runs.getBulkOperation({ operationId }, o), options.signal);
    return bulkOperationFromWire(r.operation);
  }

  /** The namespace's bulk operations, newest first, fetched a page at a time as the loop goes. */
  async *listBulkOperations(options: { pageSize?: number; signal?: AbortSignal } = {}): AsyncGenerator<BulkOperation, void, undefined> {
    let pageToken = "";
    for (;;) {
      const request = { pageSize: options.pageSize ?? 100, pageToken };
      const r = await this.#call((o) => this.raw.runs.listBulkOperations(request, o), options.signal);
      for (const operation of r.operations) yield bulkOperationFromWire(operation);
      if (!r.nextPageToken) return;
      pageToken = r.nextPageToken;
    }
  }

  /**
   * Stops a bulk operation after the run it is on: runs already acted on stay so, the rest are left
   * alone, and it ends CANCELLED with its counts so far (the answer may still show RUNNING until its
   * server sees the request). FAILED_PRECONDITION when it ended; OK when already being cancelled.
   */
  async cancelBulkOperation(operationId: string, options: { signal?: AbortSignal } = {}): Promise<BulkOperation> {
    const r = await this.#call((o) => this.raw.runs.cancelBulkOperation({ operationId }, o), options.signal);
    return bulkOperationFromWire(r.operation);
  }

  /**
   * Polls a bulk operation (soon at first, then backing off to `maxPollIntervalMs`) until it is
   * SUCCEEDED, CANCELLED or FAILED and returns it, whatever its final status. Throws
   * {@link TimeoutError} after `timeoutMs`; a poll that meets UNAVAILABLE or DEADLINE_EXCEEDED is
   * made again (the operation survives a server's restart).
   */
  async waitBulkOperation(operationId: string, options: WaitBulkOperationOptions = {}): Promise<BulkOperation> {
    const maximumMs = options.maxPollIntervalMs ?? 1_000;
    const backoff = new Backoff({ initialMs: Math.min(50, maximumMs), maximumMs, jitter: 0.2 });
    const controller = new AbortController();
    const timeout = new TimeoutError(`bulk operation ${operationId} did not end within ${options.timeoutMs} ms`);
    const timer = options.timeoutMs === undefined ? undefined : setTimeout(() => controller.abort(timeout), options.timeoutMs);
    const outer = options.signal;
    const forward = (): void => controller.abort(outer?.reason);
    if (outer?.aborted) forward();
    outer?.addEventListener("abort", forward, { once: true });
    try {
      for (let polls = 1; ; polls++) {
        const operation = await this.#pollBulkOperation(operationId, controller.signal);
        if (operation && isBulkOperationDone(operation.status)) return operation;
        await sleep(backoff.delay(polls), controller.signal);
      }
    } catch (error) {
      if (controller.signal.aborted) throw controller.signal.reason;
      throw error;
    } finally {
      clearTimeout(timer);
      outer?.removeEventListener("abort", forward);
    }
  }

  /** One poll of {@link waitBulkOperation}: the operation, or undefined after a transient error. */
  async #pollBulkOperation(operationId: string, signal: AbortSignal): Promise<BulkOperation | undefined> {
    try {
      return await this.getBulkOperation(operationId, { signal });
    } catch (error) {
      if (signal.aborted || !(error instanceof ComposerError) || !error.retryable) throw error;
      return undefined;
    }
  }

  /**
   * Creates a schedule that starts runs of `workflow` with `input` on `cron` or every `intervalMs`.
   * Each fire's run carries an idempotency key of the schedule and fire time, so one fire starts one
   * run however many servers run (docs/schedules.md). INVALID_ARGUMENT names the field (`spec.cron`,
   * `spec.time_zone`, `spec.interval`, `action.input...`); NOT_FOUND when the workflow (or version)
   * does not exist; ALREADY_EXISTS when the id is taken.
   */
  async createSchedule(scheduleId: string, workflow: string, input?: unknown, options: CreateScheduleOptions = {}): Promise<Schedule> {
    const request = { ...scheduleParts(scheduleId, workflow, input, options), paused: options.paused ?? false, note: options.note ?? "" };
    const r = await this.#call((o) => this.raw.schedules.createSchedule(request, o), options.signal);
    return scheduleFromWire(r.schedule);
  }

  /** A schedule with its recent fires, next fire times and counters; NOT_FOUND if absent. */
  async getSchedule(scheduleId: string, options: { signal?: AbortSignal } = {}): Promise<Schedule> {
    const r = await this.#call((o) => this.raw.schedules.getSchedule({ scheduleId }, o), options.signal);
    return scheduleFromWire(r.schedule);
  }

  /** The namespace's schedules by id, fetched a page at a time as the loop goes. */
  async *listSchedules(options: { pageSize?: number; signal?: AbortSignal } = {}): AsyncGenerator<Schedule, void, undefined> {
    let pageToken = "";
    for (;;) {
      const request = { pageSize: options.pageSize ?? 100, pageToken };
      const r = await this.#call((o) => this.raw.schedules.listSchedules(request, o), options.signal);
      for (const schedule of r.schedules) yield scheduleFromWire(schedule);
      if (!r.nextPageToken) return;
      pageToken = r.nextPageToken;
    }
  }

  /**
   * Replaces a schedule's definition (the arguments of {@link createSchedule} but paused and note),
   * checked the same way. Counters and recent fires stay, paused stays as it was; the next fire
   * time is computed anew from now and a buffered fire is dropped. NOT_FOUND if absent.
   */
  async updateSchedule(scheduleId: string, workflow: string, input?: unknown, options: ScheduleOptions = {}): Promise<Schedule> {
    const request = scheduleParts(scheduleId, workflow, input, options);
    const r = await this.#call((o) => this.raw.schedules.updateSchedule(request, o), options.signal);
    return scheduleFromWire(r.schedule);
  }

  /** Stops a schedule's fires until {@link resumeSchedule}, keeping `note` (why). */
  async pauseSchedule(scheduleId: string, note = "", options: { signal?: AbortSignal } = {}): Promise<Schedule> {
    const r = await this.#call((o) => this.raw.schedules.pauseSchedule({ scheduleId, note }, o), options.signal);
    return scheduleFromWire(r.schedule);
  }

  /** Lets a paused schedule fire again from its first fire time after now (fires in the pause are not started). */
  async resumeSchedule(scheduleId: string, note = "", options: { signal?: AbortSignal } = {}): Promise<Schedule> {
    const r = await this.#call((o) => this.raw.schedules.resumeSchedule({ scheduleId, note }, o), options.signal);
    return scheduleFromWire(r.schedule);
  }

  /** Deletes a schedule (the runs it started stay); NOT_FOUND if absent. */
  async deleteSchedule(scheduleId: string, options: { signal?: AbortSignal } = {}): Promise<void> {
    await this.#call((o) => this.raw.schedules.deleteSchedule({ scheduleId }, o), options.signal);
  }

  /**
   * Fires a schedule now, paused or not, under its overlap policy, and returns the fire. A fire whose
   * run could not start has outcome FAILED and the reason in the schedule's `lastError`.
   */
  async triggerSchedule(scheduleId: string, options: { signal?: AbortSignal } = {}): Promise<ScheduleFire> {
    const r = await this.#call((o) => this.raw.schedules.triggerSchedule({ scheduleId }, o), options.signal);
    return fireFromWire(r.fire);
  }

  // --- queues ----------------------------------------------------------------------------------

  /**
   * Creates or replaces `queue`'s rate limit and returns it as stored (defaults filled in); every
   * server applies it within about a second. INVALID_ARGUMENT names the field (`limit.queue`,
   * `limit.per_second`, `limit.burst`, `limit.per_key_burst`, ...) for a rate that is not positive
   * or over 100,000, a burst under the rate rounded up, or a limit with no rate at all;
   * RESOURCE_EXHAUSTED when the namespace holds 1,000 limits and this queue has none yet.
   */
  async setQueueRateLimit(queue: string, limit: QueueRateLimitOptions): Promise<QueueRateLimit> {
    const request = {
      limit: {
        queue,
        perSecond: limit.perSecond ?? 0,
        burst: limit.burst ?? 0,
        perKeyPerSecond: limit.perKeyPerSecond ?? 0,
        perKeyBurst: limit.perKeyBurst ?? 0,
      },
    };
    const r = await this.#call((o) => this.raw.queues.setQueueRateLimit(request, o), limit.signal);
    return queueRateLimitFromWire(r.limit);
  }

  /** A queue's rate limit; NOT_FOUND when the queue has none in the caller's namespace. */
  async getQueueRateLimit(queue: string, options: { signal?: AbortSignal } = {}): Promise<QueueRateLimit> {
    const r = await this.#call((o) => this.raw.queues.getQueueRateLimit({ queue }, o), options.signal);
    return queueRateLimitFromWire(r.limit);
  }

  /** The namespace's rate limits by queue, fetched a page at a time as the loop goes. */
  async *listQueueRateLimits(options: { pageSize?: number; signal?: AbortSignal } = {}): AsyncGenerator<QueueRateLimit, void, undefined> {
    let pageToken = "";
    for (;;) {
      const request = { pageSize: options.pageSize ?? 100, pageToken };
      const r = await this.#call((o) => this.raw.queues.listQueueRateLimits(request, o), options.signal);
      for (const limit of r.limits) yield queueRateLimitFromWire(limit);
      if (!r.nextPageToken) return;
      pageToken = r.nextPageToken;
    }
  }

  /** Removes a queue's rate limit (its tasks go out unlimited within about a second); NOT_FOUND when it has none. */
  async deleteQueueRateLimit(queue: string, options: { signal?: AbortSignal } = {}): Promise<void> {
    await this.#call((o) => this.raw.queues.deleteQueueRateLimit({ queue }, o), options.signal);
  }

  // --- secrets ---------------------------------------------------------------------------------

  /**
   * Stores a new version of the secret `name` and returns it, without its value (docs/secrets.md):
   * version 1 at first, one more at each set; a run's node uses the version current when it
   * executes, as `${secrets.NAME}`. `value` is 1 byte to 64 KiB; a string goes as UTF-8. No call
   * returns it, the client neither logs it nor puts it in an error, and keeps nothing of it after
   * the call (the UTF-8 bytes it made of a string are zeroed). INVALID_ARGUMENT names the field
   * (`name` breaking the name rule, `value` empty or too long); RESOURCE_EXHAUSTED when the
   * namespace holds 1,000 secrets and `name` is new; FAILED_PRECONDITION when the server was given
   * no secrets key (`--secrets-key-file`); PERMISSION_DENIED unless the token is an operator's or
   * an admin's.
   */
  async setSecret(name: string, value: SecretValue, options: { signal?: AbortSignal } = {}): Promise<Secret> {
    const bytes = secretBytes(value);
    try {
      const r = await this.#call((o) => this.raw.secrets.setSecret({ name, value: bytes }, o), options.signal);
      return secretFromWire(r.secret);
    } finally {
      // The caller's own bytes are theirs to keep or clear; the copy made of a string is ours.
      if (bytes !== value) bytes.fill(0);
    }
  }

  /** The namespace's secrets by name (names, versions and times, never values), fetched a page at a time as the loop goes. */
  async *listSecrets(options: { pageSize?: number; signal?: AbortSignal } = {}): AsyncGenerator<Secret, void, undefined> {
    let pageToken = "";
    for (;;) {
      const request = { pageSize: options.pageSize ?? 100, pageToken };
      const r = await this.#call((o) => this.raw.secrets.listSecrets(request, o), options.signal);
      for (const secret of r.secrets) yield secretFromWire(secret);
      if (!r.nextPageToken) return;
      pageToken = r.nextPageToken;
    }
  }

  /** Removes a secret and every version of it (a node naming it afterwards fails with SECRET_NOT_FOUND); NOT_FOUND when there is none. */
  async deleteSecret(name: string, options: { signal?: AbortSignal } = {}): Promise<void> {
    await this.#call((o) => this.raw.secrets.deleteSecret({ name }, o), options.signal);
  }

  /**
   * Sends a named event to one run (`runId`) or every run waiting on `correlationKey`; the payload
   * becomes the WAIT_FOR_EVENT node's output.
   */
  async sendEvent(eventName: string, payload: unknown, target: SendEventOptions): Promise<EventDelivery> {
    const hasRun = typeof target.runId === "string";
    const hasKey = typeof target.correlationKey === "string";
    if (hasRun === hasKey) throw new TypeError("sendEvent needs exactly one of runId and correlationKey");
    const request = create(SendEventRequestSchema, {
        eventName,
        requestId: target.requestId ?? "",
        target: hasRun ? { case: "runId", value: target.runId as string } : { case: "correlationKey", value: target.correlationKey as string },
      ...(payload === undefined ? {} : { payload: await this.#payload(payload, target.signal) }),
    });
    const r = await this.#call((o) => this.raw.runs.sendEvent(request, o), target.signal, await this.#traceHeaders());
    return deliveryFromWire(r);
  }

  /** A run's history, oldest first, fetched a page at a time as the loop goes. */
  async *getRunHistory(runId: string, options: { pageSize?: number; signal?: AbortSignal } = {}): AsyncGenerator<HistoryEvent, void, undefined> {
    let pageToken = "";
    for (;;) {
      const r = await this.#call(
        (o) => this.raw.runs.getRunHistory({ runId, pageSize: options.pageSize ?? 100, pageToken }, o),
        options.signal,
      );
      for (const event of r.events) yield historyFromWire(event);
      if (!r.nextPageToken) return;
      pageToken = r.nextPageToken;
    }
  }

  /**
   * The run's snapshots (the current one first, then one per change) until it ends. A stream that
   * breaks (UNAVAILABLE, DEADLINE_EXCEEDED, or reset by the server: CANCELLED without the caller's
   * signal) is opened again with back-off (the server answers with the current snapshot first, so
   * nothing is missed). Breaking out of the loop closes the stream.
   */
  async *watchRun(runId: string, options: { signal?: AbortSignal } = {}): AsyncGenerator<Run, void, undefined> {
    const backoff = new Backoff({ initialMs: 100, maximumMs: 2_000 });
    let failures = 0;
    for (;;) {
      const controller = new AbortController();
      const outer = options.signal;
      const forward = (): void => controller.abort(outer?.reason);
      if (outer?.aborted) throw outer.reason;
      outer?.addEventListener("abort", forward, { once: true });
      try {
        const stream = this.raw.runs.watchRun({ runId }, { headers: { ...this.#headers }, signal: controller.signal });
        for await (const response of stream) {
          failures = 0;
          const run = runFromWire(response.run);
          yield run;
          if (isFinalStatus(run.status)) return;
        }
      } catch (error) {
        if (outer?.aborted) throw outer.reason;
        const converted = toComposerError(error);
        // A stream the server (or the network) reset is CANCELLED without our signal: watch again.
        if (!converted.retryable && converted.code !== "CANCELLED") throw converted;
      } finally {
        outer?.removeEventListener("abort", forward);
        controller.abort();
      }
      failures += 1;
      await sleep(backoff.delay(failures), outer);
    }
  }

  /** Waits (over WatchRun) until the run ends and returns it, whatever its final status. */
  async waitForRun(runId: string, options: WaitOptions = {}): Promise<Run> {
    const controller = new AbortController();
    const timeout = new TimeoutError(`run ${runId} did not end within ${options.timeoutMs} ms`);
    const timer = options.timeoutMs === undefined ? undefined : setTimeout(() => controller.abort(timeout), options.timeoutMs);
    const outer = options.signal;
    const forward = (): void => controller.abort(outer?.reason);
    if (outer?.aborted) forward();
    outer?.addEventListener("abort", forward, { once: true });
    try {
      for await (const run of this.watchRun(runId, { signal: controller.signal })) {
        if (isFinalStatus(run.status)) return run;
      }
      throw new ComposerError("INTERNAL", `the watch of run ${runId} ended without a final status`);
    } catch (error) {
      if (controller.signal.aborted) throw controller.signal.reason;
      throw error;
    } finally {
      clearTimeout(timer);
      outer?.removeEventListener("abort", forward);
    }
  }

  /**
   * Waits until the run ends and returns its output, every reference in it replaced by the value
   * it names ({@link resolvePayload}). Throws {@link RunFailedError} (with the final run, as
   * stored) when it ends FAILED or CANCELLED, {@link TimeoutError} after `timeoutMs`.
   */
  async waitForResult(runId: string, options: WaitOptions = {}): Promise<Json> {
    const run = await this.waitForRun(runId, options);
    if (run.status !== "COMPLETED") throw new RunFailedError(run);
    return this.resolvePayload(run.output, options.signal ? { signal: options.signal } : {});
  }

  /** Starts a run and waits for its output (startRun + waitForResult). */
  async runWorkflow(workflow: string, input?: unknown, options: StartRunOptions & WaitOptions = {}): Promise<Json> {
    const started = Date.now();
    const run = await this.startRun(workflow, input, options);
    const left = options.timeoutMs === undefined ? undefined : Math.max(0, options.timeoutMs - (Date.now() - started));
    return this.waitForResult(run.runId, { ...(left === undefined ? {} : { timeoutMs: left }), ...(options.signal ? { signal: options.signal } : {}) });
  }
}
