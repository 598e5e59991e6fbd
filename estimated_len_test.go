package shardload_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardload/shardload"
)

// skewedShard writes a shard whose first samples are of one size and the rest of
// another: counts estimated from its first samples' bytes per sample miss its true
// count. It returns the shard's path.
func skewedShard(t *testing.T, path string, first, firstBytes, rest, restBytes int) string {
	t.Helper()
	var members [][2]string
	for i := range first + rest {
		n := firstBytes
		if i >= first {
			n = restBytes
		}
		key := fmt.Sprintf("%s-%05d", strings.TrimSuffix(filepath.Base(path), ".tar"), i)
		members = append(members, [2]string{key + ".bin", strings.Repeat("x", n)}, [2]string{key + ".cls", fmt.Sprint(i % 10)})
	}
	return writeTar(t, path, members...)
}

// An epoch planned from estimated counts is exactly its planned batches, in a job of
// one rank too (what len() promises a schedule such as OneCycleLR): when the shards
// hold fewer samples than estimated the last batches repeat samples (Stats.Padded),
// when they hold more the samples past the planned batches are left out
// (Stats.Trimmed); every other sample comes exactly once.
func TestEstimatedEpochIsPlannedLength(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// A shard's first 64 samples (what the estimate measures) and the rest.
		first, firstBytes, rest, restBytes int
		over                               bool // the estimate is above the true count
	}{
		{"over", 64, 200, 60, 6000, true},    // small samples first: more estimated than there are
		{"under", 64, 6000, 250, 200, false}, // large samples first: fewer estimated
	} {
		for _, dropLast := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/droplast=%v", tc.name, dropLast), func(t *testing.T) {
				dir := t.TempDir()
				paths := []string{
					skewedShard(t, filepath.Join(dir, "a.tar"), tc.first, tc.firstBytes, tc.rest, tc.restBytes),
					skewedShard(t, filepath.Join(dir, "b.tar"), tc.first, tc.firstBytes, tc.rest/2, tc.restBytes),
				}
				truth := 2*tc.first + tc.rest + tc.rest/2
				cfg := shardload.Config{URLs: paths, NoIndexStore: true, BatchSize: 8, DropLast: dropLast, Seed: 3,
					NoLock: true, Slabs: 2, SlabBytes: 1 << 20, Logf: t.Logf}
				l, err := shardload.Open(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				p := l.Plan()
				if !p.Estimated {
					t.Fatal("the plan's counts are not estimates")
				}
				if tc.over && p.Samples <= truth || !tc.over && p.Samples >= truth {
					t.Fatalf("planned from %d samples, the shards hold %d: the estimate does not miss the way this case needs", p.Samples, truth)
				}
				seen := map[string]int{}
				batches, rows, padded := 0, 0, 0
				for b, err := range l.All(ctx) {
					if err != nil {
						t.Fatal(err)
					}
					batches++
					rows += b.Rows
					padded += b.Padded
					for _, k := range b.Keys()[:b.Rows-b.Padded] {
						seen[k]++
					}
				}
				st := l.Stats()
				t.Logf("planned %d batches of %d samples; the shards hold %d; yielded %d batches, %d rows, %d padded, %d trimmed",
					p.Batches, p.Samples, truth, batches, rows, st.Padded, st.Trimmed)
				if batches != p.Batches || int(st.Batches) != p.Batches {
					t.Errorf("%d batches yielded (Stats: %d), planned %d", batches, st.Batches, p.Batches)
				}
				for k, n := range seen {
					if n > 1 {
						t.Errorf("sample %s yielded %d times outside the padding", k, n)
					}
				}
				if int(st.Padded) != padded {
					t.Errorf("Stats.Padded %d, the batches' padding rows %d", st.Padded, padded)
				}
				// Every sample read is yielded once or counted as trimmed; with DropLast
				// the partial batch's samples are dropped without being read past the plan.
				if got := len(seen) + int(st.Trimmed); !dropLast && got != truth {
					t.Errorf("%d samples yielded and %d trimmed, the shards hold %d", len(seen), st.Trimmed, truth)
				}
				if tc.over && st.Padded == 0 {
					t.Errorf("fewer samples than planned, and no padding")
				}
				if !tc.over && st.Trimmed == 0 {
					t.Errorf("more samples than planned, and none trimmed")
				}
			})
		}
	}
}
