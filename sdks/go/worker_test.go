package composer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

func TestBackoffGrowsToItsCapWithJitter(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: 0.5}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := b.Cap(i + 1); got != w*time.Millisecond {
			t.Errorf("Cap(%d) = %s, want %s", i+1, got, w*time.Millisecond)
		}
	}
	if got := b.Cap(1_000_000); got != time.Second {
		t.Errorf("Cap(huge) = %s", got)
	}
	if got := b.DelayWith(3, 0); got != 400*time.Millisecond {
		t.Errorf("DelayWith(3, 0) = %s", got)
	}
	if got := b.DelayWith(3, 0.999999); got < 200*time.Millisecond || got > 201*time.Millisecond {
		t.Errorf("DelayWith(3, ~1) = %s", got)
	}
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := b.Delay(2)
		if d < 100*time.Millisecond || d > 200*time.Millisecond {
			t.Fatalf("Delay(2) = %s, outside [cap/2, cap]", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Errorf("Delay has no jitter: %d distinct values of 1000", len(seen))
	}
	full := Backoff{Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond, Multiplier: 1, Jitter: 1}
	if got := full.DelayWith(5, 0.5); got != 5*time.Millisecond {
		t.Errorf("full jitter DelayWith = %s", got)
	}
}

func TestSlotsAccountingUnderConcurrency(t *testing.T) {
	s := newSlots(3)
	if err := s.acquire(4); err == nil {
		t.Fatal("acquired 4 of 3 slots")
	}
	if err := s.acquire(3); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if _, ok := s.waitFree(ctx); ok {
		t.Fatal("waitFree returned with no free slot")
	}
	cancel()
	got := make(chan int)
	go func() {
		n, _ := s.waitFree(context.Background())
		got <- n
	}()
	time.Sleep(20 * time.Millisecond)
	s.release()
	if n := <-got; n != 1 {
		t.Fatalf("waitFree = %d, want 1", n)
	}
	s.release()
	s.release()
	// Many goroutines taking and giving back slots never exceed the capacity.
	var wg sync.WaitGroup
	var over atomic.Bool
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if _, ok := s.waitFree(context.Background()); !ok {
					return
				}
				if s.acquire(1) != nil {
					continue // another goroutine took it first
				}
				if used, _ := s.inUse(); used > 3 {
					over.Store(true)
				}
				s.release()
			}
		}()
	}
	wg.Wait()
	used, high := s.inUse()
	if over.Load() || high > 3 || used != 0 || s.free() != 3 {
		t.Fatalf("over=%v high=%d used=%d", over.Load(), high, used)
	}
	defer func() {
		if recover() == nil {
			t.Error("release without acquire did not panic")
		}
	}()
	s.release()
}

