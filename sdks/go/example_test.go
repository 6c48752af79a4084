package composer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	composer "github.com/composer-dev/composer/sdks/go"
)

// A worker for the order example: register handlers, then Run until SIGTERM.
func ExampleNewWorker() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	client, err := composer.Dial(ctx, "") // COMPOSER_ADDRESS / COMPOSER_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	w := composer.NewWorker(client, composer.WorkerOptions{Slots: 8})
	w.Handle("shipping", "ship", func(ctx context.Context, t *composer.Task) (any, error) {
		var in struct{ Order, SKU string }
		if err := t.Decode(&in); err != nil {
			return nil, composer.NonRetryable(err)
		}
		return map[string]string{"tracking": "TRK-" + in.Order}, nil
	})
	// In a main: if err := w.Run(ctx); err != nil { log.Fatal(err) }
	fmt.Println(w.Queues())

	// Output: [shipping]
}

// The overview: a worker serves typed handlers; a client starts runs and
// waits for their results (see ExampleClient_WaitForResult). Here the
// handler is called directly, as a unit test of a handler would.
func Example() {
	type greeting struct{ Name string }
	type reply struct{ Text string }
	hello := composer.Typed(func(ctx context.Context, in greeting) (reply, error) {
		return reply{Text: "hello " + in.Name}, nil
	})
	client, err := composer.Dial(context.Background(), "127.0.0.1:7070")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	w := composer.NewWorker(client, composer.WorkerOptions{Slots: 8})
	w.Handle("greetings", "hello", hello)
	// go w.Run(ctx) serves until ctx ends.

	out, err := hello(context.Background(), &composer.Task{Input: []byte(`{"Name": "ada"}`)})
	fmt.Println(out, err)
	// Output: {hello ada} <nil>
}

type chargeInput struct {
	Order  string  `json:"order"`
	Amount float64 `json:"amount"`
}

type chargeOutput struct {
	ID     string  `json:"id"`
	Amount float64 `json:"amount"`
}

// Typed decodes the task's input into a Go value and encodes the result.
func ExampleTyped() {
	charge := composer.Typed(func(ctx context.Context, in chargeInput) (chargeOutput, error) {
		if in.Amount <= 0 {
			return chargeOutput{}, composer.NonRetryable(&composer.TaskError{Code: "BAD_AMOUNT", Message: "amount must be positive"})
		}
		return chargeOutput{ID: "ch_" + in.Order, Amount: in.Amount}, nil
	})
	out, err := charge(context.Background(), &composer.Task{Input: []byte(`{"order": "A-17", "amount": 12.5}`)})
	fmt.Println(out, err)
	_, err = charge(context.Background(), &composer.Task{Input: []byte(`{"order": "A-18", "amount": 0}`)})
	var te *composer.TaskError
	fmt.Println(errors.As(err, &te), te.Code, te.Retryable)
	// Output:
	// {ch_A-17 12.5} <nil>
	// true BAD_AMOUNT false
}

// A handler's context says why it must stop.
func ExampleHandler_cancellation() {
	handler := composer.Handler(func(ctx context.Context, t *composer.Task) (any, error) {
		select {
		case <-time.After(time.Hour):
			return "done", nil
		case <-ctx.Done():
			// ErrRunCancelled (with CancelReason(ctx)), ErrLeaseLost,
			// ErrAttemptTimeout or ErrWorkerShutdown.
			if errors.Is(context.Cause(ctx), composer.ErrRunCancelled) {
				fmt.Println("cancelled because:", composer.CancelReason(ctx))
			}
			return nil, context.Cause(ctx)
		}
	})
	ctx, cancel := context.WithCancelCause(context.Background())
	// What the worker does when a heartbeat says the run was cancelled.
	cancel(&composer.RunCancelledError{Reason: "customer asked"})
	_, err := handler(ctx, &composer.Task{})
	fmt.Println(err, errors.Is(err, composer.ErrRunCancelled))
	// Output:
	// cancelled because: customer asked
	// run cancelled: customer asked true
}

