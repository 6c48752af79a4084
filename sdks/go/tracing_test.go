package composer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// The server's lease span, as Task.trace_context carries it.
const (
	leaseTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	leaseSpanID  = "00f067aa0ba902b7"
)

func leasedWithTrace(id, name string) *pb.Task {
	task := fakeTask(id, "q", name, 3*time.Second, nil)
	task.TraceContext = map[string]string{"traceparent": "00-" + leaseTraceID + "-" + leaseSpanID + "-01", "tracestate": "composer=1"}
	return task
}

// reportRecorder keeps each report's metadata and whether the handler's
// span had been exported when the report arrived.
type reportRecorder struct {
	mu       sync.Mutex
	md       map[string]metadata.MD
	exported map[string]int
}

func recordReports(f *fakeServer, exporter *tracetest.InMemoryExporter) *reportRecorder {
	r := &reportRecorder{md: map[string]metadata.MD{}, exported: map[string]int{}}
	f.onReport = func(method, taskID string, md metadata.MD) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.md[method+" "+taskID] = md
		if exporter != nil {
			r.exported[taskID] = len(exporter.GetSpans())
		}
	}
	return r
}

func (r *reportRecorder) get(method, taskID string) metadata.MD {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.md[method+" "+taskID]
}

func spanNamed(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no span %q among %d", name, len(spans))
	return tracetest.SpanStub{}
}

