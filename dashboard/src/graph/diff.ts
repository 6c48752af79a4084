// What changed between two versions of a workflow, node by node, from their definitions
// (GetWorkflow's `definition`): a node is added, removed, or changed when any of its fields (type,
// queue, task, input template, retry, ...) or its outgoing edges (`next`: targets, `when`
// conditions, `on: error`) differ. Pure, so the page and the tests compute it the same way.
import type { Json } from "@composer-dev/composer/web";

export type NodeChange = "added" | "removed" | "changed" | "unchanged";

/** One field of a node (or of the workflow) that differs, as text; "" when absent on that side. */
export interface FieldChange {
  field: string;
  before: string;
  after: string;
}

export interface NodeDiff {
  id: string;
  change: NodeChange;
  /** `changed` only: the fields that differ, in a stable order (fields by name, then `next`, its outgoing edges). */
  fields: FieldChange[];
}

export interface DefinitionDiff {
  /** The newer version's nodes in its order, then the nodes it no longer has in the older one's. */
  nodes: NodeDiff[];
  byId: ReadonlyMap<string, NodeDiff>;
  added: string[];
  removed: string[];
  changed: string[];
  /** Workflow-level fields other than `nodes` and `edges` (input_schema, output, ...) that differ. */
  workflow: FieldChange[];
}

type JsonObject = Record<string, unknown>;

/** Name and version are what is compared, not what differs; nodes and edges are diffed by node. */
const WORKFLOW_FIELDS_NOT_COMPARED = new Set(["name", "nodes", "edges"]);

function objectOf(value: unknown): JsonObject {
  return value && typeof value === "object" && !Array.isArray(value) ? (value as JsonObject) : {};
}

function listOf(value: unknown): JsonObject[] {
  return Array.isArray(value) ? value.map(objectOf) : [];
}

function idOf(value: unknown): string {
  return typeof value === "string" ? value : typeof value === "number" ? String(value) : "";
}

/** JSON with object keys sorted, so key order in the source never counts as a change. */
function canonical(value: unknown): string {
  if (value === undefined) return "";
  if (Array.isArray(value)) return `[${value.map((v) => canonical(v ?? null)).join(",")}]`;
  if (value && typeof value === "object") {
    const entries = Object.keys(value)
      .sort()
      .filter((k) => (value as JsonObject)[k] !== undefined)
      .map((k) => `${JSON.stringify(k)}:${canonical((value as JsonObject)[k])}`);
    return `{${entries.join(",")}}`;
  }
  return JSON.stringify(value);
}

/** One outgoing edge as a reader would say it: `D`, `D when x > 1`, `E on error`. */
function edgeText(edge: JsonObject): string {
  const when = typeof edge["when"] === "string" && edge["when"] ? ` when ${edge["when"]}` : "";
  const onError = idOf(edge["on"]).toLowerCase() === "error" ? " on error" : "";
  const rest = Object.keys(edge)
    .filter((k) => !["from", "to", "when", "on"].includes(k))
    .sort()
    .map((k) => ` ${k}=${canonical(edge[k])}`)
    .join("");
  return `${idOf(edge["to"])}${when}${onError}${rest}`;
}

/**
 * A node's outgoing edges as one comparable text. A SWITCH takes its first edge that holds, so
 * its order is part of its meaning; any other node follows all of them, so their order is not.
 */
function outgoing(edges: JsonObject[], nodeId: string, type: string): string {
  const texts = edges.filter((e) => idOf(e["from"]) === nodeId).map(edgeText);
  if (type.toUpperCase() !== "SWITCH") texts.sort();
  return texts.join(", ");
}

/** How a field reads in the page: strings as written, anything else as compact JSON. */
function display(value: unknown): string {
  if (value === undefined) return "";
  if (typeof value === "string") return value;
  return JSON.stringify(value);
}

function fieldChanges(older: JsonObject, newer: JsonObject, ignored: ReadonlySet<string>): FieldChange[] {
  const fields = [...new Set([...Object.keys(older), ...Object.keys(newer)])].filter((f) => !ignored.has(f)).sort();
  return fields
    .filter((f) => canonical(older[f]) !== canonical(newer[f]))
    .map((f) => ({ field: f, before: display(older[f]), after: display(newer[f]) }));
}

const NODE_ID = new Set(["id"]);

/** The diff from `older` to `newer`; tolerant of missing or malformed fields (it compares what is there). */
export function diffDefinitions(older: Json, newer: Json): DefinitionDiff {
  const olderDoc = objectOf(older);
  const newerDoc = objectOf(newer);
  const olderNodes = listOf(olderDoc["nodes"]);
  const newerNodes = listOf(newerDoc["nodes"]);
  const olderEdges = listOf(olderDoc["edges"]);
  const newerEdges = listOf(newerDoc["edges"]);
  const olderById = new Map(olderNodes.map((n) => [idOf(n["id"]), n]));
  const newerIds = new Set(newerNodes.map((n) => idOf(n["id"])));

  const nodes: NodeDiff[] = [];
  for (const node of newerNodes) {
    const id = idOf(node["id"]);
    const before = olderById.get(id);
    if (!before) {
      nodes.push({ id, change: "added", fields: [] });
      continue;
    }
    const fields = fieldChanges(before, node, NODE_ID);
    const edgesBefore = outgoing(olderEdges, id, idOf(before["type"]));
    const edgesAfter = outgoing(newerEdges, id, idOf(node["type"]));
    if (edgesBefore !== edgesAfter) fields.push({ field: "next", before: edgesBefore, after: edgesAfter });
    nodes.push({ id, change: fields.length > 0 ? "changed" : "unchanged", fields });
  }
  for (const node of olderNodes) {
    const id = idOf(node["id"]);
    if (!newerIds.has(id)) nodes.push({ id, change: "removed", fields: [] });
  }

  const ids = (change: NodeChange): string[] => nodes.filter((n) => n.change === change).map((n) => n.id);
  return {
    nodes,
    byId: new Map(nodes.map((n) => [n.id, n])),
    added: ids("added"),
    removed: ids("removed"),
    changed: ids("changed"),
    workflow: fieldChanges(olderDoc, newerDoc, WORKFLOW_FIELDS_NOT_COMPARED),
  };
}
