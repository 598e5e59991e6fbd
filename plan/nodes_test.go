package plan

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/shardload/shardload/shard"
)

// readJob reads every rank's plan of cfg's epoch (cfg.World ranks) and counts each
// sample; it returns the counts and the samples no rank read (Plan.Dropped).
func readJob(t *testing.T, shards []shard.Info, cfg Config, seen map[sampleID]int, consumed int64) (dropped int, perRank []int) {
	t.Helper()
	for rank := range max(cfg.World, 1) {
		c := cfg
		c.Rank = rank
		p, err := New(shards, c)
		if err != nil {
			t.Fatalf("rank %d of %d, runs %v: %v", rank, c.World, c.Runs, err)
		}
		ids := readPlan(t, p)
		if consumed >= 0 {
			ids = ids[:min(consumed, int64(len(ids)))]
		}
		for _, id := range ids {
			seen[id]++
		}
		dropped = p.Dropped
		perRank = append(perRank, p.Batches)
	}
	return dropped, perRank
}

// checkOnce fails unless every sample of shards was seen once, but for dropped.
func checkOnce(t *testing.T, what string, shards []shard.Info, seen map[sampleID]int, dropped int) {
	t.Helper()
	missing := 0
	for s, info := range shards {
		for i := range info.Samples {
			switch n := seen[sampleID{s, i}]; n {
			case 0:
				missing++
			case 1:
			default:
				t.Fatalf("%s: sample %d/%d read %d times", what, s, i, n)
			}
		}
	}
	if missing != dropped {
		t.Fatalf("%s: %d samples never read, %d dropped", what, missing, dropped)
	}
}

