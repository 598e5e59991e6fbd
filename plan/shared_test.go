package plan

import (
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload/shard"
)

// windowsOf returns p's windows, made again one by one.
func windowsOf(p Plan) []Window {
	var ws []Window
	for w := range p.Windows() {
		ws = append(ws, *w)
	}
	return ws
}

// samePlan fails t unless a and b read the same spans in the same windows.
func samePlan(t *testing.T, what string, a, b Plan) {
	t.Helper()
	if !reflect.DeepEqual(a.Spans, b.Spans) || !reflect.DeepEqual(windowsOf(a), windowsOf(b)) || a.Samples != b.Samples || a.Batches != b.Batches {
		t.Fatalf("%s: the plans differ", what)
	}
}

// The ranks of a job planning at once from one list of shards hold one order (and
// one node order) between them, the order of their own list's counts: a plan of
// a copy of the list is the same plan; a list whose counts changed in place since
// gets an order of its own, that of the counts as they are. An order no plan holds
// any more is not kept.
func TestOrderShared(t *testing.T) {
	for _, perNode := range []int{0, 2} {
		t.Run(fmt.Sprintf("ranks_per_node=%d", perNode), func(t *testing.T) {
			shards := uneven(500)
			const world = 8
			cfg := Config{Seed: 3, Epoch: 1, World: world, Shuffle: true, Lanes: 4, Window: 50, BatchSize: 4, RanksPerNode: perNode}
			plans := make([]Plan, world)
			errs := make([]error, world)
			var wg sync.WaitGroup
			for r := range world {
				wg.Go(func() {
					c := cfg
					c.Rank = r
					plans[r], errs[r] = New(shards, c)
				})
			}
			wg.Wait()
			for r := range world {
				if errs[r] != nil {
					t.Fatal(errs[r])
				}
				if plans[r].seq != plans[0].seq || (perNode > 0) != (plans[r].RanksPerNode > 0) {
					t.Fatalf("rank %d: an order of its own", r)
				}
				c := cfg
				c.Rank = r
				alone, err := New(slices.Clone(shards), c)
				if err != nil {
					t.Fatal(err)
				}
				if alone.seq == plans[r].seq {
					t.Fatal("the order of another list of shards")
				}
				samePlan(t, fmt.Sprintf("rank %d", r), plans[r], alone)
			}
			// Counts changed in place: the order of the counts as they are.
			shards[7].Samples += 5
			shards[300].Samples = 0
			c := cfg
			c.Rank = 3
			changed, err := New(shards, c)
			if err != nil {
				t.Fatal(err)
			}
			fresh, err := New(slices.Clone(shards), c)
			if err != nil {
				t.Fatal(err)
			}
			if changed.seq == plans[3].seq {
				t.Fatal("the order of the counts before they changed")
			}
			samePlan(t, "changed counts", changed, fresh)
			if again, err := New(shards, c); err != nil || again.seq != changed.seq {
				t.Fatalf("planned again: %v, another order", err)
			}

			// Once no plan holds them, the orders of these shards are not kept.
			ocfg := OrderConfig{Seed: cfg.Seed, Epoch: cfg.Epoch, Shuffle: true, Lanes: cfg.Lanes, Window: cfg.Window}
			k, _ := keyOf(shards, ocfg, 0, 0)
			if perNode > 0 {
				k, _ = keyOf(shards, ocfg, world, perNode)
			}
			if !kept(k) {
				t.Fatal("no order kept while plans hold it")
			}
			plans, changed, fresh = nil, Plan{}, Plan{}
			runtime.KeepAlive(plans)
			deadline := time.Now().Add(5 * time.Second)
			for kept(k) {
				if time.Now().After(deadline) {
					t.Fatal("an order no plan holds is kept")
				}
				runtime.GC()
				time.Sleep(time.Millisecond)
			}
		})
	}
}

// kept reports whether an order is kept under k.
func kept(k orderKey) bool {
	if k.perNode > 0 {
		nodeOrders.mu.Lock()
		defer nodeOrders.mu.Unlock()
		return nodeOrders.m[k] != nil
	}
	orders.mu.Lock()
	defer orders.mu.Unlock()
	return orders.m[k] != nil
}

// A plan of shards without offsets, given some of their entries with offsets
// (Config.Loaded), is the plan of a copy of the shards with those offsets in, and
// hands them to its readers (Loaded, shard.Loaded.At).
func TestPlanLoaded(t *testing.T) {
	shards := make([]shard.Info, 2000)
	for i := range shards {
		shards[i] = shard.Info{URL: fmt.Sprintf("s3://b/%06d.tar", i), Samples: 40}
	}
	full := slices.Clone(shards)
	for i := range full {
		off := int64(0)
		for j := range full[i].Samples {
			full[i].Offsets = append(full[i].Offsets, off)
			off += 512 * int64(1+(i*7+j*13)%4000)
		}
		full[i].Size = off + 1024
		shards[i].Size = full[i].Size
	}
	cfg := Config{Seed: 7, Rank: 17, World: 64, Shuffle: true, Lanes: 8, Window: 400, BatchSize: 8, DropLast: true, GapBytes: 64 << 10}
	bare, err := New(shards, cfg)
	if err != nil {
		t.Fatal(err)
	}
	loaded := shard.Loaded{}
	withOffsets := slices.Clone(shards)
	for k, part := range bare.InPart(shards) {
		if part {
			loaded[k], withOffsets[k] = full[k], full[k]
		}
	}
	if len(loaded) == 0 {
		t.Fatal("no shard read in part: the test shows nothing")
	}
	c := cfg
	c.Loaded = loaded
	got, err := New(shards, c)
	if err != nil {
		t.Fatal(err)
	}
	want, err := New(withOffsets, cfg)
	if err != nil {
		t.Fatal(err)
	}
	samePlan(t, "loaded", got, want)
	if reflect.DeepEqual(got.Spans, bare.Spans) && reflect.DeepEqual(windowsOf(got), windowsOf(bare)) {
		t.Fatal("the offsets change nothing: the test shows nothing")
	}
	for k := range shards {
		if in := got.Loaded().At(shards, k); !reflect.DeepEqual(in, withOffsets[k]) {
			t.Fatalf("shard %d: At %+v", k, in)
		}
	}
}
