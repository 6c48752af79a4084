// What the user's role may do to this run: cancel it while it runs or waits QUEUED for a slot of its
// concurrency key, retry it once it failed, send it an event (the events its waiting nodes expect
// are offered first).
import { useState, type FormEvent } from "react";
import type { Run } from "@composer-dev/composer/web";

import { errorText } from "../api";
import { useApp } from "../context";
import type { WorkflowGraph } from "../graph/definition";
import { parseJson } from "../schema";
import { JsonInput } from "./JsonInput";
import { ErrorBanner } from "./common";

interface Props {
  run: Run;
  graph: WorkflowGraph | null;
  /** The run changed state through us (a retry): watch it again. */
  onResumed: () => void;
}

const ACTIVE = new Set<Run["status"]>(["RUNNING", "COMPENSATING"]);

/** The events of WAIT_FOR_EVENT nodes that are waiting now. */
function awaitedEvents(run: Run, graph: WorkflowGraph | null): string[] {
  if (!graph) return [];
  const waiting = new Set(run.nodes.filter((n) => n.status === "WAITING").map((n) => n.nodeId));
  return [...new Set(graph.nodes.filter((n) => n.kind === "WAIT_FOR_EVENT" && waiting.has(n.id) && n.event).map((n) => n.event))];
}

export function RunActions({ run, graph, onResumed }: Props) {
  const { client, session } = useApp();
  const [error, setError] = useState<string | null>(null);
  const [confirmCancel, setConfirmCancel] = useState(false);
  const [reason, setReason] = useState("");
  const [busy, setBusy] = useState(false);
  // what the last action did; kept here, as the form that did it may be gone once the run moved on
  const [done, setDone] = useState<string | null>(null);
  const active = ACTIVE.has(run.status);
  const canCancel = session.can.cancelRun && (active || run.status === "QUEUED");
  const canRetry = session.can.retryRun && run.status === "FAILED";
  const canSend = session.can.sendEvent && active;
  if (!canCancel && !canRetry && !canSend && !done) return null;

  const act = async (what: () => Promise<unknown>): Promise<void> => {
    setBusy(true);
    setError(null);
    try {
      await what();
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };

  return (
    <section className="panel actions" aria-label="Actions">
      <div className="action-row">
        {canRetry ? (
          <button
            type="button"
            className="primary"
            disabled={busy}
            onClick={() =>
              void act(async () => {
                await client.retryRun(run.runId);
                setDone("Run resumed from its failed nodes");
                onResumed();
              })
            }
          >
            Retry from failed nodes
          </button>
        ) : null}
        {canCancel && !confirmCancel ? (
          <button type="button" className="danger" disabled={busy} onClick={() => setConfirmCancel(true)}>
            Cancel run
          </button>
        ) : null}
      </div>
      {canCancel && confirmCancel ? (
        <form
          className="confirm"
          onSubmit={(e) => {
            e.preventDefault();
            void act(async () => {
              await client.cancelRun(run.runId, reason.trim());
              setConfirmCancel(false);
              setDone("Run cancelled");
            });
          }}
        >
          <div className="field wide">
            <label htmlFor="cancel-reason">Why cancel? (recorded in the history)</label>
            <input id="cancel-reason" value={reason} onChange={(e) => setReason(e.target.value)} />
          </div>
          <button type="submit" className="danger" disabled={busy}>
            Confirm cancel
          </button>
          <button type="button" onClick={() => setConfirmCancel(false)}>
            Keep running
          </button>
        </form>
      ) : null}
      {canSend ? <SendEventForm run={run} offered={awaitedEvents(run, graph)} onSent={setDone} /> : null}
      {done ? (
        <p className="sub" role="status">
          {done}
        </p>
      ) : null}
      <ErrorBanner error={error} />
    </section>
  );
}

function SendEventForm({ run, offered, onSent }: { run: Run; offered: string[]; onSent: (what: string) => void }) {
  const { client } = useApp();
  const [name, setName] = useState("");
  const [payload, setPayload] = useState("{}");
  const [problem, setProblem] = useState<string | null>(null);
  const chosen = name || offered[0] || "";

  const submit = async (event: FormEvent): Promise<void> => {
    event.preventDefault();
    const parsed = parseJson(payload);
    if (!parsed.ok) return setProblem(parsed.message);
    if (!chosen) return setProblem("name the event");
    setProblem(null);
    try {
      const delivery = await client.sendEvent(chosen, parsed.value, { runId: run.runId });
      onSent(delivery.deliveredRunIds.length > 0 ? `Event ${chosen} delivered` : `Event ${chosen} kept until the run waits for it`);
    } catch (e) {
      setProblem(errorText(e));
    }
  };
  return (
    <form className="send-event" onSubmit={(e) => void submit(e)} aria-label="Send an event">
      <h3>Send an event</h3>
      <div className="field">
        <label htmlFor="event-name">Event</label>
        <input id="event-name" list="event-names" value={chosen} onChange={(e) => setName(e.target.value)} />
        <datalist id="event-names">
          {offered.map((e) => (
            <option key={e} value={e} />
          ))}
        </datalist>
        {offered.length > 0 ? <p className="hint">Waiting for: {offered.join(", ")}</p> : null}
      </div>
      <JsonInput id="event-payload" label="Payload (JSON)" value={payload} onChange={setPayload} problems={problem} rows={3} />
      <button type="submit">Send event</button>
    </form>
  );
}