// Polls set aside the slots they ask for: what one reserved no other may
// take, a poll beyond the first waits for its share, and an answer turns
// the filled ones into used slots and frees the rest.
func TestSlotsReservedForPolls(t *testing.T) {
	s := newSlots(10)
	n, ok := s.reserve(context.Background(), 1, MaxPollTasks)
	if !ok || n != 10 || s.free() != 0 {
		t.Fatalf("first reserve = %d (free %d), want 10", n, s.free())
	}
	s.settle(n, 4) // 4 tasks came: 4 used, 6 free
	if used, _ := s.inUse(); used != 4 || s.free() != 6 {
		t.Fatalf("after settle: used %d free %d", used, s.free())
	}
	if n, _ := s.reserve(context.Background(), 1, 5); n != 5 {
		t.Fatalf("capped reserve = %d, want 5", n)
	}
	// 1 free: a poll that needs 3 waits until a task ends.
	got := make(chan int)
	go func() {
		n, _ := s.reserve(context.Background(), 3, MaxPollTasks)
		got <- n
	}()
	s.release()
	select {
	case n := <-got:
		t.Fatalf("reserved %d with 2 free, wanted 3", n)
	case <-time.After(30 * time.Millisecond):
	}
	s.unreserve(5) // the capped poll failed: 7 free
	if n := <-got; n != 7 {
		t.Fatalf("waiting reserve = %d, want 7", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, ok := s.reserve(ctx, 1, 1); ok {
		t.Fatal("reserved with no free slot")
	}
	// A server that leased more than asked: the leases are ours, the slots used.
	s.settle(7, 8)
	if used, high := s.inUse(); used != 11 || high != 11 {
		t.Fatalf("over-leased: used %d high %d", used, high)
	}
}

// The poll loop never asks for more tasks than free slots, and no more
// handlers run than slots.
func TestWorkerPollsForFreeSlotsOnly(t *testing.T) {
	f, client := startFake(t)
	for i := range 12 {
		f.add(fakeTask(fmt.Sprintf("t%d", i), "q", "work", 3*time.Second, map[string]any{"n": i}))
	}
	w := NewWorker(client, WorkerOptions{Slots: 3, PollWait: 200 * time.Millisecond, Backoff: fastBackoff})
	var running, peak atomic.Int32
	w.Handle("q", "work", func(ctx context.Context, task *Task) (any, error) {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
		running.Add(-1)
		return map[string]any{"id": task.ID}, nil
	})
	stop := runWorker(t, w)
	eventually(t, 20*time.Second, "12 completions", func() bool { return w.Stats().Completed == 12 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	polls, _, completes, _ := f.snapshot()
	for _, p := range polls {
		if p.maxTasks < 1 || p.outstanding+p.maxTasks > 3 {
			t.Errorf("a poll asked for %d tasks with %d outstanding of 3 slots", p.maxTasks, p.outstanding)
		}
	}
	if peak.Load() != 3 || w.Stats().MaxInFlight != 3 {
		t.Errorf("peak concurrency %d (stats %d), want 3", peak.Load(), w.Stats().MaxInFlight)
	}
	if len(completes) != 12 || w.Stats().MaxTasksAsked > 3 {
		t.Errorf("completes %d, max asked %d", len(completes), w.Stats().MaxTasksAsked)
	}
}

func TestHeartbeatsAtAThirdOfTheLease(t *testing.T) {
	f, client := startFake(t)
	f.add(fakeTask("hb", "q", "long", 900*time.Millisecond, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond})
	var started time.Time
	w.Handle("q", "long", func(ctx context.Context, task *Task) (any, error) {
		started = time.Now()
		time.Sleep(1650 * time.Millisecond)
		return "done", nil
	})
	runWorker(t, w)
	eventually(t, 10*time.Second, "completion", func() bool { return w.Stats().Completed == 1 })
	_, beats, _, _ := f.snapshot()
	// At 300, 600, 900, 1200, 1500 ms: five heartbeats, all with the lease's token.
	if len(beats) < 3 || len(beats) > 6 {
		t.Fatalf("%d heartbeats for 1.65 s of a 900 ms lease, want about 5", len(beats))
	}
	prev := started
	for i, b := range beats {
		gap := b.at.Sub(prev)
		if gap < 250*time.Millisecond || gap > 600*time.Millisecond { // slack for a loaded machine
			t.Errorf("heartbeat %d came %s after the previous, want about 300 ms", i, gap)
		}
		if b.req.GetLeaseToken() != "token-hb" || b.req.GetAttempt() != 1 || b.req.GetTaskId() != "hb" {
			t.Errorf("heartbeat %d carries %v", i, b.req)
		}
		prev = b.at
	}
	time.Sleep(400 * time.Millisecond)
	if _, after, _, _ := f.snapshot(); len(after) != len(beats) {
		t.Errorf("heartbeats went on after the report: %d then %d", len(beats), len(after))
	}
}

// C15 locally: every poll asks to confirm receipt; a first lease of 600 ms
// is confirmed at about 200 ms, and later heartbeats keep the interval of
// the task's lease (1 s).
func TestPollsConfirmReceiptAndTheFirstHeartbeatComesAThirdOfTheWayToTheFirstExpiry(t *testing.T) {
	f, client := startFake(t)
	f.receipt = 600 * time.Millisecond
	f.add(fakeTask("rc", "q", "long", 3*time.Second, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond})
	var started atomic.Pointer[time.Time]
	w.Handle("q", "long", func(ctx context.Context, task *Task) (any, error) {
		now := time.Now()
		started.Store(&now)
		time.Sleep(1500 * time.Millisecond)
		return "done", nil
	})
	runWorker(t, w)
	eventually(t, 10*time.Second, "completion", func() bool { return w.Stats().Completed == 1 })
	polls, beats, _, _ := f.snapshot()
	for i, p := range polls {
		if !p.confirmReceipt {
			t.Errorf("poll %d did not ask to confirm receipt", i)
		}
	}
	if len(beats) != 2 {
		t.Fatalf("%d heartbeats, want 2 (about 200 ms: the confirmation; about 1200 ms: the interval)", len(beats))
	}
	if first := beats[0].at.Sub(*started.Load()); first > 450*time.Millisecond {
		t.Errorf("the first heartbeat came %s after receipt, want well before the first expiry (600 ms)", first)
	}
	if gap := beats[1].at.Sub(beats[0].at); gap < 700*time.Millisecond {
		t.Errorf("the second heartbeat came %s after the first, want the lease's third (1 s)", gap)
	}
}

func TestATaskReportedBeforeItsFirstHeartbeatSendsNone(t *testing.T) {
	f, client := startFake(t)
	f.receipt = 2 * time.Second
	f.add(fakeTask("quick", "q", "quick", 3*time.Second, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond})
	w.Handle("q", "quick", func(context.Context, *Task) (any, error) { return "done", nil })
	runWorker(t, w)
	eventually(t, 10*time.Second, "completion", func() bool { return w.Stats().Completed == 1 })
	time.Sleep(500 * time.Millisecond)
	if _, beats, _, _ := f.snapshot(); len(beats) != 0 {
		t.Errorf("%d heartbeats for a task reported at once", len(beats))
	}
}

func TestFirstHeartbeatDelay(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	expiring := func(in time.Duration) *pb.Task {
		return &pb.Task{LeaseExpireTime: timestamppb.New(now.Add(in))}
	}
	for _, c := range []struct {
		name     string
		task     *pb.Task
		interval time.Duration
		want     time.Duration
	}{
		{"no first expiry: the interval", &pb.Task{}, 10 * time.Second, 10 * time.Second},
		{"a third of the way to the first expiry", expiring(6 * time.Second), 10 * time.Second, 2 * time.Second},
		{"the interval when sooner", expiring(60 * time.Second), 10 * time.Second, 10 * time.Second},
		{"an expiry already past (clocks apart): soon", expiring(-3 * time.Second), 10 * time.Second, 500 * time.Millisecond},
		{"and never later than the interval", expiring(-3 * time.Second), 200 * time.Millisecond, 200 * time.Millisecond},
	} {
		if got := firstHeartbeatDelay(c.task, c.interval, now); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// L1: a report that meets UNAVAILABLE or DEADLINE_EXCEEDED is sent again with
// the same (task_id, attempt, lease_token) until it is applied.
func TestL01ReportRetriedWithTheSameLease(t *testing.T) {
	f, client := startFake(t)
	f.completeErrs = []error{status.Error(codes.Unavailable, "down"), status.Error(codes.DeadlineExceeded, "slow"), status.Error(codes.Unavailable, "down")}
	f.add(fakeTask("r", "q", "work", 3*time.Second, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, Backoff: fastBackoff})
	w.Handle("q", "work", func(ctx context.Context, task *Task) (any, error) { return map[string]int{"ok": 1}, nil })
	runWorker(t, w)
	eventually(t, 10*time.Second, "completion", func() bool { return w.Stats().Completed == 1 })
	_, _, completes, fails := f.snapshot()
	if len(completes) != 4 || len(fails) != 0 {
		t.Fatalf("%d CompleteTask and %d FailTask calls, want 4 and 0", len(completes), len(fails))
	}
	for _, c := range completes {
		if c.GetTaskId() != "r" || c.GetAttempt() != 1 || c.GetLeaseToken() != "token-r" {
			t.Errorf("a retried report changed its lease: %v", c)
		}
	}
	if s := w.Stats(); s.ReportRetries != 3 || s.LeaseLost != 0 {
		t.Errorf("stats %+v", s)
	}
}

// LEASE_LOST on a report is final: sent once, never retried, no FailTask instead.
func TestLeaseLostReportIsNotRetried(t *testing.T) {
	f, client := startFake(t)
	f.completeErrs = []error{leaseLostStatus()}
	f.add(fakeTask("l", "q", "work", 3*time.Second, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, Backoff: fastBackoff})
	w.Handle("q", "work", func(ctx context.Context, task *Task) (any, error) { return 1, nil })
	runWorker(t, w)
	eventually(t, 10*time.Second, "the lost lease", func() bool { return w.Stats().LeaseLost == 1 })
	time.Sleep(300 * time.Millisecond)
	_, _, completes, fails := f.snapshot()
	if len(completes) != 1 || len(fails) != 0 || w.Stats().ReportRetries != 0 || w.Stats().Completed != 0 {
		t.Fatalf("completes %d fails %d stats %+v", len(completes), len(fails), w.Stats())
	}
}

// L2: poll errors back off (exponential, with jitter); the worker recovers by itself.
func TestL02PollErrorsBackOffAndRecover(t *testing.T) {
	f, client := startFake(t)
	f.pollErrors = 5
	b := Backoff{Initial: 40 * time.Millisecond, Max: 400 * time.Millisecond, Multiplier: 2, Jitter: 0.5}
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, Backoff: b})
	w.Handle("q", "work", func(ctx context.Context, task *Task) (any, error) { return "ok", nil })
	runWorker(t, w)
	eventually(t, 10*time.Second, "five poll errors", func() bool { return w.Stats().PollErrors == 5 })
	f.add(fakeTask("p", "q", "work", 3*time.Second, nil))
	eventually(t, 10*time.Second, "recovery", func() bool { return w.Stats().Completed == 1 })
	polls, _, _, _ := f.snapshot()
	for i := 1; i <= 5; i++ {
		gap := polls[i].at.Sub(polls[i-1].at)
		if low := b.Cap(i) / 2; gap < low {
			t.Errorf("poll %d came %s after failure %d, before the back-off's floor %s", i, gap, i, low)
		}
	}
	if g1, g5 := polls[1].at.Sub(polls[0].at), polls[5].at.Sub(polls[4].at); g5 <= g1 {
		t.Errorf("the back-off did not grow: %s then %s", g1, g5)
	}
}

// L3: an output that is not JSON fails the attempt non-retryably
// (INVALID_OUTPUT); an output over the payload limit is failed with
// OUTPUT_TOO_LARGE; a task with no handler fails with UNKNOWN_TASK.
func TestL03OutputsAndUnknownTasks(t *testing.T) {
	f, client := startFake(t)
	f.completeErrs = []error{status.Error(codes.ResourceExhausted, "output of 9 MiB exceeds the 1 MiB limit")}
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, Backoff: fastBackoff})
	w.Handle("q", "big", func(ctx context.Context, task *Task) (any, error) { return strings.Repeat("x", 100), nil })
	w.Handle("q", "weird", func(ctx context.Context, task *Task) (any, error) { return make(chan int), nil })
	runWorker(t, w)
	f.add(fakeTask("big", "q", "big", 3*time.Second, nil))
	eventually(t, 10*time.Second, "big failed", func() bool { return w.Stats().Failed == 1 })
	f.add(fakeTask("weird", "q", "weird", 3*time.Second, nil), fakeTask("none", "q", "nobody", 3*time.Second, nil))
	eventually(t, 10*time.Second, "three failures", func() bool { return w.Stats().Failed == 3 })
	_, _, _, fails := f.snapshot()
	got := map[string]*pb.FailTaskRequest{}
	for _, r := range fails {
		got[r.GetTaskId()] = r
	}
	if r := got["big"]; r == nil || r.GetErrorCode() != "OUTPUT_TOO_LARGE" || r.GetRetryable() || r.GetLeaseToken() != "token-big" {
		t.Errorf("big: %v", r)
	}
	if r := got["weird"]; r == nil || r.GetErrorCode() != "INVALID_OUTPUT" || r.GetRetryable() {
		t.Errorf("weird: %v", r)
	}
	if r := got["none"]; r == nil || r.GetErrorCode() != "UNKNOWN_TASK" || !strings.Contains(r.GetMessage(), "nobody") {
		t.Errorf("none: %v", r)
	}
}

// L4: a lost lease seen by a heartbeat stops the handler (its ctx is done
// with cause ErrLeaseLost) and nothing is reported.
func TestL04LeaseLostByHeartbeatStopsTheHandler(t *testing.T) {
	f, client := startFake(t)
	f.onHeartbeat = func(*pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) { return nil, leaseLostStatus() }
	f.add(fakeTask("ll", "q", "wait", 300*time.Millisecond, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond})
	causes := make(chan error, 1)
	w.Handle("q", "wait", func(ctx context.Context, task *Task) (any, error) {
		select {
		case <-ctx.Done():
			causes <- context.Cause(ctx)
			return nil, ctx.Err()
		case <-time.After(10 * time.Second):
			causes <- nil
			return "late", nil
		}
	})
	runWorker(t, w)
	select {
	case cause := <-causes:
		if !errors.Is(cause, ErrLeaseLost) {
			t.Fatalf("cause %v, want ErrLeaseLost", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was not stopped")
	}
	time.Sleep(300 * time.Millisecond)
	_, beats, completes, fails := f.snapshot()
	if len(completes)+len(fails) != 0 || len(beats) != 1 || w.Stats().LeaseLost != 1 {
		t.Fatalf("reports %d, heartbeats %d, stats %+v", len(completes)+len(fails), len(beats), w.Stats())
	}
}

// A heartbeat answering cancel_requested stops the handler with
// ErrRunCancelled; nothing is reported.
func TestCancelRequestedStopsTheHandler(t *testing.T) {
	f, client := startFake(t)
	f.onHeartbeat = func(*pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
		return &pb.HeartbeatResponse{CancelRequested: true, LeaseExpireTime: timestamppb.Now()}, nil
	}
	f.add(fakeTask("c", "q", "wait", 300*time.Millisecond, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond})
	causes := make(chan error, 1)
	w.Handle("q", "wait", func(ctx context.Context, task *Task) (any, error) {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return "ignored", nil
	})
	runWorker(t, w)
	if cause := <-causes; !errors.Is(cause, ErrRunCancelled) || cause.Error() != "run cancelled" {
		t.Fatalf("cause %v", cause)
	}
	eventually(t, 5*time.Second, "the cancel to be counted", func() bool { return w.Stats().Cancelled == 1 })
	_, _, completes, fails := f.snapshot()
	if len(completes)+len(fails) != 0 {
		t.Fatal("a cancelled attempt was reported")
	}
}

// The cancel's reason reaches the handler: context.Cause is a
// *RunCancelledError (still errors.Is ErrRunCancelled) and CancelReason
// reads it.
func TestCancelRequestedCarriesTheReason(t *testing.T) {
	f, client := startFake(t)
	f.onHeartbeat = func(*pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
		return &pb.HeartbeatResponse{CancelRequested: true, CancelReason: "customer asked", LeaseExpireTime: timestamppb.Now()}, nil
	}
	f.add(fakeTask("c", "q", "wait", 300*time.Millisecond, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond})
	type seen struct {
		cause  error
		reason string
	}
	got := make(chan seen, 1)
	w.Handle("q", "wait", func(ctx context.Context, task *Task) (any, error) {
		if CancelReason(ctx) != "" {
			t.Error("a live ctx has a cancel reason")
		}
		<-ctx.Done()
		got <- seen{context.Cause(ctx), CancelReason(ctx)}
		return nil, nil
	})
	runWorker(t, w)
	s := <-got
	var rc *RunCancelledError
	if !errors.Is(s.cause, ErrRunCancelled) || !errors.As(s.cause, &rc) || rc.Reason != "customer asked" ||
		s.cause.Error() != "run cancelled: customer asked" || s.reason != "customer asked" {
		t.Fatalf("cause %v, reason %q", s.cause, s.reason)
	}
	eventually(t, 5*time.Second, "the cancel to be counted", func() bool { return w.Stats().Cancelled == 1 })
}

// L5: a drain that times out fails the attempts with WORKER_SHUTDOWN,
// retryable, and only then stops heartbeating.
func TestL05DrainTimeoutFailsWithWorkerShutdown(t *testing.T) {
	f, client := startFake(t)
	f.add(fakeTask("d", "q", "stuck", 300*time.Millisecond, nil))
	w := NewWorker(client, WorkerOptions{Slots: 2, PollWait: 200 * time.Millisecond, DrainTimeout: 500 * time.Millisecond})
	started := make(chan struct{})
	causes := make(chan error, 1)
	release := make(chan struct{})
	w.Handle("q", "stuck", func(ctx context.Context, task *Task) (any, error) {
		close(started)
		<-release // ignores its context until the test lets it go
		causes <- context.Cause(ctx)
		return "too late", nil
	})
	stop := runWorker(t, w)
	<-started
	begun := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(begun)
	_, beats, completes, fails := f.snapshot()
	if took < 400*time.Millisecond || took > 5*time.Second {
		t.Errorf("Run returned %s after its ctx ended, want about the drain timeout", took)
	}
	if len(fails) != 1 || fails[0].GetErrorCode() != "WORKER_SHUTDOWN" || !fails[0].GetRetryable() || fails[0].GetLeaseToken() != "token-d" {
		t.Fatalf("fails %v", fails)
	}
	var duringDrain int
	for _, b := range beats {
		if b.at.After(begun) {
			duringDrain++
		}
	}
	if duringDrain == 0 {
		t.Error("no heartbeat during the drain")
	}
	close(release)
	if cause := <-causes; !errors.Is(cause, ErrWorkerShutdown) {
		t.Errorf("cause %v", cause)
	}
	time.Sleep(400 * time.Millisecond)
	_, after, completes2, _ := f.snapshot()
	if len(after) != len(beats) || len(completes2) != len(completes) || len(completes) != 0 {
		t.Errorf("after Run returned: heartbeats %d -> %d, completes %d -> %d", len(beats), len(after), len(completes), len(completes2))
	}
}

// quotaExceededStatus is the server's refusal of a call over a quota:
// RESOURCE_EXHAUSTED with google.rpc.QuotaFailure, RetryInfo and ErrorInfo
// QUOTA_EXCEEDED.
func quotaExceededStatus(retryAfter time.Duration) error {
	st, _ := status.New(codes.ResourceExhausted, "quota blob_transfers exceeded").WithDetails(
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "namespace default", Description: "blob_transfers: 256 at once"}}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)},
		&errdetails.ErrorInfo{Reason: ReasonQuotaExceeded, Domain: "composer.dev", Metadata: map[string]string{"quota": "blob_transfers"}},
	)
	return st.Err()
}

