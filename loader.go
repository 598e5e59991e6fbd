package shardload

import (
	"cmp"
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
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/pipeline"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/wire"
)

// Loader yields the batches of one rank's epoch. Open one per epoch; Close it when
// done. Next and Close may be called from different goroutines; Next is not for
// concurrent use.
type Loader struct {
	cfg    Config
	plan   plan.Plan
	order  Order
	fields []decode.Field
	p      *pipeline.Pipeline
	start  time.Time
	resume State        // the state the loader started from
	taken  atomic.Int64 // batches Next has returned
	tuner  *Tuner
	done   chan struct{} // closed by Close
	tuned  chan struct{} // closed when the tuner's goroutine is done
	close  sync.Once
	pk     *packed.Loader // the rows of a packed epoch (Config.Pack)
}

// Batch is one batch in a pinned slab. Its columns are views into Data(); they stay
// valid until Release, which hands the slab back for a later batch.
type Batch struct {
	wire.Layout
	// Seq numbers the batches of an epoch from 0.
	Seq int
	// Padded counts rows that repeat earlier samples to keep the epoch's batch count
	// when the Skip policy left samples out.
	Padded int

	b *pipeline.Batch
}

// Data returns the slab the batch lives in; columns give offsets into it.
func (b *Batch) Data() []byte { return b.b.Slab.Bytes() }

// Slab returns the pinned slab (its memfd can be shared with another process).
func (b *Batch) Slab() *pinned.Slab { return b.b.Slab }

// Keys returns the samples' keys, in row order.
func (b *Batch) Keys() []string { return b.Layout.Keys(b.Data()) }

// Release hands the batch's slab back to the loader. Using the batch afterwards reads
// memory that a later batch overwrites. Release is idempotent.
func (b *Batch) Release() { b.b.Release() }

// Transfer returns the batch's copy to the device (Config.Device): Wait on it before
// the device reads the batch at its Ptr. Release also hands its device buffer back.
// With the host backend (the default) it is complete at once and Ptr is the address
// of Data.
func (b *Batch) Transfer() *device.Transfer { return b.b.Transfer }

