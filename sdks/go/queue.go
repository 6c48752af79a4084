package composer

import (
	"context"
	"iter"
	"time"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// QueueRateLimit limits how fast a queue's tasks are handed to workers, on
// every server at once (docs/rate-limits.md). A task held back stays
// dispatched and goes out as soon as the limit allows; no attempt is spent
// waiting.
type QueueRateLimit struct {
	// Queue is the queue limited.
	Queue string
	// PerSecond is tasks per second over the whole queue, fractions allowed
	// (0.5: one every two seconds), at most 100,000; 0: no queue-wide limit
	// (then PerKeyPerSecond must be set).
	PerSecond float64
	// Burst is the most tasks handed out in any one-second window, 1 to
	// 100,000 and at least PerSecond rounded up; 0 when setting: PerSecond
	// rounded up.
	Burst int
	// PerKeyPerSecond is tasks per second for each distinct rate-limit key
	// (a TASK node's rate_limit_key); 0: no per-key limit.
	PerKeyPerSecond float64
	// PerKeyBurst is the most tasks of one key in any one-second window; 0
	// when setting: PerKeyPerSecond rounded up.
	PerKeyBurst int
	// CreateTime is when the limit was first set, UpdateTime when it was last
	// changed; both are ignored by SetQueueRateLimit.
	CreateTime time.Time
	UpdateTime time.Time
}

func (l QueueRateLimit) proto() *pb.QueueRateLimit {
	return &pb.QueueRateLimit{
		Queue: l.Queue, PerSecond: l.PerSecond, Burst: int32(l.Burst),
		PerKeyPerSecond: l.PerKeyPerSecond, PerKeyBurst: int32(l.PerKeyBurst),
	}
}

func queueRateLimitFrom(l *pb.QueueRateLimit) *QueueRateLimit {
	if l == nil {
		return nil
	}
	return &QueueRateLimit{
		Queue: l.GetQueue(), PerSecond: l.GetPerSecond(), Burst: int(l.GetBurst()),
		PerKeyPerSecond: l.GetPerKeyPerSecond(), PerKeyBurst: int(l.GetPerKeyBurst()),
		CreateTime: toTime(l.GetCreateTime()), UpdateTime: toTime(l.GetUpdateTime()),
	}
}

// SetQueueRateLimit creates or replaces limit.Queue's rate limit and returns
// it as stored (defaults filled in); every server applies it within about a
// second. INVALID_ARGUMENT with a field violation naming the field
// (limit.queue, limit.per_second, limit.burst, ...) for a bad queue name, a
// rate that is not positive or over 100,000, a burst under the rate (rounded
// up) or over 100,000, a per-key burst without a per-key rate, or a limit
// with neither rate; RESOURCE_EXHAUSTED when the namespace already holds
// 1,000 limits and this queue has none.
func (c *Client) SetQueueRateLimit(ctx context.Context, limit QueueRateLimit) (*QueueRateLimit, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.queues.SetQueueRateLimit(ctx, &pb.SetQueueRateLimitRequest{Limit: limit.proto()}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return queueRateLimitFrom(r.GetLimit()), nil
}

// GetQueueRateLimit returns a queue's rate limit. NOT_FOUND when the queue
// has none in the caller's namespace.
func (c *Client) GetQueueRateLimit(ctx context.Context, queue string) (*QueueRateLimit, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.queues.GetQueueRateLimit(ctx, &pb.GetQueueRateLimitRequest{Queue: queue}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return queueRateLimitFrom(r.GetLimit()), nil
}

// ListQueueRateLimits iterates over the namespace's rate limits by queue
// name, fetching pageSize at a time (0: 100; at most 1,000). Iteration stops
// at the first error, which it yields.
func (c *Client) ListQueueRateLimits(ctx context.Context, pageSize int) iter.Seq2[*QueueRateLimit, error] {
	return paged(ctx, c, func(ctx context.Context, token string) ([]*QueueRateLimit, string, error) {
		r, err := c.queues.ListQueueRateLimits(ctx, &pb.ListQueueRateLimitsRequest{PageSize: int32(pageSize), PageToken: token}, waitForReady)
		return convertAll(r.GetLimits(), queueRateLimitFrom), r.GetNextPageToken(), err
	})
}

// DeleteQueueRateLimit removes a queue's rate limit: its tasks are handed out
// unlimited again within about a second. NOT_FOUND when it has none.
func (c *Client) DeleteQueueRateLimit(ctx context.Context, queue string) error {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	_, err := c.queues.DeleteQueueRateLimit(ctx, &pb.DeleteQueueRateLimitRequest{Queue: queue}, waitForReady)
	return convertError(err)
}
