package turbojpeg

import (
	"bytes"
	"errors"
	"image"
	"image/color"
	"image/jpeg"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
)

// testLib returns the default library, or skips the test where it cannot be loaded.
// CI installs libturbojpeg0, so there a library that will not load fails the test.
func testLib(t testing.TB) *Lib {
	t.Helper()
	l, err := Default()
	if err == nil {
		return l
	}
	if !cgoBuild {
		t.Skipf("built without cgo, libjpeg-turbo cannot be loaded: %v", err)
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI installs libturbojpeg0 (scripts/deps.sh), yet: %v", err)
	}
	t.Skipf("libjpeg-turbo not loadable here: %v", err)
	return nil
}

// photo draws a photo-like w x h image: smooth gradients and blobs with noise of the
// given amplitude on top, the same for the same seed.
func photo(w, h int, noise float64, seed uint64) *image.RGBA {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	clamp := func(v float64) uint8 { return uint8(math.Max(0, math.Min(255, math.Round(v)))) }
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			fx, fy := float64(x)/float64(w), float64(y)/float64(h)
			blob := 60 * math.Sin(fx*7+fy*3) * math.Cos(fy*5-fx*2)
			r := 40 + 170*fx + blob + rng.NormFloat64()*noise
			g := 200 - 150*fy + 0.6*blob + rng.NormFloat64()*noise
			b := 90 + 80*math.Sin((fx+fy)*4) - 0.5*blob + rng.NormFloat64()*noise
			i := img.PixOffset(x, y)
			img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = clamp(r), clamp(g), clamp(b), 255
		}
	}
	return img
}

func encode(t testing.TB, img image.Image, quality int) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: quality}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// goRGB decodes data with image/jpeg and converts it to packed RGB into dst (grown
// as needed), the way a pure Go decoder would hand pixels on.
func goRGB(data, dst []byte) ([]byte, int, int, error) {
	img, err := jpeg.Decode(bytes.NewReader(data))
	if err != nil {
		return nil, 0, 0, err
	}
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	if cap(dst) < w*h*3 {
		dst = make([]byte, w*h*3)
	}
	dst = dst[:w*h*3]
	switch m := img.(type) {
	case *image.YCbCr:
		for y := 0; y < h; y++ {
			row := dst[y*w*3 : (y+1)*w*3]
			yi := m.YOffset(b.Min.X, b.Min.Y+y)
			for x := 0; x < w; x++ {
				ci := m.COffset(b.Min.X+x, b.Min.Y+y)
				r, g, bb := color.YCbCrToRGB(m.Y[yi+x], m.Cb[ci], m.Cr[ci])
				row[3*x], row[3*x+1], row[3*x+2] = r, g, bb
			}
		}
	default:
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				c := color.RGBAModel.Convert(img.At(b.Min.X+x, b.Min.Y+y)).(color.RGBA)
				i := 3 * (y*w + x)
				dst[i], dst[i+1], dst[i+2] = c.R, c.G, c.B
			}
		}
	}
	return dst, w, h, nil
}

// meanAbsDiff is the mean absolute difference of two equal-length byte slices.
func meanAbsDiff(a, b []byte) float64 {
	var sum int64
	for i := range a {
		d := int64(a[i]) - int64(b[i])
		if d < 0 {
			d = -d
		}
		sum += d
	}
	return float64(sum) / float64(len(a))
}

// boxDown averages k x k blocks of a packed w x h image with ch channels; blocks on
// the right and bottom edges average the pixels they have, so the result is
// ceil(w/k) x ceil(h/k) like TurboJPEG's scaled sizes.
func boxDown(src []byte, w, h, ch, k int) []byte {
	ow, oh := (w+k-1)/k, (h+k-1)/k
	out := make([]byte, ow*oh*ch)
	for oy := 0; oy < oh; oy++ {
		for ox := 0; ox < ow; ox++ {
			for c := 0; c < ch; c++ {
				sum, n := 0, 0
				for y := oy * k; y < min(h, oy*k+k); y++ {
					for x := ox * k; x < min(w, ox*k+k); x++ {
						sum += int(src[(y*w+x)*ch+c])
						n++
					}
				}
				out[(oy*ow+ox)*ch+c] = uint8((sum + n/2) / n)
			}
		}
	}
	return out
}

