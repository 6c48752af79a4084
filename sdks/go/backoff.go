package composer

import (
	"math/rand/v2"
	"time"
)

// Backoff computes the delays between retries of a failed call: before retry
// n (n >= 1) the cap is min(Initial * Multiplier^(n-1), Max), and the delay
// is the cap less a random part of up to Jitter of it. With Jitter 0.5 the
// delay lies in [cap/2, cap]: many workers coming back after an outage spread
// out, and the delay still grows.
//
// The zero value is not usable; DefaultBackoff is what the Worker uses.
type Backoff struct {
	// Initial is the cap of the first delay.
	Initial time.Duration
	// Max is the largest cap.
	Max time.Duration
	// Multiplier is how much the cap grows per failure (at least 1).
	Multiplier float64
	// Jitter is the random fraction of the cap, within [0, 1].
	Jitter float64
}

// DefaultBackoff is the Worker's back-off: 200 ms doubling to 5 s, jitter 0.5.
var DefaultBackoff = Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.5}

func (b Backoff) normalized() Backoff {
	if b.Initial <= 0 {
		b.Initial = DefaultBackoff.Initial
	}
	if b.Max < b.Initial {
		b.Max = max(DefaultBackoff.Max, b.Initial)
	}
	if b.Multiplier < 1 {
		b.Multiplier = DefaultBackoff.Multiplier
	}
	if b.Jitter < 0 || b.Jitter > 1 {
		b.Jitter = DefaultBackoff.Jitter
	}
	return b
}

// Cap is the largest delay after failures consecutive failures (from 1).
func (b Backoff) Cap(failures int) time.Duration {
	b = b.normalized()
	capacity := float64(b.Initial)
	for i := 1; i < failures && i < 256; i++ {
		capacity *= b.Multiplier
		if capacity >= float64(b.Max) {
			return b.Max
		}
	}
	return min(time.Duration(capacity), b.Max)
}

// Delay is the delay before the next try after failures consecutive
// failures, using math/rand/v2.
func (b Backoff) Delay(failures int) time.Duration {
	return b.DelayWith(failures, rand.Float64())
}

// DelayWith is Delay with the random number r in [0, 1) given (for tests).
func (b Backoff) DelayWith(failures int, r float64) time.Duration {
	b = b.normalized()
	c := b.Cap(failures)
	return time.Duration(float64(c) * (1 - b.Jitter*r))
}
