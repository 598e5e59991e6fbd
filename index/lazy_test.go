package index_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// synthShards returns n shards under prefix of samples samples each (some of them
// compressed, without offsets, some empty), whose samples vary in size, so that a
// plan's read gaps depend on the offsets.
func synthShards(prefix string, n, samples int) []shard.Info {
	infos := make([]shard.Info, n)
	for i := range infos {
		info := shard.Info{URL: fmt.Sprintf("%strain-%06d.tar", prefix, i), Samples: samples, Version: fmt.Sprintf(`"v%d"`, i)}
		switch {
		case i%97 == 5:
			info.URL += ".gz" // a compressed shard: a count, no offsets
			info.Size = int64(samples) * 4096
		case i%101 == 7:
			info.Samples, info.Size = 0, 1024
		default:
			off := int64(0)
			for j := range samples {
				info.Offsets = append(info.Offsets, off)
				off += 512 * int64(1+(i*7+j*13)%4000) // up to 2 MB a sample
			}
			info.Size = off + 1024
		}
		infos[i] = info
	}
	return infos
}

// memShards serves Stat of synthetic shards (the objects an index was written for).
type memShards struct{ infos map[string]shard.Info }

func (m memShards) Stat(_ context.Context, url string) (source.Info, error) {
	in, ok := m.infos[url]
	if !ok {
		return source.Info{}, source.ErrNotFound
	}
	return source.Info{URL: url, Size: in.Size, Version: in.Version}, nil
}

func (m memShards) Open(context.Context, string) (io.ReadCloser, error) {
	return nil, fmt.Errorf("memShards: no data")
}

// rangeFile is the File source counting the ranges read of each object.
type rangeFile struct {
	source.File
	mu     sync.Mutex
	ranges int
	bytes  int64
}

func (f *rangeFile) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	f.mu.Lock()
	f.ranges++
	f.bytes += length
	f.mu.Unlock()
	return f.File.OpenRange(ctx, url, off, length)
}

// synthLookup writes infos as an addressable index (or with Write when old) to a
// temporary file and returns a Lookup of it whose shards are "mem://" objects.
func synthLookup(t testing.TB, infos []shard.Info, old bool) (index.Lookup, *rangeFile, []string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), index.FileName)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if old {
		err = index.Write(f, infos, true)
	} else {
		err = index.WriteAddressable(f, infos)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	byURL := map[string]shard.Info{}
	urls := make([]string, len(infos))
	for i, in := range infos {
		byURL[in.URL], urls[i] = in, in.URL
	}
	rf := &rangeFile{}
	reg := &source.Registry{}
	reg.Register("file", rf)
	reg.Register("mem", memShards{byURL})
	return index.Lookup{Sources: reg, Index: p, NoBeside: true, LazyOffsets: true}, rf, urls
}

// planFn plans rank of world. With DropLast, a rank's last window holds the first
// samples of its share in position order, not runs of its lanes: the gaps between
// them, and so its spans, depend on the offsets.
func planFn(rank, world int) func([]shard.Info) (plan.Plan, error) {
	return func(infos []shard.Info) (plan.Plan, error) {
		return plan.New(infos, plan.Config{Seed: 7, Rank: rank, World: world, Shuffle: true, BatchSize: 8, DropLast: true, GapBytes: 64 << 10, Window: 400, Lanes: 8})
	}
}

// The addressable index reads back whole, as written; shards with and without
// offsets, empty ones, over several blocks.
func TestAddressableRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 3000} {
		infos := synthShards("s3://b/d/", n, 50)
		var buf bytes.Buffer
		if err := index.WriteAddressable(&buf, infos); err != nil {
			t.Fatal(err)
		}
		got, err := index.Read(bytes.NewReader(buf.Bytes()), "x")
		if err != nil {
			t.Fatal(n, err)
		}
		if len(got) != len(infos) || (n > 0 && !reflect.DeepEqual(got, infos)) {
			t.Fatalf("%d shards: read back differs", n)
		}
	}
}