func TestOpenMissing(t *testing.T) {
	const path = "/nonexistent/libturbojpeg.so"
	l, err := Open(path)
	if err == nil {
		t.Fatalf("Open(%q) loaded %s", path, l.Path())
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("error does not wrap ErrUnavailable: %v", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error does not name %s: %v", path, err)
	}
}

func TestOpenNotTurboJPEG(t *testing.T) {
	testLib(t)
	// libc loads but has none of TurboJPEG's functions.
	_, err := Open("libc.so.6")
	if err == nil || !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "tjInitDecompress") {
		t.Fatalf("Open(libc.so.6): want ErrUnavailable naming tjInitDecompress, got %v", err)
	}
}

func TestDefaultRemembered(t *testing.T) {
	l := testLib(t)
	l2, err := Default()
	if err != nil || l2 != l {
		t.Fatalf("second Default() = %p, %v; first gave %p", l2, err, l)
	}
	if l.Path() == "" {
		t.Error("Path() is empty")
	}
	t.Logf("loaded %s", l.Path())
}

func TestFactors(t *testing.T) {
	l := testLib(t)
	fs := l.Factors()
	if len(fs) == 0 || fs[0] != [2]int{1, 1} {
		t.Fatalf("Factors() = %v, want 1/1 first", fs)
	}
	for i, f := range fs {
		if f[0] <= 0 || f[0] > f[1] {
			t.Errorf("factor %d/%d is not in (0, 1]", f[0], f[1])
		}
		if i > 0 && f[0]*fs[i-1][1] >= fs[i-1][0]*f[1] {
			t.Errorf("factors not largest first: %v", fs)
		}
	}
	for _, want := range [][2]int{{1, 2}, {1, 4}, {1, 8}} {
		found := false
		for _, f := range fs {
			found = found || f == want
		}
		if !found {
			t.Errorf("Factors() = %v lacks %d/%d", fs, want[0], want[1])
		}
	}
	fs[0] = [2]int{9, 9}
	if l.Factors()[0] != [2]int{1, 1} {
		t.Error("Factors() returned the Lib's own slice")
	}
}

func TestScaledSize(t *testing.T) {
	for _, c := range []struct{ w, h, num, den, ww, wh int }{
		{640, 480, 1, 1, 640, 480},
		{640, 480, 1, 8, 80, 60},
		{333, 251, 1, 2, 167, 126},
		{333, 251, 3, 8, 125, 95},
		{1, 1, 1, 8, 1, 1},
	} {
		if w, h := ScaledSize(c.w, c.h, c.num, c.den); w != c.ww || h != c.wh {
			t.Errorf("ScaledSize(%d, %d, %d, %d) = %d, %d, want %d, %d", c.w, c.h, c.num, c.den, w, h, c.ww, c.wh)
		}
	}
}

func TestHeader(t *testing.T) {
	l := testLib(t)
	data := encode(t, photo(333, 251, 8, 1), 90)
	h, err := l.Header(data)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Header{Width: 333, Height: 251, Subsamp: Samp420, Colorspace: CSYCbCr}); h != want {
		t.Errorf("Header = %+v, want %+v", h, want)
	}
	gray := image.NewGray(image.Rect(0, 0, 40, 30))
	h, err = l.Header(encode(t, gray, 90))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Header{Width: 40, Height: 30, Subsamp: SampGray, Colorspace: CSGray}); h != want {
		t.Errorf("gray Header = %+v, want %+v", h, want)
	}
}

