// The SDK's own shapes of runs, nodes, workflows and history: plain objects with JSON values,
// string statuses and Dates, converted from the generated wire messages.
import { durationMs, timestampDate, timestampFromDate, type Duration, type Timestamp } from "@bufbuild/protobuf/wkt";

import {
  NodeStatus as WireNodeStatus,
  RunStatus as WireRunStatus,
  type Failure as WireFailure,
  type HistoryEvent as WireHistoryEvent,
  type NodeState as WireNodeState,
  type Run as WireRun,
  type WorkflowSummary as WireWorkflowSummary,
  type WorkflowVersion as WireWorkflowVersion,
} from "./gen/composer/v1/common_pb.js";
import {
  ReplayVerdict as WireReplayVerdict,
  type CheckWorkflowVersionResponse as WireCheckPage,
  type RunReplay as WireRunReplay,
  type ValidationProblem as WireProblem,
} from "./gen/composer/v1/workflow_service_pb.js";
import {
  BulkOperationKind as WireBulkKind,
  BulkOperationStatus as WireBulkStatus,
  type BulkOperation as WireBulkOperation,
  type RunFilter as WireRunFilter,
  type RunStatusCount as WireRunStatusCount,
  type SendEventResponse,
} from "./gen/composer/v1/run_service_pb.js";
import {
  OverlapPolicy as WireOverlapPolicy,
  ScheduleFireOutcome as WireFireOutcome,
  type Schedule as WireSchedule,
  type ScheduleFire as WireScheduleFire,
} from "./gen/composer/v1/schedule_service_pb.js";
import type { QueueRateLimit as WireQueueRateLimit } from "./gen/composer/v1/queue_service_pb.js";
import type { Secret as WireSecret } from "./gen/composer/v1/secret_service_pb.js";
import type { BlobRef as WireBlobRef } from "./gen/composer/v1/blob_service_pb.js";
import type { GetServerInfoResponse as WireServerInfo } from "./gen/composer/v1/server_service_pb.js";
import { fromValue, type Json } from "./values.js";

/**
 * Where a run is. QUEUED: the run waits for a slot of its workflow's concurrency key and has started
 * no node; it becomes RUNNING when a run of its key ends, in the order the runs of the key arrived.
 */
export type RunStatus = "RUNNING" | "COMPENSATING" | "COMPLETED" | "FAILED" | "CANCELLED" | "PAUSED" | "QUEUED" | "UNSPECIFIED";
/** Where a node is. */
export type NodeStatus = "SCHEDULED" | "RUNNING" | "WAITING" | "COMPLETED" | "FAILED" | "SKIPPED" | "CANCELLED" | "UNSPECIFIED";

const RUN_STATUSES: Record<number, RunStatus> = {
  [WireRunStatus.RUNNING]: "RUNNING",
  [WireRunStatus.COMPENSATING]: "COMPENSATING",
  [WireRunStatus.COMPLETED]: "COMPLETED",
  [WireRunStatus.FAILED]: "FAILED",
  [WireRunStatus.CANCELLED]: "CANCELLED",
  [WireRunStatus.PAUSED]: "PAUSED",
  [WireRunStatus.QUEUED]: "QUEUED",
};
const NODE_STATUSES: Record<number, NodeStatus> = {
  [WireNodeStatus.SCHEDULED]: "SCHEDULED",
  [WireNodeStatus.RUNNING]: "RUNNING",
  [WireNodeStatus.WAITING]: "WAITING",
  [WireNodeStatus.COMPLETED]: "COMPLETED",
  [WireNodeStatus.FAILED]: "FAILED",
  [WireNodeStatus.SKIPPED]: "SKIPPED",
  [WireNodeStatus.CANCELLED]: "CANCELLED",
};

/** True for COMPLETED, FAILED and CANCELLED. */
export function isFinalStatus(status: RunStatus): boolean {
  return status === "COMPLETED" || status === "FAILED" || status === "CANCELLED";
}

