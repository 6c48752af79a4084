// A reference to an offloaded value (docs/payloads.md) where a payload is shown: its size, the
// start of its digest and its first bytes, and a download of the whole value through BlobService
// with the session's client (token and namespace as every call). The bytes are never shown.
import { useState } from "react";

import { errorText } from "../api";
import { blobFileName, saveBytes, type BlobInfo } from "../blobs";
import { useApp } from "../context";
import { bytes } from "../format";

export function BlobReference({ blob, inline = false }: { blob: BlobInfo; inline?: boolean }) {
  const { client } = useApp();
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const short = blob.sha256.slice(0, 12);
  const headBytes = new TextEncoder().encode(blob.head).length;
  const download = async (): Promise<void> => {
    setBusy(true);
    setError(null);
    try {
      saveBytes(await client.downloadBlob(blob.sha256), blobFileName(blob));
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };
  return (
    <span className={inline ? "blob-ref inline" : "blob-ref"} data-blob={blob.sha256} role="group" aria-label={`Offloaded value ${short}`}>
      <span className="blob-meta" title={`sha256 ${blob.sha256}`}>
        blob · {bytes(blob.size)} · sha256 {short}…
      </span>{" "}
      <button type="button" className="blob-download" onClick={() => void download()} disabled={busy} aria-label={`Download blob ${short}`}>
        {busy ? "Downloading…" : "Download"}
      </button>
      {blob.head ? (
        <span className="blob-head" title={`The first ${headBytes} of ${blob.size} bytes`}>
          <span className="blob-head-label">first bytes:</span> <code className="blob-head-text">{blob.head}</code>
          {headBytes < blob.size ? "…" : null}
        </span>
      ) : null}
      {error ? (
        <span className="blob-error" role="alert">
          Download failed: {error}
        </span>
      ) : null}
    </span>
  );
}