func TestDecodeFullMatchesImageJPEG(t *testing.T) {
	l := testLib(t)
	const w, h = 640, 480
	data := encode(t, photo(w, h, 8, 2), 90)
	want, gw, gh, err := goRGB(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if gw != w || gh != h {
		t.Fatalf("image/jpeg decoded %dx%d", gw, gh)
	}
	got := make([]byte, w*h*3)
	if err := l.Decode(data, got, w, h, RGB, 0); err != nil {
		t.Fatal(err)
	}
	d := meanAbsDiff(got, want)
	t.Logf("%dx%d, %d bytes: mean |turbo - image/jpeg| = %.3f levels", w, h, len(data), d)
	// Measured 0.39 with libjpeg-turbo 2.1.5 (it interpolates chroma, image/jpeg
	// replicates it; 0.99 with the fast flags); a wrong channel order or row pitch
	// gives tens of levels.
	if d > 2.0 {
		t.Errorf("mean absolute difference %.3f > 2.0", d)
	}
	fast := make([]byte, w*h*3)
	if err := l.Decode(data, fast, w, h, RGB, FastUpsample|FastDCT); err != nil {
		t.Fatal(err)
	}
	df := meanAbsDiff(fast, want)
	t.Logf("with FastUpsample|FastDCT: %.3f levels", df)
	if bytes.Equal(fast, got) {
		t.Error("FastUpsample|FastDCT changed nothing")
	}
	if df > 2.0 {
		t.Errorf("fast mean absolute difference %.3f > 2.0", df)
	}
}

func TestDecodeScaled(t *testing.T) {
	l := testLib(t)
	for _, size := range [][2]int{{640, 480}, {333, 251}} {
		w, h := size[0], size[1]
		data := encode(t, photo(w, h, 8, 3), 90)
		full := make([]byte, w*h*3)
		if err := l.Decode(data, full, w, h, RGB, 0); err != nil {
			t.Fatal(err)
		}
		for _, k := range []int{2, 4, 8} {
			sw, sh := ScaledSize(w, h, 1, k)
			// One spare byte at the end, which Decode must not touch.
			got := make([]byte, sw*sh*3+1)
			got[len(got)-1] = 0xA5
			if err := l.Decode(data, got, sw, sh, RGB, 0); err != nil {
				t.Fatalf("%dx%d at 1/%d: %v", w, h, k, err)
			}
			if got[len(got)-1] != 0xA5 {
				t.Errorf("%dx%d at 1/%d wrote past width*height*3", w, h, k)
			}
			d := meanAbsDiff(got[:sw*sh*3], boxDown(full, w, h, 3, k))
			t.Logf("%dx%d at 1/%d -> %dx%d: mean |scaled - box(full)| = %.3f levels", w, h, k, sw, sh, d)
			// Measured 0.37 to 0.52 (2.1.5); a wrong size or layout gives tens.
			if d > 2.0 {
				t.Errorf("%dx%d at 1/%d: mean absolute difference %.3f > 2.0", w, h, k, d)
			}
			// A size that no factor gives is refused, not decoded smaller.
			if err := l.Decode(data, make([]byte, (sw+1)*sh*3), sw+1, sh, RGB, 0); err == nil {
				t.Errorf("%dx%d: Decode at %dx%d, no scaled size, succeeded", w, h, sw+1, sh)
			}
		}
	}
}

func TestDecodeGray(t *testing.T) {
	l := testLib(t)
	const w, h = 320, 240
	data := encode(t, photo(w, h, 8, 4), 90)
	rgb := make([]byte, w*h*3)
	if err := l.Decode(data, rgb, w, h, RGB, 0); err != nil {
		t.Fatal(err)
	}
	gray := make([]byte, w*h+1)
	gray[w*h] = 0x5A
	if err := l.Decode(data, gray, w, h, Gray, 0); err != nil {
		t.Fatal(err)
	}
	if gray[w*h] != 0x5A {
		t.Error("Gray decode wrote past width*height")
	}
	// Gray output is the Y channel; compare with the luma of the RGB decode.
	luma := make([]byte, w*h)
	for i := range luma {
		r, g, b := float64(rgb[3*i]), float64(rgb[3*i+1]), float64(rgb[3*i+2])
		luma[i] = uint8(math.Round(0.299*r + 0.587*g + 0.114*b))
	}
	d := meanAbsDiff(gray[:w*h], luma)
	t.Logf("mean |gray - luma(rgb)| = %.3f levels", d)
	// Measured 0.03 (2.1.5): rounding only.
	if d > 0.5 {
		t.Errorf("gray output differs from the RGB decode's luma by %.3f levels", d)
	}
	sw, sh := ScaledSize(w, h, 1, 4)
	if err := l.Decode(data, make([]byte, sw*sh), sw, sh, Gray, 0); err != nil {
		t.Errorf("gray at 1/4: %v", err)
	}
}

// scanMiddle returns an offset in the middle of data's entropy-coded scan.
func scanMiddle(t *testing.T, data []byte) int {
	sos := bytes.Index(data, []byte{0xFF, 0xDA})
	if sos < 0 {
		t.Fatal("no SOS marker")
	}
	return sos + (len(data)-sos)/2
}

func TestDecodeTruncated(t *testing.T) {
	l := testLib(t)
	const w, h = 320, 240
	data := encode(t, photo(w, h, 8, 5), 90)
	full := make([]byte, w*h*3)
	if err := l.Decode(data, full, w, h, RGB, 0); err != nil {
		t.Fatal(err)
	}
	cut := data[:scanMiddle(t, data)]
	got := make([]byte, w*h*3)
	err := l.Decode(cut, got, w, h, RGB, 0)
	var te *Error
	if !errors.As(err, &te) || !te.Warning {
		t.Fatalf("truncated JPEG: want an *Error with Warning set, got %v", err)
	}
	t.Logf("truncated at %d of %d bytes: %v", len(cut), len(data), err)
	if !strings.Contains(te.Msg, "Premature end of JPEG file") {
		t.Errorf("warning %q does not say the file ended early", te.Msg)
	}
	// The rows before the cut are decoded: the top quarter matches the full decode.
	top := w * 3 * (h / 4)
	if d := meanAbsDiff(got[:top], full[:top]); d > 0.01 {
		t.Errorf("top rows of the truncated decode differ from the full one by %.3f levels", d)
	}
	if bytes.Equal(got, full) {
		t.Error("truncated decode equals the full one")
	}
	// StopOnWarning turns the warning into an early stop, still reported as one.
	err = l.Decode(cut, got, w, h, RGB, StopOnWarning)
	if !errors.As(err, &te) {
		t.Fatalf("truncated JPEG with StopOnWarning: want an *Error, got %v", err)
	}
	t.Logf("with StopOnWarning: %v (warning %v)", err, te.Warning)
	// The header is whole, so Header reads it without complaint.
	if hdr, err := l.Header(cut); err != nil || hdr.Width != w || hdr.Height != h {
		t.Errorf("Header(truncated) = %+v, %v", hdr, err)
	}
}

func TestDecodeBadInput(t *testing.T) {
	l := testLib(t)
	garbage := make([]byte, 4096)
	rng := rand.New(rand.NewPCG(6, 7))
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}
	dst := make([]byte, 64*64*3)
	err := l.Decode(garbage, dst, 64, 64, RGB, 0)
	var te *Error
	if !errors.As(err, &te) || te.Warning {
		t.Fatalf("garbage: want an *Error that is not a warning, got %v", err)
	}
	t.Logf("garbage: %v", err)
	if _, err := l.Header(garbage); !errors.As(err, &te) || te.Warning {
		t.Errorf("Header(garbage): want an *Error that is not a warning, got %v", err)
	}
	// Cut inside the headers, before the frame header: TurboJPEG takes that for a
	// tables-only datastream and gives no size; Header and Decode must not.
	data := encode(t, photo(64, 64, 8, 8), 90)
	sof := bytes.Index(data, []byte{0xFF, 0xC0})
	if sof < 0 {
		t.Fatal("no SOF0 marker")
	}
	cut := data[:sof]
	for name, err := range map[string]error{
		"Decode": l.Decode(cut, dst, 64, 64, RGB, 0),
		"Header": func() error { _, err := l.Header(cut); return err }(),
	} {
		if err == nil || errors.As(err, &te) && te.Warning {
			t.Errorf("%s of a JPEG cut before its frame header: want a failure, got %v", name, err)
		} else {
			t.Logf("%s of a JPEG cut before its frame header: %v", name, err)
		}
	}
	// The pool's instances are reusable after failures.
	if err := l.Decode(data, dst, 64, 64, RGB, 0); err != nil {
		t.Errorf("decode after failures: %v", err)
	}
}