// Open plans this rank's epoch and starts the loader: it finds the shards' sample
// counts (cfg.Shards, else see Shards: an index, or estimates from the objects'
// sizes; no shard is read in full first unless cfg.CountFirst), infers the fields
// from the first sample unless cfg.Fields names them, allocates the slab ring and
// starts reading. ctx bounds Open's own work; the loader then runs until the epoch
// ends or Close.
func Open(ctx context.Context, cfg Config) (l *Loader, err error) {
	defer func() { err = redact.Error(err) }()
	if cfg.Pack != "" {
		return openPacked(ctx, cfg)
	}
	// The rank's first requests spread their start over a window derived from the
	// rank, and its retries draw their jitter from it (source.WithRank).
	ctx = source.WithRank(ctx, cfg.Rank, cfg.World)
	start := time.Now()
	tuner := cmp.Or(cfg.Tuner, NewTuner())
	p, fields, err := planFields(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cfg = p.cfg
	if cfg.Planned != nil {
		cfg.Planned(p.rest())
	}
	// The engine resolves the rest (the slabs' size, the memory budget, the knobs
	// it starts from, tuner's when it has some) and starts.
	pl, err := pipeline.Open(ctx, cfg.options(), pipeline.Epoch{Plan: p.plan, Shards: p.infos, Fields: fields, Order: p.order,
		Resume: p.resume, Replay: p.replay, StreamOf: p.mix.StreamOf(len(p.infos)), Record: lookup(cfg).Store.Keep(p.infos, cfg.Logf)}, &tuner.s)
	if err != nil {
		return nil, err
	}
	l = &Loader{cfg: cfg, plan: p.rest(), order: p.order, fields: fields, p: pl, start: start, resume: p.resume,
		tuner: tuner, done: make(chan struct{}), tuned: make(chan struct{})}
	if cfg.NoAutotune {
		close(l.tuned)
	} else {
		go l.autotune()
	}
	return l, nil
}

// openPacked opens a Loader of packed rows (Config.Pack): package packed plans and
// reads the epoch, the engine writes its batches into the slabs.
func openPacked(ctx context.Context, cfg Config) (*Loader, error) {
	start := time.Now()
	cfg, o, err := cfg.packedSetup()
	if err != nil {
		return nil, err
	}
	e, err := pipeline.OpenPacked(ctx, o)
	if err != nil {
		return nil, err
	}
	l := &Loader{cfg: cfg, plan: e.Plan, order: e.Order, fields: e.Fields, p: e.Pipeline, start: start, resume: e.Resume,
		tuner: NewTuner(), pk: e.Rows, done: make(chan struct{}), tuned: make(chan struct{})}
	close(l.tuned)
	return l, nil
}

// planFields plans cfg's rank's epoch (planOf) and finds its fields (Fields) for
// Open, bounded by cfg.StartTimeout (see startContext).
func planFields(ctx context.Context, cfg Config) (p planned, fields []decode.Field, err error) {
	sctx, stop, answered := startContext(ctx, cfg)
	defer stop()
	cfg.answered = answered
	if p, err = planOf(sctx, cfg); err == nil {
		fields, err = Fields(sctx, p.cfg, p.infos)
	}
	if err != nil {
		return p, nil, startError(ctx, sctx, cfg, err)
	}
	return p, fields, nil
}

// DefaultStartTimeout is Config.StartTimeout's default.
const DefaultStartTimeout = time.Minute

// startContext returns ctx bounded by cfg.StartTimeout for Open's planning, unless
// the job counts its shards first (see Config.StartTimeout): see index.StartBound.
func startContext(ctx context.Context, cfg Config) (sctx context.Context, stop, answered func()) {
	if cfg.CountFirst || len(cfg.Streams) > 0 {
		return index.StartBound(ctx, -1)
	}
	return index.StartBound(ctx, cmp.Or(cfg.StartTimeout, DefaultStartTimeout))
}

// startError returns err of Open's planning, or ErrStartTimeout when the start
// context sctx ran out (see index.StartError).
func startError(ctx, sctx context.Context, cfg Config, err error) error {
	first := ""
	switch {
	case len(cfg.URLs) > 0:
		first = cfg.URLs[0]
	case len(cfg.Shards) > 0:
		first = cfg.Shards[0].URL
	case len(cfg.Streams) > 0 && len(cfg.Streams[0].URLs) > 0:
		first = cfg.Streams[0].URLs[0]
	}
	return index.StartError(ctx, sctx, first, cmp.Or(cfg.StartTimeout, DefaultStartTimeout), err)
}

// newPlan returns cfg's rank's plan under order, after runs, with the entries of
// loaded (plan.Config.Loaded).
func newPlan(infos []shard.Info, loaded shard.Loaded, cfg Config, order Order, runs []plan.Run, mix *plan.Mix) (plan.Plan, error) {
	if cfg.ReadGap == 0 && len(infos) > 0 {
		cfg.ReadGap = source.RequestCostOf(cfg.Sources, infos[0].URL)
	}
	p, err := plan.New(infos, plan.Config{
		Seed: cfg.Seed, Epoch: order.Epoch, Rank: cfg.Rank, World: cfg.World,
		Shuffle: !cfg.NoShuffle, Lanes: order.Lanes, Window: order.Window, Runs: runs,
		BatchSize: cfg.BatchSize, DropLast: cfg.DropLast, GapBytes: cfg.ReadGap,
		MaxWindows: cfg.Memory / planWindowBytes, Mix: mix, RanksPerNode: ranksPerNode(cfg), Loaded: loaded,
	})
	if errors.Is(err, plan.ErrBadRuns) {
		err = fmt.Errorf("%w: %w", ErrResume, err)
	}
	return p, err
}

// planWindowBytes: a rank's part of an epoch may span one window of the order per
// planWindowBytes of the memory budget (16 M windows at the default 1 GiB, 8
// billion samples at the default shuffle settings). A plan holds its spans, not its
// windows, but planning walks them once and the loader once more (a microsecond or
// so each): counts that would need more are refused as wrong rather than planned for
// minutes (--memory raises the limit).
const planWindowBytes = 64

// resumeFrom returns the state the loader starts from (cfg.Resume's, or the
// epoch's start) and its runs, checking that it fits the order.
func resumeFrom(cfg Config, order Order) (State, []plan.Run, error) {
	start := State{Epoch: order.Epoch, Order: order.Fingerprint(), Samples: order.Samples}
	r := cfg.Resume
	if r == nil {
		return start, nil, nil
	}
	if err := pipeline.CheckEpoch(cfg.Epoch, r); err != nil {
		return State{}, nil, err
	}
	if r.Order == "" && r.Runs == "" || order.Mix != "" && r.Runs == "" && r.Batches == 0 {
		// The start of an epoch: under any order, and a mix's weights may change
		// between epochs (a curriculum).
		start.Batches = max(r.Batches, 0)
		return start, nil, nil // the start of the epoch
	}
	if r.Order != start.Order || r.Samples != order.Samples {
		return State{}, nil, fmt.Errorf("%w: %w (state %s with %d samples, this loader %s with %d): the shards, their counts, the seed or the shuffle settings differ",
			ErrResume, errOtherOrder, r.Order, r.Samples, start.Order, order.Samples)
	}
	if r.Batches < 0 {
		return State{}, nil, fmt.Errorf("%w: %d batches", ErrResume, r.Batches)
	}
	runs, err := plan.ParseRuns(r.Runs)
	if err != nil {
		return State{}, nil, fmt.Errorf("%w: %w", ErrResume, err)
	}
	return *r, runs, nil
}

// errOtherOrder: a state was saved under another order.
var errOtherOrder = errors.New("it was saved under another order")

// Plan returns what this rank reads this epoch.
func (l *Loader) Plan() plan.Plan { return l.plan }

// Order returns the settings that decide this epoch's order and rank split; every
// rank of a job must have the same (see Order.Fingerprint).
func (l *Loader) Order() Order { return l.order }

// Fields returns the fields the loader decodes, in column order.
func (l *Loader) Fields() []decode.Field { return slices.Clone(l.fields) }

// Next returns the next batch, or io.EOF after the epoch's last. The caller must
// Release each batch. Errors are sticky.
func (l *Loader) Next(ctx context.Context) (*Batch, error) {
	t0 := time.Now()
	b, err := l.p.Next(ctx)
	l.p.C.Wait.Add(int64(time.Since(t0)))
	if err != nil {
		return nil, err
	}
	if l.taken.Add(1) == 1 {
		l.p.C.FirstBatch.Store(int64(time.Since(l.start)))
	}
	return &Batch{Layout: b.Layout, Seq: b.Seq, Padded: b.Padded, b: b}, nil
}

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
// the caller releases the batches it still holds. Without it, the ring the loader made
// is left for the next loader of the process with the same slab settings (Slabs,
// SlabBytes, NoLock, no BindSlabs), the next epoch's, when every batch was released;
// it is unmapped otherwise, and when a ring made otherwise is left after it. Close is
// idempotent.
func (l *Loader) Close() error {
	l.close.Do(func() { close(l.done) })
	<-l.tuned
	return l.p.Close() // and the packed loader's, before the slabs it writes in
}

// Settings returns the loader's current settings of those its tuner may change
// (Config.NoAutotune): where the tuner is, or the settings as set.
func (l *Loader) Settings() Settings { return l.tuner.Settings() }

// Device returns the loader's device-copy stage: its kind and description.
func (l *Loader) Device() *device.Stage { return l.p.Device() }

// DeviceStats returns the device-copy stage's counters: batches and bytes handed
// over, the device's copy time and rate, and how long consumers waited for copies.
func (l *Loader) DeviceStats() device.Stats { return l.p.Device().Stats() }

// State returns the rank's position after the batches Next has returned so far. Save
// it with the trainer's checkpoint (after the optimizer step that used the last
// batch) and pass it as Config.Resume to continue from there.
//
// A run that continues one of the same world size extends it: the state after k
// batches of a resumed job is the uninterrupted job's state after its k batches.
func (l *Loader) State() State {
	s := l.resume
	k := int(l.taken.Load())
	if l.pk != nil {
		s.Rows = l.pk.StateAfter(int64(k)).Rows
	} else if k > 0 {
		consumed := min(int64(k)*int64(l.cfg.BatchSize), int64(l.plan.Samples))
		runs, _ := plan.ParseRuns(s.Runs) // checked by Open
		s.Runs = plan.FormatRuns(plan.AdvanceRun(runs, plan.Run{World: max(l.cfg.World, 1), Consumed: consumed, RanksPerNode: l.plan.RanksPerNode}))
	}
	s.Batches += k
	return s
}

// Stats returns counters and per-stage times so far.
func (l *Loader) Stats() Stats {
	s := l.p.Stats()
	s.Workers, s.Elapsed = l.Settings().Workers, time.Since(l.start)
	return s
}

// autotune runs the loader's tuner until l.done is closed, then closes l.tuned.
func (l *Loader) autotune() {
	defer close(l.tuned)
	// The order yields a window's samples once most of them are in: the rate is
	// judged over two windows at least.
	l.p.Tune(tuneInterval, int64(2*max(l.order.Window, l.cfg.BatchSize)), l.done)
}
