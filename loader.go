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
	"github.com/shardload/shardload/internal/budget"
	"github.com/shardload/shardload/internal/pipeline"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/logs"
	"github.com/shardload/shardload/mem"
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
	dev    *device.Stage
	p      *pipeline.Pipeline
	start  time.Time
	resume State        // the state the loader started from
	taken  atomic.Int64 // batches Next has returned
	tuner  *Tuner
	slabs  *budget.Slabs
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
	r, err := resolve(ctx, cfg, tuner)
	if err != nil {
		return nil, err
	}
	cfg = r.cfg
	dev, err := device.Open(budget.DeviceOptions(cfg.Device, cfg.SlabBytes, cfg.Logf))
	if err != nil {
		return nil, fmt.Errorf("shardload: %w", err)
	}
	l = &Loader{cfg: cfg, plan: r.rest(), order: r.order, fields: r.fields, dev: dev, start: start, resume: r.resume,
		tuner: tuner, done: make(chan struct{}), tuned: make(chan struct{})}
	l.slabs = budget.NewSlabs(r.budget, cfg.MaxSlabBytes, dev.MaxCopy(), func(need, from, to int64) {
		cfg.Logf("shardload: rank %d: a batch of %s did not fit the slabs of %s: they grow to %s as batches need (size them up front with --slab-size, Config.SlabBytes or slab_bytes=)",
			cfg.Rank, mem.FormatSize(need), mem.FormatSize(from), mem.FormatSize(to))
	})
	pins := cfg.pins
	if cfg.NoAutotune {
		pins = tune.AllPins
	}
	tuner.s.Start(r.knobs, pins, tune.Limits{Lanes: cfg.OpenShards, Fetch: r.shape.Remote,
		Fits: func(k tune.Knobs) bool { return l.slabs.Memory(k) <= cfg.Memory }})
	l.p = pipeline.Start(ctx, r.params(l.slabs, &tuner.s, dev))
	if cfg.NoAutotune {
		close(l.tuned)
	} else {
		go l.autotune(r.shape.Remote)
	}
	return l, nil
}

// resolved is a Config made ready to run, once: defaults applied, the epoch
// planned (its shards, order, state and plan), the fields found, the image decoder
// chosen, the slabs sized and the memory budget split at the knobs the loader
// starts from. Open builds it (resolve) and hands it to the engine whole (params).
type resolved struct {
	planned // cfg: with defaults and the slabs sized
	fields  []decode.Field
	images  decode.ImageDecoder
	shape   budget.Shape
	budget  budget.Budget
	knobs   tune.Knobs // where the loader starts
}

