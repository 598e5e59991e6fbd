package shardload

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/pipeline"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/wire"
)

// State is a rank's position in an epoch: what Loader.State returns after any batch,
// and what Config.Resume starts a loader from; see wire.State, its one definition,
// shared with the protocol's messages.
type State = wire.State

// StateAt returns the state of rank cfg.Rank after it has taken batches batches of
// epoch cfg.Epoch (or of cfg.Resume's remainder) without reading any data: for a
// trainer whose checkpoint has a step count but no loader state, and for measuring
// restores. It plans from the shards' counts as Open does (cfg.Shards, else an index
// or estimates, see Shards); a packed epoch (Config.Pack) from its documents' lengths
// (the index, a Megatron .idx), as Open does.
func StateAt(ctx context.Context, cfg Config, batches int) (State, error) {
	if cfg.Pack != "" {
		p, c, err := packedPlan(ctx, cfg)
		if err != nil {
			return State{}, err
		}
		if batches < 0 || int64(batches) > p.Len() {
			return State{}, fmt.Errorf("shardload: StateAt: %d batches, the rank's epoch has %d", batches, p.Len())
		}
		st := p.StateAfter(int64(batches))
		out := State{Epoch: st.Epoch, Order: st.Order, Samples: p.Rows(), Rows: st.Rows, Batches: batches}
		if r := c.Resume; r != nil {
			out.Batches += r.Batches
		}
		return out, nil
	}
	pl, err := planOf(ctx, cfg)
	if err != nil {
		return State{}, err
	}
	if batches < 0 || batches > pl.rest().Batches {
		return State{}, fmt.Errorf("shardload: StateAt: %d batches, the rank's epoch has %d", batches, pl.rest().Batches)
	}
	l := Loader{cfg: pl.cfg, plan: pl.rest(), resume: pl.resume}
	l.taken.Store(int64(batches))
	return l.State(), nil
}

// PlanOf returns what Open would plan for cfg's rank (Loader.Plan), reading no
// shard: it finds the counts as Open does (see Shards); for a packed epoch
// (Config.Pack), its batches of rows.
func PlanOf(ctx context.Context, cfg Config) (plan.Plan, error) {
	if cfg.Pack != "" { // batches of packed rows: no spans of samples
		p, c, err := packedPlan(ctx, cfg)
		if err != nil {
			return plan.Plan{}, err
		}
		n := int(p.Len())
		return plan.Plan{Batches: n, Samples: n * c.BatchSize}, nil
	}
	pl, err := planOf(ctx, cfg)
	return pl.rest(), err
}

type planned struct {
	cfg    Config
	infos  []shard.Info
	order  Order
	mix    *plan.Mix // of a job of several streams
	resume State
	plan   plan.Plan
	// replay is the batches an estimated epoch's loader drops before the first it
	// yields, to resume a state (see replayable); plan then counts those left.
	replay int
}

