package composer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// DefaultLease is the lease length assumed for a task that carries none.
const DefaultLease = 30 * time.Second

// MaxPollTasks is the most tasks one PollTasks may ask for.
const MaxPollTasks = 100

// DefaultPollers is the number of polls a worker keeps waiting at once
// unless WorkerOptions.Pollers says otherwise.
const DefaultPollers = 4

// skewedFirstHeartbeat is the first heartbeat's delay when a task's first
// expiry is already past by this process's clock (the clocks are apart).
const skewedFirstHeartbeat = 500 * time.Millisecond

const (
	maxMessage = 4000
	maxStack   = 32000
)

// WorkerOptions configures a Worker. The zero value of each field picks its default.
type WorkerOptions struct {
	// Slots is how many attempts run at once (default 10). Each poll asks
	// for at most the free slots.
	Slots int
	// Queues are polled besides the queues named in Handle.
	Queues []string
	// WorkerID is recorded by the server as the lease owner (default
	// <host>-<pid>-<random>).
	WorkerID string
	// PollWait is the long-poll wait of each PollTasks (default 20 s, at most 60 s).
	PollWait time.Duration
	// Pollers is how many PollTasks calls the worker may keep waiting at
	// once (default DefaultPollers, at most Slots). Each poll asks only for
	// free slots no other poll asked for (at most MaxPollTasks), so polls
	// waiting together never ask for more tasks than free slots. The first
	// polls as soon as a slot is free; each other one only once its share
	// (Slots / Pollers, rounded up) is free, so a worker whose slots are
	// nearly all taken polls with one large poll rather than many small
	// ones. More than one keeps a poll waiting in the server while
	// another's answer is on its way: the server hands a task a step just
	// armed to a poll waiting then, in the step's own transaction, and
	// otherwise queues the task and leases it apart, later.
	Pollers int
	// DrainTimeout is how long Run waits, once its ctx ended, for the
	// attempts in flight (default 30 s). Attempts still running then are
	// failed with WORKER_SHUTDOWN (retryable).
	DrainTimeout time.Duration
	// ReportTimeout bounds the retries of one report, or of one output's
	// upload, after UNAVAILABLE, DEADLINE_EXCEEDED or a busy server
	// (RESOURCE_EXHAUSTED with reason QUOTA_EXCEEDED or CPU_POOL_BUSY)
	// (default 5 min).
	ReportTimeout time.Duration
	// HeartbeatInterval overrides the default of a third of each task's
	// lease. The first heartbeat comes sooner when the first, short lease
	// must be confirmed before it ends (see PollTasksRequest.confirm_receipt).
	HeartbeatInterval time.Duration
	// Backoff spaces the retries of failed polls, heartbeats and reports
	// (default DefaultBackoff).
	Backoff Backoff
	// Logger receives the worker's structured logs (default: the Client's).
	Logger *slog.Logger
	// SkipServerCheck skips the protocol version check Run makes before polling.
	SkipServerCheck bool
	// TracerProvider makes the spans of the handlers (default
	// otel.GetTracerProvider(): the global one, a no-op until the program
	// sets one).
	TracerProvider trace.TracerProvider
}

// Stats is a snapshot of what a worker did since it was made.
type Stats struct {
	// Polled is the number of tasks leased to this worker.
	Polled int64
	// Completed is the number of attempts reported complete (applied).
	Completed int64
	// Failed is the number of attempts reported failed (applied).
	Failed int64
	// LeaseLost is the number of attempts dropped because the server said
	// the lease was no longer this worker's.
	LeaseLost int64
	// Cancelled is the number of attempts stopped because their run was cancelled.
	Cancelled int64
	// ReportRetries is the number of reports sent again after UNAVAILABLE,
	// DEADLINE_EXCEEDED or a busy server.
	ReportRetries int64
	// Polls is the number of PollTasks calls made, PollErrors those that failed.
	Polls      int64
	PollErrors int64
	// MaxTasksAsked is the largest max_tasks a poll asked for.
	MaxTasksAsked int64
	// InFlight is the number of attempts running now; MaxInFlight the most
	// that ever ran at once.
	InFlight    int
	MaxInFlight int
}

