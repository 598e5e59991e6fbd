//go:build linux && cgo

package turbojpeg

import (
	"bytes"
	"errors"
	"testing"
)

// TestDecodeRegionSeesDamageBelow: a region's decode reads the data to its end,
// so damage below the region is reported as it is for any other region: a cut
// scan given an end marker fails it; extraneous bytes (junk before the end
// marker, or what libjpeg-turbo leaves of a scan with an invalid Huffman code) come
// back as a skippable warning beside the region's pixels, which are the whole
// image's.
func TestDecodeRegionSeesDamageBelow(t *testing.T) {
	rg := testRegions(t)
	const w, h = 320, 240
	good := encode(t, photo(w, h, 8, 12), 90)
	_, cutEOI, ones, junk := damaged(t, good)
	top := Region{X: 40, Y: 8, W: 100, H: 16} // far above the damage
	want := make([]byte, w*top.H*3)
	wantReg, err := rg.DecodeRegion(good, want, w, h, 1, top)
	if err != nil {
		t.Fatal(err)
	}
	strips := newStripCollector(w * top.H * 3)
	defer strips.free()
	fn, ctx := strips.fn()
	for _, den := range []int{1, 2} {
		sw, sh := ScaledSize(w, h, 1, den)
		reg := Region{X: top.X / den, Y: top.Y / den, W: top.W / den, H: top.H / den}
		dst := make([]byte, sw*reg.H*3)
		_, err := rg.DecodeRegion(cutEOI, dst, sw, sh, den, reg)
		var te *Error
		if !errors.As(err, &te) || !te.Warning || te.Skippable() || te.Msg != "Corrupt JPEG data: premature end of data segment" {
			t.Errorf("1/%d: cut with an end marker: got %v, want the warning of a premature end of data segment", den, err)
		}
		_, err = rg.DecodeRegionStrips(cutEOI, dst, sw, sh, den, reg, 4, fn, ctx)
		if !errors.As(err, &te) || !te.Warning || te.Skippable() {
			t.Errorf("1/%d: cut with an end marker, by strips: got %v, want a warning that is not skippable", den, err)
		}
		for name, data := range map[string][]byte{"ones in the scan": ones, "junk before the end marker": junk} {
			_, err := rg.DecodeRegion(data, dst, sw, sh, den, reg)
			if !errors.As(err, &te) || !te.Extraneous() {
				t.Errorf("1/%d: %s: got %v, want an extraneous bytes warning", den, name, err)
			}
		}
	}
	got := make([]byte, w*top.H*3)
	gotReg, err := rg.DecodeRegion(junk, got, w, h, 1, top)
	var te *Error
	if !errors.As(err, &te) || !te.Extraneous() || gotReg != wantReg {
		t.Fatalf("junk before the end marker: region %+v, %v; want %+v and an extraneous bytes warning", gotReg, err, wantReg)
	}
	if !bytes.Equal(got, want) {
		t.Error("junk before the end marker: the region's pixels differ from the clean JPEG's")
	}
}