// A reader of earlier releases (a zstd decoder and the JSON lines of Write, as
// "zstd -d" then a plain index) reads an addressable index as every shard's URL,
// count, version and size, without offsets; and this release reads the indexes of
// earlier releases (Write), plain and compressed, with their offsets, whole, through
// Quick too.
func TestAddressableAndOldReaders(t *testing.T) {
	infos := synthShards("mem://b/d/", 500, 20)
	var buf bytes.Buffer
	if err := index.WriteAddressable(&buf, infos); err != nil {
		t.Fatal(err)
	}
	zr, err := zstd.NewReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := io.ReadAll(zr)
	zr.Close()
	if err != nil {
		t.Fatalf("a plain zstd decoder: %v", err)
	}
	old, err := index.Read(bytes.NewReader(plain), "old")
	if err != nil {
		t.Fatal(err)
	}
	if len(old) != len(infos) {
		t.Fatalf("%d shards, want %d", len(old), len(infos))
	}
	for i, in := range old {
		want := infos[i]
		want.Offsets = nil
		if !reflect.DeepEqual(in, want) {
			t.Fatalf("shard %d: %+v, want %+v", i, in, want)
		}
	}
	for _, compress := range []bool{false, true} {
		buf.Reset()
		if err := index.Write(&buf, infos, compress); err != nil {
			t.Fatal(err)
		}
		got, err := index.Read(&buf, "v1")
		if err != nil || !reflect.DeepEqual(got, infos) {
			t.Fatalf("compress %v: %v", compress, err)
		}
	}
	lk, _, urls := synthLookup(t, infos, true)
	got, err := lk.Quick(context.Background(), urls, 8)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, infos) || index.Deferred(got) != 0 {
		t.Fatalf("an index of Write through Quick: not every entry as written, or %d deferred", index.Deferred(got))
	}
}

// Quick reads the counts of an addressable index and no offsets; Plan reads those of
// the shards the rank's plan reads (one ranged read per block of them), and its plan
// is the plan of the whole index. Resolve (Count) still reads every offset.
func TestPlanLoadsOnlyTouchedOffsets(t *testing.T) {
	const world = 64
	infos := synthShards("mem://b/d/", 2000, 40)
	lk, rf, urls := synthLookup(t, infos, false)
	ctx := context.Background()
	whole, err := lk.Resolve(ctx, urls)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(whole, infos) {
		t.Fatal("Resolve: not every entry as written")
	}
	eager := lk
	eager.LazyOffsets = false
	if got, err := eager.Quick(ctx, urls, world); err != nil || !reflect.DeepEqual(got, infos) || index.Deferred(got) != 0 {
		t.Fatalf("Quick without LazyOffsets: %v, or not every entry as written", err)
	}
	split, wholeOnly := false, 0
	for k, rank := range []int{0, 17, world - 1, 5} {
		lk := lk
		if k%2 == 1 {
			// Every object checked against its entry: entries looked up by URL,
			// rather than taken in order.
			lk.CheckUpTo = len(urls) + 1
		}
		counts, err := lk.Quick(ctx, urls, world)
		if err != nil {
			t.Fatal(err)
		}
		withOffsets := 0
		for i, in := range counts {
			want := infos[i]
			want.Offsets = nil
			if in.Offsets != nil {
				withOffsets++
			} else if !reflect.DeepEqual(in, want) {
				t.Fatalf("shard %d: %+v", i, in)
			}
		}
		if withOffsets != 0 || index.Deferred(counts) == 0 {
			t.Fatalf("Quick: %d shards with offsets, %d deferred", withOffsets, index.Deferred(counts))
		}
		rf.mu.Lock()
		rf.ranges, rf.bytes = 0, 0
		rf.mu.Unlock()
		got, p, err := index.Plan(ctx, counts, planFn(rank, world))
		if err != nil {
			t.Fatal(err)
		}
		if first, err := planFn(rank, world)(counts); err != nil || !reflect.DeepEqual(first.Spans, p.Spans) {
			split = true // the offsets split spans: the second plan is another
		}
		want, err := planFn(rank, world)(infos)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(p.Spans, want.Spans) || !reflect.DeepEqual(planWindows(p), planWindows(want)) || p.Samples != want.Samples || p.Batches != want.Batches {
			t.Fatalf("rank %d: the plan from lazily read offsets differs from the plan of every offset", rank)
		}
		// The shards the plan reads in part (entered or left at a sample, or with
		// samples dropped between runs) have their offsets; those it reads whole
		// need none and have none, nor have the shards it does not read.
		touched, partial := map[int]bool{}, map[int]bool{}
		whole := p.Whole(infos)
		for k, sp := range p.Spans {
			touched[sp.Shard] = true
			if !whole[k] {
				partial[sp.Shard] = true
			}
			if whole[k] != (sp.Skip == 0 && sp.Take == infos[sp.Shard].Samples && !dropsSamples(p, k)) {
				t.Fatalf("rank %d: span %d %+v: Whole says %v", rank, k, sp, whole[k])
			}
		}
		for i, in := range got {
			bare := infos[i]
			bare.Offsets = nil
			switch {
			case partial[i] && !reflect.DeepEqual(in, infos[i]):
				t.Fatalf("rank %d: shard %d read in part by the plan: %+v", rank, i, in)
			case !partial[i] && !reflect.DeepEqual(in, bare):
				t.Fatalf("rank %d: shard %d read whole or not at all has its offsets decoded: %+v", rank, i, in)
			}
		}
		for i := range counts {
			if counts[i].Offsets != nil {
				t.Fatal("Plan changed the shards it was given")
			}
		}
		if len(partial) == 0 || len(touched) > len(infos)/4 || rf.ranges == 0 || rf.ranges > len(partial) {
			t.Fatalf("rank %d: %d shards read, %d in part, %d ranged reads of the index", rank, len(touched), len(partial), rf.ranges)
		}
		wholeOnly += len(touched) - len(partial)
		if index.Deferred(got) != index.Deferred(counts)-len(partial) {
			t.Fatalf("rank %d: Deferred of Plan's shards: %d, of its input %d, %d read in part, %d touched", rank, index.Deferred(got), index.Deferred(counts), len(partial), len(touched))
		}
		// Planning again from Plan's shards reads nothing more.
		rf.mu.Lock()
		before := rf.ranges
		rf.mu.Unlock()
		if _, p2, err := index.Plan(ctx, got, planFn(rank, world)); err != nil || !reflect.DeepEqual(p2.Spans, p.Spans) || rf.ranges != before {
			t.Fatalf("rank %d: planning again: %v, %d more reads", rank, err, rf.ranges-before)
		}
	}
	if !split {
		t.Fatal("no plan from the counts alone differs from the plan with offsets: the test shows nothing")
	}
	if wholeOnly == 0 {
		t.Fatal("no rank reads a shard whole: the test shows nothing of the offsets left unread")
	}
}

