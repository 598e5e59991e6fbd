package packed_test

import (
	"archive/tar"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/megatron"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
)

// corpusDocs returns n documents of lengths 0 to 3*seqLen, document i's first token
// being i (so that each is found again), the others random.
func corpusDocs(n, seqLen int, seed uint64) [][]int64 {
	r := rand.New(rand.NewPCG(seed, 1))
	docs := make([][]int64, n)
	for i := range docs {
		l := r.IntN(3*seqLen + 1)
		if i%7 == 0 {
			l = 1 // short ones too
		}
		d := make([]int64, max(l, 1))
		d[0] = int64(i)
		for j := 1; j < len(d); j++ {
			d[j] = int64(r.IntN(30000))
		}
		docs[i] = d
	}
	return docs
}

// writeShards writes docs into tar shards of per samples each, the field
// tokens.npy a 1-D array of descr ("<u2" or "<i4"), and returns their paths.
func writeShards(t *testing.T, dir string, docs [][]int64, per int, descr string) []string {
	t.Helper()
	var paths []string
	for s := 0; s*per < len(docs); s++ {
		p := filepath.Join(dir, fmt.Sprintf("tok-%04d.tar", s))
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		tw := tar.NewWriter(f)
		for i := s * per; i < min(len(docs), (s+1)*per); i++ {
			var data []byte
			for _, v := range docs[i] {
				if descr == "<u2" {
					data = binary.LittleEndian.AppendUint16(data, uint16(v))
				} else {
					data = binary.LittleEndian.AppendUint32(data, uint32(v))
				}
			}
			body := testutil.NPY(1, descr, false, []int{len(docs[i])}, data)
			for _, m := range []struct {
				name string
				b    []byte
			}{{fmt.Sprintf("d%06d.txt", i), []byte("doc")}, {fmt.Sprintf("d%06d.tokens.npy", i), body}} {
				if err := tw.WriteHeader(&tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.b)), Typeflag: tar.TypeReg}); err != nil {
					t.Fatal(err)
				}
				tw.Write(m.b)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		paths = append(paths, p)
	}
	return paths
}