/** The wire value of a run status (for filters). */
export function runStatusToWire(status: RunStatus): WireRunStatus {
  for (const [wire, name] of Object.entries(RUN_STATUSES)) if (name === status) return Number(wire) as WireRunStatus;
  return WireRunStatus.UNSPECIFIED;
}

/** Why a node or a run failed. */
export interface Failure {
  code: string;
  message: string;
  /** The node whose failure this is; empty for run-level failures. */
  nodeId: string;
  /** Structured details reported with the failure (a worker's `details`), or null. */
  details: Json;
}

/** One node (or MAP element `<map id>[<index>]`) of a run. */
export interface NodeState {
  nodeId: string;
  nodeType: string;
  status: NodeStatus;
  /** The current or last attempt, from 1; 0 before the first. */
  attempt: number;
  output: Json;
  error: Failure | null;
  startTime: Date | null;
  endTime: Date | null;
  /** For a node a worker runs: the input it gets, templates rendered. */
  input: Json;
  /** The worker that holds (or last held) its task's lease. */
  workerId: string;
  /** When the current lease ends; null when the task is not leased. */
  leaseExpireTime: Date | null;
}

/** One run of a workflow version. */
export interface Run {
  runId: string;
  namespace: string;
  workflowName: string;
  workflowVersion: number;
  status: RunStatus;
  input: Json;
  output: Json;
  error: Failure | null;
  labels: Record<string, string>;
  idempotencyKey: string;
  parentRunId: string;
  parentNodeId: string;
  createTime: Date | null;
  updateTime: Date | null;
  endTime: Date | null;
  /** Node states (GetRun, WatchRun); empty in ListRuns and with `skipNodes`. */
  nodes: NodeState[];
  /** Dispatch priority, 1 (lowest) to 5 (highest): startRun's, or for a child run its parent's. */
  priority: number;
  /**
   * The value of its workflow's `concurrency.key` for this run's input (docs/language.md,
   * "Concurrency keys"); empty when the workflow declares no concurrency.
   */
  concurrencyKey: string;
  /** StartRun only: false when an idempotency key matched an existing run. */
  created?: boolean;
}

/** One registered, immutable version of a workflow. */
export interface WorkflowVersion {
  namespace: string;
  name: string;
  version: number;
  description: string;
  source: string;
  definition: Json;
  contentHash: string;
  createTime: Date | null;
  /** RegisterWorkflow only: true when this call created a new version. */
  created?: boolean;
}

/** One workflow of {@link ComposerClient.listWorkflows}: its name and latest version. */
export interface WorkflowSummary {
  namespace: string;
  name: string;
  /** The highest registered version. */
  latestVersion: number;
  /** The latest version's description. */
  description: string;
  /** When the latest version was registered. */
  updateTime: Date | null;
}

/** What {@link ComposerClient.countRuns} answers: the matching runs in all and per status. */
export interface RunCounts {
  /** Every matching run. */
  total: number;
  /** How many matching runs are in each status; a status with none is absent. */
  byStatus: Partial<Record<RunStatus, number>>;
  /**
   * The server stopped counting at its limit (100,000 matching runs): each count is a floor, and a
   * status absent may still have runs.
   */
  more: boolean;
}

/** One problem ValidateWorkflow found. */
export interface ValidationProblem {
  path: string;
  message: string;
}

/** One entry of a run's history. */
export interface HistoryEvent {
  sequence: bigint;
  eventTime: Date | null;
  eventType: string;
  nodeId: string;
  attempt: number;
  actor: string;
  details: Json;
}

/** Where SendEvent's event went. */
export interface EventDelivery {
  deliveredRunIds: string[];
  /** True when the event was kept for a wait not reached yet. */
  stored: boolean;
}

