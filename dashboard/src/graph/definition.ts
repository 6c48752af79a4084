// A workflow definition (GetWorkflow's parsed `definition`, the same JSON the server runs) as the
// nodes and edges the graph draws. Node types and fields: docs/language.md.
import type { Json } from "@composer-dev/composer/web";

export type NodeKind =
  | "TASK"
  | "HTTP"
  | "CODE"
  | "SWITCH"
  | "FORK"
  | "JOIN"
  | "WAIT"
  | "WAIT_FOR_EVENT"
  | "SUB_WORKFLOW"
  | "MAP"
  | "OTHER";

export interface GraphNode {
  id: string;
  kind: NodeKind;
  /** The type as written, for display. */
  type: string;
  /** One line under the id: the task, the event, the child workflow... */
  detail: string;
  /** WAIT_FOR_EVENT: the event it waits for. */
  event: string;
  /** SUB_WORKFLOW, or a MAP of child runs: the workflow it starts. */
  workflow: string;
  /** Named by some node's `compensate`: has no edges, runs only when compensating. */
  compensation: boolean;
  /** The node's `input` as written (expressions unevaluated); null when it takes the run's input. */
  input: Json;
}

export interface GraphEdge {
  from: string;
  to: string;
  when: string;
  /** An `on: error` edge, taken only when `from` failed. */
  onError: boolean;
}

export interface WorkflowGraph {
  nodes: GraphNode[];
  edges: GraphEdge[];
  inputSchema: Json;
}

const KINDS: readonly NodeKind[] = ["TASK", "HTTP", "CODE", "SWITCH", "FORK", "JOIN", "WAIT", "WAIT_FOR_EVENT", "SUB_WORKFLOW", "MAP"];

function text(value: unknown): string {
  return typeof value === "string" ? value : typeof value === "number" ? String(value) : "";
}

function detailOf(kind: NodeKind, node: Record<string, unknown>): string {
  switch (kind) {
    case "TASK":
      return `${text(node["queue"])} / ${text(node["task"])}`;
    case "HTTP": {
      const http = (node["http"] ?? {}) as Record<string, unknown>;
      return `${text(http["method"])} ${text(http["url"])}`;
    }
    case "CODE":
      return text(node["language"]);
    case "WAIT":
      return text(node["duration"]) || text(node["until"]);
    case "WAIT_FOR_EVENT":
      return `event ${text(node["event"])}`;
    case "SUB_WORKFLOW":
      return `workflow ${text(node["workflow"])}`;
    case "MAP":
      return node["workflow"] ? `each: workflow ${text(node["workflow"])}` : `each: ${text(node["task"])}`;
    default:
      return "";
  }
}

/** The graph of a definition; tolerant of missing fields (it draws what is there). */
export function graphOf(definition: Json): WorkflowGraph {
  const doc = (definition && typeof definition === "object" && !Array.isArray(definition) ? definition : {}) as Record<string, unknown>;
  const rawNodes = Array.isArray(doc["nodes"]) ? (doc["nodes"] as Record<string, unknown>[]) : [];
  const rawEdges = Array.isArray(doc["edges"]) ? (doc["edges"] as Record<string, unknown>[]) : [];
  const compensations = new Set(rawNodes.map((n) => text(n["compensate"])).filter(Boolean));
  const nodes = rawNodes.map((n): GraphNode => {
    const type = text(n["type"]).toUpperCase();
    const kind = (KINDS as readonly string[]).includes(type) ? (type as NodeKind) : "OTHER";
    const id = text(n["id"]);
    return {
      id,
      kind,
      type,
      detail: detailOf(kind, n),
      event: text(n["event"]),
      workflow: text(n["workflow"]),
      compensation: compensations.has(id),
      input: (n["input"] ?? null) as Json,
    };
  });
  const edges = rawEdges.map(
    (e): GraphEdge => ({ from: text(e["from"]), to: text(e["to"]), when: text(e["when"]), onError: text(e["on"]).toLowerCase() === "error" }),
  );
  return { nodes, edges, inputSchema: (doc["input_schema"] ?? null) as Json };
}
