package shardload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/internal/redact"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/shard"
)

// Loader yields the batches of one rank's epoch. Open one per epoch; Close it when
// done. Next and Close may be called from different goroutines; Next is not for
// concurrent use.
type Loader struct {
	cfg    Config
	plan   shard.Plan
	counts []int // samples per shard, by index in the shard list
	order  Order
	fields []decode.Field

	dev       deviceHook   // the device-copy stage
	ring      *pinned.Ring // set once ringReady is closed
	ringErr   error
	ringReady chan struct{}

	out    chan batchMsg
	cancel context.CancelFunc
	wg     sync.WaitGroup
	pool   bufPool
	st     counters
	start  time.Time

	workers   chan struct{} // one token per worker actively reading a shard
	closeOnce sync.Once
	closed    atomic.Bool
	closeErr  error
	err       error // sticky error of Next
}

type batchMsg struct {
	b   *Batch
	err error
}

// Batch is one batch in a pinned slab. Its columns are views into Data(); they stay
// valid until Release, which hands the slab back for a later batch.
type Batch struct {
	decode.Batch
	// Seq numbers the batches of an epoch from 0.
	Seq int
	// Padded counts rows that repeat earlier samples to keep the epoch's batch count
	// when the Skip policy left samples out.
	Padded int

	slab     *pinned.Slab
	xfer     *device.Transfer // the copy to the device, see device.go
	l        *Loader
	released atomic.Bool
}

// Data returns the slab the batch lives in; columns give offsets into it.
func (b *Batch) Data() []byte { return b.slab.Bytes() }

// Slab returns the pinned slab (its memfd can be shared with another process).
func (b *Batch) Slab() *pinned.Slab { return b.slab }

// Keys returns the samples' keys, in row order.
func (b *Batch) Keys() []string {
	c, ok := b.Column(keyColumn)
	if !ok {
		return nil
	}
	keys := make([]string, b.Rows)
	for i := range keys {
		keys[i] = string(c.Row(b.Data(), i))
	}
	return keys
}

// Release hands the batch's slab back to the loader. Using the batch afterwards reads
// memory that a later batch overwrites. Release is idempotent.
func (b *Batch) Release() {
	if b.released.CompareAndSwap(false, true) {
		if b.xfer != nil {
			b.xfer.Release() // waits for the copy, so the slab is free to refill
		}
		b.l.ring.Release(b.slab)
	}
}

const keyColumn = "__key__"

