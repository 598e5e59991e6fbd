package megatron_test

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload/megatron"
)

// TestMegatronBytes checks Writer against the bytes Megatron-LM's
// IndexedDatasetBuilder writes for two documents [1 2 3] and [4 5] of uint16,
// spelled out here from the format.
func TestMegatronBytes(t *testing.T) {
	wantBin := []byte{1, 0, 2, 0, 3, 0, 4, 0, 5, 0}
	wantIdx := []byte{
		'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0, // magic
		1, 0, 0, 0, 0, 0, 0, 0, // version
		8,                      // dtype code: uint16
		2, 0, 0, 0, 0, 0, 0, 0, // sequence count
		3, 0, 0, 0, 0, 0, 0, 0, // document_indices length
		3, 0, 0, 0, // sequence_lengths
		2, 0, 0, 0,
		0, 0, 0, 0, 0, 0, 0, 0, // sequence_pointers
		6, 0, 0, 0, 0, 0, 0, 0,
		0, 0, 0, 0, 0, 0, 0, 0, // document_indices
		1, 0, 0, 0, 0, 0, 0, 0,
		2, 0, 0, 0, 0, 0, 0, 0,
	}
	var bin, idx bytes.Buffer
	w, err := megatron.NewWriter(&bin, &idx, megatron.Uint16)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range [][]int64{{1, 2, 3}, {4, 5}} {
		if err := w.AddDocument(d); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bin.Bytes(), wantBin) {
		t.Errorf(".bin\n got % x\nwant % x", bin.Bytes(), wantBin)
	}
	if !bytes.Equal(idx.Bytes(), wantIdx) {
		t.Errorf(".idx\n got % x\nwant % x", idx.Bytes(), wantIdx)
	}

	x, err := megatron.ParseBytes(wantIdx, int64(len(wantBin)))
	if err != nil {
		t.Fatal(err)
	}
	if x.Docs() != 2 || x.Sequences() != 2 || x.Tokens() != 5 || x.DType() != megatron.Uint16 || x.BinEnd() != 10 {
		t.Fatalf("Docs %d Sequences %d Tokens %d DType %v BinEnd %d", x.Docs(), x.Sequences(), x.Tokens(), x.DType(), x.BinEnd())
	}
	for i, want := range []struct{ off, n, tokens int64 }{{0, 6, 3}, {6, 4, 2}} {
		off, n := x.DocRange(i)
		if off != want.off || n != want.n || x.DocTokens(i) != want.tokens {
			t.Errorf("document %d: range %d+%d tokens %d, want %d+%d tokens %d", i, off, n, x.DocTokens(i), want.off, want.n, want.tokens)
		}
	}
	if got := docTokens(t, x, wantBin, 1); !slices.Equal(got, []int64{4, 5}) {
		t.Errorf("document 1 = %v", got)
	}
}

// TestSentencesBytes checks Writer's documents of several sequences, and empty ones,
// against the format, and Parse's answers for them.
func TestSentencesBytes(t *testing.T) {
	docs := [][][]int64{
		{{1, 2}, {3}},       // two sequences
		{},                  // no sequence
		{{}, {-7, 1 << 40}}, // an empty sequence, then one
	}
	p := write(t, megatron.Int64, docs)
	want := idxBytes(5, []int32{2, 1, 0, 2}, []int64{0, 16, 24, 24}, []int64{0, 2, 2, 4}, nil)
	if !bytes.Equal(p.idx, want) {
		t.Fatalf(".idx\n got % x\nwant % x", p.idx, want)
	}
	if len(p.bin) != 5*8 {
		t.Fatalf(".bin is %d bytes, want 40", len(p.bin))
	}
	x, err := megatron.ParseBytes(p.idx, int64(len(p.bin)))
	if err != nil {
		t.Fatal(err)
	}
	if x.Docs() != 3 || x.Sequences() != 4 || x.Tokens() != 5 {
		t.Fatalf("Docs %d Sequences %d Tokens %d", x.Docs(), x.Sequences(), x.Tokens())
	}
	for i, want := range []struct {
		first, end int
		off, n     int64
	}{{0, 2, 0, 24}, {2, 2, 24, 0}, {2, 4, 24, 16}} {
		first, end := x.DocSequences(i)
		off, n := x.DocRange(i)
		if first != want.first || end != want.end || off != want.off || n != want.n {
			t.Errorf("document %d: sequences [%d,%d) range %d+%d, want [%d,%d) %d+%d", i, first, end, off, n, want.first, want.end, want.off, want.n)
		}
	}
	if got := x.AppendDocTokens(nil); !slices.Equal(got, []int64{3, 0, 2}) {
		t.Errorf("AppendDocTokens = %v", got)
	}
	if got := docTokens(t, x, p.bin, 2); !slices.Equal(got, []int64{-7, 1 << 40}) {
		t.Errorf("document 2 = %v", got)
	}
	for s, want := range []int64{2, 1, 0, 2} {
		if got := x.SequenceTokens(s); got != want {
			t.Errorf("SequenceTokens(%d) = %d, want %d", s, got, want)
		}
	}
}

