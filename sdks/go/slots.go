package composer

import (
	"context"
	"fmt"
	"sync"
)

// slots counts the attempts a worker runs against its concurrency limit.
// Only the poll loops take slots: each sets aside (reserves) the free slots
// it asks the server for before its poll, so polls waiting at once never
// ask for more than the free slots together, and turns those the answer
// filled into used ones; each attempt gives its slot back when done.
type slots struct {
	mu       sync.Mutex
	capacity int
	used     int
	// reserved: set aside for polls in flight (neither used nor free).
	reserved int
	high     int
	// changed is closed (and replaced) at the next change after someone
	// took it to wait on (watched).
	changed chan struct{}
	watched bool
}

func newSlots(capacity int) *slots {
	return &slots{capacity: capacity, changed: make(chan struct{})}
}

func (s *slots) notifyLocked() {
	if !s.watched {
		return
	}
	close(s.changed)
	s.changed = make(chan struct{})
	s.watched = false
}

// free is the number of slots free now.
func (s *slots) free() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.capacity - s.used - s.reserved
}

// inUse is the number of slots taken now and the most ever taken at once.
func (s *slots) inUse() (used, high int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used, s.high
}

// acquire takes n slots; it fails when fewer are free.
func (s *slots) acquire(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if free := s.capacity - s.used - s.reserved; n > free {
		return fmt.Errorf("composer: asked for %d slots with %d free", n, free)
	}
	s.used += n
	s.high = max(s.high, s.used)
	s.notifyLocked()
	return nil
}

// release gives one slot back.
func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used <= 0 {
		panic("composer: slot released without acquire")
	}
	s.used--
	s.notifyLocked()
}

// waitFree waits until at least one slot is free and returns how many are;
// false when ctx ended first.
func (s *slots) waitFree(ctx context.Context) (int, bool) {
	return s.await(ctx, 1, func(free int) int { return free })
}

// reserve waits until at least least slots (at least one, at most all)
// are free, then sets aside up to most of the free ones for a poll and
// returns how many; false when ctx ended first. settle or unreserve gives
// them back.
func (s *slots) reserve(ctx context.Context, least, most int) (int, bool) {
	least = min(max(least, 1), s.capacity)
	return s.await(ctx, least, func(free int) int {
		n := min(free, max(most, least))
		s.reserved += n
		return n
	})
}

// await waits until at least least slots are free, then returns what take
// (called under the lock) makes of the free count; false when ctx ended
// first.
func (s *slots) await(ctx context.Context, least int, take func(free int) int) (int, bool) {
	for {
		s.mu.Lock()
		free, changed := s.capacity-s.used-s.reserved, s.changed
		if free >= least {
			n := take(free)
			s.mu.Unlock()
			return n, true
		}
		s.watched = true
		s.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, false
		}
	}
}

// unreserve gives back n reserved slots (a poll that failed).
func (s *slots) unreserve(n int) {
	s.settle(n, 0)
}

// settle ends a reservation of n slots whose poll returned got tasks: got
// of them become used (more than n when the server leased more than asked:
// the leases are ours, so the tasks run), the rest are free again.
func (s *slots) settle(n, got int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > s.reserved {
		panic("composer: slots settled without a reservation")
	}
	s.reserved -= n
	s.used += got
	s.high = max(s.high, s.used)
	s.notifyLocked()
}