func TestDecodeArgs(t *testing.T) {
	// These fail before any C is called, so they need no library; a Lib with
	// nothing loaded shows that nothing reaches it.
	l := &Lib{}
	data := []byte{0xFF, 0xD8}
	for _, c := range []struct {
		name       string
		jpeg, dst  []byte
		w, h       int
		format     PixelFormat
		wantSubstr string
	}{
		{"empty", nil, make([]byte, 12), 2, 2, RGB, "empty"},
		{"small dst", data, make([]byte, 11), 2, 2, RGB, "needs 12"},
		{"small gray dst", data, make([]byte, 3), 2, 2, Gray, "needs 4"},
		{"zero width", data, make([]byte, 12), 0, 2, RGB, "size"},
		{"huge", data, make([]byte, 12), 70000, 1, RGB, "size"},
		{"format", data, make([]byte, 12), 2, 2, PixelFormat(11), "format"},
	} {
		err := l.Decode(c.jpeg, c.dst, c.w, c.h, c.format, 0)
		if err == nil || !strings.Contains(err.Error(), c.wantSubstr) {
			t.Errorf("%s: want an error containing %q, got %v", c.name, c.wantSubstr, err)
		}
	}
	if _, err := l.Header(nil); err == nil {
		t.Error("Header(nil) succeeded")
	}
}