type counters struct {
	polled, completed, failed, leaseLost, cancelled, reportRetries, polls, pollErrors, maxAsked atomic.Int64
}

type handlerKey struct{ queue, task string }

// Worker runs handlers for the tasks a server leases to it. Register
// handlers with Handle, then call Run. The worker never shows a lease to a
// handler: it polls with as many tasks as it has free slots, confirms the
// receipt of each attempt still running a third of the way to its first,
// short expiry with an early heartbeat (so a poll answer lost on the way
// costs no attempt), heartbeats each running attempt at a third of its
// lease, cancels the handler's context when the run is cancelled or the
// lease lost, reports the outcome with the lease token (again with the same
// token after UNAVAILABLE, DEADLINE_EXCEEDED or a busy server, never after
// LEASE_LOST), and on shutdown stops polling, drains and only then stops
// heartbeating.
type Worker struct {
	client  *Client
	opts    WorkerOptions
	log     *slog.Logger
	tracer  trace.Tracer
	slots   *slots
	stats   counters
	running sync.WaitGroup

	mu       sync.Mutex
	handlers map[handlerKey]Handler
	queues   []string
	inFlight map[*attempt]struct{}
	serving  bool
	hard     context.Context
}

// NewWorker makes a worker that talks to the server through client.
func NewWorker(client *Client, opts WorkerOptions) *Worker {
	if opts.Slots <= 0 {
		opts.Slots = 10
	}
	if opts.PollWait <= 0 {
		opts.PollWait = 20 * time.Second
	}
	opts.PollWait = min(opts.PollWait, 60*time.Second)
	if opts.Pollers <= 0 {
		opts.Pollers = DefaultPollers
	}
	opts.Pollers = min(opts.Pollers, opts.Slots)
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 30 * time.Second
	}
	if opts.ReportTimeout <= 0 {
		opts.ReportTimeout = 5 * time.Minute
	}
	if opts.Backoff == (Backoff{}) {
		opts.Backoff = DefaultBackoff
	}
	if opts.WorkerID == "" {
		host, _ := os.Hostname()
		opts.WorkerID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randomHex(4))
	}
	logger := opts.Logger
	if logger == nil {
		logger = client.logger
	}
	if opts.TracerProvider == nil {
		opts.TracerProvider = otel.GetTracerProvider()
	}
	w := &Worker{
		client: client, opts: opts, log: logger.With("worker_id", opts.WorkerID), tracer: opts.TracerProvider.Tracer(TracerName),
		slots: newSlots(opts.Slots), handlers: map[handlerKey]Handler{}, inFlight: map[*attempt]struct{}{},
	}
	for _, q := range opts.Queues {
		w.addQueue(q)
	}
	return w
}

// ID is the worker's id, recorded by the server as the lease owner.
func (w *Worker) ID() string { return w.opts.WorkerID }

func (w *Worker) addQueue(q string) {
	for _, have := range w.queues {
		if have == q {
			return
		}
	}
	w.queues = append(w.queues, q)
}

// Handle registers handler for the tasks named taskName on queue, which is
// then polled. With an empty queue the handler serves taskName on every
// queue the worker polls. It panics if the pair already has a handler.
func (w *Worker) Handle(queue, taskName string, handler Handler) {
	w.mu.Lock()
	defer w.mu.Unlock()
	key := handlerKey{queue, taskName}
	if _, dup := w.handlers[key]; dup {
		panic(fmt.Sprintf("composer: task %q on queue %q already has a handler", taskName, queue))
	}
	w.handlers[key] = handler
	if queue != "" {
		w.addQueue(queue)
	}
}

// HandleQueue registers handler for every task of queue that no handler
// claims by name.
func (w *Worker) HandleQueue(queue string, handler Handler) {
	w.Handle(queue, "", handler)
}

// Queues returns the queues the worker polls.
func (w *Worker) Queues() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.queues...)
}

func (w *Worker) handlerFor(queue, task string) Handler {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, key := range []handlerKey{{queue, task}, {"", task}, {queue, ""}} {
		if h, ok := w.handlers[key]; ok {
			return h
		}
	}
	return nil
}

