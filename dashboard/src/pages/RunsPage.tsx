// Every run of the namespace: counts by status, filters, pages, live.
import { RunList } from "../components/RunList";
import { StatusCounts } from "../components/StatusCounts";

export function RunsPage() {
  return (
    <section className="panel" aria-labelledby="runs-title">
      <h1 id="runs-title">Runs</h1>
      <RunList caption="Runs, newest first" header={(filters, setFilters) => <StatusCounts filters={filters} onPick={setFilters} />} />
    </section>
  );
}
