package serve

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/wire"
)

// stalled serves no shard: each Open waits until its context ends, so that a
// session's loader holds its plan and the shards' entries but no sample. It answers
// no Stat (the shards of a synthetic index are not checked against their objects).
type stalled struct{}

func (stalled) Stat(context.Context, string) (source.Info, error) {
	return source.Info{}, source.ErrNotFound
}

func (stalled) Open(ctx context.Context, _ string) (io.ReadCloser, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

var _ source.Source = stalled{}

// heapNow returns the Go heap's live bytes after two collections.
func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// sessionsHeap starts a server whose dataset is the n shards of the synthetic
// index at path (shardgen.Index), opens sessions of the ranks 0 to sessions-1 of a
// job of world ranks in turn, each until its ready, and returns the Go heap that the
// server holds (after a collection, above what the process held before it started)
// once the first session is ready and once all of them are: what a loader process
// of one node holds for its trainers, less their slabs (shared memory, outside the
// heap). The sessions' loaders read no shard (stalled).
func sessionsHeap(tb testing.TB, path string, n, world, sessions int) (first, all uint64) {
	reg := &source.Registry{}
	reg.Register("file", &source.File{})
	reg.Register("s3", stalled{})
	opts := Options{
		Socket:    filepath.Join(tb.TempDir(), "run", "s.sock"),
		URLs:      []string{shardgen.IndexPattern(n)},
		MaxShards: n,
		Logf:      func(string, ...any) {},
		Pipeline: shardload.Config{Index: path, NoIndexStore: true, Fields: fields(tb, "cls:int"),
			Slabs: 2, SlabBytes: 1 << 20, Sources: reg, Logf: func(string, ...any) {}},
	}
	base := heapNow()
	s := start(tb, opts)
	defer s.Close() // its kept counts gone before the next server's (Close is idempotent)
	for r := range sessions {
		cl, m := dial(tb, s.opts.Socket, wire.Hello{Version: wire.Version, Rank: r, World: world, LocalRank: r, Seed: 1, BatchSize: 32})
		if m != nil {
			tb.Fatalf("session %d: %v", r, m)
		}
		defer cl.c.Close()
		if r == 0 {
			first = heapNow() - base
		}
	}
	all = heapNow() - base
	return first, all
}

// BenchmarkSessionsShareIndex measures the Go heap of a loader process (serve) whose
// 8 sessions, the ranks of a job of 8 on one node, plan from an addressable index of
// 10^6 synthetic shards of 100 samples ($SHARDLOAD_SHARE_SHARDS shards when set;
// shardgen.Index, written once to $TMPDIR/shardload-atscale-s3-N/ and kept for
// later runs), against its heap with the first session alone: the ratio is what
// the shards' entries cost the sessions beyond the first. Each iteration is a server
// of its own; it reports the medians.
//
//	go test -run '^$' -bench SessionsShareIndex -benchtime 3x -timeout 30m ./serve/
func BenchmarkSessionsShareIndex(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("SHARDLOAD_SHARE_SHARDS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	path, err := shardgen.Index(filepath.Join(os.TempDir(), fmt.Sprintf("shardload-atscale-s3-%d", n)), n, 100, true, false)
	if err != nil {
		b.Fatal(err)
	}
	var ones, eights, ratios []float64
	for b.Loop() {
		one, eight := sessionsHeap(b, path, n, 8, 8)
		ones, eights = append(ones, float64(one)), append(eights, float64(eight))
		ratios = append(ratios, float64(eight)/float64(one))
		b.Logf("1 session: %.1f MB; 8 sessions: %.1f MB (%.2fx)", float64(one)/1e6, float64(eight)/1e6, float64(eight)/float64(one))
	}
	b.ReportMetric(median(ones)/1e6, "1-session-MB")
	b.ReportMetric(median(eights)/1e6, "8-sessions-MB")
	b.ReportMetric(median(ratios), "ratio")
}

// median returns the median of xs (the mean of the middle two of an even count).
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
}

// The sessions of a loader process share their dataset's shards: each session
// beyond the first holds its own plan and buffers, a few bytes a shard, not a copy
// of the shards' entries (88 bytes a shard, and 120 more for the refutations' map
// of them, before) nor an order of its own (12 bytes a shard). The figures at 10^6
// shards are BenchmarkSessionsShareIndex's.
func TestSessionsShareIndex(t *testing.T) {
	if testutil.Race {
		t.Skip("the race detector's own memory")
	}
	const n, world = 50_000, 8
	path, err := shardgen.Index(t.TempDir(), n, 20, true, false)
	if err != nil {
		t.Fatal(err)
	}
	first, all := sessionsHeap(t, path, n, world, world)
	perShard := float64(all-first) / float64(world-1) / n
	t.Logf("1 session: %.1f MB; %d sessions: %.1f MB (%.2fx); %.1f bytes a shard for each session beyond the first", float64(first)/1e6, world, float64(all)/1e6, float64(all)/float64(first), perShard)
	if perShard > 24 {
		t.Errorf("each session beyond the first holds %.1f bytes a shard, want at most 24", perShard)
	}
}
