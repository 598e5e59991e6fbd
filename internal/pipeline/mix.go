package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/numa"
	"github.com/shardload/shardload/shard"
)

// run is the mixing goroutine: it opens up to OpenShards spans in plan order, takes
// samples from them in a seeded order, passes them through the shuffle buffer and
// collates batches.
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
	return pl.mix(ctx)
}

func (pl *Pipeline) mix(ctx context.Context) error {
	p := pl.p
	ctx, stopProducers := context.WithCancel(ctx)
	var producers sync.WaitGroup
	defer func() { stopProducers(); producers.Wait() }()

	rng := shard.EpochRand(p.Seed, p.Epoch, 1+uint64(p.Rank))
	shuffleItems := p.ShuffleBuffer
	if p.NoShuffle {
		shuffleItems = 1
	}
	shuf := shard.NewShuffler[*item](rng, shuffleItems, p.ShuffleBytes)
	bat := &batcher{pl: pl, rows: make([]*item, 0, p.BatchSize)}
	defer bat.free()

	var open []*slot
	next := 0
	queueBytes := slotQueueBytes(p)
	for {
		for len(open) < p.OpenShards && next < len(p.Plan.Spans) {
			s := newSlot(p.Plan.Spans[next], queueBytes)
			next++
			open = append(open, s)
			producers.Add(1)
			go func() { defer producers.Done(); pl.produce(ctx, s) }()
		}
		if len(open) == 0 {
			break
		}
		i := 0
		if !p.NoShuffle {
			i = rng.IntN(len(open))
		}
		t0 := mono()
		m, ok, err := open[i].msgs.pop(ctx)
		if err != nil {
			return err
		}
		t1 := mono()
		add(&pl.C.Starve, t1-t0)
		if !ok {
			open = slices.Delete(open, i, i+1)
			continue
		}
		open[i].q.Release(m.weight)
		if m.err != nil {
			return m.err
		}
		if m.cause != nil {
			if err := pl.noteSkip(m); err != nil {
				return err
			}
			continue
		}
		t0 = t1
		shuf.Push(m.it, m.it.size)
		for shuf.Full() {
			add(&pl.C.Shuffle, mono()-t0)
			if err := bat.add(ctx, shuf.Pop()); err != nil {
				return err
			}
			t0 = mono()
		}
		add(&pl.C.Shuffle, mono()-t0)
	}
	for shuf.Len() > 0 {
		if err := bat.add(ctx, shuf.Pop()); err != nil {
			return err
		}
	}
	return bat.finish(ctx)
}

// slotQueueBytes is the queue of each open shard: QueueBytes, and with NoShuffle also
// a share of the shuffle buffer's bytes, which that mode does not use. Samples are
// then taken from one shard at a time, and the deeper queues let the shards after it
// be read and decoded ahead on the other cores; the memory budget is the same.
func slotQueueBytes(p Params) int64 {
	if p.NoShuffle {
		return p.QueueBytes + p.ShuffleBytes/int64(p.OpenShards)
	}
	return p.QueueBytes
}

// ErrErrorBudget means the Skip policy left out more than the error budget allows.
var ErrErrorBudget = errors.New("shardload: too many samples skipped")

// noteSkip logs and counts samples the Skip policy left out, and fails once they
// exceed the error budget. It runs in the mixer, so skips are logged in a
// deterministic order.
func (pl *Pipeline) noteSkip(m slotMsg) error {
	pl.C.Skipped.Add(int64(m.skipped))
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
		return fmt.Errorf("%w: rank %d skipped %d samples and %d shards of the job's %d samples in %d shards, over the error budget (%s); last: %w",
			ErrErrorBudget, pl.p.Rank, samples, shards, b.JobSamples, b.JobShards, b.Text, m.cause)
	}
	return nil
}

// batcher collects samples into batches and collates them into slabs.
type batcher struct {
	pl      *Pipeline
	rows    []*item
	last    []*item // the previous batch's samples, kept to pad a short epoch
	seq     int
	done    bool // all of the plan's batches are out
	keys    []string
	values  [][]decode.Value
	padded  int // rows of the batch being built that repeat earlier samples
	padFrom int
}

func (b *batcher) add(ctx context.Context, it *item) error {
	if b.done {
		// Past the plan's batches: samples beyond estimated counts (or, DropLast,
		// past the last full batch) are left out.
		b.pl.C.Trimmed.Add(1)
		b.pl.put(it)
		return nil
	}
	b.rows = append(b.rows, it)
	if len(b.rows) == b.pl.p.BatchSize {
		return b.flush(ctx)
	}
	return nil
}

