// The login screen: paste a token (or arrive with `#token=...`, as `make dev` prints it).
import { useState, type FormEvent } from "react";

import { ErrorBanner } from "../components/common";
import { isExpired, sessionFor, type Session } from "../session";

export function Login({ onLogIn, notice }: { onLogIn: (session: Session) => void; notice: string | null }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState<string | null>(null);
  const submit = (event: FormEvent): void => {
    event.preventDefault();
    try {
      const session = sessionFor(token.trim());
      if (isExpired(session.claims)) {
        setError(`This token expired at ${session.claims.expires?.toLocaleString()}. Mint a new one.`);
        return;
      }
      onLogIn(session);
    } catch (e) {
      setError((e as Error).message);
    }
  };
  return (
    <main id="main" className="login">
      <form className="panel login-form" onSubmit={submit} aria-labelledby="login-title">
        <h1 id="login-title">Composer</h1>
        {notice ? (
          <p className="notice" role="alert">
            {notice}
          </p>
        ) : null}
        <label htmlFor="token">Token</label>
        <textarea
          id="token"
          name="token"
          rows={5}
          value={token}
          onChange={(e) => setToken(e.target.value)}
          spellCheck={false}
          autoComplete="off"
          placeholder="eyJ0eXAiOiJKV1Qi..."
          required
        />
        <p className="hint">
          A token from <code>composer token --sub you --role reader --ttl 8h</code>, or the admin token <code>make dev</code> prints. It is kept in
          this tab only (sessionStorage).
        </p>
        <ErrorBanner error={error} />
        <button type="submit" className="primary">
          Log in
        </button>
      </form>
    </main>
  );
}
