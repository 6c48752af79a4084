// The namespace's secrets: names, versions and who set them, a form to set a value, and delete
// with a confirmation. A value goes to the server and never comes back: no call returns one, and
// its input is uncontrolled (never React state, never an attribute) and emptied once set.
import { useRef, useState, type FormEvent, type RefObject } from "react";

import { deleteSecret, errorCode, errorText, fieldViolations, listSecretsPage, rawMessage, setSecret, type SecretPage, type SecretSummary } from "../api";
import { Empty, ErrorBanner } from "../components/common";
import { useApp } from "../context";
import { time } from "../format";
import { usePolled } from "../hooks";
import { NAME_RULE, nameProblem } from "../names";

const PAGE_SIZES = [10, 25, 50, 100];

/** The answers that mean "no secrets here for you", shown as the server words them. */
type RefusalCode = "FAILED_PRECONDITION" | "PERMISSION_DENIED";
const REFUSALS: readonly string[] = ["FAILED_PRECONDITION", "PERMISSION_DENIED"] satisfies RefusalCode[];

type Listing = { page: SecretPage; refusal: null } | { page: null; refusal: { code: RefusalCode; message: string } };

async function loadListing(load: () => Promise<SecretPage>): Promise<Listing> {
  try {
    return { page: await load(), refusal: null };
  } catch (e) {
    const code = errorCode(e);
    if (REFUSALS.includes(code)) return { page: null, refusal: { code: code as RefusalCode, message: rawMessage(e) } };
    throw e;
  }
}

export function SecretsPage() {
  const { client, session } = useApp();
  const [pageSize, setPageSize] = useState(25);
  const [tokens, setTokens] = useState<string[]>([""]);
  const [refreshKey, setRefreshKey] = useState(0);
  const [done, setDone] = useState("");
  const [formName, setFormName] = useState("");
  const valueRef = useRef<HTMLInputElement>(null);
  const pageToken = tokens[tokens.length - 1] ?? "";

  const listing = usePolled((signal) => loadListing(() => listSecretsPage(client, pageSize, pageToken, signal)), `${pageSize}|${pageToken}|${refreshKey}`);
  const refusal = listing.data?.refusal ?? null;
  const page = listing.data?.page ?? null;
  const canManage = session.can.manageSecrets && !refusal;
  const reload = (): void => setRefreshKey((k) => k + 1);

  const newValueFor = (name: string): void => {
    setFormName(name);
    valueRef.current?.focus();
  };

  return (
    <>
      <section className="panel" aria-labelledby="secrets-title">
        <h1 id="secrets-title">Secrets</h1>
        <p className="sub">
          Credentials that HTTP and CODE nodes use as <code>{"${secrets.NAME}"}</code> when they execute. A value is written here and never read back: no
          call returns one, and nothing stores it in a run.
        </p>
        {refusal ? <Refusal code={refusal.code} message={refusal.message} /> : null}
        {page ? (
          <>
            <div className="list-controls">
              <label className="inline" htmlFor="secrets-page-size">
                Per page
              </label>
              <select id="secrets-page-size" value={pageSize} onChange={(e) => (setPageSize(Number(e.target.value)), setTokens([""]))}>
                {PAGE_SIZES.map((n) => (
                  <option key={n} value={n}>
                    {n}
                  </option>
                ))}
              </select>
              <span className="spacer" />
              <span aria-live="polite" className="sub">
                Page {tokens.length}
                {listing.loading ? " · loading…" : ""}
              </span>
              <button type="button" onClick={() => setTokens((t) => t.slice(0, -1))} disabled={tokens.length <= 1}>
                Previous page
              </button>
              <button type="button" onClick={() => page.nextPageToken && setTokens((t) => [...t, page.nextPageToken])} disabled={!page.nextPageToken}>
                Next page
              </button>
            </div>
            <p className="sub" role="status">
              {done}
            </p>
            <SecretsTable secrets={page.secrets} canManage={canManage} onNewValue={newValueFor} onDeleted={(name) => (setDone(`Deleted ${name}.`), reload())} />
            {page.secrets.length === 0 ? <Empty>{tokens.length === 1 ? "No secret is stored in this namespace." : "No secrets on this page."}</Empty> : null}
          </>
        ) : null}
        <ErrorBanner error={listing.error} />
      </section>
      {canManage && page ? (
        <SetSecretForm
          name={formName}
          onNameChange={setFormName}
          valueRef={valueRef}
          onSet={(secret) => (setDone(`Set ${secret.name}: version ${secret.version}.`), reload())}
        />
      ) : null}
    </>
  );
}