// Stats returns a snapshot of the worker's counters.
func (w *Worker) Stats() Stats {
	used, high := w.slots.inUse()
	return Stats{
		Polled: w.stats.polled.Load(), Completed: w.stats.completed.Load(), Failed: w.stats.failed.Load(),
		LeaseLost: w.stats.leaseLost.Load(), Cancelled: w.stats.cancelled.Load(),
		ReportRetries: w.stats.reportRetries.Load(), Polls: w.stats.polls.Load(),
		PollErrors: w.stats.pollErrors.Load(), MaxTasksAsked: w.stats.maxAsked.Load(),
		InFlight: used, MaxInFlight: high,
	}
}

// Run serves until ctx ends, then stops gracefully: it starts no new poll
// (a poll already waiting may still return tasks, which run), waits up to
// DrainTimeout for the attempts in flight to finish and report while still
// heartbeating them, fails those still running with WORKER_SHUTDOWN, and
// only then stops heartbeating. It returns nil after a graceful stop, or
// the error that kept it from serving (no queue, a server of another
// protocol, a refused token). Before polling it checks the server's
// protocol version, waiting with back-off while the server is unreachable.
//
// For a main package, signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
// gives the ctx.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.serving {
		w.mu.Unlock()
		return errors.New("composer: this worker is already running")
	}
	if len(w.queues) == 0 {
		w.mu.Unlock()
		return errors.New("composer: the worker has no queue to poll: Handle a task on a queue, or set WorkerOptions.Queues")
	}
	hard, stopAll := context.WithCancel(context.Background())
	w.serving, w.hard = true, hard
	queues := append([]string(nil), w.queues...)
	w.mu.Unlock()
	defer func() {
		stopAll()
		w.mu.Lock()
		w.serving = false
		w.mu.Unlock()
	}()

	if !w.opts.SkipServerCheck {
		if err := w.waitForServer(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	w.log.Info("composer worker polling", "queues", strings.Join(queues, ","), "slots", w.opts.Slots)

	pollCtx, cancelPoll := context.WithCancel(hard)
	defer cancelPoll()
	pollDone := make(chan struct{})
	// Attempts run on goroutines kept for the next attempt once done (see
	// start); closing idle, once no poll can start another attempt, lets
	// them end.
	idle := make(chan *attempt)
	var pollers sync.WaitGroup
	for i := range w.opts.Pollers {
		pollers.Go(func() { w.pollLoop(i, ctx, pollCtx, queues, idle) })
	}
	go func() {
		pollers.Wait()
		close(pollDone)
	}()
	<-ctx.Done()
	drainDeadline := time.Now().Add(w.opts.DrainTimeout)
	w.log.Info("composer worker stopping: no new polls; draining", "in_flight", w.Stats().InFlight, "drain_timeout", w.opts.DrainTimeout)

	// 1. Stop polling. A poll already waiting may return tasks whose leases
	// the server recorded: cancelling it would strand them until their
	// leases expire, so it may finish (within the drain) and its tasks run.
	timer := time.NewTimer(w.opts.DrainTimeout)
	defer timer.Stop()
	select {
	case <-pollDone:
	case <-timer.C:
		cancelPoll()
		<-pollDone
	}
	close(idle)
	// 2. Drain: attempts finish and report; heartbeats go on.
	w.drain(drainDeadline)
	// 3. Only now stop heartbeating (stopAll, deferred).
	w.log.Info("composer worker stopped", "completed", w.stats.completed.Load(), "failed", w.stats.failed.Load())
	return nil
}

func (w *Worker) waitForServer(ctx context.Context) error {
	failures := 0
	for {
		callCtx, cancel := context.WithTimeout(w.client.OutgoingContext(ctx), 10*time.Second)
		r, err := w.client.server.GetServerInfo(callCtx, &pb.GetServerInfoRequest{})
		cancel()
		if err == nil {
			if perr := CheckProtocolVersion(r.GetProtocolVersion()); perr != nil {
				return fmt.Errorf("composer: server %s: %w", w.client.address, perr)
			}
			w.client.remember(serverInfoFrom(r)) // the offload threshold
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		err = convertError(err)
		if !IsRetryable(err) {
			return fmt.Errorf("composer: server %s: %w", w.client.address, err)
		}
		failures++
		w.log.Warn("composer server not reachable yet; retrying", "address", w.client.address, "error", err)
		if !sleepCtx(ctx, w.opts.Backoff.Delay(failures)) {
			return ctx.Err()
		}
	}
}

// pollLoop polls until stop ends; calls run under callCtx, which outlives
// stop. Opts.Pollers of them run at once (index numbers them from 0): each
// sets aside the free slots it asks for before its poll, and gives back
// those the answer did not fill.
func (w *Worker) pollLoop(index int, stop, callCtx context.Context, queues []string, idle chan *attempt) {
	failures := 0
	wait := durationpb.New(w.opts.PollWait)
	// The first poll loop polls as soon as a slot is free; each other one
	// only once its share of the slots is free and no poll asked for them,
	// so that a worker whose slots are all taken (a backlog waiting in the
	// server) polls as one loop, with few large polls, rather than splitting
	// its free slots into many small polls that the server answers apart.
	least := 1
	if index > 0 {
		least = max(min((w.opts.Slots+w.opts.Pollers-1)/w.opts.Pollers, MaxPollTasks), 1)
	}
	for stop.Err() == nil {
		n, ok := w.slots.reserve(stop, least, MaxPollTasks)
		if !ok {
			return
		}
		// ConfirmReceipt: a poll answer lost on the way costs no attempt
		// (decision 0012); the first heartbeat confirms (firstHeartbeatDelay).
		req := &pb.PollTasksRequest{WorkerId: w.opts.WorkerID, Queues: queues, MaxTasks: int32(n), Wait: wait, ConfirmReceipt: true}
		w.stats.polls.Add(1)
		for {
			old := w.stats.maxAsked.Load()
			if int64(n) <= old || w.stats.maxAsked.CompareAndSwap(old, int64(n)) {
				break
			}
		}
		ctx, cancel := context.WithTimeout(w.client.OutgoingContext(callCtx), w.opts.PollWait+5*time.Second)
		resp, err := w.client.workers.PollTasks(ctx, req)
		cancel()
		if err != nil {
			w.slots.unreserve(n)
			if callCtx.Err() != nil {
				return
			}
			err = convertError(err)
			failures++
			w.stats.pollErrors.Add(1)
			delay := w.opts.Backoff.Delay(failures)
			level := slog.LevelWarn
			if IsRetryable(err) && failures == 1 {
				level = slog.LevelDebug
			}
			w.log.Log(context.Background(), level, "composer poll failed; polling again after a back-off", "error", err, "delay", delay)
			sleepCtx(stop, delay)
			continue
		}
		failures = 0
		tasks := resp.GetTasks()
		if len(tasks) > n {
			// The server leased more than asked: run them anyway, the leases are ours.
			w.log.Error("composer server leased more tasks than free slots", "slots", w.opts.Slots, "asked", n, "leased", len(tasks))
		}
		w.slots.settle(n, len(tasks))
		w.stats.polled.Add(int64(len(tasks)))
		for _, t := range tasks {
			w.start(t, idle)
		}
	}
}

// attempt is one leased task running in this worker.
type attempt struct {
	raw    *pb.Task
	task   *Task
	ctx    context.Context
	cancel context.CancelCauseFunc
	// hard is the worker's context of the Run that started the attempt.
	hard         context.Context
	stopDeadline context.CancelFunc
	// claimed: the executor or the drain has taken the right to report.
	claimed atomic.Bool
	// handlerDone: the handler returned.
	handlerDone atomic.Bool
	leaseCount  atomic.Bool
	// span is the handler's span (ended before the report goes out, so an
	// exporter has it when the run ends); traceMD its context for the reports.
	span    trace.Span
	traceMD []string

	// Heartbeats: a timer armed for the first one (firstHeartbeatDelay);
	// the heartbeat loop (a goroutine) only starts when it fires, so a task
	// done before then costs no goroutine for them.
	beatMu     sync.Mutex
	beatTimer  *time.Timer
	beatStop   bool
	beatCancel context.CancelFunc
	beatsDone  chan struct{}
}

// start runs a leased task: on a goroutine waiting in idle for one if
// there is, else on a new goroutine, which waits in idle for the next
// attempt once this one is done. Reusing goroutines spares each attempt
// a goroutine's start, exit and the growth of its stack (a gRPC call needs
// more than a new goroutine has).
func (w *Worker) start(raw *pb.Task, idle chan *attempt) {
	t := taskFrom(raw, w.log)
	ctx, span := startHandlerSpan(context.WithValue(context.Background(), taskKey{}, t), w.tracer, raw)
	ctx, cancel := context.WithCancelCause(ctx)
	a := &attempt{raw: raw, task: t, cancel: cancel, hard: w.hard, stopDeadline: func() {}, span: span, traceMD: reportTraceMetadata(span)}
	if !t.Deadline.IsZero() {
		ctx, a.stopDeadline = context.WithDeadlineCause(ctx, t.Deadline, ErrAttemptTimeout)
	}
	a.ctx = ctx
	w.mu.Lock()
	w.inFlight[a] = struct{}{}
	w.mu.Unlock()
	w.running.Add(1)
	a.beatMu.Lock()
	first := firstHeartbeatDelay(raw, w.heartbeatInterval(a), time.Now())
	a.beatTimer = time.AfterFunc(first, func() { w.beginHeartbeats(a) })
	a.beatMu.Unlock()
	select {
	case idle <- a:
	default:
		go w.runAttempts(a, idle)
	}
}

// runAttempts runs a, then the attempts start hands it, until idle is closed.
func (w *Worker) runAttempts(a *attempt, idle chan *attempt) {
	for {
		w.runAttempt(a)
		var ok bool
		if a, ok = <-idle; !ok {
			return
		}
	}
}

func (w *Worker) runAttempt(a *attempt) {
	defer w.running.Done()
	defer func() {
		a.stopBeats()
		a.stopDeadline()
		a.cancel(nil)
		w.mu.Lock()
		delete(w.inFlight, a)
		w.mu.Unlock()
		w.slots.release()
	}()
	w.execute(a)
}

// beginHeartbeats runs, on the timer's goroutine, the heartbeat loop of an
// attempt still running when its first heartbeat is due.
func (w *Worker) beginHeartbeats(a *attempt) {
	a.beatMu.Lock()
	if a.beatStop || a.hard.Err() != nil {
		a.beatMu.Unlock()
		return
	}
	beats, cancel := context.WithCancel(a.hard)
	a.beatCancel, a.beatsDone = cancel, make(chan struct{})
	a.beatMu.Unlock()
	defer close(a.beatsDone)
	w.heartbeatLoop(beats, a)
}

// stopBeats stops the attempt's heartbeats and waits for a heartbeat in
// flight to end.
func (a *attempt) stopBeats() {
	a.beatMu.Lock()
	a.beatStop = true
	if a.beatTimer != nil {
		a.beatTimer.Stop()
	}
	cancel, done := a.beatCancel, a.beatsDone
	a.beatMu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

func (w *Worker) execute(a *attempt) {
	out, err := w.invoke(a)
	var value *structpb.Value
	if err == nil {
		// Still under the lease's watch: a lost lease or a cancelled run
		// stops an upload as it stops a handler.
		value, err = w.outputValue(a, out)
	}
	a.handlerDone.Store(true)
	if !a.claimed.CompareAndSwap(false, true) {
		return // the drain timed out and failed the attempt
	}
	cause := context.Cause(a.ctx)
	switch {
	case errors.Is(cause, ErrRunCancelled):
		endHandlerSpan(a.span, ErrRunCancelled.Error(), nil)
		w.stats.cancelled.Add(1)
		a.task.Logger.Info("composer task stopped: run cancelled; not reporting", "reason", CancelReason(a.ctx))
		return
	case errors.Is(cause, ErrLeaseLost):
		endHandlerSpan(a.span, cause.Error(), nil)
		a.task.Logger.Info("composer task stopped: lease lost; not reporting")
		return
	}
	if err == nil {
		endHandlerSpan(a.span, "", nil)
		w.complete(a, value)
		return
	}
	failure := w.failureOf(a, err)
	endHandlerSpan(a.span, failure.Error(), err)
	w.fail(a, failure)
}

// invoke runs the handler, turning a panic into a retryable failure.
func (w *Worker) invoke(a *attempt) (out any, err error) {
	t := a.task
	handler := w.handlerFor(t.Queue, t.Name)
	if handler == nil {
		t.Logger.Error("composer worker has no handler for this task", "queue", t.Queue)
		return nil, &TaskError{Code: "UNKNOWN_TASK", Message: fmt.Sprintf("this worker has no handler for task %q on queue %q", t.Name, t.Queue), Retryable: true}
	}
	if err := w.resolveInput(a); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			stack := string(debug.Stack())
			t.Logger.Error("composer handler panicked", "panic", r)
			err = &TaskError{
				Code: "PANIC", Message: fmt.Sprintf("handler panicked: %v", r), Retryable: true,
				Details: map[string]any{"panic": fmt.Sprint(r), "stack": truncate(stack, maxStack)},
			}
		}
	}()
	return handler(a.ctx, t)
}

// failureOf chooses the code, message, retryability and details of a handler's error.
func (w *Worker) failureOf(a *attempt, err error) *TaskError {
	var te *TaskError
	if errors.As(err, &te) {
		c := *te
		c.Code, c.Message = te.code(), te.message()
		return &c
	}
	if errors.Is(context.Cause(a.ctx), ErrAttemptTimeout) {
		return &TaskError{Code: "TIMEOUT", Message: "the attempt's deadline passed: " + err.Error(), Retryable: true}
	}
	chain := []map[string]string{}
	for e := err; e != nil && len(chain) < 16; e = errors.Unwrap(e) {
		chain = append(chain, map[string]string{"type": typeName(e), "message": truncate(e.Error(), maxMessage)})
	}
	a.task.Logger.Warn("composer handler failed", "error", err)
	return &TaskError{
		Code: errorCode(err), Message: err.Error(), Retryable: true,
		Details: map[string]any{"type": typeName(err), "error": truncate(err.Error(), maxMessage), "chain": chain},
	}
}

// DefaultErrorCode is the code of a failed handler's error that names no
// type of its own: errors.New, fmt.Errorf and errors.Join make errors whose
// Go types (errors.errorString, fmt.wrapError, ...) are the standard
// library's internals, not a code a workflow could match.
const DefaultErrorCode = "ERROR"

// errorCode is the code of a handler's error that is not a *TaskError: the
// type (without its pointer star) of the first error in its Unwrap chain
// that a program declared, e.g. fs.PathError or shop.DeclinedError, else
// DefaultErrorCode. Unexported types of the standard library are skipped.
func errorCode(err error) string {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if declaredType(e) {
			return typeName(e)
		}
	}
	return DefaultErrorCode
}