// cpuPoolBusyStatus is the CPU pool's refusal, without the RetryInfo the
// server adds, so the worker's back-off spaces the retries.
func cpuPoolBusyStatus() error {
	st, _ := status.New(codes.ResourceExhausted, "the cpu pool is busy").WithDetails(
		&errdetails.ErrorInfo{Reason: ReasonCPUPoolBusy, Domain: "composer.dev"},
	)
	return st.Err()
}

// payloadTooLargeStatus is the server's refusal of a payload over its
// limit: RESOURCE_EXHAUSTED naming the field in google.rpc.BadRequest, no
// ErrorInfo.
func payloadTooLargeStatus() error {
	st, _ := status.New(codes.ResourceExhausted, "data: a payload of 5002 bytes exceeds the 1000 bytes limit").WithDetails(
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "data", Description: "exceeds the 1000 bytes limit"}}},
	)
	return st.Err()
}

// A busy server's RESOURCE_EXHAUSTED is told apart from a payload over the
// limit, and its RetryInfo sets the delay before the call is sent again.
func TestBusyServerErrorsAndTheirRetryDelay(t *testing.T) {
	quota, cpu, tooLarge := convertError(quotaExceededStatus(1500*time.Millisecond)), convertError(cpuPoolBusyStatus()), convertError(payloadTooLargeStatus())
	if e, _ := AsError(quota); e.RetryAfter != 1500*time.Millisecond || e.Reason != ReasonQuotaExceeded || !isBusy(quota) || IsRetryable(quota) {
		t.Errorf("quota exceeded: %+v", e)
	}
	if e, _ := AsError(cpu); e.RetryAfter != 0 || !isBusy(cpu) {
		t.Errorf("cpu pool busy: %+v", e)
	}
	if !IsResourceExhausted(tooLarge) || isBusy(tooLarge) || isBusy(convertError(status.Error(codes.Unavailable, "down"))) || isBusy(nil) {
		t.Error("only RESOURCE_EXHAUSTED with a busy reason is busy")
	}

	w := &Worker{opts: WorkerOptions{Backoff: fastBackoff}}
	if delay, again := w.retryDelay(quota, 1); !again || delay != 1500*time.Millisecond {
		t.Errorf("quota exceeded: again %v after %s, want after its RetryInfo", again, delay)
	}
	if delay, again := w.retryDelay(cpu, 3); !again || delay < fastBackoff.Cap(3)/2 || delay > fastBackoff.Cap(3) {
		t.Errorf("cpu pool busy: again %v after %s, want after the back-off", again, delay)
	}
	if _, again := w.retryDelay(tooLarge, 1); again {
		t.Error("a payload over the limit would be sent again")
	}
}

