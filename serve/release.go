package serve

// The slabs a trainer holds: their release, its waits for them, and an ended run's.

import (
	"fmt"
	"time"

	"github.com/shardload/shardload/wire"
)

// release hands a slab the trainer is done with back to the ring.
func (ss *session) release(r wire.Release) error {
	ss.mu.Lock()
	h, ok := ss.held[r.Slab]
	switch {
	case !ok:
		ss.mu.Unlock()
		return fmt.Errorf("release of slab %d, which holds no batch of this trainer", r.Slab)
	case h.b.Seq != r.Seq || h.epoch != r.Epoch:
		ss.mu.Unlock()
		return fmt.Errorf("release of slab %d for batch %d of epoch %d, but it holds batch %d of epoch %d", r.Slab, r.Seq, r.Epoch, h.b.Seq, h.epoch)
	case ss.abandoning && h.run == ss.cur || h.run == ss.dropRun:
		ss.mu.Unlock()
		return fmt.Errorf("release of slab %d for batch %d of epoch %d, which the trainer abandoned: the server releases its batches", r.Slab, r.Seq, r.Epoch)
	}
	delete(ss.held, r.Slab)
	if r.Wait != nil {
		ss.tally.reportWait(time.Duration(*r.Wait * float64(time.Second)))
	}
	if len(ss.held) == 0 && len(ss.open) > 0 && !ss.abandoning {
		// Nothing more on its way to the trainer: it waits from now until the next
		// batch is sent (the server's view of its starvation, for trainers that do
		// not report their own).
		ss.starveFrom(time.Now())
	}
	ss.mu.Unlock()
	h.b.Release()
	return nil
}

// starveFrom notes that the trainer has no batch to take from t on; ss.mu held.
func (ss *session) starveFrom(t time.Time) {
	if ss.starving.IsZero() {
		ss.starving = t
		ss.tally.starveFrom(t)
	}
}

// starveTo notes that a batch reached the trainer at t; ss.mu held.
func (ss *session) starveTo(t time.Time) {
	if !ss.starving.IsZero() {
		ss.tally.starveTo(t)
		ss.starving = time.Time{}
	}
}

// releaseRun releases the batches of an abandoned epoch run that the trainer had not
// released: those it holds, and those on their way to it.
func (ss *session) releaseRun(run uint64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for k, h := range ss.held {
		if h.run == run {
			h.b.Release()
			delete(ss.held, k)
		}
	}
}

func (ss *session) releaseAll() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for k, h := range ss.held {
		h.b.Release()
		delete(ss.held, k)
	}
}
