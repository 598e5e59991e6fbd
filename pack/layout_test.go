package pack

import (
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestLayoutLocate(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, s := range coverageSpecs {
		spec, _ := ParseSpec(s)
		for _, k := range []int{1, 2, 7, BlockDocs} {
			c := randomCorpus(r, 200, spec.SeqLen)
			l, err := newLayout(spec, len(c.lens), c.length, k)
			if err != nil {
				t.Fatal(err)
			}
			var stream []tokenRef
			for _, row := range refRows(spec, c) {
				stream = append(stream, row...)
			}
			for i, w := range stream {
				doc, within := l.Locate(int64(i))
				if w.doc < 0 {
					if doc != -1 || within != int64(i)-l.Tokens() {
						t.Fatalf("%s k=%d: Locate(%d) in the pad = %d, %d", s, k, i, doc, within)
					}
					continue
				}
				if doc != w.doc || within != w.off {
					t.Fatalf("%s k=%d: Locate(%d) = %d, %d, want %d, %d", s, k, i, doc, within, w.doc, w.off)
				}
			}
			var tokens int64
			for _, n := range c.lens {
				tokens += n + spec.eosLen()
			}
			if l.Tokens() != tokens || l.Rows() != (tokens+int64(spec.SeqLen)-1)/int64(spec.SeqLen) || l.Docs() != len(c.lens) || l.Spec() != spec {
				t.Fatalf("%s: Tokens %d Rows %d Docs %d, want %d tokens", s, l.Tokens(), l.Rows(), l.Docs(), tokens)
			}
		}
	}
}

func TestLayoutEmpty(t *testing.T) {
	spec, _ := ParseSpec("t:4")
	for _, tc := range []struct {
		spec   string
		lens   []int64
		tokens int64
		rows   int64
	}{
		{"t:4", nil, 0, 0},
		{"t:4:eos=1", nil, 0, 0},
		{"t:4", []int64{0, 0, 0}, 0, 0},
		{"t:4:eos=1", []int64{0, 0, 0}, 3, 1},
		{"t:4", []int64{4}, 4, 1},
		{"t:4", []int64{0, 5, 0}, 5, 2},
		{"t:4:eos=1", []int64{3}, 4, 1},
	} {
		spec, _ = ParseSpec(tc.spec)
		c := &corpus{lens: tc.lens}
		l, err := NewLayout(spec, len(tc.lens), c.length)
		if err != nil {
			t.Fatal(err)
		}
		if l.Tokens() != tc.tokens || l.Rows() != tc.rows {
			t.Errorf("%s %v: %d tokens %d rows, want %d %d", tc.spec, tc.lens, l.Tokens(), l.Rows(), tc.tokens, tc.rows)
		}
		if p := l.Pieces(0, 10, nil); tc.rows == 0 && len(p) != 0 {
			t.Errorf("%s %v: pieces %v of no rows", tc.spec, tc.lens, p)
		}
	}
	if _, err := NewLayout(spec, 0, nil); err != nil {
		t.Errorf("no documents and no length function: %v", err)
	}
}

func TestLayoutErrors(t *testing.T) {
	spec, _ := ParseSpec("t:4:eos=0")
	lens := []int64{3, 5, -2, 4}
	_, err := NewLayout(spec, len(lens), func(i int) int64 { return lens[i] })
	if !errors.Is(err, ErrNegativeLength) || !strings.Contains(err.Error(), "document 2") {
		t.Errorf("a negative length: %v", err)
	}
	for _, huge := range [][]int64{
		{math.MaxInt64},
		{math.MaxInt64 - 4},
		{math.MaxInt64/2 + 1, math.MaxInt64 / 2},
		{1 << 62, 1 << 62, 1 << 62},
	} {
		_, err = NewLayout(spec, len(huge), func(i int) int64 { return huge[i] })
		if !errors.Is(err, ErrOverflow) {
			t.Errorf("lengths %v: %v", huge, err)
		}
	}
	// The largest epoch that fits: its rows times SEQ_LEN still fit in an int64.
	l, err := NewLayout(spec, 1, func(int) int64 { return math.MaxInt64 - 5 })
	if err != nil {
		t.Fatal(err)
	}
	if l.Rows() != (math.MaxInt64-4)/4+1 {
		t.Errorf("%d rows", l.Rows())
	}
	p := l.Pieces(l.Rows()-1, l.Rows(), nil)
	if len(p) != 2 || p[0].To != math.MaxInt64-4 || !p[0].EOS || p[1].Doc != -1 || p[1].Col+p[1].Len() != 4 {
		t.Errorf("last row of the largest epoch: %+v", p)
	}
	if _, err := NewLayout(Spec{Field: "t"}, 1, func(int) int64 { return 1 }); !errors.Is(err, ErrSeqLen) {
		t.Errorf("a zero Spec: %v", err)
	}
	if _, err := NewLayout(spec, -1, nil); !errors.Is(err, ErrDocs) {
		t.Error("a negative number of documents")
	}
	if _, err := NewLayout(spec, 3, nil); !errors.Is(err, ErrDocs) {
		t.Error("documents without a length function")
	}
}

// TestLayoutLengthChanged checks that a length function giving other lengths later
// is caught rather than giving wrong pieces silently.
func TestLayoutLengthChanged(t *testing.T) {
	spec, _ := ParseSpec("t:4")
	grow := int64(0)
	l, err := newLayout(spec, 10, func(i int) int64 { return 2 - grow }, 4)
	if err != nil {
		t.Fatal(err)
	}
	grow = 2
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "length function") {
			t.Errorf("recovered %v", r)
		}
	}()
	l.Pieces(0, l.Rows(), nil)
}

