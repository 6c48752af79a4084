// One node of a run: state, output, error with details, attempts and who reported them (the
// worker's token subject, from the history),
// and for MAP / SUB_WORKFLOW the items or child runs it started.
import type { HistoryEvent, NodeState, Run } from "@composer-dev/composer/web";

import { childRuns } from "../api";
import { useApp } from "../context";
import { duration, shortId, time } from "../format";
import type { GraphNode } from "../graph/definition";
import { statusLabel, type NodeView } from "../graph/status";
import type { RunHistoryEvent } from "../history";
import { usePolled } from "../hooks";
import { Link, runPath } from "../router";
import { JsonBlock, JsonLine, StatusBadge } from "./common";

interface Props {
  run: Run;
  node: GraphNode;
  view: NodeView | undefined;
  history: RunHistoryEvent[];
  onClose: () => void;
}

/** Node kinds whose `input` is handed on (to a worker, a snippet or a child run). */
const TAKES_INPUT = new Set<GraphNode["kind"]>(["TASK", "CODE", "SUB_WORKFLOW", "MAP"]);

interface Attempt {
  attempt: number;
  events: HistoryEvent[];
  worker: string;
}

/**
 * History events of this node (under any id it had before a move renamed it) grouped by attempt;
 * reports carry the actor `worker:<token subject>`.
 */
function attemptsOf(nodeId: string, history: RunHistoryEvent[]): Attempt[] {
  const byAttempt = new Map<number, Attempt>();
  for (const e of history) {
    if (e.currentNodeId !== nodeId || !e.attempt) continue;
    let a = byAttempt.get(e.attempt);
    if (!a) byAttempt.set(e.attempt, (a = { attempt: e.attempt, events: [], worker: "" }));
    a.events.push(e);
    if (e.actor.startsWith("worker:")) a.worker = e.actor.slice("worker:".length);
  }
  return [...byAttempt.values()].sort((x, y) => x.attempt - y.attempt);
}

function stateOf(run: Run, nodeId: string): NodeState | undefined {
  return run.nodes.find((n) => n.nodeId === nodeId);
}

