package shardload_test

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
)

// With sample offsets a rank whose part starts inside a shard reads from its first
// sample: every rank yields exactly the samples it yields without offsets, in the same
// order, and the ranks together read the dataset about once (at world 64 over 4
// shards of 1,000 samples, without offsets, each rank reads its shard up to its part:
// many times the dataset).
func TestOffsetsReadEachSampleOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("reads 4,000 samples 2 x 76 times")
	}
	ctx := context.Background()
	paths, err := shardgen.Generate(t.TempDir(), shardgen.Spec{Shards: 4, SamplesPerShard: 1000, Seed: 5,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 200, MaxBytes: 2000}, {Ext: "cls", Kind: shardgen.Class}}})
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, p := range paths {
		fi, _ := os.Stat(p)
		total += fi.Size()
	}
	infos, err := shardload.Count(ctx, shardload.Config{URLs: paths, IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	bare := slices.Clone(infos)
	for i := range bare {
		if len(bare[i].Offsets) != 1000 {
			t.Fatalf("shard %d: %d offsets", i, len(bare[i].Offsets))
		}
		bare[i].Offsets = nil
	}
	for _, world := range []int{1, 3, 8, 64} {
		var with, without int64
		for rank := range world {
			run := func(shards []shard.Info) ([]string, int64) {
				l, err := shardload.Open(ctx, shardload.Config{Shards: shards, Rank: rank, World: world, BatchSize: 16, Seed: 3,
					NoLock: true, Slabs: 2, SlabBytes: 1 << 20})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				var keys []string
				for b, err := range l.All(ctx) {
					if err != nil {
						t.Fatalf("world %d rank %d: %v", world, rank, err)
					}
					keys = append(keys, b.Keys()...)
				}
				return keys, l.Stats().BytesIn
			}
			got, n := run(infos)
			want, m := run(bare)
			if !slices.Equal(got, want) {
				t.Fatalf("world %d rank %d: with offsets the samples differ (%d vs %d)", world, rank, len(got), len(want))
			}
			with += n
			without += m
		}
		ratio, ratioBefore := float64(with)/float64(total), float64(without)/float64(total)
		t.Logf("world %d: the ranks read %.2fx the dataset with offsets, %.2fx without", world, ratio, ratioBefore)
		if ratio > 1.1 {
			t.Errorf("world %d: the ranks read %.2fx the dataset's %d bytes with offsets", world, ratio, total)
		}
	}
}

// Two processes on one node, or on two nodes with an index beside the shards, plan
// the same epoch: the counts from the store and from the index object give the
// Order of a fresh count.
func TestIndexSourcesAgree(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	paths, err := shardgen.Generate(dir, shardgen.Spec{Shards: 5, Samples: []int{9, 3, 14}, Seed: 8})
	if err != nil {
		t.Fatal(err)
	}
	cfg := shardload.Config{URLs: paths, NoIndexStore: true, World: 3, BatchSize: 4}
	open := func(cfg shardload.Config) shardload.Order {
		t.Helper()
		l, err := shardload.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Order()
	}
	fresh := open(cfg)
	store := t.TempDir()
	cfg.NoIndexStore, cfg.IndexDir = false, store
	first, second := open(cfg), open(cfg)
	infos, err := shardload.Count(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Create(dir + "/" + index.FileName)
	index.Write(f, infos, true)
	f.Close()
	cfg.IndexDir = t.TempDir() // another node
	beside := open(cfg)
	for name, o := range map[string]shardload.Order{"store, first": first, "store, second": second, "beside": beside} {
		if d := fresh.Diff(o); len(d) > 0 {
			t.Errorf("%s: the order differs in %v", name, d)
		}
	}
}
