// OpenTelemetry tracing of task attempts and run starts (Node only: the /web entry never loads it).
//
// @opentelemetry/api is an optional peer dependency, imported on first use; without it nothing here
// does anything. A run is one trace across the server and its workers: the worker's span of each
// handler continues the server's lease span, whose W3C context the task carries
// (`Task.traceContext`), and the attempt's report carries the handler span's context back; the
// client's StartRun carries its caller's. The context always travels as W3C TraceContext, whatever
// propagator the application set globally: it is what the server reads. The API package has no
// W3C propagator (it lives in @opentelemetry/core), so the two headers are read and written here.
import type { Context, Span, Tracer } from "@opentelemetry/api";

import type { Task } from "./gen/composer/v1/worker_service_pb.js";

type OpenTelemetry = typeof import("@opentelemetry/api");

/** The instrumentation name of the handler spans. */
export const TRACER_NAME = "@composer-dev/composer";

let loading: Promise<OpenTelemetry | undefined> | undefined;

/** @opentelemetry/api when the application has it (imported once), else undefined. */
export function loadOpenTelemetry(): Promise<OpenTelemetry | undefined> {
  loading ??= import("@opentelemetry/api").then(
    (api) => api,
    () => undefined,
  );
  return loading;
}

// version-traceid-parentid-flags; a version other than 00 may append fields, ff is invalid.
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** The context holding the remote span that `carrier` (traceparent, tracestate) names; ROOT without a valid one. */
function extract(api: OpenTelemetry, carrier: Record<string, string>): Context {
  const match = TRACEPARENT.exec((carrier["traceparent"] ?? "").trim());
  if (!match || match[1] === "ff" || (match[1] === "00" && match[5] !== undefined)) return api.ROOT_CONTEXT;
  const state = carrier["tracestate"];
  const spanContext = {
    traceId: match[2] as string,
    spanId: match[3] as string,
    traceFlags: parseInt(match[4] as string, 16),
    isRemote: true,
    ...(state ? { traceState: api.createTraceState(state) } : {}),
  };
  if (!api.trace.isSpanContextValid(spanContext)) return api.ROOT_CONTEXT;
  return api.trace.setSpanContext(api.ROOT_CONTEXT, spanContext);
}

/** The W3C headers naming the span of `context`; none without a valid one. */
function inject(api: OpenTelemetry, context: Context): Record<string, string> {
  const spanContext = api.trace.getSpanContext(context);
  if (!spanContext || !api.trace.isSpanContextValid(spanContext)) return {};
  const flags = (spanContext.traceFlags & 0xff).toString(16).padStart(2, "0");
  const headers: Record<string, string> = { traceparent: `00-${spanContext.traceId}-${spanContext.spanId}-${flags}` };
  const state = spanContext.traceState?.serialize();
  if (state) headers["tracestate"] = state;
  return headers;
}

/** The W3C headers of the caller's active span, for StartRun and SendEvent; none without one. */
export async function callerTraceHeaders(): Promise<Record<string, string>> {
  const api = await loadOpenTelemetry();
  return api ? inject(api, api.context.active()) : {};
}

/** What a worker traces with: the API and the tracer of its handler spans. */
export interface Tracing {
  api: OpenTelemetry;
  tracer: Tracer;
}

/** The worker's tracing (the tracer of `provider`, else of the global provider); undefined without the API. */
export async function workerTracing(provider?: { getTracer(name: string): unknown }): Promise<Tracing | undefined> {
  const api = await loadOpenTelemetry();
  if (!api) return undefined;
  return { api, tracer: (provider?.getTracer(TRACER_NAME) as Tracer | undefined) ?? api.trace.getTracer(TRACER_NAME) };
}

/** The span of one attempt's handler, a child of the lease span the task carries; inert without OpenTelemetry. */
export class HandlerSpan {
  /** The span's W3C context for the attempt's reports: none unless the span is recorded (a no-op
   * tracer's span would only echo the lease span back). */
  readonly reportHeaders: Record<string, string> = {};
  readonly #api: OpenTelemetry | undefined;
  readonly #context: Context | undefined;
  #span: Span | undefined;

  constructor(task: Task, tracing: Tracing | undefined) {
    if (!tracing) return;
    const { api, tracer } = tracing;
    const parent = extract(api, task.traceContext);
    const span = tracer.startSpan(
      `task ${task.taskName}`,
      {
        kind: api.SpanKind.CONSUMER,
        attributes: {
          "composer.run_id": task.runId,
          "composer.task_id": task.taskId,
          "composer.node_id": task.nodeId,
          "composer.attempt": task.attempt,
          "composer.queue": task.queue,
          "composer.workflow_name": task.workflowName,
          "composer.namespace": task.namespace,
        },
      },
      parent,
    );
    this.#api = api;
    this.#span = span;
    this.#context = api.trace.setSpan(parent, span);
    if (span.isRecording()) this.reportHeaders = inject(api, this.#context);
  }

  /** Calls `fn` with the span active (with a context manager registered, for what `fn` starts too). */
  run<T>(fn: () => T): T {
    return this.#api && this.#context ? this.#api.context.with(this.#context, fn) : fn();
  }

  /** Ends the span (once): status OK without `failure`, else ERROR described by it, `error` recorded. */
  end(failure?: string, error?: unknown): void {
    const span = this.#span;
    const api = this.#api;
    this.#span = undefined;
    if (!span || !api) return;
    if (failure === undefined) span.setStatus({ code: api.SpanStatusCode.OK });
    else {
      if (error !== undefined) span.recordException(error instanceof Error ? error : String(error));
      span.setStatus({ code: api.SpanStatusCode.ERROR, message: failure });
    }
    span.end();
  }
}
