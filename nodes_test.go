package shardload_test

import (
	"context"
	stdmaps "maps"
	"strings"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/shard"
)

// TestNodeAffinityResume: a job of 4 ranks, 2 a node (Config.RanksPerNode), reads
// the same samples on each node in epochs 0 and 1 (NoNodeAffinity does not); its
// state records the layout, and resumed on 3 ranks (one node of 3, three of 1,
// none given) every sample of the epoch is read once.
func TestNodeAffinityResume(t *testing.T) {
	infos, keys := resumeDataset(t, 12, shard.None)
	base := shardload.Config{Shards: infos, BatchSize: 6, Seed: 8, World: 4, RanksPerNode: 2, ShuffleBuffer: 50, NoLock: true, Slabs: 2, SlabBytes: 1 << 20}
	node := func(cfg shardload.Config, k int) map[string]bool {
		out := map[string]bool{}
		for rank := 2 * k; rank < 2*k+2; rank++ {
			cfg.Rank = rank
			batches, _, _ := run(t, cfg)
			for _, b := range batches {
				for _, key := range b {
					out[key] = true
				}
			}
		}
		return out
	}
	next := base
	next.Epoch = 1
	global, globalNext := base, next
	global.NoNodeAffinity, globalNext.NoNodeAffinity = true, true
	if !stdmaps.Equal(node(base, 0), node(next, 0)) {
		t.Fatal("node 0 reads other samples in epoch 1")
	}
	if stdmaps.Equal(node(global, 0), node(globalNext, 0)) {
		t.Fatal("node 0 reads the same samples in epochs 0 and 1 with NoNodeAffinity")
	}

	const cut = 2
	consumed := map[string]int{}
	var state shardload.State
	for rank := range 4 {
		cfg := base
		cfg.Rank = rank
		full, states, _ := run(t, cfg)
		if rank > 0 && states[cut] != state {
			t.Fatalf("rank %d's state %+v differs from rank 0's %+v", rank, states[cut], state)
		}
		state = states[cut]
		for _, b := range full[:cut] {
			for _, k := range b {
				consumed[k]++
			}
		}
	}
	if !strings.HasPrefix(state.Runs, "4/2x") {
		t.Fatalf("state's runs %q: want the layout 4/2 recorded", state.Runs)
	}
	for _, perNode := range []int{3, 1, 0} {
		seen := stdmaps.Clone(consumed)
		var dropped int
		for rank := range 3 {
			cfg := base
			cfg.World, cfg.Rank, cfg.RanksPerNode, cfg.Resume, cfg.BatchSize = 3, rank, perNode, &state, 5
			l, err := shardload.Open(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			dropped = l.Plan().Dropped
			for b, err := range l.All(context.Background()) {
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range b.Keys() {
					seen[k]++
				}
			}
			l.Close()
		}
		missing := 0
		for k := range keys {
			switch seen[k] {
			case 0:
				missing++
			case 1:
			default:
				t.Fatalf("4/2 resumed on 3 ranks, %d a node: %s read %d times", perNode, k, seen[k])
			}
		}
		if missing != dropped {
			t.Fatalf("4/2 resumed on 3 ranks, %d a node: %d samples never read, %d dropped", perNode, missing, dropped)
		}
	}
}

// TestNodeAffinityOrder: the layout is part of what a job's ranks compare, not of
// the order a state resumes under.
func TestNodeAffinityOrder(t *testing.T) {
	infos, _ := resumeDataset(t, 4, shard.None)
	order := func(cfg shardload.Config) shardload.Order {
		l, err := shardload.Open(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Order()
	}
	a := order(shardload.Config{Shards: infos, World: 4, RanksPerNode: 2, BatchSize: 4, NoLock: true, Slabs: 2, SlabBytes: 1 << 20})
	b := order(shardload.Config{Shards: infos, World: 4, BatchSize: 4, NoLock: true, Slabs: 2, SlabBytes: 1 << 20})
	c := order(shardload.Config{Shards: infos, World: 4, RanksPerNode: 2, NoNodeAffinity: true, BatchSize: 4, NoLock: true, Slabs: 2, SlabBytes: 1 << 20})
	if a.RanksPerNode != 2 || b.RanksPerNode != 0 || c.RanksPerNode != 0 {
		t.Fatalf("ranks per node %d, %d, %d; want 2, 0, 0", a.RanksPerNode, b.RanksPerNode, c.RanksPerNode)
	}
	if a.JobFingerprint() == b.JobFingerprint() || b.JobFingerprint() != c.JobFingerprint() {
		t.Fatal("the job fingerprints do not tell the layouts apart")
	}
	if a.Fingerprint() != b.Fingerprint() {
		t.Fatal("the layout changes the order a state resumes under")
	}
}
