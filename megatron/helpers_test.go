package megatron_test

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/shardload/shardload/megatron"
)

// idxBytes builds an .idx from its arrays as the format describes it, independently
// of Writer, with the counts taken from the arrays; modes is nil for none.
func idxBytes(code uint8, lens []int32, ptrs []int64, docIdx []int64, modes []int8) []byte {
	b := []byte("MMIDIDX\x00\x00")
	b = binary.LittleEndian.AppendUint64(b, 1)
	b = append(b, code)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(lens)))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(docIdx)))
	for _, n := range lens {
		b = binary.LittleEndian.AppendUint32(b, uint32(n))
	}
	for _, p := range ptrs {
		b = binary.LittleEndian.AppendUint64(b, uint64(p))
	}
	for _, d := range docIdx {
		b = binary.LittleEndian.AppendUint64(b, uint64(d))
	}
	for _, m := range modes {
		b = append(b, byte(m))
	}
	return b
}

// putU64 overwrites the uint64 at off of a copy of b.
func putU64(b []byte, off int, v uint64) []byte {
	b = bytes.Clone(b)
	binary.LittleEndian.PutUint64(b[off:], v)
	return b
}

// pair is an .idx/.bin pair written by Writer.
type pair struct {
	idx, bin []byte
}

// write writes docs, each a list of sequences, with Writer.
func write(t testing.TB, dt megatron.DType, docs [][][]int64) pair {
	t.Helper()
	var bin, idx bytes.Buffer
	w, err := megatron.NewWriter(&bin, &idx, dt)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if err := w.AddDocumentSequences(d); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return pair{idx: idx.Bytes(), bin: bin.Bytes()}
}

// randomDocs makes n documents of random tokens within lo..hi, each of 0..3
// sequences of 0..maxLen tokens, the extremes included often.
func randomDocs(r *rand.Rand, n, maxLen int, lo, hi int64) [][][]int64 {
	docs := make([][][]int64, n)
	for i := range docs {
		seqs := make([][]int64, r.IntN(4))
		for k := range seqs {
			seq := make([]int64, r.IntN(maxLen+1))
			for j := range seq {
				switch r.IntN(8) {
				case 0:
					seq[j] = lo
				case 1:
					seq[j] = hi
				default:
					seq[j] = lo + int64(r.Uint64N(uint64(hi-lo)))
				}
			}
			seqs[k] = seq
		}
		docs[i] = seqs
	}
	return docs
}

// docTokens reads document i of x from bin and decodes it.
func docTokens(t testing.TB, x *megatron.Index, bin []byte, i int) []int64 {
	t.Helper()
	off, n := x.DocRange(i)
	toks, err := megatron.AppendTokens(nil, bin[off:off+n], x.DType())
	if err != nil {
		t.Fatal(err)
	}
	return toks
}

// intDTypes are the integer codes with their bounds.
var intDTypes = []struct {
	dt     megatron.DType
	lo, hi int64
}{
	{megatron.Uint8, 0, 255},
	{megatron.Int8, -128, 127},
	{megatron.Int16, -32768, 32767},
	{megatron.Int32, -1 << 31, 1<<31 - 1},
	{megatron.Int64, -1 << 63, 1<<63 - 1},
	{megatron.Uint16, 0, 65535},
}
