package shardload_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/shard"
)

// Every negative or nonsensical setting is refused by Open with an error naming it,
// instead of being changed silently or panicking in a loader goroutine later.
func TestConfigRefusesBadSettings(t *testing.T) {
	paths := badDataset(t)
	infos := []shard.Info{{URL: paths[0], Samples: 10}}
	tests := []struct {
		name string
		set  func(*shardload.Config)
		want string
	}{
		{"QueueBytes", func(c *shardload.Config) { c.QueueBytes = -1 }, "QueueBytes -1 is negative"},
		{"ShuffleBytes", func(c *shardload.Config) { c.ShuffleBytes = -5 }, "ShuffleBytes -5 is negative"},
		{"SlabBytes", func(c *shardload.Config) { c.SlabBytes = -1 }, "SlabBytes -1 is negative"},
		{"MaxMemberSize", func(c *shardload.Config) { c.MaxMemberSize = -1 }, "MaxMemberSize -1 is negative"},
		{"Epoch", func(c *shardload.Config) { c.Epoch = -1 }, "Epoch -1 is negative"},
		{"Workers", func(c *shardload.Config) { c.Workers = -2 }, "Workers -2 is negative"},
		{"Rank", func(c *shardload.Config) { c.Rank, c.World = 4, 4 }, "Rank 4 outside [0, World 4)"},
		{"RankNoWorld", func(c *shardload.Config) { c.Rank = 1 }, "Rank 1 outside [0, World 1)"},
		{"MaxRatio", func(c *shardload.Config) { c.MaxRatio = 0.5 }, "MaxRatio 0.5"},
		{"MaxRatioNaN", func(c *shardload.Config) { c.MaxRatio = math.NaN() }, "MaxRatio NaN"},
		{"OnError", func(c *shardload.Config) { c.OnError = 7 }, "OnError 7"},
		{"Budget", func(c *shardload.Config) { c.ErrorBudget = &shardload.Budget{Fraction: 1.5} }, "ErrorBudget.Fraction 1.5"},
		{"BudgetCount", func(c *shardload.Config) { c.ErrorBudget = &shardload.Budget{Shards: -1} }, "ErrorBudget counts are negative"},
		{"CPUs", func(c *shardload.Config) { c.CPUs = []int{0, -1} }, "CPUs lists CPU -1"},
		{"Shards", func(c *shardload.Config) { c.Shards = []shard.Info{{URL: paths[0], Samples: -3}} }, "has -3 samples"},
		{"SlabsHuge", func(c *shardload.Config) { c.Slabs = 100000; c.SlabBytes = 1 << 30 }, "more than half of this machine's memory"},
		{"SlabSizeHuge", func(c *shardload.Config) { c.SlabBytes = 1 << 40 }, "more than half of this machine's memory"},
		{"SlabsOverflow", func(c *shardload.Config) { c.Slabs = 1 << 20; c.SlabBytes = 1 << 50 }, "overflows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := shardload.Config{Shards: infos, Fields: []decode.Field{mustField(t, "bin")}, BatchSize: 4, NoLock: true}
			tt.set(&cfg)
			l, err := shardload.Open(context.Background(), cfg)
			if err == nil {
				l.Close()
				t.Fatalf("Open accepted the setting; want an error with %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "bad config") {
				t.Errorf("Open: %v; want %q", err, tt.want)
			}
		})
	}
}

// An error budget of zero allows no skip at all (it used to become 1%).
func TestErrorBudgetZeroMeansNone(t *testing.T) {
	paths := badDataset(t)
	// 100 good samples and the bad shard b: 1% of 110 would allow one skip.
	dir := t.TempDir()
	infos := []shard.Info{{URL: paths[1], Samples: 10}}
	for i := range 10 {
		var members [][2]string
		for j := range 10 {
			key := fmt.Sprintf("g%d%02d", i, j)
			members = append(members, [2]string{key + ".bin", key}, [2]string{key + ".cls", "1"})
		}
		infos = append(infos, shard.Info{URL: writeTar(t, filepath.Join(dir, fmt.Sprintf("g%d.tar", i)), members...), Samples: 10})
	}
	fields := []decode.Field{mustField(t, "bin"), mustField(t, "cls")}
	ctx := context.Background()
	for _, tt := range []struct {
		budget *shardload.Budget
		fail   bool
	}{{&shardload.Budget{}, true}, {nil, true}, {&shardload.Budget{Samples: 2}, false}, {&shardload.Budget{Fraction: 0.02}, false}} {
		l, err := shardload.Open(ctx, shardload.Config{Shards: infos, Fields: fields, BatchSize: 8, NoShuffle: true, OnError: shardload.Skip,
			ErrorBudget: tt.budget, NoLock: true, Logf: func(string, ...any) {}})
		if err != nil {
			t.Fatal(err)
		}
		got := runToError(ctx, l)
		l.Close()
		if failed := errors.Is(got, shardload.ErrErrorBudget); failed != tt.fail {
			t.Errorf("budget %+v: %v; want failure %v", tt.budget, got, tt.fail)
		}
	}
}

