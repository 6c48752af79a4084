// C24 (tests/conformance/README.md): presigned URLs move blobs straight to and from the store.
// The real server keeps its blobs in a bucket of a moto server (a real S3 API, which signs URLs)
// and serves /metrics; C23's run (c23.ts) then gives C23's result with every blob moved through
// URLs, and the server's composer_grpc_requests_total counts FinishBlobUpload and GetBlobUrl calls
// and no UploadBlob or DownloadBlob call.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { URLS, c23Run } from "./c23.js";
import { Moto, ServerProcess, backingServices, freePort, metricSamples } from "./harness.js";

let moto: Moto | undefined;
let services: ReturnType<typeof backingServices> | undefined;
let server: ServerProcess | undefined;
let metrics = "";

before(async () => {
  moto = await Moto.start("composer-ts-urls");
  services = backingServices();
  const metricsAddress = `127.0.0.1:${await freePort()}`;
  metrics = `http://${metricsAddress}/metrics`;
  server = new ServerProcess(services.databaseUrl, services.redisUrl, [...moto.serverArgs(), "--metrics-listen", metricsAddress], {
    blobStore: moto.location,
  });
  await server.start();
});

after(async () => {
  await server?.stop();
  services?.drop();
  await moto?.stop();
});

/**
 * BlobService's lines of composer_grpc_requests_total (`{method="/composer.v1.BlobService/GetBlobUrl",
 * code="Ok"} 5`), each with the method's last part, its code and its value.
 */
async function blobRequests(): Promise<{ method: string; code: string; value: number }[]> {
  const response = await fetch(metrics);
  assert.equal(response.status, 200);
  const samples = metricSamples(await response.text(), "composer_grpc_requests_total");
  assert.ok(samples.length > 0, "composer_grpc_requests_total has samples");
  const prefix = "/composer.v1.BlobService/";
  return samples
    .filter(({ labels }) => labels["method"]?.startsWith(prefix))
    .map(({ labels, value }) => ({ method: (labels["method"] as string).slice(prefix.length), code: labels["code"] as string, value }));
}

describe("blob urls", { timeout: 300_000 }, () => {
  test("c24 C23's run moves every blob through presigned URLs: no UploadBlob or DownloadBlob reaches the server", async () => {
    const s = server as ServerProcess;
    await c23Run(s.address, URLS);

    const lines = await blobRequests();
    const seen = JSON.stringify(lines);
    const total = (method: string, code?: string): number =>
      lines.filter((l) => l.method === method && (code === undefined || l.code === code)).reduce((sum, l) => sum + l.value, 0);
    for (const method of ["StartBlobUpload", "FinishBlobUpload", "GetBlobUrl"]) {
      assert.ok(total(method, "Ok") > 0, `${method} answered Ok: ${seen}`);
    }
    for (const method of ["UploadBlob", "DownloadBlob"]) {
      assert.equal(total(method), 0, `${method}: ${seen}`);
    }
  });
});