// TestRoundTrip writes random documents in every integer dtype, extremes included,
// and reads them back.
func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range intDTypes {
		for _, sentences := range []bool{false, true} {
			docs := randomDocs(r, 300, 40, c.lo, c.hi)
			if !sentences {
				for i, d := range docs {
					docs[i] = [][]int64{slices.Concat(d...)}
				}
			}
			p := write(t, c.dt, docs)
			x, err := megatron.ParseBytes(p.idx, int64(len(p.bin)))
			if err != nil {
				t.Fatalf("%v: %v", c.dt, err)
			}
			if x.Docs() != len(docs) || x.BinEnd() != int64(len(p.bin)) || x.DType() != c.dt {
				t.Fatalf("%v: Docs %d BinEnd %d DType %v", c.dt, x.Docs(), x.BinEnd(), x.DType())
			}
			var total int64
			lens := x.AppendDocTokens(nil)
			for i, d := range docs {
				want := slices.Concat(d...)
				if got := docTokens(t, x, p.bin, i); !slices.Equal(got, want) {
					t.Fatalf("%v: document %d = %v, want %v", c.dt, i, got, want)
				}
				first, end := x.DocSequences(i)
				if end-first != len(d) || x.DocTokens(i) != int64(len(want)) || lens[i] != int64(len(want)) {
					t.Fatalf("%v: document %d: %d sequences, %d tokens (%d), want %d, %d", c.dt, i, end-first, x.DocTokens(i), lens[i], len(d), len(want))
				}
				for k, seq := range d {
					off, n := x.SequenceRange(first + k)
					got, err := megatron.AppendTokens(nil, p.bin[off:off+n], c.dt)
					if err != nil || !slices.Equal(got, seq) {
						t.Fatalf("%v: document %d sequence %d = %v, %v, want %v", c.dt, i, k, got, err, seq)
					}
				}
				total += int64(len(want))
			}
			if x.Tokens() != total {
				t.Fatalf("%v: Tokens %d, want %d", c.dt, x.Tokens(), total)
			}
			// The same pair with the .bin size unknown.
			if _, err := megatron.ParseBytes(p.idx, -1); err != nil {
				t.Fatalf("%v: binSize -1: %v", c.dt, err)
			}
		}
	}
}

