package decode

import (
	stdgzip "compress/gzip"
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