// declaredType reports whether err's type is a program's own: exported, or
// declared outside the standard library (whose import paths have no dot in
// their first element; main is a program's).
func declaredType(err error) bool {
	t := reflect.TypeOf(err)
	for t.Kind() == reflect.Pointer && t.Name() == "" {
		t = t.Elem()
	}
	name := t.Name()
	if name == "" {
		return false
	}
	if r, _ := utf8.DecodeRuneInString(name); unicode.IsUpper(r) {
		return true
	}
	pkg := t.PkgPath()
	first, _, _ := strings.Cut(pkg, "/")
	return pkg == "main" || strings.Contains(first, ".")
}

// typeName is the Go type of an error without its pointer star, e.g.
// errors.errorString or fs.PathError (the details' "type").
func typeName(err error) string {
	return strings.TrimLeft(fmt.Sprintf("%T", err), "*")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func (w *Worker) complete(a *attempt, value *structpb.Value) {
	req := &pb.CompleteTaskRequest{TaskId: a.raw.GetTaskId(), Attempt: a.raw.GetAttempt(), LeaseToken: a.raw.GetLeaseToken(), Output: value}
	applied, err := w.send(a, func(ctx context.Context) error {
		_, err := w.client.workers.CompleteTask(ctx, req)
		return err
	})
	switch {
	case isBusy(err):
		// The server stayed busy until the report deadline. Fail the attempt
		// retryably, as an upload meeting the same does, rather than wait for
		// the lease to expire: a FailTask is small, so a server refusing the
		// output's checks (CPU_POOL_BUSY) likely takes it; if it cannot be
		// sent either, fail logs it and the lease expires.
		w.fail(a, &TaskError{Code: "OUTPUT_UPLOAD_FAILED", Message: "could not report the output: " + err.Error(), Retryable: true, Err: err})
	case IsResourceExhausted(err):
		w.fail(a, &TaskError{Code: "OUTPUT_TOO_LARGE", Message: "output too large: " + err.(*Error).Message})
	case err != nil:
		a.task.Logger.Error("composer could not report the completion; the lease will expire", "error", err)
	case applied:
		w.stats.completed.Add(1)
		a.task.Logger.Debug("composer task completed")
	}
}

func (w *Worker) failRequest(a *attempt, f *TaskError) *pb.FailTaskRequest {
	req := &pb.FailTaskRequest{
		TaskId: a.raw.GetTaskId(), Attempt: a.raw.GetAttempt(), LeaseToken: a.raw.GetLeaseToken(),
		ErrorCode: f.code(), Message: truncate(f.message(), maxMessage), Retryable: f.Retryable,
	}
	if f.Details != nil {
		d, err := toValue(f.Details)
		if err != nil {
			d = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"repr": structpb.NewStringValue(truncate(fmt.Sprintf("%+v", f.Details), maxMessage)),
			}})
		}
		req.Details = d
	}
	return req
}

