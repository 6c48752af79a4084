// Command go_worker is the Go SDK's Worker with no-op handlers, for B1
// (bench/loadgen), the Go twin of bench/python_worker.py.
//
//	go_worker HOST:PORT QUEUE SLOTS
//
// It serves the tasks step1, step2 and step3 on QUEUE, each returning {},
// and prints the number of tasks it completed (applied by the server,
// cumulative, one integer per line) every 50 ms on standard output, for
// the load generator's closed loop. SIGTERM (or SIGINT) drains and stops.
// The server is expected to run --insecure; COMPOSER_TOKEN is sent if set.
// Logs (warnings and errors only) go to standard error.
//
// With COMPOSER_GO_WORKER_CPUPROFILE=PATH set it writes a CPU profile
// (pprof) of the whole run to PATH when it stops; with
// COMPOSER_GO_WORKER_STATS set it prints the worker's Stats to standard
// error when it stops.
//
// Build: cd bench/go_worker && go build -o go_worker .
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"

	composer "github.com/composer-dev/composer/sdks/go"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: go_worker HOST:PORT QUEUE SLOTS")
		os.Exit(2)
	}
	address, queue := os.Args[1], os.Args[2]
	slots, err := strconv.Atoi(os.Args[3])
	if err != nil || slots < 1 {
		fmt.Fprintln(os.Stderr, "SLOTS must be a positive integer")
		os.Exit(2)
	}
	if path := os.Getenv("COMPOSER_GO_WORKER_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	client, err := composer.Dial(ctx, address, composer.WithLogger(logger))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer client.Close()
	w := composer.NewWorker(client, composer.WorkerOptions{Slots: slots, PollWait: time.Second, DrainTimeout: 5 * time.Second})
	noop := func(context.Context, *composer.Task) (any, error) { return map[string]any{}, nil }
	for _, name := range []string{"step1", "step2", "step3"} {
		w.Handle(queue, name, noop)
	}

	done, printed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(printed)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			fmt.Println(w.Stats().Completed)
			select {
			case <-tick.C:
			case <-done:
				return
			}
		}
	}()
	err = w.Run(ctx)
	close(done)
	<-printed
	fmt.Println(w.Stats().Completed)
	if os.Getenv("COMPOSER_GO_WORKER_STATS") != "" {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		s := w.Stats()
		fmt.Fprintf(os.Stderr, "go_worker stats: %+v; CPU %s, %.1f µs per completed task\n", s, cpu, float64(cpu.Microseconds())/float64(max(s.Completed, 1)))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