// dropsSamples reports whether span k of p has samples read and dropped.
func dropsSamples(p plan.Plan, k int) bool {
	for w := range p.Windows() {
		for _, f := range w.Feeds {
			if f.Span == k && f.Slot < 0 {
				return true
			}
		}
	}
	return false
}

// PlanInPlace plans as Plan does, writing the offsets it reads into the shards it was
// given (those of the shards the plan reads, and no others) rather than into a copy;
// when the offsets cannot be read, the shards are left as they were.
func TestPlanInPlace(t *testing.T) {
	const world, rank = 64, 17
	infos := synthShards("mem://b/d/", 2000, 40)
	lk, rf, urls := synthLookup(t, infos, false)
	ctx := context.Background()
	counts, err := lk.Quick(ctx, urls, world)
	if err != nil {
		t.Fatal(err)
	}
	copied, want, err := index.Plan(ctx, counts, planFn(rank, world))
	if err != nil {
		t.Fatal(err)
	}
	deferred := index.Deferred(counts)
	got, p, err := index.PlanInPlace(ctx, counts, planFn(rank, world))
	if err != nil {
		t.Fatal(err)
	}
	if &got[0] != &counts[0] {
		t.Fatal("PlanInPlace returned a copy")
	}
	if !reflect.DeepEqual(got, copied) || !reflect.DeepEqual(p.Spans, want.Spans) || !reflect.DeepEqual(planWindows(p), planWindows(want)) {
		t.Fatal("PlanInPlace's shards or plan differ from Plan's")
	}
	read := 0
	for _, in := range got {
		if in.Offsets != nil {
			read++
		}
	}
	if read == 0 || index.Deferred(got) != deferred-read {
		t.Fatalf("%d shards' offsets read; %d deferred, were %d", read, index.Deferred(got), deferred)
	}
	rf.mu.Lock()
	before := rf.ranges
	rf.mu.Unlock()
	if _, p2, err := index.PlanInPlace(ctx, got, planFn(rank, world)); err != nil || !reflect.DeepEqual(p2.Spans, p.Spans) || rf.ranges != before {
		t.Fatalf("planning again: %v, %d more reads", err, rf.ranges-before)
	}

	// Another rank's offsets, from an index replaced since: an error, and the
	// shards as they were.
	other, err := lk.Quick(ctx, urls, world)
	if err != nil {
		t.Fatal(err)
	}
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
	if _, _, err := index.PlanInPlace(ctx, other, planFn(3, world)); err == nil {
		t.Fatal("offsets read from a replaced index")
	}
	for i, in := range other {
		if in.Offsets != nil {
			t.Fatalf("shard %d: offsets left in after a failure", i)
		}
	}
}

// Shards from anywhere but Quick over an addressable index are planned once, as
// they are.
func TestPlanOtherShards(t *testing.T) {
	infos := synthShards("mem://b/d/", 300, 10)
	calls := 0
	fn := func(in []shard.Info) (plan.Plan, error) { calls++; return planFn(1, 4)(in) }
	got, p, err := index.Plan(context.Background(), infos, fn)
	want, _ := planFn(1, 4)(infos)
	if err != nil || calls != 1 || &got[0] != &infos[0] || !reflect.DeepEqual(p.Spans, want.Spans) {
		t.Fatalf("%v, %d calls", err, calls)
	}
}

