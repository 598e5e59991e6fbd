//go:build linux && cgo

package turbojpeg

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestDecodeRegionStrips: a region decoded a strip at a time hands over, strip by
// strip and in order, the rows DecodeRegion decodes, for strips of one row, of a
// few, and taller than the region.
func TestDecodeRegionStrips(t *testing.T) {
	rg := testRegions(t)
	rnd := rand.New(rand.NewPCG(7, 8))
	data := encode(t, photo(500, 375, 8, 3), 90)
	for _, den := range []int{1, 2} {
		w, h := ScaledSize(500, 375, 1, den)
		want := make([]byte, w*h*3)
		for trial := range 30 {
			r := Region{X: rnd.IntN(w), Y: rnd.IntN(h)}
			r.W, r.H = 1+rnd.IntN(w-r.X), 1+rnd.IntN(h-r.Y)
			strip := []int{1, 3, 16, 1000}[trial%4]
			wantReg, err := rg.DecodeRegion(data, want, w, h, den, r)
			if err != nil {
				t.Fatal(err)
			}
			c := newStripCollector(w * h * 3)
			fn, ctx := c.fn()
			got, err := rg.DecodeRegionStrips(data, make([]byte, w*min(strip, r.H)*3), w, h, den, r, strip, fn, ctx)
			rows, calls, x, bad := c.result()
			c.free()
			if err != nil {
				t.Fatalf("1/%d %+v, strips of %d: %v", den, r, strip, err)
			}
			if got != wantReg || x != got.X {
				t.Fatalf("1/%d %+v, strips of %d: decoded %+v from column %d, DecodeRegion %+v", den, r, strip, got, x, wantReg)
			}
			if wantCalls := (r.H + strip - 1) / strip; calls != wantCalls || bad != 0 {
				t.Fatalf("1/%d %+v, strips of %d: %d calls (%d out of order), want %d", den, r, strip, calls, bad, wantCalls)
			}
			n := got.W * got.H * 3
			if !bytes.Equal(rows[:n], want[:n]) {
				t.Fatalf("1/%d %+v, strips of %d: the strips' rows differ from DecodeRegion's", den, r, strip)
			}
		}
	}
	// The destination must hold a strip; a strip function is needed.
	if _, err := rg.DecodeRegionStrips(data, make([]byte, 500*3), 500, 375, 1, Region{0, 0, 500, 375}, 2, nil, nil); err == nil {
		t.Error("no function: no error")
	}
	c := newStripCollector(500 * 375 * 3)
	defer c.free()
	fn, ctx := c.fn()
	if _, err := rg.DecodeRegionStrips(data, make([]byte, 500*3), 500, 375, 1, Region{0, 0, 500, 375}, 2, fn, ctx); err == nil {
		t.Error("a destination of one row for strips of two: no error")
	}
}
