// The run's history, oldest first: what happened, to which node, by whom. A move to another version
// (`run_migrated`) reads as a sentence; an entry written under a node's old id says its id now.
import { time } from "../format";
import { migrationOf, migrationText, type RunHistoryEvent } from "../history";
import { JsonLine } from "./common";

export function HistoryTimeline({ events, highlight }: { events: RunHistoryEvent[]; highlight: string | null }) {
  return (
    <ol className="timeline">
      {events.map((e) => {
        const migration = migrationOf(e);
        const hasDetails = e.details !== null && !(typeof e.details === "object" && !Array.isArray(e.details) && Object.keys(e.details).length === 0);
        return (
          <li key={String(e.sequence)} className={highlight && e.currentNodeId === highlight ? "highlight" : undefined} data-event={e.eventType}>
            <span className="seq">#{String(e.sequence)}</span>
            <time dateTime={e.eventTime?.toISOString()}>{time(e.eventTime)}</time>
            <span className="event-type">{e.eventType}</span>
            {e.nodeId ? <span className="mono">{e.nodeId}</span> : null}
            {e.currentNodeId && e.currentNodeId !== e.nodeId ? <span className="sub">(now {e.currentNodeId})</span> : null}
            {e.attempt ? <span className="sub">attempt {e.attempt}</span> : null}
            <span className="sub">by {e.actor}</span>
            {migration ? (
              <span className="migration">{migrationText(migration)}</span>
            ) : hasDetails ? (
              <code className="details">
                <JsonLine value={e.details} />
              </code>
            ) : null}
          </li>
        );
      })}
    </ol>
  );
}
