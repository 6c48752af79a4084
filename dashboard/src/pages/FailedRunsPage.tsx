// The dead-letter view: runs that ended FAILED, with their error, and bulk retry of the selected
// (RetryRun each: they resume from their failed nodes; completed nodes keep their outputs).
import { useState } from "react";
import type { Run } from "@composer-dev/composer/web";

import { errorText } from "../api";
import { RunList } from "../components/RunList";
import { useApp } from "../context";
import { shortId } from "../format";

interface Outcome {
  runId: string;
  ok: boolean;
  message: string;
}

export function FailedRunsPage() {
  const { client, session } = useApp();
  const [selected, setSelected] = useState<Set<string>>(new Set());
  const [outcomes, setOutcomes] = useState<Outcome[]>([]);
  const [busy, setBusy] = useState(false);
  const [refreshKey, setRefreshKey] = useState(0);

  const toggle = (runId: string): void =>
    setSelected((s) => {
      const next = new Set(s);
      if (!next.delete(runId)) next.add(runId);
      return next;
    });
  const toggleAll = (runs: Run[], on: boolean): void => setSelected(on ? new Set(runs.map((r) => r.runId)) : new Set());

  const retrySelected = async (): Promise<void> => {
    setBusy(true);
    const results: Outcome[] = [];
    for (const runId of selected) {
      try {
        await client.retryRun(runId);
        results.push({ runId, ok: true, message: "resumed" });
      } catch (e) {
        results.push({ runId, ok: false, message: errorText(e) });
      }
    }
    setOutcomes(results);
    setSelected(new Set());
    setBusy(false);
    setRefreshKey((k) => k + 1);
  };

  return (
    <section className="panel" aria-labelledby="failed-title">
      <h1 id="failed-title">Failed runs</h1>
      <p className="sub">Runs that ended FAILED. Fix the cause (a worker, a downstream service), then retry them: each resumes from its failed nodes.</p>
      {session.can.retryRun ? (
        <div className="bulk-actions">
          <button type="button" className="primary" disabled={busy || selected.size === 0} onClick={() => void retrySelected()}>
            Retry selected ({selected.size})
          </button>
        </div>
      ) : null}
      {outcomes.length > 0 ? (
        <ul className="outcomes" aria-label="Retry results" aria-live="polite">
          {outcomes.map((o) => (
            <li key={o.runId} className={o.ok ? "ok" : "failed"}>
              <span className="mono">{shortId(o.runId)}</span>: {o.message}
            </li>
          ))}
        </ul>
      ) : null}
      <RunList
        caption="Failed runs, newest first"
        fixedStatuses={["FAILED"]}
        showError
        refreshKey={refreshKey}
        {...(session.can.retryRun ? { selection: { selected, toggle, toggleAll } } : {})}
      />
    </section>
  );
}
