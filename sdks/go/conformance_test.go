package composer_test

// The SDK conformance behaviours of tests/conformance/README.md, against the
// real server (harness_test.go starts it). Each test is named after its
// number. C10 (the Python code runner) is Python's and TypeScript's: the Go
// SDK has no code runner, so there is no TestC10.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	composer "github.com/composer-dev/composer/sdks/go"
	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

func threeStep(n string) composer.Source {
	return composer.YAML([]byte(fmt.Sprintf(`
name: three-step-%[1]s
description: conformance C1
nodes:
  - { id: a, type: TASK, queue: steps-%[1]s, task: add_one, input: { x: "${input.x}" } }
  - { id: b, type: TASK, queue: steps-%[1]s, task: double, input: { x: "${nodes.a.output.x}" } }
  - { id: c, type: TASK, queue: steps-%[1]s, task: describe, input: { x: "${nodes.b.output.x}" } }
edges:
  - { from: a, to: b }
  - { from: b, to: c }
output: { result: "${nodes.c.output}" }
`, n)))
}

type seenTask struct {
	node, run, workflow string
	attempt             int
	input               string
}

func TestC01AWorkerCompletesAThreeStepWorkflowAndTheClientGetsItsOutput(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 120*time.Second)
	client := dial(t, addr)
	w := composer.NewWorker(client, fast(2))
	var mu sync.Mutex
	var seen []seenTask
	record := func(task *composer.Task) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, seenTask{task.NodeID, task.RunID, task.WorkflowName, task.Attempt, string(task.Input)})
	}
	type x struct {
		X int `json:"x"`
	}
	queue := "steps-" + n
	// A plain Handler, a Typed one, and one that decodes by hand.
	w.Handle(queue, "add_one", func(ctx context.Context, task *composer.Task) (any, error) {
		record(task)
		var in x
		if err := task.Decode(&in); err != nil {
			return nil, err
		}
		return x{in.X + 1}, nil
	})
	w.Handle(queue, "double", composer.Typed(func(ctx context.Context, in x) (x, error) {
		record(composer.TaskFromContext(ctx))
		return x{in.X * 2}, nil
	}))
	w.Handle(queue, "describe", func(ctx context.Context, task *composer.Task) (any, error) {
		record(task)
		var in x
		_ = task.Decode(&in)
		return map[string]any{"value": in.X, "run": task.RunID}, nil
	})
	serve(t, w)

	registered, err := client.RegisterWorkflow(ctx, threeStep(n))
	if err != nil {
		t.Fatal(err)
	}
	if registered.Name != "three-step-"+n || registered.Version != 1 || !registered.Created {
		t.Fatalf("registered %+v", registered)
	}
	run, err := client.StartRun(ctx, registered.Name, map[string]int{"x": 4})
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Result struct {
			Value int    `json:"value"`
			Run   string `json:"run"`
		} `json:"result"`
	}
	if err := client.WaitForResult(ctx, run.ID, &out); err != nil {
		t.Fatal(err)
	}
	if out.Result.Value != 10 || out.Result.Run != run.ID {
		t.Fatalf("output %+v", out)
	}
	done, err := client.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != composer.RunCompleted || len(done.Nodes) != 3 {
		t.Fatalf("run %+v", done)
	}
	for _, id := range []string{"a", "b", "c"} {
		node := done.Node(id)
		if node == nil || node.NodeType != "TASK" || node.Status != composer.NodeCompleted || node.Attempt != 1 {
			t.Errorf("node %s: %+v", id, node)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := []seenTask{
		{"a", run.ID, registered.Name, 1, `{"x":4}`},
		{"b", run.ID, registered.Name, 1, `{"x":5}`},
		{"c", run.ID, registered.Name, 1, `{"x":10}`},
	}
	if len(seen) != 3 {
		t.Fatalf("seen %+v", seen)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Errorf("handler %d saw %+v, want %+v", i, seen[i], want[i])
		}
	}
	if s := w.Stats(); s.Completed != 3 {
		t.Errorf("stats %+v", s)
	}
}