// TestEmptyDataset: no document at all is document_indices [0] alone.
func TestEmptyDataset(t *testing.T) {
	p := write(t, megatron.Int32, nil)
	if want := idxBytes(4, nil, nil, []int64{0}, nil); !bytes.Equal(p.idx, want) || len(p.bin) != 0 {
		t.Fatalf(".idx % x, .bin %d bytes", p.idx, len(p.bin))
	}
	x, err := megatron.ParseBytes(p.idx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if x.Docs() != 0 || x.Sequences() != 0 || x.Tokens() != 0 || len(x.AppendDocTokens(nil)) != 0 {
		t.Fatalf("Docs %d Sequences %d Tokens %d", x.Docs(), x.Sequences(), x.Tokens())
	}
}

// TestModes: a multimodal .idx ends with one int8 mode per sequence.
func TestModes(t *testing.T) {
	idx := idxBytes(8, []int32{1, 2}, []int64{0, 2}, []int64{0, 1, 2}, []int8{0, -3})
	x, err := megatron.ParseBytes(idx, 6)
	if err != nil {
		t.Fatal(err)
	}
	if !x.HasModes() || x.SequenceMode(0) != 0 || x.SequenceMode(1) != -3 {
		t.Fatalf("HasModes %v modes %d %d", x.HasModes(), x.SequenceMode(0), x.SequenceMode(1))
	}
	plain, err := megatron.ParseBytes(idxBytes(8, []int32{1, 2}, []int64{0, 2}, []int64{0, 1, 2}, nil), 6)
	if err != nil {
		t.Fatal(err)
	}
	if plain.HasModes() || plain.SequenceMode(1) != 0 {
		t.Fatal("modes without sequence_modes")
	}
}

// TestGapsBetweenDocuments: sequences need not be back to back across documents,
// and a .bin larger than the sequences is fine.
func TestGapsBetweenDocuments(t *testing.T) {
	// uint8: document 0 is sequences 0 and 1 at [0,2) and [2,5); document 1 is
	// sequence 2 at [9,10); document 2 is empty; document 3 is sequence 3 at [10,10).
	idx := idxBytes(1, []int32{2, 3, 1, 0}, []int64{0, 2, 9, 10}, []int64{0, 2, 3, 3, 4}, nil)
	x, err := megatron.ParseBytes(idx, 12)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct{ off, n int64 }{{0, 5}, {9, 1}, {10, 0}, {10, 0}} {
		if off, n := x.DocRange(i); off != want.off || n != want.n {
			t.Errorf("document %d: %d+%d, want %d+%d", i, off, n, want.off, want.n)
		}
	}
	if x.Tokens() != 6 || x.BinEnd() != 10 || x.SequenceTokens(1) != 3 {
		t.Errorf("Tokens %d BinEnd %d SequenceTokens(1) %d", x.Tokens(), x.BinEnd(), x.SequenceTokens(1))
	}
	if got := x.AppendDocTokens(nil); !slices.Equal(got, []int64{5, 1, 0, 0}) {
		t.Errorf("AppendDocTokens = %v", got)
	}
}

// TestMemoryBytes: a file as Megatron-LM writes it costs 8 bytes per document.
func TestMemoryBytes(t *testing.T) {
	const n = 1000
	docs := make([][][]int64, n)
	for i := range docs {
		docs[i] = [][]int64{make([]int64, i%7)}
	}
	p := write(t, megatron.Uint16, docs)
	x, err := megatron.ParseBytes(p.idx, int64(len(p.bin)))
	if err != nil {
		t.Fatal(err)
	}
	if got := x.MemoryBytes(); got != 8*(n+1) {
		t.Errorf("MemoryBytes = %d, want %d", got, 8*(n+1))
	}
	// Two sequences per document keeps document_indices as well.
	for i := range docs {
		docs[i] = [][]int64{{1}, make([]int64, i%7)}
	}
	p = write(t, megatron.Uint16, docs)
	if x, err = megatron.ParseBytes(p.idx, int64(len(p.bin))); err != nil {
		t.Fatal(err)
	}
	if got, want := x.MemoryBytes(), int64(8*(2*n+1)+8*(n+1)); got != want {
		t.Errorf("sentences: MemoryBytes = %d, want %d", got, want)
	}
}

// valid is the .idx of two uint16 documents [1 2 3] and [4 5], and its .bin size.
var valid = idxBytes(8, []int32{3, 2}, []int64{0, 6}, []int64{0, 1, 2}, nil)

const validBin = 10

// TestHostile: every damaged or hostile .idx is a clear error.
func TestHostile(t *testing.T) {
	set := func(off int, v byte) []byte {
		b := bytes.Clone(valid)
		b[off] = v
		return b
	}
	for _, c := range []struct {
		name    string
		idx     []byte
		binSize int64
		err     error
		says    string
	}{
		{"bad magic", set(0, 'X'), validBin, megatron.ErrBadMagic, "at byte 0"},
		{"magic without its zeros", set(8, 1), validBin, megatron.ErrBadMagic, "MMIDIDX"},
		{"not an idx at all", []byte("{\"hello\": 1}"), validBin, megatron.ErrBadMagic, ""},
		{"wrong version", putU64(valid, 9, 2), validBin, megatron.ErrVersion, "version 2 at byte 9"},
		{"dtype code 0", set(17, 0), validBin, megatron.ErrDType, "code 0, at byte 17"},
		{"dtype code 9", set(17, 9), validBin, megatron.ErrDType, "code 9"},
		{"float32 as tokens", set(17, 7), validBin, megatron.ErrFloatDType, "float32 (code 7)"},
		{"float64 as tokens", set(17, 6), validBin, megatron.ErrFloatDType, "float64 (code 6)"},
		{"sequence count past the file", putU64(valid, 18, 1000), validBin, megatron.ErrSize, "sequence count 1000"},
		{"sequence count one more", putU64(valid, 18, 3), validBin, megatron.ErrSize, ""},
		{"document count past the file", putU64(valid, 26, 100), validBin, megatron.ErrSize, "document count 100"},
		{"document count one less", putU64(valid, 26, 2), validBin, megatron.ErrSize, "follow document_indices"},
		// 12 * 2^62 is 0 modulo 2^64: a product formed unchecked would fit.
		{"sequence count wrapping to 0", putU64(valid, 18, 1<<62), validBin, megatron.ErrSize, "sequence count 4611686018427387904"},
		{"sequence count wrapping 4*n", putU64(valid, 18, 1<<62+2), validBin, megatron.ErrSize, "sequence count"},
		{"document count wrapping to 0", putU64(putU64(valid, 18, 0), 26, 1<<61+5), validBin, megatron.ErrSize, "document count"},
		{"counts at the maximum", putU64(putU64(valid, 18, math.MaxUint64), 26, math.MaxUint64), validBin, megatron.ErrSize, ""},
		{"trailing byte", append(bytes.Clone(valid), 0), validBin, megatron.ErrSize, "1 bytes follow document_indices"},
		{"no document_indices", idxBytes(8, nil, nil, nil, nil), 0, megatron.ErrDocIndices, "document count 0"},
		{"document_indices not from 0", idxBytes(8, []int32{3, 2}, []int64{0, 6}, []int64{1, 1, 2}, nil), validBin, megatron.ErrDocIndices, "document_indices[0] (byte 58) is 1"},
		{"document_indices decreasing", idxBytes(8, []int32{1, 1, 1}, []int64{0, 2, 4}, []int64{0, 2, 1, 3}, nil), 6, megatron.ErrDocIndices, "document_indices[2] (byte 86) is 1, below"},
		{"document_indices not ending at the count", idxBytes(8, []int32{3, 2}, []int64{0, 6}, []int64{0, 1}, nil), validBin, megatron.ErrDocIndices, "want the sequence count 2"},
		{"document_indices past the count", idxBytes(8, []int32{3, 2}, []int64{0, 6}, []int64{0, 5, 2}, nil), validBin, megatron.ErrDocIndices, "document_indices[1] (byte 66) is 5, past"},
		{"document_indices negative", idxBytes(8, []int32{3, 2}, []int64{0, 6}, []int64{0, -1, 2}, nil), validBin, megatron.ErrDocIndices, "document_indices[1] (byte 66) is -1, negative"},
		{"pointer past the bin", idxBytes(8, []int32{3, 2}, []int64{0, 100}, []int64{0, 1, 2}, nil), validBin, megatron.ErrPointer, "sequence 1 (pointer at byte 50)"},
		{"bin one byte short", valid, validBin - 1, megatron.ErrPointer, "sequence 1"},
		{"bin empty", valid, 0, megatron.ErrPointer, "sequence 0"},
		{"negative pointer", idxBytes(8, []int32{3, 2}, []int64{0, -6}, []int64{0, 1, 2}, nil), validBin, megatron.ErrPointer, "negative pointer -6"},
		{"pointer overflowing, bin size unknown", idxBytes(5, []int32{2}, []int64{math.MaxInt64 - 8}, []int64{0, 1}, nil), -1, megatron.ErrPointer, "sequence 0 (pointer at byte 38) is 16 bytes at .bin offset 9223372036854775799, past the largest file offset"},
		{"overlapping sequences", idxBytes(8, []int32{3, 2}, []int64{0, 4}, []int64{0, 1, 2}, nil), validBin, megatron.ErrOverlap, "sequence 1 (pointer at byte 50) starts at .bin offset 4, before sequence 0 ends at 6"},
		{"pointers unsorted", idxBytes(8, []int32{3, 2}, []int64{4, 0}, []int64{0, 1, 2}, nil), validBin, megatron.ErrOverlap, "sequence 1"},
		{"negative length", idxBytes(8, []int32{3, -1}, []int64{0, 6}, []int64{0, 1, 2}, nil), validBin, megatron.ErrLength, "sequence 1 (length at byte 38) has length -1"},
		{"gap inside a document", idxBytes(8, []int32{1, 1, 1}, []int64{0, 2, 6}, []int64{0, 1, 3}, nil), 8, megatron.ErrGap, "document 1"},
		{"modes count wrong", append(bytes.Clone(valid), 0, 0, 0), validBin, megatron.ErrSize, ""},
		{"empty file", nil, validBin, megatron.ErrTruncated, ""},
		{"magic only", []byte(megatron.Magic), validBin, megatron.ErrTruncated, "shorter than the 34-byte header"},
		{"header cut", valid[:20], validBin, megatron.ErrTruncated, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			x, err := megatron.ParseBytes(c.idx, c.binSize)
			if !errors.Is(err, c.err) {
				t.Fatalf("err = %v (index %v), want %v", err, x != nil, c.err)
			}
			if !strings.Contains(err.Error(), c.says) || !strings.HasPrefix(err.Error(), "megatron: ") {
				t.Fatalf("err = %q, want it to say %q", err, c.says)
			}
			if x != nil {
				t.Fatal("an Index with an error")
			}
			t.Log(err)
		})
	}
}

