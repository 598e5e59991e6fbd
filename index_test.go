package shardload_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// With sample offsets a rank reads only the samples it yields (ReadGap -1: not even
// those between two of its samples in a window it shares with another rank): every
// rank yields exactly the samples it yields without offsets, in the same order, and
// the ranks together read the dataset once (at world 64 over 4 shards of 1,000
// samples, without offsets, each rank reads its shards from their starts up to its
// samples: many times the dataset).
func TestOffsetsReadEachSampleOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("reads 4,000 samples 2 x 76 times")
	}
	ctx := context.Background()
	infos, total := countedShards(t, 1000, 5, 200, 2000)
	bare := slices.Clone(infos)
	for i := range bare {
		if len(bare[i].Offsets) != 1000 {
			t.Fatalf("shard %d: %d offsets", i, len(bare[i].Offsets))
		}
		bare[i].Offsets = nil
	}
	for _, world := range []int{1, 3, 8, 64} {
		var with, without int64
		for rank := range world {
			run := func(shards []shard.Info) ([]string, int64) {
				l, err := shardload.Open(ctx, shardload.Config{Shards: shards, Rank: rank, World: world, BatchSize: 16, Seed: 3,
					NoLock: true, Slabs: 2, SlabBytes: 1 << 20, ReadGap: -1})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				var keys []string
				for b, err := range l.All(ctx) {
					if err != nil {
						t.Fatalf("world %d rank %d: %v", world, rank, err)
					}
					keys = append(keys, b.Keys()...)
				}
				return keys, l.Stats().BytesIn
			}
			got, n := run(infos)
			want, m := run(bare)
			if !slices.Equal(got, want) {
				t.Fatalf("world %d rank %d: with offsets the samples differ (%d vs %d)", world, rank, len(got), len(want))
			}
			with += n
			without += m
		}
		ratio, ratioBefore := float64(with)/float64(total), float64(without)/float64(total)
		t.Logf("world %d: the ranks read %.2fx the dataset with offsets, %.2fx without", world, ratio, ratioBefore)
		if ratio > 1.1 {
			t.Errorf("world %d: the ranks read %.2fx the dataset's %d bytes with offsets", world, ratio, total)
		}
	}
}

// Ranks plan alike wherever their counts come from. Exact counts (a count, the node's
// store, an index beside the shards) give one Order; without an index, ranks of a job
// of several estimate their counts from the objects alone, so that a node whose
// store holds the exact entries plans as one whose store is empty.
func TestIndexSourcesAgree(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	paths, err := shardgen.Generate(dir, shardgen.Spec{Shards: 5, Samples: []int{9, 3, 14}, Seed: 8})
	if err != nil {
		t.Fatal(err)
	}
	open := func(cfg shardload.Config) (shardload.Order, plan.Plan) {
		t.Helper()
		l, err := shardload.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Order(), l.Plan()
	}
	base := shardload.Config{URLs: paths, World: 3, BatchSize: 4, Logf: t.Logf}
	// Without an index: estimates, the same with a full store and an empty one.
	full, empty := t.TempDir(), t.TempDir()
	counted := base
	counted.IndexDir, counted.CountFirst = full, true
	exact, exactPlan := open(counted)
	if exactPlan.Estimated {
		t.Fatal("CountFirst planned from estimates")
	}
	// A job of several ranks does not plan from estimates unless allowed to.
	if _, err := shardload.Open(ctx, base); !errors.Is(err, shardload.ErrEstimated) || !strings.Contains(err.Error(), "shardload index --output") {
		t.Fatalf("a job of 3 ranks without an index: %v; want ErrEstimated naming the fix", err)
	}
	est1 := base
	est1.IndexDir, est1.AllowEstimate = full, true
	est2 := base
	est2.IndexDir, est2.AllowEstimate = empty, true
	o1, p1 := open(est1)
	o2, p2 := open(est2)
	if !p1.Estimated || !p2.Estimated {
		t.Fatalf("without an index a job of 3 ranks planned from exact counts (%v, %v)", p1.Estimated, p2.Estimated)
	}
	if d := o1.Diff(o2); len(d) > 0 {
		t.Errorf("estimates differ between a node with the store and one without: %v", d)
	}
	// Exact counts agree however they were found: the store (a second CountFirst run),
	// and an index object beside the shards, seen from another node.
	again, _ := open(counted)
	infos, err := shardload.Count(ctx, counted)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Create(dir + "/" + index.FileName)
	index.Write(f, infos, true)
	f.Close()
	beside := base
	beside.IndexDir = t.TempDir()
	o3, p3 := open(beside)
	if p3.Estimated {
		t.Error("the index beside the shards was not used")
	}
	for name, o := range map[string]shardload.Order{"store": again, "beside": o3} {
		if d := exact.Diff(o); len(d) > 0 {
			t.Errorf("%s: the order differs in %v", name, d)
		}
	}
}

