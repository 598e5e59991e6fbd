package shardload

import (
	"context"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/pipeline"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/shard"
)

// DefaultMaxSlabBytes is Config.MaxSlabBytes's default: 1 GiB.
const DefaultMaxSlabBytes = 1 << 30

// Fields returns the fields a loader of cfg decodes: cfg.Fields, or those of the
// first sample of the first shard of infos that has one (each with the decoder its
// extension suggests), as Open infers them.
func Fields(ctx context.Context, cfg Config, infos []shard.Info) ([]decode.Field, error) {
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
	if cfg.SlabBytes > 0 {
		return cfg.SlabBytes
	}
	return tune.SlabSize(cfg.withDefaults().BatchSize, fields, infos)
}
