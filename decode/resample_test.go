package decode

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestResampleVectorMatchesGo: the vector passes (AVX2, where the build and the CPU
// have them) give the Go passes' bytes for downscales and upscales of every tap
// count, crops, windows and flips.
func TestResampleVectorMatchesGo(t *testing.T) {
	if !haveAVX2 {
		t.Skip("no AVX2 passes in this build or on this CPU")
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	var vec, scalar resampler
	scalar.noVector = true
	for trial := range 400 {
		sw, sh := 1+rnd.IntN(700), 1+rnd.IntN(500)
		src := grow(nil, sw*sh*3)
		for i := range src {
			src[i] = byte(rnd.Uint32())
		}
		// A crop of the source, resized to ow x oh, of which a window is kept.
		cx, cy := rnd.IntN(sw), rnd.IntN(sh)
		cw, ch := 1+rnd.IntN(sw-cx), 1+rnd.IntN(sh-cy)
		ow, oh := 1+rnd.IntN(300), 1+rnd.IntN(300)
		wx, wy := rnd.IntN(ow), rnd.IntN(oh)
		n, m := 1+rnd.IntN(ow-wx), 1+rnd.IntN(oh-wy)
		flip := trial%2 == 1
		for _, r := range []*resampler{&vec, &scalar} {
			r.h.set(cx, cx+cw, float64(cx), float64(cx+cw), ow, wx, n)
			r.v.set(cy, cy+ch, float64(cy), float64(cy+ch), oh, wy, m)
		}
		got, want := make([]byte, n*m*3), make([]byte, n*m*3)
		vec.resize(got, src, sw*3, flip)
		scalar.resize(want, src, sw*3, flip)
		if !bytes.Equal(got, want) {
			mean, mx := meanAbsDiff(got, want)
			t.Fatalf("trial %d: %dx%d, crop %d,%d %dx%d to %dx%d, window %d,%d %dx%d, flip %v (taps %d, %d): vector passes differ (mean %.3f, max %d)",
				trial, sw, sh, cx, cy, cw, ch, ow, oh, wx, wy, n, m, flip, vec.h.k, vec.v.k, mean, mx)
		}
	}
}
