package composer

import (
	"context"
	"fmt"
	"sync"
)

// slots counts the attempts a worker runs against its concurrency limit.
// Only the poll loop takes slots (never more than free, which is what it
// asks the server for); each attempt gives its slot back when done.
type slots struct {
	mu       sync.Mutex
	capacity int
	used     int
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
	return s.capacity - s.used
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
	if n > s.capacity-s.used {
		return fmt.Errorf("composer: asked for %d slots with %d free", n, s.capacity-s.used)
	}
	s.used += n
	s.high = max(s.high, s.used)
	s.notifyLocked()
	return nil
}

// force takes one slot even if none is free (a server that leased more
// tasks than asked for: the leases are ours, so the tasks run).
func (s *slots) force() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used++
	s.high = max(s.high, s.used)
	s.notifyLocked()
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
	for {
		s.mu.Lock()
		free, changed := s.capacity-s.used, s.changed
		if free > 0 {
			s.mu.Unlock()
			return free, true
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
