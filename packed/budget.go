package packed

// The read budget: the bytes of the chunks read ahead and not yet released.

import (
	"context"
	"sync"
)

// budget bounds the bytes of the chunks read and not yet released.
type budget struct {
	mu     sync.Mutex
	cond   *sync.Cond
	used   int64
	max    int64
	jobs   int   // batches handed to the fillers and not yet filled
	peak   int64 // the most used
	over   int64 // the most taken past max (when no batch was in flight)
	closed bool
}

func newBudget(n int64) *budget {
	b := &budget{max: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// acquireAhead waits until want bytes fit (clamped to the budget) and takes them,
// where the first need of them are the documents' and the rest read ahead. It waits
// only while batches handed to the fillers may release some: with none, it takes
// them anyway (one batch's chunks over the budget at most), so that a batch whose
// documents take more than the budget still makes progress, but then need alone:
// nothing is read ahead past the budget. It returns the bytes taken, want or need.
func (b *budget) acquireAhead(need, want int64) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.used+min(want, b.max) > b.max && b.jobs > 0 && !b.closed {
		b.cond.Wait()
	}
	if b.closed {
		return 0, context.Canceled
	}
	n := want
	if b.used+min(want, b.max) > b.max {
		n = need
	}
	b.used += min(n, b.max)
	b.peak = max(b.peak, b.used)
	b.over = max(b.over, b.used-b.max)
	return n, nil
}

// release returns n bytes.
func (b *budget) release(n int64) {
	n = min(n, b.max)
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	b.cond.Broadcast()
}

// emitted counts batches handed to the fillers (d 1) and filled (d -1).
func (b *budget) emitted(d int) {
	b.mu.Lock()
	b.jobs += d
	b.mu.Unlock()
	if d < 0 {
		b.cond.Broadcast()
	}
}

// cancel wakes every waiter for good.
func (b *budget) cancel() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cond.Broadcast()
}