// TestTruncated: every prefix of a valid .idx fails, whether its size is told
// truly or as the whole file's.
func TestTruncated(t *testing.T) {
	p := write(t, megatron.Int32, [][][]int64{{{1, 2}, {3}}, {{4}}})
	for n := range len(p.idx) {
		if _, err := megatron.ParseBytes(p.idx[:n], int64(len(p.bin))); err == nil {
			t.Errorf("prefix of %d bytes parsed", n)
		}
		_, err := megatron.Parse(bytes.NewReader(p.idx[:n]), int64(len(p.idx)), int64(len(p.bin)))
		if !errors.Is(err, megatron.ErrTruncated) && !errors.Is(err, megatron.ErrBadMagic) {
			t.Errorf("prefix of %d bytes said to be %d: %v", n, len(p.idx), err)
		}
	}
}

// failingReader fails every read past its first n bytes with err.
type failingReader struct {
	b   []byte
	err error
}

func (f failingReader) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > int64(len(f.b)) {
		return 0, f.err
	}
	return copy(p, f.b[off:]), nil
}

// TestReadError: a failing read is reported with its cause and offset.
func TestReadError(t *testing.T) {
	boom := errors.New("connection reset")
	_, err := megatron.Parse(failingReader{valid[:40], boom}, int64(len(valid)), validBin)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "at byte") {
		t.Fatalf("err = %v", err)
	}
}

