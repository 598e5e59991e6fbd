package shardload_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/plan"
)

// mixStreams writes 50 shards of 100 small samples and returns stream A (the first
// 10 shards, 1,000 samples) and B (the other 40), and the shards' directory.
func mixStreams(t *testing.T) (a, b []string, dir string) {
	t.Helper()
	dir = t.TempDir()
	paths, err := shardgen.Generate(dir, shardgen.Spec{Shards: 50, SamplesPerShard: 100,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 100, MaxBytes: 400}, {Ext: "cls", Kind: shardgen.Class}}})
	if err != nil {
		t.Fatal(err)
	}
	return paths[:10], paths[10:], dir
}

// inA reports whether a key is one of stream A's (shards 0-9).
func inA(key string) bool { return key < "s000010" }

// readEpoch reads a loader's epoch and returns its keys in order.
func readEpoch(t *testing.T, cfg shardload.Config) []string {
	t.Helper()
	batches, _, _ := run(t, cfg)
	var keys []string
	for _, b := range batches {
		keys = append(keys, b...)
	}
	return keys
}

// TestMixedEpochs: two streams of 1,000 and 4,000 samples at 1:1 in epochs of 2,000
// through Open: 1,000 of each, none twice; B's samples over 4 epochs once each;
// every 256 samples hold A at 0.35-0.65; two ranks read what one reads; a state
// after 10 batches resumes the rest exactly; the first epoch counts the shards.
func TestMixedEpochs(t *testing.T) {
	a, b, _ := mixStreams(t)
	cfg := shardload.Config{Streams: []shardload.Stream{{URLs: a, Weight: 1}, {URLs: b, Weight: 1}}, EpochSamples: 2000,
		BatchSize: 16, Seed: 3, NoIndexStore: true}
	seenB := map[string]int{}
	for epoch := range 4 {
		cfg.Epoch = epoch
		keys := readEpoch(t, cfg)
		if len(keys) != 2000 {
			t.Fatalf("epoch %d: %d samples", epoch, len(keys))
		}
		seen := map[string]bool{}
		nA := 0
		for _, k := range keys {
			if seen[k] {
				t.Fatalf("epoch %d: %s twice", epoch, k)
			}
			seen[k] = true
			if inA(k) {
				nA++
			} else {
				seenB[k]++
			}
		}
		if nA != 1000 {
			t.Fatalf("epoch %d: %d of A", epoch, nA)
		}
		if lo, hi := testutil.WindowCounts(keys, 256, inA); lo < 90 || hi > 166 {
			t.Fatalf("epoch %d: 256 consecutive samples hold %d to %d of A", epoch, lo, hi)
		}
	}
	if len(seenB) != 4000 {
		t.Fatalf("B: %d distinct samples in 4 epochs", len(seenB))
	}

	cfg.Epoch = 1
	one := readEpoch(t, cfg)
	var two []string
	for r := range 2 {
		c := cfg
		c.Rank, c.World = r, 2
		two = append(two, readEpoch(t, c)...)
	}
	// The same samples (the window the two share is split by items, each rank
	// yielding its runs in the window's order).
	if strings.Join(slices.Sorted(slices.Values(one)), " ") != strings.Join(slices.Sorted(slices.Values(two)), " ") {
		t.Fatal("two ranks read another epoch than one")
	}
	batches, states, _ := run(t, cfg)
	c := cfg
	c.Resume = &states[10]
	rest, _, _ := run(t, c)
	if len(rest) != len(batches)-10 {
		t.Fatalf("resumed after 10 of %d batches: %d batches", len(batches), len(rest))
	}
	for i := range rest {
		if strings.Join(rest[i], " ") != strings.Join(batches[10+i], " ") {
			t.Fatalf("resumed after 10 batches: batch %d differs", 10+i)
		}
	}

	// Other weights mid-epoch: refused; at the start of an epoch: a curriculum.
	c.Streams = []shardload.Stream{{URLs: a, Weight: 1}, {URLs: b, Weight: 3}}
	if _, err := shardload.Open(context.Background(), c); !errors.Is(err, shardload.ErrResume) {
		t.Fatalf("resumed mid-epoch under other weights: %v", err)
	}
	next := states[len(states)-1].NextEpoch()
	c.Resume, c.Epoch = &next, 0
	keys := readEpoch(t, c)
	nA := 0
	for _, k := range keys {
		if inA(k) {
			nA++
		}
	}
	if nA != 500 || len(keys) != 2000 {
		t.Fatalf("epoch 2 at 1:3: %d samples, %d of A", len(keys), nA)
	}
}

// TestMixBatchingThroughOpen: stratified batches of 16 at 3:1 hold 12 + 4 rows;
// per_stream batches one stream each; one stream of weight 1 is the plain job.
func TestMixBatchingThroughOpen(t *testing.T) {
	a, b, _ := mixStreams(t)
	for _, kind := range []plan.Batching{plan.Stratified, plan.PerStream} {
		cfg := shardload.Config{Streams: []shardload.Stream{{URLs: b, Weight: 3}, {URLs: a, Weight: 1}}, Batching: kind,
			BatchSize: 16, Seed: 9, NoIndexStore: true}
		batches, _, _ := run(t, cfg)
		for i, keys := range batches {
			nA := 0
			for _, k := range keys {
				if inA(k) {
					nA++
				}
			}
			if kind == plan.Stratified && nA != 4 || kind == plan.PerStream && nA != 0 && nA != 16 || len(keys) != 16 {
				t.Fatalf("%s: batch %d holds %d of A in %d rows", kind, i, nA, len(keys))
			}
		}
	}
	plain := readEpoch(t, shardload.Config{URLs: []string{filepath.Join(filepath.Dir(a[0]), "train-{000000..000009}.tar")}, BatchSize: 16, Seed: 9, NoIndexStore: true, CountFirst: true})
	one := readEpoch(t, shardload.Config{Streams: []shardload.Stream{{URLs: a, Weight: 1}}, BatchSize: 16, Seed: 9, NoIndexStore: true, CountFirst: true})
	if strings.Join(plain, " ") != strings.Join(one, " ") {
		t.Fatal("one stream of weight 1 reads another order than its URLs")
	}
}

// TestMixStats: Stats.Streams counts each stream's samples and bytes.
func TestMixStats(t *testing.T) {
	a, b, _ := mixStreams(t)
	ctx := context.Background()
	l, err := shardload.Open(ctx, shardload.Config{Streams: []shardload.Stream{{URLs: a, Choose: 300}, {URLs: b, Choose: 500}},
		BatchSize: 16, NoIndexStore: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	nA := 0
	for b, err := range l.All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range b.Keys() {
			if inA(k) {
				nA++
			}
		}
	}
	st := l.Stats()
	if len(st.Streams) != 2 || st.Streams[0].Samples != int64(nA) || st.Streams[1].Samples != 800-int64(nA) || nA != 300 {
		t.Fatalf("streams %+v; read %d of A", st.Streams, nA)
	}
	if st.Streams[0].BytesIn <= 0 || st.Streams[1].BytesIn <= 0 || st.Streams[0].BytesIn+st.Streams[1].BytesIn != st.BytesIn {
		t.Fatalf("streams %+v: bytes do not add up to %d", st.Streams, st.BytesIn)
	}
	if p := l.Plan(); len(p.Streams) != 2 || p.Streams[0] != 300 || p.Streams[1] != 500 {
		t.Fatalf("plan's streams %v", p.Streams)
	}
}
