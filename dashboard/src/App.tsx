// The shell: the login gate, the navigation, and which page a path shows.
import { useCallback, useMemo, useState } from "react";

import { makeClient } from "./api";
import { App } from "./context";
import { Login } from "./pages/Login";
import { RunsPage } from "./pages/RunsPage";
import { FailedRunsPage } from "./pages/FailedRunsPage";
import { RunPage } from "./pages/RunPage";
import { WorkflowsPage } from "./pages/WorkflowsPage";
import { WorkflowPage } from "./pages/WorkflowPage";
import { SecretsPage } from "./pages/SecretsPage";
import { NamespaceSwitch } from "./components/NamespaceSwitch";
import { Link, match, useLocation } from "./router";
import { clearSession, loadSession, saveSession, type Session } from "./session";

export function AppRoot() {
  const [session, setSession] = useState<Session | null>(loadSession);
  const [notice, setNotice] = useState<string | null>(null);

  const logIn = useCallback((next: Session) => {
    saveSession(next);
    setNotice(null);
    setSession(next);
  }, []);
  const logOut = useCallback((message: string | null) => {
    clearSession();
    setNotice(message);
    setSession(null);
  }, []);
  const expire = useCallback(
    (message: string) => logOut(`The server no longer accepts your token (${message}). It may have expired: log in with a new one.`),
    [logOut],
  );
  const client = useMemo(() => (session ? makeClient(session, expire) : null), [session, expire]);

  if (!session || !client) return <Login onLogIn={logIn} notice={notice} />;
  return (
    <App.Provider value={{ session, client, expire }}>
      <Shell session={session} onSwitch={logIn} onLogOut={() => logOut(null)} />
    </App.Provider>
  );
}

function Shell({ session, onSwitch, onLogOut }: { session: Session; onSwitch: (s: Session) => void; onLogOut: () => void }) {
  const { path } = useLocation();
  const nav = [
    { href: "/runs", label: "Runs", active: path === "/" || path.startsWith("/runs") },
    { href: "/failed", label: "Failed", active: path.startsWith("/failed") },
    { href: "/workflows", label: "Workflows", active: path.startsWith("/workflows") },
    { href: "/secrets", label: "Secrets", active: path.startsWith("/secrets") },
  ];
  return (
    <>
      <a className="skip-link" href="#main">
        Skip to content
      </a>
      <header className="topbar">
        <span className="brand">Composer</span>
        <nav aria-label="Main">
          <ul>
            {nav.map((item) => (
              <li key={item.href}>
                <Link href={item.href} aria-current={item.active ? "page" : undefined}>
                  {item.label}
                </Link>
              </li>
            ))}
          </ul>
        </nav>
        <div className="who">
          <NamespaceSwitch session={session} onSwitch={onSwitch} />
          <span className="identity" title="from the token">
            {session.claims.subject || "anonymous"} · {session.claims.roles.join(", ") || "no role"}
          </span>
          <button type="button" className="link-button" onClick={onLogOut}>
            Log out
          </button>
        </div>
      </header>
      {/* keyed by namespace: switching starts every page afresh */}
      <main id="main" key={session.namespace}>
        <Page path={path} />
      </main>
    </>
  );
}

function Page({ path }: { path: string }) {
  if (path === "/" || path === "/runs") return <RunsPage />;
  if (path === "/failed") return <FailedRunsPage />;
  if (path === "/workflows") return <WorkflowsPage />;
  if (path === "/secrets") return <SecretsPage />;
  const run = match("/runs/:id", path);
  if (run?.["id"]) return <RunPage key={run["id"]} runId={run["id"]} />;
  const workflow = match("/workflows/:name", path);
  if (workflow?.["name"]) return <WorkflowPage key={workflow["name"]} name={workflow["name"]} />;
  return (
    <section className="panel">
      <h1>Not found</h1>
      <p>
        Nothing lives at this address. <Link href="/runs">Go to the runs</Link>.
      </p>
    </section>
  );
}