// TestHostileCountsDoNotAllocate: a 100-byte .idx claiming 2^60 sequences, or a
// size far beyond the file, fails before anything is allocated in proportion.
func TestHostileCountsDoNotAllocate(t *testing.T) {
	huge := putU64(make([]byte, 100), 0, 0)
	copy(huge, idxBytes(8, nil, nil, nil, nil))
	huge = putU64(huge, 18, 1<<60)
	huge = putU64(huge, 26, 1)

	// 2^36 sequences and one document_indices entry, consistent with the size the
	// caller gives, 768 GiB, in a file of 100 bytes.
	const lie = megatron.HeaderSize + 12<<36 + 8
	liar := putU64(putU64(huge, 18, 1<<36), 26, 1)

	for _, c := range []struct {
		name string
		size int64
		idx  []byte
		err  error
	}{
		{"2^60 sequences", int64(len(huge)), huge, megatron.ErrSize},
		{"size beyond the file", lie, liar, megatron.ErrTruncated},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := bytes.NewReader(c.idx)
			if _, err := megatron.Parse(r, c.size, -1); !errors.Is(err, c.err) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			allocs := testing.AllocsPerRun(100, func() {
				megatron.Parse(r, c.size, -1)
			})
			if allocs > 8 {
				t.Errorf("%v allocations per Parse", allocs)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range 100 {
				megatron.Parse(r, c.size, -1)
			}
			runtime.ReadMemStats(&after)
			if bytesPer := (after.TotalAlloc - before.TotalAlloc) / 100; bytesPer > 1024 {
				t.Errorf("%d bytes allocated per Parse", bytesPer)
			}
		})
	}
}

