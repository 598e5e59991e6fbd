package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/cache"
)

// cacheBench is a store of n equal shards served over HTTP (so that the cache
// reads them through), counting the bytes it sends, and the flags of a bench
// over them with a cache of the given flags.
type cacheBench struct {
	served  atomic.Int64
	dataset int64
	pattern string
}

func newCacheBench(t *testing.T, shards int) *cacheBench {
	dir, size := policyShards(t, shards)
	cb := &cacheBench{dataset: int64(shards) * size}
	files := http.FileServer(http.Dir(dir))
	store := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		files.ServeHTTP(servedCounter{w, &cb.served}, r)
	}))
	t.Cleanup(store.Close)
	cb.pattern = fmt.Sprintf("%s/shard-{000..%03d}.tar", store.URL, shards-1)
	return cb
}

// config returns bench's Config and flags for the store with the cache flags given.
func (cb *cacheBench) config(t *testing.T, cacheFlags ...string) (shardload.Config, *loaderFlags) {
	t.Helper()
	var lf loaderFlags
	fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
	lf.register(fs, true)
	args := append([]string{"--cache-dir", t.TempDir(), "--batch-size", "16", "--seed", "7", "--no-index-store", "--autotune=false",
		"--index-dir", t.TempDir()}, cacheFlags...)
	if err := fs.Parse(append(args, cb.pattern)); err != nil {
		t.Fatal(err)
	}
	cfg, err := lf.config(fs.Args(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if lf.rf.cache == nil {
		t.Fatal("no cache")
	}
	t.Cleanup(lf.rf.closeCache)
	return cfg, &lf
}

// bench over a cache that holds the dataset in both tiers: the first epoch's bytes
// come from the store (the reads that found the sample counts included), the
// second's from the disk tier (and the fetches of the first still being committed),
// the third's from memory (which admits an entry on its second read from disk), none
// from the store. The report, its JSON, the cache's counters and the metrics bench
// --metrics serves agree.
func TestBenchCacheBytesByTier(t *testing.T) {
	cb := newCacheBench(t, 8)
	cfg, lf := cb.config(t, "--cache-disk", "64MiB", "--cache-memory", "64MiB")
	c := lf.rf.cache
	mon := &benchStats{world: 1, start: time.Now()}
	addr, stop, err := serveMetrics("127.0.0.1:0", false, mon.stats, c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	before := cb.served.Load()
	res, err := bench(context.Background(), cfg, 3, 0, 0, false, 0, mon)
	if err != nil {
		t.Fatal(err)
	}
	sent := cb.served.Load() - before
	if len(res.Cache) != 3 {
		t.Fatalf("cache figures of %d epochs, want 3: %+v", len(res.Cache), res.Cache)
	}
	t.Logf("dataset %d bytes, the store sent %d; epochs: %v", cb.dataset, sent, res.Cache)
	var sum cache.Bytes
	for i, e := range res.Cache {
		sum = sum.Add(e.Bytes)
		if e.Epoch != i {
			t.Errorf("cache_epochs[%d] is epoch %d", i, e.Epoch)
		}
	}
	// The first epoch reads the dataset from the store; the later ones from disk,
	// then memory. A whole-object fetch that a range read started in the background
	// may still be reading when the next epoch begins: that epoch then joins it
	// (Joined), and the first bytes of a shard sniffed before its fetch committed
	// (8 bytes, to see whether shards are compressed) come from the store: sniffs
	// are what a later epoch may take from the store, nothing more.
	const sniffs = 64
	if e := res.Cache[0]; e.Store < cb.dataset || e.HitRate > 0.3 { // the shards the open reads first (fields, counts), read again
		t.Errorf("epoch 0: %v, want the dataset's %d bytes from the store, and little else", e.Bytes, cb.dataset)
	}
	// Committing a fetch syncs its file: on a disk busy with other writes that can
	// outlast an epoch of these 8 small shards, and the epoch then reads every shard
	// from the fetches still committing (Joined), none from the tier. Which tier
	// served is timing; that the store sent nothing again is not.
	joined := res.Cache[1].Joined > 0
	if e := res.Cache[1]; e.Store > sniffs || e.Disk == 0 && !joined || e.HitRate < 0.999 {
		t.Errorf("epoch 1: %v (%d from the store), want bytes from disk, none from the store", e.Bytes, e.Store)
	}
	if e := res.Cache[2]; e.Store > sniffs || e.Memory == 0 && !joined || e.HitRate < 0.999 {
		t.Errorf("epoch 2: %v (%d from the store), want bytes from memory, none from the store", e.Bytes, e.Store)
	}
	if joined {
		t.Logf("epoch 1 joined fetches still committing: the tiers' rows are not checked")
	}
	if sum.Store != sent {
		t.Errorf("the epochs count %d bytes from the store, which sent %d", sum.Store, sent)
	}
	st := c.Stats()
	if st.BytesFetched != cb.dataset || st.StoreBytes() != sent {
		t.Errorf("the cache fetched %d bytes and read %d from the store, which sent %d; want the dataset's %d, all sent",
			st.BytesFetched, st.StoreBytes(), sent, cb.dataset)
	}
	if st.Served() != sum {
		t.Errorf("the cache served %v, the epochs %v", st.Served(), sum)
	}

	var report bytes.Buffer
	if err := res.report(&report); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("cache, epoch 0: %s", res.Cache[0].Bytes),
		fmt.Sprintf("cache, epoch 1: %s", res.Cache[1].Bytes),
		fmt.Sprintf("cache, epoch 2: %s", res.Cache[2].Bytes),
		// (A later epoch's line names the fetches it joined, if any, before its
		// hit rate: the lines above are each epoch's own.)
		"MB from the store", "MB from disk", "(hit rate 100.0%)",
	} {
		if !strings.Contains(report.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, report.String())
		}
	}
	js, _ := json.Marshal(res)
	var back struct {
		Cache []map[string]float64 `json:"cache_epochs"`
	}
	if err := json.Unmarshal(js, &back); err != nil || len(back.Cache) != 3 {
		t.Fatalf("JSON cache_epochs: %s, %v", js, err)
	}
	if e := back.Cache[2]; e["memory_bytes"] != float64(res.Cache[2].Memory) || e["store_bytes"] != 0 || e["hit_rate"] != 1 || e["epoch"] != 2 {
		t.Errorf("JSON cache_epochs[2]: %v", e)
	}

	fams, _, err := scrapeMetrics(context.Background(), "http://"+addr+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		name   string
		labels []string
		want   int64
	}{
		{"shardload_cache_served_bytes_total", []string{"from", "store"}, sent},
		{"shardload_cache_served_bytes_total", []string{"from", "disk"}, sum.Disk},
		{"shardload_cache_served_bytes_total", []string{"from", "memory"}, sum.Memory},
		{"shardload_cache_served_bytes_total", []string{"from", "joined"}, sum.Joined},
		{"shardload_cache_store_bytes_total", []string{"how", "fetch"}, st.BytesFetched},
		{"shardload_cache_store_bytes_total", []string{"how", "bypass"}, st.BytesBypassed},
		{"shardload_session_cache_bytes_total", []string{"session", "0", "from", "store"}, sum.Store},
		{"shardload_session_cache_bytes_total", []string{"session", "0", "from", "disk"}, sum.Disk},
		{"shardload_session_cache_bytes_total", []string{"session", "0", "from", "memory"}, sum.Memory},
		{"shardload_session_cache_bytes_total", []string{"session", "0", "from", "joined"}, sum.Joined},
	} {
		if got := counter(fams, m.name, m.labels...); got != float64(m.want) {
			t.Errorf("%s%v = %v, want %d", m.name, m.labels, got, m.want)
		}
	}
}

// bench over a disk cache of half the dataset, four reshuffled epochs: each epoch
// after the first is served in part from disk and in part from the store, and the
// store bytes bench reports add up to what the store sent.
func TestBenchCacheBytesHalfTheDataset(t *testing.T) {
	const epochs = 4
	cb := newCacheBench(t, 24)
	cfg, lf := cb.config(t, "--cache-disk", fmt.Sprint(cb.dataset/2))
	before := cb.served.Load()
	res, err := bench(context.Background(), cfg, epochs, 0, 0, false, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	sent := cb.served.Load() - before
	if len(res.Cache) != epochs {
		t.Fatalf("cache figures of %d epochs, want %d", len(res.Cache), epochs)
	}
	var store int64
	for _, e := range res.Cache {
		t.Logf("epoch %d: %v (%.2f of the dataset from the store)", e.Epoch, e.Bytes, float64(e.Store)/float64(cb.dataset))
		store += e.Store
		if e.Epoch > 0 && (e.Store == 0 || e.Disk == 0) {
			t.Errorf("epoch %d: %v, want bytes from both the store and the disk tier", e.Epoch, e.Bytes)
		}
		if e.Memory != 0 {
			t.Errorf("epoch %d: %d bytes from memory, with no memory tier", e.Epoch, e.Memory)
		}
	}
	st := lf.rf.cache.Stats()
	t.Logf("the store sent %d bytes; the cache read %d (fetched %d, bypassed %d); the epochs' reads %d from the store",
		sent, st.StoreBytes(), st.BytesFetched, st.BytesBypassed, store)
	if st.StoreBytes() != sent {
		t.Errorf("the cache read %d bytes from the store, which sent %d", st.StoreBytes(), sent)
	}
	if store != sent {
		t.Errorf("the epochs' reads took %d bytes from the store, which sent %d", store, sent)
	}
}

// top's cache columns: the hit rate and the store's MB/s over the interval, per
// session (from its tally) and for the node (from the cache's counters).
func TestTopCacheColumns(t *testing.T) {
	before := parseText(t, `# TYPE shardload_session_samples_total counter
shardload_session_samples_total{rank="0",session="1"} 0
shardload_session_samples_total{rank="1",session="2"} 0
# TYPE shardload_session_cache_bytes_total counter
shardload_session_cache_bytes_total{from="store",rank="0",session="1"} 1e6
shardload_session_cache_bytes_total{from="disk",rank="0",session="1"} 0
# TYPE shardload_cache_served_bytes_total counter
shardload_cache_served_bytes_total{from="store"} 1e6
shardload_cache_served_bytes_total{from="memory"} 0
shardload_cache_served_bytes_total{from="disk"} 0
shardload_cache_served_bytes_total{from="joined"} 0
# TYPE shardload_cache_store_bytes_total counter
shardload_cache_store_bytes_total{how="fetch"} 1e6
shardload_cache_store_bytes_total{how="bypass"} 0
`)
	after := parseText(t, `# TYPE shardload_session_samples_total counter
shardload_session_samples_total{rank="0",session="1"} 100
shardload_session_samples_total{rank="1",session="2"} 100
# TYPE shardload_session_cache_bytes_total counter
shardload_session_cache_bytes_total{from="store",rank="0",session="1"} 3e6
shardload_session_cache_bytes_total{from="disk",rank="0",session="1"} 4e6
shardload_session_cache_bytes_total{from="memory",rank="0",session="1"} 2e6
# TYPE shardload_cache_served_bytes_total counter
shardload_cache_served_bytes_total{from="store"} 3e6
shardload_cache_served_bytes_total{from="memory"} 2e6
shardload_cache_served_bytes_total{from="disk"} 4e6
shardload_cache_served_bytes_total{from="joined"} 2e6
# TYPE shardload_cache_store_bytes_total counter
shardload_cache_store_bytes_total{how="fetch"} 4e6
shardload_cache_store_bytes_total{how="bypass"} 1e6
`)
	rows, total := topView(before, after, 2*time.Second)
	if len(rows) != 2 {
		t.Fatalf("rows %+v", rows)
	}
	// Session 1: 2 MB from the store of 8 MB served in 2 s.
	if r := rows[0]; !r.cached || r.hit != 0.75 || r.storeMBPerSec != 1 {
		t.Errorf("session 1: %+v, want hit 0.75, 1 MB/s from the store", r)
	}
	// Session 2 read nothing through a cache.
	if r := rows[1]; r.cached {
		t.Errorf("session 2: %+v, want no cache figures", r)
	}
	// The node: 2 MB of 10 MB served from the store; the store sent 4 MB.
	if !total.cached || total.hit != 0.8 || total.storeMBPerSec != 2 {
		t.Errorf("total %+v, want hit 0.8, 2 MB/s from the store", total)
	}
	var b bytes.Buffer
	writeTop(&b, rows, total)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || !strings.Contains(lines[0], "cache hit") || !strings.HasSuffix(strings.TrimSpace(lines[1]), "75.0%         1.0") ||
		!strings.HasSuffix(strings.TrimSpace(lines[2]), "-           -") || !strings.HasSuffix(strings.TrimSpace(lines[3]), "80.0%         2.0") {
		t.Errorf("view:\n%s", b.String())
	}
}
