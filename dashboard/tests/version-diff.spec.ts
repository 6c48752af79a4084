// The pure parts of comparing versions, without a browser or a server: the node-by-node diff of two
// definitions (src/graph/diff.ts) and how a run's history reads after a move (src/history.ts).
import type { HistoryEvent, Json } from "@composer-dev/composer/web";
import { expect, test } from "@playwright/test";

import { diffDefinitions } from "../src/graph/diff";
import { lastMigration, migrationOf, migrationText, withCurrentNodeIds } from "../src/history";

const task = (id: string, name: string, extra: Record<string, Json> = {}): Json => ({ id, type: "TASK", queue: "q", task: name, ...extra });
const edge = (from: string, to: string, extra: Record<string, Json> = {}): Json => ({ from, to, ...extra });

const V1: Json = {
  name: "order",
  nodes: [task("A", "a"), task("B", "b"), task("C", "c")],
  edges: [edge("A", "B"), edge("B", "C")],
  output: "${nodes.C.output}",
};

test.describe("diffDefinitions", () => {
  test("an identical definition has no change, whatever the key order", () => {
    const reordered: Json = {
      output: "${nodes.C.output}",
      edges: [{ to: "B", from: "A" }, { to: "C", from: "B" }],
      nodes: [{ task: "a", queue: "q", type: "TASK", id: "A" }, task("B", "b"), task("C", "c")],
      name: "order",
    };
    const diff = diffDefinitions(V1, reordered);
    expect(diff.nodes.map((n) => [n.id, n.change])).toEqual([
      ["A", "unchanged"],
      ["B", "unchanged"],
      ["C", "unchanged"],
    ]);
    expect([diff.added, diff.removed, diff.changed, diff.workflow]).toEqual([[], [], [], []]);
  });

  test("a node appended is added, and the node that now leads to it changed its next nodes", () => {
    const v2: Json = { ...(V1 as object), nodes: [task("A", "a"), task("B", "b"), task("C", "c"), task("D", "d")], edges: [edge("A", "B"), edge("B", "C"), edge("C", "D")] };
    const diff = diffDefinitions(V1, v2);
    expect(diff.added).toEqual(["D"]);
    expect(diff.changed).toEqual(["C"]);
    expect(diff.byId.get("C")?.fields).toEqual([{ field: "next", before: "", after: "D" }]);
    expect(diff.removed).toEqual([]);
  });

  test("a node's task, queue, type and input template are compared field by field", () => {
    const v2: Json = {
      ...(V1 as object),
      nodes: [task("A", "a", { input: { order: "${input.id}" } }), { id: "B", type: "HTTP", http: { url: "https://x" } }, task("C", "c2", { queue: "q2" })],
    };
    const diff = diffDefinitions(V1, v2);
    expect(diff.changed).toEqual(["A", "B", "C"]);
    expect(diff.byId.get("A")?.fields).toEqual([{ field: "input", before: "", after: '{"order":"${input.id}"}' }]);
    expect(diff.byId.get("B")?.fields.map((f) => f.field)).toEqual(["http", "queue", "task", "type"]);
    expect(diff.byId.get("C")?.fields).toEqual([
      { field: "queue", before: "q", after: "q2" },
      { field: "task", before: "c", after: "c2" },
    ]);
  });

  test("a node gone is removed and listed after the newer version's nodes", () => {
    const v2: Json = { ...(V1 as object), nodes: [task("A", "a"), task("C", "c")], edges: [edge("A", "C")] };
    const diff = diffDefinitions(V1, v2);
    expect(diff.nodes.map((n) => [n.id, n.change])).toEqual([
      ["A", "changed"],
      ["C", "unchanged"],
      ["B", "removed"],
    ]);
    expect(diff.byId.get("A")?.fields).toEqual([{ field: "next", before: "B", after: "C" }]);
  });

  test("conditions and error edges are part of a node's edges; a SWITCH's edge order counts, a FORK's does not", () => {
    const base: Json = {
      nodes: [{ id: "S", type: "SWITCH" }, { id: "F", type: "FORK" }, task("X", "x"), task("Y", "y")],
      edges: [edge("S", "X", { when: "input.n > 1" }), edge("S", "Y"), edge("F", "X"), edge("F", "Y"), edge("X", "Y", { on: "error" })],
    };
    const reordered: Json = {
      nodes: [{ id: "S", type: "SWITCH" }, { id: "F", type: "FORK" }, task("X", "x"), task("Y", "y")],
      edges: [edge("S", "Y"), edge("S", "X", { when: "input.n > 2" }), edge("F", "Y"), edge("F", "X"), edge("X", "Y")],
    };
    const diff = diffDefinitions(base, reordered);
    expect(diff.changed).toEqual(["S", "X"]);
    expect(diff.byId.get("S")?.fields).toEqual([{ field: "next", before: "X when input.n > 1, Y", after: "Y, X when input.n > 2" }]);
    expect(diff.byId.get("X")?.fields).toEqual([{ field: "next", before: "Y on error", after: "Y" }]);
  });

  test("workflow fields other than nodes and edges are listed apart", () => {
    const v2: Json = { ...(V1 as object), output: "${nodes.B.output}", input_schema: { type: "object" } };
    const diff = diffDefinitions(V1, v2);
    expect(diff.workflow.map((f) => f.field)).toEqual(["input_schema", "output"]);
    expect(diff.changed).toEqual([]);
  });

  test("a definition that is not an object diffs as empty, without throwing", () => {
    const diff = diffDefinitions(null, V1);
    expect(diff.added).toEqual(["A", "B", "C"]);
    expect(diffDefinitions(V1, "nonsense").removed).toEqual(["A", "B", "C"]);
  });
});

function entry(sequence: number, eventType: string, nodeId = "", details: Json = {}): HistoryEvent {
  return { sequence: BigInt(sequence), eventTime: new Date(0), eventType, nodeId, attempt: nodeId ? 1 : 0, actor: "server", details };
}

test.describe("run_migrated in a run's history", () => {
  const history = [
    entry(1, "run_started"),
    entry(2, "node_scheduled", "A"),
    entry(3, "node_scheduled", "fan[0]"),
    entry(4, "run_migrated", "", { from_version: 1, to_version: 2, node_mapping: { A: "A2", fan: "spread" } }),
    entry(5, "node_completed", "A2"),
    entry(6, "run_migrated", "", { from_version: 2, to_version: 3, node_mapping: {} }),
    entry(7, "run_migrated", "", { from_version: 3, to_version: 4, node_mapping: { A2: "A3" } }),
  ];

  test("reads as a sentence with its renames", () => {
    const first = migrationOf(history[3] as HistoryEvent);
    expect(first).toEqual({ fromVersion: 1, toVersion: 2, renames: [["A", "A2"], ["fan", "spread"]] });
    expect(migrationText(first!)).toBe("moved from v1 to v2, renaming A → A2, fan → spread");
    expect(migrationText(migrationOf(history[5] as HistoryEvent)!)).toBe("moved from v2 to v3");
    expect(migrationOf(history[1] as HistoryEvent)).toBeNull();
    expect(lastMigration(history)?.toVersion).toBe(4);
    expect(lastMigration(history.slice(0, 3))).toBeNull();
  });

  test("entries before a move follow their node under its new id, through every later move", () => {
    const current = withCurrentNodeIds(history).map((e) => [e.nodeId, e.currentNodeId]);
    expect(current).toEqual([
      ["", ""],
      ["A", "A3"],
      ["fan[0]", "spread[0]"],
      ["", ""],
      ["A2", "A3"],
      ["", ""],
      ["", ""],
    ]);
  });
});
