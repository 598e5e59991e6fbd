package index_test

import (
	"context"
	"os"
	"reflect"
	"sync"
	"testing"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
)

// sharedPlanFn is planFn planning with the entries of loaded (plan.Config.Loaded).
func sharedPlanFn(rank, world int) func([]shard.Info, shard.Loaded) (plan.Plan, error) {
	return func(infos []shard.Info, loaded shard.Loaded) (plan.Plan, error) {
		return plan.New(infos, plan.Config{Seed: 7, Rank: rank, World: world, Shuffle: true, BatchSize: 8, DropLast: true, GapBytes: 64 << 10, Window: 400, Lanes: 8, Loaded: loaded})
	}
}

// PlanShards of shards that others share (the sessions of a loader process) plans as
// Plan does without copying them: ranks planning from one list at once leave it as
// it is, each plan's Loaded holds the entries Plan's copy completes (their offsets
// read from the index), and the plan and its windows are Plan's. An index replaced
// since fails it, the list still as it was.
func TestPlanShared(t *testing.T) {
	const world = 64
	infos := synthShards("mem://b/d/", 2000, 40)
	lk, _, urls := synthLookup(t, infos, false)
	ctx := context.Background()
	counts, err := lk.Quick(ctx, urls, world)
	if err != nil {
		t.Fatal(err)
	}
	ranks := []int{0, 17, world - 1, 5, 30, 31}
	plans := make([]plan.Plan, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for k, rank := range ranks {
		wg.Go(func() {
			var got []shard.Info
			got, plans[k], errs[k] = index.PlanShards(ctx, counts, true, sharedPlanFn(rank, world))
			if errs[k] == nil && &got[0] != &counts[0] {
				t.Errorf("rank %d: PlanShards returned other shards", rank)
			}
		})
	}
	wg.Wait()
	for k, rank := range ranks {
		if errs[k] != nil {
			t.Fatal(errs[k])
		}
		copied, want, err := index.Plan(ctx, counts, planFn(rank, world))
		if err != nil {
			t.Fatal(err)
		}
		p := plans[k]
		if !reflect.DeepEqual(p.Spans, want.Spans) || !reflect.DeepEqual(planWindows(p), planWindows(want)) || p.Samples != want.Samples || p.Batches != want.Batches {
			t.Fatalf("rank %d: the plan over the shared shards differs from Plan's", rank)
		}
		loaded, read := p.Loaded(), 0
		for i := range copied {
			in, ok := loaded[i]
			if !reflect.DeepEqual(copied[i], counts[i]) && !ok {
				t.Fatalf("rank %d: shard %d: offsets Plan read are not in the plan's Loaded", rank, i)
			}
			if ok && !reflect.DeepEqual(in, copied[i]) {
				t.Fatalf("rank %d: shard %d: Loaded %+v, Plan's copy %+v", rank, i, in, copied[i])
			}
			if in.Offsets != nil {
				read++
			}
			if got := loaded.At(counts, i); !reflect.DeepEqual(got, copied[i]) {
				t.Fatalf("rank %d: shard %d: At %+v, Plan's copy %+v", rank, i, got, copied[i])
			}
		}
		if read == 0 || len(loaded) > len(counts)/8 {
			t.Fatalf("rank %d: %d shards' offsets read, %d entries loaded", rank, read, len(loaded))
		}
	}
	for i := range counts {
		if counts[i].Offsets != nil || counts[i].Members != nil {
			t.Fatalf("shard %d: PlanShards wrote into the shared shards", i)
		}
	}
	// Not shared: PlanInPlace's, the offsets written into the shards.
	own, err := lk.Quick(ctx, urls, world)
	if err != nil {
		t.Fatal(err)
	}
	got, p, err := index.PlanShards(ctx, own, false, sharedPlanFn(17, world))
	if err != nil || &got[0] != &own[0] || p.Loaded() != nil || !reflect.DeepEqual(p.Spans, plans[1].Spans) {
		t.Fatalf("PlanShards of the caller's own shards: %v", err)
	}

	// An index replaced since: an error.
	f, err := os.Create(lk.Index)
	if err != nil {
		t.Fatal(err)
	}
	replaced := synthShards("mem://b/d/", 2000, 40)
	replaced[0].Version = `"another"`
	if err := index.WriteAddressable(f, replaced); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, _, err := index.PlanShards(ctx, counts, true, sharedPlanFn(3, world)); err == nil {
		t.Fatal("offsets read from a replaced index")
	}
	for i := range counts {
		if counts[i].Offsets != nil {
			t.Fatalf("shard %d: offsets left in after a failure", i)
		}
	}
}
