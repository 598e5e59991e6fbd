package shardload_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// statCounting is the file backend, counting its Stats.
type statCounting struct {
	source.File
	stats atomic.Int64
}

func (s *statCounting) Stat(ctx context.Context, url string) (source.Info, error) {
	s.stats.Add(1)
	return s.File.Stat(ctx, url)
}

// Shards whose size and version are known (an index's entries, Shards) are read
// in one request each, pinned to that version: the epoch asks the store for no
// Stat of its own.
func TestShardsReadWithoutStats(t *testing.T) {
	paths, want := dataset(t, 4, nil, shard.None)
	src := &statCounting{}
	reg := &source.Registry{}
	reg.Register("file", source.NewFetcher(src, source.FetchOptions{}))
	cfg := shardload.Config{URLs: paths, Sources: reg, Fields: []decode.Field{mustField(t, "txt"), mustField(t, "cls")}, BatchSize: 4, Seed: 3, NoIndexStore: true, CountFirst: true}
	infos, err := shardload.Shards(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Shards, cfg.URLs = infos, nil
	before := src.stats.Load()
	keys, _ := epochKeys(t, cfg, want)
	if len(keys) != len(want) {
		t.Fatalf("%d samples, want %d", len(keys), len(want))
	}
	if n := src.stats.Load() - before; n != 0 {
		t.Errorf("%d Stats while reading %d shards of known size and version", n, len(infos))
	}
}
