package pack

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// fillRows fills one batch of rows [from, to) and pad rows up to batch.
func fillRows(t *testing.T, spec string, lens []int64, batch int, from, to int64) *Batch {
	t.Helper()
	sp, err := ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	c := &corpus{lens: lens}
	l, err := NewLayout(sp, len(lens), c.length)
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewFiller(sp, batch)
	if err != nil {
		t.Fatal(err)
	}
	b := newBatch(f, false)
	if err := f.Fill(b, l.Pieces(from, to, nil), c.tokens); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFillSegments checks position_ids and cu_seqlens of small batches by hand.
func TestFillSegments(t *testing.T) {
	for _, tc := range []struct {
		spec     string
		lens     []int64
		batch    int
		from, to int64
		pos      string
		cu       string
		max      int32
	}{
		// With eos: documents 3, 0 (eos alone), 2; the pad after an eos starts at 0.
		{"t:4:eos=1", []int64{3, 0, 2}, 2, 0, 2,
			"[0 1 2 3 0 0 1 2]", "[0 4 5 8]", 4},
		{"t:5:eos=1", []int64{3, 0, 2}, 2, 0, 2,
			"[0 1 2 3 0 0 1 2 0 1]", "[0 4 5 8 10]", 4},
		// Without eos: the pad continues the last document's segment.
		{"t:4", []int64{1, 2}, 2, 0, 1,
			"[0 0 1 2 0 1 2 3]", "[0 1 4 8]", 4},
		{"t:6", []int64{1, 2}, 1, 0, 1,
			"[0 0 1 2 3 4]", "[0 1 6]", 5},
		// A document across rows restarts at each row's start; a pad row is a segment.
		{"t:3", []int64{7}, 4, 0, 3,
			"[0 1 2 0 1 2 0 1 2 0 1 2]", "[0 3 6 9 12]", 3},
		// A batch of pad only.
		{"t:3", []int64{7}, 2, 3, 3,
			"[0 1 2 0 1 2]", "[0 3 6]", 3},
		// The last row starting with the pad (the stream ends at a row's end).
		{"t:2:eos=0", []int64{1}, 2, 0, 1,
			"[0 1 0 1]", "[0 2 4]", 2},
	} {
		b := fillRows(t, tc.spec, tc.lens, tc.batch, tc.from, tc.to)
		if got := fmt.Sprint(b.PositionIDs); got != tc.pos {
			t.Errorf("%s %v: position_ids %s, want %s", tc.spec, tc.lens, got, tc.pos)
		}
		if got := fmt.Sprint(b.CuSeqlens); got != tc.cu {
			t.Errorf("%s %v: cu_seqlens %s, want %s", tc.spec, tc.lens, got, tc.cu)
		}
		if b.MaxSeqlen != tc.max {
			t.Errorf("%s %v: max_seqlen %d, want %d", tc.spec, tc.lens, b.MaxSeqlen, tc.max)
		}
	}
}

func TestFillInt32(t *testing.T) {
	spec, _ := ParseSpec("t:4:eos=1:pad=2")
	lens := []int64{3, 4}
	big := int64(math.MaxInt32) + 1
	tokens := func(p Piece, dst []int64) error {
		for i := range dst {
			dst[i] = 7
			if p.Doc == 1 && p.From+int64(i) == 2 {
				dst[i] = big
			}
		}
		return nil
	}
	l, _ := NewLayout(spec, len(lens), func(i int) int64 { return lens[i] })
	f, _ := NewFiller(spec, 2)
	b := newBatch(f, true)
	err := f.Fill(b, l.Pieces(0, 2, nil), tokens)
	if !errors.Is(err, ErrIDRange) || !strings.Contains(err.Error(), "document 1") || !strings.Contains(err.Error(), fmt.Sprint(big)) || !strings.Contains(err.Error(), "offset 2") {
		t.Errorf("an id past int32: %v", err)
	}
	// int64 output takes it.
	b = newBatch(f, false)
	if err := f.Fill(b, l.Pieces(0, 2, nil), tokens); err != nil || b.InputIDs[6] != big {
		t.Errorf("int64 output: %v %v", err, b.InputIDs)
	}
	// An eos that int32 cannot hold is refused for int32 output, naming the spec.
	spec, _ = ParseSpec("t:4:eos=4294967296")
	f, _ = NewFiller(spec, 1)
	b = newBatch(f, true)
	if err := f.Fill(b, nil, tokens); !errors.Is(err, ErrIDRange) || !strings.Contains(err.Error(), spec.String()) {
		t.Errorf("eos past int32: %v", err)
	}
}

func TestFillErrors(t *testing.T) {
	spec, _ := ParseSpec("t:4:eos=1")
	lens := []int64{3, 1, 6}
	c := &corpus{lens: lens}
	l, _ := NewLayout(spec, len(lens), c.length)
	f, _ := NewFiller(spec, 2)
	good := l.Pieces(0, 2, nil) // d0 d0 d0 eos | d1 eos d2 d2
	if len(good) != 3 {
		t.Fatalf("pieces %+v", good)
	}
	if err := f.Fill(newBatch(f, false), good, c.tokens); err != nil {
		t.Fatal(err)
	}
	for name, pieces := range map[string][]Piece{
		"not at a row's start": good[2:],
		"a gap":                {good[0], good[2]},
		"mid-row end":          good[:len(good)-1],
		"three rows":           l.Pieces(0, 3, nil),
		"eos without eos":      {{Doc: 0, From: 0, To: 4, EOS: true}},
		"pad with eos":         {{Doc: -1, From: 0, To: 4, EOS: true}},
		"empty piece":          {{Doc: 0, From: 0, To: 0}, {Doc: 0, From: 0, To: 4}},
		"past the row":         {{Doc: 0, From: 0, To: 5}},
	} {
		if name == "eos without eos" {
			sp, _ := ParseSpec("t:4")
			f, _ := NewFiller(sp, 2)
			if err := f.Fill(newBatch(f, false), pieces, c.tokens); !errors.Is(err, ErrPieces) {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if err := f.Fill(newBatch(f, false), pieces, c.tokens); !errors.Is(err, ErrPieces) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, b := range map[string]*Batch{
		"no input_ids":         {PositionIDs: make([]int64, 8)},
		"both input_ids":       {InputIDs: make([]int64, 8), InputIDs32: make([]int32, 8)},
		"short input_ids":      {InputIDs: make([]int64, 7)},
		"short input_ids32":    {InputIDs32: make([]int32, 7)},
		"short position_ids":   {InputIDs: make([]int64, 8), PositionIDs: make([]int64, 7)},
		"short cu_seqlens cap": {InputIDs: make([]int64, 8), CuSeqlens: make([]int32, 8)},
	} {
		if err := f.Fill(b, good, c.tokens); !errors.Is(err, ErrBuffers) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Only input_ids wanted.
	b := &Batch{InputIDs: make([]int64, 8)}
	if err := f.Fill(b, good, c.tokens); err != nil || b.MaxSeqlen != 4 {
		t.Errorf("input_ids alone: %v, max %d", err, b.MaxSeqlen)
	}
	// The tokens function's error comes back, wrapped.
	boom := errors.New("boom")
	err := f.Fill(newBatch(f, false), good, func(Piece, []int64) error { return boom })
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "document 0") {
		t.Errorf("tokens error: %v", err)
	}
	err = f.Fill(newBatch(f, true), good, func(Piece, []int64) error { return boom })
	if !errors.Is(err, boom) {
		t.Errorf("tokens error, int32: %v", err)
	}
	for _, bs := range []int{0, -1, math.MaxInt32/4 + 1} {
		if _, err := NewFiller(spec, bs); !errors.Is(err, ErrBatchSize) {
			t.Errorf("NewFiller(%d): %v", bs, err)
		}
	}
	if _, err := NewFiller(Spec{Field: "t"}, 1); !errors.Is(err, ErrSeqLen) {
		t.Errorf("NewFiller of a zero spec: %v", err)
	}
	if f.BatchSize() != 2 || f.Tokens() != 8 || f.MaxCuSeqlens() != 9 {
		t.Errorf("BatchSize %d Tokens %d MaxCuSeqlens %d", f.BatchSize(), f.Tokens(), f.MaxCuSeqlens())
	}
}

// TestFillAllocs checks that filling a batch allocates nothing, in int64 and (after
// its first batch) int32.
func TestFillAllocs(t *testing.T) {
	spec, _ := ParseSpec("t:64:eos=1")
	c := &corpus{lens: []int64{10, 100, 3, 0, 70, 200, 5}}
	l, _ := NewLayout(spec, len(c.lens), c.length)
	f, _ := NewFiller(spec, 4)
	pieces := l.Pieces(0, 4, nil)
	tokens := func(p Piece, dst []int64) error {
		for i := range dst {
			dst[i] = int64(p.Doc)
		}
		return nil
	}
	for _, int32IDs := range []bool{false, true} {
		b := newBatch(f, int32IDs)
		cu := b.CuSeqlens
		n := testing.AllocsPerRun(20, func() {
			b.CuSeqlens = cu
			if err := f.Fill(b, pieces, tokens); err != nil {
				t.Fatal(err)
			}
		})
		if n != 0 {
			t.Errorf("int32 %v: Fill allocates %v times", int32IDs, n)
		}
	}
}