func (w *Worker) fail(a *attempt, f *TaskError) {
	req := w.failRequest(a, f)
	applied, err := w.send(a, func(ctx context.Context) error {
		_, err := w.client.workers.FailTask(ctx, req)
		return err
	})
	if err != nil {
		a.task.Logger.Error("composer could not report the failure; the lease will expire", "error", err)
		return
	}
	if applied {
		w.stats.failed.Add(1)
		a.task.Logger.Info("composer task failed", "code", req.ErrorCode, "retryable", req.Retryable, "message", req.Message)
	}
}

// send sends a report, again with the same lease token after UNAVAILABLE,
// DEADLINE_EXCEEDED or a busy server (see retryDelay), for up to
// ReportTimeout. It returns false (and no error) when the server said the
// lease was lost: the report is dropped and never sent again.
func (w *Worker) send(a *attempt, call func(context.Context) error) (bool, error) {
	deadline := time.Now().Add(w.opts.ReportTimeout)
	failures := 0
	for {
		ctx, cancel := context.WithTimeout(withTraceMetadata(w.client.OutgoingContext(w.hard), a.traceMD), 10*time.Second)
		err := convertError(call(ctx))
		cancel()
		if err == nil {
			return true, nil
		}
		if IsLeaseLost(err) {
			w.countLeaseLost(a)
			a.cancel(ErrLeaseLost)
			a.task.Logger.Warn("composer report refused: the lease was lost; dropping it (not retried)")
			return false, nil
		}
		failures++
		delay, again := w.retryDelay(err, failures)
		if !again || w.hard.Err() != nil || time.Now().After(deadline) {
			return false, err
		}
		w.stats.reportRetries.Add(1)
		a.task.Logger.Info("composer report failed; sending it again with the same lease", "error", err, "delay", delay)
		if !sleepCtx(w.hard, delay) {
			return false, err
		}
	}
}

