package serve

// Hints: a reader's epochs announced to the node's cache, so that it evicts by next
// use (cache.PolicyOrder; see "Eviction by next use" in the cache package).

import (
	"sync"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/source"
)

// DefaultBatchGuess is the time per batch EpochHints assumes for a reader's first
// epoch until it has seen some of its batches: a guess, corrected from the rate
// measured after the first few percent of the epoch (and, for later epochs, from the
// epoch before). Only the order of the reads matters to the cache while their times
// are near; a wrong guess is mended by the next publish.
const DefaultBatchGuess = time.Second

// republishes is how many times an epoch's hints are published again as it
// advances, at even steps of its batches (the cache asks for at most about a
// hundred).
const republishes = 32

// EpochHints announces one reader's epochs (a serve session, a rank of bench) to the
// node's cache, when that cache evicts by next use (cache.PolicyOrder; under
// PolicyLRU nothing is announced): at each epoch's open, the distinct URLs of its
// plan's spans in plan order (a span of no samples, a packed epoch's read, each
// time it comes), spaced evenly over the epoch's expected duration; then
// again every 1/32 of the epoch's batches, the reads done left out and the times
// estimated again from the rate measured. The expected duration is the epoch's
// batches times the time per batch: measured in this epoch once some batches are
// done, else that of the epoch before, else DefaultBatchGuess. It does nothing when
// the loader's shards are not read through a cache. Its methods are safe for
// concurrent use; a nil *EpochHints does nothing.
type EpochHints struct {
	reader string
	logf   func(format string, args ...any)

	mu      sync.Mutex
	h       *cache.Hints
	c       *cache.Cache
	urls    []string      // the epoch's distinct URLs, in plan order
	batches int           // the epoch's batches
	start   time.Time     // when the epoch opened
	perB    time.Duration // expected time per batch
	next    int           // the batch of the last publish
	done    int           // the batches taken so far
	doneAt  time.Time     // when the last of them was taken
	failed  bool          // a publish failed: logged once
	planned bool          // OpenPlan announced the epoch of the loader Open is given next
	st      HintStats     // what was published, but by e.h
}

// HintStats is what an EpochHints published: its cache.HintStats, the epochs'
// shards announced and the time its publishes took.
type HintStats struct {
	cache.HintStats
	// ShardEpochs is the distinct shards announced at the epochs' opens, summed over
	// the epochs: FileBytes / ShardEpochs is the bytes written per shard and epoch.
	ShardEpochs int64
	// Time is the time spent publishing (building the schedule, Hints.Publish: the
	// hint keys, the file written and renamed), on the reader's goroutine.
	Time time.Duration
}

// NewEpochHints returns the hints of the reader named reader (a name for the cache's
// log lines). logf, if not nil, reports a failed publish once.
func NewEpochHints(reader string, logf func(format string, args ...any)) *EpochHints {
	return &EpochHints{reader: reader, logf: logf}
}

// cacheOf returns the cache that reads url in reg, or nil.
func cacheOf(reg *source.Registry, url string) *cache.Cache {
	if reg == nil {
		return nil
	}
	src, err := reg.Lookup(url)
	if err != nil {
		return nil
	}
	c, _ := src.(*cache.Cache)
	return c
}

// Open publishes the reads of the epoch of l, just opened, whose shards are read
// through reg; it replaces those of the epoch before. Where OpenPlan announced the
// epoch already (l's Config.Planned), it does nothing. Prefer OpenPlan from
// Config.Planned: l has started reading by the time Open can announce its reads,
// and a packed loader's reads are announced only there (its Plan has no spans).
func (e *EpochHints) Open(l *shardload.Loader, reg *source.Registry) {
	if e == nil || l == nil {
		return
	}
	e.mu.Lock()
	planned := e.planned
	e.planned = false
	e.mu.Unlock()
	if !planned {
		e.open(l.Plan(), reg)
	}
}

