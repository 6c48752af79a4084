// C16 locally (tests/conformance/README.md): the handler's span continues the server's lease span
// the task carries, is active in the handler, ends with the attempt's outcome before the report,
// and the report names it; StartRun continues the caller's span; with no tracer provider nothing
// is sent. (That the SDK works without @opentelemetry/api installed is shown by test/pack.)
import assert from "node:assert/strict";
import { before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { context, SpanKind, SpanStatusCode, trace, type SpanContext } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from "@opentelemetry/sdk-trace-base";

import { Backoff, CANCEL_RUN_CANCELLED, Client, Worker, type Handler, type WorkerOptions } from "../../src/index.js";
import { FakeServer, task } from "./fake.js";

const QUIET = { debug() {}, info() {}, warn() {}, error() {} };
const LEASE_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736";
const LEASE_SPAN_ID = "00f067aa0ba902b7";
/** The server's lease span, as Task.trace_context carries it. */
const LEASE_CONTEXT = { traceparent: `00-${LEASE_TRACE_ID}-${LEASE_SPAN_ID}-01`, tracestate: "composer=1" };

function recordingProvider(): { provider: BasicTracerProvider; exporter: InMemorySpanExporter } {
  const exporter = new InMemorySpanExporter();
  return { provider: new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }), exporter };
}

function traceparent(spanContext: SpanContext): string {
  return `00-${spanContext.traceId}-${spanContext.spanId}-${spanContext.traceFlags.toString(16).padStart(2, "0")}`;
}

function named(exporter: InMemorySpanExporter, name: string): ReadableSpan {
  const span = exporter.getFinishedSpans().find((s) => s.name === name);
  assert.ok(span, `no finished span ${name}`);
  return span;
}

/** Serves the fake's tasks with `handler` (task name "t" on queue "q") until `done()`, then stops. */
async function serve(fake: FakeServer, handler: Handler, done: () => boolean, options: WorkerOptions = {}): Promise<void> {
  const worker = new Worker({ transport: fake, slots: 2, backoff: new Backoff({ initialMs: 10, maximumMs: 50 }), logger: QUIET, pollWaitMs: 100, ...options });
  worker.task("q", "t", handler);
  const served = worker.serve();
  const deadline = Date.now() + 10_000;
  while (!done() && Date.now() < deadline) await sleep(10);
  worker.stop();
  await served;
  assert.ok(done(), "the scenario did not finish within 10 s");
}

describe("tracing (local, fake server)", () => {
  before(() => {
    // What a Node application's OpenTelemetry setup does: the active span follows async calls.
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  });

  test("c16 the handler's span continues the lease span, is active in the handler, and the report names it", async () => {
    const { provider, exporter } = recordingProvider();
    const userTracer = provider.getTracer("user code");
    const endedBeforeReport: Record<string, boolean> = {};
    const sawReport = (request: { taskId: string }) => {
      endedBeforeReport[request.taskId] = exporter.getFinishedSpans().some((s) => s.attributes["composer.task_id"] === request.taskId);
      return {};
    };
    const fake = new FakeServer({ CompleteTask: sawReport, FailTask: sawReport });
    fake.tasks.push(task({ taskId: "good", traceContext: LEASE_CONTEXT }), task({ taskId: "bad", traceContext: LEASE_CONTEXT }));
    await serve(
      fake,
      async (ctx) => {
        if (ctx.taskId === "bad") throw new RangeError("card declined");
        await userTracer.startActiveSpan("user work", async (span) => {
          await sleep(1);
          span.end();
        });
        return { charged: true };
      },
      () => fake.requests("CompleteTask").length === 1 && fake.requests("FailTask").length === 1,
      { tracerProvider: provider },
    );

    const spans = exporter.getFinishedSpans().filter((s) => s.name === "task t");
    assert.equal(spans.length, 2);
    const good = spans.find((s) => s.attributes["composer.task_id"] === "good") as ReadableSpan;
    const bad = spans.find((s) => s.attributes["composer.task_id"] === "bad") as ReadableSpan;
    for (const span of [good, bad]) {
      assert.equal(span.spanContext().traceId, LEASE_TRACE_ID);
      assert.equal(span.parentSpanContext?.spanId, LEASE_SPAN_ID);
      assert.equal(span.parentSpanContext?.isRemote, true);
      assert.equal(span.kind, SpanKind.CONSUMER);
    }
    assert.deepEqual(good.attributes, {
      "composer.run_id": "run-1",
      "composer.task_id": "good",
      "composer.node_id": "work",
      "composer.attempt": 1,
      "composer.queue": "q",
      "composer.workflow_name": "wf",
      "composer.namespace": "default",
    });
    const user = named(exporter, "user work");
    assert.equal(user.parentSpanContext?.spanId, good.spanContext().spanId, "the user's span is the handler span's child");
    assert.equal(user.spanContext().traceId, LEASE_TRACE_ID);
    assert.equal(good.status.code, SpanStatusCode.OK);
    assert.deepEqual(bad.status, { code: SpanStatusCode.ERROR, message: "RangeError: card declined" });
    assert.deepEqual(
      bad.events.map((e) => [e.name, e.attributes?.["exception.type"]]),
      [["exception", "RangeError"]],
    );

    const [completeHeaders] = fake.headers("CompleteTask");
    const [failHeaders] = fake.headers("FailTask");
    assert.equal(completeHeaders?.get("traceparent"), traceparent(good.spanContext()));
    assert.equal(failHeaders?.get("traceparent"), traceparent(bad.spanContext()));
    assert.equal(completeHeaders?.get("tracestate"), "composer=1");
    assert.deepEqual(endedBeforeReport, { good: true, bad: true });
  });

  test("c16 a cancelled attempt ends its span as an error naming the cause", async () => {
    const { provider, exporter } = recordingProvider();
    const fake = new FakeServer({ Heartbeat: () => ({ cancelRequested: true }) });
    fake.tasks.push(task({ traceContext: LEASE_CONTEXT }));
    await serve(
      fake,
      (ctx) => new Promise((resolve) => ctx.signal.addEventListener("abort", resolve)),
      () => exporter.getFinishedSpans().length === 1,
      { tracerProvider: provider, heartbeatIntervalMs: 20 },
    );
    assert.deepEqual(named(exporter, "task t").status, { code: SpanStatusCode.ERROR, message: CANCEL_RUN_CANCELLED });
    assert.equal(fake.requests("CompleteTask").length + fake.requests("FailTask").length, 0);
  });

  test("c16 with no tracer provider the worker works and sends no trace context", async () => {
    const fake = new FakeServer();
    fake.tasks.push(task({ traceContext: LEASE_CONTEXT }));
    await serve(fake, () => "ok", () => fake.requests("CompleteTask").length === 1);
    assert.equal(fake.headers("CompleteTask")[0]?.get("traceparent"), null);
  });

  test("c16 startRun and sendEvent inside a span continue the caller's trace", async () => {
    const { provider } = recordingProvider();
    const fake = new FakeServer({ StartRun: () => ({ run: { runId: "r-1", workflowName: "order" }, created: true }) });
    const client = new Client({ transport: fake });
    const caller = await provider.getTracer("app").startActiveSpan("checkout", async (span) => {
      await client.startRun("order");
      await client.sendEvent("paid", null, { runId: "r-1" });
      span.end();
      return span.spanContext();
    });
    await client.startRun("order");
    assert.deepEqual(
      [...fake.headers("StartRun"), ...fake.headers("SendEvent")].map((h) => h.get("traceparent")),
      [traceparent(caller), null, traceparent(caller)],
    );
    assert.equal(trace.getActiveSpan(), undefined);
  });
});
