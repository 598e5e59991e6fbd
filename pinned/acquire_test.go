//go:build linux

package pinned

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitWaiting spins (yielding, not sleeping) until n Acquire calls are blocked in r.
func waitWaiting(t *testing.T, r *Ring, n int32) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d Acquire calls waiting", n), func() bool { return r.waiting.Load() == n })
}

// receive returns the next result; the timeout only stops a broken test from hanging.
func receive(t *testing.T, results <-chan acquired) acquired {
	t.Helper()
	select {
	case res := <-results:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return")
		return acquired{}
	}
}

// waitFor spins, yielding, until cond holds; the deadline only stops a broken test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		runtime.Gosched()
	}
}

type acquired struct {
	s   *Slab
	err error
}

func TestBackPressure(t *testing.T) {
	for _, waiters := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d waiting", waiters), func(t *testing.T) {
			const n = 3
			r := newTestRing(t, small(n, 1))
			ctx := context.Background()
			var held []*Slab
			for i := range n {
				s, err := r.Acquire(ctx)
				if err != nil {
					t.Fatalf("Acquire %d: %v", i, err)
				}
				held = append(held, s)
			}
			if s, ok := r.TryAcquire(); ok || s != nil {
				t.Fatalf("TryAcquire on a full ring = %v, %v", s, ok)
			}
			if got := r.InUse(); got != n {
				t.Fatalf("InUse() = %d, want %d", got, n)
			}
			results := make(chan acquired, waiters)
			for range waiters {
				acquireAsync(r, ctx, results)
			}
			waitWaiting(t, r, int32(waiters))
			select {
			case res := <-results:
				t.Fatalf("a waiter got %v, %v before any Release", res.s, res.err)
			default:
			}
			// Each Release lets exactly one waiter through, with the slab released;
			// the others stay blocked.
			for i := range waiters {
				if err := r.Release(held[i]); err != nil {
					t.Fatalf("Release slab %d: %v", held[i].Index(), err)
				}
				res := receive(t, results)
				if res.err != nil || res.s != held[i] {
					t.Fatalf("after releasing slab %d a waiter got %v, %v", held[i].Index(), res.s, res.err)
				}
				select {
				case res := <-results:
					t.Fatalf("second waiter got %v, %v from one Release", res.s, res.err)
				default:
				}
				if got, want := r.waiting.Load(), int32(waiters-i-1); got != want {
					t.Fatalf("%d waiting after %d releases, want %d", got, i+1, want)
				}
				if got := r.InUse(); got != n {
					t.Fatalf("InUse() = %d, want %d", got, n)
				}
			}
			if s, ok := r.TryAcquire(); ok {
				t.Fatalf("TryAcquire got slab %d, but every slab is held", s.Index())
			}
		})
	}
}

func TestAcquireContext(t *testing.T) {
	tests := []struct {
		name    string
		full    bool // acquire every slab first
		ctx     func() (context.Context, context.CancelFunc)
		blocked bool // cancel only once Acquire waits
		want    error
	}{
		{"canceled while waiting", true, func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.Background())
		}, true, context.Canceled},
		{"canceled before, ring full", true, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, false, context.Canceled},
		{"deadline passed, slab free", false, func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Unix(1, 0))
		}, false, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const n = 2
			r := newTestRing(t, small(n, 1))
			var held []*Slab
			if tt.full {
				for range n {
					s, ok := r.TryAcquire()
					if !ok {
						t.Fatal("TryAcquire on a ring with free slabs failed")
					}
					held = append(held, s)
				}
			}
			ctx, cancel := tt.ctx()
			defer cancel()
			results := make(chan acquired, 1)
			acquireAsync(r, ctx, results)
			if tt.blocked {
				waitWaiting(t, r, 1)
				cancel()
			}
			res := receive(t, results)
			if res.s != nil || !errors.Is(res.err, tt.want) {
				t.Fatalf("Acquire = %v, %v; want %v", res.s, res.err, tt.want)
			}
			if got := r.InUse(); got != len(held) {
				t.Errorf("InUse() = %d after failed Acquire, want %d", got, len(held))
			}
			// The failed Acquire took nothing: every slab can still be had.
			for _, s := range held {
				if err := r.Release(s); err != nil {
					t.Fatal(err)
				}
			}
			for i := range n {
				if _, ok := r.TryAcquire(); !ok {
					t.Fatalf("slab %d of %d lost after a failed Acquire", i, n)
				}
			}
		})
	}
}

func TestClose(t *testing.T) {
	const n = 2
	before := fdCount(t)
	r, err := NewRing(small(n, 1))
	if err != nil {
		t.Fatal(err)
	}
	var held []*Slab
	for range n {
		s, err := r.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	results := make(chan acquired, 2)
	acquireAsync(r, context.Background(), results)
	acquireAsync(r, context.Background(), results)
	waitWaiting(t, r, 2)
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for range 2 {
		if res := receive(t, results); res.s != nil || !errors.Is(res.err, ErrClosed) {
			t.Errorf("blocked Acquire after Close = %v, %v; want ErrClosed", res.s, res.err)
		}
	}
	if got := fdCount(t); got != before {
		t.Errorf("%d fds open after Close, %d before NewRing", got, before)
	}
	if s, err := r.Acquire(context.Background()); s != nil || !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close = %v, %v; want ErrClosed", s, err)
	}
	if s, ok := r.TryAcquire(); ok || s != nil {
		t.Errorf("TryAcquire after Close = %v, %v", s, ok)
	}
	if err := r.Release(held[0]); !errors.Is(err, ErrClosed) {
		t.Errorf("Release after Close = %v, want ErrClosed", err)
	}
	if err := r.Release(held[0]); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("second Release after Close = %v, want ErrNotAcquired", err)
	}
	if got := r.InUse(); got != n-1 {
		t.Errorf("InUse() = %d, want %d", got, n-1)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if got := fdCount(t); got != before {
		t.Errorf("%d fds open after second Close, %d before NewRing", got, before)
	}
}

