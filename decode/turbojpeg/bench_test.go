package turbojpeg

import "testing"

// BenchmarkDecode decodes a 500x375 photo-like JPEG of about 100 KB to packed RGB
// with TurboJPEG and with image/jpeg plus the YCbCr to RGB conversion.
func BenchmarkDecode(b *testing.B) {
	const w, h = 500, 375
	data := encode(b, photo(w, h, 22, 10), 90)
	b.Logf("%dx%d, %d bytes", w, h, len(data))
	b.Run("turbo", func(b *testing.B) {
		l := testLib(b)
		dst := make([]byte, w*h*3)
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			if err := l.Decode(data, dst, w, h, RGB, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("turbo-half", func(b *testing.B) {
		l := testLib(b)
		sw, sh := ScaledSize(w, h, 1, 2)
		dst := make([]byte, sw*sh*3)
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if err := l.Decode(data, dst, sw, sh, RGB, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("go", func(b *testing.B) {
		dst := make([]byte, w*h*3)
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if dst, _, _, err = goRGB(data, dst); err != nil {
				b.Fatal(err)
			}
		}
	})
}
