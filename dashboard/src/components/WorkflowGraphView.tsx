// The workflow's graph in SVG: one shape per node type (FORK, JOIN, SWITCH, MAP, SUB_WORKFLOW and
// the waits each look different), coloured by the run's node states, or marked by how a version
// changed them (added, removed, changed: in words as well as in colour); a node is a button.
import { memo, useId, type KeyboardEvent, type ReactElement } from "react";

import type { NodeChange } from "../graph/diff";
import type { GraphLayout, PlacedEdge, PlacedNode } from "../graph/layout";
import { statusClass, statusLabel, type NodeView } from "../graph/status";

interface Props {
  layout: GraphLayout;
  views?: Map<string, NodeView>;
  selected?: string | null;
  onSelect?: (nodeId: string) => void;
  label: string;
  /** How each node changed between two versions; shown instead of a run's state. */
  marks?: ReadonlyMap<string, NodeChange>;
}

/** The word a changed node carries, with a sign that reads without colour. */
export function changeLabel(change: NodeChange): string {
  switch (change) {
    case "added":
      return "+ added";
    case "removed":
      return "− removed";
    case "changed":
      return "~ changed";
    default:
      return "";
  }
}

function clip(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

function shapeOf({ node, width: w, height: h }: PlacedNode): ReactElement {
  const x = -w / 2;
  const y = -h / 2;
  switch (node.kind) {
    case "SWITCH":
      return <polygon className="shape" points={`0,${y} ${w / 2},0 0,${-y} ${x},0`} />;
    case "FORK":
      // wide at the bottom: one way in, many ways out
      return <polygon className="shape" points={`${x + 22},${y} ${-x - 22},${y} ${-x},${-y} ${x},${-y}`} />;
    case "JOIN":
      // wide at the top: many ways in, one way out
      return <polygon className="shape" points={`${x},${y} ${-x},${y} ${-x - 22},${-y} ${x + 22},${-y}`} />;
    case "WAIT":
      return <rect className="shape" x={x} y={y} width={w} height={h} rx={h / 2} />;
    case "WAIT_FOR_EVENT":
      return <polygon className="shape" points={`${x + 14},${y} ${-x - 14},${y} ${-x},0 ${-x - 14},${-y} ${x + 14},${-y} ${x},0`} />;
    case "MAP":
      // a stack: one node, many items
      return (
        <>
          <rect className="shape shadow" x={x + 8} y={y - 8} width={w} height={h} rx={6} />
          <rect className="shape shadow" x={x + 4} y={y - 4} width={w} height={h} rx={6} />
          <rect className="shape" x={x} y={y} width={w} height={h} rx={6} />
        </>
      );
    case "SUB_WORKFLOW":
      // the flowchart "predefined process": a box with double sides
      return (
        <>
          <rect className="shape" x={x} y={y} width={w} height={h} rx={2} />
          <line className="inner" x1={x + 9} y1={y} x2={x + 9} y2={-y} />
          <line className="inner" x1={-x - 9} y1={y} x2={-x - 9} y2={-y} />
        </>
      );
    default:
      return <rect className="shape" x={x} y={y} width={w} height={h} rx={6} />;
  }
}

function progress(view: NodeView | undefined): string {
  if (!view) return "";
  const elements = view.elements.filter(Boolean);
  if (elements.length > 0) {
    const done = elements.filter((e) => e.status === "COMPLETED").length;
    return `${done}/${elements.length} items`;
  }
  return view.attempt > 1 ? `attempt ${view.attempt}` : "";
}

const GraphNodeShape = memo(function GraphNodeShape({
  placed,
  view,
  selected,
  onSelect,
  mark,
}: {
  placed: PlacedNode;
  view: NodeView | undefined;
  selected: boolean;
  onSelect: ((id: string) => void) | undefined;
  mark: NodeChange | undefined;
}) {
  const { node } = placed;
  const status = view?.status ?? "NOT_STARTED";
  const thin = node.kind === "FORK" || node.kind === "JOIN";
  const extra = progress(view);
  // a version's graph has no run: the line under the work says how the node changed, if it did
  const stateText = mark ? changeLabel(mark) : [statusLabel(status), extra].filter(Boolean).join(" · ");
  const spoken = mark ? (mark === "unchanged" ? "unchanged" : mark) : `${statusLabel(status)}${extra ? `, ${extra}` : ""}`;
  const key = (event: KeyboardEvent<SVGGElement>): void => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      onSelect?.(node.id);
    }
  };
  const classes = [
    "node",
    `kind-${node.kind.toLowerCase()}`,
    mark ? `change-${mark}` : statusClass(status),
    selected ? "selected" : "",
    node.compensation ? "compensation" : "",
  ];
  return (
    <g
      className={classes.join(" ")}
      transform={`translate(${placed.x},${placed.y})`}
      data-node={node.id}
      data-status={status}
      {...(mark ? { "data-change": mark } : {})}
      {...(onSelect
        ? { role: "button", tabIndex: 0, onClick: () => onSelect(node.id), onKeyDown: key, "aria-pressed": selected }
        : { role: "img" })}
      aria-label={`${node.type} ${node.id}: ${spoken}`}
    >
      {shapeOf(placed)}
      {thin ? (
        <text className="title" y={4}>
          {clip(`${mark && mark !== "unchanged" ? `${changeLabel(mark).slice(0, 1)} ` : ""}${node.kind} ${node.id}`, 24)}
        </text>
      ) : (
        <>
          <text className="title" y={-8}>
            {clip(node.id, 24)}
          </text>
          <text className="detail" y={7}>
            {clip(node.detail || node.type, 28)}
          </text>
          <text className="state" y={21}>
            {clip(stateText, 28)}
          </text>
        </>
      )}
    </g>
  );
});