// retryDelay says whether a failed report or output upload may be sent
// again as it is, and after how long: after UNAVAILABLE, DEADLINE_EXCEEDED
// or a busy server (isBusy), once the delay the server asked for
// (google.rpc.RetryInfo) or, when it named none, the back-off's has passed.
func (w *Worker) retryDelay(err error, failures int) (time.Duration, bool) {
	if !IsRetryable(err) && !isBusy(err) {
		return 0, false
	}
	if e, _ := AsError(err); e.RetryAfter > 0 {
		return e.RetryAfter, true
	}
	return w.opts.Backoff.Delay(failures), true
}

func (w *Worker) countLeaseLost(a *attempt) {
	if a.leaseCount.CompareAndSwap(false, true) {
		w.stats.leaseLost.Add(1)
	}
}

func (w *Worker) heartbeatInterval(a *attempt) time.Duration {
	if w.opts.HeartbeatInterval > 0 {
		return w.opts.HeartbeatInterval
	}
	lease := a.task.LeaseDuration
	if lease <= 0 {
		lease = DefaultLease
	}
	return max(lease/3, 50*time.Millisecond)
}

// firstHeartbeatDelay is how long after receipt (now) the first heartbeat
// goes out. A task polled with ConfirmReceipt is held only until its first,
// short LeaseExpireTime unless a heartbeat confirms it: so the first
// heartbeat comes a third of the way there, or after interval if that is
// sooner. An expiry already past by this clock (clocks apart) gets a short
// delay instead.
func firstHeartbeatDelay(raw *pb.Task, interval time.Duration, now time.Time) time.Duration {
	if raw.GetLeaseExpireTime() == nil {
		return interval
	}
	untilExpiry := raw.GetLeaseExpireTime().AsTime().Sub(now)
	if untilExpiry <= 0 {
		return min(skewedFirstHeartbeat, interval)
	}
	return min(untilExpiry/3, interval)
}