// A block read from an index replaced since its counts were read is an error, not
// another index's offsets.
func TestPlanIndexReplaced(t *testing.T) {
	infos := synthShards("mem://b/d/", 400, 30)
	lk, _, urls := synthLookup(t, infos, false)
	counts, err := lk.Quick(context.Background(), urls, 4)
	if err != nil {
		t.Fatal(err)
	}
	other := synthShards("mem://b/d/", 400, 30)
	other[0].Version = `"another"`
	f, err := os.Create(lk.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := index.WriteAddressable(f, other); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, _, err := index.Plan(context.Background(), counts, planFn(0, 4)); err == nil {
		t.Fatal("offsets read from a replaced index")
	}
}

func FuzzReadAddressable(f *testing.F) {
	for _, infos := range [][]shard.Info{
		{{URL: "s3://b/a.tar", Samples: 2, Version: "v", Size: 2048, Offsets: []int64{0, 1024}}, {URL: "s3://b/b.tar.gz", Samples: 3}},
		synthShards("s3://b/", 40, 3),
		memberShards("s3://b/", 12, 3), // members in the blocks (version 2)
	} {
		var buf bytes.Buffer
		index.WriteAddressable(&buf, infos)
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		infos, err := index.Read(bytes.NewReader(data), "fuzz")
		if err != nil {
			return
		}
		for _, in := range infos {
			checkAccepted(t, in)
		}
	})
}

// Shards that came with every offset (an index of the earlier format, read whole)
// keep, once PlanInPlace has planned them, only the offsets of the shards the plan
// reads in part; the plan is the plan of every offset, and Plan, which copies, leaves
// the shards it was given as they were.
func TestPlanInPlaceKeepsPartOffsets(t *testing.T) {
	const world, rank = 8, 3
	infos := synthShards("mem://b/d/", 400, 40)
	lk, _, urls := synthLookup(t, infos, true)
	ctx := context.Background()
	all, err := lk.Quick(ctx, urls, world)
	if err != nil {
		t.Fatal(err)
	}
	if index.Deferred(all) != 0 || !reflect.DeepEqual(all, infos) {
		t.Fatal("an index of the earlier format: not every offset read")
	}
	want, err := planFn(rank, world)(infos)
	if err != nil {
		t.Fatal(err)
	}
	copied, _, err := index.Plan(ctx, all, planFn(rank, world))
	if err != nil || !reflect.DeepEqual(copied, infos) {
		t.Fatalf("Plan changed the shards: %v", err)
	}
	got, p, err := index.PlanInPlace(ctx, all, planFn(rank, world))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Spans, want.Spans) || !reflect.DeepEqual(planWindows(p), planWindows(want)) {
		t.Fatal("the plan differs from the plan of every offset")
	}
	part := map[int]bool{}
	whole := 0
	for k, w := range p.Whole(infos) {
		if !w {
			part[p.Spans[k].Shard] = true
		} else {
			whole++
		}
	}
	kept := 0
	for i, in := range got {
		bare := infos[i]
		bare.Offsets = nil
		switch {
		case part[i] && !reflect.DeepEqual(in, infos[i]):
			t.Fatalf("shard %d, read in part: %+v", i, in)
		case !part[i] && !reflect.DeepEqual(in, bare):
			t.Fatalf("shard %d, read whole or not at all, kept its offsets", i)
		case in.Offsets != nil:
			kept++
		}
	}
	partWithOffsets := 0
	for i := range part {
		if infos[i].Offsets != nil {
			partWithOffsets++ // not a compressed shard (a count, no offsets)
		}
	}
	if partWithOffsets == 0 || whole == 0 || kept != partWithOffsets {
		t.Fatalf("%d shards read in part, %d spans whole, %d kept offsets: the test shows nothing", len(part), whole, kept)
	}
	// Planning again from what is kept gives the same plan.
	if _, p2, err := index.PlanInPlace(ctx, got, planFn(rank, world)); err != nil || !reflect.DeepEqual(p2.Spans, p.Spans) || !reflect.DeepEqual(planWindows(p2), planWindows(p)) {
		t.Fatalf("planning again: %v, or another plan", err)
	}
}

// planWindows returns p's windows, made again one by one.
func planWindows(p plan.Plan) []plan.Window {
	var ws []plan.Window
	for w := range p.Windows() {
		ws = append(ws, *w)
	}
	return ws
}
