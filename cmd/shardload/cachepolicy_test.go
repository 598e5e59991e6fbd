package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/serve"
)

// --cache-policy sets the cache's eviction policy; order is the default.
func TestCachePolicyFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want cache.Policy
		bad  bool
	}{
		{nil, cache.PolicyOrder, false},
		{[]string{"--cache-policy", "lru"}, cache.PolicyLRU, false},
		{[]string{"--cache-policy=ORDER"}, cache.PolicyOrder, false},
		{[]string{"--cache-policy", "mru"}, 0, true},
	} {
		var rf readFlags
		fs := pflag.NewFlagSet("warm", pflag.ContinueOnError)
		rf.register(fs)
		if err := fs.Parse(append([]string{"--cache-dir", t.TempDir()}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		opts, err := rf.cacheOptions()
		if tc.bad {
			if err == nil {
				t.Errorf("%q: no error", tc.args)
			}
			continue
		}
		if err != nil || opts.Policy != tc.want {
			t.Errorf("%q: policy %v, %v; want %v", tc.args, opts.Policy, err, tc.want)
		}
	}
}

// policyShards writes n shards of equal size (16 samples of 4 KiB each) and
// returns their directory and the size of one.
func policyShards(t *testing.T, n int) (string, int64) {
	return equalShards(t, n, "shard-%03d.tar", func(s, i int) (string, []byte) {
		return fmt.Sprintf("s%03d-%02d.bin", s, i), bytes.Repeat([]byte{byte(s), byte(i)}, 2048)
	})
}

// equalShards writes n tar shards named by name (a format of the shard's number),
// each of 16 members member(shard, i) gives, and returns their directory and the
// size of the last.
func equalShards(t *testing.T, n int, name string, member func(s, i int) (string, []byte)) (string, int64) {
	dir := t.TempDir()
	var size int64
	for s := range n {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for i := range 16 {
			m, data := member(s, i)
			if err := tw.WriteHeader(&tar.Header{Name: m, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
				t.Fatal(err)
			}
			tw.Write(data)
		}
		tw.Close()
		size = int64(buf.Len())
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf(name, s)), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, size
}

// servedStore serves the files of dir over HTTP (so that a cache reads them
// through) and counts the body bytes it sends.
func servedStore(t *testing.T, dir string) (url string, served *atomic.Int64) {
	served = new(atomic.Int64)
	files := http.FileServer(http.Dir(dir))
	store := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		files.ServeHTTP(servedCounter{w, served}, r)
	}))
	t.Cleanup(store.Close)
	return store.URL, served
}

// The case --cache-policy order is for, end to end: 24 equal shards on a store
// (local files served over HTTP, so that the cache reads them through), a cache
// whose disk holds half of them, 4 epochs each reshuffled. The loader announces
// each epoch's reads as bench and serve do (serve.EpochHints); by next use the
// epochs after the first fetch well below what LRU fetches again, and the batches
// are the same under both policies.
func TestCachePolicyOrderFetchesLess(t *testing.T) {
	const shards, epochs = 24, 4
	dir, size := policyShards(t, shards)
	storeURL, served := servedStore(t, dir) // served: bytes the store sent
	dataset := float64(shards * size)
	pattern := fmt.Sprintf("%s/shard-{000..%03d}.tar", storeURL, shards-1)

	setup := func(policy string) (shardload.Config, *loaderFlags) {
		var lf loaderFlags
		fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
		lf.register(fs, true)
		args := []string{"--cache-dir", t.TempDir(), "--cache-disk", fmt.Sprint(int64(dataset) / 2), "--cache-policy", policy,
			"--batch-size", "16", "--seed", "7", "--no-index-store", "--autotune=false", "--index-dir", t.TempDir(), pattern}
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
		return cfg, &lf
	}

	frac := map[string][]float64{}
	keys := map[string][][]string{}
	for _, policy := range []string{"order", "lru"} {
		cfg, lf := setup(policy)
		c := lf.rf.cache
		start := served.Load()
		hints := serve.NewEpochHints("test", t.Logf)
		for e := range epochs {
			before := served.Load()
			ecfg := cfg
			ecfg.Epoch = e
			ecfg.Planned = func(p plan.Plan) { hints.OpenPlan(p, ecfg.Sources) }
			l, err := shardload.Open(context.Background(), ecfg)
			if err != nil {
				t.Fatal(err)
			}
			hints.Open(l, ecfg.Sources) // announced already: does nothing
			var ek []string
			for n := 1; ; n++ {
				b, err := l.Next(context.Background())
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				ek = append(ek, b.Keys()...)
				b.Release()
				hints.Batch(n)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			keys[policy] = append(keys[policy], ek)
			frac[policy] = append(frac[policy], float64(served.Load()-before)/dataset)
		}
		hints.Close()
		if n := hints.Stats().ShardEpochs; policy == "order" && n != shards*epochs {
			t.Errorf("%s: %d shards announced over the epochs, want %d (each epoch once)", policy, n, shards*epochs)
		}
		st := c.Stats()
		if st.BytesFetched+st.BytesBypassed > served.Load()-start {
			t.Errorf("%s: the cache read %d bytes from the store, which sent %d", policy, st.BytesFetched+st.BytesBypassed, served.Load()-start)
		}
		t.Logf("%s: fetched per epoch (fraction of the dataset) %.3f; declined %d, evicted %d", policy, frac[policy], st.Declined, st.Evicted)
		lf.rf.closeCache()
	}
	for e := range epochs {
		if !slices.Equal(keys["order"][e], keys["lru"][e]) {
			t.Errorf("epoch %d: the batches differ between the policies", e)
		}
		if len(keys["order"][e]) != shards*16 {
			t.Errorf("epoch %d: %d samples, want %d", e, len(keys["order"][e]), shards*16)
		}
		if e > 0 && slices.Equal(keys["order"][e], keys["order"][e-1]) {
			t.Errorf("epoch %d: not reshuffled", e)
		}
	}
	var order, lru float64
	for e := 1; e < epochs; e++ {
		order += frac["order"][e]
		lru += frac["lru"][e]
		if frac["order"][e] > 0.65 {
			t.Errorf("epoch %d: by next use %.3f of the dataset fetched, want at most 0.65", e, frac["order"][e])
		}
	}
	if order > 0.8*lru {
		t.Errorf("after the first epoch, by next use %.3f datasets fetched, by LRU %.3f: want well below", order, lru)
	}

	// bench itself, 4 epochs in one run: its hints fetch less than LRU.
	fetched := map[string]float64{}
	for _, policy := range []string{"order", "lru"} {
		cfg, lf := setup(policy)
		start := served.Load()
		if _, err := bench(context.Background(), cfg, epochs, 0, 0, false, 0, nil); err != nil {
			t.Fatal(err)
		}
		fetched[policy] = float64(served.Load()-start) / dataset
		lf.rf.closeCache()
	}
	t.Logf("bench --epochs %d: fetched %.3f datasets by next use, %.3f by LRU", epochs, fetched["order"], fetched["lru"])
	if fetched["order"] >= fetched["lru"] {
		t.Errorf("bench: by next use %.3f datasets fetched, by LRU %.3f", fetched["order"], fetched["lru"])
	}
}

// servedCounter counts the body bytes written to a response.
type servedCounter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w servedCounter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n.Add(int64(n))
	return n, err
}
