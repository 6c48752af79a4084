// One run, live: its graph coloured by node state (WatchRun), the selected node's detail, the
// actions its role allows, its input / output / error and its history.
import { useMemo, useState } from "react";

import { ErrorBanner, JsonBlock, Section, StatusBadge } from "../components/common";
import { HistoryTimeline } from "../components/HistoryTimeline";
import { NodeDetail } from "../components/NodeDetail";
import { RunActions } from "../components/RunActions";
import { WorkflowGraphView } from "../components/WorkflowGraphView";
import { useApp } from "../context";
import { duration, time } from "../format";
import { graphOf } from "../graph/definition";
import { layoutGraph } from "../graph/layout";
import { nodeViews } from "../graph/status";
import { lastMigration, withCurrentNodeIds } from "../history";
import { useHistory, usePolled, useWatchedRun } from "../hooks";
import { Link, runPath, workflowPath } from "../router";

export function RunPage({ runId }: { runId: string }) {
  const { client, session } = useApp();
  const { run, error, restart } = useWatchedRun(runId);
  const [selected, setSelected] = useState<string | null>(null);
  const workflowKey = run ? `${run.workflowName}@${run.workflowVersion}` : "";
  const workflow = usePolled(
    async (signal) => (run ? client.getWorkflow(run.workflowName, run.workflowVersion, { signal }) : null),
    workflowKey,
  );
  const graph = useMemo(() => (workflow.data ? graphOf(workflow.data.definition) : null), [workflow.data]);
  const layout = useMemo(() => (graph ? layoutGraph(graph) : null), [graph]);
  const views = useMemo(() => nodeViews(run?.nodes ?? []), [run]);
  // the version too: a move to another version (MigrateRuns) writes history
  const history = useHistory(runId, `${run?.updateTime?.getTime() ?? 0}|${run?.status ?? ""}|${run?.workflowVersion ?? 0}`);
  const events = useMemo(() => withCurrentNodeIds(history.data ?? []), [history.data]);
  const moved = useMemo(() => lastMigration(events), [events]);

  if (!run) {
    return (
      <section className="panel">
        <h1>Run {runId}</h1>
        {error ? <ErrorBanner error={error} /> : <p aria-live="polite">Loading…</p>}
      </section>
    );
  }
  const selectedNode = graph?.nodes.find((n) => n.id === selected) ?? null;
  return (
    <div className="run-page">
      <section className="panel run-header" aria-labelledby="run-title">
        <h1 id="run-title">
          Run <span className="mono">{run.runId}</span> <StatusBadge status={run.status} />
        </h1>
        <dl className="facts inline-facts">
          <dt>Workflow</dt>
          <dd>
            <Link href={workflowPath(run.workflowName, run.workflowVersion)}>
              {run.workflowName} v{run.workflowVersion}
            </Link>
            {moved && moved.toVersion === run.workflowVersion ? <span className="sub"> (moved from v{moved.fromVersion})</span> : null}
          </dd>
          <dt>Created</dt>
          <dd>{time(run.createTime)}</dd>
          <dt>Duration</dt>
          <dd>{duration(run.createTime, run.endTime)}</dd>
          {run.concurrencyKey ? (
            <>
              <dt>Concurrency key</dt>
              <dd>
                <span className="mono">{run.concurrencyKey}</span>
                {run.status === "QUEUED" ? <span className="sub"> (waiting for a slot of this key)</span> : null}
              </dd>
            </>
          ) : null}
          {run.idempotencyKey ? (
            <>
              <dt>Idempotency key</dt>
              <dd className="mono">{run.idempotencyKey}</dd>
            </>
          ) : null}
          {run.parentRunId ? (
            <>
              <dt>Parent</dt>
              <dd>
                <Link className="mono" href={runPath(run.parentRunId)}>
                  {run.parentRunId}
                </Link>{" "}
                <span className="mono sub">{run.parentNodeId}</span>
              </dd>
            </>
          ) : null}
          {Object.keys(run.labels).length > 0 ? (
            <>
              <dt>Labels</dt>
              <dd>
                {Object.entries(run.labels).map(([k, v]) => (
                  <span key={k} className="label-chip">
                    {k}={v}
                  </span>
                ))}
              </dd>
            </>
          ) : null}
        </dl>
        {session.can.startRun ? (
          <p>
            <Link href={workflowPath(run.workflowName, run.workflowVersion)}>Start another run of this workflow</Link>
          </p>
        ) : null}
        <ErrorBanner error={error} />
      </section>
      <RunActions run={run} graph={graph} onResumed={restart} />
      {run.error ? (
        <Section title="Run error">
          <p className="mono">
            {run.error.code}: {run.error.message}
            {run.error.nodeId ? ` (node ${run.error.nodeId})` : ""}
          </p>
          {run.error.details !== null ? <JsonBlock value={run.error.details} label="Run error details" /> : null}
        </Section>
      ) : null}
      <div className="graph-and-detail">
        <Section title="Graph">
          <ErrorBanner error={workflow.error} />
          {layout ? (
            <WorkflowGraphView layout={layout} views={views} selected={selected} onSelect={setSelected} label={`Graph of ${run.workflowName} v${run.workflowVersion}`} />
          ) : (
            <p aria-live="polite">Loading the definition…</p>
          )}
          <Legend />
        </Section>
        {selectedNode ? (
          <NodeDetail run={run} node={selectedNode} view={views.get(selectedNode.id)} history={events} onClose={() => setSelected(null)} />
        ) : null}
      </div>
      <div className="two-columns">
        <Section title="Input">
          <JsonBlock value={run.input} label="Run input" />
        </Section>
        <Section title="Output">
          {run.status === "COMPLETED" ? <JsonBlock value={run.output} label="Run output" /> : <p className="sub">Once the run completes.</p>}
        </Section>
      </div>
      <Section title="History">
        <ErrorBanner error={history.error} />
        <HistoryTimeline events={events} highlight={selected} />
      </Section>
    </div>
  );
}

function Legend() {
  const states = ["not-started", "scheduled", "running", "waiting", "completed", "failed", "skipped", "cancelled"];
  return (
    <ul className="legend" aria-label="Legend">
      {states.map((s) => (
        <li key={s} className={`legend-item status-${s}`}>
          {s.replace("-", " ")}
        </li>
      ))}
    </ul>
  );
}
