// An admin's tokens act in any namespace (the x-composer-namespace header); others see their own.
import { useState, type FormEvent } from "react";

import { sessionFor, type Session } from "../session";

export function NamespaceSwitch({ session, onSwitch }: { session: Session; onSwitch: (s: Session) => void }) {
  const [draft, setDraft] = useState(session.namespace);
  if (!session.can.switchNamespace) {
    return <span className="namespace">namespace {session.namespace}</span>;
  }
  const submit = (event: FormEvent): void => {
    event.preventDefault();
    const name = draft.trim();
    if (name && name !== session.namespace) onSwitch(sessionFor(session.token, name));
  };
  return (
    <form className="namespace-switch" onSubmit={submit}>
      <label htmlFor="namespace">Namespace</label>
      <input id="namespace" value={draft} onChange={(e) => setDraft(e.target.value)} pattern="[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}" size={12} />
      <button type="submit">Switch</button>
    </form>
  );
}
