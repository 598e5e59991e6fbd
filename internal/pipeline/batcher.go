package pipeline

// The batcher: samples into batches, padded or trimmed to the plan, collated into slabs.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/wire"
)

// batcher collects samples into batches and collates them into slabs. With exact
// counts, batch k holds positions [k*BatchSize, (k+1)*BatchSize) of the rank's part
// of the order, in order, and the samples left out (missing) are made up by rows
// repeating others of the batch (or of the batch before), after its samples; with
// estimated counts the batches take the samples as they come, and the last ones are
// padded or trimmed to the plan. Either way a batch's padding rows are its last.
type batcher struct {
	pl *Pipeline
	pc *placer // reads into slab rows; nil without
	// held is the batch before, held back from the ring while its rows, read
	// straight into its slab, may still pad the next batch (pad).
	held    *Batch
	rows    []*item
	last    []*item // the previous batch's samples, kept to pad a short epoch
	seq     int     // the next batch's Seq
	n       int     // batches out
	done    bool    // all of the plan's batches are out
	keys    []string
	values  [][]decode.Value
	padded  int // rows of the batch being built that repeat earlier samples
	padFrom int
}

func (b *batcher) add(ctx context.Context, it *item) error {
	if b.pl.p.Plan.Estimated {
		if it == missing {
			return nil
		}
		if b.done {
			// Past the plan's batches: samples beyond estimated counts are left out.
			b.pl.C.Trimmed.Add(1)
			b.pl.put(it)
			return nil
		}
	}
	b.rows = append(b.rows, it)
	if len(b.rows) == b.pl.p.BatchSize {
		return b.flush(ctx)
	}
	return nil
}

// finish emits the epoch's last batches: the partial one (unless DropLast) and, with
// estimated counts, batches padded with repeated samples so that every rank yields
// the planned number of batches.
func (b *batcher) finish(ctx context.Context) error {
	p := b.pl.p
	if !p.Plan.Estimated {
		if len(b.rows) > 0 {
			if err := b.flush(ctx); err != nil {
				return err
			}
		}
		if b.n != p.Plan.Batches {
			return fmt.Errorf("shardload: internal error: rank %d yielded %d batches of the %d planned", p.Rank, b.n, p.Plan.Batches)
		}
		return nil
	}
	defer b.report()
	for b.n < p.Plan.Batches {
		want := p.BatchSize
		if !p.DropLast && b.n == p.Plan.Batches-1 {
			want = p.Plan.Samples - b.n*p.BatchSize
		}
		if len(b.rows) < want {
			src := b.last
			if len(src) == 0 {
				src = b.rows
			}
			if len(src) == 0 {
				return fmt.Errorf("shardload: rank %d found none of the samples planned for it: the shards' counts were estimated from their sizes, and its part of the epoch lies past their ends; give the loader an index (shardload index --output DIR/ URL...)", p.Rank)
			}
			for len(b.rows) < want {
				b.rows = append(b.rows, src[b.padFrom%len(src)].ref())
				b.padFrom++
				b.padded++
			}
		}
		if err := b.flush(ctx); err != nil {
			return err
		}
	}
	return nil
}

// pad replaces the rows left out with repeats of the batch's other rows, or of the
// advance moves to the next batch: the rows of the one done become the padding
// source, and the previous ones go back.
func (b *batcher) advance() {
	b.padded = 0
	b.seq++
	b.n++
	b.done = b.n >= b.pl.p.Plan.Batches
	for _, it := range b.last {
		b.pl.put(it)
	}
	b.last, b.rows = b.rows, b.last[:0]
}

// batch before's when none is left.
func (b *batcher) pad() error {
	n := 0 // the samples, moved to the front in order
	for _, it := range b.rows {
		if it != missing {
			b.rows[n] = it
			n++
		}
	}
	if n == len(b.rows) {
		return nil
	}
	good := b.rows[:n]
	if n == 0 {
		good = b.last
		detach(good) // their slab may go back to the ring
	}
	if len(good) == 0 {
		return fmt.Errorf("shardload: every sample of rank %d's batch %d was left out, and no batch before it has samples to pad it with", b.pl.p.Rank, b.seq)
	}
	// The padding rows are the batch's last: a trainer drops them as rows[:Rows-Padded].
	for i := n; i < len(b.rows); i++ {
		b.rows[i] = good[b.padFrom%len(good)].ref()
		b.padFrom++
		b.padded++
	}
	return nil
}

