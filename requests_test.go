package shardload_test

import (
	"context"
	"io"
	"reflect"
	"sync/atomic"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/plan"
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

// knownShards returns the config of an epoch of 4 local shards read through src,
// their counts, sizes and versions given (cfg.Shards), and the samples' bytes.
func knownShards(t *testing.T, src source.Source) (shardload.Config, map[string]map[string][]byte) {
	t.Helper()
	paths, want := dataset(t, 4, nil, shard.None)
	reg := &source.Registry{}
	reg.Register("file", source.NewFetcher(src, source.FetchOptions{}))
	cfg := shardload.Config{URLs: paths, Sources: reg, Fields: []decode.Field{mustField(t, "txt"), mustField(t, "cls")}, BatchSize: 4, Seed: 3, NoIndexStore: true, CountFirst: true}
	infos, err := shardload.Shards(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Shards, cfg.URLs = infos, nil
	return cfg, want
}

// Shards whose size and version are known (an index's entries, Shards) are read
// in one request each, pinned to that version: the epoch asks the store for no
// Stat of its own.
func TestShardsReadWithoutStats(t *testing.T) {
	src := &statCounting{}
	cfg, want := knownShards(t, src)
	infos := cfg.Shards
	before := src.stats.Load()
	keys, _ := epochKeys(t, cfg, want)
	if len(keys) != len(want) {
		t.Fatalf("%d samples, want %d", len(keys), len(want))
	}
	if n := src.stats.Load() - before; n != 0 {
		t.Errorf("%d Stats while reading %d shards of known size and version", n, len(infos))
	}
}

// openCounting is the file backend, counting the streams it opens.
type openCounting struct {
	source.File
	opens atomic.Int64
}

func (s *openCounting) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	s.opens.Add(1)
	return s.File.Open(ctx, url)
}

func (s *openCounting) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	s.opens.Add(1)
	return s.File.OpenRange(ctx, url, off, length)
}

func (s *openCounting) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	s.opens.Add(1)
	return s.File.OpenVersion(ctx, url, version, off, length)
}

// Config.Planned is called once an epoch, with the plan the loader then reads
// (Loader.Plan), before any shard is opened for it: where a cache evicts by next
// use, the epoch's reads announced there count from its first read.
func TestPlannedBeforeTheFirstRead(t *testing.T) {
	src := &openCounting{}
	cfg, want := knownShards(t, src)
	for epoch := range 2 {
		cfg.Epoch = epoch
		wantPlan, err := shardload.PlanOf(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var plans []plan.Plan
		before := src.opens.Load()
		opened := int64(-1)
		cfg.Planned = func(p plan.Plan) {
			plans = append(plans, p)
			opened = src.opens.Load() - before
		}
		keys, _ := epochKeys(t, cfg, want)
		if len(plans) != 1 {
			t.Fatalf("epoch %d: Planned called %d times, want once", epoch, len(plans))
		}
		if opened != 0 {
			t.Errorf("epoch %d: %d shards opened before Planned", epoch, opened)
		}
		if !reflect.DeepEqual(plans[0], wantPlan) {
			t.Errorf("epoch %d: Planned's plan is not the epoch's", epoch)
		}
		if len(keys) != len(want) || src.opens.Load() == before {
			t.Errorf("epoch %d: %d samples read in %d opens, want %d", epoch, len(keys), src.opens.Load()-before, len(want))
		}
	}
}
