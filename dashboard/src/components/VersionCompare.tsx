// Two versions of a workflow side by side: each one's graph and nodes, with the nodes the newer
// version added, removed or changed marked in words (a badge, the graph's node text and its label)
// as well as in colour, and what changed in each node, field by field.
import { useMemo, type ChangeEvent } from "react";
import type { WorkflowVersion } from "@composer-dev/composer/web";

import type { WorkflowVersionSummary } from "../api";
import { useApp } from "../context";
import { diffDefinitions, type DefinitionDiff, type FieldChange, type NodeChange, type NodeDiff } from "../graph/diff";
import { graphOf, type GraphNode } from "../graph/definition";
import { layoutGraph } from "../graph/layout";
import { usePolled } from "../hooks";
import { ErrorBanner } from "./common";
import { WorkflowGraphView, changeLabel } from "./WorkflowGraphView";

interface Props {
  name: string;
  /** Newest first. */
  versions: WorkflowVersionSummary[];
  from: number;
  to: number;
  onPick: (from: number, to: number) => void;
}

export function VersionCompare({ name, versions, from, to, onPick }: Props) {
  const { client } = useApp();
  const older = usePolled((signal) => client.getWorkflow(name, from, { signal }), `${name}@${from}`);
  const newer = usePolled((signal) => client.getWorkflow(name, to, { signal }), `${name}@${to}`);
  // the loaded definitions, only once they are the versions picked (not the last pick's)
  const olderData = older.data?.version === from ? older.data : null;
  const newerData = newer.data?.version === to ? newer.data : null;
  const diff = useMemo(() => (olderData && newerData ? diffDefinitions(olderData.definition, newerData.definition) : null), [olderData, newerData]);

  return (
    <div className="version-compare">
      <div className="filters" role="group" aria-label="Versions to compare">
        <VersionSelect label="From version" value={from} versions={versions} onChange={(v) => onPick(v, to)} />
        <VersionSelect label="To version" value={to} versions={versions} onChange={(v) => onPick(from, v)} />
      </div>
      <ErrorBanner error={older.error ?? newer.error} />
      {from === to ? <p className="hint">Pick two different versions to see what changed.</p> : null}
      {diff ? <p className="change-summary">{summary(from, to, diff)}</p> : <p aria-live="polite">Loading the definitions…</p>}
      <div className="compare">
        <VersionSide title={`v${from}`} side="from" workflow={olderData} diff={diff} />
        <VersionSide title={`v${to}`} side="to" workflow={newerData} diff={diff} />
      </div>
      {diff && olderData && newerData ? <ChangeList diff={diff} older={olderData} newer={newerData} /> : null}
    </div>
  );
}

function summary(from: number, to: number, diff: DefinitionDiff): string {
  const parts = [`${diff.added.length} added`, `${diff.removed.length} removed`, `${diff.changed.length} changed`];
  const workflow = diff.workflow.length > 0 ? `; workflow fields changed: ${diff.workflow.map((f) => f.field).join(", ")}` : "";
  return `v${from} → v${to}: nodes ${parts.join(", ")}${workflow}.`;
}

function VersionSelect({ label, value, versions, onChange }: { label: string; value: number; versions: WorkflowVersionSummary[]; onChange: (v: number) => void }) {
  const id = `compare-${label.toLowerCase().replace(/\s+/g, "-")}`;
  return (
    <div className="field narrow">
      <label htmlFor={id}>{label}</label>
      <select id={id} value={value} onChange={(e: ChangeEvent<HTMLSelectElement>) => onChange(Number(e.target.value))}>
        {versions.map((v) => (
          <option key={v.version} value={v.version}>
            v{v.version}
          </option>
        ))}
      </select>
    </div>
  );
}