// planOf plans cfg's rank's epoch: the shards' counts, the order, the state it
// starts from and the plan.
func planOf(ctx context.Context, cfg Config) (p planned, err error) {
	if err := cfg.Validate(); err != nil {
		return p, err
	} else if len(cfg.URLs)+len(cfg.Shards)+len(cfg.Streams) == 0 {
		return p, errors.New("shardload: bad config: no shard URLs")
	}
	p.cfg = cfg.withDefaults()
	if st := p.cfg.Streams; len(st) == 1 && st[0].Repeat == 0 && st[0].Choose == 0 && p.cfg.EpochSamples == 0 && p.cfg.Batching == plan.Random {
		p.cfg.URLs, p.cfg.Shards, p.cfg.Streams = st[0].URLs, st[0].Shards, nil // a plain job
	}
	if len(p.cfg.Streams) > 0 {
		p.infos, p.mix, err = mixOf(ctx, p.cfg)
	} else {
		p.infos, err = Shards(ctx, p.cfg)
	}
	if err != nil {
		return p, err
	}
	p.order = orderOf(p.cfg, p.infos, p.mix)
	var runs []plan.Run
	p.resume, runs, err = resumeFrom(p.cfg, p.order)
	if errors.Is(err, errOtherOrder) && len(p.cfg.Shards) == 0 && shard.Estimated(p.infos) == 0 {
		// A state saved while the counts were estimated, resumed once they are known
		// (an index written since, or the node's store filled by the epoch): the
		// rest of that epoch is planned from the same estimates again.
		if est, eerr := estimatedShards(ctx, p.cfg); eerr == nil && shard.Estimated(est) > 0 && orderOf(p.cfg, est, nil).Fingerprint() == p.cfg.Resume.Order {
			p.infos, p.order = est, orderOf(p.cfg, est, nil)
			p.resume, runs, err = resumeFrom(p.cfg, p.order)
		}
	}
	if err != nil {
		return p, err
	}
	if n := shard.Estimated(p.infos); n > 0 {
		if p.cfg.World > 1 && !p.cfg.AllowEstimate && len(runs) == 0 {
			return p, fmt.Errorf("%w: %d of the %d shards have no index entry, and a job of %d ranks planned from counts estimated from the shards' sizes would leave samples out or repeat them without an error. Write an index once: shardload index --output DIR/ URL... (a loader finds DIR/%s beside the shards); or count the shards before the first batch (count_first=True in Python, --count-first, Config.CountFirst in Go); or accept approximate epochs (allow_estimate=True in Python, --allow-estimate, Config.AllowEstimate in Go)",
				ErrEstimated, n, len(p.infos), p.cfg.World, index.FileName)
		}
		p.cfg.once("estimate "+p.order.Dataset, func() { p.cfg.Logf("%s", index.EstimateNotice(n, len(p.infos), p.cfg.World)) })
		// An estimated plan's batches follow the data, not its positions: its state
		// resumes by replaying the epoch from its start and dropping the batches
		// taken (the same batches, in the same order, as the job that saved it), in a
		// job of the same world size and batch size only.
		var ok bool
		if p.replay, ok = plan.Replayable(runs, p.resume.Batches, p.cfg.World, p.cfg.BatchSize); len(runs) > 0 && !ok {
			return p, fmt.Errorf("%w: the epoch was planned from counts estimated from the shards' sizes (%d shards without an index entry), so its batches follow the data, and a state of it resumes only in a job of its own world size and batch size (it was saved after %d batches by a job of %q; this job has %d ranks and batches of %d); start the epoch anew (a state with only its epoch), or index the dataset before training (shardload index)",
				ErrResume, n, p.resume.Batches, p.resume.Runs, p.cfg.World, p.cfg.BatchSize)
		}
		runs = nil
	}
	// Planned from the counts, then again with the offsets of the shards it reads
	// (an addressable index's are read for those alone); shards others may hold
	// (cfg.Shards: a server's sessions share a dataset's) are not copied for them.
	shared := len(p.cfg.Shards)+len(p.cfg.Streams) > 0
	p.infos, p.plan, err = index.PlanShards(ctx, p.infos, shared, func(infos []shard.Info, loaded shard.Loaded) (plan.Plan, error) {
		return newPlan(infos, loaded, p.cfg, p.order, runs, p.mix)
	})
	return p, err
}

// rest returns what the rank yields of its plan: the plan, less the batches an
// estimated epoch replays.
func (p planned) rest() plan.Plan {
	plan := p.plan
	if p.replay > 0 {
		plan.Batches = max(plan.Batches-p.replay, 0)
		plan.Samples = max(plan.Samples-p.replay*p.cfg.BatchSize, 0)
	}
	return plan
}

// estimatedShards returns the shards of cfg with counts estimated as a loader without
// an index or a node store estimates them.
func estimatedShards(ctx context.Context, cfg Config) ([]shard.Info, error) {
	urls, err := cfg.expand(ctx)
	if err != nil {
		return nil, err
	}
	return lookup(cfg).Estimate(ctx, urls, nil) // from the objects alone: no store, no index
}

// packedSetup checks cfg and returns it with its defaults and its engine's options,
// for Open and for StateAt and PlanOf of a packed epoch (Config.Pack).
func (cfg Config) packedSetup() (Config, pipeline.Options, error) {
	if err := cfg.Validate(); err != nil {
		return cfg, pipeline.Options{}, err
	}
	cfg = cfg.withDefaults()
	for i, st := range cfg.Streams {
		if len(st.Shards) > 0 {
			return cfg, pipeline.Options{}, fmt.Errorf("shardload: Pack: stream %d gives Shards: a packed mix names its streams by URLs", i)
		}
	}
	return cfg, cfg.options(), nil
}

// packedPlan plans cfg's packed epoch (Config.Pack) as Open does, reading no token;
// it returns cfg with its defaults.
func packedPlan(ctx context.Context, cfg Config) (packed.Planned, Config, error) {
	cfg, o, err := cfg.packedSetup()
	if err != nil {
		return packed.Planned{}, cfg, err
	}
	p, err := pipeline.PlanPacked(ctx, o)
	return p, cfg, err
}
