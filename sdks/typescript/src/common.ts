// What both entry points export besides their Client.
export { ComposerClient, checkProtocolVersion, PROTOCOL_MAJOR, PROTOCOL_MINOR } from "./client.js";
export type {
  BaseClientOptions,
  BulkRunsOptions,
  BulkRunsWithReasonOptions,
  ClientOptions,
  CreateScheduleOptions,
  ListRunsOptions,
  QueueRateLimitOptions,
  ScheduleOptions,
  SendEventOptions,
  StartRunOptions,
  WaitBulkOperationOptions,
  WaitOptions,
  WorkflowSource,
} from "./client.js";
export {
  ComposerError,
  LEASE_LOST,
  NonRetryableError,
  RunFailedError,
  TaskError,
  TimeoutError,
  decodeBadRequest,
  decodeErrorInfo,
  isAlreadyExists,
  isCancelled,
  isDeadlineExceeded,
  isFailedPrecondition,
  isInternal,
  isInvalidArgument,
  isLeaseLost,
  isNotFound,
  isPermissionDenied,
  isResourceExhausted,
  isUnauthenticated,
  isUnavailable,
  isUnimplemented,
  toComposerError,
} from "./errors.js";
export type { ComposerErrorInit, FieldViolation, StatusCode, TaskErrorOptions } from "./errors.js";
export { isBulkOperationDone, isFinalStatus } from "./models.js";
export type {
  BulkOperation,
  BulkOperationFailure,
  BulkOperationKind,
  BulkOperationStatus,
  EventDelivery,
  Failure,
  FireOutcome,
  HistoryEvent,
  NodeState,
  NodeStatus,
  OverlapPolicy,
  QueueRateLimit,
  Run,
  RunFilter,
  RunStatus,
  Schedule,
  ScheduleAction,
  ScheduleFire,
  ScheduleSpec,
  ServerInfo,
  ValidationProblem,
  WorkflowVersion,
} from "./models.js";
export { Backoff } from "./backoff.js";
export type { BackoffOptions } from "./backoff.js";
export { NotJsonError, fromValue, toJsonValue, toValue } from "./values.js";
export type { Json } from "./values.js";