// Without an index the counts are estimated from the shards' sizes, and still every
// rank yields the same number of batches, no sample is read twice (repeats are only
// the padding rows, counted in Stats.Padded), and the samples left out are no more
// than the estimates were wrong by; a job of one rank too yields its planned batches.
func TestEstimatedEpochs(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	paths := unevenShards(t, dir)
	exact, err := shardload.Count(ctx, shardload.Config{URLs: paths, NoIndexStore: true})
	if err != nil {
		t.Fatal(err)
	}
	total, wrongBy := 0, 0
	for _, s := range exact {
		total += s.Samples
	}
	for _, world := range []int{1, 2, 3, 8} {
		base := shardload.Config{URLs: paths, NoIndexStore: true, World: world, BatchSize: 5, Seed: 1, ShuffleBuffer: 20,
			NoLock: true, Slabs: 2, SlabBytes: 1 << 20, Logf: t.Logf, AllowEstimate: true}
		infos, err := shardload.Shards(ctx, base)
		if err != nil {
			t.Fatal(err)
		}
		wrongBy = 0
		for i, s := range infos {
			if !s.Estimated && i > 0 {
				t.Fatalf("world %d: shard %d not estimated", world, i)
			}
			wrongBy += max(s.Samples-exact[i].Samples, exact[i].Samples-s.Samples)
		}
		seen := map[string]int{}
		var batches []int
		for rank := range world {
			cfg := base
			cfg.Rank = rank
			l, err := shardload.Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for b, err := range l.All(ctx) {
				if err != nil {
					t.Fatalf("world %d rank %d: %v", world, rank, err)
				}
				n++
				for _, k := range b.Keys()[:b.Rows-b.Padded] {
					seen[k]++
				}
			}
			if p := l.Plan(); n != p.Batches {
				t.Errorf("world %d rank %d: %d batches, planned %d", world, rank, n, p.Batches)
			}
			l.Close()
			batches = append(batches, n)
		}
		for k, c := range seen {
			if c > 1 {
				t.Errorf("world %d: sample %s read %d times", world, k, c)
			}
		}
		omitted := total - len(seen)
		t.Logf("world %d: estimates off by %d samples in all; %d of %d samples left out; batches per rank %v", world, wrongBy, omitted, total, batches)
		if slices.Min(batches) != slices.Max(batches) {
			t.Errorf("world %d: batches per rank %v", world, batches)
		}
		if omitted > wrongBy+world {
			t.Errorf("world %d: %d samples left out, more than the estimates were wrong by (%d) plus the remainder", world, omitted, wrongBy)
		}
	}
}

