// How many runs match the filters, per status (CountRuns); a count filters the list by its status.
// When the server stopped counting at its limit, each count is a floor and shows a "+".
import { countRuns, RUN_STATUSES, type RunFilters } from "../api";
import { useApp } from "../context";
import { usePolled } from "../hooks";
import { filtersToQuery } from "./RunFiltersForm";

export function StatusCounts({ filters, onPick }: { filters: RunFilters; onPick: (f: RunFilters) => void }) {
  const { client } = useApp();
  const counts = usePolled((signal) => countRuns(client, filters, signal), filtersToQuery({ ...filters, statuses: [] }), { live: true });
  if (counts.error) return <p className="sub">Counts unavailable: {counts.error}</p>;
  const data = counts.data?.counts ?? {};
  const more = counts.data?.more ?? false;
  const total = RUN_STATUSES.reduce((sum, s) => sum + (data[s] ?? 0), 0);
  // counted only up to the server's limit: each count is a floor
  const shown = (n: number) => `${n}${more ? "+" : ""}`;
  const active = filters.statuses[0] ?? null;
  return (
    <ul className="counts" aria-label="Runs by status">
      <li>
        <button type="button" className={`count${active === null ? " active" : ""}`} aria-pressed={active === null} onClick={() => onPick({ ...filters, statuses: [] })}>
          <span className="count-label">all</span> <span className="count-value">{counts.data ? shown(total) : "…"}</span>
        </button>
      </li>
      {RUN_STATUSES.map((status) => (
        <li key={status}>
          <button
            type="button"
            className={`count status-${status.toLowerCase()}${active === status ? " active" : ""}`}
            aria-pressed={active === status}
            data-count={status}
            onClick={() => onPick({ ...filters, statuses: [status] })}
          >
            <span className="count-label">{status.toLowerCase()}</span> <span className="count-value">{counts.data ? shown(data[status] ?? 0) : "…"}</span>
          </button>
        </li>
      ))}
    </ul>
  );
}
