package pipeline

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The queue hands messages over in order across its growth and wraparound, reports
// its end only once it is empty, and a pop on a stopped loader takes nothing.
func TestSlotQueueOrder(t *testing.T) {
	var q slotQueue
	q.init(nil)
	ctx := context.Background()
	next, want := 0, 0
	// Interleave pushes and pops so that the head wraps while the ring grows.
	for round := range 12 {
		for range 3 * (round + 1) {
			q.push(slotMsg{skipped: next})
			next++
		}
		for range 2 * (round + 1) {
			m, ok, err := q.pop(ctx)
			if !ok || err != nil || m.skipped != want {
				t.Fatalf("pop: message %d, %v, %v; want message %d", m.skipped, ok, err, want)
			}
			want++
		}
	}
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	if _, ok, err := q.pop(stopped); ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("pop on a stopped loader: %v, %v", ok, err)
	}
	q.close()
	for ; want < next; want++ {
		m, ok, err := q.pop(ctx)
		if !ok || err != nil || m.skipped != want {
			t.Fatalf("pop after close: message %d, %v, %v; want message %d", m.skipped, ok, err, want)
		}
	}
	if _, ok, err := q.pop(ctx); ok || err != nil {
		t.Fatalf("pop of a closed, empty queue: %v, %v", ok, err)
	}
	for i, m := range q.ring {
		if m != (slotMsg{}) {
			t.Fatalf("ring entry %d still holds a message taken: %+v", i, m)
		}
	}
}

// A mixer that waits on an empty queue wakes for each push and for the close, with
// a producer on another goroutine (run with -race).
func TestSlotQueueWakes(t *testing.T) {
	var q slotQueue
	q.init(nil)
	const n = 20000
	go func() {
		for i := range n {
			q.push(slotMsg{skipped: i})
			if i%1000 == 0 {
				time.Sleep(time.Millisecond) // let the mixer find the queue empty
			}
		}
		q.close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 0; ; i++ {
		m, ok, err := q.pop(ctx)
		if err != nil {
			t.Fatalf("after %d messages: %v", i, err)
		}
		if !ok {
			if i != n {
				t.Fatalf("closed after %d messages, want %d", i, n)
			}
			return
		}
		if m.skipped != i {
			t.Fatalf("message %d, want %d", m.skipped, i)
		}
	}
}