// Open plans this rank's epoch and starts the loader: it counts the shards' samples
// unless cfg.Shards or cfg.Index give them, infers the fields from the first sample
// unless cfg.Fields names them, allocates the slab ring and starts reading. ctx bounds
// Open's own work; the loader then runs until the epoch ends or Close.
func Open(ctx context.Context, cfg Config) (l *Loader, err error) {
	defer func() { err = redact.Error(err) }()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	start := time.Now()
	infos, err := Count(ctx, cfg)
	if err != nil {
		return nil, err
	}
	plan, err := shard.NewPlan(infos, shard.PlanConfig{
		Seed: cfg.Seed, Epoch: cfg.Epoch, Rank: cfg.Rank, World: cfg.World,
		Shuffle: !cfg.NoShuffle, BatchSize: cfg.BatchSize, DropLast: cfg.DropLast,
	})
	if err != nil {
		return nil, err
	}
	fields := cfg.Fields
	if len(fields) == 0 {
		if fields, err = inferFields(ctx, cfg, infos); err != nil {
			return nil, err
		}
	}
	dev, err := openDevice(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l = &Loader{dev: deviceHook{stage: dev},
		cfg: cfg, plan: plan, order: orderOf(cfg, infos), fields: fields, cancel: cancel, start: start,
		counts:    make([]int, len(infos)),
		out:       make(chan batchMsg, cfg.Slabs),
		workers:   make(chan struct{}, cfg.Workers),
		ringReady: make(chan struct{}),
	}
	// Free buffers kept for reuse: as much as the queues and the shuffle buffer hold.
	for i, info := range infos {
		l.counts[i] = info.Samples
	}
	l.pool.maxFree = int64(cfg.OpenShards)*cfg.QueueBytes + cfg.ShuffleBytes
	// The arena may map twice that: what the queues and the shuffle buffer hold, and
	// room for the batches being collated and for size classes that round up.
	l.pool.maxArena = 2 * l.pool.maxFree
	if cfg.Ring != nil {
		l.ring = cfg.Ring
		close(l.ringReady)
	} else {
		// Mapping and locking the slabs takes a while (page faults for every page): it
		// overlaps with reading the first samples, and the first batch waits for it.
		go func() {
			defer close(l.ringReady)
			l.ring, l.ringErr = pinned.NewRing(pinned.Options{Slabs: cfg.Slabs, SlabBytes: cfg.SlabBytes, NoLock: cfg.NoLock, Bind: cfg.BindSlabs,
				Warn: func(msg string) { lockWarning.Do(func() { cfg.Logf("shardload: warning: %s", msg) }) }})
		}()
	}
	l.wg.Add(1)
	go l.run(ctx)
	return l, nil
}

// inferFields reads the first sample of the first shard that has one.
func inferFields(ctx context.Context, cfg Config, infos []shard.Info) ([]decode.Field, error) {
	for _, info := range infos {
		if info.Samples == 0 {
			continue
		}
		body, err := cfg.Sources.Open(ctx, info.URL)
		if err != nil {
			return nil, err
		}
		r := shard.NewReader(body, shard.Options{URL: info.URL, SizesOnly: true, MaxMemberSize: cfg.MaxMemberSize, MaxRatio: cfg.MaxRatio})
		s, err := r.Next()
		var fields []decode.Field
		if err == nil {
			for _, f := range s.Fields {
				fd, perr := decode.ParseField(f.Ext)
				if perr != nil {
					err = perr
					break
				}
				fields = append(fields, fd)
			}
		}
		r.Close()
		body.Close()
		if err != nil {
			return nil, fmt.Errorf("shardload: inferring fields from %s: %w", info.URL, err)
		}
		return fields, nil
	}
	return nil, ErrEmpty
}

// lockWarning says once per process that slabs cannot be page-locked.
var lockWarning sync.Once

// ErrEmpty means the shards hold no samples.
var ErrEmpty = errors.New("shardload: no samples in the shards")

// Plan returns what this rank reads this epoch.
func (l *Loader) Plan() shard.Plan { return l.plan }

// Order returns the settings that decide this epoch's order and rank split; every
// rank of a job must have the same (see Order.Fingerprint).
func (l *Loader) Order() Order { return l.order }

// Fields returns the fields the loader decodes, in column order.
func (l *Loader) Fields() []decode.Field { return slices.Clone(l.fields) }

// Next returns the next batch, or io.EOF after the epoch's last. The caller must
// Release each batch. Errors are sticky.
func (l *Loader) Next(ctx context.Context) (*Batch, error) {
	if l.closed.Load() {
		// Batches still queued when Close ran belong to freed slabs: never hand them out.
		l.err = ErrClosed
	}
	if l.err != nil {
		return nil, l.err
	}
	t0 := time.Now()
	var m batchMsg
	var ok bool
	select {
	case m, ok = <-l.out:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	l.st.add(&l.st.wait, time.Since(t0))
	switch {
	case l.closed.Load():
		if ok && m.b != nil {
			m.b.Release()
		}
		l.err = ErrClosed
	case !ok:
		l.err = io.EOF
	case m.err != nil:
		l.err = redact.Error(m.err)
	default:
		if m.b.Seq == 0 {
			l.st.firstBatch.Store(int64(time.Since(l.start)))
		}
		return m.b, nil
	}
	return nil, l.err
}

// ErrClosed is returned by Next after Close.
var ErrClosed = errors.New("shardload: loader closed")

// All iterates over the remaining batches of the epoch, releasing each when the loop
// body returns. It stops at the first error, which it yields.
func (l *Loader) All(ctx context.Context) iter.Seq2[*Batch, error] {
	return func(yield func(*Batch, error) bool) {
		for {
			b, err := l.Next(ctx)
			if err == io.EOF {
				return
			}
			if err != nil {
				yield(nil, err)
				return
			}
			more := yield(b, nil)
			b.Release()
			if !more {
				return
			}
		}
	}
}

// Close stops the loader, waits for its goroutines and frees the slabs. Batches not
// yet released must not be used afterwards. With Config.Ring, the ring stays open and
// the caller releases the batches it still holds. Close is idempotent.
func (l *Loader) Close() error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		l.cancel()
		// Drain batches nobody will take, so the producer side can exit.
		go func() {
			for m := range l.out {
				if m.b != nil {
					m.b.Release()
				}
			}
		}()
		l.wg.Wait()
		l.pool.release() // every goroutine that held a sample buffer is done
		devErr := l.closeDevice()
		<-l.ringReady
		if l.ring != nil && l.cfg.Ring == nil {
			l.closeErr = l.ring.Close()
		}
		l.closeErr = errors.Join(devErr, l.closeErr)
	})
	return l.closeErr
}

