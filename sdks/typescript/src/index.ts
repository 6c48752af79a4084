// @composer-dev/composer (Node): the Client over HTTP/2 gRPC, the Worker, and the JavaScript code runner.
export { Client } from "./node-client.js";
export type { NodeClientOptions } from "./node-client.js";
export { DEFAULT_ADDRESS, createNodeTransport } from "./transport-node.js";
export * from "./common.js";
export {
  CANCEL_ATTEMPT_DEADLINE,
  CANCEL_ATTEMPT_FAILED,
  CANCEL_LEASE_LOST,
  CANCEL_RUN_CANCELLED,
  CANCEL_SHUTDOWN,
  Slots,
  TaskCancelledError,
  TaskSecrets,
  Worker,
} from "./worker.js";
export { consoleLogger, failureOf, MAX_POLL_TASKS } from "./worker.js";
export type { CancelKind, Handler, Logger, TaskContext, TracerProviderLike, WorkerOptions, WorkerStats } from "./worker.js";
export {
  DEFAULT_MEMORY_LIMIT_MB,
  DEFAULT_TIME_LIMIT_MS,
  SandboxUnavailable,
  defaultSandbox,
  detectSandbox,
  makeCodeHandler,
  runSnippet,
} from "./code-runner.js";
export type { CodeRunnerOptions, Sandbox, SnippetOptions, SnippetResult } from "./code-runner.js";
