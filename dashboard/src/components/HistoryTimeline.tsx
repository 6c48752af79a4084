// The run's history, oldest first: what happened, to which node, by whom.
import type { HistoryEvent } from "@composer-dev/composer/web";

import { json, time } from "../format";

export function HistoryTimeline({ events, highlight }: { events: HistoryEvent[]; highlight: string | null }) {
  return (
    <ol className="timeline">
      {events.map((e) => {
        const hasDetails = e.details !== null && !(typeof e.details === "object" && !Array.isArray(e.details) && Object.keys(e.details).length === 0);
        return (
          <li key={String(e.sequence)} className={highlight && e.nodeId === highlight ? "highlight" : undefined} data-event={e.eventType}>
            <span className="seq">#{String(e.sequence)}</span>
            <time dateTime={e.eventTime?.toISOString()}>{time(e.eventTime)}</time>
            <span className="event-type">{e.eventType}</span>
            {e.nodeId ? <span className="mono">{e.nodeId}</span> : null}
            {e.attempt ? <span className="sub">attempt {e.attempt}</span> : null}
            <span className="sub">by {e.actor}</span>
            {hasDetails ? <code className="details">{json(e.details).replace(/\s+/g, " ")}</code> : null}
          </li>
        );
      })}
    </ol>
  );
}