func TestC02TheSlotLimitHolds(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 150*time.Second)
	queue := "slow-" + n
	var w *composer.Worker
	var overAsked atomic.Int32
	// Records, for every poll, the tasks running and the tasks asked for.
	interceptor := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if poll, ok := req.(*pb.PollTasksRequest); ok && w != nil {
			if int(poll.GetMaxTasks())+w.Stats().InFlight > 4 {
				overAsked.Add(1)
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	client := dial(t, addr, composer.WithUnaryInterceptor(interceptor))
	w = composer.NewWorker(client, fast(4))
	var running, peak atomic.Int32
	w.Handle(queue, "slow", func(ctx context.Context, task *composer.Task) (any, error) {
		now := running.Add(1)
		for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
		}
		defer running.Add(-1)
		time.Sleep(time.Second)
		var in struct{ N int }
		_ = task.Decode(&in)
		return in.N, nil
	})
	if _, err := client.RegisterWorkflow(ctx, oneTask("slow-"+n, queue, "slow", `input: { n: "${input.n}" }`)); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 20 {
		run, err := client.StartRun(ctx, "slow-"+n, map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, run.ID)
	}
	began := time.Now()
	serve(t, w)
	for i, id := range ids {
		var out struct{ Result int }
		if err := client.WaitForResult(ctx, id, &out); err != nil {
			t.Fatal(err)
		}
		if out.Result != i {
			t.Errorf("run %d output %d", i, out.Result)
		}
	}
	elapsed := time.Since(began)
	if peak.Load() != 4 || w.Stats().MaxInFlight != 4 {
		t.Errorf("peak %d (stats %d), want 4", peak.Load(), w.Stats().MaxInFlight)
	}
	if overAsked.Load() != 0 || w.Stats().MaxTasksAsked > 4 {
		t.Errorf("%d polls asked for more than the free slots (max asked %d)", overAsked.Load(), w.Stats().MaxTasksAsked)
	}
	if elapsed < 5*time.Second {
		t.Errorf("20 tasks of 1 s on 4 slots took %s", elapsed)
	}
}

func TestC03HeartbeatsKeepATaskAlivePastItsLease(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 90*time.Second)
	client := dial(t, addr)
	w := composer.NewWorker(client, fast(1))
	var attempts []int
	var mu sync.Mutex
	w.Handle("hb-"+n, "long", func(ctx context.Context, task *composer.Task) (any, error) {
		mu.Lock()
		attempts = append(attempts, task.Attempt)
		mu.Unlock()
		select {
		case <-time.After(7 * time.Second): // 3.5 leases of 2 s
			return "survived", nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	})
	serve(t, w)
	if _, err := client.RegisterWorkflow(ctx, oneTask("hb-"+n, "hb-"+n, "long", "heartbeat_timeout: 2s\nretry: { max_attempts: 3 }")); err != nil {
		t.Fatal(err)
	}
	run, err := client.StartRun(ctx, "hb-"+n, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]string
	if err := client.WaitForResult(ctx, run.ID, &out); err != nil || out["result"] != "survived" {
		t.Fatalf("output %v, %v", out, err)
	}
	for _, e := range historyTypes(t, client, run.ID) {
		if strings.Contains(strings.ToLower(e), "expired") {
			t.Errorf("history has %s", e)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 1 || attempts[0] != 1 || w.Stats().LeaseLost != 0 {
		t.Errorf("attempts %v, stats %+v", attempts, w.Stats())
	}
}

func TestC04ATaskWhoseRunIsCancelledSeesItsCancellation(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 90*time.Second)
	client := dial(t, addr)
	w := composer.NewWorker(client, fast(2))
	started := make(chan struct{}, 1)
	type seen struct {
		cause  error
		reason string
		at     time.Time
	}
	seenCh := make(chan seen, 1)
	w.Handle("cancel-"+n, "wait", func(ctx context.Context, task *composer.Task) (any, error) {
		started <- struct{}{}
		select {
		case <-ctx.Done():
			seenCh <- seen{context.Cause(ctx), composer.CancelReason(ctx), time.Now()}
			return nil, ctx.Err()
		case <-time.After(120 * time.Second):
			return "unreachable", nil
		}
	})
	serve(t, w)
	if _, err := client.RegisterWorkflow(ctx, oneTask("cancel-"+n, "cancel-"+n, "wait", "heartbeat_timeout: 3s")); err != nil {
		t.Fatal(err)
	}
	run, err := client.StartRun(ctx, "cancel-"+n, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the task did not start")
	}
	cancelledAt := time.Now()
	if _, err := client.CancelRun(ctx, run.ID, "conformance C4"); err != nil {
		t.Fatal(err)
	}
	var got seen
	select {
	case got = <-seenCh:
	case <-time.After(15 * time.Second):
		t.Fatal("the handler's context was not cancelled")
	}
	// The heartbeat carries the reason given to CancelRun.
	if !errors.Is(got.cause, composer.ErrRunCancelled) || got.reason != "conformance C4" || got.cause.Error() != "run cancelled: conformance C4" {
		t.Errorf("cause %v, reason %q", got.cause, got.reason)
	}
	if d := got.at.Sub(cancelledAt); d > 3*time.Second { // one heartbeat interval (1 s) plus slack
		t.Errorf("the handler saw the cancellation %s after it", d)
	}
	ended := finalRun(t, client, run.ID, 60*time.Second)
	if ended.Status != composer.RunCancelled {
		t.Errorf("status %s", ended.Status)
	}
	if _, err := client.CancelRun(ctx, run.ID, "again"); !composer.IsFailedPrecondition(err) {
		t.Errorf("cancelling again: %v", err)
	}
	err = client.WaitForResult(ctx, run.ID, nil)
	var failed *composer.RunFailedError
	if !errors.As(err, &failed) || failed.Run.Status != composer.RunCancelled || failed.Code() != "CANCELLED" || failed.Message() != "conformance C4" {
		t.Errorf("WaitForResult: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	if s := w.Stats(); s.Completed != 0 || s.Failed != 0 || s.Cancelled != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestC05AWorkerKilledMidTaskHasItsTaskRunAgainAsAttempt2(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 150*time.Second)
	client := dial(t, addr)
	queue := "kill-" + n
	if _, err := client.RegisterWorkflow(ctx, oneTask("kill-"+n, queue, "slow", "heartbeat_timeout: 2s\nretry: { max_attempts: 3, initial_interval: 100ms }")); err != nil {
		t.Fatal(err)
	}
	first := startWorkerProcess(t, addr, queue, 1, 120, 30)
	run, err := client.StartRun(ctx, "kill-"+n, nil)
	if err != nil {
		t.Fatal(err)
	}
	began := first.waitFor(t, "started", 1, 60*time.Second)[0]
	if began["attempt"] != 1.0 || began["run_id"] != run.ID {
		t.Fatalf("first worker began %v", began)
	}
	// Killed once its lease is confirmed: before that the task would come
	// back as attempt 1 (C15).
	first.waitFor(t, "heartbeat", 1, 30*time.Second)
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.wait(t, 10*time.Second)
	second := startWorkerProcess(t, addr, queue, 1, 120, 30)
	var out struct {
		Result struct{ Pid, Attempt int }
	}
	if err := client.WaitForResult(ctx, run.ID, &out); err != nil {
		t.Fatal(err)
	}
	again := second.waitFor(t, "finished", 1, 30*time.Second)[0]
	if again["task_id"] != began["task_id"] || again["attempt"] != 2.0 {
		t.Errorf("second worker ran %v, first %v", again, began)
	}
	if out.Result.Pid != second.cmd.Process.Pid || out.Result.Attempt != 2 {
		t.Errorf("output %+v, second pid %d", out, second.cmd.Process.Pid)
	}
	done, err := client.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if node := done.Node("work"); node == nil || node.Attempt != 2 || node.Status != composer.NodeCompleted {
		t.Errorf("node %+v", node)
	}
}

// recorder is a unary interceptor that records every request, by method.
type recorder struct {
	mu    sync.Mutex
	calls map[string][]proto.Message
}

func (r *recorder) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	r.mu.Lock()
	if r.calls == nil {
		r.calls = map[string][]proto.Message{}
	}
	name := method[strings.LastIndex(method, "/")+1:]
	r.calls[name] = append(r.calls[name], proto.Clone(req.(proto.Message)))
	r.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (r *recorder) requests(method string) []proto.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]proto.Message(nil), r.calls[method]...)
}

