package decode

import (
	stdgzip "compress/gzip"
	"fmt"
	"strings"
	"testing"
)

// BenchmarkDecodeNPY decodes a real Lhotse feature matrix (float32, 2238x80, 700 KiB)
// with a fixed-shape field: the header is parsed and checked, the data is not
// copied.
func BenchmarkDecodeNPY(b *testing.B) {
	var data []byte
	for _, v := range lhotseNPYs(b) {
		if len(data) < len(v) {
			data = v
		}
	}
	a, err := ParseNPY(data)
	if err != nil {
		b.Fatal(err)
	}
	f := Field{Name: "feats", Ext: "npy", Kind: KindNPY, DType: Float32, Shape: a.Shape}
	var d Decoder
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := d.Decode(&f, data, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeGunzipText inflates a 22 KiB gzipped caption into a reused buffer.
func BenchmarkDecodeGunzipText(b *testing.B) {
	text := []byte(strings.Repeat("a small caption about a photo of a dog on a beach. ", 440))
	data := gz(b, text, stdgzip.Header{Name: "x.txt"})
	f := mustField(b, "caption=txt.gz")
	var d Decoder
	var buf []byte
	var err error
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if _, buf, err = d.Decode(&f, data, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// collateInput returns 32 rows of a 110 KB raw field (a JPEG-sized image) and an int
// label, a slab that fits them, and their bytes.
func collateInput(b *testing.B) (fields []Field, keys []string, vals [][]Value, slab []byte, total int64) {
	fields = []Field{mustField(b, "img=jpg"), mustField(b, "label=cls")}
	const rows, size = 32, 110_000
	keys = make([]string, rows)
	vals = make([][]Value, rows)
	for i := range rows {
		keys[i] = fmt.Sprintf("train/%08d", i)
		vals[i] = []Value{{Data: seq(size)}, {Int: int64(i % 1000)}}
		total += size + 8 + int64(len(keys[i]))
	}
	return fields, keys, vals, make([]byte, Needed(fields, keys, vals)), total
}

// BenchmarkCollate collates 32 rows of a 110 KB raw field (a JPEG-sized image) and
// an int label into a reused slab and Batch.
func BenchmarkCollate(b *testing.B) {
	fields, keys, vals, slab, total := collateInput(b)
	var batch Batch
	b.SetBytes(total)
	b.ReportAllocs()
	for b.Loop() {
		if err := CollateInto(&batch, slab, fields, keys, vals); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCollateAlloc is BenchmarkCollate with Collate, which allocates the
// Batch's columns and shapes every time.
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