// The error budget is the whole job's: a rank that reads few shards of a large job is
// not failed by one bad shard when the job's 1% allows it (it was 1% of the rank's
// own shards, so a rank of fewer than 100 shards failed on the first bad one).
func TestErrorBudgetIsTheJobs(t *testing.T) {
	dir := t.TempDir()
	var infos []shard.Info
	for i := range 200 {
		key := fmt.Sprintf("s%03d", i)
		p := writeTar(t, filepath.Join(dir, key+".tar"), [2]string{key + ".bin", key}, [2]string{key + ".cls", "1"})
		if i == 7 {
			os.WriteFile(p, []byte("not a tar file at all, and long enough to be read as a header block"), 0o644)
		}
		infos = append(infos, shard.Info{URL: p, Samples: 1})
	}
	fields := []decode.Field{mustField(t, "bin"), mustField(t, "cls")}
	ctx := context.Background()
	// World 4 without shuffling: rank 0 reads shards 0-49, among them the bad one.
	l, err := shardload.Open(ctx, shardload.Config{Shards: infos, Fields: fields, BatchSize: 5, NoShuffle: true, World: 4, Rank: 0,
		OnError: shardload.Skip, NoLock: true, Logf: func(string, ...any) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := runToError(ctx, l); err != nil {
		t.Fatalf("rank 0: %v; want the epoch read (1 shard of the job's 200 is within 1%%)", err)
	}
	if st := l.Stats(); st.SkippedShards != 1 || st.Samples != 49 {
		t.Errorf("stats %+v; want 1 shard skipped, 49 samples", st)
	}
}

// A shard whose count fails part-way fails Count under either policy: a count cut
// short on one node would give its ranks another plan than the others'.
func TestCountFailsOnAShardItCannotCount(t *testing.T) {
	paths := badDataset(t) // c.tar is cut inside its fifth sample
	for _, policy := range []shardload.Policy{shardload.Fail, shardload.Skip} {
		infos, err := shardload.Count(context.Background(), shardload.Config{URLs: paths, OnError: policy, Logf: func(string, ...any) {}})
		if err == nil || !strings.Contains(err.Error(), paths[2]) || !strings.Contains(err.Error(), "stopped after 4") {
			t.Errorf("%v: Count = %v, %v; want an error naming %s", policy, infos, err, paths[2])
		}
	}
}

// Order is the same for every rank of a job, and names the settings that differ.
func TestOrderFingerprint(t *testing.T) {
	paths, _ := dataset(t, 4, nil, shard.None)
	ctx := context.Background()
	infos, err := shardload.Count(ctx, shardload.Config{URLs: paths})
	if err != nil {
		t.Fatal(err)
	}
	order := func(set func(*shardload.Config)) shardload.Order {
		cfg := shardload.Config{Shards: infos, World: 2, BatchSize: 4, NoLock: true, Slabs: 1}
		set(&cfg)
		l, err := shardload.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Order()
	}
	base := order(func(c *shardload.Config) {})
	if base.Samples != 46 || base.Shards != 4 || base.World != 2 || !base.Shuffle || base.Lanes != 8 || len(base.JobFingerprint()) != 16 {
		t.Errorf("order %+v, fingerprint %q", base, base.JobFingerprint())
	}
	if o := order(func(c *shardload.Config) { c.Rank = 1; c.Workers = 1; c.QueueBytes = 1 << 20 }); o != base || o.JobFingerprint() != base.JobFingerprint() {
		t.Errorf("rank 1 with other workers: %+v, want %+v", o, base)
	}
	for _, tt := range []struct {
		set  func(*shardload.Config)
		want []string
	}{
		{func(c *shardload.Config) { c.OpenShards = 2 }, []string{"lanes"}},
		{func(c *shardload.Config) { c.ShuffleBuffer = 10 }, []string{"window"}},
		{func(c *shardload.Config) { c.NoShuffle = true }, []string{"shuffle", "lanes", "window", "split"}},
		{func(c *shardload.Config) { c.Seed = 9; c.BatchSize = 8 }, []string{"seed", "batch_size"}},
		{func(c *shardload.Config) {
			c.Shards = slices.Clone(infos)
			c.Shards[3].Samples--
			c.Shards[3].Offsets = c.Shards[3].Offsets[:c.Shards[3].Samples]
			c.Shards[3].Members = nil
		}, []string{"dataset", "samples"}},
	} {
		o := order(tt.set)
		d := base.Diff(o)
		if !slices.Equal(d, tt.want) || o.JobFingerprint() == base.JobFingerprint() {
			t.Errorf("Diff = %q (fingerprints %s, %s); want %q", d, base.JobFingerprint(), o.JobFingerprint(), tt.want)
		}
		// The order of the samples changes with the dataset, seed and shuffle, not
		// with the batching or the world.
		sameOrder := !slices.Contains(d, "dataset") && !slices.Contains(d, "seed") && !slices.Contains(d, "lanes") && !slices.Contains(d, "window") && !slices.Contains(d, "shuffle")
		if (o.Fingerprint() == base.Fingerprint()) != sameOrder {
			t.Errorf("%q differ: order fingerprints %s and %s", d, o.Fingerprint(), base.Fingerprint())
		}
	}
	// Without shuffling, the shuffle settings do not change the order.
	a := order(func(c *shardload.Config) { c.NoShuffle = true })
	b := order(func(c *shardload.Config) { c.NoShuffle = true; c.OpenShards = 2; c.ShuffleBuffer = 10 })
	if a.JobFingerprint() != b.JobFingerprint() || a.Fingerprint() != b.Fingerprint() {
		t.Errorf("no shuffle: %+v and %+v differ", a, b)
	}
}

// An index that says a shard has fewer samples than it holds fails the loader, naming
// the shard (it read 10 of 300 samples, exit 0); one that says more fails too, and
// counts whose sum overflows are refused at Open (they planned "0 samples").
func TestIndexThatDisagrees(t *testing.T) {
	dir := t.TempDir()
	var members [][2]string
	for j := range 30 {
		key := fmt.Sprintf("k%03d", j)
		members = append(members, [2]string{key + ".bin", key}, [2]string{key + ".cls", "1"})
	}
	p := writeTar(t, filepath.Join(dir, "a.tar"), members...)
	fields := []decode.Field{mustField(t, "bin"), mustField(t, "cls")}
	ctx := context.Background()
	for _, tt := range []struct {
		count  int
		policy shardload.Policy
		want   string
	}{
		{10, shardload.Fail, "more samples than the 10 its count says"},
		{10, shardload.Skip, "more samples than the 10 its count says"},
		{40, shardload.Fail, "has 30 samples, but its count says at least 40"},
	} {
		index := filepath.Join(dir, "index.jsonl")
		os.WriteFile(index, []byte(fmt.Sprintf("{\"url\": %q, \"samples\": %d}\n", p, tt.count)), 0o644)
		l, err := shardload.Open(ctx, shardload.Config{URLs: []string{p}, Index: index, Fields: fields, BatchSize: 4, NoLock: true,
			OnError: tt.policy, ErrorBudget: &shardload.Budget{Fraction: 1}, Logf: func(string, ...any) {}})
		if err != nil {
			t.Fatal(err)
		}
		got := runToError(ctx, l)
		l.Close()
		if tt.policy == shardload.Skip && tt.count > 30 {
			continue
		}
		if !errors.Is(got, shardload.ErrCountMismatch) || !strings.Contains(got.Error(), p) || !strings.Contains(got.Error(), tt.want) {
			t.Errorf("count %d, %v: %v; want %q naming %s", tt.count, tt.policy, got, tt.want, p)
		}
	}
	// Counts the shards' sizes cannot hold (a sample takes at least a 512-byte
	// header), and counts that overflow, are refused before anything is planned.
	q := writeTar(t, filepath.Join(dir, "b.tar"), members...)
	for _, n := range []int64{1_000_000_000, math.MaxInt64/2 + 1} {
		index := filepath.Join(dir, "huge.jsonl")
		os.WriteFile(index, []byte(fmt.Sprintf("{\"url\": %q, \"samples\": %d}\n{\"url\": %q, \"samples\": %d}\n", p, n, q, n)), 0o644)
		l, err := shardload.Open(ctx, shardload.Config{URLs: []string{p, q}, Index: index, Fields: fields, NoLock: true})
		if err == nil {
			l.Close()
			t.Fatalf("counts of %d samples in %s were accepted", n, p)
		}
		if !errors.Is(err, shard.ErrBadCount) || !strings.Contains(err.Error(), "cannot hold") || !strings.Contains(err.Error(), p) {
			t.Errorf("counts of %d samples: %v", n, err)
		}
	}
	// Library users' counts are checked against the sizes they give.
	_, err := shardload.Open(ctx, shardload.Config{Shards: []shard.Info{{URL: p, Samples: 1 << 40, Size: 30 << 10}}, Fields: fields, NoLock: true})
	if !errors.Is(err, shard.ErrBadCount) {
		t.Errorf("Config.Shards with 2^40 samples in 30 KiB: %v", err)
	}
}
