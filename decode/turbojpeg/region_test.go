package turbojpeg

import (
	"errors"
	"image"
	"math/rand/v2"
	"os"
	"testing"
)

// testRegions returns the default libjpeg library, or skips the test where it cannot
// be loaded. CI installs libjpeg62-turbo (with PIL), so there it must load.
func testRegions(t testing.TB) *Regions {
	t.Helper()
	r, err := DefaultRegions()
	if err == nil {
		return r
	}
	if !cgoBuild {
		t.Skipf("built without cgo, libjpeg cannot be loaded: %v", err)
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI installs libjpeg62-turbo (scripts/deps.sh, with python3-pil), yet: %v", err)
	}
	t.Skipf("libjpeg not loadable here: %v", err)
	return nil
}

// TestDecodeRegionMatchesDecode: a region's pixels are the full decode's, at every
// scale, for colour (4:2:0) and grayscale JPEGs, save for the decoded columns' first
// and last where they are not the image's edges.
func TestDecodeRegionMatchesDecode(t *testing.T) {
	l := testLib(t)
	rg := testRegions(t)
	rnd := rand.New(rand.NewPCG(5, 6))
	type img struct {
		data []byte
		w, h int
	}
	var imgs []img
	for i, sz := range [][2]int{{500, 375}, {375, 500}, {333, 251}, {37, 29}, {1, 1}, {1600, 1200}} {
		data := encode(t, photo(sz[0], sz[1], 8, uint64(i)), 90)
		imgs = append(imgs, img{data, sz[0], sz[1]})
	}
	gray := image.NewGray(image.Rect(0, 0, 301, 203))
	for i := range gray.Pix {
		gray.Pix[i] = uint8(i*7 + i/301)
	}
	imgs = append(imgs, img{encode(t, gray, 85), 301, 203})
	// testdata: 203x151 photo-like pictures written by PIL (Image.save, quality 90)
	// with 4:4:4 and 4:2:2 chroma, and progressive 4:2:0.
	for _, name := range []string{"s444.jpg", "s422.jpg", "prog420.jpg"} {
		data, err := os.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img{data, 203, 151})
	}
	for _, im := range imgs {
		for _, den := range []int{1, 2, 4, 8} {
			w, h := ScaledSize(im.w, im.h, 1, den)
			full := make([]byte, w*h*3)
			if err := l.Decode(im.data, full, w, h, RGB, 0); err != nil {
				t.Fatal(err)
			}
			dst := make([]byte, w*h*3)
			for trial := range 40 {
				var r Region
				r.X, r.Y = rnd.IntN(w), rnd.IntN(h)
				r.W, r.H = 1+rnd.IntN(w-r.X), 1+rnd.IntN(h-r.Y)
				if trial == 0 {
					r = Region{0, 0, w, h}
				}
				got, err := rg.DecodeRegion(im.data, dst, w, h, den, r)
				if err != nil {
					t.Fatalf("%dx%d 1/%d %+v: %v", im.w, im.h, den, r, err)
				}
				if got.Y != r.Y || got.H != r.H || got.X > r.X || got.X+got.W != r.X+r.W {
					t.Fatalf("%dx%d 1/%d %+v: decoded %+v", im.w, im.h, den, r, got)
				}
				for y := range got.H {
					for x := range got.W {
						ax := got.X + x
						if ax == got.X && ax > 0 || ax == got.X+got.W-1 && ax < w-1 {
							continue
						}
						a := dst[(y*got.W+x)*3 : (y*got.W+x)*3+3]
						b := full[((got.Y+y)*w+ax)*3 : ((got.Y+y)*w+ax)*3+3]
						if a[0] != b[0] || a[1] != b[1] || a[2] != b[2] {
							t.Fatalf("%dx%d 1/%d %+v (decoded %+v): pixel %d,%d is %v, the full decode's %v",
								im.w, im.h, den, r, got, ax, got.Y+y, a, b)
						}
					}
				}
			}
		}
	}
}

func TestDecodeRegionErrors(t *testing.T) {
	rg := testRegions(t)
	data := encode(t, photo(64, 48, 4, 1), 90)
	dst := make([]byte, 64*48*3)
	var err error
	for _, c := range []struct {
		w, h, den int
		r         Region
	}{
		{64, 48, 3, Region{0, 0, 64, 48}},
		{64, 48, 1, Region{0, 0, 65, 48}},
		{64, 48, 1, Region{-1, 0, 10, 10}},
		{64, 48, 1, Region{0, 0, 0, 10}},
		{32, 24, 1, Region{0, 0, 32, 24}}, // not the image's size at 1/1
	} {
		if _, err := rg.DecodeRegion(data, dst, c.w, c.h, c.den, c.r); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if _, err := rg.DecodeRegion(data, dst[:10], 64, 48, 1, Region{0, 0, 64, 48}); err == nil {
		t.Error("a short destination: no error")
	}
	// Truncated: a warning, which ends the decode.
	_, err = rg.DecodeRegion(data[:len(data)/2], dst, 64, 48, 1, Region{0, 0, 64, 48})
	var te *Error
	if !errors.As(err, &te) || !te.Warning {
		t.Errorf("truncated: %v, want a warning", err)
	}
	// A YCCK JPEG cannot be decoded to RGB: an error.
	ycck, err := os.ReadFile("testdata/ycck.jpg")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rg.DecodeRegion(ycck, dst, 32, 24, 1, Region{0, 0, 32, 24}); !errors.As(err, &te) || te.Warning {
		t.Errorf("YCCK: %v, want an error", err)
	}
	// Not a JPEG: an error.
	if _, err := rg.DecodeRegion([]byte("not a jpeg at all"), dst, 64, 48, 1, Region{0, 0, 64, 48}); !errors.As(err, &te) || te.Warning {
		t.Errorf("garbage: %v, want an error", err)
	}
}