// finish emits the epoch's last batches: the partial one (unless DropLast) and, when
// skipped samples left the epoch short, batches padded with repeated samples so that
// every rank yields the planned number of batches.
func (b *batcher) finish(ctx context.Context) error {
	p := b.pl.p
	defer b.report()
	if p.Stretch {
		if len(b.rows) > 0 && (!p.DropLast || len(b.rows) == p.BatchSize) {
			return b.flush(ctx)
		}
		return nil
	}
	for b.seq < p.Plan.Batches {
		want := p.BatchSize
		if !p.DropLast && b.seq == p.Plan.Batches-1 {
			want = p.Plan.Samples - b.seq*p.BatchSize
		}
		if len(b.rows) < want {
			src := b.last
			if len(src) == 0 {
				src = b.rows
			}
			if len(src) == 0 && b.pl.estimated() {
				return fmt.Errorf("shardload: rank %d found none of the samples planned for it: the shards' counts were estimated from their sizes, and its part of the epoch lies past their ends; give the loader an index (shardload index --output DIR/ URL...)", p.Rank)
			}
			if len(src) == 0 {
				return fmt.Errorf("shardload: every sample of rank %d's epoch was skipped", p.Rank)
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

func (b *batcher) flush(ctx context.Context) error {
	pl := b.pl
	select {
	case <-pl.ringReady:
	case <-ctx.Done():
		return ctx.Err()
	}
	if pl.ringErr != nil {
		return pl.ringErr
	}
	slab, err := pl.ring.Acquire(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	b.keys = b.keys[:0]
	b.values = b.values[:0]
	for _, it := range b.rows {
		b.keys = append(b.keys, it.key)
		b.values = append(b.values, it.values)
	}
	db, err := decode.Collate(slab.Bytes(), pl.p.Fields, b.keys, b.values)
	add(&pl.C.Collate, time.Since(t0))
	if err != nil {
		pl.ring.Release(slab)
		return fmt.Errorf("shardload: batch %d: %w", b.seq, err)
	}
	out := &Batch{Batch: db, Seq: b.seq, Padded: b.padded, Slab: slab, ring: pl.ring}
	if err := pl.toDevice(ctx, out); err != nil {
		out.Release()
		return err
	}
	pl.C.Samples.Add(int64(len(b.rows) - b.padded))
	pl.C.Padded.Add(int64(b.padded))
	pl.C.Batches.Add(1)
	pl.C.BytesOut.Add(db.Used)
	b.padded = 0
	b.seq++
	b.done = b.seq >= pl.p.Plan.Batches && !pl.p.Stretch
	// The rows of this batch become the padding source; the previous ones go back.
	for _, it := range b.last {
		pl.put(it)
	}
	b.last, b.rows = b.rows, b.last[:0]
	select {
	case pl.out <- msg{b: out}:
		return nil
	case <-ctx.Done():
		out.Release()
		return ctx.Err()
	}
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
func (pl *Pipeline) estimated() bool {
	for _, s := range pl.p.Shards {
		if s.Estimated {
			return true
		}
	}
	return false
}

func (b *batcher) free() {
	for _, it := range b.rows {
		b.pl.put(it)
	}
	for _, it := range b.last {
		b.pl.put(it)
	}
}

// toDevice starts the copy of b to the device, registering its slab first. It waits
// while every device buffer holds a batch the consumer has not released.
func (pl *Pipeline) toDevice(ctx context.Context, b *Batch) error {
	dev := pl.p.Device
	if dev == nil {
		return nil
	}
	if err := dev.Register(b.Slab.Bytes()); err != nil {
		pl.regWarn.Do(func() {
			pl.p.Logf("shardload: warning: %v; copies from unregistered slabs are staged by the driver (slower)", err)
		})
	}
	xfer, err := dev.Copy(ctx, b.Slab.Bytes()[:b.Used])
	if err != nil {
		return fmt.Errorf("shardload: batch %d: %w", b.Seq, err)
	}
	b.Transfer = xfer
	return nil
}

// placeThread wires the calling goroutine to a thread on the CPUs, when set, and
// returns what undoes it.
func (pl *Pipeline) placeThread() func() {
	if len(pl.p.CPUs) == 0 {
		return func() {}
	}
	unlock, err := numa.LockThread(pl.p.CPUs)
	if err != nil {
		placeWarning.Do(func() {
			pl.p.Logf("shardload: warning: loader threads not placed on CPUs %s: %v", numa.FormatCPUList(pl.p.CPUs), err)
		})
		return func() {}
	}
	return unlock
}

// placeWarning says once per process that threads cannot be placed.
var placeWarning sync.Once

// clockBase anchors mono.
var clockBase = time.Now()

// mono returns a monotonic timestamp for stage times: one clock read, where time.Now
// takes two (wall and monotonic). The producers and the mixer take several per
// sample.
func mono() time.Duration { return time.Since(clockBase) }

func add(c *atomic.Int64, d time.Duration) { c.Add(int64(d)) }