// OpenPlan publishes the reads of an epoch from its plan, p, before its loader
// reads: as a loader's Config.Planned calls it (Planned: func(p plan.Plan) {
// e.OpenPlan(p, reg) }), so that the cache knows the epoch's order from its first
// read. The Open that follows, for the loader of that plan, then does nothing.
func (e *EpochHints) OpenPlan(p plan.Plan, reg *source.Registry) {
	if e == nil {
		return
	}
	e.open(p, reg)
	e.mu.Lock()
	e.planned = true
	e.mu.Unlock()
}

func (e *EpochHints) open(p plan.Plan, reg *source.Registry) {
	seen := make(map[string]bool, len(p.Spans))
	var urls []string
	var c *cache.Cache
	distinct := 0
	for _, s := range p.Spans {
		// A shard's runs of samples are announced at its first; a span of no samples
		// is a read of its own (a packed epoch's, packed.Planned.ReadPlan).
		again := seen[s.URL]
		if again && s.Feeds > 0 {
			continue
		}
		seen[s.URL] = true
		if sc := cacheOf(reg, s.URL); sc != nil && sc.Policy() == cache.PolicyOrder {
			c = sc
			urls = append(urls, s.URL)
			if !again {
				distinct++
			}
		}
	}
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done > 0 {
		// The epoch before: its rate is the best guess for this one.
		e.perB = max(e.doneAt.Sub(e.start)/time.Duration(e.done), time.Microsecond)
	}
	if e.perB <= 0 {
		e.perB = DefaultBatchGuess
	}
	e.urls, e.batches, e.start, e.next, e.done = urls, max(p.Batches, 1), now, 0, 0
	if c == nil {
		return
	}
	if e.h != nil && e.c != c {
		e.st.HintStats.Add(e.h.Stats())
		e.h.Close()
		e.h = nil
	}
	if e.h == nil {
		h, err := c.Hint(e.reader, cache.HintOptions{WriteEvery: time.Second})
		if err != nil {
			return
		}
		e.h, e.c = h, c
	}
	e.st.ShardEpochs += int64(distinct)
	e.publish(0, now, true)
}

// Batch reports that the reader took its batch number done (counted from 1) of
// the epoch: every 1/32 of the epoch the hints are published again.
func (e *EpochHints) Batch(done int) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.batches == 0 || done <= 0 {
		return
	}
	now := time.Now()
	e.done, e.doneAt = done, now
	step := max(e.batches/republishes, 1)
	if e.h == nil || done < e.next+step || done >= e.batches {
		return
	}
	e.perB = max(now.Sub(e.start)/time.Duration(done), time.Microsecond)
	e.publish(done, now, false)
}

// first returns the first URL a publish after batch done announces.
func (e *EpochHints) first(done int) int {
	from := min(len(e.urls)*done/e.batches, len(e.urls))
	return max(from-1, 0)
}

// publish announces the reads still to come after batch done, from now at the
// expected rate: written for the other processes at once when open (the epoch's
// order is new), else as often as HintOptions.WriteEvery allows. The URL at the position the batches have reached is kept (the
// loader reads ahead of its batches, and a span can feed several).
func (e *EpochHints) publish(done int, now time.Time, open bool) {
	defer func(t0 time.Time) { e.st.Time += time.Since(t0) }(time.Now())
	e.next = done
	from := e.first(done)
	rest := e.urls[from:]
	left := time.Duration(e.batches-done) * e.perB
	every := time.Duration(0)
	if len(rest) > 0 {
		every = left / time.Duration(len(rest))
	}
	pub := e.h.Publish
	if open {
		pub = e.h.Announce
	}
	if err := pub(cache.Schedule(rest, now, every)); err != nil && !e.failed && e.logf != nil {
		e.failed = true
		e.logf("hints of %s: %v", e.reader, err)
	}
}

// Stats returns what was published so far.
func (e *EpochHints) Stats() HintStats {
	if e == nil {
		return HintStats{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.st
	if e.h != nil {
		st.HintStats.Add(e.h.Stats())
	}
	return st
}

// Close withdraws the hints.
func (e *EpochHints) Close() {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.h != nil {
		e.st.HintStats.Add(e.h.Stats())
		e.h.Close()
		e.h = nil
	}
}
