// A filtered, paged, live list of runs: what the Runs and Failed pages share.
import { useState, type ReactNode } from "react";
import type { Run } from "@composer-dev/composer/web";

import { listRunsPage, listWorkflows, type RunFilters } from "../api";
import { useApp } from "../context";
import { usePolled } from "../hooks";
import { navigate, useLocation } from "../router";
import { Empty, ErrorBanner } from "./common";
import { RunFiltersForm, filtersFromQuery, filtersToQuery } from "./RunFiltersForm";
import { RunsTable } from "./RunsTable";

const PAGE_SIZES = [10, 25, 50, 100];

interface Props {
  caption: string;
  /** Statuses fixed by the page (the Failed view); the status filter is then hidden. */
  fixedStatuses?: Run["status"][];
  showError?: boolean;
  selection?: { selected: Set<string>; toggle: (runId: string) => void; toggleAll: (runs: Run[], on: boolean) => void };
  /** Above the table, given the current filters (the counts). */
  header?: (filters: RunFilters, setFilters: (f: RunFilters) => void) => ReactNode;
  /** Bumped by the page to reload now (after a bulk action). */
  refreshKey?: number;
}

export function RunList({ caption, fixedStatuses, showError, selection, header, refreshKey = 0 }: Props) {
  const { client } = useApp();
  const { path, query } = useLocation();
  const filters: RunFilters = { ...filtersFromQuery(query), ...(fixedStatuses ? { statuses: fixedStatuses } : {}) };
  const [pageSize, setPageSize] = useState(25);
  const [tokens, setTokens] = useState<string[]>([""]);
  const [live, setLive] = useState(true);
  const pageToken = tokens[tokens.length - 1] ?? "";
  const filterKey = filtersToQuery(filters);

  const page = usePolled((signal) => listRunsPage(client, filters, pageSize, pageToken, signal), `${filterKey}|${pageSize}|${pageToken}|${refreshKey}`, {
    live,
  });
  const workflows = usePolled((signal) => listWorkflows(client, signal), "workflows");

  const setFilters = (next: RunFilters): void => {
    setTokens([""]);
    navigate(`${path}${filtersToQuery(fixedStatuses ? { ...next, statuses: [] } : next)}`, { replace: true });
  };
  const runs = page.data?.runs ?? [];

  return (
    <>
      <RunFiltersForm
        key={filterKey}
        value={filters}
        workflows={(workflows.data ?? []).map((w) => w.name)}
        showStatus={!fixedStatuses}
        onChange={setFilters}
      />
      {header?.(filters, setFilters)}
      <div className="list-controls">
        <label className="inline">
          <input type="checkbox" checked={live} onChange={(e) => setLive(e.target.checked)} /> Live (every 3 s)
        </label>
        <label className="inline" htmlFor="page-size">
          Per page
        </label>
        <select id="page-size" value={pageSize} onChange={(e) => (setPageSize(Number(e.target.value)), setTokens([""]))}>
          {PAGE_SIZES.map((n) => (
            <option key={n} value={n}>
              {n}
            </option>
          ))}
        </select>
        <span className="spacer" />
        <span aria-live="polite" className="sub">
          Page {tokens.length}
          {page.loading ? " · loading…" : ""}
        </span>
        <button type="button" onClick={() => setTokens((t) => t.slice(0, -1))} disabled={tokens.length <= 1}>
          Previous page
        </button>
        <button type="button" onClick={() => page.data?.nextPageToken && setTokens((t) => [...t, page.data?.nextPageToken ?? ""])} disabled={!page.data?.nextPageToken}>
          Next page
        </button>
      </div>
      <ErrorBanner error={page.error} />
      {runs.length > 0 ? (
        <RunsTable
          runs={runs}
          caption={caption}
          showError={showError ?? false}
          {...(selection
            ? { selection: { selected: selection.selected, toggle: selection.toggle, toggleAll: (on: boolean) => selection.toggleAll(runs, on) } }
            : {})}
        />
      ) : page.loading ? null : (
        <Empty>No runs match these filters.</Empty>
      )}
    </>
  );
}