/** The server's version, protocol version, features and payload limits. */
export interface ServerInfo {
  serverVersion: string;
  protocolVersion: string;
  features: string[];
  /**
   * A value whose compact JSON is longer than this many bytes is kept in the blob store and
   * carried as a reference (docs/payloads.md); 0: the server offloads nothing.
   */
  payloadOffloadBytes: number;
  /** The largest payload the server accepts, inline or as a blob (0 from a server that does not say). */
  maxPayloadBytes: number;
  /** The largest request the server decodes: a larger payload must go through the blob store (0: not said). */
  maxMessageBytes: number;
  /**
   * Whether BlobService gives presigned URLs (its blob store signs them: a bucket, not a folder):
   * the Node client then moves blobs straight to and from the store.
   */
  blobUrls: boolean;
}

export function serverInfoFromWire(info: WireServerInfo): ServerInfo {
  return {
    serverVersion: info.serverVersion,
    protocolVersion: info.protocolVersion,
    features: [...info.features],
    payloadOffloadBytes: Number(info.payloadOffloadBytes),
    maxPayloadBytes: Number(info.maxPayloadBytes),
    maxMessageBytes: Number(info.maxMessageBytes),
    blobUrls: info.blobUrls,
  };
}

/**
 * A blob in the server's blob store, as a reference names it: a value that stands in the blob
 * store is carried as `{"$blob": {"sha256", "size", "head"}}` (docs/payloads.md).
 */
export interface BlobRef {
  /** The SHA-256 of the blob's bytes, 64 lowercase hex digits. */
  sha256: string;
  /** Its length in bytes. */
  size: number;
  /** Its first bytes (at most 256, cut at a character boundary), for a preview. */
  head: string;
}

export function blobRefFromWire(ref: WireBlobRef | undefined): BlobRef {
  return { sha256: ref?.sha256 ?? "", size: Number(ref?.size ?? 0n), head: ref?.head ?? "" };
}

function date(ts: Timestamp | undefined): Date | null {
  return ts ? timestampDate(ts) : null;
}

export function failureFromWire(f: WireFailure | undefined): Failure | null {
  if (!f) return null;
  return { code: f.code, message: f.message, nodeId: f.nodeId, details: fromValue(f.details) };
}

export function nodeFromWire(n: WireNodeState): NodeState {
  return {
    nodeId: n.nodeId,
    nodeType: n.nodeType,
    status: NODE_STATUSES[n.status] ?? "UNSPECIFIED",
    attempt: n.attempt,
    output: fromValue(n.output),
    error: failureFromWire(n.error),
    startTime: date(n.startTime),
    endTime: date(n.endTime),
    input: fromValue(n.input),
    workerId: n.workerId,
    leaseExpireTime: date(n.leaseExpireTime),
  };
}

export function runFromWire(r: WireRun | undefined, created?: boolean): Run {
  if (!r) throw new TypeError("the server's answer carries no run");
  const run: Run = {
    runId: r.runId,
    namespace: r.namespace,
    workflowName: r.workflowName,
    workflowVersion: r.workflowVersion,
    status: RUN_STATUSES[r.status] ?? "UNSPECIFIED",
    input: fromValue(r.input),
    output: fromValue(r.output),
    error: failureFromWire(r.error),
    labels: { ...r.labels },
    idempotencyKey: r.idempotencyKey,
    parentRunId: r.parentRunId,
    parentNodeId: r.parentNodeId,
    createTime: date(r.createTime),
    updateTime: date(r.updateTime),
    endTime: date(r.endTime),
    nodes: r.nodes.map(nodeFromWire),
    priority: r.priority,
    concurrencyKey: r.concurrencyKey,
  };
  if (created !== undefined) run.created = created;
  return run;
}

export function workflowFromWire(w: WireWorkflowVersion | undefined, created?: boolean): WorkflowVersion {
  if (!w) throw new TypeError("the server's answer carries no workflow");
  const out: WorkflowVersion = {
    namespace: w.namespace,
    name: w.name,
    version: w.version,
    description: w.description,
    source: w.source,
    definition: fromValue(w.definition),
    contentHash: w.contentHash,
    createTime: date(w.createTime),
  };
  if (created !== undefined) out.created = created;
  return out;
}

export function workflowSummaryFromWire(w: WireWorkflowSummary): WorkflowSummary {
  return { namespace: w.namespace, name: w.name, latestVersion: w.latestVersion, description: w.description, updateTime: date(w.updateTime) };
}