// writeMegatron writes docs as the Megatron dataset dir/corpus.{idx,bin} of dtype
// dt and returns the .idx's path.
func writeMegatron(t *testing.T, dir string, docs [][]int64, dt megatron.DType) string {
	t.Helper()
	bin, _ := os.Create(filepath.Join(dir, "corpus.bin"))
	idx, _ := os.Create(filepath.Join(dir, "corpus.idx"))
	w, err := megatron.NewWriter(bin, idx, dt)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if err := w.AddDocument(d); err != nil {
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

// epoch returns the rows (input_ids, row after row) and padded rows of every batch
// of a rank, and checks each batch's position_ids and cu_seqlens agree.
func epoch(t *testing.T, cfg packed.Config) (batches [][]int64, padded []int, st []packed.State, l *packed.Loader) {
	t.Helper()
	l, err := packed.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	for {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var zeros []int32
		for i, p := range b.PositionIDs {
			if p == 0 {
				zeros = append(zeros, int32(i))
			}
		}
		zeros = append(zeros, int32(len(b.PositionIDs)))
		if !slices.Equal(zeros, b.CuSeqlens) {
			t.Fatalf("batch %d: cu_seqlens %v, where position_ids are 0: %v", b.Seq, b.CuSeqlens, zeros)
		}
		ids := b.InputIDs
		if cfg.Int32 {
			ids = make([]int64, len(b.InputIDs32))
			for i, v := range b.InputIDs32 {
				ids[i] = int64(v)
			}
		}
		batches = append(batches, ids)
		padded = append(padded, b.Padded)
		st = append(st, l.State())
	}
	if int64(len(batches)) != l.Len() {
		t.Fatalf("%d batches, Len says %d", len(batches), l.Len())
	}
	return batches, padded, st, l
}

// checkStream checks that rows, the world-1 epoch, are every document once with eos
// after each, then pad.
func checkStream(t *testing.T, rows []int64, docs [][]int64, spec pack.Spec) {
	t.Helper()
	var got [][]int64
	var cur []int64
	tail := len(rows)
	for tail > 0 && rows[tail-1] == spec.Pad {
		tail--
	}
	for _, v := range rows[:tail+1] {
		if v == spec.EOS {
			got = append(got, cur)
			cur = nil
			continue
		}
		cur = append(cur, v)
	}
	if len(got) != len(docs) {
		t.Fatalf("%d documents in the rows, want %d", len(got), len(docs))
	}
	seen := make([]bool, len(docs))
	for _, d := range got {
		i := int(d[0])
		if i >= len(docs) || seen[i] || !slices.Equal(d, docs[i]) {
			t.Fatalf("document %d (%d tokens) is not the one written, or seen twice", i, len(d))
		}
		seen[i] = true
	}
	if int64(len(rows)-tail-1) >= int64(spec.SeqLen) {
		t.Errorf("%d tokens of pad at the end: more than a row", len(rows)-tail-1)
	}
}

// interleave rebuilds the epoch's rows from the ranks' batches: step after step,
// rank after rank.
func interleave(ranks [][][]int64) []int64 {
	var rows []int64
	for s := 0; s < len(ranks[0]); s++ {
		for r := range ranks {
			rows = append(rows, ranks[r][s]...)
		}
	}
	return rows
}

func TestPackedExactOnEveryWorld(t *testing.T) {
	const seqLen = 64
	docs := corpusDocs(300, seqLen, 1)
	spec := pack.Spec{Field: "tokens.npy", SeqLen: seqLen, HasEOS: true, EOS: 65535, Pad: 65534}
	for _, kind := range []string{"tar <u2", "tar <i4", "megatron"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			base := packed.Config{Pack: spec, BatchSize: 3, Seed: 7, Epoch: 2, ShuffleBuffer: 40, OpenShards: 3, Logf: t.Logf}
			if kind == "megatron" {
				base.URLs = []string{writeMegatron(t, dir, docs, megatron.Uint16)}
				base.Pack.Field = "tokens"
			} else {
				base.URLs = writeShards(t, dir, docs, 23, strings.TrimPrefix(kind, "tar "))
			}
			one, _, _, l := epoch(t, base)
			rows := interleave([][][]int64{one})
			if int64(len(rows)) < l.Rows()*seqLen {
				t.Fatalf("%d tokens for %d rows", len(rows), l.Rows())
			}
			checkStream(t, rows[:l.Rows()*seqLen], docs, spec)
			for _, world := range []int{2, 3} {
				var ranks [][][]int64
				for r := range world {
					c := base
					c.Rank, c.World = r, world
					b, pads, _, _ := epoch(t, c)
					if len(b) != len(ranks0(ranks, b)) {
						t.Fatalf("world %d: rank %d yields %d batches, rank 0 %d", world, r, len(b), len(ranks[0]))
					}
					_ = pads
					ranks = append(ranks, b)
				}
				got := interleave(ranks)
				if !slices.Equal(got[:l.Rows()*seqLen], rows[:l.Rows()*seqLen]) {
					t.Errorf("world %d: the ranks' rows together differ from world 1's", world)
				}
				for _, v := range got[l.Rows()*seqLen:] {
					if v != spec.Pad {
						t.Fatalf("world %d: a token past the epoch's rows is %d, not pad", world, v)
					}
				}
			}
		})
	}
}

// ranks0 returns rank 0's batches (b itself for rank 0).
func ranks0(ranks [][][]int64, b [][]int64) [][]int64 {
	if len(ranks) == 0 {
		return b
	}
	return ranks[0]
}