func TestReleaseNotAcquired(t *testing.T) {
	tests := []struct {
		name  string
		slab  func(t *testing.T, r, other *Ring) *Slab
		other bool // the slab is acquired from other and must stay so
	}{
		{"double release", func(t *testing.T, r, _ *Ring) *Slab {
			s, _ := r.TryAcquire()
			if err := r.Release(s); err != nil {
				t.Fatal(err)
			}
			return s
		}, false},
		{"never acquired", func(_ *testing.T, r, _ *Ring) *Slab { return r.Slabs()[2] }, false},
		{"other ring", func(t *testing.T, _, other *Ring) *Slab {
			s, ok := other.TryAcquire()
			if !ok {
				t.Fatal("TryAcquire on other ring failed")
			}
			return s
		}, true},
		{"nil", func(*testing.T, *Ring, *Ring) *Slab { return nil }, false},
		{"zero Slab", func(*testing.T, *Ring, *Ring) *Slab { return &Slab{} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTestRing(t, small(3, 1))
			other := newTestRing(t, small(3, 1))
			held, ok := r.TryAcquire() // one slab stays acquired throughout
			if !ok {
				t.Fatal("TryAcquire failed")
			}
			s := tt.slab(t, r, other)
			inUse, free := r.InUse(), len(r.free)
			otherInUse, otherFree := other.InUse(), len(other.free)
			if err := r.Release(s); !errors.Is(err, ErrNotAcquired) {
				t.Fatalf("Release = %v, want ErrNotAcquired", err)
			}
			if r.InUse() != inUse || len(r.free) != free {
				t.Errorf("ring changed: InUse %d -> %d, free %d -> %d", inUse, r.InUse(), free, len(r.free))
			}
			if other.InUse() != otherInUse || len(other.free) != otherFree {
				t.Errorf("other ring changed: InUse %d -> %d, free %d -> %d",
					otherInUse, other.InUse(), otherFree, len(other.free))
			}
			if tt.other {
				if err := other.Release(s); err != nil {
					t.Errorf("slab no longer acquired from its own ring: %v", err)
				}
			}
			if err := r.Release(held); err != nil {
				t.Errorf("releasing the held slab: %v", err)
			}
			for i := range 3 {
				if _, ok := r.TryAcquire(); !ok {
					t.Fatalf("only %d of 3 slabs acquirable after the bad Release", i)
				}
			}
		})
	}
}

// TestConcurrentUse has goroutines take and give back slabs as fast as they can and
// checks that no slab is ever held twice.
func TestConcurrentUse(t *testing.T) {
	const slabs, workers, rounds = 3, 8, 400
	r := newTestRing(t, small(slabs, 1))
	holders := make([]atomic.Int32, slabs)
	var taken atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			ctx := context.Background()
			for i := range rounds {
				s, ok := r.TryAcquire()
				if !ok {
					var err error
					if s, err = r.Acquire(ctx); err != nil {
						t.Errorf("worker %d: Acquire: %v", w, err)
						return
					}
				}
				taken.Add(1)
				if h := holders[s.Index()].Add(1); h != 1 {
					t.Errorf("worker %d: slab %d held by %d at once", w, s.Index(), h)
				}
				b := s.Bytes()
				mark := uint64(w)<<32 | uint64(i)
				binary.LittleEndian.PutUint64(b, mark)
				binary.LittleEndian.PutUint64(b[len(b)-8:], mark)
				runtime.Gosched()
				if a, z := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[len(b)-8:]); a != mark || z != mark {
					t.Errorf("worker %d: slab %d overwritten while held: %#x %#x, want %#x", w, s.Index(), a, z, mark)
				}
				holders[s.Index()].Add(-1)
				if err := r.Release(s); err != nil {
					t.Errorf("worker %d: Release: %v", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := taken.Load(); got != workers*rounds {
		t.Errorf("%d acquisitions, want %d", got, workers*rounds)
	}
	if got := r.InUse(); got != 0 {
		t.Errorf("InUse() = %d after every worker released", got)
	}
	if got := len(r.free); got != slabs {
		t.Errorf("%d slabs free at the end, want %d", got, slabs)
	}
}

// TestConcurrentClose closes the ring while goroutines use it: every call returns
// either a slab or ErrClosed, and every blocked Acquire returns.
func TestConcurrentClose(t *testing.T) {
	r, err := NewRing(small(2, 1))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range 6 {
		wg.Go(func() {
			<-start
			for {
				s, err := r.Acquire(context.Background())
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("worker %d: Acquire: %v", w, err)
					return
				}
				// Do not touch the memory: Close may have unmapped it.
				if err := r.Release(s); err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("worker %d: Release: %v", w, err)
					return
				}
			}
		})
	}
	close(start)
	waitFor(t, "a blocked Acquire", func() bool { return r.waiting.Load() > 0 })
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

func acquireAsync(r *Ring, ctx context.Context, results chan<- acquired) {
	go func() {
		s, err := r.Acquire(ctx)
		results <- acquired{s, err}
	}()
}

func BenchmarkAcquireRelease(b *testing.B) {
	r := newTestRing(b, small(4, 1))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s, err := r.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Release(s); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAcquireReleaseParallel(b *testing.B) {
	r := newTestRing(b, small(4, 1))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			s, err := r.Acquire(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if err := r.Release(s); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