func (b *batcher) flush(ctx context.Context) error {
	pl := b.pl
	err := b.pad()
	b.unhold()
	if err != nil {
		return err
	}
	if b.n < pl.p.Replay {
		// Taken before the state this loader resumes: dropped, but its rows pad as
		// they did.
		b.advance()
		return nil
	}
	select {
	case <-pl.ringReady:
	case <-ctx.Done():
		return ctx.Err()
	}
	if pl.ringErr != nil {
		return pl.ringErr
	}
	slab := b.pc.take(b.n)
	if slab == nil {
		tb := mono()
		var err error
		slab, err = pl.ring.Acquire(ctx)
		add(&pl.C.Backpressure, mono()-tb)
		if err != nil {
			return err
		}
	}
	t0 := time.Now()
	b.keys = b.keys[:0]
	b.values = b.values[:0]
	placed := false
	for _, it := range b.rows {
		b.keys = append(b.keys, it.key)
		b.values = append(b.values, it.values)
		placed = placed || it.placed != 0
	}
	if placed && !wire.InPlace(slab.Bytes(), pl.p.Fields, b.keys, b.values) {
		// Not as planned (a row left out, a size the index got wrong): collated as
		// on the copying path, from memory of their own.
		detach(b.rows)
		placed = false
		pl.C.Replaced.Add(1)
	}
	db, err := wire.Collate(slab.Bytes(), pl.p.Fields, b.keys, b.values)
	if errors.Is(err, wire.ErrSlabTooSmall) && pl.p.Slabs != nil {
		err = pl.grow(slab, wire.Needed(pl.p.Fields, b.keys, b.values), b.seq)
		if err == nil {
			db, err = wire.Collate(slab.Bytes(), pl.p.Fields, b.keys, b.values)
		}
	}
	add(&pl.C.Collate, time.Since(t0))
	if err != nil {
		pl.ring.Release(slab)
		return fmt.Errorf("shardload: batch %d: %w", b.seq, err)
	}
	out := &Batch{Layout: db, Seq: b.seq, Padded: b.padded, Slab: slab, ring: pl.ring}
	if err := pl.toDevice(ctx, out); err != nil {
		out.Release()
		return err
	}
	if placed {
		// Its rows become the next batch's padding source: their slab is held
		// until that batch has been padded.
		out.holds.Add(1)
		b.held = out
	}
	pl.C.Samples.Add(int64(len(b.rows) - b.padded))
	if pl.C.Streams != nil {
		for _, it := range b.rows[:len(b.rows)-b.padded] {
			pl.C.Streams[it.stream].Samples.Add(1)
		}
	}
	pl.C.Padded.Add(int64(b.padded))
	pl.C.Batches.Add(1)
	pl.C.BytesOut.Add(db.Used)
	b.advance()
	b.pc.reserve(b)
	tb := mono()
	defer func() { add(&pl.C.Backpressure, mono()-tb) }()
	select {
	case pl.out <- msg{b: out}:
		return nil
	case <-ctx.Done():
		out.Release()
		return ctx.Err()
	}
}

// grow makes slab large enough for a batch of need bytes, as far as Params.Slabs allows.
func (pl *Pipeline) grow(slab *pinned.Slab, need int64, seq int) error {
	size, err := pl.p.Slabs.Grow(need, pl.p.Tuned.Knobs())
	if err != nil {
		return err
	}
	var unmapping func([]byte)
	if dev := pl.p.Device; dev != nil {
		unmapping = func(old []byte) { dev.Unregister(old) }
	}
	if err := pl.ring.Grow(slab, size, unmapping); err != nil {
		return fmt.Errorf("growing slab %d to %d bytes: %w", slab.Index(), size, err)
	}
	pl.C.SlabGrowths.Add(1)
	return nil
}

// report says at the end of an epoch planned from estimated counts how far the data
// was from them.
func (b *batcher) report() {
	pl := b.pl
	if !pl.estimated() {
		return
	}
	c := &pl.C
	pl.p.Logf("shardload: rank %d: the epoch was planned from estimated sample counts (%d samples in %d batches): %d batches delivered with %d samples, %d of them repeats padding the last batches and %d samples left out past the planned batches",
		pl.p.Rank, pl.p.Plan.Samples, pl.p.Plan.Batches, c.Batches.Load(), c.Samples.Load()+c.Padded.Load(), c.Padded.Load(), c.Trimmed.Load())
}

// estimated reports whether any shard's count is an estimate.
func (pl *Pipeline) estimated() bool { return pl.p.Plan.Estimated }

// unhold lets go of the batch held for padding.
func (b *batcher) unhold() {
	if b.held != nil {
		b.held.unref()
		b.held = nil
	}
}

func (b *batcher) free() {
	b.unhold()
	for _, it := range b.rows {
		if it != missing {
			b.pl.put(it)
		}
	}
	for _, it := range b.last {
		b.pl.put(it)
	}
}
