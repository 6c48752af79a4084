// The dashboard's one door to the server: the SDK's browser Client over grpc-web on the page's own
// origin, with the admin's namespace header and the "token expired" hook on every call. Calls the
// SDK does not wrap the way a page needs them (one page of runs with its token, counts, workflow
// lists) go through the SDK's raw connect clients and are converted here.
import {
  Client,
  fromValue,
  toComposerError,
  type ComposerError,
  type Failure,
  type Json,
  type NodeState,
  type NodeStatus,
  type Run,
  type RunStatus,
  type WebClientOptions,
} from "@composer-dev/composer/web";

// The SDK's client wraps no SecretService call and its package exports none of its generated code:
// the service's descriptor comes from the generated source itself (never edited here), and its
// calls go through the client's own transport, so the namespace header and the expiry hook apply.
import { SecretService } from "../../sdks/typescript/src/gen/composer/v1/secret_service_pb";
import type { Session } from "./session";

type Interceptor = NonNullable<WebClientOptions["interceptors"]>[number];
type RawRuns = Client["raw"]["runs"];
type WireRun = NonNullable<Awaited<ReturnType<RawRuns["getRun"]>>["run"]>;
type WireTimestamp = WireRun["createTime"];

/** The header an admin sets to act in another namespace (docs/tokens.md). */
const NAMESPACE_HEADER = "x-composer-namespace";

/** The run statuses in wire order (`RUN_STATUSES[n - 1]` is wire status n). */
export const RUN_STATUSES: readonly RunStatus[] = ["RUNNING", "COMPENSATING", "COMPLETED", "FAILED", "CANCELLED", "PAUSED", "QUEUED"];
const RUN_STATUS_NUMBERS: Record<RunStatus, number> = { UNSPECIFIED: 0, RUNNING: 1, COMPENSATING: 2, COMPLETED: 3, FAILED: 4, CANCELLED: 5, PAUSED: 6, QUEUED: 7 };
const NODE_STATUS_NAMES: readonly NodeStatus[] = ["UNSPECIFIED", "SCHEDULED", "RUNNING", "WAITING", "COMPLETED", "FAILED", "SKIPPED", "CANCELLED"];

/** The client of one session; `onUnauthenticated` runs when the server refuses the token. */
export function makeClient(session: Session, onUnauthenticated: (message: string) => void): Client {
  const namespace: Interceptor = (next) => (request) => {
    if (session.namespace !== session.claims.namespace) request.header.set(NAMESPACE_HEADER, session.namespace);
    return next(request);
  };
  const expiry: Interceptor = (next) => async (request) => {
    try {
      return await next(request);
    } catch (error) {
      const converted = toComposerError(error);
      if (converted.code === "UNAUTHENTICATED") onUnauthenticated(converted.rawMessage);
      throw error;
    }
  };
  return new Client({ baseUrl: window.location.origin, token: session.token, interceptors: [namespace, expiry] });
}

/** A failed call as one readable line. */
export function errorText(error: unknown): string {
  const e: ComposerError = toComposerError(error);
  const violations = e.fieldViolations.map((v) => `${v.field}: ${v.description}`).join("; ");
  return `${e.code}: ${e.rawMessage}${violations ? ` (${violations})` : ""}`;
}

/** The server's own message of a failed call. */
export function rawMessage(error: unknown): string {
  return toComposerError(error).rawMessage;
}

export function isUnauthenticatedError(error: unknown): boolean {
  return toComposerError(error).code === "UNAUTHENTICATED";
}

// --- runs ----------------------------------------------------------------------------------------

/** The list filters a user sets; the same for ListRuns and CountRuns. */
export interface RunFilters {
  statuses: RunStatus[];
  workflow: string;
  /** 0: any version. */
  version: number;
  labels: Record<string, string>;
  createdAfter: Date | null;
  createdBefore: Date | null;
  /** A run id (exact) or an idempotency key (prefix). */
  search: string;
  parentRunId: string;
}

export const NO_FILTERS: RunFilters = {
  statuses: [],
  workflow: "",
  version: 0,
  labels: {},
  createdAfter: null,
  createdBefore: null,
  search: "",
  parentRunId: "",
};