// bigOutputWorker runs a worker whose handler returns a 5,002-byte output
// to a fake server offloading values over 500 bytes.
func bigOutputWorker(t *testing.T, reportTimeout time.Duration) (*fakeServer, *Worker, string) {
	t.Helper()
	f, client := startFake(t)
	f.mu.Lock()
	f.offload = 500
	f.mu.Unlock()
	output := strings.Repeat("o", 5000)
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, Backoff: fastBackoff, ReportTimeout: reportTimeout})
	w.Handle("q", "big", func(ctx context.Context, task *Task) (any, error) { return output, nil })
	runWorker(t, w)
	return f, w, `"` + output + `"`
}

// L6: an output's upload refused by a busy server (QUOTA_EXCEEDED) is sent
// again after the status's RetryInfo delay; once taken, the task completes
// with the reference.
func TestL06BusyUploadIsSentAgain(t *testing.T) {
	f, w, output := bigOutputWorker(t, 0)
	refusals := 2
	f.blobs.mu.Lock()
	f.blobs.refuse = func() error {
		if refusals == 0 {
			return nil
		}
		refusals--
		return quotaExceededStatus(10 * time.Millisecond)
	}
	f.blobs.mu.Unlock()
	f.add(fakeTask("busy", "q", "big", 3*time.Second, nil))
	eventually(t, 10*time.Second, "busy completed", func() bool { return w.Stats().Completed == 1 })
	_, _, completes, fails := f.snapshot()
	ref, ok := ParseBlobRef(rawJSON(completes[0].GetOutput()))
	if !ok || string(f.blobs.get(ref.SHA256)) != output || len(fails) != 0 {
		t.Errorf("reported %.200s, fails %v", rawJSON(completes[0].GetOutput()), fails)
	}
	if uploads, _ := f.blobs.recorded(); len(uploads) != 3 {
		t.Errorf("%d uploads, want 3 (refused twice, then taken)", len(uploads))
	}
}

