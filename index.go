package shardload

import (
	"context"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
)

// Count returns the shards of cfg (its URLs, brace-expanded and listed) with their
// sample counts, object versions and, for uncompressed shards, sample offsets. It
// reads as little as it can (see index.Lookup): Config.Index when set, otherwise the
// node's index store and an index object beside the shards (index.FileName); it
// reads only the shards none of these has an entry for, or whose object changed,
// Workers at a time, and keeps their entries in the store. Pass the result as
// Config.Shards to open several epochs without looking again.
//
// A sample that fails on its own (a duplicate extension) still counts: it holds a
// place in the epoch. A shard that cannot be counted to its end fails Count under
// either policy: every rank plans from the counts, and a count that one process got
// short after a transient failure would give that rank another plan than the others
// (overlapping slices, unequal batch counts, a hung job).
func Count(ctx context.Context, cfg Config) (infos []shard.Info, err error) {
	defer func() { err = redact.Error(err) }()
	cfg = cfg.withDefaults()
	if len(cfg.Shards) > 0 {
		return cfg.Shards, nil
	}
	urls, err := cfg.expand(ctx)
	if err != nil {
		return nil, err
	}
	return lookup(cfg).Resolve(ctx, urls)
}

// Shards returns the shards Open plans an epoch from, without waiting for a count
// where it need not: exact entries when Config.Index or an index object beside the
// shards (index.FileName) has them, reading only the shards it lacks; otherwise,
// unless Config.CountFirst, counts estimated from the objects' sizes
// (shard.Info.Estimated; see index.Lookup.Quick), with the node's index store's
// exact entries too when World is 1. Every rank of a job gets the same shards from
// the same objects.
func Shards(ctx context.Context, cfg Config) (infos []shard.Info, err error) {
	defer func() { err = redact.Error(err) }()
	cfg = cfg.withDefaults()
	if len(cfg.Shards) > 0 || cfg.CountFirst {
		return Count(ctx, cfg)
	}
	// Bounded by StartTimeout also when called alone (a loader process's count of
	// a dataset for its sessions), not only within Open.
	sctx := ctx
	if cfg.answered == nil { // not within Open, which bounds its planning itself
		var stop func()
		sctx, stop, cfg.answered = startContext(ctx, cfg)
		defer stop()
	}
	urls, err := cfg.expand(sctx)
	if err == nil {
		infos, err = lookup(cfg).Quick(sctx, urls, cfg.World)
	}
	if err != nil {
		return nil, startError(ctx, sctx, cfg, err)
	}
	return infos, nil
}

// expand returns the shard URLs of cfg (with defaults): its patterns expanded, the
// prefixes listed, index objects left out.
func (cfg Config) expand(ctx context.Context) ([]string, error) {
	urls, err := shard.ExpandAll(cfg.URLs)
	if err == nil {
		urls, err = cfg.Sources.Expand(ctx, urls)
	}
	return index.Omit(urls), err
}

// lookup returns the index lookup of cfg (with defaults).
func lookup(cfg Config) index.Lookup {
	lk := index.Lookup{Sources: cfg.Sources, Index: cfg.Index, Workers: max(cfg.Workers, 16), Logf: cfg.Logf, Once: cfg.once, LazyOffsets: true, Answered: cfg.answered,
		Reader: shard.Options{MaxMemberSize: cfg.MaxMemberSize, MaxRatio: cfg.MaxRatio}}
	if !cfg.NoIndexStore {
		// Without the node's store (it cannot be opened), said once, every run counts.
		var err error
		if lk.Store, err = index.Shared(cfg.IndexDir); err != nil {
			cfg.once("store", func() { cfg.Logf("shardload: warning: %v (shards are counted on every run)", err) })
		}
	}
	return lk
}
