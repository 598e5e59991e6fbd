package megatron_test

import (
	"strings"
	"testing"

	"github.com/shardload/shardload/megatron"
)

// FuzzParse: Parse never panics, its errors carry the package prefix, and an Index
// it accepts describes documents that tile its sequences in order, within the .bin.
func FuzzParse(f *testing.F) {
	f.Add(valid, int64(validBin))
	f.Add(valid, int64(-1))
	f.Add(valid, int64(validBin-1))
	for _, c := range intDTypes {
		p := write(f, c.dt, [][][]int64{{{c.lo, c.hi}}, {}, {{1}, {}, {2, 3}}})
		f.Add(p.idx, int64(len(p.bin)))
	}
	f.Add(idxBytes(1, []int32{2, 3, 1, 0}, []int64{0, 2, 9, 10}, []int64{0, 2, 3, 3, 4}, nil), int64(12))
	f.Add(idxBytes(8, []int32{1, 2}, []int64{0, 2}, []int64{0, 1, 2}, []int8{0, 1}), int64(6))
	f.Add(idxBytes(8, []int32{1, 1, 1}, []int64{0, 2, 6}, []int64{0, 1, 3}, nil), int64(8))
	f.Add(idxBytes(8, []int32{3, -1}, []int64{0, 6}, []int64{0, 1, 2}, nil), int64(validBin))
	f.Add(idxBytes(8, []int32{3, 2}, []int64{0, 4}, []int64{0, 1, 2}, nil), int64(validBin))
	f.Add(putU64(valid, 18, 1<<62), int64(validBin))
	f.Add(putU64(valid, 26, 1<<61), int64(validBin))
	f.Add(valid[:20], int64(validBin))

	f.Fuzz(func(t *testing.T, idx []byte, binSize int64) {
		x, err := megatron.ParseBytes(idx, binSize)
		if err != nil {
			if x != nil || !strings.HasPrefix(err.Error(), "megatron: ") {
				t.Fatalf("Index %v with error %q", x != nil, err)
			}
			return
		}
		isz := int64(x.DType().Size())
		if !x.DType().Integer() || x.Docs() < 0 || x.Sequences() < 0 || x.BinEnd() < 0 || (binSize >= 0 && x.BinEnd() > binSize) {
			t.Fatalf("DType %v Docs %d Sequences %d BinEnd %d, .bin %d", x.DType(), x.Docs(), x.Sequences(), x.BinEnd(), binSize)
		}
		var tokens, end int64
		seq := 0
		lens := x.AppendDocTokens(nil)
		for i := range x.Docs() {
			off, n := x.DocRange(i)
			first, last := x.DocSequences(i)
			if off < end || n < 0 || n%isz != 0 || off > x.BinEnd()-n || first != seq || last < first {
				t.Fatalf("document %d: %d+%d after %d, sequences [%d,%d) after %d", i, off, n, end, first, last, seq)
			}
			if n/isz != x.DocTokens(i) || lens[i] != x.DocTokens(i) {
				t.Fatalf("document %d: %d bytes, DocTokens %d, AppendDocTokens %d", i, n, x.DocTokens(i), lens[i])
			}
			at := off
			for s := first; s < last; s++ {
				so, sn := x.SequenceRange(s)
				if so != at || sn != x.SequenceTokens(s)*isz {
					t.Fatalf("document %d: sequence %d at %d+%d, want it at %d", i, s, so, sn, at)
				}
				at += sn
			}
			if at != off+n {
				t.Fatalf("document %d: sequences end at %d, document at %d", i, at, off+n)
			}
			tokens += n / isz
			end, seq = off+n, last
		}
		if seq != x.Sequences() || tokens != x.Tokens() {
			t.Fatalf("documents cover %d of %d sequences, %d of %d tokens", seq, x.Sequences(), tokens, x.Tokens())
		}
	})
}
