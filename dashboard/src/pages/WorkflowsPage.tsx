// Every workflow of the namespace with its latest version.
import { listWorkflows } from "../api";
import { Empty, ErrorBanner } from "../components/common";
import { useApp } from "../context";
import { time } from "../format";
import { usePolled } from "../hooks";
import { Link, workflowPath } from "../router";

export function WorkflowsPage() {
  const { client } = useApp();
  const workflows = usePolled((signal) => listWorkflows(client, signal), "workflows");
  return (
    <section className="panel" aria-labelledby="workflows-title">
      <h1 id="workflows-title">Workflows</h1>
      <ErrorBanner error={workflows.error} />
      {workflows.data && workflows.data.length === 0 ? <Empty>No workflow is registered in this namespace.</Empty> : null}
      {workflows.data && workflows.data.length > 0 ? (
        <table className="runs">
          <caption className="visually-hidden">Workflows by name</caption>
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">Latest version</th>
              <th scope="col">Description</th>
              <th scope="col">Updated</th>
            </tr>
          </thead>
          <tbody>
            {workflows.data.map((w) => (
              <tr key={w.name}>
                <td>
                  <Link href={workflowPath(w.name)}>{w.name}</Link>
                </td>
                <td>v{w.latestVersion}</td>
                <td>{w.description}</td>
                <td>{time(w.updateTime)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : null}
    </section>
  );
}