// L6: a task input's download refused by a busy server fails the attempt
// with INPUT_UNAVAILABLE, retryable (the next attempt may be served), and
// the handler does not run.
func TestL06BusyInputDownloadFailsRetryably(t *testing.T) {
	f, client := startFake(t)
	ref := f.blobs.put([]byte(`{"doc":"` + strings.Repeat("d", 3000) + `"}`))
	f.blobs.mu.Lock()
	f.blobs.refuseDownload = func() error { return quotaExceededStatus(20 * time.Millisecond) }
	f.blobs.mu.Unlock()
	var input map[string]any
	_ = json.Unmarshal(ref.Reference(), &input)
	ran := make(chan struct{}, 1)
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, Backoff: fastBackoff})
	w.Handle("q", "read", func(ctx context.Context, task *Task) (any, error) { ran <- struct{}{}; return nil, nil })
	runWorker(t, w)
	f.add(fakeTask("busy", "q", "read", 3*time.Second, input))
	eventually(t, 10*time.Second, "busy failed", func() bool { return w.Stats().Failed == 1 })
	_, _, _, fails := f.snapshot()
	if r := fails[0]; r.GetErrorCode() != "INPUT_UNAVAILABLE" || !r.GetRetryable() || !strings.Contains(r.GetMessage(), ReasonQuotaExceeded) {
		t.Errorf("fail %v", r)
	}
	if len(ran) != 0 {
		t.Error("the handler ran without its input")
	}
}

