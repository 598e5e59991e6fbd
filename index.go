package shardload

import (
	"context"
	"slices"
	"sync"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/redact"
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
	urls, err := shard.ExpandAll(cfg.URLs)
	if err != nil {
		return nil, err
	}
	if urls, err = cfg.Sources.Expand(ctx, urls); err != nil {
		return nil, err
	}
	urls = index.Omit(urls)
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
	urls, err := shard.ExpandAll(cfg.URLs)
	if err != nil {
		return nil, err
	}
	if urls, err = cfg.Sources.Expand(ctx, urls); err != nil {
		return nil, err
	}
	urls = index.Omit(urls)
	return lookup(cfg).Quick(ctx, urls, cfg.World)
}

// lookup returns the index lookup of cfg (with defaults).
func lookup(cfg Config) index.Lookup {
	lk := index.Lookup{Sources: cfg.Sources, Index: cfg.Index, Workers: max(cfg.Workers, 16), Logf: cfg.Logf,
		Reader: shard.Options{MaxMemberSize: cfg.MaxMemberSize, MaxRatio: cfg.MaxRatio}}
	if !cfg.NoIndexStore {
		lk.Store = openStore(cfg.IndexDir, cfg.Logf)
	}
	return lk
}

// stores holds the index stores opened, by directory.
var stores sync.Map // string -> *index.Store

// openStore opens the index store in dir (index.DefaultStoreDir when ""), or says
// once why it cannot and returns nil.
func openStore(dir string, logf func(string, ...any)) *index.Store {
	if dir == "" {
		dir = index.DefaultStoreDir()
	}
	if dir == "" {
		return nil
	}
	if s, ok := stores.Load(dir); ok {
		return s.(*index.Store)
	}
	s, err := index.OpenStore(dir)
	if err != nil {
		storeWarning.Do(func() { logf("shardload: warning: %v (shards are counted on every run)", err) })
		return nil
	}
	stores.Store(dir, s)
	return s
}

var storeWarning sync.Once

// recorder returns what keeps the true entries of estimated shards read whole in the
// node's index store, or nil; once every shard of infos has its true entry, the
// dataset's entries are kept together too (index.Store.PutSet), so that the next run
// on the node reads one file.
func recorder(cfg Config, infos []shard.Info) func(shard.Info) {
	if cfg.NoIndexStore {
		return nil
	}
	store := openStore(cfg.IndexDir, cfg.Logf)
	if store == nil {
		return nil
	}
	warn := func(err error) {
		storeWarning.Do(func() { cfg.Logf("shardload: warning: %v (entries are not kept for the next run)", err) })
	}
	var mu sync.Mutex
	entries := slices.Clone(infos)
	at := make(map[string]int, len(infos))
	pending := 0
	for i, in := range infos {
		if in.Estimated {
			at[in.URL] = i
			pending++
		}
	}
	return func(info shard.Info) {
		if err := store.Put(info); err != nil {
			warn(err)
		}
		mu.Lock()
		defer mu.Unlock()
		i, ok := at[info.URL]
		if !ok {
			return
		}
		delete(at, info.URL)
		entries[i] = info
		if pending--; pending == 0 {
			if err := store.PutSet(entries); err != nil {
				warn(err)
			}
		}
	}
}
