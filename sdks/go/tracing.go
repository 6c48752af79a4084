package composer

// Tracing: the worker opens a span around each handler, a child of the
// server's lease span whose W3C context the task carries
// (Task.trace_context), and sends that span's context with the attempt's
// report, so a run is one trace across the server and its workers. The
// Client's StartRun and SendEvent carry the caller's span context, so the
// run's trace continues the caller's. The context always travels as W3C
// TraceContext, whatever propagator the program set globally: it is what
// the server reads.

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// TracerName is the instrumentation name of the handler spans.
const TracerName = "github.com/composer-dev/composer/sdks/go"

var w3c propagation.TraceContext

// startHandlerSpan starts the span of raw's handler as a child of the lease
// span raw carries (a new trace when it carries none) and returns ctx with
// the span in it.
func startHandlerSpan(ctx context.Context, tracer trace.Tracer, raw *pb.Task) (context.Context, trace.Span) {
	parent := w3c.Extract(ctx, propagation.MapCarrier(raw.GetTraceContext()))
	return tracer.Start(parent, "task "+raw.GetTaskName(),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("composer.run_id", raw.GetRunId()),
			attribute.String("composer.task_id", raw.GetTaskId()),
			attribute.String("composer.node_id", raw.GetNodeId()),
			attribute.Int("composer.attempt", int(raw.GetAttempt())),
			attribute.String("composer.queue", raw.GetQueue()),
			attribute.String("composer.workflow_name", raw.GetWorkflowName()),
			attribute.String("composer.namespace", raw.GetNamespace()),
		))
}

// endHandlerSpan ends a handler span: status Ok when failure is empty, else
// Error with failure as its description and err, if any, recorded.
func endHandlerSpan(span trace.Span, failure string, err error) {
	if failure == "" {
		span.SetStatus(codes.Ok, "")
	} else {
		if err != nil {
			span.RecordError(err)
		}
		span.SetStatus(codes.Error, failure)
	}
	span.End()
}

// reportTraceMetadata is the W3C context of a handler span as gRPC metadata
// pairs for the attempt's reports; none when the span is not recorded: a
// no-op provider's span only echoes the lease span, which the server knows.
func reportTraceMetadata(span trace.Span) []string {
	if !span.IsRecording() {
		return nil
	}
	return traceMetadata(trace.ContextWithSpan(context.Background(), span))
}

// traceMetadata is the W3C context of ctx's span as metadata pairs
// (traceparent, and tracestate when there is one); none without a valid span.
func traceMetadata(ctx context.Context) []string {
	carrier := propagation.MapCarrier{}
	w3c.Inject(ctx, carrier)
	pairs := make([]string, 0, 2*len(carrier))
	for key, value := range carrier {
		pairs = append(pairs, key, value)
	}
	return pairs
}

// withTraceMetadata adds metadata pairs to ctx's outgoing metadata.
func withTraceMetadata(ctx context.Context, pairs []string) context.Context {
	if len(pairs) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, pairs...)
}
