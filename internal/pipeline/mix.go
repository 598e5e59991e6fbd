package pipeline

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/shardload/shardload/plan"
)

// run is the mixing goroutine: it opens up to OpenShards (plus ReadAhead) of the
// plan's spans at a time, in the order the windows need them, puts each sample the producers decode
// at its place in its window, yields each window's samples in the order's
// permutation as they become available, and collates batches.
func (pl *Pipeline) run(ctx context.Context) {
	defer pl.wg.Done()
	defer close(pl.out)
	defer pl.placeThread()()
	err := pl.mixSafely(ctx)
	if err != nil && ctx.Err() == nil {
		select {
		case pl.out <- msg{err: err}:
		case <-ctx.Done():
		}
	}
}

// mixSafely runs mix, turning a panic into the pipeline's error.
func (pl *Pipeline) mixSafely(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = PanicError("in the mixer", r)
		}
	}()
	if pl.p.Packed != nil {
		return pl.pack(ctx)
	}
	return pl.mix(ctx)
}

// missing stands in the windows and batches for a sample the Skip policy left out
// (or, with estimated counts, one a shard did not have): its row is padded. The first
// position of a skip notice holds a note instead (an item with skip set), so that
// skips are logged and counted in the order's order, whatever the timing.
var missing = &item{}

// isMissing reports whether it stands for a left-out sample.
func isMissing(it *item) bool { return it == missing || it.skip != nil }

// window is a window of the plan being filled and yielded.
type window struct {
	w      *plan.Window
	held   []*item         // nil until placed; missing when left out
	emit   []int32         // held index of each position yielded, in order
	next   int             // positions yielded
	feeds  int             // feeds not yet done
	extras map[int][]*item // per span, samples past an estimated shard's end (yielded after the rest, in span order)
	extra  int             // feeds that end an estimated shard and wait for its end
	// after maps, in a window that permutes nothing, the held index of an estimated
	// shard's last planned sample to its span: the shard's extra samples are yielded
	// right after it, in order.
	after map[int32]int
	start int        // the rank's order's position of its first yield
	srcs  []placeKey // with reads into slab rows: each held sample's span and number in it
}

// mixSlot is an open span and where its samples go.
type mixSlot struct {
	*slot
	feeds   []feedRef // the span's feeds made so far, in order, from its feed base on
	base    int
	nfeeds  int   // the span's feeds (plan.Span.Feeds)
	lastWin int   // the window of its last feed, once made; -1 before
	cur     int   // the feed being filled
	left    int32 // samples the current feed still takes; -1 until it is begun
	missing int   // positions a skip notice left out, still to apply
	note    *item // the skip notice whose positions are being applied, for the first
	// toEnd: the span ends where its shard does. The window of its last feed waits
	// for the reader's end, which checks the shard's end (and may fail the loader
	// there); with extras (an estimated count), samples past the feeds are the
	// shard's extra samples.
	toEnd  bool
	extras bool
	closed bool
	index  int   // the span's index in the plan
	err    error // the producer's failure: the loader fails when the order reaches it
}

type feedRef struct {
	win  int // index in the plan's windows
	feed plan.Feed
	last bool // the span's last feed
}