// A shard overwritten after its entry was taken fails the loader under either policy
// (the read is pinned to the entry's version), naming the shard: no rank reads another
// object with the old counts and offsets.
func TestStaleEntryFailsLoudly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	paths, err := shardgen.Generate(dir, shardgen.Spec{Shards: 3, SamplesPerShard: 40, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	infos, err := shardload.Count(ctx, shardload.Config{URLs: paths, NoIndexStore: true})
	if err != nil {
		t.Fatal(err)
	}
	other, err := shardgen.Generate(t.TempDir(), shardgen.Spec{Shards: 3, SamplesPerShard: 40, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(other[1])
	os.WriteFile(paths[1], data, 0o644)
	for _, policy := range []shardload.Policy{shardload.Fail, shardload.Skip} {
		for _, world := range []int{1, 2} {
			for rank := range world {
				l, err := shardload.Open(ctx, shardload.Config{Shards: infos, World: world, Rank: rank, OnError: policy, BatchSize: 8,
					ErrorBudget: &shardload.Budget{Fraction: 1}, NoLock: true, Slabs: 2, SlabBytes: 1 << 20, Logf: t.Logf})
				if err != nil {
					t.Fatal(err)
				}
				reads := false
				for _, s := range l.Plan().Spans {
					reads = reads || s.URL == paths[1]
				}
				err = runToError(ctx, l)
				l.Close()
				if !reads {
					continue
				}
				if !errors.Is(err, shardload.ErrCountMismatch) || !strings.Contains(err.Error(), paths[1]) || !strings.Contains(err.Error(), "changed") {
					t.Errorf("%v, world %d rank %d: %v", policy, world, rank, err)
				}
			}
		}
	}
}

// An epoch planned from estimated counts resumes exactly or not at all: a state saved
// after any batch resumes, in a job of the same world and batch size, to the batches
// the uninterrupted job yields after it (no sample twice, none lost), also once an
// index has been written since (the rest of the epoch is planned from the same
// estimates); in a job of another world size it is refused with ErrResume.
func TestEstimatedResume(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	paths := unevenShards(t, dir)
	base := shardload.Config{URLs: paths, NoIndexStore: true, World: 2, BatchSize: 5, Seed: 1, ShuffleBuffer: 20, AllowEstimate: true,
		NoLock: true, Slabs: 2, SlabBytes: 1 << 20, Logf: func(string, ...any) {}}
	type epoch struct {
		keys   [][]string
		states []shardload.State
	}
	run := func(cfg shardload.Config) epoch {
		t.Helper()
		l, err := shardload.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		e := epoch{states: []shardload.State{l.State()}}
		for b, err := range l.All(ctx) {
			if err != nil {
				t.Fatal(err)
			}
			e.keys = append(e.keys, b.Keys())
			e.states = append(e.states, l.State())
		}
		return e
	}
	full := map[int]epoch{}
	for rank := range 2 {
		cfg := base
		cfg.Rank = rank
		full[rank] = run(cfg)
	}
	check := func(what string, cfg shardload.Config) {
		for rank := range 2 {
			f := full[rank]
			for k := range len(f.keys) + 1 {
				c := cfg
				c.Rank, c.Resume = rank, &f.states[k]
				got := run(c)
				if len(got.keys) != len(f.keys)-k {
					t.Fatalf("%s: rank %d resumed after %d batches: %d batches, want %d", what, rank, k, len(got.keys), len(f.keys)-k)
				}
				for i := range got.keys {
					if !slices.Equal(got.keys[i], f.keys[k+i]) || got.states[i+1] != f.states[k+i+1] {
						t.Fatalf("%s: rank %d resumed after %d batches: batch %d is %v (state %+v), want %v (%+v)", what, rank, k, k+i, got.keys[i], got.states[i+1], f.keys[k+i], f.states[k+i+1])
					}
				}
			}
		}
	}
	check("estimated", base)
	// Another world size cannot replay the data-dependent batches: refused.
	other := base
	other.World, other.Resume = 3, &full[0].states[2]
	if _, err := shardload.Open(ctx, other); !errors.Is(err, shardload.ErrResume) || !strings.Contains(err.Error(), "estimated") {
		t.Errorf("world 3 from a world 2 estimated state: %v; want ErrResume saying why", err)
	}
	// An index written since: the epoch the state is in goes on from the estimates.
	infos, err := shardload.Count(ctx, shardload.Config{URLs: paths, NoIndexStore: true})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Create(dir + "/" + index.FileName)
	index.Write(f, infos, true)
	f.Close()
	check("indexed since", base)
}

// An index beside the shards is found, and its counts used, however a loader spells
// the shards: relative, "./", absolute, file://, a bare name in their directory; an
// index an older release wrote with relative names too; and a dataset moved to
// another directory with its index keeps its counts (matched by base name, version
// and size). A job of two ranks plans from them: no estimate, no counting pass.
func TestIndexEverySpelling(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	data := root + "/data"
	if _, err := shardgen.Generate(data, shardgen.Spec{Shards: 3, Samples: []int{9, 30, 14}, Seed: 8}); err != nil {
		t.Fatal(err)
	}
	names := []string{"train-000000.tar", "train-000001.tar", "train-000002.tar"}
	t.Chdir(root)
	write := func(dir string, infos []shard.Info) {
		f, err := os.Create(dir + "/" + index.FileName)
		if err != nil {
			t.Fatal(err)
		}
		if err := index.Write(f, infos, true); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	var rel []string
	for _, n := range names {
		rel = append(rel, "data/"+n)
	}
	infos, err := shardload.Count(ctx, shardload.Config{URLs: rel, NoIndexStore: true})
	if err != nil {
		t.Fatal(err)
	}
	exact := func(what string, urls []string) {
		t.Helper()
		var logs []string
		cfg := shardload.Config{URLs: urls, World: 2, BatchSize: 4, NoIndexStore: true, NoLock: true, Slabs: 1,
			Logf: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }}
		plan, err := shardload.PlanOf(ctx, cfg)
		if err != nil || plan.Estimated {
			t.Errorf("%s: plan estimated %v, %v", what, plan.Estimated, err)
		}
		for _, l := range logs {
			if strings.Contains(l, "reading") || strings.Contains(l, "estimated") {
				t.Errorf("%s: %s", what, l)
			}
		}
	}
	abs := func(dir string) (out []string) {
		for _, n := range names {
			out = append(out, root+"/"+dir+"/"+n)
		}
		return out
	}
	prefixed := func(p string, in []string) (out []string) {
		for _, u := range in {
			out = append(out, p+u)
		}
		return out
	}
	// As "shardload index" writes it: local shards under their canonical URLs.
	canon := slices.Clone(infos)
	for i := range canon {
		canon[i].URL = source.Canonical(canon[i].URL)
	}
	write(data, canon)
	exact("relative", rel)
	exact("./", prefixed("./", rel))
	exact("absolute", abs("data"))
	exact("file://", prefixed("file://", abs("data")))
	t.Chdir(data)
	exact("bare names", names)
	// An older index, its names relative to where it was run (the parent directory).
	t.Chdir(root)
	write(data, infos)
	exact("legacy, relative", rel)
	t.Chdir(data)
	exact("legacy, bare names", names)
	// Moved (renamed: same files, same modification times) with its index.
	t.Chdir(root)
	if err := os.Rename(data, root+"/moved"); err != nil {
		t.Fatal(err)
	}
	exact("moved", abs("moved"))
}

// unevenShards writes 6 shards of 1 to 90 samples of 100 to 3,000 bytes into dir:
// their counts estimated from their sizes are wrong by various amounts.
func unevenShards(t *testing.T, dir string) []string {
	t.Helper()
	paths, err := shardgen.Generate(dir, shardgen.Spec{Shards: 6, Samples: []int{40, 7, 90, 1, 33}, Seed: 4,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 100, MaxBytes: 3000}, {Ext: "cls", Kind: shardgen.Class}}})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

// Ranks that share a window split it by where its samples lie in the data, so each
// reads a run of every lane's part of it: at world 8 over 4 shards of 16-48 KiB
// samples, where every window is shared, the ranks together read the dataset once,
// a few requests a rank, whatever the read gap (the split by positions read it 2.4
// times with the object stores' 1 MiB gap, and 1.26 times in 64 requests a rank
// with a local file's).
func TestDefaultReadGap(t *testing.T) {
	ctx := context.Background()
	infos, total := countedShards(t, 200, 9, 16<<10, 48<<10)
	read := func(gap int64) (ratio float64, requests int64) {
		var in int64
		for rank := range 8 {
			l, err := shardload.Open(ctx, shardload.Config{Shards: infos, Rank: rank, World: 8, BatchSize: 16, Seed: 3,
				NoLock: true, Slabs: 2, SlabBytes: 1 << 20, ReadGap: gap})
			if err != nil {
				t.Fatal(err)
			}
			for _, err := range l.All(ctx) {
				if err != nil {
					t.Fatal(err)
				}
			}
			st := l.Stats()
			in, requests = in+st.BytesIn, requests+st.Requests
			l.Close()
		}
		return float64(in) / float64(total), requests
	}
	def, defReq := read(0)
	wide, wideReq := read(1 << 20)
	t.Logf("world 8: default gap %.2fx the dataset in %d requests; 1 MiB gap %.2fx in %d", def, defReq, wide, wideReq)
	if def > 1.02 || wide > 1.02 || defReq > 8*8 || wideReq > 8*8 {
		t.Errorf("default gap: %.2fx in %d requests, 1 MiB gap: %.2fx in %d requests; want at most 1.02x the dataset in at most 8 requests a rank", def, defReq, wide, wideReq)
	}
}

// countedShards writes 4 shards of per samples each (a "bin" of minBytes-maxBytes
// and a label) and counts them: their infos, with sample offsets, and their bytes.
func countedShards(t *testing.T, per int, seed uint64, minBytes, maxBytes int) ([]shard.Info, int64) {
	t.Helper()
	paths, err := shardgen.Generate(t.TempDir(), shardgen.Spec{Shards: 4, SamplesPerShard: per, Seed: seed,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: minBytes, MaxBytes: maxBytes}, {Ext: "cls", Kind: shardgen.Class}}})
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, p := range paths {
		fi, _ := os.Stat(p)
		total += fi.Size()
	}
	infos, err := shardload.Count(context.Background(), shardload.Config{URLs: paths, IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return infos, total
}

// A loader over an addressable index (what "shardload index" writes) plans each rank
// as one given every shard's offsets does, reading the offsets of its own shards only.
func TestAddressableIndexPlans(t *testing.T) {
	ctx := context.Background()
	infos, _ := countedShards(t, 300, 9, 200, 2000)
	idx := addressableIndex(t, infos)
	var urls []string
	for _, in := range infos {
		urls = append(urls, in.URL)
	}
	for _, world := range []int{1, 3, 16} {
		for rank := range world {
			cfg := shardload.Config{Rank: rank, World: world, BatchSize: 8, Seed: 2, ReadGap: -1, NoIndexStore: true}
			c := cfg
			c.Shards = infos
			want, err := shardload.PlanOf(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			c = cfg
			c.URLs, c.Index = urls, idx
			got, err := shardload.PlanOf(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got.Spans) != fmt.Sprint(want.Spans) || fmt.Sprint(planWindows(got)) != fmt.Sprint(planWindows(want)) {
				t.Fatalf("world %d rank %d: the plan over the addressable index differs from the one with every offset:\n%v\n%v", world, rank, got.Spans, want.Spans)
			}
		}
	}
}

// A mix of streams over an addressable index plans with the offsets of the shards
// it reads, as from shards whose every offset is known.
func TestAddressableIndexPlansMix(t *testing.T) {
	ctx := context.Background()
	infos, _ := countedShards(t, 300, 9, 200, 2000)
	idx := addressableIndex(t, infos)
	parts := [][]shard.Info{infos[:1], infos[1:]}
	var urls [2][]string
	for k, part := range parts {
		for _, in := range part {
			urls[k] = append(urls[k], in.URL)
		}
	}
	for _, world := range []int{1, 4} {
		for rank := range world {
			cfg := shardload.Config{Rank: rank, World: world, BatchSize: 8, Seed: 2, ReadGap: -1, NoIndexStore: true}
			c := cfg
			c.Streams = []shardload.Stream{{Shards: parts[0], Weight: 1}, {Shards: parts[1], Weight: 3}}
			want, err := shardload.PlanOf(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			c = cfg
			c.Streams = []shardload.Stream{{URLs: urls[0], Weight: 1}, {URLs: urls[1], Weight: 3}}
			c.Index = idx
			got, err := shardload.PlanOf(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got.Spans) != fmt.Sprint(want.Spans) || fmt.Sprint(planWindows(got)) != fmt.Sprint(planWindows(want)) {
				t.Fatalf("world %d rank %d: the mix's plan over an addressable index differs from the one with every offset:\n%v\n%v", world, rank, got.Spans, want.Spans)
			}
		}
	}
}

// addressableIndex writes infos as an addressable index in a new directory and
// returns its path.
func addressableIndex(t *testing.T, infos []shard.Info) string {
	t.Helper()
	idx := t.TempDir() + "/ds.index"
	f, err := os.Create(idx)
	if err != nil {
		t.Fatal(err)
	}
	if err := index.WriteAddressable(f, infos); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return idx
}

// planWindows returns p's windows, made again one by one.
func planWindows(p plan.Plan) []plan.Window {
	var ws []plan.Window
	for w := range p.Windows() {
		ws = append(ws, *w)
	}
	return ws
}