// Stats returns counters and per-stage times so far.
func (l *Loader) Stats() Stats {
	st := l.st.snapshot(l.start)
	st.Workers = l.cfg.Workers
	select {
	case <-l.ringReady:
		st.PageLocked = l.ring != nil && l.ring.Locked()
	default:
	}
	return st
}

// run is the loader's mixing goroutine: it opens up to OpenShards spans in plan order,
// takes samples from them in a seeded order, passes them through the shuffle buffer
// and collates batches. Everything that decides the order happens here, so the
// order does not depend on goroutine timing.
func (l *Loader) run(ctx context.Context) {
	defer l.wg.Done()
	defer close(l.out)
	defer l.placeThread()()
	err := l.mixSafely(ctx)
	if err != nil && ctx.Err() == nil {
		select {
		case l.out <- batchMsg{err: err}:
		case <-ctx.Done():
		}
	}
}

// mixSafely runs mix, turning a panic into the loader's error.
func (l *Loader) mixSafely(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicError("in the mixer", r)
		}
	}()
	return l.mix(ctx)
}

func (l *Loader) mix(ctx context.Context) error {
	cfg := l.cfg
	ctx, stopProducers := context.WithCancel(ctx)
	var producers sync.WaitGroup
	defer func() { stopProducers(); producers.Wait() }()

	rng := shard.EpochRand(cfg.Seed, cfg.Epoch, 1+uint64(cfg.Rank))
	shuffleItems := cfg.ShuffleBuffer
	if cfg.NoShuffle {
		shuffleItems = 1
	}
	shuf := shard.NewShuffler[*item](rng, shuffleItems, cfg.ShuffleBytes)
	bat := &batcher{l: l, rows: make([]*item, 0, cfg.BatchSize)}
	defer bat.free()

	var open []*slot
	next := 0
	queueBytes := slotQueueBytes(cfg)
	for {
		for len(open) < cfg.OpenShards && next < len(l.plan.Spans) {
			s := newSlot(l.plan.Spans[next], queueBytes)
			next++
			open = append(open, s)
			producers.Add(1)
			go func() { defer producers.Done(); l.produce(ctx, s) }()
		}
		if len(open) == 0 {
			break
		}
		i := 0
		if !cfg.NoShuffle {
			i = rng.IntN(len(open))
		}
		var m slotMsg
		var ok bool
		t0 := mono()
		select {
		case m, ok = <-open[i].ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		t1 := mono()
		l.st.add(&l.st.starve, t1-t0)
		if !ok {
			open = slices.Delete(open, i, i+1)
			continue
		}
		open[i].q.Release(m.weight)
		if m.err != nil {
			return m.err
		}
		if m.cause != nil {
			if err := l.noteSkip(m); err != nil {
				return err
			}
			continue
		}
		t0 = t1
		shuf.Push(m.it, m.it.size)
		for shuf.Full() {
			l.st.add(&l.st.shuffle, mono()-t0)
			if err := bat.add(ctx, shuf.Pop()); err != nil {
				return err
			}
			t0 = mono()
		}
		l.st.add(&l.st.shuffle, mono()-t0)
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
func slotQueueBytes(cfg Config) int64 {
	if cfg.NoShuffle {
		return cfg.QueueBytes + cfg.ShuffleBytes/int64(cfg.OpenShards)
	}
	return cfg.QueueBytes
}

// noteSkip logs and counts samples the Skip policy left out, and fails once they
// exceed the error budget. It runs in the mixer, so skips are logged in a
// deterministic order.
func (l *Loader) noteSkip(m slotMsg) error {
	l.st.skipped.Add(int64(m.skipped))
	what := fmt.Sprintf("%d sample", m.skipped)
	if m.skipped != 1 {
		what += "s"
	}
	if m.shard {
		l.st.skippedShards.Add(1)
		what += " (rest of the shard)"
	}
	l.cfg.Logf("shardload: skipped %s: %v", what, m.cause)
	samples, shards := l.st.skipped.Load(), l.st.skippedShards.Load()
	b := *l.cfg.ErrorBudget
	maxSamples, maxShards := b.limits(l.order.Samples, int64(l.order.Shards))
	if float64(samples) > maxSamples || float64(shards) > maxShards {
		return fmt.Errorf("%w: rank %d skipped %d samples and %d shards of the job's %d samples in %d shards, over the error budget (%s); last: %w",
			ErrErrorBudget, l.cfg.Rank, samples, shards, l.order.Samples, l.order.Shards, b, m.cause)
	}
	return nil
}

// batcher collects samples into batches and collates them into slabs.
type batcher struct {
	l       *Loader
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
		// DropLast: samples past the last full batch are left out.
		b.l.pool.put(it)
		return nil
	}
	b.rows = append(b.rows, it)
	if len(b.rows) == b.l.cfg.BatchSize {
		return b.flush(ctx)
	}
	return nil
}

// finish emits the epoch's last batches: the partial one (unless DropLast) and, when
// skipped samples left the epoch short, batches padded with repeated samples so that
// every rank yields the planned number of batches.
func (b *batcher) finish(ctx context.Context) error {
	cfg, plan := b.l.cfg, b.l.plan
	for b.seq < plan.Batches {
		want := cfg.BatchSize
		if !cfg.DropLast && b.seq == plan.Batches-1 {
			want = plan.Samples - b.seq*cfg.BatchSize
		}
		if len(b.rows) < want {
			src := b.last
			if len(src) == 0 {
				src = b.rows
			}
			if len(src) == 0 {
				return fmt.Errorf("shardload: every sample of rank %d's epoch was skipped", cfg.Rank)
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
	l := b.l
	select {
	case <-l.ringReady:
	case <-ctx.Done():
		return ctx.Err()
	}
	if l.ringErr != nil {
		return l.ringErr
	}
	slab, err := l.ring.Acquire(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	b.keys = b.keys[:0]
	b.values = b.values[:0]
	var bytes int64
	for _, it := range b.rows {
		b.keys = append(b.keys, it.key)
		b.values = append(b.values, it.values)
		bytes += it.size
	}
	db, err := decode.Collate(slab.Bytes(), l.fields, b.keys, b.values)
	l.st.add(&l.st.collate, time.Since(t0))
	if err != nil {
		l.ring.Release(slab)
		return fmt.Errorf("shardload: batch %d: %w", b.seq, err)
	}
	out := &Batch{Batch: db, Seq: b.seq, Padded: b.padded, slab: slab, l: l}
	if err := l.toDevice(ctx, out); err != nil {
		out.Release()
		return err
	}
	l.st.samples.Add(int64(len(b.rows) - b.padded))
	l.st.padded.Add(int64(b.padded))
	l.st.batches.Add(1)
	l.st.bytesOut.Add(db.Used)
	b.padded = 0
	b.seq++
	b.done = b.seq >= l.plan.Batches
	// The rows of this batch become the padding source; the previous ones go back.
	for _, it := range b.last {
		l.pool.put(it)
	}
	b.last, b.rows = b.rows, b.last[:0]
	select {
	case l.out <- batchMsg{b: out}:
		return nil
	case <-ctx.Done():
		out.Release()
		return ctx.Err()
	}
}

func (b *batcher) free() {
	for _, it := range b.rows {
		b.l.pool.put(it)
	}
	for _, it := range b.last {
		b.l.pool.put(it)
	}
}