// TestPieces checks the pieces of a small layout by hand, and Pieces's clamping.
func TestPieces(t *testing.T) {
	spec, _ := ParseSpec("t:4:eos=9")
	lens := []int64{5, 0, 2}
	l, err := NewLayout(spec, len(lens), func(i int) int64 { return lens[i] })
	if err != nil {
		t.Fatal(err)
	}
	// Stream: d0 d0 d0 d0 | d0 eos eos(d1) d2 | d2 eos pad pad
	want := []Piece{
		{Doc: 0, From: 0, To: 4, Row: 0, Col: 0},
		{Doc: 0, From: 4, To: 6, Row: 1, Col: 0, EOS: true},
		{Doc: 1, From: 0, To: 1, Row: 1, Col: 2, EOS: true},
		{Doc: 2, From: 0, To: 1, Row: 1, Col: 3},
		{Doc: 2, From: 1, To: 3, Row: 2, Col: 0, EOS: true},
		{Doc: -1, From: 0, To: 2, Row: 2, Col: 2},
	}
	got := l.Pieces(-3, 99, nil)
	if len(got) != len(want) {
		t.Fatalf("pieces %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("piece %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if got := l.Pieces(1, 2, nil); len(got) != 3 || got[0] != want[1] || got[2] != want[3] {
		t.Errorf("row 1: %+v", got)
	}
	if got := l.Pieces(2, 2, nil); len(got) != 0 {
		t.Errorf("no rows: %+v", got)
	}
	if got := l.Pieces(3, 5, nil); len(got) != 0 {
		t.Errorf("rows past the end: %+v", got)
	}
	if n := []int{got[0].DocTokens(), want[1].DocTokens(), want[2].DocTokens(), want[5].DocTokens()}; n[0] != 4 || n[1] != 1 || n[2] != 0 || n[3] != 0 {
		t.Errorf("DocTokens %v", n)
	}
}

// TestWalkPieces checks that WalkPieces gives what Pieces gives for the row ranges
// a rank asks for in order (batches dealt round the world, pad rows past the end),
// and for ranges that go back, where the walk must not be used.
func TestWalkPieces(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, s := range coverageSpecs {
		spec, _ := ParseSpec(s)
		for _, k := range []int{1, 3, BlockDocs} {
			c := randomCorpus(r, 300, spec.SeqLen)
			calls := 0
			l, err := newLayout(spec, len(c.lens), func(i int) int64 { calls++; return c.length(i) }, k)
			if err != nil {
				t.Fatal(err)
			}
			for _, world := range []int64{1, 2, 5} {
				for _, batch := range []int64{1, 3} {
					var w Walk
					for rank := range world {
						for from := rank * batch; from < l.Rows()+batch; from += world * batch {
							got := l.WalkPieces(&w, from, from+batch, nil)
							if want := l.Pieces(from, from+batch, nil); !slices.Equal(got, want) {
								t.Fatalf("%s k=%d world %d: rows %d+%d: %v, want %v", s, k, world, from, batch, got, want)
							}
						}
					}
				}
			}
			// Ranges in random order, the walk kept: each as Pieces gives it.
			var w Walk
			for range 200 {
				from := r.Int64N(l.Rows() + 2)
				to := from + r.Int64N(4)
				if got, want := l.WalkPieces(&w, from, to, nil), l.Pieces(from, to, nil); !slices.Equal(got, want) {
					t.Fatalf("%s k=%d: rows %d to %d: %v, want %v", s, k, from, to, got, want)
				}
			}
			// A rank of one walks each document about once.
			w, calls = Walk{}, 0
			for from := int64(0); from < l.Rows(); from += 2 {
				l.WalkPieces(&w, from, from+2, nil)
			}
			if limit := 2*len(c.lens) + int(l.Rows()); calls > limit {
				t.Errorf("%s k=%d: %d length calls for one walk over %d documents, %d rows", s, k, calls, len(c.lens), l.Rows())
			}
		}
	}
}

// TestLayoutMemory checks that a layout of 10^7 documents allocates less than 1 MB:
// no state per document.
func TestLayoutMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("10^7 documents")
	}
	spec, _ := ParseSpec("tokens:2048:eos=0")
	const docs = 10_000_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l, err := NewLayout(spec, docs, func(i int) int64 { return int64(i%4099 + i%7) })
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got >= 1<<20 {
		t.Errorf("NewLayout of %d documents allocated %d bytes", docs, got)
	} else {
		t.Logf("NewLayout of %d documents allocated %d bytes (%d rows)", docs, got, l.Rows())
	}
	// Pieces of a batch deep into the epoch allocate nothing into a slice with room.
	dst := make([]Piece, 0, 64)
	if n := testing.AllocsPerRun(10, func() { dst = l.Pieces(l.Rows()/2, l.Rows()/2+8, dst[:0]) }); n != 0 {
		t.Errorf("Pieces allocates %v times", n)
	}
}
