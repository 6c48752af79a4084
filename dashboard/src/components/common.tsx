// Small pieces every page uses. Payloads go through JsonBlock (or JsonLine): React text, never
// HTML, and a reference to an offloaded value as a BlobReference block in its place.
import type { ReactNode } from "react";
import type { Json, RunStatus } from "@composer-dev/composer/web";

import { hasBlobs, jsonParts } from "../blobs";
import { json } from "../format";
import { BlobReference } from "./BlobReference";

export function StatusBadge({ status }: { status: RunStatus | string }) {
  return <span className={`badge status-${status.toLowerCase().replace(/_/g, "-")}`}>{status.toLowerCase().replace(/_/g, " ")}</span>;
}

export function JsonBlock({ value, label }: { value: Json | undefined; label: string }) {
  return (
    <pre className="json" aria-label={label} tabIndex={0}>
      {hasBlobs(value) ? jsonParts(value).map((part, i) => (typeof part === "string" ? part : <BlobReference key={i} blob={part} />)) : json(value)}
    </pre>
  );
}

/** A value on one line (history details, attempts, items): its JSON with whitespace collapsed. */
export function JsonLine({ value }: { value: Json | undefined }) {
  if (!hasBlobs(value)) return <>{json(value).replace(/\s+/g, " ")}</>;
  return <>{jsonParts(value).map((part, i) => (typeof part === "string" ? part.replace(/\s+/g, " ") : <BlobReference key={i} blob={part} inline />))}</>;
}

export function ErrorBanner({ error }: { error: string | null }) {
  if (!error) return null;
  return (
    <p className="error-banner" role="alert">
      {error}
    </p>
  );
}

export function Section({ title, children, actions }: { title: string; children: ReactNode; actions?: ReactNode }) {
  return (
    <section className="panel" aria-label={title}>
      <header className="panel-header">
        <h2>{title}</h2>
        {actions ? <div className="panel-actions">{actions}</div> : null}
      </header>
      {children}
    </section>
  );
}

export function Empty({ children }: { children: ReactNode }) {
  return <p className="empty">{children}</p>;
}
