// Package order is the order example's workers in Go: the payments,
// inventory and shipping tasks of order.yaml (the same workflow as
// examples/python/order.yaml, name order_example).
package order

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"time"

	composer "github.com/composer-dev/composer/sdks/go"
)

// Workflow is the order workflow's definition (order.yaml).
//
//go:embed order.yaml
var Workflow []byte

// ChargeInput is the input of the charge task.
type ChargeInput struct {
	Order  string  `json:"order"`
	Amount float64 `json:"amount"`
}

// Charge is the output of the charge task.
type Charge struct {
	ID     string  `json:"id"`
	Amount float64 `json:"amount"`
}

// Register adds the order example's handlers to w.
func Register(w *composer.Worker) {
	w.Handle("payments", "charge", composer.Typed(charge))
	w.Handle("inventory", "reserve_stock", reserveStock)
	w.Handle("shipping", "ship", ship)
	w.Handle("payments", "refund", func(ctx context.Context, t *composer.Task) (any, error) {
		var in struct{ Charge string }
		if err := t.Decode(&in); err != nil {
			return nil, composer.NonRetryable(err)
		}
		return map[string]string{"refunded": in.Charge}, nil
	})
	w.Handle("payments", "void", func(ctx context.Context, t *composer.Task) (any, error) {
		var in struct{ Charge string }
		if err := t.Decode(&in); err != nil {
			return nil, composer.NonRetryable(err)
		}
		return map[string]string{"voided": in.Charge}, nil
	})
}

func charge(ctx context.Context, in ChargeInput) (Charge, error) {
	if in.Amount <= 0 {
		return Charge{}, composer.NonRetryable(&composer.TaskError{Code: "BAD_AMOUNT", Message: "amount must be positive"})
	}
	// The task id is the same for every attempt: the payment provider's idempotency key.
	t := composer.TaskFromContext(ctx)
	sum := sha256.Sum256([]byte(t.ID))
	t.Logger.Info("charged", "amount", in.Amount, "order", in.Order)
	return Charge{ID: "ch_" + hex.EncodeToString(sum[:])[:12], Amount: in.Amount}, nil
}

func reserveStock(ctx context.Context, t *composer.Task) (any, error) {
	var in struct {
		SKU      string `json:"sku"`
		ChargeID string `json:"charge_id"`
	}
	if err := t.Decode(&in); err != nil {
		return nil, composer.NonRetryable(err)
	}
	return map[string]any{"sku": in.SKU, "reserved": true, "charge": in.ChargeID}, nil
}

func ship(ctx context.Context, t *composer.Task) (any, error) {
	var in struct{ Order, SKU string }
	if err := t.Decode(&in); err != nil {
		return nil, composer.NonRetryable(err)
	}
	select {
	case <-time.After(200 * time.Millisecond):
	case <-ctx.Done(): // run cancelled, lease lost, or the worker stopping
		return nil, context.Cause(ctx)
	}
	return map[string]string{"tracking": "TRK-" + in.Order, "sku": in.SKU}, nil
}
