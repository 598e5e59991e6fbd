package shardload

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/internal/budget"
	"github.com/shardload/shardload/internal/pipeline"
	"github.com/shardload/shardload/logs"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/wire"
)

// openPacked opens a Loader of packed rows (Config.Pack): package packed plans and
// reads the epoch, the engine writes its batches into the slabs.
func openPacked(ctx context.Context, cfg Config) (*Loader, error) {
	start := time.Now()
	cfg, pc, err := cfg.packedSetup()
	if err != nil {
		return nil, err
	}
	bufs := pipeline.NewSlabBuffers() // the batches are written in the slabs
	pc.Buffers = bufs
	pk, err := packed.Open(ctx, pc)
	if err != nil {
		return nil, packedError(err)
	}
	st := pk.State()
	resume := State{Epoch: st.Epoch, Order: st.Order, Samples: pk.Rows(), Rows: st.Rows}
	if r := cfg.Resume; r != nil {
		resume.Batches = r.Batches
	}
	if cfg.Ring != nil {
		cfg.Slabs, cfg.SlabBytes = len(cfg.Ring.Slabs()), cfg.Ring.MaxSlabBytes()
	} else {
		cfg.SlabBytes = SlabSize(cfg, nil, nil)
	}
	dev, err := device.Open(budget.DeviceOptions(cfg.Device, cfg.SlabBytes, cfg.Logf))
	if err != nil {
		pk.Close()
		return nil, fmt.Errorf("shardload: %w", err)
	}
	batches := int(pk.Len())
	order := Order{Dataset: st.Order, Shards: len(pc.URLs) + len(pc.Shards), Samples: pk.Rows(), Tokens: pk.Tokens(), Seed: cfg.Seed, Epoch: pc.Epoch,
		World: cfg.World, BatchSize: cfg.BatchSize, Shuffle: !cfg.NoShuffle, Mix: "pack " + pc.Pack.String()}
	l := &Loader{cfg: cfg, plan: plan.Plan{Batches: batches, Samples: batches * cfg.BatchSize}, order: order,
		fields: wire.PackedFields(pc.Pack.SeqLen, pc.Pack.Int32), dev: dev, start: start, resume: resume,
		tuner: NewTuner(), pk: pk, done: make(chan struct{}), tuned: make(chan struct{})}
	close(l.tuned)
	logKey, logf := cfg.logKey, cfg.Logf
	l.p = pipeline.Start(ctx, pipeline.Params{
		Packed: pk, Buffers: bufs, SeqLen: pc.Pack.SeqLen, Int32IDs: pc.Pack.Int32, BatchSize: cfg.BatchSize, Rank: cfg.Rank,
		Ring: cfg.Ring,
		RingOptions: pinned.Options{Slabs: cfg.Slabs, SlabBytes: cfg.SlabBytes, NoLock: cfg.NoLock, Bind: cfg.BindSlabs,
			Warn: func(msg string) { logs.Once(logKey, "lock", func() { logf("shardload: warning: %s", msg) }) }},
		Queue: cfg.Slabs, Device: dev, CPUs: cfg.CPUs, Logf: cfg.Logf, LogKey: cfg.logKey,
	})
	return l, nil
}

// packedSetup checks cfg and returns it with its defaults and its packed loader's
// configuration.
func (cfg Config) packedSetup() (Config, packed.Config, error) {
	if err := cfg.Validate(); err != nil {
		return cfg, packed.Config{}, err
	}
	cfg = cfg.withDefaults()
	pc, err := cfg.packedConfig()
	return cfg, pc, err
}

// packedError is an error of package packed's planning as the root's: ErrResume
// for a state that does not resume.
func packedError(err error) error {
	if errors.Is(err, packed.ErrResume) {
		return fmt.Errorf("%w: %w", ErrResume, err)
	}
	return fmt.Errorf("shardload: %w", err)
}

// packedConfig returns the packed loader's configuration of cfg (with defaults).
func (cfg *Config) packedConfig() (packed.Config, error) {
	spec, err := pack.ParseSpec(cfg.Pack)
	if err != nil {
		return packed.Config{}, fmt.Errorf("shardload: Pack: %w", err)
	}
	pc := packed.Config{
		URLs: cfg.URLs, Shards: cfg.Shards, Index: cfg.Index, Pack: spec, BatchSize: cfg.BatchSize,
		Rank: cfg.Rank, World: cfg.World, Seed: cfg.Seed, Epoch: cfg.Epoch, NoShuffle: cfg.NoShuffle,
		OpenShards: cfg.OpenShards, ShuffleBuffer: cfg.ShuffleBuffer, ReadAhead: cfg.Slabs,
		Memory: cfg.Memory, Sources: cfg.Sources, Logf: cfg.Logf,
	}
	// A mix: the streams' URLs one after the other, each stream's weight its share
	// of the epoch's tokens.
	pc.EpochTokens = cfg.EpochTokens
	for i, st := range cfg.Streams {
		if len(st.Shards) > 0 {
			return pc, fmt.Errorf("shardload: Pack: stream %d gives Shards: a packed mix names its streams by URLs", i)
		}
		pc.Streams = append(pc.Streams, plan.Stream{First: len(pc.URLs), Count: len(st.URLs), Weight: st.Weight, Repeat: st.Repeat, Choose: st.Choose})
		pc.URLs = append(pc.URLs, st.URLs...)
	}
	if cfg.ReadGap > 0 {
		pc.ReadGap = cfg.ReadGap
	}
	if r := cfg.Resume; r != nil {
		switch {
		case cfg.Epoch != 0 && cfg.Epoch != r.Epoch:
			return pc, fmt.Errorf("%w: the state is in epoch %d, the loader was asked for epoch %d", ErrResume, r.Epoch, cfg.Epoch)
		case r.Runs != "":
			return pc, fmt.Errorf("%w: the state is a position of an unpacked epoch (runs %q), not of packed rows", ErrResume, r.Runs)
		case r.Rows != 0 || r.Batches != 0:
			pc.Resume = &packed.State{Epoch: r.Epoch, Order: r.Order, Rows: r.Rows}
		}
		pc.Epoch = r.Epoch // at Rows 0: the start of its epoch, under any order
	}
	return pc, nil
}
