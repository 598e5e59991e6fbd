package index_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// BenchmarkIndexAtScale measures what one rank of a job of 80,000 (10,000 nodes of 8)
// holds and spends to plan its epoch from the index of a synthetic dataset of
// 10^6 shards of 100 samples of 100-120 KB ($SHARDLOAD_ATSCALE_SHARDS shards when
// set): Lookup.Quick and a plan, from an index of Write (every offset read: "whole")
// and from one of WriteAddressable with LazyOffsets and Plan ("lazy"). It reports
// the seconds, the peak Go heap above what the process held before (sampled every
// millisecond; garbage included, as the collector lets it grow), the peak resident
// set of the process while it plans (Linux: VmHWM, reset before; the process's own
// few MB included), the heap still held
// once the plan is made (the URLs, the shards and the plan, after a collection), the
// index file's bytes and the shards whose offsets were decoded. "lazy-members" is
// "lazy" over an index that holds each sample's members too (a jpg and a cls; format
// version 2): its counts are those of "lazy" (counts-MB), its blocks larger.
// The indexes are written once to $TMPDIR/shardload-atscale-s3-N/ and kept for later
// runs (a few minutes to write at 10^6 shards). Run each case in its own process:
//
//	go test -run '^$' -bench 'IndexAtScale/lazy' -benchtime 1x -timeout 30m ./index/
//	go test -run '^$' -bench 'IndexAtScale/whole' -benchtime 1x -timeout 30m ./index/
func BenchmarkIndexAtScale(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("SHARDLOAD_ATSCALE_SHARDS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	const samples = 100
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("shardload-atscale-s3-%d", n))
	// One rank of 80,000 (a few shards each), and one of 8 (an eighth of the
	// dataset: shards read whole, whose offsets a lazy lookup leaves unread).
	for _, c := range []struct {
		name        string
		lazy        bool
		members     bool
		world, rank int
	}{{"whole", false, false, 80_000, 12_345}, {"lazy", true, false, 80_000, 12_345}, {"lazy-world8", true, false, 8, 3}, {"lazy-members", true, true, 80_000, 12_345}} {
		world, rank := c.world, c.rank
		b.Run(c.name, func(b *testing.B) {
			path := atScaleIndex(b, dir, n, samples, c.lazy, c.members)
			st, err := os.Stat(path)
			if err != nil {
				b.Fatal(err)
			}
			reg := &source.Registry{}
			reg.Register("file", &source.File{})
			reg.Register("s3", memShards{})
			lk := index.Lookup{Sources: reg, Index: path, NoBeside: true, LazyOffsets: c.lazy}
			cfg := plan.Config{Seed: 1, Rank: rank, World: world, Shuffle: true, Lanes: 8, Window: 1000, BatchSize: 32, GapBytes: 1 << 20}
			planFn := func(infos []shard.Info) (plan.Plan, error) { return plan.New(infos, cfg) }
			var decoded int
			for b.Loop() {
				runtime.GC()
				debug.FreeOSMemory()
				rss := rssPeak()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				base := ms.HeapAlloc
				peak := heapPeak()
				start := time.Now()
				urls := make([]string, n)
				for i := range urls {
					urls[i] = atScaleURL(i)
				}
				infos, err := lk.Quick(context.Background(), urls, world)
				if err != nil {
					b.Fatal(err)
				}
				// As a loader plans from the shards it looked up itself.
				infos, p, err := index.PlanInPlace(context.Background(), infos, planFn)
				if err != nil {
					b.Fatal(err)
				}
				secs := time.Since(start).Seconds()
				max := peak()
				if r := rss(); r > 0 {
					b.ReportMetric(float64(r)/1e6, "peak-rss-MB")
				}
				decoded = 0
				for _, in := range infos {
					if in.Offsets != nil {
						decoded++
					}
				}
				b.ReportMetric(secs, "s/plan")
				b.ReportMetric(float64(max)/1e6, "peak-heap-MB")
				b.ReportMetric(float64(st.Size())/1e6, "index-MB")
				if f, err := os.Open(path); err == nil {
					if l, ok, err := index.ReadLayout(f, path); ok && err == nil {
						b.ReportMetric(float64(l.Counts)/1e6, "counts-MB")
					}
					f.Close()
				}
				b.ReportMetric(float64(decoded), "shards-decoded")
				b.ReportMetric(float64(len(p.Spans)), "spans")
				runtime.GC()
				runtime.ReadMemStats(&ms)
				b.ReportMetric(float64(ms.HeapAlloc-base)/1e6, "kept-heap-MB")
				runtime.KeepAlive(infos)
			}
		})
	}
}

// rssPeak resets the process's peak resident set (VmHWM, Linux) to its resident set
// now, and returns a function that reads it: 0 where it cannot.
func rssPeak() func() int64 {
	if os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) != nil {
		return func() int64 { return 0 }
	}
	return func() int64 {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return 0
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
		return 0
	}
}

