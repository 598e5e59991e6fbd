package shardload_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/megatron"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/wire"
)

// megatronCorpus writes n documents of 1 to 40 tokens (document i's first token
// i+1, so none is 0, the eos) as a Megatron dataset and returns its .idx.
func megatronCorpus(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	bin, _ := os.Create(filepath.Join(dir, "c.bin"))
	idx, _ := os.Create(filepath.Join(dir, "c.idx"))
	w, err := megatron.NewWriter(bin, idx, megatron.Int32)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 7))
	for i := range n {
		doc := make([]int64, 1+r.IntN(40))
		doc[0] = int64(i + 1)
		for j := 1; j < len(doc); j++ {
			doc[j] = 1 + r.Int64N(5000)
		}
		if err := w.AddDocument(doc); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	bin.Close()
	idx.Close()
	return idx.Name()
}

// packedRows reads the rest of l's epoch and returns its rows of input_ids that are
// not pad rows (a batch's last Padded rows), after checking each batch's columns:
// position_ids 0 exactly where cu_seqlens say, max_seqlen the longest segment.
func packedRows(t *testing.T, l *shardload.Loader, seqLen, limit int) (rows [][]int64, states []shardload.State) {
	t.Helper()
	for len(states) != limit {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		slab := b.Data()
		col := func(name string) *wire.Column {
			c, ok := b.Column(name)
			if !ok {
				t.Fatalf("batch %d has no column %s: %+v", b.Seq, name, b.Columns)
			}
			return c
		}
		ids, pos := col(wire.InputIDsColumn).Int64s(slab), col(wire.PositionIDsColumn).Int64s(slab)
		cu := col(wire.CuSeqlensColumn)
		if len(ids) != b.Rows*seqLen || len(pos) != len(ids) || cu.Shape[0] < b.Rows+1 {
			t.Fatalf("batch %d: %d input_ids, %d position_ids, cu_seqlens %v for %d rows of %d", b.Seq, len(ids), len(pos), cu.Shape, b.Rows, seqLen)
		}
		var zeros []int32
		for i, p := range pos {
			if p == 0 {
				zeros = append(zeros, int32(i))
			}
		}
		zeros = append(zeros, int32(len(pos)))
		got := make([]int32, cu.Shape[0])
		longest := int32(0)
		for i := range got {
			got[i] = int32(binary.LittleEndian.Uint32(slab[cu.Offset+4*int64(i):]))
			if i > 0 {
				longest = max(longest, got[i]-got[i-1])
			}
		}
		if !slices.Equal(got, zeros) {
			t.Fatalf("batch %d: cu_seqlens %v, position_ids are 0 at %v", b.Seq, got, zeros)
		}
		ms := col(wire.MaxSeqlenColumn)
		if m := int32(binary.LittleEndian.Uint32(slab[ms.Offset:])); m != longest {
			t.Fatalf("batch %d: max_seqlen %d, the longest segment is %d", b.Seq, m, longest)
		}
		if _, ok := b.Column(wire.KeyColumn); ok {
			t.Fatalf("batch %d of packed rows has a key column", b.Seq)
		}
		for r := range b.Rows - b.Padded {
			rows = append(rows, ids[r*seqLen:(r+1)*seqLen])
		}
		b.Release()
		states = append(states, l.State())
	}
	return rows, states
}