// TestNodesCoverEpochOnce: with ranks grouped into nodes, every sample of an epoch is
// read by exactly one rank (but for the fewer than World dropped), every rank yields
// the same batches, and the plan says it keeps shards on nodes.
func TestNodesCoverEpochOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	withNodes := 0
	defer func() {
		if withNodes < 25 {
			t.Errorf("%d of 60 trials kept shards on nodes", withNodes)
		}
	}()
	for trial := range 60 {
		shards := randomShards(rng, 1+rng.IntN(40), 200)
		perNode := 1 + rng.IntN(4)
		cfg := Config{Seed: rng.Uint64(), Epoch: rng.IntN(4), Shuffle: true, Lanes: 1 + rng.IntN(6), Window: rng.IntN(600),
			BatchSize: 1 + rng.IntN(16), World: 1 + rng.IntN(9), RanksPerNode: perNode, DropLast: trial%4 == 0}
		what := fmt.Sprintf("trial %d: world %d, %d a node", trial, cfg.World, perNode)
		p0, err := New(shards, cfg)
		if err != nil {
			continue // too few samples for the ranks
		}
		if want := perNode * btoi(cfg.World > perNode); p0.RanksPerNode != want {
			t.Fatalf("%s: plan keeps shards on nodes of %d, want %d", what, p0.RanksPerNode, want)
		}
		withNodes += btoi(p0.RanksPerNode > 0)
		seen := map[sampleID]int{}
		dropped, batches := readJob(t, shards, cfg, seen, -1)
		if slices.Min(batches) != slices.Max(batches) {
			t.Fatalf("%s: batches per rank %v", what, batches)
		}
		if cfg.DropLast {
			dropped += p0.DroppedInBatch * cfg.World
		}
		checkOnce(t, what, shards, seen, dropped)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestNodesResumeOnOtherWorld: an epoch of world 4 with 2 ranks a node, stopped
// after some batches and resumed on world 3 (one node of 3, three of 1, or no
// nodes given), reads every sample once; resumed on its own world, each rank yields
// what it would have yielded had the job not stopped.
func TestNodesResumeOnOtherWorld(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for trial := range 30 {
		shards := randomShards(rng, 8+rng.IntN(40), 300)
		base := Config{Seed: rng.Uint64(), Epoch: rng.IntN(3), Shuffle: true, Lanes: 1 + rng.IntN(6), Window: 1 + rng.IntN(500),
			BatchSize: 1 + rng.IntN(12), World: 4, RanksPerNode: 2}
		p0, err := New(shards, base)
		if err != nil {
			t.Fatal(err)
		}
		if p0.RanksPerNode != 2 {
			t.Fatalf("trial %d: plan keeps shards on nodes of %d", trial, p0.RanksPerNode)
		}
		consumed := min(int64(rng.IntN(p0.Batches+1))*int64(base.BatchSize), int64(p0.Samples))
		runs := AdvanceRun(nil, Run{World: 4, Consumed: consumed, RanksPerNode: p0.RanksPerNode})
		// The state's runs as a loader saves them.
		again, err := ParseRuns(FormatRuns(runs))
		if err != nil || !slices.Equal(again, runs) {
			t.Fatalf("runs %v -> %q -> %v, %v", runs, FormatRuns(runs), again, err)
		}
		for _, perNode := range []int{3, 1, 0} {
			what := fmt.Sprintf("trial %d: 4/2 consumed %d, then world 3 with %d a node", trial, consumed, perNode)
			seen := map[sampleID]int{}
			readJob(t, shards, base, seen, consumed)
			cfg := base
			cfg.World, cfg.RanksPerNode, cfg.Runs = 3, perNode, runs
			q, err := New(shards, cfg)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if q.RanksPerNode != 2 {
				t.Fatalf("%s: the resumed plan keeps shards on nodes of %d, want the first run's 2", what, q.RanksPerNode)
			}
			dropped, _ := readJob(t, shards, cfg, seen, -1)
			checkOnce(t, what, shards, seen, dropped)
		}
		// The same world: each rank continues its own sequence.
		for rank := range 4 {
			cfg := base
			cfg.Rank = rank
			p, _ := New(shards, cfg)
			whole := readPlan(t, p)
			cfg.Runs = runs
			q, err := New(shards, cfg)
			if err != nil {
				t.Fatal(err)
			}
			equalSeq(t, fmt.Sprintf("trial %d rank %d resumed after %d", trial, rank, consumed), readPlan(t, q), whole[consumed:])
		}
	}
}

// TestNodesElastic: runs of any world sizes and layouts, the first with nodes, each
// consuming part of what the last left, then a last run reading the rest: every
// sample exactly once, but for fewer than the last world size.
func TestNodesElastic(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	shards := randomShards(rng, 30, 150)
	base := Config{Seed: 9, Shuffle: true, Lanes: 4, Window: 300, BatchSize: 8}
	for trial := range 40 {
		var runs []Run
		seen := map[sampleID]int{}
		for range 1 + rng.IntN(3) {
			cfg := base
			cfg.Runs, cfg.World, cfg.RanksPerNode = runs, 1+rng.IntN(9), rng.IntN(4)
			p0, err := New(shards, cfg)
			if err != nil {
				t.Fatal(err)
			}
			consumed := min(int64(rng.IntN(p0.Batches+1))*int64(cfg.BatchSize), int64(p0.Samples))
			readJob(t, shards, cfg, seen, consumed)
			runs = AdvanceRun(runs, Run{World: cfg.World, Consumed: consumed, RanksPerNode: p0.RanksPerNode})
			runs, _ = ParseRuns(FormatRuns(runs))
		}
		cfg := base
		cfg.Runs, cfg.World, cfg.RanksPerNode = runs, 1+rng.IntN(9), rng.IntN(4)
		dropped, _ := readJob(t, shards, cfg, seen, -1)
		if dropped >= cfg.World {
			t.Fatalf("trial %d: %d dropped by a world of %d", trial, dropped, cfg.World)
		}
		checkOnce(t, fmt.Sprintf("trial %d runs %q then world %d", trial, FormatRuns(runs), cfg.World), shards, seen, dropped)
	}
}

// staying returns the fraction of what nodes read of each shard in epoch a that they
// read again in epoch b: sum over nodes and shards of min(a, b) over the samples read.
func staying(a, b [][]int64) float64 {
	var kept, all int64
	for k := range a {
		for s := range a[k] {
			kept += min(a[k][s], b[k][s])
			all += a[k][s]
		}
	}
	return float64(kept) / float64(all)
}

// shardsRead returns the shards each node reads any sample of.
func shardsRead(reads [][]int64) []map[int]bool {
	out := make([]map[int]bool, len(reads))
	for k, r := range reads {
		out[k] = map[int]bool{}
		for s, n := range r {
			if n > 0 {
				out[k][s] = true
			}
		}
	}
	return out
}

// TestNodesKeepTheirShards measures what stays on a node from epoch to epoch: with
// nodes, a node reads the same samples of the same shards every epoch (at most one
// shard shared with each neighbouring node), and no other, while the global reshuffle moves about
// (nodes-1)/nodes of them; a node's ranks still read other shards each epoch, and
// the samples come in another order.
func TestNodesKeepTheirShards(t *testing.T) {
	shards := testShards(slices.Repeat([]int{300}, 64)...)
	for _, c := range []struct{ world, perNode int }{{4, 1}, {8, 2}, {16, 4}, {6, 3}} {
		nodes := c.world / c.perNode
		cfg := Config{Seed: 3, Shuffle: true, Lanes: 8, Window: 500, BatchSize: 32, World: c.world, RanksPerNode: c.perNode}
		global := cfg
		global.RanksPerNode = 0
		var withNodes, without float64
		for epoch := range 3 {
			cfg.Epoch, global.Epoch = epoch, epoch
			a, err := NodeShards(shards, cfg, c.perNode)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Epoch++
			b, _ := NodeShards(shards, cfg, c.perNode)
			ga, _ := NodeShards(shards, global, c.perNode)
			global.Epoch++
			gb, _ := NodeShards(shards, global, c.perNode)
			if f := staying(a, b); f != 1 {
				// The groups are cut where the rank split's nodes start: a node
				// reads its group and nothing else, every epoch.
				t.Errorf("world %d/%d epoch %d: %.5f of a node's reads stay on it, want all", c.world, c.perNode, epoch, f)
			}
			withNodes += staying(a, b) / 3
			without += staying(ga, gb) / 3
			for k, set := range shardsRead(a) {
				// A node's group: 64/nodes shards, and a part of one at each boundary.
				if n := len(set); n > 64/nodes+2 {
					t.Errorf("world %d/%d epoch %d: node %d reads %d shards, want at most %d", c.world, c.perNode, epoch, k, n, 64/nodes+2)
				}
			}
			if c.perNode > 1 {
				// A node's ranks split its shards anew each epoch.
				p0, _ := New(shards, Config{Seed: 3, Shuffle: true, Lanes: 8, Window: 500, BatchSize: 32, World: c.world, RanksPerNode: c.perNode, Epoch: epoch})
				p1, _ := New(shards, Config{Seed: 3, Shuffle: true, Lanes: 8, Window: 500, BatchSize: 32, World: c.world, RanksPerNode: c.perNode, Epoch: epoch + 1})
				if slices.Equal(spanShards(p0), spanShards(p1)) {
					t.Errorf("world %d/%d epoch %d: rank 0 reads the same shards in the next epoch", c.world, c.perNode, epoch)
				}
			}
		}
		t.Logf("world %d, %d a node: %.3f of a node's reads stay on it from epoch to epoch (global reshuffle %.3f)", c.world, c.perNode, withNodes, without)
		if want := 1/float64(nodes) + 0.15; without > want {
			t.Errorf("world %d/%d: the global reshuffle keeps %.3f on a node, more than %.3f: does the test measure anything?", c.world, c.perNode, without, want)
		}
	}
}

// spanShards returns the shards a plan reads, sorted.
func spanShards(p Plan) []int {
	var s []int
	for _, sp := range p.Spans {
		s = append(s, sp.Shard)
	}
	slices.Sort(s)
	return slices.Compact(s)
}

// TestNodesReshuffle: a node's samples come in another order each epoch, and not in
// the order of the global reshuffle.
func TestNodesReshuffle(t *testing.T) {
	shards := testShards(slices.Repeat([]int{200}, 24)...)
	cfg := Config{Seed: 5, Shuffle: true, Lanes: 4, Window: 400, BatchSize: 16, World: 4, RanksPerNode: 2}
	p0, _ := New(shards, cfg)
	cfg.Epoch = 1
	p1, _ := New(shards, cfg)
	a, b := readPlan(t, p0), readPlan(t, p1)
	same := 0
	for i := range a {
		if a[i] == b[i] {
			same++
		}
	}
	if same > len(a)/50 {
		t.Fatalf("rank 0 yields %d of its %d samples at the same place in epochs 0 and 1", same, len(a))
	}
	// Adjacent samples come from many shards: the windows mix the node's lanes.
	from := map[int]bool{}
	for _, id := range a[:200] {
		from[id.shard] = true
	}
	if len(from) < 3 {
		t.Fatalf("rank 0's first 200 samples come from %d shards", len(from))
	}
}

// TestRunsWithNodes: a first run's ranks per node format and parse; a later run's
// or one of no fewer ranks per node than the world is refused.
func TestRunsWithNodes(t *testing.T) {
	runs := AdvanceRun(nil, Run{World: 4, Consumed: 10, RanksPerNode: 2})
	runs = AdvanceRun(runs, Run{World: 4, Consumed: 5, RanksPerNode: 1})
	runs = AdvanceRun(runs, Run{World: 3, Consumed: 7, RanksPerNode: 3})
	if got, want := FormatRuns(runs), "4/2x15,3x7"; got != want {
		t.Fatalf("runs %q, want %q", got, want)
	}
	if r, err := ParseRuns("4/2x15,3x7"); err != nil || !slices.Equal(r, runs) {
		t.Fatalf("parsed %v, %v", r, err)
	}
	for _, bad := range []string{"4/4x1", "4/0x1", "4/x1", "3x1,4/2x1", "4/-1x1", "4/2/1x1"} {
		if _, err := ParseRuns(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestNodesSmallGroupsReshuffleRanks: a node of two ranks whose group has one shard
// a lane (8 shards, 8 lanes) still gives its ranks other samples each epoch: its
// shards are cut at points drawn per epoch, where each lane would otherwise be one
// shard that the ranks split at the same places every epoch.
func TestNodesSmallGroupsReshuffleRanks(t *testing.T) {
	shards := testShards(slices.Repeat([]int{300}, 32)...)
	cfg := Config{Seed: 1, Shuffle: true, Lanes: 8, Window: 500, BatchSize: 32, World: 8, RanksPerNode: 2}
	var kept, all int
	for epoch := range 4 {
		cfg.Epoch = epoch
		a, err := New(shards, cfg)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Epoch = epoch + 1
		b, _ := New(shards, cfg)
		was := map[sampleID]bool{}
		for _, id := range readPlan(t, a) {
			was[id] = true
		}
		for _, id := range readPlan(t, b) {
			all++
			if was[id] {
				kept++
			}
		}
	}
	if f := float64(kept) / float64(all); f > 0.75 {
		t.Fatalf("rank 0 reads %.3f of its samples again the next epoch, want about half", f)
	}
}
