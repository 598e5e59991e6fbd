package decode

import (
	"bytes"
	"errors"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/shardload/shardload/decode/turbojpeg"
)

func TestParseImageField(t *testing.T) {
	cases := []struct {
		spec  string
		shape []int
		dtype DType
		opts  ImageOptions
		str   string
	}{
		{"img=jpg:image", []int{224, 224, 3}, Uint8, ImageOptions{}, "img=jpg:image:uint8:224x224x3"},
		{"img=jpg:image:uint8:3x160x128", []int{3, 160, 128}, Uint8, ImageOptions{}, "img=jpg:image:uint8:3x160x128"},
		{"png:image:float16:64x64x1:resize=80", []int{64, 64, 1}, Float16, ImageOptions{Resize: 80}, "png:image:float16:64x64x1:resize=80"},
		{"x=webp:image:float32:3x224x224:random-crop,scale=0.25-1,ratio=0.5-2,flip,imagenet,full-decode", []int{3, 224, 224}, Float32,
			ImageOptions{RandomCrop: true, Scale: [2]float64{0.25, 1}, Ratio: [2]float64{0.5, 2}, Flip: true, Mean: ImageNetMean, Std: ImageNetStd, FullDecode: true},
			"x=webp:image:float32:3x224x224:random-crop,scale=0.25-1,ratio=0.5-2,flip,imagenet,full-decode"},
		{"x=jpg:image:float32:8x8x3:mean=0.5,std=0.25/0.5/1", []int{8, 8, 3}, Float32,
			ImageOptions{Mean: [3]float64{0.5, 0.5, 0.5}, Std: [3]float64{0.25, 0.5, 1}}, "x=jpg:image:float32:8x8x3:mean=0.5/0.5/0.5,std=0.25/0.5/1"},
	}
	for _, c := range cases {
		f, err := ParseField(c.spec)
		if err != nil {
			t.Fatalf("ParseField(%q): %v", c.spec, err)
		}
		if f.Kind != KindImage || !slices.Equal(f.Shape, c.shape) || f.DType != c.dtype || f.Image != c.opts {
			t.Errorf("ParseField(%q) = %+v", c.spec, f)
		}
		if got := f.String(); got != c.str {
			t.Errorf("String() = %q, want %q", got, c.str)
		}
		g, err := ParseField(f.String())
		if err != nil || g.String() != f.String() || g.Image != f.Image {
			t.Errorf("round trip of %q: %+v, %v", f.String(), g, err)
		}
		if want := int64(c.shape[0] * c.shape[1] * c.shape[2] * c.dtype.Size()); f.RowBytes() != want {
			t.Errorf("%q: RowBytes %d, want %d", c.spec, f.RowBytes(), want)
		}
	}
	// A plain jpg stays raw bytes.
	if f, _ := ParseField("jpg"); f.Kind != KindRaw || f.RowBytes() != -1 {
		t.Errorf("jpg: %+v", f)
	}
}

func TestCenterGeometry(t *testing.T) {
	// torchvision: Resize(256) gives the short side 256 and the long one
	// int(256 * long / short); CenterCrop(224) starts at int(round((size-224)/2.0)).
	cases := []struct {
		iw, ih, resize int
		want           region
	}{
		{500, 375, 0, region{W: 500, H: 375, OW: 298, OH: 224, WX: 37, WY: 0}},    // 298.67 -> 298; (298-224)/2 = 37
		{375, 500, 256, region{W: 375, H: 500, OW: 256, OH: 341, WX: 16, WY: 58}}, // 341.33; 58.5 rounds to even 58
		{333, 251, 0, region{W: 333, H: 251, OW: 297, OH: 224, WX: 36, WY: 0}},    // 297.18; 36.5 -> 36
		{224, 224, 0, region{W: 224, H: 224, OW: 224, OH: 224}},
		{100, 50, 0, region{W: 100, H: 50, OW: 448, OH: 224, WX: 112}}, // upscale
	}
	for _, c := range cases {
		o := ImageOptions{Resize: c.resize}
		if got := o.geometry(c.iw, c.ih, 224, 224, nil); got != c.want {
			t.Errorf("%dx%d resize %d: %+v, want %+v", c.iw, c.ih, c.resize, got, c.want)
		}
	}
}

