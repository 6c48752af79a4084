// C23 (tests/conformance/README.md): large payloads move through the blob store, unseen by
// handlers, against the real server (its --blob-store a temporary folder, from the harness: the
// bytes go through BlobService's streams). Each test acts in a namespace of its own; the run
// itself is c23.ts's.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import type { SendEventRequest } from "../../src/gen/composer/v1/run_service_pb.js";
import { fromValue } from "../../src/values.js";
import { STREAMS, Recorder, c23Run, clientIn as clientOf, refOf } from "./c23.js";
import { hex, useServer } from "./harness.js";

const stack = useServer();

function clientIn(namespace: string, recorder?: Recorder): ReturnType<typeof clientOf> {
  return clientOf(stack.server.address, namespace, recorder);
}

describe("payloads", { timeout: 300_000 }, () => {
  test("c23 large payloads move through the blob store, unseen by handlers", async () => {
    await c23Run(stack.server.address, STREAMS);
  });

  test("c23 sendEvent uploads a large payload; uploadBlob of the same bytes gives the same reference", async () => {
    const s = hex();
    const namespace = `c23e-${s}`;
    const name = `c23e-${s}`;
    const calls = new Recorder();
    const client = clientIn(namespace, calls);
    try {
      await client.registerWorkflow(`
name: ${name}
nodes:
  - { id: wait, type: WAIT_FOR_EVENT, event: doc_ready }
output: { size: "\${size(nodes.wait.output.doc)}", got: "\${nodes.wait.output}" }
`);
      const run = await client.startRun(name, {});
      const payload = { doc: "p".repeat(100_000), k: "v" };
      await client.sendEvent("doc_ready", payload, { runId: run.runId });
      const sent = calls.requests<SendEventRequest>("SendEvent");
      const ref = refOf(fromValue(sent[0]?.payload), "SendEvent's payload");
      assert.equal(calls.count("UploadBlob"), 1);
      assert.deepEqual(await client.waitForResult(run.runId, { timeoutMs: 60_000 }), { size: 100_000, got: payload });

      const again = await client.uploadBlob(new TextEncoder().encode(JSON.stringify(payload)));
      assert.deepEqual(again, ref);
    } finally {
      client.close();
    }
  });
});
