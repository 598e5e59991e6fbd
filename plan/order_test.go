package plan

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
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
	next := make([]int, len(p.Spans))  // samples of each span handed out
	feeds := make([]int, len(p.Spans)) // feeds of each span
	var out []sampleID
	windows := 0
	for w := range p.Windows() {
		windows++
		held := make([]sampleID, w.Held)
		filled := 0
		for _, f := range w.Feeds {
			sp := p.Spans[f.Span]
			feeds[f.Span]++
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
		if feeds[i] != sp.Feeds {
			t.Fatalf("span %d %+v: %d feeds in the windows", i, sp, feeds[i])
		}
	}
	if windows != p.WindowCount {
		t.Fatalf("%d windows, WindowCount %d", windows, p.WindowCount)
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
		var items []ShardSample
		for j := range o.Windows() {
			items = o.WindowItems(j, items[:0])
			if size := o.WindowStart(j+1) - o.WindowStart(j); int64(len(items)) != size {
				t.Fatalf("trial %d: window %d has %d items, want %d", trial, j, len(items), size)
			}
			for q, it := range items {
				if s, i := o.Item(j, q); it != (ShardSample{s, i}) {
					t.Fatalf("trial %d: window %d item %d is %v, Item gives %d/%d", trial, j, q, it, s, i)
				}
			}
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

// splitSeq returns the rank split's sequence T of o, worked out afresh: window by
// window, the window's positions sorted by where their items lie in the data, the
// lanes' parts interleaved in proportion to their lengths (item i of a part of n
// at (2i+1)/2n, the earlier part first on a tie).
func splitSeq(o *Order) []int64 {
	var seq []int64
	for j := range o.Windows() {
		start, end := o.bounds(j)
		size := int(end - start)
		inv := make([]int64, size)
		for p := range inv {
			inv[p] = int64(p)
		}
		for p, q := range o.Perm(j, size) {
			inv[q] = int64(p)
		}
		type el struct{ piece, i, n, q int64 }
		var els []el
		var q int64
		for k, pc := range o.pieces(j, nil) {
			for i := range pc.n {
				els = append(els, el{int64(k), i, pc.n, q})
				q++
			}
		}
		slices.SortFunc(els, func(a, b el) int {
			if c := cmp.Compare((2*a.i+1)*b.n, (2*b.i+1)*a.n); c != 0 {
				return c
			}
			return cmp.Compare(a.piece, b.piece)
		})
		for _, e := range els {
			seq = append(seq, start+inv[e.q])
		}
	}
	return seq
}

// rankSeq returns what a rank yields of T's elements [lo, lo+per), of which it
// takes the first take (DropLast): window by window, each window's in position
// order.
func rankSeq(o *Order, t []int64, lo, per, take int64) []sampleID {
	part := slices.Clone(t[lo : lo+per])
	slices.Sort(part) // windows are runs of positions: by window, then position
	var out []sampleID
	for _, n := range part[:take] {
		s, i := o.At(n)
		out = append(out, sampleID{s, i})
	}
	return out
}

// TestPlanReadsTheOrder: what a rank reads by its plan is its part of the split's
// sequence, in the order's positions, for every rank of several world sizes;
// together the ranks read every sample of the order once but the dropped rest (and
// one rank reads the order itself). The ranks read no sample twice between them,
// even where reading across a gap is taken to cost nothing: a rank's samples of a
// window it shares are a run of every lane's part of it.
func TestPlanReadsTheOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 30 {
		shards := randomShards(rng, 1+rng.IntN(25), 200)
		offsets := trial%3 == 0
		if offsets {
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
		if offsets && trial%2 == 0 {
			// Every shard's offsets known, and reading between runs always cheaper
			// than a new request: a rank still reads none of another's samples.
			for i := range shards {
				shards[i].Offsets = nil
				for k := range shards[i].Samples {
					shards[i].Offsets = append(shards[i].Offsets, int64(k)*100<<10)
				}
			}
			base.GapBytes = 1 << 40
		}
		o, _ := NewOrder(shards, OrderConfig{Seed: base.Seed, Epoch: base.Epoch, Shuffle: base.Shuffle, Lanes: base.Lanes, Window: base.Window})
		tseq := splitSeq(o)
		for _, world := range []int{1, 2, 3, 7} {
			var all []sampleID
			var batches int
			var read int
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
				per := int64(p.Samples)
				take := per
				if base.DropLast {
					take = int64(p.Batches * base.BatchSize)
				}
				equalSeq(t, fmt.Sprintf("trial %d world %d rank %d", trial, world, rank), got, rankSeq(o, tseq, int64(rank)*per, per, take))
				all = append(all, got...)
				for _, sp := range p.Spans {
					read += sp.Take
				}
			}
			if all == nil {
				continue
			}
			if world == 1 {
				equalSeq(t, fmt.Sprintf("trial %d: one rank", trial), all, orderSeq(o, []Range{{0, int64(len(all))}}))
			}
			seen := map[sampleID]bool{}
			for _, id := range all {
				if seen[id] {
					t.Fatalf("trial %d world %d: %v read twice", trial, world, id)
				}
				seen[id] = true
			}
			if base.GapBytes > 1<<30 && read != len(all) {
				t.Fatalf("trial %d world %d: the ranks read %d samples to yield %d", trial, world, read, len(all))
			}
		}
	}
}

// TestResumeSameWorld: a rank of a run that resumes one of its own world size
// yields what it would have yielded after the samples consumed, whatever windows
// the ranks share.
func TestResumeSameWorld(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 40 {
		shards := randomShards(rng, 1+rng.IntN(12), 150)
		base := Config{Seed: rng.Uint64(), Shuffle: trial%5 != 0, Lanes: 1 + rng.IntN(5), Window: 1 + rng.IntN(400),
			BatchSize: 1 + rng.IntN(16), World: 1 + rng.IntN(6), DropLast: trial%3 == 0}
		for rank := range base.World {
			cfg := base
			cfg.Rank = rank
			p, err := New(shards, cfg)
			if err != nil {
				break
			}
			whole := readPlan(t, p)
			// A loader consumes whole batches (the last may be short).
			b := int64(base.BatchSize)
			for _, consumed := range []int64{0, b, int64(rng.IntN(p.Batches+1)) * b, int64(p.Batches) * b} {
				consumed = min(consumed, int64(p.Samples))
				cfg.Runs = []Run{{World: base.World, Consumed: consumed}}
				q, err := New(shards, cfg)
				if err != nil {
					t.Fatalf("trial %d rank %d consumed %d: %v", trial, rank, consumed, err)
				}
				equalSeq(t, fmt.Sprintf("trial %d rank %d consumed %d", trial, rank, consumed), readPlan(t, q), whole[min(consumed, int64(len(whole))):])
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
