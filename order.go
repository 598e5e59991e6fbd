package shardload

import (
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/wire"
)

// Order holds every setting that decides which samples each rank of a job reads in an
// epoch, and in which order (see wire.OrderSettings, its one definition, shared with
// the protocol's ready message): compare JobFingerprints across ranks, and name the
// differing settings with Diff.
type Order = wire.OrderSettings

// orderOf returns the Order of cfg (with defaults applied) over shards, mixed by mix
// when it is not nil.
func orderOf(cfg Config, shards []shard.Info, mix *plan.Mix) Order {
	o := Order{Shards: len(shards), Seed: cfg.Seed, Epoch: cfg.Epoch, World: cfg.World, BatchSize: cfg.BatchSize,
		DropLast: cfg.DropLast, Shuffle: !cfg.NoShuffle}
	o.Dataset, o.Samples = plan.Dataset(shards)
	if o.Shuffle {
		o.Lanes, o.Window = cfg.OpenShards, plan.WindowSize(cfg.ShuffleBuffer, cfg.ShuffleBytes, shards)
	}
	if cfg.Resume != nil {
		o.Epoch, o.Runs = cfg.Resume.Epoch, cfg.Resume.Runs
	}
	if mix != nil {
		o.Mix, o.Samples = mix.Key(shards, cfg.BatchSize)
	}
	if o.Shuffle && (mix == nil || mix.Batching == "" || mix.Batching == plan.Random) {
		o.Split = "items"
	}
	if o.Shuffle && mix == nil && cfg.Pack == "" {
		o.RanksPerNode = ranksPerNode(cfg)
	}
	return o
}

// ranksPerNode returns the ranks per node by which cfg's epochs keep shards on nodes,
// 0 when they do not (plan.Config.RanksPerNode).
func ranksPerNode(cfg Config) int {
	if cfg.NoNodeAffinity || cfg.RanksPerNode >= max(cfg.World, 1) {
		return 0
	}
	return cfg.RanksPerNode
}