export function NodeDetail({ run, node, view, history, onClose }: Props) {
  const state = stateOf(run, node.id);
  const attempts = attemptsOf(node.id, history);
  const lastWorker = [...attempts].reverse().find((a) => a.worker)?.worker ?? "";
  const elements = (view?.elements ?? []).filter(Boolean);
  const startsChildren = node.kind === "SUB_WORKFLOW" || (node.kind === "MAP" && node.workflow !== "");
  return (
    <aside className="panel node-detail" aria-labelledby="node-title">
      <header className="panel-header">
        <h2 id="node-title">
          {node.type} <span className="mono">{node.id}</span>
        </h2>
        <button type="button" onClick={onClose}>
          Close
        </button>
      </header>
      <dl className="facts">
        <dt>Status</dt>
        <dd>
          <StatusBadge status={statusLabel(view?.status ?? "NOT_STARTED").toUpperCase()} />
        </dd>
        {node.detail ? (
          <>
            <dt>What</dt>
            <dd className="mono">{node.detail}</dd>
          </>
        ) : null}
        <dt>Attempt</dt>
        <dd>{state?.attempt ?? 0}</dd>
        <dt>Started</dt>
        <dd>{time(state?.startTime ?? null)}</dd>
        <dt>Ended</dt>
        <dd>{time(state?.endTime ?? null)}</dd>
        <dt>Took</dt>
        <dd>{state?.startTime ? duration(state.startTime, state.endTime ?? null) : "—"}</dd>
        {state?.workerId ? (
          <>
            <dt>Worker</dt>
            <dd className="mono">{state.workerId}</dd>
          </>
        ) : null}
        {state?.leaseExpireTime ? (
          <>
            <dt>Lease ends</dt>
            <dd>{time(state.leaseExpireTime)}</dd>
          </>
        ) : null}
        {lastWorker ? (
          <>
            <dt>Reported by</dt>
            <dd className="mono">{lastWorker}</dd>
          </>
        ) : null}
      </dl>
      {state?.error ? (
        <div className="node-error" role="group" aria-label="Error">
          <h3>Error</h3>
          <p className="mono">
            {state.error.code}: {state.error.message}
          </p>
          {state.error.details !== null ? <JsonBlock value={state.error.details} label="Error details" /> : null}
        </div>
      ) : null}
      {state && state.status === "COMPLETED" ? (
        <>
          <h3>Output</h3>
          <JsonBlock value={state.output} label="Node output" />
        </>
      ) : null}
      {state && state.input !== null ? (
        <>
          <h3>Input</h3>
          <JsonBlock value={state.input} label="Node input as the worker got it" />
        </>
      ) : TAKES_INPUT.has(node.kind) ? (
        <>
          <h3>Input, as defined</h3>
          {node.input !== null ? <JsonBlock value={node.input} label="Node input as defined" /> : <p className="sub">The run's input.</p>}
        </>
      ) : null}
      {attempts.length > 0 ? (
        <>
          <h3>Attempts</h3>
          <table className="attempts">
            <thead>
              <tr>
                <th scope="col">#</th>
                <th scope="col">Reported by</th>
                <th scope="col">What happened</th>
              </tr>
            </thead>
            <tbody>
              {attempts.map((a) => (
                <tr key={a.attempt}>
                  <td>{a.attempt}</td>
                  <td className="mono">{a.worker || "—"}</td>
                  <td>
                    {a.events.map((e) => (
                      <div key={String(e.sequence)}>
                        <time dateTime={e.eventTime?.toISOString()}>{time(e.eventTime)}</time> {e.eventType}{" "}
                        {e.details !== null && Object.keys(e.details as object).length > 0 ? <code>
                            <JsonLine value={e.details} />
                          </code> : null}
                      </div>
                    ))}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      ) : null}
      {elements.length > 0 ? <MapItems elements={elements} /> : null}
      {startsChildren ? <ChildRuns run={run} nodeId={node.id} /> : null}
    </aside>
  );
}

function MapItems({ elements }: { elements: NodeState[] }) {
  return (
    <>
      <h3>Items ({elements.length})</h3>
      <table className="items">
        <thead>
          <tr>
            <th scope="col">Item</th>
            <th scope="col">Status</th>
            <th scope="col">Output or error</th>
          </tr>
        </thead>
        <tbody>
          {elements.map((e) => (
            <tr key={e.nodeId}>
              <td className="mono">{e.nodeId}</td>
              <td>
                <StatusBadge status={e.status} />
              </td>
              <td className="mono clip">{e.error ? `${e.error.code}: ${e.error.message}` : <JsonLine value={e.output} />}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </>
  );
}

/** Child runs this node started (ListRuns by parent), matched on the node or its MAP items. */
function ChildRuns({ run, nodeId }: { run: Run; nodeId: string }) {
  const { client } = useApp();
  const children = usePolled((signal) => childRuns(client, run.runId, signal), `${run.runId}|${run.updateTime?.getTime()}`);
  const mine = (children.data ?? []).filter((c) => c.parentNodeId === nodeId || c.parentNodeId.startsWith(`${nodeId}[`));
  return (
    <>
      <h3>Child runs</h3>
      {mine.length === 0 ? (
        <p className="sub">{children.loading ? "Loading…" : "None started yet."}</p>
      ) : (
        <ul className="children">
          {mine.map((c) => (
            <li key={c.runId}>
              <Link className="mono" href={runPath(c.runId)}>
                {shortId(c.runId)}
              </Link>{" "}
              {c.parentNodeId !== nodeId ? <span className="mono sub">{c.parentNodeId}</span> : null} <StatusBadge status={c.status} />
            </li>
          ))}
        </ul>
      )}
    </>
  );
}