func TestC06ALateReportAfterTheLeaseWasLostIsRefusedAndNotRetried(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 150*time.Second)
	rec := &recorder{}
	client := dial(t, addr, composer.WithUnaryInterceptor(rec.intercept))
	opts := fast(2)
	opts.HeartbeatInterval = time.Hour // no heartbeats: attempt 1's lease expires
	w := composer.NewWorker(client, opts)
	secondDone := make(chan struct{})
	w.Handle("late-"+n, "late", func(ctx context.Context, task *composer.Task) (any, error) {
		if task.Attempt == 1 {
			<-secondDone // report only after attempt 2 completed
			time.Sleep(500 * time.Millisecond)
		} else {
			close(secondDone)
		}
		return map[string]int{"attempt": task.Attempt}, nil
	})
	serve(t, w)
	if _, err := client.RegisterWorkflow(ctx, oneTask("late-"+n, "late-"+n, "late", "heartbeat_timeout: 2s\nretry: { max_attempts: 3, initial_interval: 100ms }")); err != nil {
		t.Fatal(err)
	}
	run, err := client.StartRun(ctx, "late-"+n, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Result struct{ Attempt int } }
	if err := client.WaitForResult(ctx, run.ID, &out); err != nil || out.Result.Attempt != 2 {
		t.Fatalf("output %+v, %v", out, err)
	}
	until(t, 30*time.Second, "the late report to be refused", func() bool { return w.Stats().LeaseLost >= 1 })
	time.Sleep(time.Second) // time in which a retry would show
	byAttempt := map[int32][]*pb.CompleteTaskRequest{}
	for _, m := range rec.requests("CompleteTask") {
		r := m.(*pb.CompleteTaskRequest)
		byAttempt[r.GetAttempt()] = append(byAttempt[r.GetAttempt()], r)
	}
	if len(byAttempt[1]) != 1 || len(byAttempt[2]) != 1 {
		t.Fatalf("CompleteTask per attempt: 1 -> %d, 2 -> %d (want one each)", len(byAttempt[1]), len(byAttempt[2]))
	}
	for _, m := range rec.requests("FailTask") {
		t.Errorf("a FailTask was sent: %v", m)
	}
	if s := w.Stats(); s.ReportRetries != 0 || s.LeaseLost != 1 || s.Completed != 1 {
		t.Errorf("stats %+v", s)
	}
	// The server's answer itself: the stale report once more, sent raw.
	raw := pb.NewWorkerServiceClient(client.Conn())
	_, err = raw.CompleteTask(client.OutgoingContext(ctx), byAttempt[1][0])
	if err == nil {
		t.Fatal("the stale report was accepted")
	}
	decoded := composer.FromStatus(status.Convert(err))
	if !composer.IsLeaseLost(decoded) || decoded.Code != codes.FailedPrecondition || decoded.Reason != "LEASE_LOST" {
		t.Errorf("decoded %#v", decoded)
	}
}

