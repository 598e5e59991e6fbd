package decode

import (
	stdgzip "compress/gzip"
	"strings"
	"testing"
)

// BenchmarkDecodeNPY decodes a real Lhotse feature matrix (float32, 2238x80, 700 KiB)
// with a fixed-shape field, again and again: the header is the one the Decoder parsed
// last (its memo), checked by comparing bytes; the data is not copied.
// BenchmarkDecodeNPYParse parses every header.
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

// BenchmarkDecodeNPYParse decodes two arrays of the same shape and size but not the
// same dtype by turns, so that every header is parsed.
func BenchmarkDecodeNPYParse(b *testing.B) {
	i4 := npyFile(1, "<i4", false, []int{2048}, make([]byte, 8192))
	f4 := npyFile(1, "<f4", false, []int{2048}, make([]byte, 8192))
	f := Field{Name: "tokens", Ext: "npy", Kind: KindNPY, Shape: []int{2048}}
	var d Decoder
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m := i4
		if i%2 == 1 {
			m = f4
		}
		if _, _, err := d.Decode(&f, m, nil); err != nil {
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