// One rank's plan of a job of 8,000 from an addressable index of 10^5 shards, as a
// loader makes it (Lookup.Quick with LazyOffsets, then PlanInPlace), allocates at
// most maxAlloc bytes a shard in all (garbage included: what the heap grows by
// between two collections) and holds at most maxHeld once made: the shards'
// entries (88 bytes each), their versions and the order's 12 bytes a shard. The
// URLs are the caller's, made before. BenchmarkIndexAtScale has the figures at 10^6.
//
// With members in the index (format version 2), the same holds (their blocks are read
// for the shards whose offsets are), and its counts are those of the index without
// members, byte for byte but for the header's version.
func TestPlanMemoryPerShard(t *testing.T) {
	dir := t.TempDir()
	var counts [2]int64
	for k, members := range []bool{false, true} {
		t.Run(fmt.Sprintf("members=%v", members), func(t *testing.T) {
			counts[k] = planMemoryPerShard(t, dir, members)
		})
	}
	if d := counts[1] - counts[0]; d < -8 || d > 8 {
		t.Errorf("counts of %d bytes with members, %d without", counts[1], counts[0])
	}
}

// planMemoryPerShard is TestPlanMemoryPerShard of the index with or without
// members; it returns the bytes of its counts.
func planMemoryPerShard(t *testing.T, dir string, members bool) int64 {
	const n, samples, world, rank = 100_000, 20, 8_000, 1_234
	const maxAlloc, maxHeld = 250, 110
	path := atScaleIndex(t, dir, n, samples, true, members)
	reg := &source.Registry{}
	reg.Register("file", &source.File{})
	reg.Register("s3", memShards{})
	lk := index.Lookup{Sources: reg, Index: path, NoBeside: true, LazyOffsets: true}
	cfg := plan.Config{Seed: 1, Rank: rank, World: world, Shuffle: true, Lanes: 8, Window: 1000, BatchSize: 32, GapBytes: 1 << 20}
	urls := make([]string, n)
	for i := range urls {
		urls[i] = atScaleURL(i)
	}
	ctx := context.Background()
	runtime.GC()
	var before, after, held runtime.MemStats
	runtime.ReadMemStats(&before)
	infos, err := lk.Quick(ctx, urls, world)
	if err != nil {
		t.Fatal(err)
	}
	infos, p, err := index.PlanInPlace(ctx, infos, func(infos []shard.Info) (plan.Plan, error) { return plan.New(infos, cfg) })
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	runtime.GC()
	runtime.ReadMemStats(&held)
	decoded, withMembers := 0, 0
	for _, in := range infos {
		if in.Offsets != nil {
			decoded++
		}
		if in.Members != nil {
			withMembers++
			if in.Offsets == nil || in.Members.Samples() != samples {
				t.Fatalf("%s: members of %d samples, offsets %v", in.URL, in.Members.Samples(), in.Offsets != nil)
			}
		}
	}
	if decoded == 0 || decoded > 100 || len(p.Spans) == 0 {
		t.Fatalf("%d shards' offsets decoded for %d spans", decoded, len(p.Spans))
	}
	if members && withMembers != decoded || !members && withMembers != 0 {
		t.Fatalf("%d shards' members decoded, %d shards' offsets", withMembers, decoded)
	}
	runtime.KeepAlive(infos)
	alloc := float64(after.TotalAlloc-before.TotalAlloc) / n
	kept := (float64(held.HeapAlloc) - float64(before.HeapAlloc)) / n
	t.Logf("%d shards: %.0f bytes a shard allocated, %.0f held; %d shards' offsets decoded", n, alloc, kept, decoded)
	if alloc > maxAlloc || kept > maxHeld {
		t.Errorf("%.0f bytes a shard allocated and %.0f held, want at most %d and %d", alloc, kept, maxAlloc, maxHeld)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, _, err := index.ReadLayout(f, path)
	if err != nil {
		t.Fatal(err)
	}
	return l.Counts
}

// heapPeak starts sampling the heap's objects every millisecond and returns a
// function that stops and returns the most seen above the heap at the start.
func heapPeak() func() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 { metrics.Read(s); return s[0].Value.Uint64() }
	base := read()
	var mu sync.Mutex
	most := base
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				v := read()
				mu.Lock()
				most = max(most, v)
				mu.Unlock()
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		most = max(most, read())
		return most - base
	}
}

// atScaleURL is shard i's URL: in an object store, whose objects are not checked
// against their entries beyond Lookup.CheckUpTo (the stub source answers no Stat).
func atScaleURL(i int) string { return shardgen.IndexURL(i) }

// atScaleIndex returns the path of the synthetic index of n shards in dir (written
// by WriteAddressable when addressable, else Write), writing it if it is not there
// (shardgen.Index).
func atScaleIndex(b testing.TB, dir string, n, samples int, addressable, members bool) string {
	b.Helper()
	path, err := shardgen.Index(dir, n, samples, addressable, members)
	if err != nil {
		b.Fatal(err)
	}
	return path
}
