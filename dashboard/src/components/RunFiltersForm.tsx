// The run list's filters, kept in the address (so a filtered list can be bookmarked and shared).
import { useState, type FormEvent } from "react";

import { NO_FILTERS, RUN_STATUSES, type RunFilters, type RunStatus } from "../api";

/** `k=v, k2=v2` as labels; pieces without `=` are ignored. */
function parseLabels(text: string): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const piece of text.split(",")) {
    const at = piece.indexOf("=");
    if (at > 0) labels[piece.slice(0, at).trim()] = piece.slice(at + 1).trim();
  }
  return labels;
}

function labelsText(labels: Record<string, string>): string {
  return Object.entries(labels)
    .map(([k, v]) => `${k}=${v}`)
    .join(", ");
}

/** A Date as the value of an <input type="datetime-local"> (local time, minutes). */
function localInput(date: Date | null): string {
  if (!date) return "";
  const local = new Date(date.getTime() - date.getTimezoneOffset() * 60_000);
  return local.toISOString().slice(0, 16);
}

export function filtersFromQuery(query: URLSearchParams): RunFilters {
  const status = query.get("status");
  const date = (name: string): Date | null => {
    const v = query.get(name);
    const d = v ? new Date(v) : null;
    return d && !Number.isNaN(d.getTime()) ? d : null;
  };
  return {
    ...NO_FILTERS,
    statuses: status ? (status.split(",").filter((s) => (RUN_STATUSES as string[]).includes(s)) as RunStatus[]) : [],
    workflow: query.get("workflow") ?? "",
    version: Number(query.get("version") ?? 0) || 0,
    labels: parseLabels(query.get("labels") ?? ""),
    createdAfter: date("after"),
    createdBefore: date("before"),
    search: query.get("q") ?? "",
  };
}

export function filtersToQuery(filters: RunFilters): string {
  const q = new URLSearchParams();
  if (filters.statuses.length) q.set("status", filters.statuses.join(","));
  if (filters.workflow) q.set("workflow", filters.workflow);
  if (filters.version) q.set("version", String(filters.version));
  if (Object.keys(filters.labels).length) q.set("labels", labelsText(filters.labels));
  if (filters.createdAfter) q.set("after", filters.createdAfter.toISOString());
  if (filters.createdBefore) q.set("before", filters.createdBefore.toISOString());
  if (filters.search) q.set("q", filters.search);
  const text = q.toString();
  return text ? `?${text}` : "";
}

interface Props {
  value: RunFilters;
  workflows: string[];
  showStatus: boolean;
  onChange: (filters: RunFilters) => void;
}

export function RunFiltersForm({ value, workflows, showStatus, onChange }: Props) {
  const [status, setStatus] = useState(value.statuses[0] ?? "");
  const [workflow, setWorkflow] = useState(value.workflow);
  const [version, setVersion] = useState(value.version ? String(value.version) : "");
  const [labels, setLabels] = useState(labelsText(value.labels));
  const [after, setAfter] = useState(localInput(value.createdAfter));
  const [before, setBefore] = useState(localInput(value.createdBefore));
  const [search, setSearch] = useState(value.search);

  const submit = (event: FormEvent): void => {
    event.preventDefault();
    onChange({
      ...value,
      statuses: showStatus ? (status ? [status as RunStatus] : []) : value.statuses,
      workflow: workflow.trim(),
      version: workflow.trim() ? Number(version) || 0 : 0,
      labels: parseLabels(labels),
      createdAfter: after ? new Date(after) : null,
      createdBefore: before ? new Date(before) : null,
      search: search.trim(),
    });
  };
  const reset = (): void => {
    setStatus("");
    setWorkflow("");
    setVersion("");
    setLabels("");
    setAfter("");
    setBefore("");
    setSearch("");
    onChange({ ...NO_FILTERS, statuses: showStatus ? [] : value.statuses });
  };

  return (
    <form className="filters" onSubmit={submit} aria-label="Filter runs">
      <div className="field wide">
        <label htmlFor="f-search">Run id or idempotency key</label>
        <input id="f-search" type="search" value={search} onChange={(e) => setSearch(e.target.value)} placeholder="exact id, or key prefix" />
      </div>
      {showStatus ? (
        <div className="field">
          <label htmlFor="f-status">Status</label>
          <select id="f-status" value={status} onChange={(e) => setStatus(e.target.value)}>
            <option value="">any</option>
            {RUN_STATUSES.map((s) => (
              <option key={s} value={s}>
                {s.toLowerCase()}
              </option>
            ))}
          </select>
        </div>
      ) : null}
      <div className="field">
        <label htmlFor="f-workflow">Workflow</label>
        <input id="f-workflow" list="f-workflows" value={workflow} onChange={(e) => setWorkflow(e.target.value)} />
        <datalist id="f-workflows">
          {workflows.map((w) => (
            <option key={w} value={w} />
          ))}
        </datalist>
      </div>
      <div className="field narrow">
        <label htmlFor="f-version">Version</label>
        {/* a version means nothing without its workflow (the server requires both) */}
        <input id="f-version" type="number" min={0} value={workflow ? version : ""} onChange={(e) => setVersion(e.target.value)} placeholder="any" disabled={!workflow.trim()} />
      </div>
      <div className="field">
        <label htmlFor="f-labels">Labels</label>
        <input id="f-labels" value={labels} onChange={(e) => setLabels(e.target.value)} placeholder="team=shop, env=prod" />
      </div>
      <div className="field">
        <label htmlFor="f-after">Created after</label>
        <input id="f-after" type="datetime-local" value={after} onChange={(e) => setAfter(e.target.value)} />
      </div>
      <div className="field">
        <label htmlFor="f-before">Created before</label>
        <input id="f-before" type="datetime-local" value={before} onChange={(e) => setBefore(e.target.value)} />
      </div>
      <div className="field buttons">
        <button type="submit" className="primary">
          Apply
        </button>
        <button type="button" onClick={reset}>
          Clear
        </button>
      </div>
    </form>
  );
}
