package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
)

// planJSON is the part of "bench --json" that says how the epoch was planned.
type planJSON struct {
	Order     string `json:"order_fingerprint"`
	Estimated bool   `json:"estimated_counts"`
	Batches   int64  `json:"batches"`
}

// TestRanksAgreeAcrossProcesses: the two ranks of a job run as processes on two
// "nodes" (index stores), one of which has every shard's entry (from ls) and one
// none, over S3 (MinIO). Without an index both estimate the same counts; with
// --count-first both count exactly; with an index object beside the shards, written
// by "shardload index", both read it. In each case the ranks' orders are the same,
// and the exact ones are the same whichever way the counts were found.
func TestRanksAgreeAcrossProcesses(t *testing.T) {
	m := testutil.MinIO(t)
	m.CreateBucket(t, "data")
	spec := shardgen.Spec{Shards: 6, Samples: []int{40, 37, 25, 50, 33, 12}, Seed: 11}
	paths, err := shardgen.Generate(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		data, _ := os.ReadFile(p)
		m.Put(t, "data", "ds/"+filepath.Base(p), data)
	}
	pattern := "s3://data/ds/" + spec.Pattern()
	full, empty := t.TempDir(), t.TempDir()
	ok(t, append(m.Env(), "SHARDLOAD_INDEX_DIR="+full), "ls", "--summary", pattern)

	plan := func(store string, rank int, args ...string) planJSON {
		t.Helper()
		var p planJSON
		res := ok(t, append(m.Env(), "SHARDLOAD_INDEX_DIR="+store),
			append([]string{"bench", "--json", "--world", "2", "--rank", strconv.Itoa(rank), "--batches", "1", "--batch-size", "8"}, append(args, pattern)...)...)
		if err := json.Unmarshal(res, &p); err != nil {
			t.Fatalf("bench --json printed %q: %v", res, err)
		}
		return p
	}
	check := func(name string, a, b planJSON, estimated bool) {
		t.Helper()
		if a.Order == "" || a.Order != b.Order {
			t.Errorf("%s: rank 0 planned %q, rank 1 %q", name, a.Order, b.Order)
		}
		if a.Estimated != estimated || b.Estimated != estimated {
			t.Errorf("%s: estimated %v and %v, want %v", name, a.Estimated, b.Estimated, estimated)
		}
	}
	// Without an index, a job of two ranks is refused before its first batch, naming
	// the fix, unless approximate epochs are allowed.
	for rank, store := range []string{full, empty} {
		r := shardload(t, "", append(m.Env(), "SHARDLOAD_INDEX_DIR="+store), "bench", "--world", "2", "--rank", strconv.Itoa(rank), "--batches", "1", pattern)
		if r.code != 1 || !strings.Contains(r.stderr, "shardload index --output") || !strings.Contains(r.stderr, "--allow-estimate") {
			t.Errorf("rank %d without an index: exit %d, %s", rank, r.code, r.stderr)
		}
	}
	est0, est1 := plan(full, 0, "--allow-estimate"), plan(empty, 1, "--allow-estimate")
	check("no index", est0, est1, true)
	cnt0, cnt1 := plan(full, 0, "--count-first"), plan(empty, 1, "--count-first")
	check("--count-first", cnt0, cnt1, false)

	ok(t, m.Env(), "index", "--output", "s3://data/ds/", pattern)
	idx0, idx1 := plan(t.TempDir(), 0), plan(t.TempDir(), 1)
	check("index beside the shards", idx0, idx1, false)
	if idx0.Order != cnt0.Order {
		t.Errorf("the index's plan %s differs from the count's %s", idx0.Order, cnt0.Order)
	}
}
