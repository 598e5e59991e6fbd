package shardload

import (
	"context"
	"errors"
	"fmt"
	"github.com/shardload/shardload/internal/budget"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
)

// keysOf runs an epoch and returns its keys in batch order; turn, when set, is called
// after every batch with the loader and the batch's number.
func keysOf(t *testing.T, cfg Config, turn func(l *Loader, n int)) ([]string, Stats) {
	t.Helper()
	ctx := context.Background()
	l, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var keys []string
	n := 0
	for b, err := range l.All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, b.Keys()...)
		if turn != nil {
			turn(l, n)
		}
		n++
	}
	return keys, l.Stats()
}

// TestKnobsKeepTheBatches: the settings the tuner changes while a loader runs (worker
// count, read-ahead, queue bytes, fetch parts) change nothing in what it yields.
func TestKnobsKeepTheBatches(t *testing.T) {
	paths, err := shardgen.Generate(t.TempDir(), shardgen.Spec{Shards: 24, Samples: []int{7, 10, 13, 16, 5}, Compression: shard.Zstd, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	base := Config{URLs: paths, BatchSize: 5, Seed: 3, ShuffleBuffer: 30, OpenShards: 3, NoIndexStore: true, CountFirst: true, NoAutotune: true}
	want, _ := keysOf(t, base, nil)
	if len(want) == 0 || slices.IsSorted(want) {
		t.Fatalf("%d keys, sorted: %v", len(want), slices.IsSorted(want))
	}
	settings := []tune.Knobs{
		{Workers: 1, QueueBytes: 64 << 10},
		{Workers: 6, ReadAhead: 5, QueueBytes: 4 << 20, FetchParallel: 8, FetchPartSize: 1 << 20},
		{Workers: 2, ReadAhead: 1, QueueBytes: 256 << 10},
		{Workers: 9, ReadAhead: 12, QueueBytes: 8 << 10},
	}
	queued := int64(0)
	got, st := keysOf(t, base, func(l *Loader, n int) {
		k := settings[n%len(settings)]
		l.p.SetKnobs(k)
		queued = max(queued, l.Stats().Queued)
	})
	if !slices.Equal(got, want) {
		t.Errorf("knobs changed mid-epoch: another order (%d keys, want %d)", len(got), len(want))
	}
	if queued <= 0 || st.Queued != 0 {
		t.Errorf("queued bytes: at most %d during the epoch, %d at its end; want some, then none", queued, st.Queued)
	}
	for _, ra := range []int{0, 2, 20} {
		cfg := base
		cfg.ReadAhead, cfg.Workers = ra, 3+ra
		if got, _ := keysOf(t, cfg, nil); !slices.Equal(got, want) {
			t.Errorf("read-ahead %d: another order", ra)
		}
	}
	// With the tuner on, judging every millisecond: its trials move the knobs while
	// the epoch runs (under -race, concurrently with the stages), and the order stays.
	defer func(d time.Duration) { tuneInterval = d }(tuneInterval)
	tuneInterval = time.Millisecond
	cfg := base
	cfg.NoAutotune, cfg.Tuner = false, NewTuner()
	for range 3 {
		if got, _ := keysOf(t, cfg, func(*Loader, int) { runtime.Gosched() }); !slices.Equal(got, want) {
			t.Errorf("autotuned: another order")
		}
	}
	steps := cfg.Tuner.s.Steps()
	t.Logf("tuner: %d intervals judged, at %v", steps, cfg.Tuner.Settings())
	if steps == 0 {
		t.Error("the tuner judged no interval")
	}
}

// TestMemoryBudget: settings left to their defaults are lowered to fit Memory, set
// ones that do not fit fail Open with ErrMemory saying what needs what, and the
// memory at the settings in effect stays within the budget.
func TestMemoryBudget(t *testing.T) {
	paths, err := shardgen.Generate(t.TempDir(), shardgen.Spec{Shards: 6, Samples: []int{20}, Seed: 8})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{URLs: paths, NoIndexStore: true, CountFirst: true, Slabs: 2, SlabBytes: 1 << 20, ShuffleBytes: 1 << 20, OpenShards: 4}
	fixed := int64(2<<20) + (1<<20+2<<20)*9/8 // slabs; shuffle and two batches, with an eighth
	// Room for queues of 512 KiB at most: the default 2 MiB must come down.
	cfg.Memory = fixed + 4*(512<<10)*9/8 + 4096
	l, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open with the defaults lowered to fit: %v", err)
	}
	s := l.Settings()
	for _, err := range l.All(context.Background()) {
		if err != nil {
			t.Fatal(err)
		}
	}
	st := l.Stats()
	l.Close()
	if s.QueueBytes > 512<<10 || s.QueueBytes < 256<<10 {
		t.Errorf("queue bytes %d: want the default lowered to fit (256-512 KiB)", s.QueueBytes)
	}
	if st.Memory > cfg.Memory || st.Memory == 0 {
		t.Errorf("memory at the settings in effect %d, budget %d", st.Memory, cfg.Memory)
	}

	cfg.QueueBytes = 4 << 20 // set: not lowered
	_, err = Open(context.Background(), cfg)
	if !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), "queues 4 x 4MiB") {
		t.Errorf("Open with queues that do not fit = %v; want ErrMemory naming the queues", err)
	}
}

