// Small pieces every page uses. Payloads go through JsonBlock: React text, never HTML.
import type { ReactNode } from "react";
import type { Json, RunStatus } from "@composer-dev/composer/web";

import { json } from "../format";

export function StatusBadge({ status }: { status: RunStatus | string }) {
  return <span className={`badge status-${status.toLowerCase().replace(/_/g, "-")}`}>{status.toLowerCase().replace(/_/g, " ")}</span>;
}

export function JsonBlock({ value, label }: { value: Json | undefined; label: string }) {
  return (
    <pre className="json" aria-label={label} tabIndex={0}>
      {json(value)}
    </pre>
  );
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
