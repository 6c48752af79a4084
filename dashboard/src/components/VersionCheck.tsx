// "Check runs in flight against vN": replays every run of the workflow in flight against version N
// on the server (CheckWorkflowVersion, every page) and shows how many runs got each verdict and
// why each run that is not identical is not (docs/versions.md).
import { useEffect, useRef, useState } from "react";

import { checkRunsInFlight, errorText, REPLAY_VERDICTS, type ReplayVerdict, type RunReplay, type VersionCheck as CheckResult } from "../api";
import { useApp } from "../context";
import { Link, runPath } from "../router";
import { Empty, ErrorBanner, StatusBadge } from "./common";

/** Rows drawn at most; the counts cover every run (`composer workflow check -o json` lists all). */
const MAX_ROWS = 1000;
/** The runs to read first: those the version cannot continue. */
const VERDICT_ORDER: Record<RunReplay["verdict"], number> = { INCOMPATIBLE: 0, UNREPLAYABLE: 1, COMPATIBLE: 2, IDENTICAL: 3, UNSPECIFIED: 4 };

const verdictWord = (verdict: RunReplay["verdict"]): string => verdict.toLowerCase();
const runCount = (n: number): string => `${n} run${n === 1 ? "" : "s"}`;

export function VersionCheck({ name, version }: { name: string; version: number }) {
  const { client } = useApp();
  const [result, setResult] = useState<CheckResult | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [checking, setChecking] = useState(false);
  const controller = useRef<AbortController | null>(null);
  useEffect(() => () => controller.current?.abort(), []);

  const check = async (): Promise<void> => {
    controller.current?.abort();
    const current = new AbortController();
    controller.current = current;
    setChecking(true);
    setError(null);
    setResult(null);
    try {
      await checkRunsInFlight(client, name, version, (sofar) => !current.signal.aborted && setResult(sofar), current.signal);
    } catch (e) {
      if (!current.signal.aborted) setError(errorText(e));
    } finally {
      if (!current.signal.aborted) setChecking(false);
    }
  };

  return (
    <div className="version-check">
      <p className="hint">
        Replays every run of {name} in flight (running, compensating or paused, on any version) against v{version} on the server, as{" "}
        <code>composer workflow check</code> does. Nothing is changed.
      </p>
      <p>
        <button type="button" className="primary" onClick={() => void check()} disabled={checking}>
          Check runs in flight against v{version}
        </button>
      </p>
      <ErrorBanner error={error} />
      <p aria-live="polite" className="sub">
        {checking ? `Checking… ${runCount(result?.checked ?? 0)} so far.` : result ? `Checked ${runCount(result.checked)} in flight against v${version}.` : ""}
      </p>
      {result ? <Verdicts result={result} /> : null}
      {result?.done ? <NotIdentical runs={result.runs} version={version} /> : null}
    </div>
  );
}

function Verdicts({ result }: { result: CheckResult }) {
  return (
    <ul className="counts" aria-label="Runs by verdict">
      {REPLAY_VERDICTS.map((verdict: ReplayVerdict) => (
        <li key={verdict} className={`count verdict-${verdict.toLowerCase()}`} data-verdict={verdict}>
          <span className="count-label">{verdictWord(verdict)}</span> <span className="count-value">{result.counts[verdict]}</span>
        </li>
      ))}
    </ul>
  );
}

function Why({ run }: { run: RunReplay }) {
  if (run.divergence) {
    const { rule, nodeId, sequence, message } = run.divergence;
    return (
      <>
        <span className="mono">{rule}</span>
        {nodeId ? (
          <>
            {" "}
            at <span className="mono">{nodeId}</span>
          </>
        ) : null}
        {sequence ? <span className="sub"> (history #{sequence})</span> : null}: {message}
      </>
    );
  }
  if (run.unreplayableReason) return <>{run.unreplayableReason}</>;
  return (
    <ul className="differences">
      {run.differences.map((d, i) => (
        <li key={i}>
          <span className="mono">{d.kind}</span>
          {d.nodeId ? (
            <>
              {" "}
              <span className="mono">{d.nodeId}</span>
            </>
          ) : null}
          : {d.message}
        </li>
      ))}
    </ul>
  );
}

function NotIdentical({ runs, version }: { runs: RunReplay[]; version: number }) {
  if (runs.length === 0) return <Empty>Every run in flight is identical under v{version}.</Empty>;
  const sorted = [...runs].sort((a, b) => VERDICT_ORDER[a.verdict] - VERDICT_ORDER[b.verdict]);
  const shown = sorted.slice(0, MAX_ROWS);
  return (
    <>
      <table className="runs replay-runs">
        <caption className="visually-hidden">Runs in flight that are not identical under v{version}</caption>
        <thead>
          <tr>
            <th scope="col">Run</th>
            <th scope="col">On</th>
            <th scope="col">Status</th>
            <th scope="col">Verdict</th>
            <th scope="col">Why</th>
          </tr>
        </thead>
        <tbody>
          {shown.map((run) => (
            <tr key={run.runId} data-run={run.runId} data-verdict={run.verdict}>
              <td>
                <Link className="mono" href={runPath(run.runId)}>
                  {run.runId}
                </Link>
              </td>
              <td>v{run.workflowVersion}</td>
              <td>
                <StatusBadge status={run.status} />
              </td>
              <td>
                <span className={`badge verdict-${run.verdict.toLowerCase()}`}>{verdictWord(run.verdict)}</span>
              </td>
              <td>
                <Why run={run} />
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {sorted.length > shown.length ? (
        <p className="hint">
          The first {shown.length} of {sorted.length} runs that are not identical; <code>composer workflow check -o json</code> lists every one.
        </p>
      ) : null}
    </>
  );
}