export function runCountsFromWire(counts: readonly WireRunStatusCount[], more = false): RunCounts {
  const out: RunCounts = { total: 0, byStatus: {}, more };
  for (const each of counts) {
    // int64 on the wire; a count of runs stays far below 2^53.
    const count = Number(each.count);
    const status = RUN_STATUSES[each.status] ?? "UNSPECIFIED";
    out.byStatus[status] = (out.byStatus[status] ?? 0) + count;
    out.total += count;
  }
  return out;
}

export function problemFromWire(p: WireProblem): ValidationProblem {
  return { path: p.path, message: p.message };
}

export function historyFromWire(e: WireHistoryEvent): HistoryEvent {
  return {
    sequence: e.sequence,
    eventTime: date(e.eventTime),
    eventType: e.eventType,
    nodeId: e.nodeId,
    attempt: e.attempt,
    actor: e.actor,
    details: fromValue(e.details),
  };
}

export function deliveryFromWire(r: SendEventResponse): EventDelivery {
  return { deliveredRunIds: [...r.deliveredRunIds], stored: r.stored };
}

/** What a schedule's fire does while the run of its previous fire still runs. */
export type OverlapPolicy = "SKIP" | "BUFFER_ONE" | "ALLOW_ALL" | "CANCEL_PREVIOUS" | "UNSPECIFIED";
/** How one fire of a schedule went. */
export type FireOutcome = "STARTED" | "SKIPPED" | "BUFFERED" | "FAILED" | "UNSPECIFIED";

const OVERLAP_POLICIES: Record<number, OverlapPolicy> = {
  [WireOverlapPolicy.SKIP]: "SKIP",
  [WireOverlapPolicy.BUFFER_ONE]: "BUFFER_ONE",
  [WireOverlapPolicy.ALLOW_ALL]: "ALLOW_ALL",
  [WireOverlapPolicy.CANCEL_PREVIOUS]: "CANCEL_PREVIOUS",
};
const FIRE_OUTCOMES: Record<number, FireOutcome> = {
  [WireFireOutcome.STARTED]: "STARTED",
  [WireFireOutcome.SKIPPED]: "SKIPPED",
  [WireFireOutcome.BUFFERED]: "BUFFERED",
  [WireFireOutcome.FAILED]: "FAILED",
};

/** The wire value of an overlap policy. */
export function overlapPolicyToWire(policy: OverlapPolicy): WireOverlapPolicy {
  for (const [wire, name] of Object.entries(OVERLAP_POLICIES)) if (name === policy) return Number(wire) as WireOverlapPolicy;
  return WireOverlapPolicy.UNSPECIFIED;
}

/** When a schedule fires: `cron` (read in `timeZone`, UTC when empty) or a fixed `intervalMs`. */
export interface ScheduleSpec {
  /** 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first; empty with an interval. */
  cron: string;
  /** The IANA time zone `cron` is read in; empty: UTC. */
  timeZone: string;
  /** The interval in ms (whole seconds, 1 s to 366 days); null with a cron expression. */
  intervalMs: number | null;
}

/** The run a schedule's fire starts. */
export interface ScheduleAction {
  workflowName: string;
  /** 0: the latest version at each fire. */
  version: number;
  input: Json;
  /** The run's labels; it also carries `composer.schedule` (the id) and `composer.fire_time`. */
  labels: Record<string, string>;
}

/** One fire of a schedule. */
export interface ScheduleFire {
  /** The fire time the spec gave (before jitter). */
  fireTime: Date | null;
  /** The run it started; empty unless STARTED. */
  runId: string;
  outcome: FireOutcome;
}