// heartbeatLoop extends the attempt's lease, at once and then every
// interval, until ctx ends; it cancels the handler when the run was
// cancelled or the lease lost.
func (w *Worker) heartbeatLoop(ctx context.Context, a *attempt) {
	interval := w.heartbeatInterval(a)
	req := &pb.HeartbeatRequest{TaskId: a.raw.GetTaskId(), Attempt: a.raw.GetAttempt(), LeaseToken: a.raw.GetLeaseToken()}
	failures := 0
	for first := true; ; first = false {
		if !first {
			delay := interval
			if failures > 0 {
				delay = min(w.opts.Backoff.Delay(failures), interval)
			}
			if !sleepCtx(ctx, delay) {
				return
			}
		}
		callCtx, cancel := context.WithTimeout(w.client.OutgoingContext(ctx), max(interval, time.Second))
		resp, err := w.client.workers.Heartbeat(callCtx, req)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			err = convertError(err)
			if IsLeaseLost(err) {
				if a.handlerDone.Load() {
					return
				}
				w.countLeaseLost(a)
				a.task.Logger.Warn("composer lease lost; cancelling the handler, the attempt will not be reported")
				a.cancel(ErrLeaseLost)
				return
			}
			failures++
			a.task.Logger.Debug("composer heartbeat failed; retrying", "error", err)
			continue
		}
		failures = 0
		if resp.GetCancelRequested() && !a.handlerDone.Load() {
			a.task.Logger.Info("composer run cancelled; cancelling the handler", "reason", resp.GetCancelReason())
			a.cancel(&RunCancelledError{Reason: resp.GetCancelReason()})
			return
		}
	}
}

