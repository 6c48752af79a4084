package composer

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// Task is one leased attempt of a node, as a handler sees it. The lease
// itself stays with the Worker: it heartbeats and reports for the handler.
type Task struct {
	// ID is the same for every attempt: use it as the idempotency key of
	// the step's own side effects.
	ID string
	// Attempt counts from 1.
	Attempt int
	// RunID is the run the task belongs to.
	RunID string
	// NodeID is the node (or "<map id>[<index>]") the task executes.
	NodeID          string
	WorkflowName    string
	WorkflowVersion int
	Namespace       string
	Queue           string
	// Name is the task name (the node's task) the handler was chosen by.
	Name string
	// Input is the node's rendered input, as JSON ("null" when it has
	// none), every blob reference in it replaced by the value it names.
	Input json.RawMessage
	// Deadline is when the attempt must finish (the node's timeout), zero
	// if none; the handler's context carries it too.
	Deadline time.Time
	// LeaseDuration is how long each heartbeat extends the lease.
	LeaseDuration time.Duration
	// Logger is the worker's logger with the task's ids as attributes.
	Logger *slog.Logger
}

// Decode decodes the task's input into v (as json.Unmarshal does).
func (t *Task) Decode(v any) error {
	if err := json.Unmarshal(t.Input, v); err != nil {
		return fmt.Errorf("composer: decode the input of task %s: %w", t.Name, err)
	}
	return nil
}

func taskFrom(p *pb.Task, logger *slog.Logger) *Task {
	input := rawJSON(p.GetInput())
	if len(input) == 0 {
		input = json.RawMessage("null")
	}
	t := &Task{
		ID: p.GetTaskId(), Attempt: int(p.GetAttempt()), RunID: p.GetRunId(), NodeID: p.GetNodeId(),
		WorkflowName: p.GetWorkflowName(), WorkflowVersion: int(p.GetWorkflowVersion()),
		Namespace: p.GetNamespace(), Queue: p.GetQueue(), Name: p.GetTaskName(), Input: input,
	}
	if p.GetAttemptDeadline() != nil {
		t.Deadline = p.GetAttemptDeadline().AsTime()
	}
	if p.GetLeaseDuration() != nil {
		t.LeaseDuration = p.GetLeaseDuration().AsDuration()
	}
	t.Logger = taskLogger(logger, slog.String("task_id", t.ID), slog.Int("attempt", t.Attempt),
		slog.String("run_id", t.RunID), slog.String("node_id", t.NodeID), slog.String("task", t.Name))
	return t
}

// Handler runs one task attempt. Its ctx is done when the run was cancelled
// (context.Cause is a *RunCancelledError, errors.Is ErrRunCancelled, with
// the reason: CancelReason(ctx)), the lease lost (ErrLeaseLost), the
// attempt's deadline passed (ErrAttemptTimeout) or the worker stopped past
// its drain (ErrWorkerShutdown). It returns the node's output (any
// JSON-encodable value; a json.RawMessage is taken as it is; one larger
// than the server's offload threshold is uploaded and reported as its
// blob reference) or an error:
// a *TaskError chooses the code and retryability, NonRetryable(err) makes
// any error final, and any other error is a retryable failure.
type Handler func(ctx context.Context, t *Task) (any, error)

// Typed adapts a function of typed input and output to a Handler: the
// task's input is decoded into In with encoding/json (a failure fails the
// attempt non-retryably with code INVALID_INPUT) and Out is the output.
func Typed[In, Out any](fn func(ctx context.Context, in In) (Out, error)) Handler {
	return func(ctx context.Context, t *Task) (any, error) {
		var in In
		if err := json.Unmarshal(t.Input, &in); err != nil {
			return nil, &TaskError{Code: "INVALID_INPUT", Message: fmt.Sprintf("cannot decode the input into %T: %v", in, err), Err: err}
		}
		out, err := fn(ctx, in)
		if err != nil {
			return nil, err
		}
		return out, nil
	}
}

type taskKey struct{}

// TaskFromContext returns the Task a handler's context belongs to (nil
// outside a handler): a Typed handler reads the task's ids from it.
func TaskFromContext(ctx context.Context) *Task {
	t, _ := ctx.Value(taskKey{}).(*Task)
	return t
}