/** A schedule that starts runs on a timetable, with its state (docs/schedules.md). */
export interface Schedule {
  scheduleId: string;
  namespace: string;
  spec: ScheduleSpec;
  action: ScheduleAction;
  overlapPolicy: OverlapPolicy;
  /** How late a missed fire may still start, in ms. */
  catchUpWindowMs: number | null;
  /** The most a fire's start is delayed past its fire time, in ms. */
  jitterMs: number | null;
  paused: boolean;
  /** The note of the last pause or resume. */
  note: string;
  /** The last fires, newest first (at most 10). */
  recentFires: ScheduleFire[];
  /** The next fire times (at most 10; none while paused). */
  nextFireTimes: Date[];
  /** Fires that started a run. */
  firedCount: number;
  /** Fires the overlap policy skipped. */
  skippedCount: number;
  /** Fires older than the catch-up window when the scheduler reached them, never started. */
  missedCount: number;
  /** Why the last fire started no run; empty after one that did. */
  lastError: string;
  /** A fire waiting for the previous run to end (BUFFER_ONE). */
  bufferedFireTime: Date | null;
  createTime: Date | null;
  updateTime: Date | null;
}

function ms(d: Duration | undefined): number | null {
  return d ? durationMs(d) : null;
}

export function fireFromWire(f: WireScheduleFire | undefined): ScheduleFire {
  if (!f) throw new TypeError("the server's answer carries no fire");
  return { fireTime: date(f.fireTime), runId: f.runId, outcome: FIRE_OUTCOMES[f.outcome] ?? "UNSPECIFIED" };
}

export function scheduleFromWire(s: WireSchedule | undefined): Schedule {
  if (!s) throw new TypeError("the server's answer carries no schedule");
  return {
    scheduleId: s.scheduleId,
    namespace: s.namespace,
    spec: { cron: s.spec?.cron ?? "", timeZone: s.spec?.timeZone ?? "", intervalMs: ms(s.spec?.interval) },
    action: {
      workflowName: s.action?.workflowName ?? "",
      version: s.action?.version ?? 0,
      input: fromValue(s.action?.input),
      labels: { ...s.action?.labels },
    },
    overlapPolicy: OVERLAP_POLICIES[s.overlapPolicy] ?? "UNSPECIFIED",
    catchUpWindowMs: ms(s.catchUpWindow),
    jitterMs: ms(s.jitter),
    paused: s.paused,
    note: s.note,
    recentFires: s.recentFires.map(fireFromWire),
    nextFireTimes: s.nextFireTimes.map((t) => timestampDate(t)),
    firedCount: Number(s.firedCount),
    skippedCount: Number(s.skippedCount),
    missedCount: Number(s.missedCount),
    lastError: s.lastError,
    bufferedFireTime: date(s.bufferedFireTime),
    createTime: date(s.createTime),
    updateTime: date(s.updateTime),
  };
}

/**
 * Which runs a bulk operation acts on: ListRuns' filters (and their rules). Every field given must
 * match; an empty filter matches nothing unless the call sets `all`.
 */
export interface RunFilter {
  /** Only runs of this workflow. */
  workflow?: string;
  /** Only runs of this version of `workflow` (which it requires); 0 or absent: any version. */
  workflowVersion?: number;
  /** Only runs in one of these statuses. */
  statuses?: readonly RunStatus[];
  /** Only runs carrying all of these labels with these values. */
  labels?: Record<string, string>;
  /** Only runs created at or after this time. */
  createdAfter?: Date;
  /** Only runs created before this time. */
  createdBefore?: Date;
  /** Only child runs of this run. */
  parentRunId?: string;
  /** Only runs this text finds, as ListRuns' `search`. */
  search?: string;
}

/** What a bulk operation does to each run. */
export type BulkOperationKind = "CANCEL" | "RETRY" | "PAUSE" | "RESUME" | "MIGRATE" | "UNSPECIFIED";
/** Where a bulk operation is in its life; SUCCEEDED, CANCELLED and FAILED are final. */
export type BulkOperationStatus = "PENDING" | "RUNNING" | "SUCCEEDED" | "CANCELLED" | "FAILED" | "UNSPECIFIED";

