package plan

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// Reads lists every shard with samples in the windows from the one holding the
// position on, once, in the order of the window in which the order first takes a
// sample of it (read from the windows' items), a lane's shards in lane order, and
// the positions of its first and last reads within the cuts of those windows.
func TestReadsFollowTheWindows(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		shards := randomShards(rng, 1+rng.IntN(40), 200)
		cfg := OrderConfig{Seed: rng.Uint64(), Epoch: rng.IntN(5), Shuffle: trial%7 != 0, Lanes: 1 + rng.IntN(8), Window: rng.IntN(900)}
		o, err := NewOrder(shards, cfg)
		if err != nil {
			t.Fatal(err)
		}
		from := int64(0)
		if o.Len() > 0 && trial%2 == 1 {
			from = rng.Int64N(o.Len())
		}
		// The reference: each shard's first and last window, from the windows' items.
		first, last := map[int]int64{}, map[int]int64{}
		var want []int
		if from < o.Len() {
			j0, _, _ := o.window(from)
			var items []ShardSample
			for j := j0; j < o.Windows(); j++ {
				for _, it := range o.WindowItems(j, items[:0]) {
					if _, ok := first[it.Shard]; !ok {
						first[it.Shard] = j
						want = append(want, it.Shard)
					}
					last[it.Shard] = j
				}
			}
		}
		reads := o.Reads(from)
		var got []int
		for _, r := range reads {
			got = append(got, r.Shard)
			// Its positions lie in its first and last windows' cuts.
			for _, c := range []struct {
				at  int64
				win int64
			}{{r.First, first[r.Shard]}, {r.Last, last[r.Shard]}} {
				if c.at <= o.cut(c.win) || c.at > o.cut(c.win+1) {
					t.Fatalf("trial %d (%+v, from %d): shard %d read at cut %d, outside window %d's cuts (%d, %d]", trial, cfg, from, r.Shard, c.at, c.win, o.cut(c.win), o.cut(c.win+1))
				}
			}
		}
		if len(got) != len(want) {
			t.Fatalf("trial %d (%+v, from %d): %d shards, want %d: %v against %v", trial, cfg, from, len(got), len(want), got, want)
		}
		sortedGot, sortedWant := slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))
		if !slices.Equal(sortedGot, sortedWant) {
			t.Fatalf("trial %d (%+v, from %d): shards %v, want %v", trial, cfg, from, sortedGot, sortedWant)
		}
		lanePos := map[int]int{} // the shard's place in the shuffled sequence
		for k, s := range o.perm {
			lanePos[int(s)] = k
		}
		for i := 1; i < len(got); i++ {
			a, b := got[i-1], got[i]
			if first[a] > first[b] {
				t.Fatalf("trial %d (%+v, from %d): shard %d (first in window %d) listed before shard %d (window %d)", trial, cfg, from, a, first[a], b, first[b])
			}
		}
		// Within a lane, the shards come in lane order.
		placed := map[int]int{} // lane -> place of its last shard listed
		for _, s := range got {
			k := lanePos[s]
			l := o.laneOf(k)
			if p, ok := placed[l]; ok && p > k {
				t.Fatalf("trial %d (%+v, from %d): lane %d lists shard %d (place %d) after place %d", trial, cfg, from, l, s, k, p)
			}
			placed[l] = k
		}
	}
}

// laneOf returns the lane of the shard at place k of the shuffled sequence.
func (o *Order) laneOf(k int) int {
	for l, ln := range o.lanes {
		if o.starts[k] >= ln.start && o.starts[k] < ln.start+ln.n {
			return l
		}
	}
	return -1
}