func TestRandomCropGeometry(t *testing.T) {
	o := ImageOptions{RandomCrop: true}
	var areas []float64
	seen := map[[4]int]bool{}
	for i := range 20000 {
		iw, ih := 200+i%300, 150+i%257
		r := rng{SampleSeed(7, 1, strconv.Itoa(i))}
		x, y, w, h := o.randomCrop(iw, ih, &r)
		if x < 0 || y < 0 || w <= 0 || h <= 0 || x+w > iw || y+h > ih {
			t.Fatalf("%dx%d: crop %d,%d %dx%d outside", iw, ih, x, y, w, h)
		}
		a := float64(w*h) / float64(iw*ih)
		ratio := float64(w) / float64(h)
		// Rounding w and h to whole pixels moves the area and ratio a little.
		if a > 1.0001 || a < 0.07 || ratio < 0.7 || ratio > 1.42 {
			t.Fatalf("%dx%d: crop %dx%d: area fraction %.3f, ratio %.3f", iw, ih, w, h, a, ratio)
		}
		areas = append(areas, a)
		seen[[4]int{x, y, w, h}] = true
	}
	slices.Sort(areas)
	// torchvision's RandomResizedCrop.get_params over the same image sizes, 20,000
	// draws: deciles 0.138, 0.377, 0.710 (its draws that do not fit are drawn again,
	// which leaves fewer large crops than the uniform target area).
	for _, q := range []struct{ at, want float64 }{{0.1, 0.138}, {0.5, 0.377}, {0.9, 0.710}} {
		if got := areas[int(q.at*float64(len(areas)))]; math.Abs(got-q.want) > 0.02 {
			t.Errorf("area fraction quantile %.1f: %.3f, torchvision's %.3f", q.at, got, q.want)
		}
	}
	if len(seen) < 19000 {
		t.Errorf("only %d distinct crops in 20000", len(seen))
	}
	// The same seed, the same crop.
	r1, r2 := rng{SampleSeed(1, 2, "a")}, rng{SampleSeed(1, 2, "a")}
	a1, b1, c1, d1 := o.randomCrop(640, 480, &r1)
	a2, b2, c2, d2 := o.randomCrop(640, 480, &r2)
	if [4]int{a1, b1, c1, d1} != [4]int{a2, b2, c2, d2} {
		t.Error("the same seed gave two crops")
	}
	// A ratio no crop can meet falls back to the center crop of the largest region
	// within it.
	narrow := ImageOptions{RandomCrop: true, Ratio: [2]float64{4, 5}, Scale: [2]float64{0.9, 1}}
	r := rng{1}
	if x, y, w, h := narrow.randomCrop(100, 100, &r); w != 100 || h != 25 || x != 0 || y != 37 {
		t.Errorf("fallback crop %d,%d %dx%d, want 0,37 100x25", x, y, w, h)
	}
}

func TestSampleSeed(t *testing.T) {
	base := SampleSeed(1, 0, "a")
	for _, other := range []uint64{SampleSeed(2, 0, "a"), SampleSeed(1, 1, "a"), SampleSeed(1, 0, "b")} {
		if other == base {
			t.Error("seed, epoch and key do not all change the sample's seed")
		}
	}
	if SampleSeed(1, 0, "a") != base {
		t.Error("SampleSeed is not a function of its arguments")
	}
}

