// A run's history as the pages read it. MigrateRuns records `run_migrated` (details: from_version,
// to_version, node_mapping of renamed ids, docs/history.md) and the entries before it keep the
// node ids they were written with; the pages follow a node under its current id.
import type { HistoryEvent, Json } from "@composer-dev/composer/web";

export interface Migration {
  fromVersion: number;
  toVersion: number;
  /** [recorded id, new id], by recorded id. */
  renames: [string, string][];
}

export interface RunHistoryEvent extends HistoryEvent {
  /** The node as the run calls it now (after every later `run_migrated`'s renames); `nodeId` is as recorded. */
  currentNodeId: string;
}

export const RUN_MIGRATED = "run_migrated";

function numberOf(value: Json | undefined): number {
  return typeof value === "number" ? value : typeof value === "string" ? Number(value) || 0 : 0;
}

/** The move a `run_migrated` entry records; null for any other entry. */
export function migrationOf(event: HistoryEvent): Migration | null {
  if (event.eventType !== RUN_MIGRATED) return null;
  const details = event.details && typeof event.details === "object" && !Array.isArray(event.details) ? event.details : {};
  const mapping = details["node_mapping"];
  const renames =
    mapping && typeof mapping === "object" && !Array.isArray(mapping)
      ? Object.entries(mapping)
          .filter((pair): pair is [string, string] => typeof pair[1] === "string")
          .sort(([a], [b]) => a.localeCompare(b))
      : [];
  return { fromVersion: numberOf(details["from_version"]), toVersion: numberOf(details["to_version"]), renames };
}

/** `moved from v1 to v2`, with its renames: `moved from v1 to v2, renaming A → A2, B → B2`. */
export function migrationText(migration: Migration): string {
  const renames = migration.renames.map(([from, to]) => `${from} → ${to}`).join(", ");
  return `moved from v${migration.fromVersion} to v${migration.toVersion}${renames ? `, renaming ${renames}` : ""}`;
}

/** A MAP element's id (`fan[3]`) is renamed with its MAP. */
const ELEMENT = /^(.*)(\[\d+\])$/;

function renamed(id: string, renames: ReadonlyMap<string, string>): string {
  const direct = renames.get(id);
  if (direct !== undefined) return direct;
  const element = ELEMENT.exec(id);
  const base = element?.[1] !== undefined ? renames.get(element[1]) : undefined;
  return base !== undefined ? `${base}${element?.[2] ?? ""}` : id;
}

/** Every entry with the id its node has now: each `run_migrated` renames the entries before it. */
export function withCurrentNodeIds(events: readonly HistoryEvent[]): RunHistoryEvent[] {
  const out: RunHistoryEvent[] = new Array<RunHistoryEvent>(events.length);
  // walking back from the newest entry: `current` maps an id as of this point to the id now
  let current = (id: string): string => id;
  for (let i = events.length - 1; i >= 0; i--) {
    const event = events[i] as HistoryEvent;
    out[i] = { ...event, currentNodeId: event.nodeId ? current(event.nodeId) : "" };
    const migration = migrationOf(event);
    if (migration && migration.renames.length > 0) {
      const later = current;
      const renames = new Map(migration.renames);
      current = (id) => later(renamed(id, renames));
    }
  }
  return out;
}

/** The last move of the run, if it was ever moved. */
export function lastMigration(events: readonly HistoryEvent[]): Migration | null {
  for (let i = events.length - 1; i >= 0; i--) {
    const migration = migrationOf(events[i] as HistoryEvent);
    if (migration) return migration;
  }
  return null;
}