function VersionSide({ title, side, workflow, diff }: { title: string; side: "from" | "to"; workflow: WorkflowVersion | null; diff: DefinitionDiff | null }) {
  const graph = useMemo(() => (workflow ? graphOf(workflow.definition) : null), [workflow]);
  const layout = useMemo(() => (graph ? layoutGraph(graph) : null), [graph]);
  const marks = useMemo(() => {
    const map = new Map<string, NodeChange>();
    // an id is in both versions (changed or not), only the "to" one (added) or only the "from" one
    // (removed), so each side's nodes find their own mark
    for (const node of graph?.nodes ?? []) {
      const mark = diff?.byId.get(node.id)?.change;
      if (mark) map.set(node.id, mark);
    }
    return map;
  }, [graph, diff]);
  return (
    <section className="compare-side" aria-label={`${title} (${side})`} data-side={side}>
      <h3>
        {title} <span className="sub">{side === "from" ? "from" : "to"}</span>
      </h3>
      {layout && graph ? (
        <>
          <WorkflowGraphView layout={layout} marks={marks} label={`Graph of ${title}, changes marked`} />
          <NodeTable title={title} nodes={graph.nodes} diff={diff} />
        </>
      ) : null}
    </section>
  );
}

function ChangeBadge({ change }: { change: NodeChange | undefined }) {
  if (!change || change === "unchanged") return <span className="sub">unchanged</span>;
  return <span className={`badge change-${change}`}>{changeLabel(change)}</span>;
}

function NodeTable({ title, nodes, diff }: { title: string; nodes: GraphNode[]; diff: DefinitionDiff | null }) {
  return (
    <table className="compare-nodes">
      <caption className="visually-hidden">Nodes of {title}</caption>
      <thead>
        <tr>
          <th scope="col">Node</th>
          <th scope="col">Type</th>
          <th scope="col">Work</th>
          <th scope="col">Change</th>
        </tr>
      </thead>
      <tbody>
        {nodes.map((node) => {
          const nodeDiff = diff?.byId.get(node.id);
          return (
            <tr key={node.id} data-node={node.id} data-change={nodeDiff?.change}>
              <th scope="row" className="mono">
                {node.id}
              </th>
              <td>{node.type}</td>
              <td className="mono clip">{node.detail}</td>
              <td>
                <ChangeBadge change={nodeDiff?.change} />
                {nodeDiff?.change === "changed" ? <span className="sub"> {nodeDiff.fields.map((f) => f.field).join(", ")}</span> : null}
              </td>
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}

function clip(text: string, max = 160): string {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

function FieldLine({ change }: { change: FieldChange }) {
  return (
    <li>
      <span className="field-name">{change.field}</span>: {change.before ? <del>{clip(change.before)}</del> : <span className="sub">(none)</span>} →{" "}
      {change.after ? <ins>{clip(change.after)}</ins> : <span className="sub">(none)</span>}
    </li>
  );
}

function ChangeList({ diff, older, newer }: { diff: DefinitionDiff; older: WorkflowVersion; newer: WorkflowVersion }) {
  const olderNodes = useMemo(() => new Map(graphOf(older.definition).nodes.map((n) => [n.id, n])), [older]);
  const newerNodes = useMemo(() => new Map(graphOf(newer.definition).nodes.map((n) => [n.id, n])), [newer]);
  const differing = diff.nodes.filter((n) => n.change !== "unchanged");
  if (differing.length === 0 && diff.workflow.length === 0) return <p className="empty">No node differs between v{older.version} and v{newer.version}.</p>;
  const work = (n: NodeDiff): string => {
    const node = (n.change === "removed" ? olderNodes : newerNodes).get(n.id);
    return node ? [node.type, node.detail].filter(Boolean).join(" ") : "";
  };
  return (
    <>
      <h3>What changed</h3>
      <ul className="changes" aria-label={`Changes from v${older.version} to v${newer.version}`}>
        {differing.map((n) => (
          <li key={n.id} data-node={n.id} data-change={n.change}>
            <ChangeBadge change={n.change} /> <span className="mono">{n.id}</span> {n.change === "changed" ? null : <span className="sub">{work(n)}</span>}
            {n.fields.length > 0 ? (
              <ul className="fields">
                {n.fields.map((f) => (
                  <FieldLine key={f.field} change={f} />
                ))}
              </ul>
            ) : null}
          </li>
        ))}
        {diff.workflow.length > 0 ? (
          <li data-change="workflow">
            <span className="badge change-changed">~ workflow</span>
            <ul className="fields">
              {diff.workflow.map((f) => (
                <FieldLine key={f.field} change={f} />
              ))}
            </ul>
          </li>
        ) : null}
      </ul>
    </>
  );
}
