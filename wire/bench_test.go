package wire

import (
	"fmt"
	"testing"

	"github.com/shardload/shardload/decode"
)

// collateInput returns 32 rows of a 110 KB raw field (a JPEG-sized image) and an int
// label, a slab that fits them, and their bytes.
func collateInput(b *testing.B) (fields []decode.Field, keys []string, vals [][]decode.Value, slab []byte, total int64) {
	fields = []decode.Field{mustField(b, "img=jpg"), mustField(b, "label=cls")}
	const rows, size = 32, 110_000
	keys = make([]string, rows)
	vals = make([][]decode.Value, rows)
	for i := range rows {
		keys[i] = fmt.Sprintf("train/%08d", i)
		vals[i] = []decode.Value{{Data: seq(size)}, {Int: int64(i % 1000)}}
		total += size + 8 + int64(len(keys[i]))
	}
	return fields, keys, vals, make([]byte, Needed(fields, keys, vals)), total
}

// BenchmarkCollate collates 32 rows of a 110 KB raw field (a JPEG-sized image) and
// an int label into a reused slab and Layout.
func BenchmarkCollate(b *testing.B) {
	fields, keys, vals, slab, total := collateInput(b)
	var batch Layout
	b.SetBytes(total)
	b.ReportAllocs()
	for b.Loop() {
		if err := CollateInto(&batch, slab, fields, keys, vals); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCollateAlloc is BenchmarkCollate with Collate, which allocates the
// Layout's columns and shapes every time.
func BenchmarkCollateAlloc(b *testing.B) {
	fields, keys, vals, slab, total := collateInput(b)
	b.SetBytes(total)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Collate(slab, fields, keys, vals); err != nil {
			b.Fatal(err)
		}
	}
}
