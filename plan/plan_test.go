package plan

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"

	"github.com/shardload/shardload/shard"
)

// uneven returns n shards with 7..19 samples each.
func uneven(n int) []shard.Info {
	out := make([]shard.Info, n)
	for i := range out {
		out[i] = shard.Info{URL: fmt.Sprintf("s3://b/%06d.tar", i), Samples: 7 + (i*5)%13}
	}
	return out
}

// planSamples lists the (shard, sample) pairs a plan reads.
func planSamples(p Plan) [][2]int {
	var out [][2]int
	for _, s := range p.Spans {
		for j := s.Skip; j < s.Skip+s.Take; j++ {
			out = append(out, [2]int{s.Shard, j})
		}
	}
	return out
}

func TestPlanCoversEpochOnce(t *testing.T) {
	for _, nShards := range []int{1, 5, 7, 16, 17} {
		shards := uneven(nShards)
		total := 0
		for _, s := range shards {
			total += s.Samples
		}
		for _, world := range []int{1, 2, 3, 8} {
			for _, dropLast := range []bool{false, true} {
				name := fmt.Sprintf("shards=%d/world=%d/droplast=%v", nShards, world, dropLast)
				t.Run(name, func(t *testing.T) {
					seen := map[[2]int]int{}
					batches := -1
					for rank := 0; rank < world; rank++ {
						p, err := New(shards, Config{Seed: 7, Epoch: 3, Rank: rank, World: world, Shuffle: true, BatchSize: 4, DropLast: dropLast})
						if errors.Is(err, ErrNoSamples) && total/world < 4 {
							return
						}
						if err != nil {
							t.Fatal(err)
						}
						if batches >= 0 && p.Batches != batches {
							t.Fatalf("rank %d has %d batches, rank 0 has %d", rank, p.Batches, batches)
						}
						batches = p.Batches
						got := planSamples(p)
						read := p.Samples
						if dropLast {
							read = p.Batches * 4 // the rest of the last batch is not read
						}
						if len(got) != read || p.Samples != total/world {
							t.Fatalf("rank %d: %d samples listed, Samples %d, want %d", rank, len(got), p.Samples, total/world)
						}
						wantBatches := (p.Samples + 3) / 4
						if dropLast {
							wantBatches = p.Samples / 4
						}
						if p.Batches != wantBatches {
							t.Errorf("rank %d: %d batches for %d samples", rank, p.Batches, p.Samples)
						}
						for _, s := range got {
							seen[s]++
						}
					}
					// Every sample at most once; exactly total%world are read by no rank.
					missing := 0
					for i, s := range shards {
						for j := 0; j < s.Samples; j++ {
							switch seen[[2]int{i, j}] {
							case 0:
								missing++
							case 1:
							default:
								t.Fatalf("sample %d of shard %d read %d times", j, i, seen[[2]int{i, j}])
							}
						}
					}
					want := total % world
					if dropLast {
						want += world * ((total / world) % 4)
					}
					if missing != want {
						t.Errorf("%d samples read by no rank, want %d", missing, want)
					}
				})
			}
		}
	}
}

func TestPlanDeterministicAndSeeded(t *testing.T) {
	shards := uneven(23)
	cfg := Config{Seed: 1, Epoch: 0, Rank: 1, World: 3, Shuffle: true, BatchSize: 8}
	a, _ := New(shards, cfg)
	b, _ := New(shards, cfg)
	if !slices.Equal(a.Spans, b.Spans) {
		t.Fatal("same settings gave different plans")
	}
	for _, c := range []Config{{Seed: 2}, {Epoch: 1}} {
		other := cfg
		other.Seed += c.Seed
		other.Epoch += c.Epoch
		o, _ := New(shards, other)
		if slices.Equal(a.Spans, o.Spans) {
			t.Errorf("seed %d epoch %d gave the same plan as seed 1 epoch 0", other.Seed, other.Epoch)
		}
	}
	cfg.Shuffle = false
	cfg.Rank = 0
	in, _ := New(shards, cfg)
	for i, s := range in.Spans {
		if s.Shard != i {
			t.Fatalf("unshuffled plan reads shard %d at position %d", s.Shard, i)
		}
	}
}

func TestPlanErrors(t *testing.T) {
	shards := []shard.Info{{URL: "a", Samples: 2}}
	for _, cfg := range []Config{
		{BatchSize: 0},
		{BatchSize: 1, Rank: 3, World: 3},
		{BatchSize: 1, World: 3},
		{BatchSize: 4, DropLast: true},
	} {
		if _, err := New(shards, cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}

// A plan holds its spans, not its windows: what it keeps does not grow with the
// samples of its shards. Ten times the samples in the same shards (ten times the
// windows) keep about the same heap; a plan that kept its windows and their feeds
// (some 300 bytes a window of 504 samples here) kept ten times more.
func TestPlanHeldGrowsWithShardsNotSamples(t *testing.T) {
	held := func(samples int) (int64, Plan) {
		shards := make([]shard.Info, 2000)
		for i := range shards {
			shards[i] = shard.Info{URL: fmt.Sprintf("s3://b/%06d.tar", i), Samples: samples, Size: int64(samples) << 10}
		}
		var a, b runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&a)
		p, err := New(shards, Config{Seed: 1, Rank: 1, World: 4, Shuffle: true, Lanes: 8, Window: 504, BatchSize: 64})
		if err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&b)
		runtime.KeepAlive(shards)
		return int64(b.HeapAlloc) - int64(a.HeapAlloc), p
	}
	held(1000) // what the first plan allocates once
	small, ps := held(1000)
	large, pl := held(10000)
	t.Logf("held: %d windows %d B, %d windows %d B", ps.WindowCount, small, pl.WindowCount, large)
	if pl.WindowCount < 9*ps.WindowCount {
		t.Fatalf("%d and %d windows: the test shows nothing", ps.WindowCount, pl.WindowCount)
	}
	if perShard := large / 2000; large > small+64<<10 || perShard > 256 {
		t.Fatalf("a plan of %d windows holds %d bytes (%d a shard), one of %d holds %d: it grows with the samples", pl.WindowCount, large, perShard, ps.WindowCount, small)
	}
}

// A Plan that New did not make has no windows (and does not panic).
func TestZeroPlanHasNoWindows(t *testing.T) {
	var p Plan
	for w := range p.Windows() {
		t.Fatalf("window %+v", w)
	}
	if _, ok := p.Cursor().Next(); ok {
		t.Fatal("a window from a zero Plan's cursor")
	}
}