func (pl *Pipeline) mix(ctx context.Context) error {
	p := pl.p
	plan := &p.Plan
	pc := newPlacer(pl)
	defer pc.release() // after the producers are done with the slabs
	ctx, stopProducers := context.WithCancel(ctx)
	var producers sync.WaitGroup
	defer func() { stopProducers(); producers.Wait() }()

	bat := &batcher{pl: pl, pc: pc, rows: make([]*item, 0, p.BatchSize), seq: p.FirstSeq}
	defer bat.free()

	wake := make(chan struct{}, 1)
	var open []*mixSlot
	bySpan := map[int]*mixSlot{}                // the open slots, by span
	spanClosed := make([]bool, len(plan.Spans)) // spans whose messages have all been taken
	nextSpan := 0
	// The windows are made as the mixer reaches them, and their feeds handed to
	// their spans' slots (or kept for the spans not open yet): the mixer holds the
	// feeds of the windows it fills, not the epoch's.
	cursor := plan.Cursor()
	pending := map[int][]feedRef{} // feeds of the spans not open yet
	madeFeeds := map[int]int{}     // feeds made so far of the spans whose last is still to come
	fed := map[int]int{}           // with reads into slab rows: samples fed so far, by span
	start := 0                     // the next window's first position in the rank's order
	makeWindow := func(wi int) (*window, bool, error) {
		sw, ok := cursor.Next()
		if !ok {
			if len(madeFeeds) > 0 {
				return nil, false, fmt.Errorf("shardload: internal error: the plan's windows end before %d of its spans' feeds", len(madeFeeds))
			}
			return nil, false, nil
		}
		refs := make([]feedRef, len(sw.Feeds))
		for i, f := range sw.Feeds {
			n := madeFeeds[f.Span] + 1
			if n > plan.Spans[f.Span].Feeds {
				return nil, false, fmt.Errorf("shardload: internal error: window %d feeds span %d (%s) more than the %d times its plan counts", sw.Index, f.Span, plan.Spans[f.Span].URL, plan.Spans[f.Span].Feeds)
			}
			refs[i] = feedRef{win: wi, feed: f, last: n == plan.Spans[f.Span].Feeds}
			if refs[i].last {
				delete(madeFeeds, f.Span)
			} else {
				madeFeeds[f.Span] = n
			}
			if s := bySpan[f.Span]; s != nil {
				s.add(refs[i])
			} else {
				pending[f.Span] = append(pending[f.Span], refs[i])
			}
		}
		w := pl.newWindow(wi, sw, refs)
		w.start = start
		start += len(w.emit)
		if pc != nil {
			w.srcs = make([]placeKey, sw.Held)
			for i, f := range sw.Feeds {
				n := fed[f.Span]
				for h := f.Slot; f.Slot >= 0 && h < f.Slot+f.Count; h++ {
					w.srcs[h] = placeKey{span: f.Span, n: n + int(h-f.Slot)}
				}
				if refs[i].last {
					delete(fed, f.Span)
				} else {
					fed[f.Span] = n + int(f.Count)
				}
			}
		}
		return w, true, nil
	}
	// Two windows are filled at once: the one being yielded and the next, so that the
	// shards keep being read while the first waits for its last samples.
	const ahead = 2
	var wins []*window
	nextWin := 0 // windows made
	more := true // windows left to make
	defer func() {
		for _, w := range wins {
			w.free(pl)
		}
	}()
	for {
		for len(wins) < ahead && more {
			w, ok, err := makeWindow(nextWin)
			if err != nil {
				return err
			}
			if more = ok; more {
				wins = append(wins, w)
				nextWin++
			}
		}
		if len(wins) == 0 && len(open) == 0 {
			break
		}
		pc.see(wins, !more)
		pc.reserve(bat)
		// A span whose reader failed keeps its place in open until the order
		// reaches its failure (so that the loader fails at the first position the
		// failure leaves empty, whatever the timing), but not its share of the open
		// shards: the spans the windows need before that position must still be
		// read, or the mixer would wait for them forever.
		reading := 0
		for _, s := range open {
			if s.err == nil {
				reading++
			}
		}
		for reading < p.OpenShards+pl.live.knobs().ReadAhead && nextSpan < len(plan.Spans) {
			if fs := pending[nextSpan]; bat.n == 0 && len(wins) > 0 && (len(fs) == 0 || fs[0].win > nextWin-len(wins)) {
				// Until the first batch is out, only what the first window needs is
				// read: a fresh or resumed rank's first batch does not share the
				// source with reads ahead.
				break
			}
			sp := plan.Spans[nextSpan]
			info := p.Shards[sp.Shard]
			s := &mixSlot{slot: newSlot(sp, pl.slotQueueBytes(), wake), nfeeds: sp.Feeds, left: -1, lastWin: -1, index: nextSpan,
				toEnd: sp.Skip+sp.Take == info.Samples, extras: info.Estimated}
			for _, r := range pending[nextSpan] {
				s.add(r)
			}
			delete(pending, nextSpan)
			nextSpan++
			open = append(open, s)
			bySpan[s.index] = s
			s.slot.index = s.index
			reading++
			producers.Add(1)
			go func() { defer producers.Done(); pl.produce(ctx, s.slot) }()
		}
		t0 := mono()
		progress := false
		for i := 0; i < len(open); i++ {
			s := open[i]
			moved, err := pl.pull(ctx, s, wins, nextWin-len(wins))
			if err != nil {
				return err
			}
			progress = progress || moved
			if s.err != nil && s.cur == s.nfeeds {
				// Failed after its last sample of this rank (the shard's end, or its
				// count, is wrong): no position waits for it, so nothing else would
				// report it before the epoch's end.
				return s.err
			}
			if s.closed && s.cur == s.nfeeds && s.err == nil {
				open = slices.Delete(open, i, i+1)
				delete(bySpan, s.index)
				spanClosed[s.index] = true
				i--
				progress = true
			}
		}
		if len(wins) == 0 {
			// Past the last window: a reader that failed after its samples.
			for _, s := range open {
				if s.err != nil {
					return s.err
				}
			}
		}
		t1 := mono()
		// The batches collated on the way, and the waits for their slabs, are
		// counted as collate and backpressure, not as shuffle.
		other := pl.C.Collate.Load() + pl.C.Backpressure.Load()
		// Yield what the first window has ready, and move on when it is done.
		for len(wins) > 0 {
			w := wins[0]
			moved, err := pl.yield(ctx, w, bat, bySpan, spanClosed)
			progress = progress || moved
			if err != nil {
				return err
			}
			if w.next < len(w.emit) || w.feeds > 0 || w.extra > 0 {
				// Blocked: on a span that failed, the loader fails here, at the
				// first position the failure leaves empty.
				if err := w.failure(bySpan); err != nil {
					return err
				}
				break
			}
			// Done. A span that failed after its last sample of this window (a
			// shard with more samples than counted, a bad trailer) fails it now.
			for _, f := range w.w.Feeds {
				if s := bySpan[f.Span]; s != nil && s.err != nil && s.cur == s.nfeeds {
					return s.err
				}
			}
			if w.w.Last {
				// Samples past an estimated shard's end go to the rank that yields the
				// window's end.
				for _, sp := range slices.Sorted(maps.Keys(w.extras)) {
					for _, it := range w.extras[sp] {
						if err := bat.add(ctx, it); err != nil {
							return err
						}
					}
					delete(w.extras, sp)
				}
			}
			w.free(pl)
			wins = wins[1:]
			pc.see(wins, !more)
			progress = true
		}
		add(&pl.C.Shuffle, mono()-t1-time.Duration(pl.C.Collate.Load()+pl.C.Backpressure.Load()-other))
		if !progress {
			select {
			case <-wake:
			case <-ctx.Done():
				return ctx.Err()
			}
			add(&pl.C.Starve, mono()-t0)
		}
	}
	return bat.finish(ctx)
}

