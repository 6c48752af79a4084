// One workflow: its versions, the chosen version's source and graph, its runs, "start a run", two
// versions side by side with what changed, and a check of the runs in flight against a version.
import { useMemo } from "react";

import { listWorkflowVersions } from "../api";
import { ErrorBanner, Section } from "../components/common";
import { StartRunForm } from "../components/StartRunForm";
import { VersionCheck } from "../components/VersionCheck";
import { VersionCompare } from "../components/VersionCompare";
import { WorkflowGraphView } from "../components/WorkflowGraphView";
import { useApp } from "../context";
import { time } from "../format";
import { graphOf } from "../graph/definition";
import { layoutGraph } from "../graph/layout";
import { usePolled } from "../hooks";
import { Link, navigate, useLocation, workflowPath } from "../router";

export function WorkflowPage({ name }: { name: string }) {
  const { client, session } = useApp();
  const { query } = useLocation();
  const versions = usePolled((signal) => listWorkflowVersions(client, name, signal), name);
  const chosen = Number(query.get("version") ?? 0) || versions.data?.[0]?.version || 0;
  const workflow = usePolled((signal) => client.getWorkflow(name, chosen, { signal }), `${name}@${chosen}`);
  const graph = useMemo(() => (workflow.data ? graphOf(workflow.data.definition) : null), [workflow.data]);
  const layout = useMemo(() => (graph ? layoutGraph(graph) : null), [graph]);
  const version = workflow.data?.version ?? chosen;
  // compared: `?from=&to=`, else the newest version and the one before it
  const compareTo = Number(query.get("to") ?? 0) || versions.data?.[0]?.version || 0;
  const compareFrom = Number(query.get("from") ?? 0) || versions.data?.[1]?.version || 0;
  const pickCompared = (from: number, to: number): void => {
    const next = new URLSearchParams(query);
    next.set("from", String(from));
    next.set("to", String(to));
    navigate(`${window.location.pathname}?${next.toString()}`, { replace: true });
  };

  return (
    <div className="workflow-page">
      <section className="panel" aria-labelledby="workflow-title">
        <h1 id="workflow-title">
          {name} {version ? <span className="sub">v{version}</span> : null}
        </h1>
        {workflow.data?.description ? <p>{workflow.data.description}</p> : null}
        <p>
          <Link href={`/runs?workflow=${encodeURIComponent(name)}${version ? `&version=${version}` : ""}`}>Runs of this version</Link>
        </p>
        <ErrorBanner error={versions.error ?? workflow.error} />
        <nav aria-label="Versions" className="versions">
          <ul>
            {(versions.data ?? []).map((v) => (
              <li key={v.version}>
                <Link href={workflowPath(name, v.version)} aria-current={v.version === version ? "page" : undefined}>
                  v{v.version}
                </Link>{" "}
                <span className="sub">{time(v.createTime)}</span>
              </li>
            ))}
          </ul>
        </nav>
      </section>
      {session.can.startRun && workflow.data && graph ? (
        <Section title="Start a run">
          <StartRunForm key={version} workflow={name} version={version} inputSchema={graph.inputSchema} />
        </Section>
      ) : null}
      <div className="two-columns">
        <Section title="Graph">{layout ? <WorkflowGraphView layout={layout} label={`Graph of ${name} v${version}`} /> : null}</Section>
        <Section title="Source">
          <pre className="source" tabIndex={0} aria-label={`Source of ${name} v${version}`}>
            {workflow.data?.source ?? ""}
          </pre>
        </Section>
      </div>
      {versions.data && compareFrom && compareTo ? (
        <Section title="Compare versions">
          <VersionCompare name={name} versions={versions.data} from={compareFrom} to={compareTo} onPick={pickCompared} />
        </Section>
      ) : null}
      {compareTo ? (
        <Section title="Runs in flight">
          <VersionCheck key={`${name}@${compareTo}`} name={name} version={compareTo} />
        </Section>
      ) : null}
    </div>
  );
}