func TestC07TheServerRestartsUnderARunningWorker(t *testing.T) {
	srv := ownServer(t)
	n := names()
	ctx := testContext(t, 180*time.Second)
	client := dial(t, srv.address())
	w := composer.NewWorker(client, fast(2))
	release := make(chan struct{})
	type in struct {
		N    int  `json:"n"`
		Hold bool `json:"hold"`
	}
	type out struct {
		Attempt int `json:"attempt"`
		N       int `json:"n"`
	}
	w.Handle("restart-"+n, "step", func(ctx context.Context, task *composer.Task) (any, error) {
		var v in
		if err := task.Decode(&v); err != nil {
			return nil, err
		}
		if v.Hold {
			<-release
		}
		return out{task.Attempt, v.N}, nil
	})
	serve(t, w)
	if _, err := client.RegisterWorkflow(ctx, oneTask("restart-"+n, "restart-"+n, "step", "heartbeat_timeout: 10s\ninput: \"${input}\"")); err != nil {
		t.Fatal(err)
	}
	before, err := client.StartRun(ctx, "restart-"+n, in{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	var o struct{ Result out }
	if err := client.WaitForResult(ctx, before.ID, &o); err != nil || o.Result != (out{1, 1}) {
		t.Fatalf("before: %+v, %v", o, err)
	}
	held, err := client.StartRun(ctx, "restart-"+n, in{N: 2, Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	until(t, 30*time.Second, "the held task to start", func() bool { return w.Stats().InFlight == 1 })
	srv.restart(t)
	close(release) // its report meets a server that just came back
	after, err := client.StartRun(ctx, "restart-"+n, in{N: 3})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]int{held.ID: 2, after.ID: 3} {
		var got struct{ Result out }
		if err := client.WaitForResult(ctx, id, &got); err != nil || got.Result.N != want {
			t.Errorf("run %s: %+v, %v", id, got, err)
		}
	}
	if w.Stats().PollErrors < 1 {
		t.Errorf("the worker saw no poll error: %+v", w.Stats())
	}
}

func TestC08SIGTERMDrainsInFlightTasksAndPollsNothingNew(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 150*time.Second)
	client := dial(t, addr)
	queue := "term-" + n
	if _, err := client.RegisterWorkflow(ctx, oneTask("term-"+n, queue, "slow", "heartbeat_timeout: 2s")); err != nil {
		t.Fatal(err)
	}
	proc := startWorkerProcess(t, addr, queue, 2, 3.0, 30)
	proc.waitFor(t, "ready", 1, 30*time.Second)
	var runs []string
	for range 2 {
		run, err := client.StartRun(ctx, "term-"+n, nil)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run.ID)
	}
	proc.waitFor(t, "started", 2, 30*time.Second)
	if err := proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Both slots are busy, so no poll is waiting: a run started now must not reach this worker.
	late, err := client.StartRun(ctx, "term-"+n, nil)
	if err != nil {
		t.Fatal(err)
	}
	if code := proc.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, proc.output())
	}
	for _, id := range runs {
		var out struct{ Result struct{ Pid, Attempt int } }
		if err := client.WaitForResult(testContext(t, 10*time.Second), id, &out); err != nil {
			t.Fatal(err)
		}
		if out.Result.Pid != proc.cmd.Process.Pid || out.Result.Attempt != 1 {
			t.Errorf("run %s output %+v", id, out)
		}
	}
	exited := proc.seen("exited")
	if len(proc.seen("finished")) != 2 || len(exited) != 1 || exited[0]["completed"] != 2.0 || exited[0]["polled"] != 2.0 {
		t.Errorf("worker events: %s", proc.output())
	}
	lateRun, err := client.GetRun(ctx, late.ID)
	if err != nil {
		t.Fatal(err)
	}
	if node := lateRun.Node("work"); node != nil && node.Status == composer.NodeCompleted {
		t.Errorf("the late run was completed by the stopped worker: %+v", node)
	}
	// Another worker takes the late run as its attempt 1.
	other := composer.NewWorker(client, fast(1))
	other.Handle(queue, "slow", func(ctx context.Context, task *composer.Task) (any, error) {
		return map[string]int{"pid": 0, "attempt": task.Attempt}, nil
	})
	serve(t, other)
	var out struct{ Result struct{ Pid, Attempt int } }
	if err := client.WaitForResult(ctx, late.ID, &out); err != nil || out.Result.Pid != 0 || out.Result.Attempt != 1 {
		t.Errorf("late run: %+v, %v", out, err)
	}
}

