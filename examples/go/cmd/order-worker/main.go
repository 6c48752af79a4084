// Command order-worker serves the order example's tasks until Ctrl-C or
// SIGTERM (then it stops polling, drains and exits).
//
//	COMPOSER_TOKEN=... go run ./cmd/order-worker
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/composer-dev/composer/examples/go/order"
	composer "github.com/composer-dev/composer/sdks/go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	client, err := composer.Dial(ctx, "") // COMPOSER_ADDRESS (default 127.0.0.1:7070), COMPOSER_TOKEN
	if err != nil {
		slog.Error("dial", "error", err)
		os.Exit(1)
	}
	defer client.Close()
	w := composer.NewWorker(client, composer.WorkerOptions{Slots: 8})
	order.Register(w)
	if err := w.Run(ctx); err != nil {
		slog.Error("worker", "error", err)
		os.Exit(1)
	}
}