// TestValidateMemory: a budget under what the settings need at the least is refused
// before anything is read (a server checks its settings once, at start).
func TestValidateMemory(t *testing.T) {
	cfg := Config{Slabs: 4, SlabBytes: 16 << 20, Memory: 64 << 20}
	if err := cfg.Validate(); !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), "slabs 4 x 16MiB") {
		t.Errorf("slabs of 64 MiB in a 64 MiB budget: %v", err)
	}
	cfg.Memory = 0 // the default, 1 GiB
	if err := cfg.Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	cfg.QueueBytes = 128 << 20 // set: 8 x 128 MiB do not fit
	if err := cfg.Validate(); err == nil {
		t.Error("queues of 8 x 128 MiB in 1 GiB: no error")
	}
}

// Close waits for the tuner's goroutine: none of a closed loader's goroutines is left
// to move the knobs of a pipeline that is gone.
func TestCloseWaitsForTheTuner(t *testing.T) {
	paths, err := shardgen.Generate(t.TempDir(), shardgen.Spec{Shards: 3, Samples: []int{20}, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(context.Background(), Config{URLs: paths, NoIndexStore: true, CountFirst: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Next(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.Close()
	select {
	case <-l.tuned:
	default:
		t.Error("Close returned while the tuner's goroutine runs")
	}
}

// TestMemoryBudgetCountsIndexAndPlan: what a loader holds of its shards' index
// entries and of its plan grows with the dataset and is counted in its budget: a
// budget the buffers alone fit, with the entries of 100,000 shards, is refused
// with ErrMemory naming them; with 2,000 shards the loader opens, and the memory
// it reports holds them.
func TestMemoryBudgetCountsIndexAndPlan(t *testing.T) {
	label, err := decode.ParseField("cls:int")
	if err != nil {
		t.Fatal(err)
	}
	shards := func(n int) []shard.Info {
		out := make([]shard.Info, n)
		for i := range out {
			out[i] = shard.Info{URL: fmt.Sprintf("/nonexistent/dataset/train-%06d.tar", i), Samples: 100, Size: 1 << 20}
		}
		return out
	}
	cfg := Config{Fields: []decode.Field{label}, NoIndexStore: true, NoAutotune: true, Slabs: 2, SlabBytes: 1 << 20, ShuffleBytes: 4 << 20,
		OpenShards: 4, BatchSize: 32, Memory: 24 << 20, Logf: t.Logf}

	cfg.Shards = shards(100_000)
	p, err := plan.New(cfg.Shards, plan.Config{Rank: 0, World: 1, BatchSize: 32})
	if err != nil {
		t.Fatal(err)
	}
	held := budget.Held(cfg.Shards, &p)
	if min := int64(100_000) * int64(len(cfg.Shards[0].URL)+int(unsafe.Sizeof(shard.Info{}))); held < min {
		t.Fatalf("held %d bytes for 100,000 shards' entries, less than their URLs and Infos' %d", held, min)
	}
	_, err = Open(context.Background(), cfg)
	if !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), "index entries and the plan") {
		t.Fatalf("Open of 100,000 shards' entries (%d MB) and 10 MB of buffers in a 24 MiB budget = %v; want ErrMemory naming the index entries", held>>20, err)
	}

	cfg.Shards = shards(2_000)
	l, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open of 2,000 shards in the same budget: %v", err)
	}
	st := l.Stats()
	l.Close()
	if p := l.Plan(); st.Memory < budget.Held(cfg.Shards, &p) || st.Memory > cfg.Memory {
		t.Errorf("memory at the settings in effect %d: want at least the entries and plan held (%d), at most the budget %d", st.Memory, budget.Held(cfg.Shards, &p), cfg.Memory)
	}
}

// TestMemoryBudgetCountsDecompressors: each open shard of zstd shards holds a
// decompressor's window (shard.InflateBytes), which the budget counts: a budget
// with room for the buffers but not for the decompressors fails Open with ErrMemory
// naming them, and with room for them the memory in effect counts them.
func TestMemoryBudgetCountsDecompressors(t *testing.T) {
	paths, err := shardgen.Generate(t.TempDir(), shardgen.Spec{Shards: 4, Samples: []int{20}, Seed: 8, Compression: shard.Zstd})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{URLs: paths, NoIndexStore: true, CountFirst: true, Slabs: 2, SlabBytes: 1 << 20, ShuffleBytes: 1 << 20,
		OpenShards: 4, QueueBytes: 256 << 10}
	buffers := int64(2<<20) + (4*(256<<10)+1<<20+2<<20)*9/8 // slabs; queues, shuffle and two batches, with an eighth
	inflate := 4 * shard.InflateBytes(shard.Zstd)
	cfg.Memory = buffers + inflate - shard.InflateBytes(shard.Zstd) + 4096
	if _, err := Open(context.Background(), cfg); !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), "decompressors 34MiB (4 open shards x 8704KiB)") {
		t.Fatalf("Open without room for 4 decompressors = %v; want ErrMemory naming them", err)
	}
	cfg.Memory = buffers + inflate + 4096
	l, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open with room for the decompressors: %v", err)
	}
	defer l.Close()
	for _, err := range l.All(context.Background()) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := l.Stats(); st.Memory < inflate || st.Memory > cfg.Memory {
		t.Errorf("memory at the settings in effect %d: want the decompressors' %d within the budget %d", st.Memory, inflate, cfg.Memory)
	}
}