func TestC09NonRetryableFailsAtOnceAPlainErrorIsRetried(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 120*time.Second)
	client := dial(t, addr)
	queue := "fail-" + n
	w := composer.NewWorker(client, fast(4))
	var mu sync.Mutex
	calls := map[string][]int{}
	note := func(name string, attempt int) {
		mu.Lock()
		defer mu.Unlock()
		calls[name] = append(calls[name], attempt)
	}
	w.Handle(queue, "final", func(ctx context.Context, task *composer.Task) (any, error) {
		note("final", task.Attempt)
		return nil, composer.NonRetryable(&composer.TaskError{Code: "DECLINED", Message: "card declined"})
	})
	w.Handle(queue, "flaky", func(ctx context.Context, task *composer.Task) (any, error) {
		note("flaky", task.Attempt)
		if task.Attempt < 3 {
			return nil, errors.New("try again")
		}
		return "third time lucky", nil
	})
	w.Handle(queue, "broken", func(ctx context.Context, task *composer.Task) (any, error) {
		note("broken", task.Attempt)
		return nil, fmt.Errorf("always: %w", errors.New("the disk is on fire"))
	})
	w.Handle(queue, "panics", func(ctx context.Context, task *composer.Task) (any, error) {
		note("panics", task.Attempt)
		panic("always panics")
	})
	serve(t, w)
	retry := "retry: { max_attempts: 3, initial_interval: 100ms, backoff: 1.0 }"
	ended := map[string]*composer.Run{}
	for _, task := range []string{"final", "flaky", "broken", "panics"} {
		if _, err := client.RegisterWorkflow(ctx, oneTask(task+"-"+n, queue, task, retry)); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[string]string{}
	for _, task := range []string{"final", "flaky", "broken", "panics"} {
		run, err := client.StartRun(ctx, task+"-"+n, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[task] = run.ID
	}
	for task, id := range ids {
		ended[task] = finalRun(t, client, id, 60*time.Second)
	}
	mu.Lock()
	got := fmt.Sprint(calls)
	mu.Unlock()
	if got != "map[broken:[1 2 3] final:[1] flaky:[1 2 3] panics:[1 2 3]]" {
		t.Errorf("calls %s", got)
	}
	node := ended["final"].Node("work")
	if ended["final"].Status != composer.RunFailed || node.Attempt != 1 || node.Error == nil || node.Error.Code != "DECLINED" {
		t.Errorf("final: %+v %+v", ended["final"], node)
	}
	var flaky struct{ Result string }
	if err := ended["flaky"].DecodeOutput(&flaky); ended["flaky"].Status != composer.RunCompleted || err != nil || flaky.Result != "third time lucky" {
		t.Errorf("flaky: %+v", ended["flaky"])
	}
	// A plain error (fmt.Errorf of errors.New): code ERROR, not a Go
	// implementation type; details carry the error chain (Go errors have no
	// stack trace; a panic's details carry the stack).
	broken := ended["broken"].Node("work")
	if ended["broken"].Status != composer.RunFailed || broken.Attempt != 3 || broken.Error == nil || broken.Error.Code != composer.DefaultErrorCode {
		t.Fatalf("broken: %+v", broken)
	}
	var details struct {
		Type  string
		Chain []struct{ Type, Message string }
	}
	if len(broken.Error.Details) == 0 {
		t.Fatal("the server dropped FailTask.details from the node's error")
	}
	if err := json.Unmarshal(broken.Error.Details, &details); err != nil || len(details.Chain) != 2 || details.Chain[1].Message != "the disk is on fire" {
		t.Errorf("broken details %s", broken.Error.Details)
	}
	panics := ended["panics"].Node("work")
	var stack struct{ Panic, Stack string }
	if panics.Error == nil || panics.Error.Code != "PANIC" || panics.Attempt != 3 || json.Unmarshal(panics.Error.Details, &stack) != nil ||
		stack.Panic != "always panics" || !strings.Contains(stack.Stack, "conformance_test.go") {
		t.Errorf("panics: %+v", panics)
	}
}

func TestC11ABadWorkflowGivesAnErrorListingEachFieldViolation(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 60*time.Second)
	client := dial(t, addr)
	bad := composer.YAML([]byte(fmt.Sprintf(`
name: bad-%s
nodes:
  - { id: a, type: TASK, queue: q, task: t, retry: { max_attempts: 0 } }
  - { id: b, type: TASK, queue: q, task: t }
edges:
  - { from: a, to: nowhere }
`, n)))
	_, err := client.RegisterWorkflow(ctx, bad)
	var ce *composer.Error
	if !errors.As(err, &ce) || !composer.IsInvalidArgument(err) || ce.Code != codes.InvalidArgument {
		t.Fatalf("RegisterWorkflow: %v", err)
	}
	var fields []string
	for _, v := range ce.FieldViolations {
		fields = append(fields, v.Field)
		if v.Description == "" {
			t.Errorf("violation %q has no description", v.Field)
		}
		if !strings.Contains(err.Error(), v.Field) {
			t.Errorf("the error's text lacks %q", v.Field)
		}
	}
	joined := strings.Join(fields, " ")
	if !strings.Contains(joined, "nodes[0].retry.max_attempts") || !strings.Contains(joined, "edges[0]") {
		t.Errorf("fields %v", fields)
	}
	problems, err := client.ValidateWorkflow(ctx, bad)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != len(ce.FieldViolations) {
		t.Fatalf("problems %v, violations %v", problems, ce.FieldViolations)
	}
	for i, p := range problems {
		if p.Path != ce.FieldViolations[i].Field || p.Message != ce.FieldViolations[i].Description {
			t.Errorf("problem %d %+v, violation %+v", i, p, ce.FieldViolations[i])
		}
	}
	// The Go client is synchronous: there is no separate sync facade.
	// A definition given as a Go value is checked the same way.
	_, err = client.RegisterWorkflow(ctx, composer.Definition(map[string]any{"name": "bad-value-" + n, "nodes": []any{}}))
	if !composer.IsInvalidArgument(err) {
		t.Errorf("Definition: %v", err)
	}
}