// newWindow returns window wi of the plan, sw, ready to fill; refs are its feeds.
func (pl *Pipeline) newWindow(wi int, sw *plan.Window, refs []feedRef) *window {
	plan := &pl.p.Plan
	w := &window{w: sw, held: make([]*item, sw.Held), emit: plan.Emit(sw), feeds: len(sw.Feeds)}
	if plan.Estimated && plan.Order().Perm(sw.Index, int(sw.Size)) == nil {
		for _, r := range refs {
			f := r.feed
			sp := plan.Spans[f.Span]
			info := pl.p.Shards[sp.Shard]
			if f.Slot >= 0 && info.Estimated && sp.Skip+sp.Take == info.Samples && r.last {
				if w.after == nil {
					w.after = map[int32]int{}
				}
				w.after[f.Slot+f.Count-1] = f.Span
			}
		}
	}
	return w
}

// yield hands the window's samples to the batcher in the order's order, as far as
// they are there, and reports whether it handed any.
func (pl *Pipeline) yield(ctx context.Context, w *window, bat *batcher, bySpan map[int]*mixSlot, spanClosed []bool) (bool, error) {
	moved := false
	for w.next < len(w.emit) {
		if w.next > 0 && w.after != nil {
			// After an estimated shard's last planned sample come the samples past
			// it, once its reader has ended.
			if sp, ok := w.after[w.emit[w.next-1]]; ok {
				if !spanClosed[sp] && (bySpan[sp] == nil || !bySpan[sp].closed) {
					return moved, nil
				}
				if w.w.Last {
					for _, it := range w.extras[sp] {
						if err := bat.add(ctx, it); err != nil {
							return moved, err
						}
					}
					delete(w.extras, sp)
				}
				delete(w.after, w.emit[w.next-1])
			}
		}
		h := w.emit[w.next]
		it := w.held[h]
		if it == nil {
			return moved, nil
		}
		w.held[h] = nil
		w.next++
		moved = true
		if it.skip != nil {
			err := pl.noteSkip(*it.skip)
			it = missing
			if err != nil {
				return moved, err
			}
		}
		if err := bat.add(ctx, it); err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// failure returns the error of a failed span that the window waits for: the one that
// was to fill the next position to yield, else any of the window's.
func (w *window) failure(bySpan map[int]*mixSlot) error {
	if w.next < len(w.emit) {
		h := w.emit[w.next]
		for _, f := range w.w.Feeds {
			if f.Slot >= 0 && h >= f.Slot && h < f.Slot+f.Count {
				if s := bySpan[f.Span]; s != nil && s.err != nil {
					return s.err
				}
				return nil
			}
		}
	}
	if w.next == len(w.emit) {
		for _, f := range w.w.Feeds {
			if s := bySpan[f.Span]; s != nil && s.err != nil {
				return s.err
			}
		}
	}
	return nil
}

// free recycles the samples a window still holds (when the loader stops early).
func (w *window) free(pl *Pipeline) {
	for i, it := range w.held {
		if it != nil && !isMissing(it) {
			pl.put(it)
		}
		w.held[i] = nil
	}
	for sp, its := range w.extras {
		for _, it := range its {
			pl.put(it)
		}
		delete(w.extras, sp)
	}
}

// pull takes the messages of slot s that belong to the windows being filled (wins,
// the first of which is the plan's window first) and puts their samples in place.
// It reports whether it took any.
func (pl *Pipeline) pull(ctx context.Context, s *mixSlot, wins []*window, first int) (bool, error) {
	moved := false
	for {
		// Apply positions left out by a skip notice before taking more messages.
		for s.missing > 0 && s.cur < s.nfeeds {
			w := s.window(wins, first)
			if w == nil {
				return moved, nil
			}
			it := missing
			if s.note != nil {
				it, s.note = s.note, nil
			}
			s.place(w, it, pl)
			s.missing--
			moved = true
		}
		if s.err != nil {
			return moved, nil // taken when the order reaches it
		}
		var w *window
		if s.cur < s.nfeeds {
			if w = s.window(wins, first); w == nil {
				return moved, nil // its next samples belong to a later window
			}
		}
		m, ok, closed := s.msgs.tryPop()
		if !ok {
			if closed && !s.closed {
				s.closed = true
				moved = true
				if err := s.end(ctx, wins, first, pl); err != nil {
					return moved, err
				}
			}
			return moved, nil
		}
		moved = true
		s.q.Release(m.weight)
		s.queued.Add(-m.weight)
		pl.C.Queued.Add(-m.weight)
		if pl.p.StreamOf != nil {
			m.stream = int32(pl.p.StreamOf[s.span.Shard])
			if m.it != nil {
				m.it.stream = m.stream
			}
		}
		switch {
		case m.err != nil:
			s.err = m.err
			return moved, nil
		case m.cause != nil:
			if m.skipped == 0 || s.cur == s.nfeeds {
				// No position to note it at (a shard's bad end after its samples).
				if err := pl.noteSkip(m); err != nil {
					return moved, err
				}
				continue
			}
			s.missing += m.skipped
			note := m // a copy: taking m's address would move every message to the heap
			s.note = &item{skip: &note}
		case w == nil:
			// Past the span's feeds: an estimated shard's extra samples, for the
			// window of its last feed.
			if lw := windowAt(wins, first, s.lastWin); lw != nil && s.toEnd && s.extras {
				if lw.extras == nil {
					lw.extras = map[int][]*item{}
				}
				lw.extras[s.index] = append(lw.extras[s.index], m.it)
			} else {
				pl.put(m.it)
			}
		default:
			s.place(w, m.it, pl)
		}
	}
}

// window returns the window of s's current feed when it is being filled, else nil.
func (s *mixSlot) window(wins []*window, first int) *window {
	r, ok := s.feed(s.cur)
	if !ok {
		return nil // in a window not made yet
	}
	return windowAt(wins, first, r.win)
}

// feed returns s's feed i, if it has been made and not dropped.
func (s *mixSlot) feed(i int) (feedRef, bool) {
	if i -= s.base; i >= 0 && i < len(s.feeds) {
		return s.feeds[i], true
	}
	return feedRef{}, false
}

// add adds r, s's next feed, as its window is made.
func (s *mixSlot) add(r feedRef) {
	if s.cur-s.base >= 32 {
		// Drop the feeds done.
		s.feeds = append(s.feeds[:0], s.feeds[s.cur-s.base:]...)
		s.base = s.cur
	}
	s.feeds = append(s.feeds, r)
	if r.last {
		s.lastWin = r.win
	}
}

func windowAt(wins []*window, first, wi int) *window {
	if i := wi - first; i >= 0 && i < len(wins) {
		return wins[i]
	}
	return nil
}

// place puts it at the next position of s's current feed in w, or drops it when the
// feed drops its samples.
func (s *mixSlot) place(w *window, it *item, pl *Pipeline) {
	r, _ := s.feed(s.cur) // made: its window is w
	f := r.feed
	if s.left < 0 {
		s.left = f.Count
	}
	if f.Slot >= 0 {
		w.held[f.Slot+f.Count-s.left] = it
	} else if !isMissing(it) {
		pl.put(it)
	}
	s.left--
	for s.left == 0 {
		last := s.cur == s.nfeeds-1
		if last && s.toEnd && !s.closed {
			w.extra++ // the window waits for the shard's end
		}
		w.feeds--
		prev := r.win
		s.cur++
		if s.cur == s.nfeeds {
			return
		}
		var ok bool
		if r, ok = s.feed(s.cur); !ok {
			s.left = -1 // taken from the feed once its window is made
			return
		}
		s.left = r.feed.Count
		if r.win != prev {
			return
		}
	}
}

// end handles the end of s's messages: the feeds still open get nothing more. With
// estimated counts that is a shard shorter than its estimate (the positions are
// left out); with exact counts the producer has said why (an error) unless the
// loader is stopping.
func (s *mixSlot) end(ctx context.Context, wins []*window, first int, pl *Pipeline) error {
	if s.cur == s.nfeeds {
		if s.toEnd {
			if w := windowAt(wins, first, s.lastWin); w != nil {
				w.extra-- // the shard's end has come
			}
		}
		return nil
	}
	if !pl.p.Plan.Estimated {
		if err := ctx.Err(); err != nil {
			return err
		}
		return fmt.Errorf("shardload: internal error: the reader of %s stopped %d feeds before its span's end", s.span.URL, s.nfeeds-s.cur)
	}
	s.missing = math.MaxInt // the rest of the feeds, as their windows come
	return nil
}

// slotQueueBytes is the queue of each open shard: QueueBytes, and with NoShuffle also
// a share of the shuffle buffer's bytes, which that mode does not use. Samples are
// then taken from one shard at a time, and the deeper queues let the shards after it
// be read and decoded ahead on the other cores; the memory budget is the same.
func (pl *Pipeline) slotQueueBytes() int64 {
	q := pl.live.knobs().QueueBytes
	if pl.p.NoShuffle {
		return q + pl.p.ShuffleBytes/int64(pl.p.OpenShards)
	}
	return q
}

// ErrErrorBudget means the Skip policy left out more than the error budget allows.
var ErrErrorBudget = errors.New("shardload: too many samples skipped")

// RaiseBudget says, in ErrErrorBudget's message, how to raise the budget: the
// loader's flags (serve's, whose trainers cannot set it, and bench's) and the Go
// setting.
const RaiseBudget = "raise it with --error-budget FRACTION, --error-budget-samples N or --error-budget-shards N of shardload serve or bench (a trainer of serve takes its server's), or Config.ErrorBudget in Go"

// noteSkip logs and counts samples the Skip policy left out, and fails once they
// exceed the error budget. It runs in the mixer, so skips are logged in a
// deterministic order.
func (pl *Pipeline) noteSkip(m slotMsg) error {
	pl.C.Skipped.Add(int64(m.skipped))
	if pl.C.Streams != nil {
		pl.C.Streams[m.stream].Skipped.Add(int64(m.skipped))
	}
	what := fmt.Sprintf("%d sample", m.skipped)
	if m.skipped != 1 {
		what += "s"
	}
	if m.shard {
		pl.C.SkippedShards.Add(1)
		what += " (rest of the shard)"
	}
	pl.p.Logf("shardload: skipped %s: %v", what, m.cause)
	samples, shards := pl.C.Skipped.Load(), pl.C.SkippedShards.Load()
	b := pl.p.Budget
	if float64(samples) > b.MaxSamples || float64(shards) > b.MaxShards {
		return fmt.Errorf("%w: rank %d skipped %d samples and %d shards of the job's %d samples in %d shards, over the error budget (%s; %s); last: %w",
			ErrErrorBudget, pl.p.Rank, samples, shards, b.JobSamples, b.JobShards, b.Text, RaiseBudget, m.cause)
	}
	return nil
}
