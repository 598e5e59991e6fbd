package turbojpeg

import "testing"

// BenchmarkDecodeRegion decodes parts of the 500x375 photo of BenchmarkDecode with
// DecodeRegion: its top quarter (the rows below it are only entropy-decoded, to the
// end marker), its center half, and all of it; whole is Decode of all of it, for
// comparison.
func BenchmarkDecodeRegion(b *testing.B) {
	const w, h = 500, 375
	data := encode(b, photo(w, h, 22, 10), 90)
	for _, c := range []struct {
		name string
		reg  Region
	}{
		{"top-quarter", Region{X: 125, Y: 0, W: 250, H: h / 4}},
		{"center-half", Region{X: 125, Y: h / 4, W: 250, H: h / 2}},
		{"all", Region{W: w, H: h}},
	} {
		b.Run(c.name, func(b *testing.B) {
			rg := testRegions(b)
			dst := make([]byte, w*c.reg.H*3)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rg.DecodeRegion(data, dst, w, h, 1, c.reg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("whole", func(b *testing.B) {
		l := testLib(b)
		dst := make([]byte, w*h*3)
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if err := l.Decode(data, dst, w, h, RGB, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}
