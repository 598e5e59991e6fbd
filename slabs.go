package shardload

import (
	"context"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/budget"
	"github.com/shardload/shardload/internal/pipeline"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/wire"
)

// DefaultMaxSlabBytes is Config.MaxSlabBytes's default: 1 GiB.
const DefaultMaxSlabBytes = 1 << 30

// Fields returns the fields a loader of cfg decodes: cfg.Fields, or those of the
// first sample of the first shard of infos that has one (each with the decoder its
// extension suggests), as Open infers them.
func Fields(ctx context.Context, cfg Config, infos []shard.Info) ([]decode.Field, error) {
	if cfg.Pack != "" {
		spec, err := pack.ParseSpec(cfg.Pack)
		return wire.PackedFields(spec.SeqLen, spec.Int32), err
	}
	if len(cfg.Fields) > 0 {
		return cfg.Fields, nil
	}
	cfg = cfg.withDefaults()
	return pipeline.InferFields(ctx, cfg.Sources, infos, shard.Options{MaxMemberSize: cfg.MaxMemberSize, MaxRatio: cfg.MaxRatio})
}

// SlabSize returns the size of the slabs of a loader of cfg over infos decoding
// fields: Config.SlabBytes when set; otherwise the size of one batch, exact for
// fixed-size columns (images, labels, npy fields with a shape) and, for ragged ones,
// the dataset's mean stored sample size (from the shards' sizes and counts) with a
// quarter more, rounded up to a huge page (2 MiB at least). A batch that turns out
// larger grows its slab while the loader runs (see Config.MaxSlabBytes).
func SlabSize(cfg Config, infos []shard.Info, fields []decode.Field) int64 {
	cfg = cfg.withDefaults()
	o := cfg.options()
	return o.SlabSize(infos, fields)
}

// CheckBatch refuses, from the settings alone, a batch of cfg that Open would refuse
// for its slabs, before anything is read or allocated: cfg.BatchSize samples of fields
// (cfg.Fields when nil) whose fixed-size columns (images, labels, npy fields with a
// shape: rows x shape x dtype) need a slab larger than cfg.MaxSlabBytes, or whose ring
// of cfg.Slabs such slabs (or of cfg.SlabBytes when that is larger) and the other
// buffers at their least take more than cfg.Memory. Ragged columns count their
// offsets only: their bytes are known once samples are read. Open makes the same
// check before it allocates its slabs; a loader process makes it when a trainer
// says its batch. The error wraps ErrMemory; errors.As finds a *BatchError with the
// figures.
func CheckBatch(cfg Config, fields []decode.Field) error {
	cfg = cfg.withDefaults()
	if fields == nil {
		fields = cfg.Fields
	}
	// The shards are not known yet: their queues are counted at the least any take
	// (shards of a byte, read locally), so that nothing Open accepts is refused.
	o := cfg.options()
	return o.Budget(budget.Shape{MaxShard: 1}).CheckBatch(pipeline.FixedBytes(fields), o.BatchSize, o.MaxSlabBytes, o.Knobs, true)
}
