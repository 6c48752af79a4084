#!/usr/bin/env node
// composer-code-runner-js: serves JavaScript CODE nodes (queue code.javascript) until SIGTERM.
import { parseArgs } from "node:util";

import { DEFAULT_MEMORY_LIMIT_MB, DEFAULT_TIME_LIMIT_MS, SandboxUnavailable } from "../code-runner.js";
import { Worker, consoleLogger } from "../worker.js";

const { values } = parseArgs({
  options: {
    address: { type: "string", default: process.env["COMPOSER_ADDRESS"] ?? "127.0.0.1:7070" },
    token: { type: "string" },
    slots: { type: "string", default: "4" },
    queue: { type: "string", default: "code.javascript" },
    "time-limit": { type: "string", default: String(DEFAULT_TIME_LIMIT_MS / 1000) },
    "memory-limit": { type: "string", default: String(DEFAULT_MEMORY_LIMIT_MB) },
    "drain-timeout": { type: "string", default: "30" },
    "allow-network-in-snippets": { type: "boolean", default: false },
    help: { type: "boolean", default: false },
  },
});
if (values.help) {
  console.log(`composer-code-runner-js [--address HOST:PORT] [--token T] [--slots 4] [--queue code.javascript]
  [--time-limit SECONDS] [--memory-limit MIB] [--drain-timeout SECONDS] [--allow-network-in-snippets]
Serves JavaScript CODE nodes of a Composer server (COMPOSER_ADDRESS, COMPOSER_TOKEN).
Each snippet runs in new network, mount and PID namespaces (as nobody when root); where the kernel
gives none the runner refuses to start unless --allow-network-in-snippets (snippets can then reach
the network).`);
  process.exit(0);
}
const worker = new Worker({
  address: values.address,
  ...(values.token ? { token: values.token } : {}),
  slots: Number(values.slots),
  drainTimeoutMs: Number(values["drain-timeout"]) * 1000,
  logger: consoleLogger(process.env["COMPOSER_LOG_LEVEL"] ?? "info"),
});
try {
  worker.serveCode({
    queue: values.queue,
    timeLimitMs: Number(values["time-limit"]) * 1000,
    memoryLimitMb: Number(values["memory-limit"]),
    allowNetworkInSnippets: values["allow-network-in-snippets"],
  });
} catch (error) {
  if (!(error instanceof SandboxUnavailable)) throw error;
  console.error(`composer-code-runner-js: ${error.message}`);
  process.exit(2);
}
await worker.run();
process.exit(0);