// L6: an upload the server refuses as busy until the report deadline fails
// the attempt with OUTPUT_UPLOAD_FAILED, retryable.
func TestL06UploadBusyUntilTheDeadlineFailsRetryably(t *testing.T) {
	f, w, _ := bigOutputWorker(t, 100*time.Millisecond)
	f.blobs.mu.Lock()
	f.blobs.refuse = func() error { return quotaExceededStatus(20 * time.Millisecond) }
	f.blobs.mu.Unlock()
	f.add(fakeTask("busy", "q", "big", 3*time.Second, nil))
	eventually(t, 10*time.Second, "busy failed", func() bool { return w.Stats().Failed == 1 })
	_, _, completes, fails := f.snapshot()
	if r := fails[0]; len(completes) != 0 || r.GetErrorCode() != "OUTPUT_UPLOAD_FAILED" || !r.GetRetryable() || !strings.Contains(r.GetMessage(), ReasonQuotaExceeded) {
		t.Errorf("completes %v, fail %v", completes, r)
	}
	if uploads, _ := f.blobs.recorded(); len(uploads) < 2 {
		t.Errorf("%d uploads, want the refused one sent again", len(uploads))
	}
}

// L6: a RESOURCE_EXHAUSTED without a busy reason (the payload limit, naming
// its field in google.rpc.BadRequest) fails the attempt with
// OUTPUT_TOO_LARGE, non-retryably, and is not sent again.
func TestL06PayloadLimitIsOutputTooLarge(t *testing.T) {
	f, w, _ := bigOutputWorker(t, 0)
	f.blobs.mu.Lock()
	f.blobs.refuse = payloadTooLargeStatus
	f.blobs.mu.Unlock()
	f.add(fakeTask("huge", "q", "big", 3*time.Second, nil))
	eventually(t, 10*time.Second, "huge failed", func() bool { return w.Stats().Failed == 1 })
	_, _, completes, fails := f.snapshot()
	if r := fails[0]; len(completes) != 0 || r.GetErrorCode() != "OUTPUT_TOO_LARGE" || r.GetRetryable() {
		t.Errorf("completes %v, fail %v", completes, r)
	}
	if uploads, _ := f.blobs.recorded(); len(uploads) != 1 {
		t.Errorf("%d uploads, want 1", len(uploads))
	}
}

// L6: a completion report refused by a busy server is sent again with the
// same lease (after the back-off when the status has no RetryInfo) until
// it is applied.
func TestL06BusyReportIsSentAgain(t *testing.T) {
	f, client := startFake(t)
	f.completeErrs = []error{cpuPoolBusyStatus(), quotaExceededStatus(10 * time.Millisecond)}
	f.add(fakeTask("r", "q", "work", 3*time.Second, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, Backoff: fastBackoff})
	w.Handle("q", "work", func(ctx context.Context, task *Task) (any, error) { return map[string]int{"ok": 1}, nil })
	runWorker(t, w)
	eventually(t, 10*time.Second, "completion", func() bool { return w.Stats().Completed == 1 })
	_, _, completes, fails := f.snapshot()
	if len(completes) != 3 || len(fails) != 0 || w.Stats().ReportRetries != 2 {
		t.Fatalf("%d CompleteTask and %d FailTask calls, stats %+v; want 3 and 0", len(completes), len(fails), w.Stats())
	}
	for _, c := range completes {
		if c.GetLeaseToken() != "token-r" {
			t.Errorf("a retried report changed its lease: %v", c)
		}
	}
}