// A state taken at world 2 resumes at world 3: every row of the epoch once overall.
func TestPackedResumeOnAnotherWorld(t *testing.T) {
	const seqLen = 32
	docs := corpusDocs(200, seqLen, 2)
	dir := t.TempDir()
	spec := pack.Spec{Field: "tokens.npy", SeqLen: seqLen, HasEOS: true, EOS: 65535, Pad: 65535}
	base := packed.Config{URLs: writeShards(t, dir, docs, 17, "<u2"), Pack: spec, BatchSize: 2, Seed: 3, ShuffleBuffer: 30, Logf: t.Logf}
	one, _, _, l := epoch(t, base)
	want := interleave([][][]int64{one})[:l.Rows()*seqLen]
	for _, k := range []int{1, 4, 9} {
		var first [][][]int64
		var state packed.State
		for r := range 2 {
			c := base
			c.Rank, c.World = r, 2
			b, _, st, _ := epoch(t, c)
			if k > len(b) {
				t.Fatalf("k %d past the %d batches", k, len(b))
			}
			first = append(first, b[:k])
			if r == 0 {
				state = st[k-1]
			} else if st[k-1] != state {
				t.Fatalf("ranks' states differ: %+v, %+v", state, st[k-1])
			}
		}
		var rest [][][]int64
		for r := range 3 {
			c := base
			c.Rank, c.World, c.Resume = r, 3, &state
			b, _, _, _ := epoch(t, c)
			rest = append(rest, b)
		}
		got := append(interleave(first), interleave(rest)...)
		if len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
			t.Errorf("k %d: 2 ranks then 3 give other rows than one rank", k)
		}
	}
	bad := base
	bad.Seed = 4
	st := packed.State{Order: l.Fingerprint(), Rows: 3}
	bad.Resume = &st
	if _, err := packed.Open(context.Background(), bad); !errors.Is(err, packed.ErrResume) {
		t.Errorf("a state of another seed: %v, want ErrResume", err)
	}
}

// Bad input is an error before the first batch, naming what is wrong.
func TestPackedBadInput(t *testing.T) {
	dir := t.TempDir()
	docs := corpusDocs(20, 16, 3)
	paths := writeShards(t, dir, docs, 10, "<i4")
	spec := pack.Spec{Field: "tokens.npy", SeqLen: 16, HasEOS: true, EOS: 1 << 40, Pad: 0}
	if _, err := packed.Open(context.Background(), packed.Config{URLs: paths, Pack: spec, Int32: true, Logf: t.Logf}); err == nil || !strings.Contains(err.Error(), "eos") {
		t.Errorf("eos past int32: %v", err)
	}
	spec.EOS = 1
	if _, err := packed.Open(context.Background(), packed.Config{URLs: paths, Pack: pack.Spec{Field: "txt", SeqLen: 16}, Logf: t.Logf}); !errors.Is(err, packed.ErrNotPackable) || !strings.Contains(err.Error(), "txt") {
		t.Errorf("a text field: %v, want ErrNotPackable naming it", err)
	}
	if _, err := packed.Open(context.Background(), packed.Config{URLs: paths, Pack: spec, Memory: 64, Logf: t.Logf}); err == nil || !strings.Contains(err.Error(), "memory") {
		t.Errorf("a document over the memory budget: %v", err)
	}
	// A Megatron index cut short.
	idx := writeMegatron(t, dir, docs, megatron.Int32)
	b, _ := os.ReadFile(idx)
	os.WriteFile(idx, b[:len(b)-3], 0o644)
	if _, err := packed.Open(context.Background(), packed.Config{URLs: []string{idx}, Pack: pack.Spec{Field: "tokens", SeqLen: 8}, Logf: t.Logf}); err == nil || !strings.Contains(err.Error(), "corpus.idx") {
		t.Errorf("a cut .idx: %v", err)
	}
}

// A Next whose ctx ends while it waits skips nothing: the next call returns the
// batch it waited for. After Close, Next says so.
func TestNextAfterCanceledWait(t *testing.T) {
	docs := corpusDocs(400, 32, 5)
	idx := writeMegatron(t, t.TempDir(), docs, megatron.Uint16)
	cfg := packed.Config{URLs: []string{idx}, Pack: pack.Spec{Field: "tokens", SeqLen: 32, HasEOS: true}, BatchSize: 2, Seed: 4}
	want, _, _, _ := epoch(t, cfg)
	l, err := packed.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	var got [][]int64
	for i := 0; ; i++ {
		ctx := context.Background()
		if i%2 == 0 {
			ctx = done // a wait cut short (unless a batch is ready)
		}
		b, err := l.Next(ctx)
		if err == context.Canceled {
			continue
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, slices.Clone(b.InputIDs))
		l.Release(b)
	}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("%d batches with canceled waits between them, %d without: they differ", len(got), len(want))
	}
	l.Close()
	l2, err := packed.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	l2.Close()
	if _, err := l2.Next(context.Background()); !errors.Is(err, packed.ErrClosed) {
		t.Fatalf("Next after Close: %v, want ErrClosed", err)
	}
}
