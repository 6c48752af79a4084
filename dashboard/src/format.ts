// How values read on screen. Payloads are always shown as text (JSON), never as HTML.
import type { Json } from "@composer-dev/composer/web";

export function json(value: Json | undefined): string {
  if (value === undefined || value === null) return "null";
  return JSON.stringify(value, null, 2);
}

export function time(date: Date | null): string {
  if (!date) return "—";
  return date.toLocaleString(undefined, { hour12: false });
}

export function duration(start: Date | null, end: Date | null, now = new Date()): string {
  if (!start) return "—";
  const ms = (end ?? now).getTime() - start.getTime();
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3_600_000) return `${Math.floor(ms / 60_000)} m ${Math.floor((ms % 60_000) / 1000)} s`;
  return `${Math.floor(ms / 3_600_000)} h ${Math.floor((ms % 3_600_000) / 60_000)} m`;
}

/** The end of a run id: UUIDv7 ids start with their creation time, so their ends tell them apart. */
export function shortId(id: string): string {
  return id.length > 13 ? `…${id.slice(-12)}` : id;
}

/** A byte count in binary units: `512 B`, `146.5 KiB`, `3.2 MiB`. */
export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = n / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(1)} ${units[unit]}`;
}