// drain waits for the attempts in flight until deadline, then fails those
// still running with WORKER_SHUTDOWN (retryable) and stops their heartbeats.
func (w *Worker) drain(deadline time.Time) {
	done := make(chan struct{})
	go func() {
		w.running.Wait()
		close(done)
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-done:
		return
	case <-timer.C:
	}
	w.mu.Lock()
	var late []*attempt
	for a := range w.inFlight {
		late = append(late, a)
	}
	w.mu.Unlock()
	var wg sync.WaitGroup
	for _, a := range late {
		if !a.claimed.CompareAndSwap(false, true) {
			continue // reporting already
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.cancel(ErrWorkerShutdown)
			endHandlerSpan(a.span, ErrWorkerShutdown.Error(), nil)
			req := w.failRequest(a, &TaskError{Code: "WORKER_SHUTDOWN", Message: "the worker stopped before the task finished", Retryable: true})
			ctx, cancel := context.WithTimeout(withTraceMetadata(w.client.OutgoingContext(context.Background()), a.traceMD), 5*time.Second)
			_, err := w.client.workers.FailTask(ctx, req)
			cancel()
			if err != nil {
				a.task.Logger.Warn("composer could not fail the unfinished attempt", "error", convertError(err))
			} else {
				w.stats.failed.Add(1)
			}
			a.stopBeats()
		}()
	}
	if len(late) > 0 {
		w.log.Warn("composer attempts did not finish within the drain; failed them as WORKER_SHUTDOWN", "count", len(late))
	}
	wg.Wait()
	// Give the cancelled handlers a moment to return.
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
}
