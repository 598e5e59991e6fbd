package serve

import (
	"context"
	"sync"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/pinned"
)

// SessionStats are one session's counters so far, over all its epochs.
type SessionStats struct {
	ID          uint64
	Rank, World int
	Epoch       int // the epoch being read (or last read)
	Started     time.Time
	// MemoryBudget is what the session's buffers may hold (Config.MemoryBudget).
	MemoryBudget int64
	// Settings are the session's tuned settings (its Config.Tuner's); zero with
	// NoAutotune.
	Settings shardload.Settings
	// RingSlabs is the session's slabs, and RingInUse those holding a batch that is
	// being collated, is wire.Ready, or is with the trainer.
	RingSlabs, RingInUse int
	// Cache is what the node's cache served the session's reads, by where the
	// bytes came from (the store, the memory tier, the disk tier); zero without a
	// cache.
	Cache cache.Bytes
	shardload.Stats
}

// Stats returns the counters of the sessions being served, and the totals of the
// sessions that have ended (so that a total over both never goes down).
func (s *Server) Stats() (sessions []SessionStats, ended shardload.Stats) {
	s.statsMu.Lock()
	live := make([]*session, 0, len(s.live))
	for _, ss := range s.live {
		live = append(live, ss)
	}
	ended.Add(s.ended)
	s.statsMu.Unlock()
	for _, ss := range live {
		sessions = append(sessions, ss.tally.snapshot(ss))
	}
	return sessions, ended
}

// sessionTally is what a session's loaders counted: those of its ended epochs and
// the one being read; and how long its trainer waited for batches.
type sessionTally struct {
	mu      sync.Mutex
	done    shardload.Stats
	cur     *shardload.Loader
	epoch   int
	started time.Time
	ring    *pinned.Ring
	// The trainer's waits for batches that were not ready: as it reports them in
	// its releases (protocol 4), else as the server sees them (time with no wire.Batch
	// sent and not released; less than the trainer's when it keeps batches a while).
	reported time.Duration
	reports  bool
	starved  time.Duration
	// since is when the trainer's current wait began (it holds no batch and none is
	// on its way), zero when it is not waiting; shown is the most "wait" a snapshot
	// said, so that the metric never goes back.
	since time.Time
	shown time.Duration
	// cache counts the bytes the node's cache serves the session's reads (their
	// context carries it: reads); epochFrom is its reading at the start of the
	// epoch being read.
	cache     cache.Tally
	epochFrom cache.Bytes
}

// reads returns ctx for the session's reads: the cache counts what it serves them
// in the session's tally.
func (t *sessionTally) reads(ctx context.Context) context.Context {
	return cache.WithTally(ctx, &t.cache)
}

// epochCache returns what the cache served the session since the last call (the
// epoch that ended), and starts the next epoch's count.
func (t *sessionTally) epochCache() cache.Bytes {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cache.Bytes()
	b := now.Sub(t.epochFrom)
	t.epochFrom = now
	return b
}

// logEpochCache logs what the node's cache served the session's reads in the
// epoch that ended: bytes from the store and from each tier; nothing when no read
// went through a cache.
func (ss *session) logEpochCache(epoch int) {
	if b := ss.tally.epochCache(); b.Total() > 0 {
		ss.srv.opts.Logf("serve: session %d: epoch %d: cache: %s", ss.id, epoch, b)
	}
}

// cacheFigures says what the cache served a session, "" for nothing.
func cacheFigures(b cache.Bytes) string {
	if b.Total() == 0 {
		return ""
	}
	return "; cache: " + b.String()
}

// reportWait notes the trainer's own count of its waits so far.
func (t *sessionTally) reportWait(d time.Duration) {
	t.mu.Lock()
	t.reported, t.reports = max(t.reported, d), true
	t.mu.Unlock()
}

// starveFrom notes that the trainer has had no batch to take since at.
func (t *sessionTally) starveFrom(at time.Time) {
	t.mu.Lock()
	t.since = at
	t.mu.Unlock()
}

// starveTo notes that a batch reached the trainer at at, ending its wait.
func (t *sessionTally) starveTo(at time.Time) {
	t.mu.Lock()
	if !t.since.IsZero() {
		t.starved += at.Sub(t.since)
		t.since = time.Time{}
	}
	t.mu.Unlock()
}

// wait returns the trainer's waits so far at now (t.mu held): what it reported, or
// what the server saw, and the wait under way, so that a starved trainer's metric
// rises while it waits, not only when its next release says so.
func (t *sessionTally) wait(now time.Time) time.Duration {
	w := t.starved
	if t.reports {
		w = t.reported
	}
	if !t.since.IsZero() {
		w += now.Sub(t.since)
	}
	t.shown = max(t.shown, w)
	return t.shown
}

// backpressure returns the time the session's loaders waited for the trainer's
// slabs, l's included.
func (t *sessionTally) backpressure(l *shardload.Loader) time.Duration {
	t.mu.Lock()
	d := t.done.Stages["backpressure"]
	t.mu.Unlock()
	return d + l.Stats().Stages["backpressure"]
}

// setRing notes the session's ring, for its occupancy.
func (t *sessionTally) setRing(r *pinned.Ring) {
	t.mu.Lock()
	t.ring = r
	t.mu.Unlock()
}

// open notes the loader of an epoch being read.
func (t *sessionTally) open(l *shardload.Loader, epoch int) {
	t.mu.Lock()
	t.cur, t.epoch = l, epoch
	t.mu.Unlock()
}

// close adds the loader's counters to the session's, as it ends.
func (t *sessionTally) close(l *shardload.Loader) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done.Add(l.Stats())
	if t.cur == l {
		t.cur = nil
	}
}

func (t *sessionTally) snapshot(ss *session) SessionStats {
	t.mu.Lock()
	var st shardload.Stats
	st.Add(t.done)
	if t.cur != nil {
		st.Add(t.cur.Stats())
	}
	// The session's "wait" is its trainer's, not the time the session's loop waited
	// in Next (most of which is backpressure: the trainer holding every slab).
	if st.Stages == nil {
		st.Stages = map[string]time.Duration{}
	}
	st.Stages["wait"] = t.wait(time.Now())
	out := SessionStats{ID: ss.id, Rank: ss.cfg.Rank, World: ss.cfg.World, Epoch: t.epoch, Started: t.started,
		MemoryBudget: ss.cfg.MemoryBudget(), Cache: t.cache.Bytes(), Stats: st}
	if ss.cfg.Tuner != nil {
		out.Settings = ss.cfg.Tuner.Settings()
	}
	if t.ring != nil {
		out.RingSlabs, out.RingInUse = len(t.ring.Slabs()), t.ring.InUse()
	}
	t.mu.Unlock()
	return out
}