// NonRetryable makes any error final; a TaskError chooses its code.
func ExampleNonRetryable() {
	err := composer.NonRetryable(&composer.TaskError{Code: "DECLINED", Message: "card declined"})
	var te *composer.TaskError
	errors.As(err, &te)
	fmt.Println(te.Code, te.Retryable, err)
	// Output: DECLINED false DECLINED: card declined
}

// Dial, register a workflow, start a run and wait for its result.
func ExampleDial() {
	ctx := context.Background()
	client, err := composer.Dial(ctx, "127.0.0.1:7070", composer.WithToken(os.Getenv("COMPOSER_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	fmt.Println(client.Address())
	// Output: 127.0.0.1:7070
}

func ExampleClient_WaitForResult() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := composer.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := client.RegisterWorkflow(ctx, composer.File("order.yaml")); err != nil {
		log.Fatal(err)
	}
	run, err := client.StartRun(ctx, "order_example", map[string]any{"order_id": "A-17", "amount": 12.5, "sku": "BOOK-1"},
		composer.WithIdempotencyKey("A-17"), composer.WithLabels(map[string]string{"shop": "eu"}))
	if err != nil {
		log.Fatal(err)
	}
	var out struct {
		Shipment struct{ Tracking string }
	}
	err = client.WaitForResult(ctx, run.ID, &out)
	var failed *composer.RunFailedError
	switch {
	case errors.As(err, &failed):
		log.Printf("run %s ended %s: %s", run.ID, failed.Run.Status, failed.Run.Error.Code)
	case errors.Is(err, context.DeadlineExceeded):
		log.Printf("still running")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println(out.Shipment.Tracking)
	}
}

func ExampleClient_ListRuns() {
	ctx := context.Background()
	client, err := composer.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	filter := composer.RunFilter{Workflow: "order_example", Statuses: []composer.RunStatus{composer.RunFailed}, PageSize: 100}
	for run, err := range client.ListRuns(ctx, filter) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(run.ID, run.Status, run.Error.Code)
	}
}

// After an outage, retry every run of a workflow that failed in it, with
// one call, and wait for the operation to end.
func ExampleClient_BulkRetryRuns() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	client, err := composer.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	filter := composer.RunFilter{
		Workflow: "order_example", Statuses: []composer.RunStatus{composer.RunFailed},
		CreatedAfter: time.Date(2026, 4, 12, 9, 0, 0, 0, time.UTC), CreatedBefore: time.Date(2026, 4, 12, 11, 0, 0, 0, time.UTC),
	}
	op, err := client.BulkRetryRuns(ctx, filter, composer.WithRequestID("outage-2026-04-12"))
	if err != nil {
		log.Fatal(err)
	}
	op, err = client.WaitBulkOperation(ctx, op.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(op.Status, op.Succeeded, "retried,", op.Skipped, "skipped,", op.Failed, "failed")
	for _, f := range op.Failures {
		fmt.Println(f.RunID, f.Message)
	}
}

func ExampleClient_SendEvent() {
	ctx := context.Background()
	client, err := composer.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	delivery, err := client.SendEvent(ctx, composer.Event{Name: "approval", Payload: map[string]bool{"ok": true}, CorrelationKey: "order-A-17"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(delivery.DeliveredRunIDs, delivery.Stored)
}

// Backoff spaces retries: the cap doubles up to Max; the delay is the cap
// less up to Jitter of it.
func ExampleBackoff() {
	b := composer.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: 0.5}
	for n := 1; n <= 5; n++ {
		fmt.Print(b.Cap(n), " ")
	}
	fmt.Println(b.DelayWith(3, 0.5))
	// Output: 100ms 200ms 400ms 800ms 1s 300ms
}

// Errors are one type, read with errors.As or the Is helpers.
func ExampleError() {
	ctx := context.Background()
	client, err := composer.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	_, err = client.RegisterWorkflow(ctx, composer.YAML([]byte("name: bad\nnodes: []\n")))
	var ce *composer.Error
	if errors.As(err, &ce) {
		fmt.Println(ce.Code, ce.Reason)
		for _, v := range ce.FieldViolations {
			fmt.Println(v.Field, v.Description)
		}
	}
	if composer.IsNotFound(err) || composer.IsUnauthenticated(err) {
		log.Print("check the name or the token")
	}
}