// L6: a completion report refused as busy until the report deadline fails
// the attempt with OUTPUT_UPLOAD_FAILED, retryable.
func TestL06ReportBusyUntilTheDeadlineFailsRetryably(t *testing.T) {
	f, client := startFake(t)
	// Each refusal asks for 20 ms: far more than the 100 ms deadline lets through.
	for range 50 {
		f.completeErrs = append(f.completeErrs, quotaExceededStatus(20*time.Millisecond))
	}
	f.add(fakeTask("r", "q", "work", 3*time.Second, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, Backoff: fastBackoff, ReportTimeout: 100 * time.Millisecond})
	w.Handle("q", "work", func(ctx context.Context, task *Task) (any, error) { return map[string]int{"ok": 1}, nil })
	runWorker(t, w)
	eventually(t, 10*time.Second, "the failure", func() bool { return w.Stats().Failed == 1 })
	_, _, completes, fails := f.snapshot()
	if r := fails[0]; len(completes) < 2 || r.GetErrorCode() != "OUTPUT_UPLOAD_FAILED" || !r.GetRetryable() || r.GetLeaseToken() != "token-r" {
		t.Errorf("%d CompleteTask calls, fail %v", len(completes), r)
	}
	if w.Stats().Completed != 0 {
		t.Errorf("stats %+v", w.Stats())
	}
}

// A graceful stop: no poll starts after ctx ends; the attempt in flight
// finishes and reports while heartbeats go on.
func TestGracefulStopDrainsAndPollsNothingNew(t *testing.T) {
	f, client := startFake(t)
	f.add(fakeTask("g", "q", "slow", 300*time.Millisecond, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, DrainTimeout: 10 * time.Second})
	started := make(chan struct{})
	w.Handle("q", "slow", func(ctx context.Context, task *Task) (any, error) {
		close(started)
		time.Sleep(time.Second)
		return "drained", ctx.Err()
	})
	stop := runWorker(t, w)
	<-started
	begun := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	polls, beats, completes, _ := f.snapshot()
	for _, p := range polls {
		if p.at.After(begun) {
			t.Errorf("a poll started %s after the stop", p.at.Sub(begun))
		}
	}
	if len(completes) != 1 || w.Stats().Completed != 1 {
		t.Fatalf("completes %d", len(completes))
	}
	last := beats[len(beats)-1].at
	if !last.After(begun) || last.After(time.Now()) {
		t.Errorf("heartbeats did not go on during the drain")
	}
}

// A panic in a handler is a retryable failure with its stack in the details.
func TestPanicIsARetryableFailureWithItsStack(t *testing.T) {
	f, client := startFake(t)
	f.add(fakeTask("p", "q", "boom", 3*time.Second, nil))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond})
	w.Handle("q", "boom", func(ctx context.Context, task *Task) (any, error) {
		var s []int
		return s[len(task.ID)], nil // a runtime error: index out of range
	})
	runWorker(t, w)
	eventually(t, 10*time.Second, "the failure", func() bool { return w.Stats().Failed == 1 })
	_, _, _, fails := f.snapshot()
	r := fails[0]
	stack := r.GetDetails().GetStructValue().GetFields()["stack"].GetStringValue()
	if r.GetErrorCode() != "PANIC" || !r.GetRetryable() || !strings.Contains(r.GetMessage(), "index out of range") || !strings.Contains(stack, "worker_test.go") {
		t.Fatalf("fail %v", r)
	}
}

// The attempt deadline is the handler's context deadline; its expiry fails
// the attempt with TIMEOUT.
func TestAttemptDeadlineIsTheContextDeadline(t *testing.T) {
	f, client := startFake(t)
	task := fakeTask("dl", "q", "slow", 3*time.Second, nil)
	deadline := time.Now().Add(400 * time.Millisecond).Truncate(time.Microsecond)
	task.AttemptDeadline = timestamppb.New(deadline)
	f.add(task)
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond})
	var seen time.Time
	var cause error
	w.Handle("q", "slow", func(ctx context.Context, t *Task) (any, error) {
		seen, _ = ctx.Deadline()
		<-ctx.Done()
		cause = context.Cause(ctx)
		return nil, ctx.Err()
	})
	runWorker(t, w)
	eventually(t, 10*time.Second, "the failure", func() bool { return w.Stats().Failed == 1 })
	_, _, _, fails := f.snapshot()
	if !seen.Equal(deadline) || !errors.Is(cause, ErrAttemptTimeout) || fails[0].GetErrorCode() != "TIMEOUT" {
		t.Fatalf("deadline %s (want %s), cause %v, fail %v", seen, deadline, cause, fails[0])
	}
}