func TestFloat16(t *testing.T) {
	// Against a decoder of the half-precision result: the nearest half, ties to
	// even.
	half := func(h uint16) float64 {
		e, m := int(h>>10&0x1f), float64(h&0x3ff)
		v := 0.0
		switch e {
		case 0:
			v = m * math.Pow(2, -24)
		case 31:
			v = math.Inf(1)
		default:
			v = (1 + m/1024) * math.Pow(2, float64(e-15))
		}
		if h&0x8000 != 0 {
			v = -v
		}
		return v
	}
	cases := map[float32]uint16{0: 0, 1: 0x3c00, -2: 0xc000, 65504: 0x7bff, 65520: 0x7c00, 1e-8: 0, 5.960464477539063e-08: 1, 0.1: 0x2e66, 1.0 / 3: 0x3555}
	for f, want := range cases {
		if got := float16bits(f); got != want {
			t.Errorf("float16bits(%g) = %#x, want %#x", f, got, want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		f := float32((r.Float64()*2 - 1) * math.Pow(2, float64(r.IntN(40)-25)))
		h := float16bits(f)
		got := half(h)
		// No other half is nearer.
		for _, n := range []uint16{h - 1, h + 1} {
			if n&0x7c00 == 0x7c00 {
				continue
			}
			if d, dn := math.Abs(got-float64(f)), math.Abs(half(n)-float64(f)); dn < d || dn == d && h&1 == 1 {
				t.Fatalf("float16bits(%g) = %#x (%g); %#x (%g) is nearer", f, h, got, n, half(n))
			}
		}
	}
}

// photo returns a w x h picture with smooth gradients and texture.
func photo(w, h int, seed uint64) *image.RGBA {
	r := rand.New(rand.NewPCG(seed, 1))
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	fx, fy := 3+r.Float64()*20, 3+r.Float64()*20
	for y := range h {
		for x := range w {
			v := func(c float64) uint8 {
				s := 128 + 60*math.Sin(float64(x)/fx+c) + 40*math.Cos(float64(y)/fy-c) + r.NormFloat64()*10
				return uint8(max(0, min(255, s)))
			}
			img.SetRGBA(x, y, color.RGBA{v(0), v(1), v(2), 255})
		}
	}
	return img
}

func encodeJPEG(t testing.TB, img image.Image) []byte {
	var b bytes.Buffer
	if err := jpeg.Encode(&b, img, &jpeg.Options{Quality: 90}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodePNG(t testing.TB, img image.Image) []byte {
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func decodeImg(t testing.TB, d *Decoder, spec string, data []byte) []byte {
	t.Helper()
	f := mustField(t, spec)
	v, _, err := d.Decode(&f, data, nil)
	if err != nil {
		t.Fatalf("%s: %v", spec, err)
	}
	if v.DType != f.DType || !slices.Equal(v.Shape, f.Shape) || int64(len(v.Data)) != f.RowBytes() {
		t.Fatalf("%s: value %s %v of %d bytes", spec, v.DType.Name(), v.Shape, len(v.Data))
	}
	return slices.Clone(v.Data)
}

// decoders are the JPEG decoders to test: Go's always, libjpeg-turbo where it loads
// (CI installs it: there it must).
func decoders(t *testing.T) []ImageDecoder {
	if _, err := turbojpeg.Default(); err != nil {
		if ciRequiresTurbo() {
			t.Fatalf("libjpeg-turbo does not load in CI: %v", err)
		}
		t.Logf("libjpeg-turbo not tested: %v", err)
		return []ImageDecoder{ImageDecoderGo}
	}
	return []ImageDecoder{ImageDecoderTurbo, ImageDecoderGo}
}

func meanAbsDiff(a, b []byte) (float64, int) {
	var sum, mx int
	for i := range a {
		d := int(a[i]) - int(b[i])
		if d < 0 {
			d = -d
		}
		sum += d
		mx = max(mx, d)
	}
	return float64(sum) / float64(len(a)), mx
}

func TestImageLayouts(t *testing.T) {
	src := photo(300, 200, 1)
	for _, data := range [][]byte{encodePNG(t, src), encodeJPEG(t, src)} {
		for _, be := range decoders(t) {
			d := Decoder{Images: be}
			hwc := decodeImg(t, &d, "i=x:image:uint8:64x48x3", data)
			chw := decodeImg(t, &d, "i=x:image:uint8:3x64x48", data)
			gray := decodeImg(t, &d, "i=x:image:uint8:64x48x1", data)
			f32 := decodeImg(t, &d, "i=x:image:float32:3x64x48", data)
			f16 := decodeImg(t, &d, "i=x:image:float16:64x48x3:mean=0.5/0.4/0.3,std=0.2/0.25/0.5", data)
			n := 64 * 48
			for p := range n {
				for c := range 3 {
					v := hwc[3*p+c]
					if chw[c*n+p] != v {
						t.Fatalf("%s: CHW pixel %d channel %d = %d, HWC has %d", be, p, c, chw[c*n+p], v)
					}
					if got := math.Float32frombits(le32(f32[4*(c*n+p):])); got != float32(v)/255 {
						t.Fatalf("%s: float32 %g for %d", be, got, v)
					}
					mean, std := [3]float32{0.5, 0.4, 0.3}, [3]float32{0.2, 0.25, 0.5}
					want := float16bits((float32(v)/255 - mean[c]) / std[c])
					if got := uint16(f16[2*(3*p+c)]) | uint16(f16[2*(3*p+c)+1])<<8; got != want {
						t.Fatalf("%s: float16 %#x for %d, want %#x", be, got, v, want)
					}
				}
				q := hwc[3*p : 3*p+3]
				l := byte((uint32(q[0])*19595 + uint32(q[1])*38470 + uint32(q[2])*7471 + 0x8000) >> 16)
				if gray[p] != l {
					t.Fatalf("%s: gray %d, want %d", be, gray[p], l)
				}
			}
		}
	}
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func TestImageFlip(t *testing.T) {
	data := encodePNG(t, photo(320, 240, 2))
	d := Decoder{}
	plain := decodeImg(t, &d, "i=png:image:uint8:32x40x3", data)
	var flipped, kept int
	for s := range uint64(40) {
		d.Seed = s
		out := decodeImg(t, &d, "i=png:image:uint8:32x40x3:flip", data)
		if bytes.Equal(out, plain) {
			kept++
			continue
		}
		flipped++
		for y := range 32 {
			for x := range 40 {
				a, b := out[3*(y*40+x):3*(y*40+x)+3], plain[3*(y*40+39-x):3*(y*40+39-x)+3]
				if !bytes.Equal(a, b) {
					t.Fatalf("seed %d: pixel %d,%d = %v, mirrored %v", s, x, y, a, b)
				}
			}
		}
	}
	if flipped < 10 || kept < 10 {
		t.Errorf("flip: %d of 40 seeds flipped", flipped)
	}
}

func TestImageDecodersAgree(t *testing.T) {
	ds := decoders(t)
	if len(ds) < 2 {
		t.Skip("libjpeg-turbo not loaded")
	}
	for i, sz := range [][2]int{{500, 375}, {375, 500}, {333, 251}, {1600, 1200}, {224, 224}} {
		data := encodeJPEG(t, photo(sz[0], sz[1], uint64(i)))
		for _, spec := range []string{"i=jpg:image", "i=jpg:image:uint8:224x224x3:full-decode", "i=jpg:image:uint8:224x224x3:random-crop,flip"} {
			turbo := decodeImg(t, &Decoder{Images: ImageDecoderTurbo, Seed: 3}, spec, data)
			goImg := decodeImg(t, &Decoder{Images: ImageDecoderGo, Seed: 3}, spec, data)
			mean, mx := meanAbsDiff(turbo, goImg)
			t.Logf("%dx%d %s: libjpeg-turbo vs go: mean %.3f, max %d", sz[0], sz[1], spec, mean, mx)
			// Measured: mean 0.04, max 3 (0.29 and 2 where libjpeg-turbo decodes at
			// half scale): Go's IDCT differs, its chroma upsampling and colour
			// conversion are libjpeg's.
			if mean > 0.5 || mx > 8 {
				t.Errorf("%dx%d %s: libjpeg-turbo and go differ by %.3f on average, %d at most", sz[0], sz[1], spec, mean, mx)
			}
		}
	}
}

func TestImageErrors(t *testing.T) {
	jpg := encodeJPEG(t, photo(200, 150, 3))
	pngData := encodePNG(t, photo(200, 150, 3))
	for _, be := range decoders(t) {
		d := Decoder{Images: be}
		cases := []struct {
			spec string
			data []byte
			msg  string
		}{
			{"i=jpg:image", []byte("hello, world"), "not a JPEG, PNG, WebP or GIF image"},
			{"i=jpg:image", jpg[:len(jpg)/2], ""},
			{"i=jpg:image", jpg[:20], ""},
			{"i=png:image", pngData[:len(pngData)/2], "PNG"},
		}
		for _, c := range cases {
			f := mustField(t, c.spec)
			_, _, err := d.Decode(&f, c.data, nil)
			var fe *FieldError
			if !errors.Is(err, ErrBadImage) || !errors.As(err, &fe) || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("%s: %d bytes: error %v, want ErrBadImage with %q", be, len(c.data), err, c.msg)
			}
		}
		// Cut short, through a resize and a crop (libjpeg-turbo decodes those by
		// strips, resizing each as it comes): the sample's error, and the decoder
		// gives the next image what a fresh one gives.
		for _, spec := range []string{"i=jpg:image:uint8:3x64x64:resize=80", "i=jpg:image:uint8:64x64x3:random-crop,flip"} {
			f := mustField(t, spec)
			_, _, err := d.Decode(&f, jpg[:len(jpg)/2], nil)
			if !errors.Is(err, ErrBadImage) || be == ImageDecoderTurbo && !strings.Contains(err.Error(), "JPEG truncated") {
				t.Errorf("%s: %s, cut short: error %v, want ErrBadImage (JPEG truncated, from libjpeg-turbo)", be, spec, err)
			}
			got, _, err := d.Decode(&f, jpg, nil)
			if err != nil {
				t.Fatal(err)
			}
			fresh := Decoder{Images: be}
			want, _, err := fresh.Decode(&f, jpg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Data, want.Data) {
				t.Errorf("%s: %s: after a truncated JPEG the decoder's next image differs from a fresh decoder's", be, spec)
			}
		}
		// Over the cap: 200 x 150 x 3 bytes decoded.
		f := mustField(t, "i=jpg:image")
		f.MaxBytes = 200*150*3 - 1
		if _, _, err := d.Decode(&f, jpg, nil); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "over the cap") {
			t.Errorf("%s: over the cap: %v", be, err)
		}
		f.MaxBytes = 200 * 150 * 3
		if _, _, err := d.Decode(&f, jpg, nil); err != nil {
			t.Errorf("%s: at the cap: %v", be, err)
		}
	}
}

func TestImageCMYK(t *testing.T) {
	// A CMYK JPEG (YCCK, Adobe; image/jpeg's encoder writes any image as YCbCr),
	// which libjpeg-turbo cannot convert to RGB: decoded in Go.
	data, err := os.ReadFile("turbojpeg/testdata/ycck.jpg")
	if err != nil {
		t.Fatal(err)
	}
	ref := decodeImg(t, &Decoder{Images: ImageDecoderGo}, "i=jpg:image:uint8:20x30x3", data)
	for _, be := range decoders(t) {
		d := Decoder{Images: be}
		out := decodeImg(t, &d, "i=jpg:image:uint8:20x30x3", data)
		if !bytes.Equal(out, ref) {
			t.Errorf("%s: CMYK decoded differently", be)
		}
	}
}

// BenchmarkImage decodes a 500x375 photo into 224x224 crops. Beside the wall time it
// reports cpu-ms/op, the process's CPU time an image (getrusage), steadier than the
// wall time on a shared machine. For comparison in the same run, libjpeg-turbo's
// whole-jpeg runs decode every pixel of the JPEG (no partial decode), and its
// go-resize runs do that and resize with the Go passes (no AVX2): the path before
// either.
func BenchmarkImage(b *testing.B) {
	data := encodeJPEG(b, photo(500, 375, 9))
	for _, be := range []ImageDecoder{ImageDecoderTurbo, ImageDecoderGo} {
		if _, err := be.Resolve(); err != nil {
			continue
		}
		for _, spec := range []string{"i=jpg:image:uint8:224x224x3", "i=jpg:image:uint8:3x224x224:resize=256", "i=jpg:image:uint8:3x224x224:random-crop,flip", "i=jpg:image:float32:3x224x224:imagenet"} {
			for _, variant := range []string{"", "/whole-jpeg", "/go-resize"} {
				if variant != "" && be != ImageDecoderTurbo {
					continue
				}
				b.Run(be.String()+"/"+spec[strings.LastIndexByte(spec, ':')+1:]+variant, func(b *testing.B) {
					f := mustField(b, spec)
					d := Decoder{Images: be, wholeJPEG: variant != ""}
					b.SetBytes(int64(len(data)))
					b.ReportAllocs()
					d.Decode(&f, data, nil)
					d.img.rs.noVector = variant == "/go-resize"
					c0 := cpuTime()
					for i := range b.N {
						d.Seed = uint64(i)
						if _, _, err := d.Decode(&f, data, nil); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(cpuTime()-c0)/1e6/float64(b.N), "cpu-ms/op")
				})
			}
		}
	}
}

// TestImageRegionDecodeExact: decoding only the part of a JPEG the resize reads
// (libjpeg's jpeg_crop_scanline and jpeg_skip_scanlines) gives the pixels of the
// whole decode, byte for byte, for the center and random crops, flips, every output
// layout, reduced scales, and PIL's 4:4:4, 4:2:2 and progressive JPEGs.
func TestImageRegionDecodeExact(t *testing.T) {
	if _, err := turbojpeg.Default(); err != nil {
		if ciRequiresTurbo() {
			t.Fatal(err)
		}
		t.Skipf("libjpeg-turbo not loaded: %v", err)
	}
	if _, err := turbojpeg.DefaultRegions(); err != nil {
		if ciRequiresTurbo() {
			t.Fatal(err)
		}
		t.Skipf("libjpeg not loaded: %v", err)
	}
	var jpegs [][]byte
	for i, sz := range [][2]int{{500, 375}, {375, 500}, {333, 251}, {640, 480}, {1600, 1200}, {97, 61}} {
		jpegs = append(jpegs, encodeJPEG(t, photo(sz[0], sz[1], uint64(i+20))))
	}
	for _, name := range []string{"s444.jpg", "s422.jpg", "prog420.jpg"} {
		data, err := os.ReadFile("turbojpeg/testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		jpegs = append(jpegs, data)
	}
	specs := []string{
		"i=jpg:image", "i=jpg:image:uint8:224x224x3:resize=256", "i=jpg:image:uint8:3x224x224:resize=320",
		"i=jpg:image:uint8:224x224x3:random-crop,flip", "i=jpg:image:float32:3x224x224:random-crop,flip,imagenet",
		"i=jpg:image:uint8:64x48x1:random-crop,scale=0.05-0.3", "i=jpg:image:uint8:32x32x3:random-crop,ratio=0.3-3",
		"i=jpg:image:uint8:224x224x3:random-crop,full-decode", "i=jpg:image:uint8:40x30x3",
	}
	var partial, total int
	for i, data := range jpegs {
		for _, spec := range specs {
			f := mustField(t, spec)
			seeds := 1
			if f.Image.RandomCrop {
				seeds = 25
			}
			for s := range uint64(seeds) {
				whole := Decoder{Images: ImageDecoderTurbo, Seed: s, wholeJPEG: true}
				part := Decoder{Images: ImageDecoderTurbo, Seed: s}
				want := decodeImg(t, &whole, spec, data)
				got := decodeImg(t, &part, spec, data)
				total++
				if part.img.region.W > 0 {
					partial++
				}
				if !bytes.Equal(got, want) {
					mean, mx := meanAbsDiff(got, want)
					t.Fatalf("image %d, %s, seed %d: the partial decode's output differs (mean %.3f, max %d; region %+v)", i, spec, s, mean, mx, part.img.region)
				}
			}
		}
	}
	t.Logf("%d of %d decodes partial", partial, total)
	if partial < total/2 {
		t.Errorf("only %d of %d decodes were partial", partial, total)
	}
}