// TestAppendTokens decodes each dtype's bytes and appends in place.
func TestAppendTokens(t *testing.T) {
	for _, c := range []struct {
		dt   megatron.DType
		b    []byte
		want []int64
	}{
		{megatron.Uint8, []byte{0, 255}, []int64{0, 255}},
		{megatron.Int8, []byte{0x80, 0x7f, 0xff}, []int64{-128, 127, -1}},
		{megatron.Uint16, []byte{0xff, 0xff, 1, 0}, []int64{65535, 1}},
		{megatron.Int16, []byte{0, 0x80, 0xff, 0x7f}, []int64{-32768, 32767}},
		{megatron.Int32, []byte{0, 0, 0, 0x80, 2, 0, 0, 0}, []int64{math.MinInt32, 2}},
		{megatron.Int64, []byte{0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []int64{-2}},
	} {
		got, err := megatron.AppendTokens([]int64{42}, c.b, c.dt)
		if err != nil || !slices.Equal(got, append([]int64{42}, c.want...)) {
			t.Errorf("%v: %v, %v, want 42 then %v", c.dt, got, err, c.want)
		}
	}
	buf := make([]int64, 0, 64)
	b := make([]byte, 128)
	if allocs := testing.AllocsPerRun(100, func() {
		buf, _ = megatron.AppendTokens(buf[:0], b, megatron.Uint16)
	}); allocs != 0 {
		t.Errorf("%v allocations with room in the buffer", allocs)
	}
	for _, c := range []struct {
		dt  megatron.DType
		b   []byte
		err error
	}{
		{megatron.Float32, make([]byte, 8), megatron.ErrFloatDType},
		{megatron.Float64, make([]byte, 8), megatron.ErrFloatDType},
		{megatron.DType(0), make([]byte, 8), megatron.ErrDType},
		{megatron.DType(200), make([]byte, 8), megatron.ErrDType},
		{megatron.Int32, make([]byte, 6), megatron.ErrPartialToken},
	} {
		dst := []int64{1}
		got, err := megatron.AppendTokens(dst, c.b, c.dt)
		if !errors.Is(err, c.err) || !slices.Equal(got, dst) {
			t.Errorf("%v, %d bytes: %v, %v, want %v", c.dt, len(c.b), got, err, c.err)
		}
	}
}

// integerDTypes are the dtypes AppendTokens decodes.
var integerDTypes = []megatron.DType{megatron.Uint8, megatron.Int8, megatron.Uint16, megatron.Int16, megatron.Int32, megatron.Int64}

// tokenBytes returns bytes for up to 40 elements of any integer dtype, and one more
// for a misaligned start, of no pattern a decode could pass by luck.
func tokenBytes() []byte {
	raw := make([]byte, 8*40+1)
	for i := range raw {
		raw[i] = byte(i*151 + 7)
	}
	return raw
}

// TestAppendTokensLengths decodes every integer dtype at lengths around the eight
// elements a step of the unrolled loops takes, against a plain element-by-element
// decode, from a misaligned slice too.
func TestAppendTokensLengths(t *testing.T) {
	raw := tokenBytes()
	for _, dt := range integerDTypes {
		size := dt.Size()
		for n := 0; n <= 40; n++ {
			for _, skew := range []int{0, 1} {
				b := raw[skew : skew+n*size]
				want := make([]int64, n)
				for i := range want {
					var u uint64
					for k := size - 1; k >= 0; k-- {
						u = u<<8 | uint64(b[i*size+k])
					}
					switch dt {
					case megatron.Int8:
						want[i] = int64(int8(u))
					case megatron.Int16:
						want[i] = int64(int16(u))
					case megatron.Int32:
						want[i] = int64(int32(u))
					default:
						want[i] = int64(u)
					}
				}
				got, err := megatron.AppendTokens(nil, b, dt)
				if err != nil || !slices.Equal(got, want) {
					t.Fatalf("%v, %d elements, skew %d: %v, %v, want %v", dt, n, skew, got, err, want)
				}
			}
		}
	}
}

// BenchmarkAppendTokens decodes a batch's worth of tokens (32 rows of 2,048) of
// each 16- and 32-bit dtype; the bytes are the stored ones.
func BenchmarkAppendTokens(b *testing.B) {
	const n = 32 * 2048
	for _, dt := range []megatron.DType{megatron.Uint16, megatron.Int32} {
		b.Run(dt.String(), func(b *testing.B) {
			src := make([]byte, n*dt.Size())
			dst := make([]int64, 0, n)
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				dst, _ = megatron.AppendTokens(dst[:0], src, dt)
			}
		})
	}
}

