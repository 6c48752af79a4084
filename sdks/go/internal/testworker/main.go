// Command testworker is a Composer worker run as its own process by the Go
// SDK's conformance tests (the SIGKILL and SIGTERM behaviours, C5 and C8).
//
//	testworker ADDRESS QUEUE SLOTS SECONDS [DRAIN_TIMEOUT]
//
// It serves task "slow" on QUEUE: prints {"event":"started",...} as a JSON
// line when an attempt starts, sleeps SECONDS on attempt 1 (returns at once
// on later attempts), prints "finished" and returns {"pid":..,"attempt":..}.
// It prints "heartbeat" after each heartbeat the server accepted (the first
// confirms the lease). SIGTERM or SIGINT stop it gracefully (Worker.Run); it
// then prints "exited" with its counters. The token comes from COMPOSER_TOKEN.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	composer "github.com/composer-dev/composer/sdks/go"
	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

var mu sync.Mutex

func emit(event string, fields map[string]any) {
	if fields == nil {
		fields = map[string]any{}
	}
	fields["event"] = event
	b, _ := json.Marshal(fields)
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(string(b))
}

// heartbeatEvents prints "heartbeat" once the server accepted a Heartbeat.
func heartbeatEvents(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if beat, ok := req.(*pb.HeartbeatRequest); ok && err == nil {
		emit("heartbeat", map[string]any{"task_id": beat.GetTaskId(), "attempt": beat.GetAttempt()})
	}
	return err
}

func main() {
	if len(os.Args) < 5 {
		fmt.Fprintln(os.Stderr, "usage: testworker ADDRESS QUEUE SLOTS SECONDS [DRAIN_TIMEOUT]")
		os.Exit(2)
	}
	address, queue := os.Args[1], os.Args[2]
	slots, _ := strconv.Atoi(os.Args[3])
	seconds, _ := strconv.ParseFloat(os.Args[4], 64)
	drain := 30.0
	if len(os.Args) > 5 {
		drain, _ = strconv.ParseFloat(os.Args[5], 64)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	client, err := composer.Dial(ctx, address, composer.WithLogger(logger), composer.WithUnaryInterceptor(heartbeatEvents))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer client.Close()
	w := composer.NewWorker(client, composer.WorkerOptions{
		Slots: slots, DrainTimeout: time.Duration(drain * float64(time.Second)), PollWait: 2 * time.Second,
	})
	w.Handle(queue, "slow", func(ctx context.Context, t *composer.Task) (any, error) {
		emit("started", map[string]any{"task_id": t.ID, "attempt": t.Attempt, "run_id": t.RunID})
		if t.Attempt == 1 {
			time.Sleep(time.Duration(seconds * float64(time.Second)))
		}
		emit("finished", map[string]any{"task_id": t.ID, "attempt": t.Attempt, "run_id": t.RunID})
		return map[string]any{"pid": os.Getpid(), "attempt": t.Attempt}, nil
	})
	emit("ready", map[string]any{"worker_id": w.ID()})
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s := w.Stats()
	emit("exited", map[string]any{"completed": s.Completed, "polled": s.Polled})
}