export interface RunPage {
  runs: Run[];
  nextPageToken: string;
}

function timestamp(date: Date | null): { seconds: bigint; nanos: number } | undefined {
  if (!date) return undefined;
  const ms = date.getTime();
  return { seconds: BigInt(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1_000_000 };
}

function dateOf(ts: WireTimestamp): Date | null {
  return ts ? new Date(Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1_000_000)) : null;
}

function filterRequest(filters: RunFilters) {
  const after = timestamp(filters.createdAfter);
  const before = timestamp(filters.createdBefore);
  return {
    workflowName: filters.workflow,
    workflowVersion: filters.version,
    labels: { ...filters.labels },
    search: filters.search,
    parentRunId: filters.parentRunId,
    ...(after ? { createTimeAfter: after } : {}),
    ...(before ? { createTimeBefore: before } : {}),
  };
}

function failureOf(f: WireRun["error"]): Failure | null {
  return f ? { code: f.code, message: f.message, nodeId: f.nodeId, details: fromValue(f.details) } : null;
}

/** A wire run as the SDK's Run (ListRuns answers wire messages; the rest of the UI reads SDK runs). */
function runOf(r: WireRun): Run {
  const nodes: NodeState[] = r.nodes.map((n) => ({
    nodeId: n.nodeId,
    nodeType: n.nodeType,
    status: NODE_STATUS_NAMES[n.status] ?? "UNSPECIFIED",
    attempt: n.attempt,
    output: fromValue(n.output),
    error: failureOf(n.error),
    startTime: dateOf(n.startTime),
    endTime: dateOf(n.endTime),
    input: fromValue(n.input),
    workerId: n.workerId,
    leaseExpireTime: dateOf(n.leaseExpireTime),
  }));
  return {
    runId: r.runId,
    namespace: r.namespace,
    workflowName: r.workflowName,
    workflowVersion: r.workflowVersion,
    status: RUN_STATUSES[r.status - 1] ?? "UNSPECIFIED",
    input: fromValue(r.input),
    output: fromValue(r.output),
    error: failureOf(r.error),
    labels: { ...r.labels },
    idempotencyKey: r.idempotencyKey,
    parentRunId: r.parentRunId,
    parentNodeId: r.parentNodeId,
    createTime: dateOf(r.createTime),
    updateTime: dateOf(r.updateTime),
    endTime: dateOf(r.endTime),
    nodes,
    priority: r.priority,
    concurrencyKey: r.concurrencyKey,
  };
}

/** One page of runs, newest first. */
export async function listRunsPage(client: Client, filters: RunFilters, pageSize: number, pageToken: string, signal?: AbortSignal): Promise<RunPage> {
  const request = {
    ...filterRequest(filters),
    statuses: filters.statuses.map((s) => RUN_STATUS_NUMBERS[s]),
    pageSize,
    pageToken,
  };
  const response = await client.raw.runs.listRuns(request, client.callOptions(signal ? { signal } : {}));
  return { runs: response.runs.map(runOf), nextPageToken: response.nextPageToken };
}

/** How many runs match the filters (statuses aside), by status; with `more` set the server stopped counting at its limit and each count is a floor. */
export interface RunCounts {
  counts: Partial<Record<RunStatus, number>>;
  more: boolean;
}

/** How many runs match the filters (statuses aside), by status. */
export async function countRuns(client: Client, filters: RunFilters, signal?: AbortSignal): Promise<RunCounts> {
  const response = await client.raw.runs.countRuns(filterRequest(filters), client.callOptions(signal ? { signal } : {}));
  const counts: Partial<Record<RunStatus, number>> = {};
  for (const c of response.counts) {
    const status = RUN_STATUSES[c.status - 1];
    if (status) counts[status] = Number(c.count);
  }
  return { counts, more: response.more };
}

/** Every child run of a run (SUB_WORKFLOW and MAP children), newest first, up to `limit`. */
export async function childRuns(client: Client, parentRunId: string, signal?: AbortSignal, limit = 1000): Promise<Run[]> {
  const page = await listRunsPage(client, { ...NO_FILTERS, parentRunId }, limit, "", signal);
  return page.runs;
}

