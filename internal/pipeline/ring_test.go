package pipeline

import (
	"context"
	"errors"
	"testing"

	"github.com/shardload/shardload/pinned"
)

// clearIdleRing closes the ring a pipeline left, so that a test starts without one.
func clearIdleRing() {
	idleRing.Lock()
	r := idleRing.ring
	idleRing.ring = nil
	idleRing.Unlock()
	if r != nil {
		r.Close()
	}
}

// A ring is left for the next pipeline made alike, and closed where it must not be
// handed on: a slab grew, its options bind the slabs (a function cannot be compared),
// or another ring is left after it.
func TestLeaveRing(t *testing.T) {
	clearIdleRing()
	defer clearIdleRing()
	opts := pinned.Options{Slabs: 2, SlabBytes: 64 << 10, NoLock: true, NoHugePages: true}
	closed := func(r *pinned.Ring) bool {
		s, err := r.Acquire(context.Background())
		if err == nil {
			r.Release(s)
		}
		return errors.Is(err, pinned.ErrClosed)
	}

	r, err := takeRing(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := leaveRing(r, opts); err != nil || closed(r) {
		t.Fatalf("a ring left: %v, closed %v", err, closed(r))
	}
	if again, _ := takeRing(opts); again != r {
		t.Fatal("the ring left was not taken")
	}

	s, _ := r.Acquire(context.Background())
	if err := r.Grow(s, 256<<10, nil); err != nil {
		t.Fatal(err)
	}
	r.Release(s)
	leaveRing(r, opts)
	if !closed(r) {
		t.Fatal("a ring with a grown slab was left")
	}

	bound := opts
	bound.Bind = func([]byte) error { return nil }
	b, err := takeRing(bound)
	if err != nil {
		t.Fatal(err)
	}
	leaveRing(b, bound)
	if !closed(b) {
		t.Fatal("a ring bound by a function was left")
	}

	first, _ := takeRing(opts)
	second, _ := takeRing(opts)
	leaveRing(first, opts)
	leaveRing(second, opts)
	if !closed(first) || closed(second) {
		t.Fatalf("two rings left: the first closed %v, the second %v", closed(first), closed(second))
	}
}
