// A JSON text field that says what is wrong before anything is sent.
import type { ReactNode } from "react";

export function JsonInput({ id, label, value, onChange, problems, rows = 6 }: { id: string; label: string; value: string; onChange: (v: string) => void; problems: ReactNode; rows?: number }) {
  return (
    <div className="field wide">
      <label htmlFor={id}>{label}</label>
      <textarea
        id={id}
        className="mono"
        rows={rows}
        value={value}
        onChange={(e) => onChange(e.target.value)}
        spellCheck={false}
        aria-describedby={problems ? `${id}-problems` : undefined}
        aria-invalid={problems ? true : undefined}
      />
      {problems ? (
        <div id={`${id}-problems`} className="problems" role="alert">
          {problems}
        </div>
      ) : null}
    </div>
  );
}