func TestC12TheClientIdempotencyListingErrorsRetryEventsAndTimeouts(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 150*time.Second)
	client := dial(t, addr)
	queue := "client-" + n
	w := composer.NewWorker(client, fast(4))
	var failOn atomic.Bool
	failOn.Store(true)
	w.Handle(queue, "echo", func(ctx context.Context, task *composer.Task) (any, error) {
		var in map[string]any
		_ = task.Decode(&in)
		if in["fail"] == true && failOn.Load() {
			return nil, composer.NonRetryable(&composer.TaskError{Code: "ASKED", Message: "asked to fail"})
		}
		return task.Input, nil
	})
	serve(t, w)
	echo := oneTask("echo-"+n, queue, "echo", `input: "${input}"`)
	if _, err := client.RegisterWorkflow(ctx, echo); err != nil {
		t.Fatal(err)
	}
	again, err := client.RegisterWorkflow(ctx, echo)
	if err != nil || again.Version != 1 || again.Created {
		t.Fatalf("registering again: %+v, %v", again, err)
	}
	labels := map[string]string{"suite": n}
	key := "key-" + names()
	first, err := client.StartRun(ctx, "echo-"+n, map[string]int{"n": 1}, composer.WithIdempotencyKey(key), composer.WithLabels(labels))
	if err != nil {
		t.Fatal(err)
	}
	repeat, err := client.StartRun(ctx, "echo-"+n, map[string]int{"n": 1}, composer.WithIdempotencyKey(key), composer.WithLabels(labels))
	if err != nil || !first.Created || repeat.Created || repeat.ID != first.ID {
		t.Fatalf("idempotent start: %v %v %v", first.Created, repeat.Created, err)
	}
	all := map[string]bool{first.ID: true}
	for i := 2; i <= 5; i++ {
		r, err := client.StartRun(ctx, "echo-"+n, map[string]int{"n": i}, composer.WithLabels(labels))
		if err != nil {
			t.Fatal(err)
		}
		all[r.ID] = true
	}
	for id := range all {
		if err := client.WaitForResult(ctx, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	listed := map[string]bool{}
	for r, err := range client.ListRuns(ctx, composer.RunFilter{Workflow: "echo-" + n, Labels: labels, PageSize: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != composer.RunCompleted || listed[r.ID] {
			t.Errorf("listed %s %s (seen before: %v)", r.ID, r.Status, listed[r.ID])
		}
		listed[r.ID] = true
	}
	if fmt.Sprint(listed) != fmt.Sprint(all) {
		t.Errorf("listed %v, want %v", listed, all)
	}
	for r, err := range client.ListRuns(ctx, composer.RunFilter{Workflow: "echo-" + n, Statuses: []composer.RunStatus{composer.RunFailed}}) {
		t.Errorf("a FAILED filter listed %v, %v", r, err)
	}
	// Typed errors.
	if _, err := client.GetRun(ctx, "0190f1a2-0000-7000-8000-000000000000"); !composer.IsNotFound(err) {
		t.Errorf("GetRun of an unknown id: %v", err)
	}
	if _, err := client.StartRun(ctx, "missing-"+n, nil); !composer.IsNotFound(err) {
		t.Errorf("StartRun of an unknown workflow: %v", err)
	}
	// Retry of a failed run.
	failing, err := client.StartRun(ctx, "echo-"+n, map[string]bool{"fail": true})
	if err != nil {
		t.Fatal(err)
	}
	if run := finalRun(t, client, failing.ID, 60*time.Second); run.Status != composer.RunFailed {
		t.Fatalf("failing run ended %s", run.Status)
	}
	if _, err := client.RetryRun(ctx, first.ID); !composer.IsFailedPrecondition(err) {
		t.Errorf("RetryRun of a COMPLETED run: %v", err)
	}
	failOn.Store(false)
	resumed, err := client.RetryRun(ctx, failing.ID)
	if err != nil || resumed.Status != composer.RunRunning {
		t.Fatalf("RetryRun: %+v, %v", resumed, err)
	}
	var echoed struct{ Result map[string]bool }
	if err := client.WaitForResult(ctx, failing.ID, &echoed); err != nil || !echoed.Result["fail"] {
		t.Fatalf("retried run: %+v, %v", echoed, err)
	}
	// Events, and waiting with a timeout.
	waiting := composer.YAML([]byte(fmt.Sprintf(`
name: waiting-%s
nodes:
  - { id: approval, type: WAIT_FOR_EVENT, event: approval }
output: { approved: "${nodes.approval.output.ok}" }
`, n)))
	if _, err := client.RegisterWorkflow(ctx, waiting); err != nil {
		t.Fatal(err)
	}
	waiter, err := client.StartRun(ctx, "waiting-"+n, nil)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	err = client.WaitForResult(short, waiter.ID, nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting with a timeout: %v", err)
	}
	delivery, err := client.SendEvent(ctx, composer.Event{Name: "approval", Payload: map[string]bool{"ok": true}, RunID: waiter.ID, RequestID: "r-" + n})
	if err != nil {
		t.Fatal(err)
	}
	if !(len(delivery.DeliveredRunIDs) == 1 && delivery.DeliveredRunIDs[0] == waiter.ID) && !delivery.Stored {
		t.Errorf("delivery %+v", delivery)
	}
	var approved struct{ Approved bool }
	if err := client.WaitForResult(ctx, waiter.ID, &approved); err != nil || !approved.Approved {
		t.Fatalf("approved: %+v, %v", approved, err)
	}
	// The history of the run, through History.
	// (The protos name event types RunCompleted, ...; the server writes
	// run_completed: compare both spellings.)
	types := strings.ReplaceAll(strings.ToLower(strings.Join(historyTypes(t, client, waiter.ID), " ")), "_", "")
	if !strings.Contains(types, "eventreceived") || !strings.Contains(types, "runcompleted") {
		t.Errorf("history %s", types)
	}
}

func TestC13TheSDKChecksTheProtocolVersion(t *testing.T) {
	addr := sharedServer(t)
	client := dial(t, addr)
	info, err := client.ServerInfo(testContext(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	major, minor, _ := strings.Cut(info.ProtocolVersion, ".")
	if major != "1" || minor == "" || info.ServerVersion == "" {
		t.Errorf("server info %+v", info)
	}
	// That a worker refuses a server of another major before polling is
	// proved against a fake server (TestRunRefusesAServerOfAnotherProtocol):
	// the real server cannot be made to announce another protocol.
	if composer.CheckProtocolVersion(info.ProtocolVersion) != nil || composer.CheckProtocolVersion("2.0") == nil {
		t.Error("CheckProtocol")
	}
}

func TestC14TokensComeFromTheOptionOrCOMPOSER_TOKENAndBadOnesAreRefused(t *testing.T) {
	addr := sharedServer(t)
	ctx := testContext(t, 60*time.Second)
	// GetRun needs a role; GetServerInfo needs none, so calls here list runs.
	check := func(c *composer.Client) error {
		for _, err := range c.ListRuns(ctx, composer.RunFilter{PageSize: 1}) {
			return err
		}
		return nil
	}
	if err := check(dial(t, addr)); err != nil { // COMPOSER_TOKEN
		t.Fatalf("COMPOSER_TOKEN: %v", err)
	}
	admin := session.token
	t.Setenv("COMPOSER_TOKEN", "")
	if err := check(dial(t, addr, composer.WithToken(admin))); err != nil {
		t.Fatalf("WithToken: %v", err)
	}
	if err := check(dial(t, addr)); !composer.IsUnauthenticated(err) {
		t.Errorf("no token: %v", err)
	}
	forged := admin[:strings.LastIndex(admin, ".")+1] + "c2lnbmF0dXJl"
	err := check(dial(t, addr, composer.WithToken(forged)))
	if !composer.IsUnauthenticated(err) || composer.Code(err) != codes.Unauthenticated {
		t.Errorf("forged token: %v", err)
	}
	poll := &pb.PollTasksRequest{WorkerId: "scoped", Queues: []string{"anything"}, MaxTasks: 1, Wait: durationpb.New(0)}
	workerClient := dial(t, addr, composer.WithToken(mustToken(t, "scoped", "worker")))
	if _, err := pb.NewWorkerServiceClient(workerClient.Conn()).PollTasks(workerClient.OutgoingContext(ctx), poll); err != nil {
		t.Errorf("a worker token polling: %v", err)
	}
	clientOnly := dial(t, addr, composer.WithToken(mustToken(t, "client-only", "client")))
	_, err = pb.NewWorkerServiceClient(clientOnly.Conn()).PollTasks(clientOnly.OutgoingContext(ctx), poll)
	if decoded := composer.FromStatus(status.Convert(err)); !composer.IsPermissionDenied(decoded) {
		t.Errorf("a client token polling: %v", err)
	}
	// A Worker with that token sees the same error on its polls and keeps
	// trying (with back-off) rather than crash: its Stats count them.
	w := composer.NewWorker(clientOnly, fast(1))
	w.Handle("perm-"+names(), "x", func(ctx context.Context, task *composer.Task) (any, error) { return nil, nil })
	stop := serve(t, w)
	until(t, 20*time.Second, "a refused poll", func() bool { return w.Stats().PollErrors >= 1 })
	stop()
}

func TestC15ATaskRunningPastTheFirstShortLeaseIsConfirmedAndKeepsItsLease(t *testing.T) {
	srv := ownServer(t, "--lease-receipt-timeout", "2s")
	n := names()
	ctx := testContext(t, 120*time.Second)
	rec := &recorder{}
	client := dial(t, srv.address(), composer.WithUnaryInterceptor(rec.intercept))
	w := composer.NewWorker(client, fast(2))
	type out struct {
		Attempt int    `json:"attempt"`
		Run     string `json:"run"`
	}
	var mu sync.Mutex
	var started []string // "<run>#<attempt>", each time the handler starts
	w.Handle("receipt-"+n, "long", func(ctx context.Context, task *composer.Task) (any, error) {
		mu.Lock()
		started = append(started, fmt.Sprintf("%s#%d", task.RunID, task.Attempt))
		mu.Unlock()
		select {
		case <-time.After(7 * time.Second): // 3.5 first leases of 2 s
			return out{task.Attempt, task.RunID}, nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	})
	serve(t, w)
	// heartbeat_timeout 30s: heartbeats at the interval alone (10 s) would all
	// come after the first lease (2 s) ended unconfirmed, and the task would
	// be offered again and again.
	workflows := map[string]int{"receipt-" + n: 3, "receipt-once-" + n: 1}
	var runs []string
	for name, attempts := range workflows {
		extra := fmt.Sprintf("heartbeat_timeout: 30s\nretry: { max_attempts: %d }", attempts)
		if _, err := client.RegisterWorkflow(ctx, oneTask(name, "receipt-"+n, "long", extra)); err != nil {
			t.Fatal(err)
		}
		run, err := client.StartRun(ctx, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run.ID)
	}
	var want []string
	for _, id := range runs {
		var got struct{ Result out }
		if err := client.WaitForResult(testContext(t, 60*time.Second), id, &got); err != nil || got.Result != (out{1, id}) {
			t.Fatalf("run %s: output %+v, %v", id, got, err)
		}
		done := finalRun(t, client, id, 30*time.Second)
		if node := done.Node("work"); node == nil || node.Status != composer.NodeCompleted || node.Attempt != 1 {
			t.Errorf("run %s: node %+v", id, node)
		}
		for _, e := range historyTypes(t, client, id) {
			if strings.Contains(strings.ToLower(e), "expired") {
				t.Errorf("run %s: history has %s", id, e)
			}
		}
		want = append(want, id+"#1")
	}
	// Each handler ran once: a lease that ended unconfirmed would have
	// offered its task again.
	mu.Lock()
	got := append([]string(nil), started...)
	mu.Unlock()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("handlers started %v, want %v", got, want)
	}
	if s := w.Stats(); s.LeaseLost != 0 || s.Completed != 2 {
		t.Errorf("stats %+v", s)
	}
	polls := rec.requests("PollTasks")
	if len(polls) == 0 {
		t.Fatal("no PollTasks recorded")
	}
	for i, m := range polls {
		if !m.(*pb.PollTasksRequest).GetConfirmReceipt() {
			t.Fatalf("poll %d did not ask to confirm receipt", i)
		}
	}
}