func openPacked(t *testing.T, cfg shardload.Config) *shardload.Loader {
	t.Helper()
	l, err := shardload.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// The loader's packed batches are package packed's, written into slabs: the same
// rows, and position_ids, cu_seqlens and max_seqlen that agree.
func TestPackedLoaderIsPackedRows(t *testing.T) {
	idx := megatronCorpus(t, 300)
	const seq, bs = 16, 4
	cfg := shardload.Config{URLs: []string{idx}, Pack: "tokens:16:eos=0", BatchSize: bs, Seed: 3, NoLock: true}
	l := openPacked(t, cfg)
	if l.Plan().Batches == 0 {
		t.Fatal("no batches planned")
	}
	got, _ := packedRows(t, l, seq, -1)

	spec, _ := pack.ParseSpec(cfg.Pack)
	pl, err := packed.Open(context.Background(), packed.Config{URLs: cfg.URLs, Pack: spec, BatchSize: bs, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	var want [][]int64
	for {
		b, err := pl.Next(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for r := range bs - b.Padded {
			want = append(want, b.InputIDs[r*seq:(r+1)*seq])
		}
	}
	if int64(len(want)) != pl.Rows() || !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("the loader yielded %d rows, package packed %d (epoch of %d): they differ", len(got), len(want), pl.Rows())
	}
	// Stats: a slab holds a batch of rows; Memory the ring of them.
	if st := l.Stats(); st.SlabBytes < wire.PackedBytes(bs, seq, false) || st.Memory < 2*st.SlabBytes {
		t.Errorf("Stats: slab bytes %d (a batch of rows takes %d), memory %d", st.SlabBytes, wire.PackedBytes(bs, seq, false), st.Memory)
	}
}

// A packed loader closed early, over a ring of the caller's, gives back every slab
// it holds (those its fillers were writing in, those queued for Next) but the one
// the caller still holds: a serve session that ends does not shrink the ring.
func TestPackedLoaderCloseGivesSlabsBack(t *testing.T) {
	idx := megatronCorpus(t, 300)
	const seq, bs = 16, 4
	ring, err := pinned.NewRing(pinned.Options{Slabs: 4, SlabBytes: wire.PackedBytes(bs, seq, false), NoLock: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	for take := range 4 {
		l, err := shardload.Open(context.Background(), shardload.Config{URLs: []string{idx}, Pack: "tokens:16:eos=0", BatchSize: bs, Seed: 3, Ring: ring})
		if err != nil {
			t.Fatal(err)
		}
		var held *shardload.Batch
		for range take {
			b, err := l.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if held != nil {
				held.Release()
			}
			held = b
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		want := 0
		if held != nil {
			want = 1
		}
		if n := ring.InUse(); n != want {
			t.Fatalf("after %d batches and Close: %d slabs in use, want %d (the one held)", take, n, want)
		}
		if held != nil {
			held.Release()
		}
		if n := ring.InUse(); n != 0 {
			t.Fatalf("%d slabs in use after the last was released", n)
		}
	}
}

// A packed job's state resumes on another world size: two ranks take some batches,
// three ranks read the rest, and together they read every row of the one-rank
// epoch once.
func TestPackedLoaderResumesOnAnotherWorld(t *testing.T) {
	idx := megatronCorpus(t, 400)
	const seq = 16
	base := shardload.Config{URLs: []string{idx}, Pack: "tokens:16:eos=0", BatchSize: 3, Seed: 5, Epoch: 2, NoLock: true}
	all, _ := packedRows(t, openPacked(t, base), seq, -1)

	var seen [][]int64
	var st shardload.State
	for rank := range 2 {
		cfg := base
		cfg.Rank, cfg.World = rank, 2
		rows, states := packedRows(t, openPacked(t, cfg), seq, 4)
		seen = append(seen, rows...)
		st = states[len(states)-1]
	}
	if st.Rows != 4*2*3 || st.Epoch != 2 {
		t.Fatalf("state after 4 batches of 3 rows on 2 ranks: %+v", st)
	}
	b, _ := json.Marshal(st)
	var back shardload.State
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	batches := -1
	for rank := range 3 {
		cfg := base
		cfg.Epoch, cfg.Rank, cfg.World, cfg.Resume = 0, rank, 3, &back
		l := openPacked(t, cfg)
		if batches >= 0 && l.Plan().Batches != batches {
			t.Fatalf("rank %d plans %d batches, rank 0 %d", rank, l.Plan().Batches, batches)
		}
		batches = l.Plan().Batches
		rows, states := packedRows(t, l, seq, -1)
		seen = append(seen, rows...)
		if last := states[len(states)-1]; last.Rows != int64(len(all)) {
			t.Fatalf("rank %d ends at row %d of %d", rank, last.Rows, len(all))
		}
	}
	key := func(r []int64) string { b, _ := json.Marshal(r); return string(b) }
	count := map[string]int{}
	for _, r := range all {
		count[key(r)]++
	}
	for _, r := range seen {
		count[key(r)]--
	}
	for k, n := range count {
		if n != 0 {
			t.Fatalf("row %s read %d times too few across the resumed job", k, n)
		}
	}
	if len(seen) != len(all) {
		t.Fatalf("the resumed job read %d rows, the epoch has %d", len(seen), len(all))
	}

	// Another packing's state does not resume.
	other := base
	other.Pack, other.Resume = "tokens:8:eos=0", &back
	if _, err := shardload.Open(context.Background(), other); !errors.Is(err, shardload.ErrResume) {
		t.Fatalf("a state of rows of 16 resumed rows of 8: %v", err)
	}
}

// Open, StateAt and PlanOf of a packed epoch refuse alike what does not plan: a state
// of another epoch or of an epoch of samples (ErrResume), a stream of a mix given by
// its Shards.
func TestPackedRefusals(t *testing.T) {
	idx := megatronCorpus(t, 50)
	base := shardload.Config{URLs: []string{idx}, Pack: "tokens:16:eos=0", BatchSize: 2, NoLock: true}
	otherEpoch, samples, shards := base, base, base
	otherEpoch.Epoch, otherEpoch.Resume = 2, &shardload.State{Epoch: 1, Rows: 4}
	samples.Resume = &shardload.State{Runs: "w2:c4"}
	shards.URLs, shards.Streams = nil, []shardload.Stream{{URLs: []string{idx}}, {Shards: []shard.Info{{URL: "a.tar", Samples: 1}}}}
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		cfg    shardload.Config
		resume bool
		want   string
	}{
		{"another epoch", otherEpoch, true, "the state is in epoch 1, the loader was asked for epoch 2"},
		{"a state of samples", samples, true, "the state is a position of an unpacked epoch"},
		{"a stream of shards", shards, false, "shardload: Pack: stream 1 gives Shards"},
	} {
		l, err := shardload.Open(ctx, c.cfg)
		if err == nil {
			l.Close()
			t.Fatalf("%s: Open gave no error", c.name)
		}
		if !strings.Contains(err.Error(), c.want) || errors.Is(err, shardload.ErrResume) != c.resume {
			t.Errorf("%s: Open: %v; want %q, ErrResume %v", c.name, err, c.want, c.resume)
		}
		if _, serr := shardload.StateAt(ctx, c.cfg, 0); serr == nil || serr.Error() != err.Error() {
			t.Errorf("%s: StateAt: %v; Open's error: %v", c.name, serr, err)
		}
		if _, perr := shardload.PlanOf(ctx, c.cfg); perr == nil || perr.Error() != err.Error() {
			t.Errorf("%s: PlanOf: %v; Open's error: %v", c.name, perr, err)
		}
	}
}

// StateAt and PlanOf plan a packed epoch as Open does, without reading a token: the
// state after k batches is the loader's after its k-th, also in a job resumed on
// another world, and the batches are the loader's.
func TestPackedStateAtAndPlanOf(t *testing.T) {
	idx := megatronCorpus(t, 300)
	base := shardload.Config{URLs: []string{idx}, Pack: "tokens:16:eos=0", BatchSize: 3, Seed: 4, Epoch: 1, Rank: 1, World: 2, NoLock: true}
	ctx := context.Background()
	check := func(what string, cfg shardload.Config) []shardload.State {
		t.Helper()
		l := openPacked(t, cfg)
		_, states := packedRows(t, l, 16, -1)
		p, err := shardload.PlanOf(ctx, cfg)
		if err != nil || p.Batches != l.Plan().Batches || p.Batches != len(states) {
			t.Fatalf("%s: PlanOf %d batches (%v), the loader plans %d and yields %d", what, p.Batches, err, l.Plan().Batches, len(states))
		}
		for k, want := range states {
			got, err := shardload.StateAt(ctx, cfg, k+1)
			if err != nil || got != want {
				t.Fatalf("%s: StateAt(%d) = %+v (%v), the loader's state then %+v", what, k+1, got, err, want)
			}
		}
		if _, err := shardload.StateAt(ctx, cfg, len(states)+1); err == nil {
			t.Errorf("%s: StateAt past the rank's %d batches gave no error", what, len(states))
		}
		return states
	}
	states := check("two ranks", base)
	resumed := base
	resumed.Epoch, resumed.Rank, resumed.World, resumed.Resume = 0, 2, 3, &states[1]
	check("resumed on three ranks", resumed)
}

// ids=int32 gives the same rows as int64 input_ids, in an int32 column of a slab a
// quarter smaller a token, and the states of either resume the other.
func TestPackedLoaderInt32IDs(t *testing.T) {
	idx := megatronCorpus(t, 300)
	base := shardload.Config{URLs: []string{idx}, Pack: "tokens:16:eos=0", BatchSize: 3, Seed: 6, NoLock: true}
	want, states := packedRows(t, openPacked(t, base), 16, -1)
	cfg := base
	cfg.Pack = "tokens:16:eos=0:ids=int32"
	read := func(cfg shardload.Config) (rows [][]int64, last shardload.State) {
		l := openPacked(t, cfg)
		for b, err := range l.All(context.Background()) {
			if err != nil {
				t.Fatal(err)
			}
			c, ok := b.Column(wire.InputIDsColumn)
			if !ok || c.DType != decode.Int32 || c.Length != int64(4*b.Rows*16) {
				t.Fatalf("batch %d: input_ids %+v, want int32 [%d, 16]", b.Seq, c, b.Rows)
			}
			data := b.Data()[c.Offset : c.Offset+c.Length]
			for r := range b.Rows - b.Padded {
				row := make([]int64, 16)
				for i := range row {
					row[i] = int64(int32(binary.LittleEndian.Uint32(data[4*(r*16+i):])))
				}
				rows = append(rows, row)
			}
			b.Release()
			last = l.State()
		}
		return rows, last
	}
	got, last := read(cfg)
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("ids=int32 gives %d rows that differ from int64's %d", len(got), len(want))
	}
	if last != states[len(states)-1] {
		t.Errorf("the int32 loader's last state %+v, the int64 loader's %+v", last, states[len(states)-1])
	}
	resumed := cfg
	resumed.Resume = &states[4]
	if rest, _ := read(resumed); !slices.EqualFunc(rest, want[5*3:], slices.Equal) {
		t.Errorf("an int64 loader's state after 5 batches resumed in int32 gives %d rows, want the %d after them", len(rest), len(want[5*3:]))
	}
}

// A bad spec is a clear error of the configuration.
func TestPackedLoaderBadSpec(t *testing.T) {
	for _, spec := range []string{"tokens", "tokens:0", "tokens:8:eos=-1", ":8"} {
		cfg := shardload.Config{URLs: []string{"x.idx"}, Pack: spec}
		if err := cfg.Validate(); err == nil {
			t.Errorf("Pack %q validated", spec)
		}
	}
}

// megatronStream writes n documents of minLen to maxLen tokens, all in [lo, lo+1000),
// as a Megatron dataset named name in dir, and returns its .idx.
func megatronStream(t *testing.T, dir, name string, n, minLen, maxLen int, lo int64) string {
	t.Helper()
	bin, _ := os.Create(filepath.Join(dir, name+".bin"))
	idx, _ := os.Create(filepath.Join(dir, name+".idx"))
	w, err := megatron.NewWriter(bin, idx, megatron.Int32)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(uint64(lo), 1))
	for range n {
		doc := make([]int64, minLen+r.IntN(maxLen-minLen+1))
		for j := range doc {
			doc[j] = lo + r.Int64N(1000)
		}
		if err := w.AddDocument(doc); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	bin.Close()
	idx.Close()
	return idx.Name()
}

// With Pack, a stream's weight is its share of the epoch's tokens: streams of short
// and long documents at 0.7 and 0.3 of an epoch of EpochTokens tokens.
func TestPackedLoaderMixesByTokens(t *testing.T) {
	dir := t.TempDir()
	short := megatronStream(t, dir, "short", 400, 2, 20, 1000)   // tokens in [1000, 2000)
	long := megatronStream(t, dir, "long", 100, 200, 400, 10000) // tokens in [10000, 11000)
	const epochTokens = 60000
	cfg := shardload.Config{Streams: []shardload.Stream{{URLs: []string{short}, Weight: 0.7}, {URLs: []string{long}, Weight: 0.3}},
		Pack: "tokens:64", EpochTokens: epochTokens, BatchSize: 4, Seed: 2, NoLock: true}
	rows, _ := packedRows(t, openPacked(t, cfg), 64, -1)
	var s, l int
	for _, r := range rows {
		for _, v := range r {
			switch {
			case v >= 1000 && v < 2000:
				s++
			case v >= 10000 && v < 11000:
				l++
			}
		}
	}
	total := float64(s + l)
	if total < 0.95*epochTokens || total > 1.05*epochTokens {
		t.Fatalf("an epoch of %v tokens, want %d", total, epochTokens)
	}
	if share := float64(s) / total; share < 0.67 || share > 0.73 {
		t.Fatalf("the short stream holds %.3f of the tokens, want 0.7", share)
	}
}

// binOpens is the file backend, counting the reads of .bin objects.
type binOpens struct {
	source.File
	opens atomic.Int64
}

func (s *binOpens) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	if strings.HasSuffix(url, ".bin") {
		s.opens.Add(1)
	}
	return s.File.OpenRange(ctx, url, off, length)
}

func (s *binOpens) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	if strings.HasSuffix(url, ".bin") {
		s.opens.Add(1)
	}
	return s.File.OpenVersion(ctx, url, version, off, length)
}

// With Pack, Config.Planned is called once an epoch, before the epoch reads a
// token, with the rank's batches and the reads of the objects (the streams' .bin
// files), each at its first read and its last, as spans of no samples: what a cache
// that evicts by next use is told.
func TestPackedPlannedBeforeTheFirstRead(t *testing.T) {
	dir := t.TempDir()
	a := megatronStream(t, dir, "a", 300, 2, 20, 1000)
	b := megatronStream(t, dir, "b", 300, 2, 20, 5000)
	src := &binOpens{}
	reg := &source.Registry{}
	reg.Register("file", src)
	for epoch := range 2 {
		var plans []plan.Plan
		opened := int64(-1)
		before := src.opens.Load()
		cfg := shardload.Config{URLs: []string{a, b}, Pack: "tokens:32", BatchSize: 4, Seed: 2, Epoch: epoch, NoLock: true, Sources: reg,
			Planned: func(p plan.Plan) {
				plans = append(plans, p)
				opened = src.opens.Load() - before
			}}
		l := openPacked(t, cfg)
		rows, _ := packedRows(t, l, 32, -1)
		if len(plans) != 1 {
			t.Fatalf("epoch %d: Planned called %d times, want once", epoch, len(plans))
		}
		if opened != 0 {
			t.Errorf("epoch %d: %d reads of the .bin files before Planned", epoch, opened)
		}
		var urls []string
		for _, s := range plans[0].Spans {
			urls = append(urls, s.URL)
			if s.Feeds != 0 || s.Take != 0 {
				t.Errorf("epoch %d: span %+v of a packed plan has samples", epoch, s)
			}
		}
		slices.Sort(urls)
		binA, binB := strings.TrimSuffix(a, ".idx")+".bin", strings.TrimSuffix(b, ".idx")+".bin"
		if want := []string{binA, binA, binB, binB}; !slices.Equal(urls, want) {
			t.Errorf("epoch %d: Planned's spans name %v, want each .bin at its first read and its last: %v", epoch, urls, want)
		}
		if plans[0].Batches != l.Plan().Batches || len(rows) == 0 || src.opens.Load() == before {
			t.Errorf("epoch %d: Planned's plan has %d batches, the loader's %d; %d rows read in %d reads", epoch, plans[0].Batches, l.Plan().Batches, len(rows), src.opens.Load()-before)
		}
	}
}
