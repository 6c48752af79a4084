// A layered (Sugiyama) layout of the workflow graph with dagre: top to bottom, node sizes fixed
// per kind so the layout never needs the DOM to measure text.
import { Graph, layout } from "@dagrejs/dagre";

import type { GraphEdge, GraphNode, NodeKind, WorkflowGraph } from "./definition";

export interface PlacedNode {
  node: GraphNode;
  /** Centre. */
  x: number;
  y: number;
  width: number;
  height: number;
}

export interface PlacedEdge {
  edge: GraphEdge;
  points: { x: number; y: number }[];
}

export interface GraphLayout {
  nodes: PlacedNode[];
  edges: PlacedEdge[];
  width: number;
  height: number;
}

export function sizeOf(kind: NodeKind): { width: number; height: number } {
  switch (kind) {
    case "FORK":
    case "JOIN":
      return { width: 150, height: 26 };
    case "SWITCH":
      return { width: 170, height: 76 };
    case "WAIT":
      return { width: 150, height: 56 };
    default:
      return { width: 190, height: 56 };
  }
}

export function layoutGraph(graph: WorkflowGraph): GraphLayout {
  const g = new Graph({ multigraph: true });
  g.setGraph({ rankdir: "TB", nodesep: 28, ranksep: 44, marginx: 16, marginy: 16 });
  g.setDefaultEdgeLabel(() => ({}));
  for (const node of graph.nodes) g.setNode(node.id, { ...sizeOf(node.kind) });
  const known = new Set(graph.nodes.map((n) => n.id));
  const drawn = graph.edges.filter((e) => known.has(e.from) && known.has(e.to));
  drawn.forEach((edge, i) => g.setEdge(edge.from, edge.to, {}, `e${i}`));
  layout(g);
  const nodes = graph.nodes.map((node): PlacedNode => {
    const placed = g.node(node.id) as { x: number; y: number; width: number; height: number };
    return { node, x: placed.x, y: placed.y, width: placed.width, height: placed.height };
  });
  const edges = drawn.map((edge, i): PlacedEdge => {
    const label = g.edge({ v: edge.from, w: edge.to, name: `e${i}` }) as { points?: { x: number; y: number }[] };
    return { edge, points: label.points ?? [] };
  });
  const size = g.graph() as { width?: number; height?: number };
  return { nodes, edges, width: size.width ?? 0, height: size.height ?? 0 };
}