// --- workflows -----------------------------------------------------------------------------------

export interface WorkflowSummary {
  name: string;
  latestVersion: number;
  description: string;
  updateTime: Date | null;
}

export interface WorkflowVersionSummary {
  version: number;
  description: string;
  contentHash: string;
  createTime: Date | null;
}

/** Every workflow of the namespace, by name (fetched a page at a time). */
export async function listWorkflows(client: Client, signal?: AbortSignal): Promise<WorkflowSummary[]> {
  const out: WorkflowSummary[] = [];
  let pageToken = "";
  do {
    const r = await client.raw.workflows.listWorkflows({ pageSize: 1000, pageToken, namePrefix: "" }, client.callOptions(signal ? { signal } : {}));
    for (const w of r.workflows) out.push({ name: w.name, latestVersion: w.latestVersion, description: w.description, updateTime: dateOf(w.updateTime) });
    pageToken = r.nextPageToken;
  } while (pageToken);
  return out;
}

/** Every version of a workflow, newest first. */
export async function listWorkflowVersions(client: Client, name: string, signal?: AbortSignal): Promise<WorkflowVersionSummary[]> {
  const out: WorkflowVersionSummary[] = [];
  let pageToken = "";
  do {
    const r = await client.raw.workflows.listWorkflowVersions({ name, pageSize: 1000, pageToken }, client.callOptions(signal ? { signal } : {}));
    for (const v of r.versions) out.push({ version: v.version, description: v.description, contentHash: v.contentHash, createTime: dateOf(v.createTime) });
    pageToken = r.nextPageToken;
  } while (pageToken);
  return out;
}

// --- checking a version against the runs in flight ------------------------------------------------

/** What a version would do with a run (docs/versions.md), in wire order from 1. */
export type ReplayVerdict = "IDENTICAL" | "COMPATIBLE" | "INCOMPATIBLE" | "UNREPLAYABLE";
export const REPLAY_VERDICTS: readonly ReplayVerdict[] = ["IDENTICAL", "COMPATIBLE", "INCOMPATIBLE", "UNREPLAYABLE"];
/** CheckScope CHECK_SCOPE_IN_FLIGHT: RUNNING, COMPENSATING and PAUSED runs. */
const CHECK_SCOPE_IN_FLIGHT = 1;
/** Runs a CheckWorkflowVersion call replays (the server's default page). */
const CHECK_PAGE_SIZE = 200;

type WireRunReplay = Awaited<ReturnType<Client["raw"]["workflows"]["checkWorkflowVersion"]>>["runs"][number];

export interface RunReplay {
  runId: string;
  /** The version the run is on. */
  workflowVersion: number;
  status: RunStatus;
  verdict: ReplayVerdict | "UNSPECIFIED";
  /** INCOMPATIBLE: the first rule the version breaks. */
  divergence: { rule: string; nodeId: string; sequence: number; message: string } | null;
  /** COMPATIBLE: what differs without stopping the run. */
  differences: { kind: string; nodeId: string; message: string }[];
  /** UNREPLAYABLE: why. */
  unreplayableReason: string;
}

export interface VersionCheck {
  checked: number;
  counts: Record<ReplayVerdict, number>;
  /** Every run that is not identical. */
  runs: RunReplay[];
  /** False while pages remain. */
  done: boolean;
}

function runReplayOf(r: WireRunReplay): RunReplay {
  return {
    runId: r.runId,
    workflowVersion: r.workflowVersion,
    status: RUN_STATUSES[r.status - 1] ?? "UNSPECIFIED",
    verdict: REPLAY_VERDICTS[r.verdict - 1] ?? "UNSPECIFIED",
    divergence: r.divergence
      ? { rule: r.divergence.rule, nodeId: r.divergence.nodeId, sequence: Number(r.divergence.sequence), message: r.divergence.message }
      : null,
    differences: r.differences.map((d) => ({ kind: d.kind, nodeId: d.nodeId, message: d.message })),
    unreplayableReason: r.unreplayableReason,
  };
}

