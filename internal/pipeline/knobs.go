package pipeline

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/source"
)

// gate bounds the producers that read at once; its limit may change at any time. A
// token that comes free goes to the waiter whose queue holds the least (ties: the one
// that has waited longest), not to whichever goroutine runs first: the shard the mixer
// is about to wait for is read first. At the start of an epoch every open shard's
// queue is empty, and the first window, which needs some samples of every lane, is
// complete once each lane has had its turn, not once the lanes before it have filled
// their queues.
type gate struct {
	mu      sync.Mutex
	n       int       // tokens held
	limit   int       // most tokens held
	waiting []*waiter // in the order they came
}

// waiter is one producer waiting for a token: ch is closed when it is given one.
type waiter struct {
	ch   chan struct{}
	fill func() int64 // what its queue holds now (nil: nothing)
}

func newGate(limit int) *gate { return &gate{limit: max(limit, 1)} }

// acquire takes a token, waiting for one; it returns false when ctx is done first.
func (g *gate) acquire(ctx context.Context) bool { return g.acquireFor(ctx, nil) }

// acquireFor takes a token for a producer whose queue holds fill() bytes: the token
// waiters with the least queued get first. It returns false when ctx is done first.
func (g *gate) acquireFor(ctx context.Context, fill func() int64) bool {
	g.mu.Lock()
	if g.n < g.limit && len(g.waiting) == 0 {
		g.n++
		g.mu.Unlock()
		return true
	}
	w := &waiter{ch: make(chan struct{}), fill: fill}
	g.waiting = append(g.waiting, w)
	g.mu.Unlock()
	select {
	case <-w.ch:
		return true
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(g.waiting, w); i >= 0 {
		g.waiting = slices.Delete(g.waiting, i, i+1)
		return false
	}
	// Given a token as ctx ended: hand it on.
	g.n--
	g.grant()
	return false
}

// release returns a token.
func (g *gate) release() {
	g.mu.Lock()
	g.n--
	g.grant()
	g.mu.Unlock()
}

// contended reports whether a producer waits for a token.
func (g *gate) contended() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiting) > 0
}

// held returns the tokens held.
func (g *gate) held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// setLimit changes the limit; holders above a lower limit finish what they hold.
func (g *gate) setLimit(limit int) {
	g.mu.Lock()
	g.limit = max(limit, 1)
	g.grant()
	g.mu.Unlock()
}

// grant gives the free tokens to the waiters whose queues hold the least. Called
// with g.mu held.
func (g *gate) grant() {
	for g.n < g.limit && len(g.waiting) > 0 {
		best, least := 0, int64(math.MaxInt64)
		for i, w := range g.waiting {
			var f int64
			if w.fill != nil {
				f = w.fill()
			}
			if f < least {
				best, least = i, f
			}
		}
		w := g.waiting[best]
		g.waiting = slices.Delete(g.waiting, best, best+1)
		g.n++
		close(w.ch)
	}
}

// live holds the knobs the stages read as they go (SetKnobs).
type live struct{ atomic.Pointer[tune.Knobs] }

// knobs returns the knobs in effect (zero before SetKnobs).
func (l *live) knobs() tune.Knobs {
	if k := l.Load(); k != nil {
		return *k
	}
	return tune.Knobs{}
}

// SetKnobs changes the settings that do not change what the pipeline yields (the
// tuner's, see Params): the worker limit at once; the shards opened ahead, the queues
// (when k's is set) and the fetch settings (zero: the sources' own) of the shards
// opened from now on.
func (pl *Pipeline) SetKnobs(k tune.Knobs) {
	pl.workers.setLimit(k.Workers)
	k.ReadAhead = max(k.ReadAhead, 0)
	if k.QueueBytes <= 0 {
		k.QueueBytes = pl.live.knobs().QueueBytes
	}
	pl.live.Store(&k)
}

// fetchContext returns ctx carrying the fetch settings for a shard opened now.
func (pl *Pipeline) fetchContext(ctx context.Context) context.Context {
	if k := pl.live.knobs(); k.FetchParallel > 0 || k.FetchPartSize > 0 {
		return source.WithTuning(ctx, source.Tuning{Parallel: k.FetchParallel, PartSize: k.FetchPartSize})
	}
	return ctx
}
