// Start a run of a workflow version with a JSON input, checked against its input_schema first.
import { useState, type FormEvent } from "react";
import type { Json } from "@composer-dev/composer/web";

import { errorText } from "../api";
import { useApp } from "../context";
import { navigate, runPath } from "../router";
import { parseJson, validate, type SchemaProblem } from "../schema";
import { JsonInput } from "./JsonInput";

interface Props {
  workflow: string;
  version: number;
  inputSchema: Json;
}

function exampleFor(schema: Json): string {
  const s = schema as { properties?: Record<string, unknown> } | null;
  if (!s || typeof s !== "object" || !s.properties) return "{}";
  return JSON.stringify(Object.fromEntries(Object.keys(s.properties).map((k) => [k, null])), null, 2);
}

export function StartRunForm({ workflow, version, inputSchema }: Props) {
  const { client } = useApp();
  const [text, setText] = useState(() => exampleFor(inputSchema));
  const [key, setKey] = useState("");
  const [problems, setProblems] = useState<SchemaProblem[] | string | null>(null);
  const [busy, setBusy] = useState(false);

  const submit = async (event: FormEvent): Promise<void> => {
    event.preventDefault();
    const parsed = parseJson(text);
    if (!parsed.ok) return setProblems(parsed.message);
    const found = validate(parsed.value, inputSchema);
    if (found.length > 0) return setProblems(found);
    setProblems(null);
    setBusy(true);
    try {
      const run = await client.startRun(workflow, parsed.value, { version, ...(key.trim() ? { idempotencyKey: key.trim() } : {}) });
      navigate(runPath(run.runId));
    } catch (e) {
      setProblems(errorText(e));
      setBusy(false);
    }
  };

  const shown =
    problems === null ? null : typeof problems === "string" ? (
      problems
    ) : (
      <ul>
        {problems.map((p) => (
          <li key={`${p.path}:${p.message}`}>
            <code>{p.path}</code> {p.message}
          </li>
        ))}
      </ul>
    );
  return (
    <form className="start-run" onSubmit={(e) => void submit(e)} aria-label={`Start a run of ${workflow}`}>
      <JsonInput id="run-input" label={`Input (JSON) for ${workflow} v${version}`} value={text} onChange={setText} problems={shown} />
      <div className="field">
        <label htmlFor="run-key">Idempotency key (optional)</label>
        <input id="run-key" value={key} onChange={(e) => setKey(e.target.value)} />
      </div>
      <button type="submit" className="primary" disabled={busy}>
        Start run
      </button>
    </form>
  );
}