/**
 * Replays every run of workflow `name` in flight (of any version) against its version `version`
 * with CheckWorkflowVersion, a page at a time until the last; `onProgress` sees the sums so far
 * after each page (a new object each time; its `runs` is the one list, grown in place).
 */
export async function checkRunsInFlight(
  client: Client,
  name: string,
  version: number,
  onProgress: (sofar: VersionCheck) => void,
  signal?: AbortSignal,
): Promise<VersionCheck> {
  const result: VersionCheck = { checked: 0, counts: { IDENTICAL: 0, COMPATIBLE: 0, INCOMPATIBLE: 0, UNREPLAYABLE: 0 }, runs: [], done: false };
  let pageToken = "";
  do {
    const request = { name, version, scope: CHECK_SCOPE_IN_FLIGHT, pageSize: CHECK_PAGE_SIZE, pageToken };
    const r = await client.raw.workflows.checkWorkflowVersion(request, client.callOptions(signal ? { signal } : {}));
    result.checked += r.checked;
    result.counts = {
      IDENTICAL: result.counts.IDENTICAL + r.identical,
      COMPATIBLE: result.counts.COMPATIBLE + r.compatible,
      INCOMPATIBLE: result.counts.INCOMPATIBLE + r.incompatible,
      UNREPLAYABLE: result.counts.UNREPLAYABLE + r.unreplayable,
    };
    for (const run of r.runs) result.runs.push(runReplayOf(run));
    pageToken = r.nextPageToken;
    result.done = !pageToken;
    onProgress({ ...result });
  } while (pageToken);
  return result;
}

// --- secrets --------------------------------------------------------------------------------------

/** A stored secret as ListSecrets and SetSecret describe it: never its value. */
export interface SecretSummary {
  name: string;
  version: number;
  createTime: Date | null;
  updateTime: Date | null;
  updatedBy: string;
}

export interface SecretPage {
  secrets: SecretSummary[];
  nextPageToken: string;
}

function secretOf(s: { name: string; version: number; createTime?: WireTimestamp; updateTime?: WireTimestamp; updatedBy: string }): SecretSummary {
  return { name: s.name, version: s.version, createTime: dateOf(s.createTime), updateTime: dateOf(s.updateTime), updatedBy: s.updatedBy };
}

/** One page of the namespace's secrets, by name. */
export async function listSecretsPage(client: Client, pageSize: number, pageToken: string, signal?: AbortSignal): Promise<SecretPage> {
  const o = client.callOptions(signal ? { signal } : {});
  const r = await client.transport.unary(SecretService.method.listSecrets, o.signal, o.timeoutMs, o.headers, { pageSize, pageToken });
  return { secrets: r.message.secrets.map(secretOf), nextPageToken: r.message.nextPageToken };
}

/** Stores a new version of secret `name` (UTF-8 of `value`); the secret as it now is. */
export async function setSecret(client: Client, name: string, value: string): Promise<SecretSummary> {
  const o = client.callOptions();
  const input = { name, value: new TextEncoder().encode(value) };
  const r = await client.transport.unary(SecretService.method.setSecret, o.signal, o.timeoutMs, o.headers, input);
  if (!r.message.secret) throw new Error("the server answered SetSecret without describing the secret");
  return secretOf(r.message.secret);
}

/** Removes secret `name` and all its versions. */
export async function deleteSecret(client: Client, name: string): Promise<void> {
  const o = client.callOptions();
  await client.transport.unary(SecretService.method.deleteSecret, o.signal, o.timeoutMs, o.headers, { name });
}

/** The gRPC status code of a failed call, by name. */
export function errorCode(error: unknown): ComposerError["code"] {
  return toComposerError(error).code;
}

/** The field violations (google.rpc.BadRequest) of a failed call. */
export function fieldViolations(error: unknown): ComposerError["fieldViolations"] {
  return toComposerError(error).fieldViolations;
}

export type { Json, Run, RunStatus, NodeState, NodeStatus, Failure };
