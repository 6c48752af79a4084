// Command run-order is the order example in one command: it starts the
// order worker in-process, registers order.yaml, runs one order, approves
// it and prints the output.
//
//	make dev                                  # in another terminal
//	COMPOSER_TOKEN=<admin token> go run ./cmd/run-order
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/composer-dev/composer/examples/go/order"
	composer "github.com/composer-dev/composer/sdks/go"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, err := composer.Dial(ctx, "")
	if err != nil {
		return err
	}
	defer client.Close()

	w := composer.NewWorker(client, composer.WorkerOptions{Slots: 8, PollWait: 2 * time.Second})
	order.Register(w)
	workerCtx, stopWorker := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- w.Run(workerCtx) }()
	defer func() {
		stopWorker()
		<-served
	}()

	workflow, err := client.RegisterWorkflow(ctx, composer.YAML(order.Workflow))
	if err != nil {
		return err
	}
	fmt.Printf("registered %s v%d\n", workflow.Name, workflow.Version)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	orderID := "A-" + hex.EncodeToString(b)
	started, err := client.StartRun(ctx, workflow.Name,
		map[string]any{"order_id": orderID, "amount": 12.5, "sku": "BOOK-1"}, composer.WithIdempotencyKey(orderID))
	if err != nil {
		return err
	}
	fmt.Printf("started run %s for order %s\n", started.ID, orderID)
	// An event sent before the run reaches its WAIT_FOR_EVENT is kept until it does.
	if _, err := client.SendEvent(ctx, composer.Event{Name: "approval", Payload: map[string]bool{"ok": true}, RunID: started.ID}); err != nil {
		return err
	}
	fmt.Println("sent approval")
	var output map[string]any
	if err := client.WaitForResult(ctx, started.ID, &output); err != nil {
		return err
	}
	text, _ := json.MarshalIndent(output, "", "  ")
	fmt.Println(string(text))
	return nil
}
