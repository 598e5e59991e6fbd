package pipeline

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/source"
)

// gate bounds the producers that read at once; its limit may change at any time.
type gate struct {
	mu    sync.Mutex
	n     int           // tokens held
	limit int           // most tokens held
	wake  chan struct{} // closed when a token is returned or the limit rises
}

func newGate(limit int) *gate { return &gate{limit: max(limit, 1), wake: make(chan struct{})} }

// acquire takes a token, waiting for one; it returns false when ctx is done first.
func (g *gate) acquire(ctx context.Context) bool {
	for {
		g.mu.Lock()
		if g.n < g.limit {
			g.n++
			g.mu.Unlock()
			return true
		}
		wake := g.wake
		g.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return false
		}
	}
}

// release returns a token.
func (g *gate) release() {
	g.mu.Lock()
	g.n--
	g.broadcast()
	g.mu.Unlock()
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
	g.broadcast()
	g.mu.Unlock()
}

// broadcast wakes every waiter. Called with g.mu held.
func (g *gate) broadcast() {
	close(g.wake)
	g.wake = make(chan struct{})
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