const BULK_KINDS: Record<number, BulkOperationKind> = {
  [WireBulkKind.CANCEL]: "CANCEL",
  [WireBulkKind.RETRY]: "RETRY",
  [WireBulkKind.PAUSE]: "PAUSE",
  [WireBulkKind.RESUME]: "RESUME",
  [WireBulkKind.MIGRATE]: "MIGRATE",
};
const BULK_STATUSES: Record<number, BulkOperationStatus> = {
  [WireBulkStatus.PENDING]: "PENDING",
  [WireBulkStatus.RUNNING]: "RUNNING",
  [WireBulkStatus.SUCCEEDED]: "SUCCEEDED",
  [WireBulkStatus.CANCELLED]: "CANCELLED",
  [WireBulkStatus.FAILED]: "FAILED",
};

/** True for SUCCEEDED, CANCELLED and FAILED: the operation acts on no more runs. */
export function isBulkOperationDone(status: BulkOperationStatus): boolean {
  return status === "SUCCEEDED" || status === "CANCELLED" || status === "FAILED";
}

/** One run a bulk operation could not act on. */
export interface BulkOperationFailure {
  runId: string;
  /** Why. */
  message: string;
}

/**
 * A long-running action over the runs a filter matched (bulkCancelRuns, bulkRetryRuns,
 * bulkPauseRuns, bulkResumeRuns, migrateRuns). Any server works on it a batch at a time, and another takes over
 * if that one stops. Counts only grow; once it ends, `matched` = `succeeded` + `skipped` + `failed`
 * unless it was cancelled.
 */
export interface BulkOperation {
  operationId: string;
  namespace: string;
  kind: BulkOperationKind;
  status: BulkOperationStatus;
  /** The filter it was started with (only the fields that were set). */
  filter: RunFilter;
  /** The reason given, for cancel and pause. */
  reason: string;
  /** Runs that matched when it started (only runs created before it). */
  matched: number;
  /** Runs acted on. */
  succeeded: number;
  /** Runs passed over because they were no longer in a status the action applies to. */
  skipped: number;
  /** Runs the action failed on; the first of them are in `failures`. */
  failed: number;
  /** Up to 20 of the runs the action failed on, with why. */
  failures: BulkOperationFailure[];
  /** The subject of the token that started it. */
  createdBy: string;
  createTime: Date | null;
  /** When it last made progress. */
  updateTime: Date | null;
  /** When it ended; null while it runs. */
  endTime: Date | null;
  /** Why it FAILED; empty otherwise. */
  error: string;
  /** MIGRATE: the version runs are moved to; 0 for the other kinds. */
  targetVersion: number;
  /** MIGRATE: node ids renamed in the target, recorded id to new id; empty otherwise. */
  nodeMapping: Record<string, string>;
  /** The bulk calls only: false when `requestId` matched an existing operation. */
  created?: boolean;
}

/** The wire RunFilter of a {@link RunFilter}. */
export function runFilterToWire(filter: RunFilter) {
  return {
    workflowName: filter.workflow ?? "",
    workflowVersion: filter.workflowVersion ?? 0,
    statuses: (filter.statuses ?? []).map(runStatusToWire),
    labels: { ...filter.labels },
    parentRunId: filter.parentRunId ?? "",
    search: filter.search ?? "",
    ...(filter.createdAfter ? { createTimeAfter: timestampFromDate(filter.createdAfter) } : {}),
    ...(filter.createdBefore ? { createTimeBefore: timestampFromDate(filter.createdBefore) } : {}),
  };
}

/** A wire RunFilter as a {@link RunFilter} holding only the fields set, so it can be passed back. */
export function runFilterFromWire(f: WireRunFilter | undefined): RunFilter {
  const filter: RunFilter = {};
  if (!f) return filter;
  if (f.workflowName) filter.workflow = f.workflowName;
  if (f.workflowVersion) filter.workflowVersion = f.workflowVersion;
  if (f.statuses.length > 0) filter.statuses = f.statuses.map((s) => RUN_STATUSES[s] ?? "UNSPECIFIED");
  if (Object.keys(f.labels).length > 0) filter.labels = { ...f.labels };
  if (f.createTimeAfter) filter.createdAfter = timestampDate(f.createTimeAfter);
  if (f.createTimeBefore) filter.createdBefore = timestampDate(f.createTimeBefore);
  if (f.parentRunId) filter.parentRunId = f.parentRunId;
  if (f.search) filter.search = f.search;
  return filter;
}

