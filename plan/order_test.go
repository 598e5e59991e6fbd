package plan

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/shardload/shardload/shard"
)

// sampleID names a sample: shard index and sample index.
type sampleID struct{ shard, idx int }

func testShards(counts ...int) []shard.Info {
	infos := make([]shard.Info, len(counts))
	for i, n := range counts {
		infos[i] = shard.Info{URL: fmt.Sprintf("s%03d.tar", i), Samples: n}
	}
	return infos
}

func randomShards(rng *rand.Rand, n, maxSamples int) []shard.Info {
	counts := make([]int, n)
	for i := range counts {
		counts[i] = rng.IntN(maxSamples + 1)
	}
	return testShards(counts...)
}

// readPlan does what a loader does with a plan: reads each span's samples in order,
// puts them where the windows' feeds say, and yields each window's held items in
// Emit's order. It checks that every feed's samples lie in its span.
func readPlan(t *testing.T, p Plan) []sampleID {
	t.Helper()
	next := make([]int, len(p.Spans)) // samples of each span handed out
	var out []sampleID
	for wi := range p.Windows {
		w := &p.Windows[wi]
		held := make([]sampleID, w.Held)
		filled := 0
		for _, f := range w.Feeds {
			sp := p.Spans[f.Span]
			for k := range f.Count {
				if next[f.Span] >= sp.Take {
					t.Fatalf("window %d: feed reads past span %d %+v", w.Index, f.Span, sp)
				}
				if f.Slot >= 0 {
					held[f.Slot+k] = sampleID{sp.Shard, sp.Skip + next[f.Span]}
				}
				next[f.Span]++
			}
			if f.Slot >= 0 {
				filled += int(f.Count)
			}
		}
		if filled != int(w.Held) {
			t.Fatalf("window %d: feeds fill %d of %d held items", w.Index, filled, w.Held)
		}
		for _, i := range p.Emit(w) {
			out = append(out, held[i])
		}
	}
	for i, sp := range p.Spans {
		if next[i] != sp.Take {
			t.Fatalf("span %d %+v: %d of its samples used", i, sp, next[i])
		}
	}
	return out
}

func orderSeq(o *Order, rs []Range) []sampleID {
	var out []sampleID
	for _, r := range rs {
		for n := r.Start; n < r.End; n++ {
			s, i := o.At(n)
			out = append(out, sampleID{s, i})
		}
	}
	return out
}

func equalSeq(t *testing.T, what string, got, want []sampleID) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d samples, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: sample %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

// TestOrderIsAPermutation: every sample of the epoch is at exactly one position.
func TestOrderIsAPermutation(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 40 {
		shards := randomShards(rng, 1+rng.IntN(30), 300)
		cfg := OrderConfig{Seed: rng.Uint64(), Epoch: rng.IntN(5), Shuffle: trial%5 != 0, Lanes: 1 + rng.IntN(6), Window: rng.IntN(1500)}
		o, err := NewOrder(shards, cfg)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[sampleID]bool{}
		for n := range o.Len() {
			s, i := o.At(n)
			id := sampleID{s, i}
			if i < 0 || i >= shards[s].Samples || seen[id] {
				t.Fatalf("trial %d (%+v): position %d is %v (seen %v)", trial, cfg, n, id, seen[id])
			}
			seen[id] = true
		}
		if o.WindowStart(o.Windows()) != o.Len() || o.WindowStart(0) != 0 {
			t.Fatalf("trial %d: windows cover [%d, %d) of %d", trial, o.WindowStart(0), o.WindowStart(o.Windows()), o.Len())
		}
		if !cfg.Shuffle {
			// In order: shard after shard.
			n := 0
			for si, sh := range shards {
				for i := range sh.Samples {
					if s, k := o.At(int64(n)); s != si || k != i {
						t.Fatalf("no shuffle: position %d is %d/%d, want %d/%d", n, s, k, si, i)
					}
					n++
				}
			}
		}
	}
}