// TestDType: names, sizes and kinds of every code.
func TestDType(t *testing.T) {
	for _, c := range []struct {
		dt      megatron.DType
		name    string
		size    int
		integer bool
	}{
		{1, "uint8", 1, true}, {2, "int8", 1, true}, {3, "int16", 2, true}, {4, "int32", 4, true},
		{5, "int64", 8, true}, {6, "float64", 8, false}, {7, "float32", 4, false}, {8, "uint16", 2, true},
		{0, "dtype(0)", 0, false}, {9, "dtype(9)", 0, false},
	} {
		if c.dt.String() != c.name || c.dt.Size() != c.size || c.dt.Integer() != c.integer || c.dt.Known() != (c.size > 0) {
			t.Errorf("code %d: %q size %d integer %v known %v", uint8(c.dt), c.dt, c.dt.Size(), c.dt.Integer(), c.dt.Known())
		}
	}
}

// failingWriter fails every write.
type failingWriter struct{ err error }

func (f failingWriter) Write([]byte) (int, error) { return 0, f.err }

// TestWriterErrors: a token out of range writes nothing and the Writer goes on; a
// failed write is sticky; Close ends it.
func TestWriterErrors(t *testing.T) {
	for _, dt := range []megatron.DType{megatron.Float32, megatron.Float64, 0, 9} {
		if _, err := megatron.NewWriter(nil, nil, dt); err == nil {
			t.Errorf("NewWriter(%v) worked", dt)
		}
	}
	for _, c := range intDTypes {
		var bin, idx bytes.Buffer
		w, _ := megatron.NewWriter(&bin, &idx, c.dt)
		if err := w.AddDocument([]int64{c.lo, c.hi}); err != nil {
			t.Fatalf("%v: %v", c.dt, err)
		}
		if c.dt == megatron.Int64 {
			continue
		}
		for _, bad := range []int64{c.lo - 1, c.hi + 1} {
			err := w.AddDocumentSequences([][]int64{{1}, {2, bad}})
			if !errors.Is(err, megatron.ErrTokenRange) || !strings.Contains(err.Error(), "document 1, sequence 1 of it, token 1") {
				t.Errorf("%v: token %d: %v", c.dt, bad, err)
			}
		}
		if bin.Len() != 2*c.dt.Size() {
			t.Errorf("%v: %d bytes written after refused tokens", c.dt, bin.Len())
		}
		if err := w.AddDocument([]int64{1}); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		x, err := megatron.ParseBytes(idx.Bytes(), int64(bin.Len()))
		if err != nil || x.Docs() != 2 {
			t.Fatalf("%v: %v", c.dt, err)
		}
		if err := w.AddDocument(nil); !errors.Is(err, megatron.ErrClosed) {
			t.Errorf("AddDocument after Close: %v", err)
		}
		if err := w.Close(); !errors.Is(err, megatron.ErrClosed) {
			t.Errorf("Close after Close: %v", err)
		}
	}

	boom := errors.New("disk full")
	w, _ := megatron.NewWriter(failingWriter{boom}, &bytes.Buffer{}, megatron.Uint16)
	if err := w.AddDocument([]int64{1}); !errors.Is(err, boom) {
		t.Fatalf("bin write: %v", err)
	}
	if err := w.AddDocument([]int64{1}); !errors.Is(err, boom) {
		t.Fatalf("after a failed write: %v", err)
	}
	if err := w.Close(); !errors.Is(err, boom) {
		t.Fatalf("Close after a failed write: %v", err)
	}
	w, _ = megatron.NewWriter(&bytes.Buffer{}, failingWriter{boom}, megatron.Uint16)
	w.AddDocument([]int64{1})
	if err := w.Close(); !errors.Is(err, boom) || !strings.Contains(err.Error(), ".idx") {
		t.Fatalf("idx write: %v", err)
	}
}