export function bulkOperationFromWire(o: WireBulkOperation | undefined, created?: boolean): BulkOperation {
  if (!o) throw new TypeError("the server's answer carries no bulk operation");
  const operation: BulkOperation = {
    operationId: o.operationId,
    namespace: o.namespace,
    kind: BULK_KINDS[o.kind] ?? "UNSPECIFIED",
    status: BULK_STATUSES[o.status] ?? "UNSPECIFIED",
    filter: runFilterFromWire(o.filter),
    reason: o.reason,
    matched: Number(o.matched),
    succeeded: Number(o.succeeded),
    skipped: Number(o.skipped),
    failed: Number(o.failed),
    failures: o.failures.map((f) => ({ runId: f.runId, message: f.message })),
    createdBy: o.createdBy,
    createTime: date(o.createTime),
    updateTime: date(o.updateTime),
    endTime: date(o.endTime),
    error: o.error,
    targetVersion: o.targetVersion,
    nodeMapping: { ...o.nodeMapping },
  };
  if (created !== undefined) operation.created = created;
  return operation;
}

/**
 * How fast a queue's tasks are handed to workers (docs/rate-limits.md): at most `perSecond` tasks
 * per second over time and at most `burst` in any one-second window, and the same per rate-limit
 * key with `perKeyPerSecond` and `perKeyBurst`. Tasks held back stay dispatched and go out as soon
 * as the limit allows; no attempt is spent waiting.
 */
export interface QueueRateLimit {
  queue: string;
  /** Tasks per second over the whole queue, fractions allowed; 0: no queue-wide limit. */
  perSecond: number;
  /** The most tasks handed out in any one-second window (at least `perSecond` rounded up). */
  burst: number;
  /** Tasks per second for each distinct rate-limit key (a TASK node's `rate_limit_key`); 0: none. */
  perKeyPerSecond: number;
  /** The most tasks of one key in any one-second window. */
  perKeyBurst: number;
  /** When the limit was first set. */
  createTime: Date | null;
  /** When the limit was last changed. */
  updateTime: Date | null;
}

export function queueRateLimitFromWire(l: WireQueueRateLimit | undefined): QueueRateLimit {
  if (!l) throw new TypeError("the server's answer carries no rate limit");
  return {
    queue: l.queue,
    perSecond: l.perSecond,
    burst: l.burst,
    perKeyPerSecond: l.perKeyPerSecond,
    perKeyBurst: l.perKeyBurst,
    createTime: date(l.createTime),
    updateTime: date(l.updateTime),
  };
}

/**
 * One of the namespace's secrets, the credentials HTTP and CODE nodes use as `${secrets.NAME}`
 * (docs/secrets.md). It never holds the value: no call returns one.
 */
export interface Secret {
  /** The name, as `${secrets.NAME}` refers to it. */
  name: string;
  /** The current version: 1 for the first value, one more for each `setSecret` since. */
  version: number;
  /** When the first version was set. */
  createTime: Date | null;
  /** When the current version was set. */
  updateTime: Date | null;
  /** The subject of the token that set the current version. */
  updatedBy: string;
}

export function secretFromWire(s: WireSecret | undefined): Secret {
  if (!s) throw new TypeError("the server's answer carries no secret");
  return { name: s.name, version: s.version, createTime: date(s.createTime), updateTime: date(s.updateTime), updatedBy: s.updatedBy };
}

/**
 * Whether a new definition could continue a run (docs/versions.md). IDENTICAL: every recorded
 * decision the same and nothing the run has not reached differs; COMPATIBLE: the same nodes start in
 * the same order with the same work, the differences listed; INCOMPATIBLE: the definition parts from
 * what the run did, `divergence` says where; UNREPLAYABLE: the history is not what the run's own
 * definition decides (cut short, edited, or recorded by another engine), `unreplayableReason` says
 * why.
 */