func traceparentOf(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

// The handler's span continues the lease span of Task.trace_context, is
// current in the handler (the user's span is its child), ends with the
// attempt's outcome before the report, and the report names it.
func TestHandlerSpansContinueTheLeaseSpanAndReportsNameThem(t *testing.T) {
	exporter := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	f, client := startFake(t)
	reports := recordReports(f, exporter)
	f.add(leasedWithTrace("good", "charge"), leasedWithTrace("bad", "refund"))
	w := NewWorker(client, WorkerOptions{Slots: 2, PollWait: 200 * time.Millisecond, Backoff: fastBackoff, TracerProvider: provider})
	w.Handle("q", "charge", func(ctx context.Context, task *Task) (any, error) {
		_, span := provider.Tracer("user").Start(ctx, "user work")
		span.End()
		return "ok", nil
	})
	w.Handle("q", "refund", func(ctx context.Context, task *Task) (any, error) { return nil, errors.New("card declined") })
	stop := runWorker(t, w)
	eventually(t, 10*time.Second, "both reports", func() bool { s := w.Stats(); return s.Completed == 1 && s.Failed == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	spans := exporter.GetSpans()
	good, bad, user := spanNamed(t, spans, "task charge"), spanNamed(t, spans, "task refund"), spanNamed(t, spans, "user work")
	for _, s := range []tracetest.SpanStub{good, bad} {
		if s.SpanContext.TraceID().String() != leaseTraceID || s.Parent.SpanID().String() != leaseSpanID || !s.Parent.IsRemote() {
			t.Errorf("%s: trace %s parent %s, want the lease span %s/%s", s.Name, s.SpanContext.TraceID(), s.Parent.SpanID(), leaseTraceID, leaseSpanID)
		}
		if s.SpanKind != trace.SpanKindConsumer {
			t.Errorf("%s: kind %s, want consumer", s.Name, s.SpanKind)
		}
	}
	want := map[attribute.Key]attribute.Value{
		"composer.run_id": attribute.StringValue("run-good"), "composer.task_id": attribute.StringValue("good"),
		"composer.node_id": attribute.StringValue("node-good"), "composer.attempt": attribute.IntValue(1),
		"composer.queue": attribute.StringValue("q"), "composer.workflow_name": attribute.StringValue("wf"),
		"composer.namespace": attribute.StringValue("default"),
	}
	got := map[attribute.Key]attribute.Value{}
	for _, kv := range good.Attributes {
		got[kv.Key] = kv.Value
	}
	for key, value := range want {
		if got[key] != value {
			t.Errorf("attribute %s = %s, want %s", key, got[key].String(), value.String())
		}
	}
	if user.Parent.SpanID() != good.SpanContext.SpanID() || user.SpanContext.TraceID() != good.SpanContext.TraceID() {
		t.Errorf("the user's span has parent %s, want the handler's %s", user.Parent.SpanID(), good.SpanContext.SpanID())
	}
	if good.Status.Code != codes.Ok {
		t.Errorf("the completed attempt's span has status %v", good.Status)
	}
	if bad.Status.Code != codes.Error || bad.Status.Description != "ERROR: card declined" {
		t.Errorf("the failed attempt's span has status %+v", bad.Status)
	}
	if len(bad.Events) != 1 || bad.Events[0].Name != "exception" {
		t.Errorf("the failed attempt's span has events %+v, want the exception", bad.Events)
	}

	for _, report := range []struct {
		method, taskID string
		span           tracetest.SpanStub
	}{{"CompleteTask", "good", good}, {"FailTask", "bad", bad}} {
		md := reports.get(report.method, report.taskID)
		if got, want := md.Get("traceparent"), traceparentOf(report.span.SpanContext); len(got) != 1 || got[0] != want {
			t.Errorf("%s sent traceparent %v, want %s", report.method, got, want)
		}
		if got := md.Get("tracestate"); len(got) != 1 || got[0] != "composer=1" {
			t.Errorf("%s sent tracestate %v, want the lease's", report.method, got)
		}
		reports.mu.Lock()
		exported := reports.exported[report.taskID]
		reports.mu.Unlock()
		if exported == 0 {
			t.Errorf("%s arrived before the handler's span ended", report.method)
		}
	}
}

// Without a TracerProvider (the global no-op one) the worker works as
// before and its reports carry no trace context.
func TestNoTracerProviderSendsNoTraceContext(t *testing.T) {
	f, client := startFake(t)
	reports := recordReports(f, nil)
	f.add(leasedWithTrace("plain", "work"))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, Backoff: fastBackoff})
	w.Handle("q", "work", func(ctx context.Context, task *Task) (any, error) { return 1, nil })
	runWorker(t, w)
	eventually(t, 10*time.Second, "completion", func() bool { return w.Stats().Completed == 1 })
	md := reports.get("CompleteTask", "plain")
	if md == nil {
		t.Fatal("the report was not seen")
	}
	if got := md.Get("traceparent"); len(got) != 0 {
		t.Errorf("a worker with no tracer provider sent traceparent %v", got)
	}
}

type fakeRuns struct {
	pb.UnimplementedRunServiceServer
	mu sync.Mutex
	md []metadata.MD
}

func (f *fakeRuns) record(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.md = append(f.md, md)
}

func (f *fakeRuns) StartRun(ctx context.Context, req *pb.StartRunRequest) (*pb.StartRunResponse, error) {
	f.record(ctx)
	return &pb.StartRunResponse{Run: &pb.Run{RunId: "r-1", WorkflowName: req.GetWorkflowName()}, Created: true}, nil
}

func (f *fakeRuns) SendEvent(ctx context.Context, _ *pb.SendEventRequest) (*pb.SendEventResponse, error) {
	f.record(ctx)
	return &pb.SendEventResponse{}, nil
}

// StartRun and SendEvent from inside a span carry its trace context, so
// the run's trace continues the caller's; without a span they carry none.
func TestStartRunCarriesTheCallersTraceContext(t *testing.T) {
	runs := &fakeRuns{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterRunServiceServer(srv, runs)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	client, err := Dial(context.Background(), lis.Addr().String(), WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })

	provider := sdktrace.NewTracerProvider()
	ctx, caller := provider.Tracer("app").Start(context.Background(), "checkout")
	defer caller.End()
	if _, err := client.StartRun(ctx, "order", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := client.SendEvent(ctx, Event{Name: "paid", RunID: "r-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StartRun(context.Background(), "order", nil); err != nil {
		t.Fatal(err)
	}
	runs.mu.Lock()
	defer runs.mu.Unlock()
	want := traceparentOf(caller.SpanContext())
	for i, call := range []string{"StartRun", "SendEvent"} {
		if got := runs.md[i].Get("traceparent"); len(got) != 1 || got[0] != want {
			t.Errorf("%s in a span sent traceparent %v, want %s", call, got, want)
		}
	}
	if got := runs.md[2].Get("traceparent"); len(got) != 0 {
		t.Errorf("StartRun outside any span sent traceparent %v", got)
	}
}