// Errors: TaskError, NonRetryable and a plain error are reported as documented.
func TestHandlerErrorsBecomeFailures(t *testing.T) {
	f, client := startFake(t)
	w := NewWorker(client, WorkerOptions{Slots: 3, PollWait: 200 * time.Millisecond})
	w.Handle("q", "declined", func(ctx context.Context, t *Task) (any, error) {
		return nil, NonRetryable(&TaskError{Code: "DECLINED", Message: "card declined", Details: map[string]string{"card": "4242"}})
	})
	w.Handle("q", "flaky", func(ctx context.Context, t *Task) (any, error) {
		return nil, &TaskError{Code: "FLAKY", Retryable: true, Err: errors.New("try again")}
	})
	w.Handle("q", "plain", func(ctx context.Context, t *Task) (any, error) {
		return nil, fmt.Errorf("charging: %w", errors.New("connection reset"))
	})
	runWorker(t, w)
	f.add(fakeTask("declined", "q", "declined", 3*time.Second, nil), fakeTask("flaky", "q", "flaky", 3*time.Second, nil), fakeTask("plain", "q", "plain", 3*time.Second, nil))
	eventually(t, 10*time.Second, "three failures", func() bool { return w.Stats().Failed == 3 })
	_, _, _, fails := f.snapshot()
	got := map[string]*pb.FailTaskRequest{}
	for _, r := range fails {
		got[r.GetTaskId()] = r
	}
	if r := got["declined"]; r.GetErrorCode() != "DECLINED" || r.GetRetryable() || r.GetMessage() != "card declined" ||
		r.GetDetails().GetStructValue().GetFields()["card"].GetStringValue() != "4242" {
		t.Errorf("declined: %v", r)
	}
	if r := got["flaky"]; r.GetErrorCode() != "FLAKY" || !r.GetRetryable() || r.GetMessage() != "try again" {
		t.Errorf("flaky: %v", r)
	}
	r := got["plain"]
	chain := r.GetDetails().GetStructValue().GetFields()["chain"].GetListValue().GetValues()
	if r.GetErrorCode() != DefaultErrorCode || !r.GetRetryable() || r.GetMessage() != "charging: connection reset" || len(chain) != 2 {
		t.Errorf("plain: %v", r)
	}
}

func TestTypedDecodesTheInputAndEncodesTheOutput(t *testing.T) {
	type in struct {
		X int `json:"x"`
	}
	type out struct {
		Y int `json:"y"`
	}
	h := Typed(func(ctx context.Context, v in) (out, error) { return out{Y: v.X * 2}, nil })
	got, err := h(context.Background(), &Task{Input: json.RawMessage(`{"x": 21}`)})
	if err != nil || got.(out).Y != 42 {
		t.Fatalf("got %v, %v", got, err)
	}
	_, err = h(context.Background(), &Task{Input: json.RawMessage(`{"x": "nope"}`)})
	var te *TaskError
	if !errors.As(err, &te) || te.Code != "INVALID_INPUT" || te.Retryable {
		t.Fatalf("bad input: %v", err)
	}
}

func TestErrorsDecodeStatusDetails(t *testing.T) {
	st, _ := status.New(codes.InvalidArgument, "the workflow is invalid").WithDetails(
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: "nodes[0].retry.max_attempts", Description: "must be at least 1"},
			{Field: "edges[0].to", Description: "unknown node nowhere"},
		}},
		&errdetails.ErrorInfo{Reason: "INVALID_WORKFLOW", Domain: "composer.dev", Metadata: map[string]string{"k": "v"}},
	)
	err := fmt.Errorf("registering: %w", convertError(st.Err()))
	var ce *Error
	if !errors.As(err, &ce) || !IsInvalidArgument(err) || IsNotFound(err) || Code(err) != codes.InvalidArgument {
		t.Fatalf("%v", err)
	}
	if len(ce.FieldViolations) != 2 || ce.FieldViolations[1].Field != "edges[0].to" || ce.Reason != "INVALID_WORKFLOW" || ce.Metadata["k"] != "v" {
		t.Fatalf("%+v", ce)
	}
	text := ce.Error()
	for _, want := range []string{"INVALID_ARGUMENT", "nodes[0].retry.max_attempts: must be at least 1", "edges[0].to", "[INVALID_WORKFLOW]"} {
		if !strings.Contains(text, want) {
			t.Errorf("%q lacks %q", text, want)
		}
	}
	if status.Code(ce) != codes.InvalidArgument {
		t.Error("status.Code does not see the code")
	}
	lost := convertError(leaseLostStatus())
	if !IsLeaseLost(lost) || !IsFailedPrecondition(lost) || IsRetryable(lost) {
		t.Errorf("lease lost: %v", lost)
	}
	if !IsRetryable(convertError(status.Error(codes.Unavailable, "x"))) || IsLeaseLost(nil) || Code(nil) != codes.OK {
		t.Error("retryable / nil")
	}
}

// The local half of C13: a server of another protocol major is refused
// before any poll.
func TestRunRefusesAServerOfAnotherProtocol(t *testing.T) {
	f, client := startFake(t)
	f.protocol = "2.0"
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond})
	w.Handle("q", "x", func(ctx context.Context, t *Task) (any, error) { return nil, nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := w.Run(ctx)
	if !IsFailedPrecondition(err) || !strings.Contains(err.Error(), `"2.0"`) {
		t.Fatalf("Run = %v", err)
	}
	if polls, _, _, _ := f.snapshot(); len(polls) != 0 {
		t.Fatal("polled a server of another protocol")
	}
	for _, v := range []string{"1.0", "1.7", "1"} {
		if CheckProtocolVersion(v) != nil {
			t.Errorf("refused %s", v)
		}
	}
	for _, v := range []string{"0.9", "2.0", "", "x.y"} {
		if CheckProtocolVersion(v) == nil {
			t.Errorf("accepted %q", v)
		}
	}
}

func TestRunWithoutQueuesFails(t *testing.T) {
	_, client := startFake(t)
	if err := NewWorker(client, WorkerOptions{}).Run(context.Background()); err == nil {
		t.Fatal("a worker with no queue ran")
	}
}