func TestDecodeYCCK(t *testing.T) {
	l := testLib(t)
	// testdata/ycck.jpg: 32x24, written by TurboJPEG from CMYK pixels (Adobe
	// transform 2, YCCK).
	data, err := os.ReadFile("testdata/ycck.jpg")
	if err != nil {
		t.Fatal(err)
	}
	if img, err := jpeg.Decode(bytes.NewReader(data)); err != nil {
		t.Fatalf("image/jpeg: %v", err)
	} else if _, ok := img.(*image.CMYK); !ok {
		t.Fatalf("image/jpeg decodes it as %T, not CMYK", img)
	}
	h, err := l.Header(data)
	if err != nil {
		t.Fatal(err)
	}
	if h.Width != 32 || h.Height != 24 || h.Colorspace != CSYCCK {
		t.Errorf("Header = %+v, want 32x24 YCCK (%d)", h, CSYCCK)
	}
	for _, f := range []PixelFormat{RGB, Gray} {
		err := l.Decode(data, make([]byte, 32*24*3), 32, 24, f, 0)
		var te *Error
		if !errors.As(err, &te) || te.Warning {
			t.Errorf("YCCK to format %d: want a fatal *Error, got %v", f, err)
		} else {
			t.Logf("YCCK to format %d: %v", f, err)
		}
	}
}

func TestDecodeConcurrent(t *testing.T) {
	l := testLib(t)
	const w, h = 500, 375
	data := encode(t, photo(w, h, 8, 9), 90)
	want := make([]byte, w*h*3)
	if err := l.Decode(data, want, w, h, RGB, 0); err != nil {
		t.Fatal(err)
	}
	const workers, rounds = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := make([]byte, w*h*3)
			for range rounds {
				clear(got)
				if err := l.Decode(data, got, w, h, RGB, 0); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, want) {
					errs <- errors.New("a concurrent decode differs from the single one")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestFailedCallNotReused: an instance whose call failed in the middle of a
// datastream (headers cut short) fails every later call in TurboJPEG 2.x ("Bogus
// DQT index"), so it must not go back to the pool: the next call on one goroutine,
// which would take it again, succeeds.
func TestFailedCallNotReused(t *testing.T) {
	l := testLib(t)
	data := encode(t, photo(64, 48, 4, 1), 90)
	dst := make([]byte, 64*48*3)
	for _, bad := range [][]byte{data[:20], data[:200], []byte("\xff\xd8\xff\xdb garbage")} {
		l.Header(bad)
		if hd, err := l.Header(data); err != nil || hd.Width != 64 {
			t.Fatalf("Header after a failed Header of %d bytes: %+v, %v", len(bad), hd, err)
		}
		l.Decode(bad, dst, 64, 48, RGB, 0)
		if err := l.Decode(data, dst, 64, 48, RGB, 0); err != nil {
			t.Fatalf("Decode after a failed Decode of %d bytes: %v", len(bad), err)
		}
	}
}