// TestLongSequences: a sequence longer than the Writer's encoding piece, and an
// .idx larger than Parse's read buffer.
func TestLongSequences(t *testing.T) {
	long := make([]int64, 100_000)
	for i := range long {
		long[i] = int64(i % 65536)
	}
	docs := [][][]int64{{long}}
	for i := range 20_000 {
		docs = append(docs, [][]int64{{int64(i)}})
	}
	p := write(t, megatron.Uint16, docs)
	x, err := megatron.ParseBytes(p.idx, int64(len(p.bin)))
	if err != nil {
		t.Fatal(err)
	}
	if got := docTokens(t, x, p.bin, 0); !slices.Equal(got, long) {
		t.Fatal("long document differs")
	}
	if got := docTokens(t, x, p.bin, 20_000); !slices.Equal(got, []int64{19_999}) {
		t.Fatalf("last document = %v", got)
	}
}

// TestOutOfRange: a document or sequence out of range panics, naming it.
func TestOutOfRange(t *testing.T) {
	x, err := megatron.ParseBytes(valid, validBin)
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func(){
		"DocRange(2)":        func() { x.DocRange(2) },
		"DocTokens(-1)":      func() { x.DocTokens(-1) },
		"DocSequences(2)":    func() { x.DocSequences(2) },
		"SequenceRange(2)":   func() { x.SequenceRange(2) },
		"SequenceMode(-1)":   func() { x.SequenceMode(-1) },
		"SequenceTokens(99)": func() { x.SequenceTokens(99) },
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), "out of range") {
					t.Errorf("%s: recovered %v", name, r)
				}
			}()
			f()
		}()
	}
}

// countWriter counts what is written to it.
type countWriter struct{ n int64 }

func (c *countWriter) Write(b []byte) (int, error) { c.n += int64(len(b)); return len(b), nil }

// BenchmarkParse parses an .idx of 10^6 documents of 1 to 64 uint16 tokens, one
// sequence each as Megatron-LM writes them by default, or two (--split-sentences).
func BenchmarkParse(b *testing.B) {
	const docs = 1_000_000
	for _, perDoc := range []int{1, 2} {
		name := map[int]string{1: "sequence-per-doc", 2: "sentences"}[perDoc]
		b.Run(name, func(b *testing.B) {
			var bin countWriter
			var idx bytes.Buffer
			w, _ := megatron.NewWriter(&bin, &idx, megatron.Uint16)
			r := rand.New(rand.NewPCG(3, 4))
			toks := make([]int64, 64)
			seqs := make([][]int64, perDoc)
			for range docs {
				for k := range seqs {
					seqs[k] = toks[:1+r.IntN(64)]
				}
				if err := w.AddDocumentSequences(seqs); err != nil {
					b.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
			data := idx.Bytes()
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			var x *megatron.Index
			for b.Loop() {
				var err error
				if x, err = megatron.ParseBytes(data, bin.n); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/docs, "ns/doc")
			b.ReportMetric(float64(x.MemoryBytes())/docs, "B/doc")
		})
	}
}

// AppendTokens32 gives AppendTokens' ids as int32 for the dtypes whose ids an int32
// holds, at every length (the eight-at-a-time loop and its tail), and declines the
// others, appending nothing.
func TestAppendTokens32(t *testing.T) {
	raw := tokenBytes()
	for _, dt := range integerDTypes {
		size := dt.Size()
		for n := 0; n <= 40; n++ {
			b := raw[1 : 1+n*size]
			want, err := megatron.AppendTokens(nil, b, dt)
			if err != nil {
				t.Fatal(err)
			}
			got, ok, err := megatron.AppendTokens32([]int32{42}, b, dt)
			if err != nil || ok != (dt != megatron.Int64) {
				t.Fatalf("%v, %d tokens: ok %v, %v", dt, n, ok, err)
			}
			if !ok {
				if !slices.Equal(got, []int32{42}) {
					t.Fatalf("%v declined, but appended: %v", dt, got)
				}
				continue
			}
			if len(got) != n+1 || got[0] != 42 {
				t.Fatalf("%v, %d tokens: %d appended", dt, n, len(got)-1)
			}
			for i, v := range want {
				if int64(got[i+1]) != v {
					t.Fatalf("%v, %d tokens: token %d is %d, AppendTokens gives %d", dt, n, i, got[i+1], v)
				}
			}
		}
	}
	if _, _, err := megatron.AppendTokens32(nil, make([]byte, 3), megatron.Uint16); !errors.Is(err, megatron.ErrPartialToken) {
		t.Errorf("3 bytes of uint16: %v", err)
	}
}
