package pack

import (
	"fmt"
	"testing"
)

// BenchmarkNewLayout lays out epochs of 10^6 and 10^8 documents (the latter takes
// about a second an op) and reports the cost per document.
func BenchmarkNewLayout(b *testing.B) {
	spec, _ := ParseSpec("tokens:4096:eos=0")
	for _, docs := range []int{1_000_000, 100_000_000} {
		b.Run(fmt.Sprintf("docs=%d", docs), func(b *testing.B) {
			b.ReportAllocs()
			length := func(i int) int64 { return int64(i%4099 + i%7) }
			var l *Layout
			for b.Loop() {
				var err error
				if l, err = NewLayout(spec, docs, length); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(docs), "ns/doc")
			b.ReportMetric(float64(8*len(l.cum)), "layout-bytes")
		})
	}
}

// BenchmarkBatch finds and fills one batch of 8 rows of 4096 tokens deep into an
// epoch of 10^6 documents: Pieces then Fill, in bytes of int64 input_ids.
func BenchmarkBatch(b *testing.B) {
	spec, _ := ParseSpec("tokens:4096:eos=0")
	length := func(i int) int64 { return int64(i%4099 + i%7) }
	l, err := NewLayout(spec, 1_000_000, length)
	if err != nil {
		b.Fatal(err)
	}
	f, _ := NewFiller(spec, 8)
	batch := newBatch(f, false)
	cu := batch.CuSeqlens
	tokens := func(p Piece, dst []int64) error {
		for i := range dst {
			dst[i] = p.From + int64(i)
		}
		return nil
	}
	pieces := make([]Piece, 0, 64)
	b.SetBytes(int64(8 * f.Tokens()))
	b.ReportAllocs()
	row := l.Rows() / 3
	for b.Loop() {
		pieces = l.Pieces(row, row+8, pieces[:0])
		batch.CuSeqlens = cu
		if err := f.Fill(batch, pieces, tokens); err != nil {
			b.Fatal(err)
		}
	}
}
