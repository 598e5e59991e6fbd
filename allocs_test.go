package shardload_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/shard"
)

// TestAllocationsPerSample: what an epoch allocates for each sample it reads, the
// loader's start and the shards' opening set apart (the difference between two
// datasets of as many shards, one with ten times the samples of the other), the
// shards counted before, as an index gives them. The hot path allocates nothing of
// its own per sample: its items, buffers and messages are recycled, and its
// members' names are carved from shared chunks. One allocation more a sample fails
// the test (so did the three it found: a queue message and a looked-for error, moved
// to the heap for every sample, and a string for every member's name).
func TestAllocationsPerSample(t *testing.T) {
	if testing.CoverMode() != "" || testutil.Race {
		t.Skip("allocation counts differ under -cover and -race (make test runs it without)")
	}
	fields := []shardgen.Field{{Ext: "npy", Kind: shardgen.Tokens, Tokens: 64}, {Ext: "cls", Kind: shardgen.Class}}
	const shards, small, large = 4, 300, 3000
	for _, c := range []struct {
		name string
		comp shard.Compression
	}{{"tar", shard.None}, {"zstd", shard.Zstd}} {
		t.Run(c.name, func(t *testing.T) {
			mallocs := func(samples int) uint64 {
				paths, err := shardgen.Generate(t.TempDir(), shardgen.Spec{Shards: shards, SamplesPerShard: samples, Fields: fields, Compression: c.comp, Seed: 5})
				if err != nil {
					t.Fatal(err)
				}
				cfg := shardload.Config{URLs: paths, NoIndexStore: true, BatchSize: 32, NoAutotune: true, NoLock: true,
					Fields: []decode.Field{mustField(t, "tokens=npy:npy:int32:64"), mustField(t, "label=cls:int")}}
				// Counted first, as an index gives them: the epoch alone is measured.
				if cfg.Shards, err = shardload.Count(context.Background(), cfg); err != nil {
					t.Fatal(err)
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				l, err := shardload.Open(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for b, err := range l.All(context.Background()) {
					if err != nil {
						t.Fatal(err)
					}
					n += b.Layout.Rows
				}
				l.Close()
				runtime.ReadMemStats(&after)
				if n != shards*samples {
					t.Fatalf("%d samples, want %d", n, shards*samples)
				}
				return after.Mallocs - before.Mallocs
			}
			m0, m1 := mallocs(small), mallocs(large)
			per := float64(int64(m1)-int64(m0)) / float64(shards*(large-small))
			t.Logf("%d allocations for %d samples, %d for %d: %.2f a sample", m0, shards*small, m1, shards*large, per)
			// Less than one: what the item pool misses (a sync.Pool, emptied by the
			// collector), what each batch allocates, shared by its 32 rows, and the
			// names' chunks, shared by about 200 names.
			if want := 1.0; per > want {
				t.Errorf("%.2f allocations a sample, want at most %.0f", per, want)
			}
		})
	}
}