export type ReplayVerdict = "IDENTICAL" | "COMPATIBLE" | "INCOMPATIBLE" | "UNREPLAYABLE" | "UNSPECIFIED";
/** Which runs {@link ComposerClient.checkWorkflowVersion} replays: those in flight (RUNNING, COMPENSATING, PAUSED) or completed. */
export type CheckScope = "IN_FLIGHT" | "COMPLETED";

const REPLAY_VERDICTS: Record<number, ReplayVerdict> = {
  [WireReplayVerdict.IDENTICAL]: "IDENTICAL",
  [WireReplayVerdict.COMPATIBLE]: "COMPATIBLE",
  [WireReplayVerdict.INCOMPATIBLE]: "INCOMPATIBLE",
  [WireReplayVerdict.UNREPLAYABLE]: "UNREPLAYABLE",
};

/** Where a new definition first parts from a run: the rule it breaks, as docs/versions.md names it. */
export interface ReplayDivergence {
  /** `node_not_started`, `node_changed`, `branch_changed`, `waiting_node_removed`, ... */
  rule: string;
  /** The node (its recorded id); empty if none. */
  nodeId: string;
  /**
   * The history entry where it shows (a {@link HistoryEvent}'s `sequence`, as a number: a verdict is
   * printed as JSON, and a run's history stays far below 2^53 entries); 0 if none.
   */
  sequence: number;
  /** What differs, in words. */
  message: string;
}

/** A difference that does not stop a run going on under the new definition. */
export interface ReplayDifference {
  /** `node_added`, `node_changed`, `node_removed`, `input_differs` or `node_renamed`. */
  kind: string;
  nodeId: string;
  /** What differs, in words. */
  message: string;
}

/** One run replayed against a new definition, and the verdict. */
export interface RunReplay {
  runId: string;
  /** The version the run runs on. */
  workflowVersion: number;
  status: RunStatus;
  verdict: ReplayVerdict;
  /** Set when INCOMPATIBLE; null otherwise. */
  divergence: ReplayDivergence | null;
  /** The differences of a COMPATIBLE run (at most 20). */
  differences: ReplayDifference[];
  /** Why an UNREPLAYABLE run could not be replayed; empty otherwise. */
  unreplayableReason: string;
  /** Events rebuilt from the history and replayed. */
  events: number;
}

/**
 * What {@link ComposerClient.checkWorkflowVersion} found, summed over every page: how many runs it
 * replayed, the count of each verdict, and every run that is not identical.
 */
export interface WorkflowVersionCheck {
  checked: number;
  identical: number;
  compatible: number;
  incompatible: number;
  unreplayable: number;
  /** Every run replayed that is not IDENTICAL, newest first, with its verdict. */
  runs: RunReplay[];
}

export function runReplayFromWire(r: WireRunReplay | undefined): RunReplay {
  if (!r) throw new TypeError("the server's answer carries no replay");
  const d = r.divergence;
  return {
    runId: r.runId,
    workflowVersion: r.workflowVersion,
    status: RUN_STATUSES[r.status] ?? "UNSPECIFIED",
    verdict: REPLAY_VERDICTS[r.verdict] ?? "UNSPECIFIED",
    divergence: d ? { rule: d.rule, nodeId: d.nodeId, sequence: Number(d.sequence), message: d.message } : null,
    differences: r.differences.map((each) => ({ kind: each.kind, nodeId: each.nodeId, message: each.message })),
    unreplayableReason: r.unreplayableReason,
    events: r.events,
  };
}

/** Adds one page of CheckWorkflowVersion's counts and runs to `check`. */
export function addCheckPage(check: WorkflowVersionCheck, page: WireCheckPage): void {
  check.checked += page.checked;
  check.identical += page.identical;
  check.compatible += page.compatible;
  check.incompatible += page.incompatible;
  check.unreplayable += page.unreplayable;
  for (const run of page.runs) check.runs.push(runReplayFromWire(run));
}
