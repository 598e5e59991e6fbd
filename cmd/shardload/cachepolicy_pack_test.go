package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload/internal/testutil"
)

// tokenShards writes n equal tar shards of 16 documents of 512 int32 tokens (a
// tokens.npy member each) and returns their directory and the size of one.
func tokenShards(t *testing.T, n int) (string, int64) {
	return equalShards(t, n, "tok-%03d.tar", func(s, i int) (string, []byte) {
		var data []byte
		for j := range 512 {
			data = binary.LittleEndian.AppendUint32(data, uint32(1+s*10000+i*512+j))
		}
		return fmt.Sprintf("d%03d-%02d.tokens.npy", s, i), testutil.NPY(1, "<i4", false, []int{512}, data)
	})
}

// The case --cache-policy order is for, with packed token streams (bench --pack),
// end to end: 96 indexed token shards on a store (served over HTTP, so that the
// cache reads them through), a cache whose disk holds half of them, 4 epochs each
// reshuffled, read ahead by a small part of the dataset (--memory 1MiB: 512 KiB, a
// tenth of it; a job's 64 MiB is a far smaller part of its corpus). bench announces
// each epoch's reads of its shards (each at its first and its last) before its
// first read; by next use the epochs after the first fetch well below what LRU
// fetches again (LRU: 0.83-0.86 of the dataset an epoch here, order 0.54-0.59).
func TestCachePolicyOrderFetchesLessPacked(t *testing.T) {
	const shards, epochs = 96, 4
	dir, size := tokenShards(t, shards)
	storeURL, served := servedStore(t, dir) // served: bytes the store sent
	dataset := float64(int64(shards) * size)
	pattern := fmt.Sprintf("%s/tok-{000..%03d}.tar", storeURL, shards-1)
	idx := filepath.Join(t.TempDir(), "tok.index")
	if code, _, stderr := runCLI(t, "index", "--no-index-store", "--output", idx, pattern); code != 0 {
		t.Fatalf("index: exit %d: %s", code, stderr)
	}

	fetched := map[string]float64{}
	announced := map[string]int64{}
	for _, policy := range []string{"order", "lru"} {
		var lf loaderFlags
		fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
		lf.register(fs, true)
		args := []string{"--cache-dir", t.TempDir(), "--cache-disk", fmt.Sprint(int64(dataset) / 2), "--cache-policy", policy,
			"--batch-size", "2", "--seed", "7", "--open-shards", "2", "--memory", "1MiB", "--no-index-store", "--index", idx, pattern}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		cfg, err := lf.config(fs.Args(), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if lf.rf.cache == nil {
			t.Fatal("no cache")
		}
		start := served.Load()
		var out bytes.Buffer
		if err := runPackedBench(context.Background(), cfg, "tokens.npy:256", epochs, 0, 0, true, &out); err != nil {
			t.Fatal(err)
		}
		fetched[policy] = float64(served.Load()-start) / dataset
		if h := lf.rf.cache; h != nil {
			st := h.Stats()
			t.Logf("%s: %.3f datasets fetched in %d epochs; declined %d, evicted %d; %s", policy, fetched[policy], epochs, st.Declined, st.Evicted, bytes.TrimSpace(out.Bytes()))
		}
		var rep packReport
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Rows == 0 || rep.Epochs != epochs {
			t.Fatalf("%s: %d rows in %d epochs", policy, rep.Rows, rep.Epochs)
		}
		if rep.Hints != nil {
			announced[policy] = rep.Hints.ShardEpochs
		}
		lf.rf.closeCache()
	}
	if announced["order"] != int64(shards*epochs) {
		t.Errorf("order: %d shards announced over the epochs, want %d (each epoch's every shard once)", announced["order"], shards*epochs)
	}
	// The first epoch fetches the dataset under either policy; the rest is what the
	// policy fetches again.
	order, lru := fetched["order"]-1, fetched["lru"]-1
	if order > 0.85*lru || order/(epochs-1) > 0.72 {
		t.Errorf("after the first epoch, by next use %.3f datasets fetched (%.3f an epoch), by LRU %.3f: want well below", order, order/(epochs-1), lru)
	}
}