function edgePath(points: PlacedEdge["points"]): string {
  return points.map((p, i) => `${i === 0 ? "M" : "L"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
}

export function WorkflowGraphView({ layout, views, selected = null, onSelect, label, marks }: Props) {
  // several graphs can share a page (two versions side by side): each its own arrowhead id
  const arrow = `arrow-${useId().replace(/[^A-Za-z0-9_-]/g, "")}`;
  return (
    <div className="graph-scroll">
      <svg
        className="graph"
        width={Math.max(layout.width, 200)}
        height={Math.max(layout.height, 80)}
        viewBox={`0 0 ${Math.max(layout.width, 200)} ${Math.max(layout.height, 80)}`}
        role="group"
        aria-label={label}
      >
        <defs>
          <marker id={arrow} viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
            <path d="M0,0 L10,5 L0,10 z" className="arrowhead" />
          </marker>
        </defs>
        {layout.edges.map(({ edge, points }, i) => {
          const mid = points[Math.floor(points.length / 2)];
          const skipped = views?.get(edge.to)?.status === "SKIPPED";
          return (
            <g key={i} className={`edge${edge.onError ? " on-error" : ""}${skipped ? " skipped" : ""}`}>
              <path d={edgePath(points)} markerEnd={`url(#${arrow})`} />
              {(edge.when || edge.onError) && mid ? (
                <text x={mid.x + 6} y={mid.y} className="edge-label">
                  <title>{edge.when || "on error"}</title>
                  {clip(edge.onError ? `on error${edge.when ? `: ${edge.when}` : ""}` : edge.when, 30)}
                </text>
              ) : null}
            </g>
          );
        })}
        {layout.nodes.map((placed) => (
          <GraphNodeShape
            key={placed.node.id}
            placed={placed}
            view={views?.get(placed.node.id)}
            selected={selected === placed.node.id}
            onSelect={onSelect}
            mark={marks?.get(placed.node.id)}
          />
        ))}
      </svg>
    </div>
  );
}
