// The SDK's own shapes of runs, nodes, workflows and history: plain objects with JSON values,
// string statuses and Dates, converted from the generated wire messages.
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";

import {
  NodeStatus as WireNodeStatus,
  RunStatus as WireRunStatus,
  type Failure as WireFailure,
  type HistoryEvent as WireHistoryEvent,
  type NodeState as WireNodeState,
  type Run as WireRun,
  type WorkflowVersion as WireWorkflowVersion,
} from "./gen/composer/v1/common_pb.js";
import type { ValidationProblem as WireProblem } from "./gen/composer/v1/workflow_service_pb.js";
import type { SendEventResponse } from "./gen/composer/v1/run_service_pb.js";
import { fromValue, type Json } from "./values.js";

/** Where a run is. */
export type RunStatus = "RUNNING" | "COMPENSATING" | "COMPLETED" | "FAILED" | "CANCELLED" | "UNSPECIFIED";
/** Where a node is. */
export type NodeStatus = "SCHEDULED" | "RUNNING" | "WAITING" | "COMPLETED" | "FAILED" | "SKIPPED" | "CANCELLED" | "UNSPECIFIED";

const RUN_STATUSES: Record<number, RunStatus> = {
  [WireRunStatus.RUNNING]: "RUNNING",
  [WireRunStatus.COMPENSATING]: "COMPENSATING",
  [WireRunStatus.COMPLETED]: "COMPLETED",
  [WireRunStatus.FAILED]: "FAILED",
  [WireRunStatus.CANCELLED]: "CANCELLED",
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

/** The server's version, protocol version and features. */
export interface ServerInfo {
  serverVersion: string;
  protocolVersion: string;
  features: string[];
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
