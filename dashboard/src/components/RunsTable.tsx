// A page of runs. Arrow keys move between rows (each row's id is a link: Enter opens the run);
// with `selection`, each row has a checkbox for bulk actions.
import type { KeyboardEvent } from "react";
import type { Run } from "@composer-dev/composer/web";

import { duration, time } from "../format";
import { Link, runPath, workflowPath } from "../router";
import { StatusBadge } from "./common";

interface Props {
  runs: Run[];
  caption: string;
  selection?: { selected: Set<string>; toggle: (runId: string) => void; toggleAll: (on: boolean) => void };
  showError?: boolean;
}

function moveFocus(event: KeyboardEvent<HTMLTableSectionElement>): void {
  if (event.key !== "ArrowDown" && event.key !== "ArrowUp") return;
  const links = Array.from(event.currentTarget.querySelectorAll<HTMLAnchorElement>("a.run-link"));
  const at = links.indexOf(document.activeElement as HTMLAnchorElement);
  const next = links[Math.min(links.length - 1, Math.max(0, at + (event.key === "ArrowDown" ? 1 : -1)))];
  if (next) {
    event.preventDefault();
    next.focus();
  }
}

export function RunsTable({ runs, caption, selection, showError = false }: Props) {
  const all = selection !== undefined && runs.length > 0 && runs.every((r) => selection.selected.has(r.runId));
  return (
    <table className="runs">
      <caption className="visually-hidden">{caption}</caption>
      <thead>
        <tr>
          {selection ? (
            <th scope="col" className="check">
              <input type="checkbox" aria-label="Select every run on this page" checked={all} onChange={(e) => selection.toggleAll(e.target.checked)} />
            </th>
          ) : null}
          <th scope="col">Run</th>
          <th scope="col">Workflow</th>
          <th scope="col">Status</th>
          <th scope="col">Created</th>
          <th scope="col">Duration</th>
          <th scope="col">{showError ? "Error" : "Labels"}</th>
        </tr>
      </thead>
      <tbody onKeyDown={moveFocus}>
        {runs.map((run) => (
          <tr key={run.runId} data-run={run.runId}>
            {selection ? (
              <td className="check">
                <input
                  type="checkbox"
                  aria-label={`Select run ${run.runId}`}
                  checked={selection.selected.has(run.runId)}
                  onChange={() => selection.toggle(run.runId)}
                />
              </td>
            ) : null}
            <td>
              <Link className="run-link mono" href={runPath(run.runId)}>
                {run.runId}
              </Link>
              {run.idempotencyKey ? <div className="sub mono">{run.idempotencyKey}</div> : null}
            </td>
            <td>
              <Link href={workflowPath(run.workflowName, run.workflowVersion)}>{run.workflowName}</Link> <span className="sub">v{run.workflowVersion}</span>
            </td>
            <td>
              <StatusBadge status={run.status} />
            </td>
            <td>{time(run.createTime)}</td>
            <td>{duration(run.createTime, run.endTime)}</td>
            <td>
              {showError && run.error ? (
                <span className="mono">
                  {run.error.code}: {run.error.message}
                </span>
              ) : (
                Object.entries(run.labels).map(([k, v]) => (
                  <span key={k} className="label-chip">
                    {k}={v}
                  </span>
                ))
              )}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}