// TestPlanReadsTheOrder: what a rank reads by its plan is its slice of the
// world-independent order, for every rank of several world sizes; together the
// ranks read the whole order but the dropped rest.
func TestPlanReadsTheOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 30 {
		shards := randomShards(rng, 1+rng.IntN(25), 200)
		if trial%3 == 0 {
			// Offsets for some shards: gaps are then measured in bytes.
			for i := range shards {
				if i%2 == 0 {
					for k := range shards[i].Samples {
						shards[i].Offsets = append(shards[i].Offsets, int64(k)*100<<10)
					}
				}
			}
		}
		base := Config{Seed: rng.Uint64(), Epoch: rng.IntN(3), Shuffle: trial%4 != 0, Lanes: 1 + rng.IntN(5),
			Window: 1 + rng.IntN(700), BatchSize: 1 + rng.IntN(40), DropLast: trial%2 == 1}
		o, _ := NewOrder(shards, OrderConfig{Seed: base.Seed, Epoch: base.Epoch, Shuffle: base.Shuffle, Lanes: base.Lanes, Window: base.Window})
		for _, world := range []int{1, 2, 3, 7} {
			var all []sampleID
			var batches int
			for rank := range world {
				cfg := base
				cfg.Rank, cfg.World = rank, world
				p, err := New(shards, cfg)
				if err != nil {
					continue // too few samples for this world
				}
				if rank > 0 && p.Batches != batches {
					t.Fatalf("rank %d: %d batches, rank 0 %d", rank, p.Batches, batches)
				}
				batches = p.Batches
				got := readPlan(t, p)
				equalSeq(t, fmt.Sprintf("trial %d world %d rank %d", trial, world, rank), got, orderSeq(o, p.Ranges))
				all = append(all, got...)
			}
			if all == nil {
				continue
			}
			full := orderSeq(o, []Range{{0, int64(len(all))}})
			if !base.DropLast {
				equalSeq(t, fmt.Sprintf("trial %d world %d: all ranks", trial, world), all, full)
			}
		}
	}
}

// TestRemainingElastic: runs of any world sizes, each consuming part of what the
// last left, then a last run reading the rest: every sample exactly once, but for
// fewer than the last world size.
func TestRemainingElastic(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	shards := randomShards(rng, 20, 150)
	base := Config{Seed: 9, Shuffle: true, Lanes: 4, Window: 300, BatchSize: 8}
	o, _ := NewOrder(shards, OrderConfig{Seed: 9, Shuffle: true, Lanes: 4, Window: 300})
	for trial := range 50 {
		var runs []Run
		seen := map[sampleID]int{}
		for range rng.IntN(4) {
			world := 1 + rng.IntN(9)
			cfg := base
			cfg.Runs, cfg.World = runs, world
			p0, err := New(shards, cfg)
			if err != nil {
				t.Fatal(err)
			}
			consumed := int64(rng.IntN(p0.Batches+1)) * int64(cfg.BatchSize)
			consumed = min(consumed, int64(p0.Samples))
			for rank := range world {
				cfg.Rank = rank
				p, err := New(shards, cfg)
				if err != nil {
					t.Fatal(err)
				}
				for _, id := range readPlan(t, p)[:consumed] {
					seen[id]++
				}
			}
			runs = append(runs, Run{World: world, Consumed: consumed})
		}
		world := 1 + rng.IntN(9)
		cfg := base
		cfg.Runs, cfg.World = runs, world
		var dropped int
		for rank := range world {
			cfg.Rank = rank
			p, err := New(shards, cfg)
			if err != nil {
				t.Fatalf("trial %d runs %v world %d: %v", trial, runs, world, err)
			}
			dropped = p.Dropped
			for _, id := range readPlan(t, p) {
				seen[id]++
			}
		}
		missing := 0
		for n := range o.Len() {
			s, i := o.At(n)
			switch seen[sampleID{s, i}] {
			case 0:
				missing++
			case 1:
			default:
				t.Fatalf("trial %d runs %v world %d: sample %d/%d read %d times", trial, runs, world, s, i, seen[sampleID{s, i}])
			}
		}
		if missing != dropped || dropped >= world {
			t.Fatalf("trial %d runs %v world %d: %d samples never read, the last run dropped %d", trial, runs, world, missing, dropped)
		}
	}
}