/** The server's own words for why there are no secrets to show, and what to do about it. */
function Refusal({ code, message }: { code: RefusalCode; message: string }) {
  return (
    <div className="notice refusal" role="alert" data-code={code}>
      <p>{message}</p>
      <p className="hint">
        {code === "FAILED_PRECONDITION"
          ? "Secrets need the key-encryption key the server's operator gives it (--secrets-key-file or COMPOSER_SECRETS_KEY_FILE); until then none can be set, listed or used."
          : "Secrets are managed with an operator or admin token of the namespace."}
      </p>
    </div>
  );
}

interface TableProps {
  secrets: SecretSummary[];
  canManage: boolean;
  onNewValue: (name: string) => void;
  onDeleted: (name: string) => void;
}

function SecretsTable({ secrets, canManage, onNewValue, onDeleted }: TableProps) {
  const { client } = useApp();
  const [confirming, setConfirming] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  if (secrets.length === 0) return <ErrorBanner error={error} />;

  const remove = async (name: string): Promise<void> => {
    setBusy(true);
    setError(null);
    try {
      await deleteSecret(client, name);
      setConfirming(null);
      onDeleted(name);
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };

  return (
    <>
      <ErrorBanner error={error} />
      <table className="runs secrets">
        <caption className="visually-hidden">Secrets by name</caption>
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col">Version</th>
            <th scope="col">Updated</th>
            <th scope="col">Updated by</th>
            {canManage ? (
              <th scope="col">
                <span className="visually-hidden">Actions</span>
              </th>
            ) : null}
          </tr>
        </thead>
        <tbody>
          {secrets.map((s) => (
            <tr key={s.name} data-secret={s.name}>
              <td className="mono name">{s.name}</td>
              <td className="version">{s.version}</td>
              <td className="updated" title={`first set ${time(s.createTime)}`}>
                {time(s.updateTime)}
              </td>
              <td className="updated-by">{s.updatedBy || "—"}</td>
              {canManage ? (
                <td className="row-actions">
                  {confirming === s.name ? (
                    <span className="confirm-inline">
                      <span>Delete {s.name} and all its versions? A node that names it then fails.</span>
                      <button type="button" className="danger" disabled={busy} onClick={() => void remove(s.name)}>
                        Confirm delete<span className="visually-hidden"> of {s.name}</span>
                      </button>
                      {/* focus lands here, the harmless choice, as the Delete button goes away */}
                      <button type="button" disabled={busy} autoFocus onClick={() => setConfirming(null)}>
                        Keep<span className="visually-hidden"> {s.name}</span>
                      </button>
                    </span>
                  ) : (
                    <>
                      <button type="button" onClick={() => onNewValue(s.name)}>
                        New value<span className="visually-hidden"> for {s.name}</span>
                      </button>
                      <button type="button" onClick={() => (setError(null), setConfirming(s.name))}>
                        Delete<span className="visually-hidden"> {s.name}</span>
                      </button>
                    </>
                  )}
                </td>
              ) : null}
            </tr>
          ))}
        </tbody>
      </table>
    </>
  );
}

interface FormProps {
  name: string;
  onNameChange: (name: string) => void;
  valueRef: RefObject<HTMLInputElement | null>;
  onSet: (secret: SecretSummary) => void;
}

/** The server's complaints about a SetSecret call, by where the page shows them. */
interface Refused {
  name: string[];
  value: string[];
  other: string | null;
}

const NOTHING_REFUSED: Refused = { name: [], value: [], other: null };

function refusedOf(error: unknown): Refused {
  const violations = fieldViolations(error);
  const name = violations.filter((v) => v.field === "name").map((v) => v.description);
  const value = violations.filter((v) => v.field === "value").map((v) => v.description);
  const placed = name.length + value.length;
  // a refusal the fields do not explain is shown whole: FAILED_PRECONDITION, PERMISSION_DENIED, ...
  const other = placed > 0 && placed === violations.length ? null : REFUSALS.includes(errorCode(error)) ? rawMessage(error) : errorText(error);
  return { name, value, other };
}

function SetSecretForm({ name, onNameChange, valueRef, onSet }: FormProps) {
  const { client } = useApp();
  const [refused, setRefused] = useState<Refused>(NOTHING_REFUSED);
  const [busy, setBusy] = useState(false);
  const problem = name ? nameProblem(name) : null;

  const submit = async (event: FormEvent): Promise<void> => {
    event.preventDefault();
    const input = valueRef.current;
    if (!input) return;
    setBusy(true);
    try {
      const secret = await setSecret(client, name, input.value);
      input.value = "";
      onNameChange("");
      setRefused(NOTHING_REFUSED);
      onSet(secret);
    } catch (e) {
      setRefused(refusedOf(e));
    } finally {
      setBusy(false);
    }
  };

  const nameDescribedBy = ["secret-name-rule", problem ? "secret-name-check" : "", refused.name.length > 0 ? "secret-name-violation" : ""].filter(Boolean).join(" ");
  const valueDescribedBy = ["secret-value-hint", refused.value.length > 0 ? "secret-value-violation" : ""].filter(Boolean).join(" ");
  return (
    <section className="panel" aria-labelledby="set-secret-title">
      <h2 id="set-secret-title">Set a secret</h2>
      <p className="sub">A new name stores version 1; an existing name gets its next version, which runs use from their next node on.</p>
      <form className="secret-form" onSubmit={(e) => void submit(e)} aria-labelledby="set-secret-title">
        <div className="field wide">
          <label htmlFor="secret-name">Name</label>
          <input
            id="secret-name"
            className="mono"
            value={name}
            required
            autoComplete="off"
            spellCheck={false}
            aria-invalid={refused.name.length > 0 || problem !== null}
            aria-describedby={nameDescribedBy}
            onChange={(e) => {
              onNameChange(e.target.value);
              // the server's verdict was about the name as it was
              setRefused((r) => ({ ...r, name: [] }));
            }}
          />
          <p className="hint" id="secret-name-rule">
            {NAME_RULE}.
          </p>
          {problem ? (
            <p className="hint warn" id="secret-name-check">
              This name breaks the rule: {problem}.
            </p>
          ) : null}
          {refused.name.length > 0 ? (
            <p className="problems" id="secret-name-violation" role="alert">
              {refused.name.join("; ")}
            </p>
          ) : null}
        </div>
        <div className="field wide">
          <label htmlFor="secret-value">Value</label>
          {/* uncontrolled: the value lives in this input alone until it is sent */}
          <input
            id="secret-value"
            ref={valueRef}
            type="password"
            required
            autoComplete="new-password"
            spellCheck={false}
            aria-invalid={refused.value.length > 0}
            aria-describedby={valueDescribedBy}
          />
          <p className="hint" id="secret-value-hint">
            1 byte to 64 KiB, sent as UTF-8. Never shown again.
          </p>
          {refused.value.length > 0 ? (
            <p className="problems" id="secret-value-violation" role="alert">
              {refused.value.join("; ")}
            </p>
          ) : null}
        </div>
        <div className="field buttons">
          <button type="submit" className="primary" disabled={busy}>
            Set secret
          </button>
        </div>
      </form>
      <ErrorBanner error={refused.other} />
    </section>
  );
}