// resolve returns cfg resolved for Open, its start from tuner's settings: the
// planning bounded by cfg.StartTimeout (see startContext).
func resolve(ctx context.Context, cfg Config, tuner *Tuner) (r resolved, err error) {
	sctx, stop, answered := startContext(ctx, cfg)
	defer stop()
	cfg.answered = answered
	if r.planned, err = planOf(sctx, cfg); err == nil {
		r.fields, err = Fields(sctx, r.cfg, r.infos)
	}
	if err != nil {
		return r, startError(ctx, sctx, cfg, err)
	}
	stop()
	c, infos := &r.cfg, r.infos
	if r.images, err = c.ImageDecoder.Resolve(); err != nil {
		return r, err
	}
	r.shape = budget.ShapeOf(infos, r.fields)
	if r.shape.SmallShards(c.QueueBytes) {
		// Whether the shards inflate changes what their queues hold: found out from
		// their bytes, not their names.
		r.shape.Compressed = pipeline.Compressed(ctx, c.Sources, infos, pipeline.FirstWhole(r.plan.Spans))
	}
	sized := c.SlabBytes == 0
	if c.Ring != nil {
		c.Slabs, c.SlabBytes = len(c.Ring.Slabs()), c.Ring.MaxSlabBytes()
	} else {
		c.SlabBytes = SlabSize(*c, infos, r.fields)
	}
	r.budget = c.budget(r.shape)
	r.budget.Held = budget.Held(infos, &r.plan)
	if err := r.budget.CheckBatch(fixedBytes(r.fields), c.BatchSize, c.MaxSlabBytes, c.knobs(), sized); err != nil {
		return r, err
	}
	r.knobs, err = r.budget.StartFrom(&tuner.s, c.knobs(), c.OpenShards)
	return r, err
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

// params returns the engine's parameters: r, its slabs growing within slabs at
// tuned's knobs, its batches handed to dev.
func (r *resolved) params(slabs *budget.Slabs, tuned *tune.Shared, dev *device.Stage) pipeline.Params {
	cfg, order := &r.cfg, r.order
	firstSeq := r.resume.Batches
	if r.replay > 0 {
		firstSeq = 0 // the replayed batches are numbered, and dropped
	}
	fetch := pipeline.FetchKnobs(r.knobs, r.shape.Remote)
	if cfg.NoAutotune && !cfg.pins.Pinned(tune.FetchParallel) && !cfg.pins.Pinned(tune.FetchPartSize) {
		fetch.FetchParallel, fetch.FetchPartSize = 0, 0 // the sources' own settings
	}
	logKey, logf := cfg.logKey, cfg.Logf
	return pipeline.Params{
		Sources: cfg.Sources, Plan: r.plan, Shards: r.infos, Fields: r.fields,
		ImageDecoder: r.images, AugmentSeed: cfg.Seed, Epoch: order.Epoch,
		Reader: shard.Options{MaxMemberSize: cfg.MaxMemberSize, MaxSampleSize: cfg.MaxSampleSize, MaxRatio: cfg.MaxRatio},
		Rank:   cfg.Rank, FirstSeq: firstSeq, Replay: r.replay,
		NoShuffle: cfg.NoShuffle, ShuffleBytes: cfg.ShuffleBytes, OpenShards: max(cfg.OpenShards, r.plan.Lanes), Knobs: fetch,
		SampleBytes: cfg.Memory - r.budget.Held - int64(cfg.Slabs)*cfg.SlabBytes - r.budget.Fetch(r.knobs),
		BatchSize:   cfg.BatchSize, DropLast: cfg.DropLast, CPUs: cfg.CPUs,
		Record: lookup(*cfg).Store.Keep(r.infos, cfg.Logf),
		Skip:   cfg.OnError == Skip, StreamOf: r.mix.StreamOf(len(r.infos)),
		Budget: pipeline.NewBudget(cfg.ErrorBudget.Fraction, cfg.ErrorBudget.Samples, cfg.ErrorBudget.Shards, order.Samples, order.Shards),
		Ring:   cfg.Ring,
		RingOptions: pinned.Options{Slabs: cfg.Slabs, SlabBytes: cfg.SlabBytes, NoLock: cfg.NoLock, Bind: cfg.BindSlabs,
			Warn: func(msg string) { logs.Once(logKey, "lock", func() { logf("shardload: warning: %s", msg) }) }},
		Slabs: slabs, Tuned: tuned,
		Queue: cfg.Slabs, Device: dev, Logf: cfg.Logf, LogKey: cfg.logKey,
	}
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
	if cfg.Epoch != 0 && cfg.Epoch != r.Epoch {
		return State{}, nil, fmt.Errorf("%w: the state is in epoch %d, the loader was asked for epoch %d", ErrResume, r.Epoch, cfg.Epoch)
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
// the caller releases the batches it still holds. Close is idempotent.
func (l *Loader) Close() error {
	l.close.Do(func() { close(l.done) })
	<-l.tuned
	return l.p.Close() // and the packed loader's, before the slabs it writes in
}

// Settings returns the loader's current settings of those its tuner may change
// (Config.NoAutotune): where the tuner is, or the settings as set.
func (l *Loader) Settings() Settings { return l.tuner.Settings() }

// memory returns what the loader's buffers may hold at the settings in effect.
func (l *Loader) memory() int64 {
	if l.slabs == nil {
		return l.cfg.RingBytes() // a packed epoch's: its slabs
	}
	return l.slabs.Memory(l.tuner.s.Knobs())
}

// Device returns the loader's device-copy stage: its kind and description.
func (l *Loader) Device() *device.Stage { return l.dev }

// DeviceStats returns the device-copy stage's counters: batches and bytes handed
// over, the device's copy time and rate, and how long consumers waited for copies.
func (l *Loader) DeviceStats() device.Stats { return l.dev.Stats() }

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
	s.Workers, s.Memory, s.Elapsed, s.SlabBytes = l.Settings().Workers, l.memory(), time.Since(l.start), l.cfg.RingBytes()
	if l.slabs != nil {
		s.SlabBytes = l.slabs.Bytes()
	}
	if l.pk != nil { // finding the documents: the index, an .idx
		if s.Stages == nil {
			s.Stages = map[string]time.Duration{}
		}
		s.Stages["find"] = l.pk.FindTime()
	}
	return s
}

// autotune runs the loader's tuner until l.done is closed, then closes l.tuned.
func (l *Loader) autotune(remote bool) {
	defer close(l.tuned)
	// The order yields a window's samples once most of them are in: the rate is
	// judged over two windows at least.
	l.p.Tune(&l.tuner.s, tuneInterval, int64(2*max(l.order.Window, l.cfg.BatchSize)), remote, func(k0 tune.Knobs, rate float64) {
		// Once per logger: a loader process serves many ranks and epochs, whose
		// settings the metrics (shardload_session_setting) and bench's report show.
		logs.Once(l.cfg.logKey, "autotune", func() {
			l.cfg.Logf("shardload: rank %d: autotune kept %s: %.0f samples/s (the tuners' later changes are not logged: see the shardload_session_setting metrics, or bench's autotune line)", l.cfg.Rank, k0, rate)
		})
	}, l.done)
}
