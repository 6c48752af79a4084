// Lays out and draws an N-node workflow graph with the dashboard's own code (definition → dagre
// layout → SVG through React), timing the whole path to the next frame, and publishes the times
// on window.benchResult for bench/graph.bench.spec.ts.
import { flushSync } from "react-dom";
import { createRoot } from "react-dom/client";
import type { Json } from "@composer-dev/composer/web";

import { WorkflowGraphView } from "../src/components/WorkflowGraphView";
import { graphOf } from "../src/graph/definition";
import { layoutGraph } from "../src/graph/layout";
import { nodeViews } from "../src/graph/status";
import "../src/styles.css";

declare global {
  interface Window {
    benchResult?: { nodes: number; edges: number; runs: { layoutMs: number; totalMs: number }[] };
  }
}

/** Stages of FORK → 6 branches (tasks, a MAP, a SUB_WORKFLOW, a wait) → JOIN → SWITCH, chained. */
export function bigDefinition(target: number): Json {
  const nodes: Record<string, Json>[] = [];
  const edges: Record<string, Json>[] = [];
  let previous = "";
  for (let stage = 0; nodes.length < target; stage++) {
    const fork = `fork_${stage}`;
    const join = `join_${stage}`;
    const pick = `switch_${stage}`;
    nodes.push({ id: fork, type: "FORK" });
    if (previous) edges.push({ from: previous, to: fork });
    for (let b = 0; b < 5; b++) {
      const id = `s${stage}_b${b}`;
      const node: Record<string, Json> =
        b === 3
          ? { id, type: "MAP", items: "${input.items}", queue: "q", task: "each" }
          : b === 4
            ? { id, type: "SUB_WORKFLOW", workflow: "child" }
            : { id, type: "TASK", queue: "work", task: `task_${b}` };
      nodes.push(node);
      edges.push({ from: fork, to: id }, { from: id, to: join });
    }
    nodes.push({ id: join, type: "JOIN" }, { id: pick, type: "SWITCH" });
    edges.push({ from: join, to: pick });
    const wait = `wait_${stage}`;
    nodes.push({ id: wait, type: "WAIT_FOR_EVENT", event: "go" });
    edges.push({ from: pick, to: wait, when: "input.wait == true" });
    previous = pick;
  }
  const kept = nodes.slice(0, target);
  const ids = new Set(kept.map((n) => n["id"]));
  return { name: "bench", nodes: kept, edges: edges.filter((e) => ids.has(e["from"] ?? null) && ids.has(e["to"] ?? null)) };
}

const nextFrame = (): Promise<void> => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));

async function main(): Promise<void> {
  const n = Number(new URLSearchParams(window.location.search).get("n") ?? 500);
  const definition = bigDefinition(n);
  const host = document.getElementById("root");
  if (!host) return;
  const runs: { layoutMs: number; totalMs: number }[] = [];
  let edges = 0;
  for (let i = 0; i < 5; i++) {
    const root = createRoot(host);
    await nextFrame();
    const start = performance.now();
    const graph = graphOf(definition);
    const layout = layoutGraph(graph);
    const laidOut = performance.now();
    // some nodes done, some running: the colours a live run shows
    const views = nodeViews(graph.nodes.slice(0, n / 2).map((node) => ({ nodeId: node.id, nodeType: node.type, status: "COMPLETED", attempt: 1, output: null, error: null, startTime: null, endTime: null, input: null, workerId: "", leaseExpireTime: null })));
    flushSync(() => root.render(<WorkflowGraphView layout={layout} views={views} onSelect={() => undefined} label="bench" />));
    await nextFrame();
    runs.push({ layoutMs: laidOut - start, totalMs: performance.now() - start });
    edges = layout.edges.length;
    if (i < 4) root.unmount();
  }
  window.benchResult = { nodes: definition && typeof definition === "object" && !Array.isArray(definition) ? (definition["nodes"] as Json[]).length : 0, edges, runs };
}

void main();
