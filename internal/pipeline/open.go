package pipeline

// The engine of an epoch of samples made ready from Options and the planned Epoch,
// once: the image decoder chosen, the slabs sized, the memory budget split at the
// knobs the loader starts from (resolve), then the device stage, the slabs' growth,
// the tuner and the stages started (Open, with Params).

import (
	"context"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/internal/budget"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/mem"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/wire"
)

// Epoch is a rank's epoch of samples as the root planned it.
type Epoch struct {
	Plan   plan.Plan    // the rank's plan, the batches an estimated epoch replays included
	Shards []shard.Info // the shard list the plan indexes
	Fields []decode.Field
	Order  wire.OrderSettings
	Resume wire.State // the state the rank starts from
	// Replay is the batches dropped before the first one handed out (Params.Replay).
	Replay int
	// StreamOf and Record are Params'.
	StreamOf []int
	Record   func(shard.Info)
}

// resolved is an epoch made ready to run: the image decoder chosen, the slabs sized
// and the memory budget split at the knobs the loader starts from.
type resolved struct {
	Options // the slabs sized
	e       Epoch
	images  decode.ImageDecoder
	shape   budget.Shape
	budget  budget.Budget
	knobs   tune.Knobs // where the loader starts
	members map[int]*shard.Members
}

// Open starts the engine of e: it resolves o over e (its start from the settings
// tuned kept, when it kept some), opens the device stage, starts tuned there (with
// o.NoAutotune it changes nothing) and starts the stages. The caller runs the tuner
// (Tune) unless o.NoAutotune.
func Open(ctx context.Context, o Options, e Epoch, tuned *tune.Shared) (*Pipeline, error) {
	r, err := resolve(ctx, o, e, tuned)
	if err != nil {
		return nil, err
	}
	dev, err := r.openDevice()
	if err != nil {
		return nil, err
	}
	slabs := budget.NewSlabs(r.budget, r.MaxSlabBytes, dev.MaxCopy(), func(need, from, to int64) {
		r.Logf("shardload: rank %d: a batch of %s did not fit the slabs of %s: they grow to %s as batches need (size them up front with --slab-size, Config.SlabBytes or slab_bytes=)",
			r.Rank, mem.FormatSize(need), mem.FormatSize(from), mem.FormatSize(to))
	})
	pins := r.Pins
	if r.NoAutotune {
		pins = tune.AllPins
	}
	tuned.Start(r.knobs, pins, tune.Limits{Lanes: r.OpenShards, Fetch: r.shape.Remote,
		Fits: func(k tune.Knobs) bool { return slabs.Memory(k) <= r.Memory }})
	return Start(ctx, r.params(slabs, tuned, dev)), nil
}

// resolve returns o resolved over e, its start from tuned's settings.
func resolve(ctx context.Context, o Options, e Epoch, tuned *tune.Shared) (r resolved, err error) {
	r.Options, r.e = o, e
	if r.images, err = o.ImageDecoder.Resolve(); err != nil {
		return r, err
	}
	r.shape = budget.ShapeOf(e.Shards, e.Fields)
	c, assumed := CompressionOfNames(e.Shards), false
	if c == shard.None && r.shape.SmallShards(o.Knobs.QueueBytes) {
		// Whether small shards inflate changes what their queues hold: found out
		// from their bytes where their names do not say, assumed where those
		// cannot be read (their decompressors are then counted only when known).
		c, assumed = Compression(ctx, o.Sources, e.Shards, FirstWhole(e.Plan.Spans))
	}
	r.shape.Compressed, r.shape.Inflate = c != shard.None || assumed, shard.InflateBytes(c)
	sized := o.SlabBytes == 0
	r.sizeSlabs(o.SlabSize(e.Shards, e.Fields))
	r.budget = r.Budget(r.shape)
	r.budget.Held = budget.Held(e.Shards, &r.e.Plan)
	if err := r.budget.CheckBatch(FixedBytes(e.Fields), o.BatchSize, o.MaxSlabBytes, o.Knobs, sized); err != nil {
		return r, err
	}
	r.knobs, err = r.budget.StartFrom(tuned, o.Knobs, o.OpenShards)
	if err == nil {
		r.members = slabMembers(ctx, o, e)
	}
	return r, err
}

// params returns the stages' parameters: r, its slabs growing within slabs at
// tuned's knobs, its batches handed to dev.
func (r *resolved) params(slabs *budget.Slabs, tuned *tune.Shared, dev *device.Stage) Params {
	e, order := &r.e, r.e.Order
	firstSeq := e.Resume.Batches
	if e.Replay > 0 {
		firstSeq = 0 // the replayed batches are numbered, and dropped
	}
	fetch := FetchKnobs(r.knobs, r.shape.Remote)
	if r.NoAutotune && !r.Pins.Pinned(tune.FetchParallel) && !r.Pins.Pinned(tune.FetchPartSize) {
		fetch.FetchParallel, fetch.FetchPartSize = 0, 0 // the sources' own settings
	}
	eb := r.ErrorBudget
	return Params{
		Sources: r.Sources, Plan: e.Plan, Shards: e.Shards, Fields: e.Fields,
		ImageDecoder: r.images, AugmentSeed: r.Seed, Epoch: order.Epoch,
		Reader: r.Reader, Rank: r.Rank, FirstSeq: firstSeq, Replay: e.Replay,
		NoShuffle: r.NoShuffle, SlabReads: r.SlabReads, ShuffleBytes: r.ShuffleBytes, OpenShards: max(r.OpenShards, e.Plan.Lanes), Knobs: fetch,
		SampleBytes: r.Memory - r.budget.Held - int64(r.Slabs)*r.SlabBytes - r.budget.Fetch(r.knobs) - r.budget.Inflate(r.knobs),
		BatchSize:   r.BatchSize, DropLast: r.DropLast, CPUs: r.CPUs,
		Record: e.Record, Skip: r.Skip, StreamOf: e.StreamOf, Members: r.members,
		Budget: NewBudget(eb.Fraction, eb.Samples, eb.Shards, order.Samples, order.Shards),
		Ring:   r.Ring, RingOptions: r.ringOptions(), Remote: r.shape.Remote,
		Slabs: slabs, Tuned: tuned,
		Queue: r.Slabs, Device: dev, Logf: r.Logf, LogKey: r.LogKey,
	}
}
