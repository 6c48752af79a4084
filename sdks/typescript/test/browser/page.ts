// The browser test page's script (bundled by esbuild): the /web entry point's Client over grpc-web.
// Query: ?server=<url>&token=<jwt>&workflow=<name>&mode=run|info|blob (&sha256=<digest>). Writes its outcome to
// window.composerResult.
import { Client, isUnauthenticated, type RunStatus } from "../../src/web.js";

declare global {
  interface Window {
    composerResult?: unknown;
  }
}

async function main(): Promise<unknown> {
  const params = new URLSearchParams(location.search);
  const client = new Client({ baseUrl: params.get("server") ?? "", token: params.get("token") ?? "" });
  if (params.get("mode") === "info") {
    try {
      const info = await client.serverInfo();
      return { ok: true, protocolVersion: info.protocolVersion };
    } catch (error) {
      return { ok: false, error: String(error), code: (error as { code?: string }).code, unauthenticated: isUnauthenticated(error) };
    }
  }
  if (params.get("mode") === "blob") {
    // Large payloads over grpc-web: downloads stream, an upload cannot; a large input goes inline.
    const sha256 = params.get("sha256") ?? "";
    const bytes = await client.downloadBlob(sha256);
    const resolved = await client.resolvePayload({ wrapped: { $blob: { sha256, size: bytes.length, head: "" } } });
    const upload = await client.uploadBlob(bytes).then(
      () => "uploaded",
      (error: unknown) => (error as { code?: string }).code,
    );
    const big = await client.startRun(params.get("workflow") ?? "", { doc: "w".repeat(100_000) });
    return { ok: true, size: bytes.length, text: new TextDecoder().decode(bytes), resolved, upload, bigRunId: big.runId };
  }
  const started = await client.startRun(params.get("workflow") ?? "", { x: 20 }, { labels: { from: "browser" } });
  const statuses: RunStatus[] = [];
  let output: unknown = null;
  for await (const run of client.watchRun(started.runId)) {
    statuses.push(run.status);
    output = run.output;
  }
  const history: string[] = [];
  for await (const event of client.getRunHistory(started.runId)) history.push(event.eventType);
  return { ok: true, runId: started.runId, created: started.created, statuses, output, history };
}

main().then(
  (result) => (window.composerResult = result),
  (error: unknown) => (window.composerResult = { ok: false, error: String(error) }),
);
