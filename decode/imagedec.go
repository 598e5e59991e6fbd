package decode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"image/jpeg"
	"math"
	"strings"
	"sync"

	"github.com/shardload/shardload/decode/turbojpeg"
)

// ImageDecoder chooses the JPEG decoder of image fields. PNG, WebP and GIF are
// always decoded in Go.
type ImageDecoder int

const (
	// ImageDecoderAuto uses libjpeg-turbo when its TurboJPEG library
	// (libturbojpeg.so.0) loads, and Go's image/jpeg otherwise.
	ImageDecoderAuto ImageDecoder = iota
	// ImageDecoderTurbo uses libjpeg-turbo, loaded at run time; Resolve fails when it
	// cannot be loaded. It decodes as PIL does (same IDCT and upsampling), and can
	// decode at 1/2, 1/4 or 1/8 scale in the DCT. A JPEG it cannot decode (CMYK) is
	// decoded in Go.
	ImageDecoderTurbo
	// ImageDecoderGo uses Go's image/jpeg: no C library, about 3x slower. Its
	// chroma is upsampled and converted to RGB as libjpeg does, so that its pixels are
	// within a few levels of libjpeg-turbo's (its IDCT differs).
	ImageDecoderGo
)

var imageDecoderNames = [...]string{"auto", "libjpeg-turbo", "go"}

// String returns "auto", "libjpeg-turbo" or "go".
func (d ImageDecoder) String() string {
	if d >= 0 && int(d) < len(imageDecoderNames) {
		return imageDecoderNames[d]
	}
	return fmt.Sprintf("ImageDecoder(%d)", int(d))
}

// ParseImageDecoder parses the names String returns.
func ParseImageDecoder(s string) (ImageDecoder, error) {
	for i, n := range imageDecoderNames {
		if n == s {
			return ImageDecoder(i), nil
		}
	}
	return 0, fmt.Errorf("decode: unknown image decoder %q (want auto, libjpeg-turbo or go)", s)
}

// Resolve returns the decoder d stands for in this process: ImageDecoderTurbo or
// ImageDecoderGo. For ImageDecoderTurbo it fails, saying why, when libjpeg-turbo
// cannot be loaded ($SHARDLOAD_TURBOJPEG names the library's path when it is not
// where the dynamic loader looks).
func (d ImageDecoder) Resolve() (ImageDecoder, error) {
	switch d {
	case ImageDecoderGo:
		return d, nil
	case ImageDecoderTurbo:
		if _, err := turbojpeg.Default(); err != nil {
			return d, fmt.Errorf("decode: image decoder libjpeg-turbo: %w (install libturbojpeg0, or use the go decoder)", err)
		}
		return d, nil
	case ImageDecoderAuto:
		if _, err := turbojpeg.Default(); err == nil {
			return ImageDecoderTurbo, nil
		}
		return ImageDecoderGo, nil
	}
	return d, fmt.Errorf("decode: invalid image decoder %d", int(d))
}

// imageState is a Decoder's scratch for images.
type imageState struct {
	rgb []byte // the decoded image, packed RGB
	px  []byte // the resized crop, packed HWC uint8, when the output is not that
	out []byte // the output row
	rs  resampler
	lut lut
	// region is the part of the image in rgb when it was decoded in part.
	region turbojpeg.Region
	// hs runs the horizontal pass as a partial decode makes its rows; hrows, when
	// not nil, is what it gave: the rows from source row hbase on, as the vertical
	// pass reads them.
	hs    hstrip
	hrows []byte
	hbase int
}

// lut maps a channel's byte to its float output's bytes.
type lut struct {
	dtype     DType
	mean, std [3]float64
	ok        bool
	v         [3][256]uint32
}

var imageStates = sync.Pool{New: func() any { return new(imageState) }}

// image formats, by their first bytes.
const (
	fmtUnknown = iota
	fmtJPEG
	fmtPNG
	fmtWebP
	fmtGIF
)

func sniff(b []byte) int {
	switch {
	case len(b) >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff:
		return fmtJPEG
	case bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")):
		return fmtPNG
	case len(b) >= 12 && string(b[:4]) == "RIFF" && string(b[8:12]) == "WEBP":
		return fmtWebP
	case bytes.HasPrefix(b, []byte("GIF87a")) || bytes.HasPrefix(b, []byte("GIF89a")):
		return fmtGIF
	}
	return fmtUnknown
}

var formatNames = [...]string{"unknown", "JPEG", "PNG", "WebP", "GIF"}

// decodeImage decodes an image member into the field's output, in the state's out
// buffer.
func (d *Decoder) decodeImage(f *Field, data []byte) (Value, error) {
	st := d.img
	if st == nil {
		st = imageStates.Get().(*imageState)
		d.img = st
	}
	oh, ow, ch, chw, _ := imageLayout(f.Shape)
	format := sniff(data)
	if format == fmtUnknown {
		return Value{}, errf(ErrBadImage, "not a JPEG, PNG, WebP or GIF image (starts with %s)", quotePrefix(data[:min(len(data), 8)]))
	}
	backend, err := d.Images.Resolve()
	if err != nil {
		return Value{}, err
	}
	if format == fmtJPEG {
		// A component without its quantization table: libjpeg fails on it, Go's
		// decoder would give it flat gray.
		if err := turbojpeg.CheckTables(data); err != nil {
			return Value{}, errf(ErrBadImage, "JPEG: %v", err)
		}
	}
	var lib *turbojpeg.Lib
	if format == fmtJPEG && backend == ImageDecoderTurbo {
		lib, _ = turbojpeg.Default()
	}
	// The image's size, from its header.
	var iw, ih int
	partial := false // whether libjpeg may decode a part of the JPEG
	if lib != nil {
		hd, err := lib.Header(data)
		if err != nil {
			lib = nil // let Go's decoder have its say
		} else {
			iw, ih = hd.Width, hd.Height
			// Only the colourspaces TurboJPEG decodes to RGB (libjpeg converts CMYK
			// too, as Go's decoder does not).
			partial = !d.wholeJPEG && (hd.Colorspace == turbojpeg.CSYCbCr || hd.Colorspace == turbojpeg.CSGray)
		}
	}
	if lib == nil {
		cfg, err := decodeConfig(format, data)
		if err != nil {
			return Value{}, errf(ErrBadImage, "%s: %v", formatNames[format], err)
		}
		iw, ih = cfg.Width, cfg.Height
	}
	if iw <= 0 || ih <= 0 {
		return Value{}, errf(ErrBadImage, "%s of %dx%d pixels", formatNames[format], iw, ih)
	}
	if need := int64(iw) * int64(ih) * 3; need > f.maxBytes() {
		return Value{}, errf(ErrBadImage, "%dx%d %s decodes to %d bytes, over the cap of %d (raise the field's MaxBytes)", iw, ih, formatNames[format], need, f.maxBytes())
	}
	r := rng{d.Seed}
	g := f.Image.geometry(iw, ih, ow, oh, &r)
	flip := f.Image.Flip && r.float() < 0.5

	// Decode, at a reduced scale when libjpeg-turbo can and the crop region is four
	// times the output or more: the smallest scale that keeps twice the output.
	den := 1
	if lib != nil && !f.Image.FullDecode {
		for _, k := range [...]int{8, 4, 2} {
			if g.W >= 2*k*g.OW && g.H >= 2*k*g.OH {
				den = k
				break
			}
		}
	}
	var sw, sh int
	if lib != nil {
		sw, sh = turbojpeg.ScaledSize(iw, ih, 1, den)
	} else {
		sw, sh = iw, ih
	}
	// The resize of the crop's region: in the decoded image's pixels, [X, X+W) of the
	// source scaled by 1/den.
	st.setAxes(g, den, sw, sh, ow, oh)
	stride := sw * 3
	st.region, st.hrows = turbojpeg.Region{}, nil
	switch {
	case lib != nil && partial && d.decodeRegion(st, data, sw, sh, den, flip):
		stride = st.region.W * 3
	case lib != nil:
		st.rgb = grow(st.rgb, sw*sh*3)
		// Any warning stops the decode: a truncated or corrupt JPEG is an error
		// whatever the path, never an image with gray or garbled rows.
		err := lib.Decode(data, st.rgb, sw, sh, turbojpeg.RGB, turbojpeg.StopOnWarning)
		te, _ := err.(*turbojpeg.Error) // not errors.As: its target would be allocated for every image
		switch {
		case err == nil:
		case te != nil && te.Skippable():
			// Extraneous bytes before a marker, or a note on the metadata, which PIL
			// and Go decode through. TurboJPEG reports no later warning: decodeWhole
			// sees them all.
			inGo, err := d.decodeWhole(st, format, data, sw, sh, den, iw, ih)
			if err != nil {
				return Value{}, err
			}
			if inGo && den != 1 {
				// Decoded in Go, at full size.
				sw, sh = iw, ih
				st.setAxes(g, 1, sw, sh, ow, oh)
				stride = sw * 3
			}
		case te != nil && te.Warning:
			return Value{}, jpegWarning(te.Msg)
		default:
			// What libjpeg-turbo cannot decode (a CMYK JPEG), Go may.
			if gerr := d.decodeGo(st, format, data, iw, ih); gerr != nil {
				return Value{}, errf(ErrBadImage, "JPEG: %v", err)
			}
			if den != 1 {
				sw, sh = iw, ih
				st.setAxes(g, 1, sw, sh, ow, oh)
				stride = sw * 3
			}
		}
	default:
		if err := d.decodeGo(st, format, data, iw, ih); err != nil {
			return Value{}, errf(ErrBadImage, "%s: %v", formatNames[format], err)
		}
	}
	n := ow * oh
	rowBytes := n * ch * f.DType.Size()
	st.out = grow(st.out, rowBytes)
	direct := ch == 3 && !chw && f.DType == Uint8 // the resize's pixels are the output
	px := st.out
	if !direct {
		st.px = grow(st.px, n*3)
		px = st.px
	}
	if st.hrows != nil {
		st.rs.finish(px, st.hrows, 3*len(st.rs.h.start), st.hbase)
	} else {
		st.rs.resize(px, st.rgb, stride, flip)
	}
	if !direct {
		st.emit(f, st.out, px, n, ch, chw)
	}
	return Value{Data: st.out[:rowBytes:rowBytes], DType: f.DType, Shape: f.Shape}, nil
}

// jpegWarning is the error of a JPEG libjpeg warned about: truncated, or corrupt.
func jpegWarning(msg string) error {
	what := "corrupt"
	if strings.Contains(msg, "Premature end of JPEG file") {
		what = "truncated"
	}
	return errf(ErrBadImage, "JPEG %s (%s)", what, msg)
}

// decodeWhole decodes a JPEG whose decode by TurboJPEG stopped on a skippable
// warning into st.rgb, seeing every warning: through libjpeg (sw x sh, scaled by
// 1/den, as TurboJPEG would have), or in Go at full size (iw x ih) where libjpeg does
// not load. It reports whether it decoded in Go. A warning that is not skippable,
// or Go's failure, is the sample's error. So is extraneous data that Go's decoder
// does not decode through: libjpeg-turbo decodes an invalid Huffman code as a zero,
// without a warning, and what it leaves of the scan is the extraneous data; Go's
// decoder fails on the code, and skips only what lies beyond whole entropy-coded
// data.
func (d *Decoder) decodeWhole(st *imageState, format int, data []byte, sw, sh, den, iw, ih int) (bool, error) {
	rg, err := turbojpeg.DefaultRegions()
	if err != nil {
		if err := d.decodeGo(st, format, data, iw, ih); err != nil {
			return true, errf(ErrBadImage, "%s: %v", formatNames[format], err)
		}
		return true, nil
	}
	st.rgb = grow(st.rgb, sw*sh*3)
	_, err = rg.DecodeRegion(data, st.rgb, sw, sh, den, turbojpeg.Region{W: sw, H: sh})
	te, _ := err.(*turbojpeg.Error)
	switch {
	case err == nil:
	case te != nil && te.Extraneous():
		if _, gerr := jpeg.Decode(jpegWithStandardHuffman(data)); gerr != nil {
			return false, errf(ErrBadImage, "JPEG corrupt (%s; image/jpeg: %v)", te.Msg, gerr)
		}
	case te != nil && te.Skippable():
	case te != nil && te.Warning:
		return false, jpegWarning(te.Msg)
	default:
		return false, errf(ErrBadImage, "JPEG: %v", err)
	}
	return false, nil
}

// setAxes sets the resampler's taps for the crop g of a source decoded at 1/den of
// its size, sw x sh pixels, into an ow x oh output.
func (st *imageState) setAxes(g region, den, sw, sh, ow, oh int) {
	s := 1 / float64(den)
	x0, x1 := float64(g.X)*s, float64(g.X+g.W)*s
	y0, y1 := float64(g.Y)*s, float64(g.Y+g.H)*s
	st.rs.h.set(int(math.Floor(x0)), min(int(math.Ceil(x1)), sw), x0, x1, g.OW, g.WX, ow)
	st.rs.v.set(int(math.Floor(y0)), min(int(math.Ceil(y1)), sh), y0, y1, g.OH, g.WY, oh)
}

// regionMargin is how far a partial decode reaches beyond the pixels the resize
// reads, on each side: the first and last columns of a partial decode are not the
// full decode's (their chroma is upsampled without the neighbour beyond).
const regionMargin = 2

// regionMinSaving is the fraction of a decode's pixels a partial decode must leave
// out to be used, where the horizontal pass cannot run as the rows are decoded.
const regionMinSaving = 0.05

// eoi is the marker a whole JPEG ends with.
var eoi = []byte{0xff, 0xd9}

// stripRows is how many rows a partial decode makes before the horizontal pass
// takes them: about 24 KB of a 500-pixel-wide photo, which stays in the CPU's
// caches (a whole decoded photo does not: the pass read it at a third of the speed).
const stripRows = 16

// decodeRegion decodes only the part of the JPEG (scaled by 1/den, sw x sh pixels)
// that the resampler's taps read, through libjpeg's partial decoding, when libjpeg
// loads. Where the vector horizontal pass runs, it runs on the rows as they are
// decoded, a strip at a time, into st.hrows, whatever the part's size; otherwise the
// part goes into st.rgb when it is smaller than the image. It moves the taps to the
// part's coordinates (the horizontal pass's, when it ran, need no move) and records
// the part in st.region. It returns false, changing nothing the caller uses, when it
// does not apply or libjpeg fails or warns: the caller then decodes the whole image,
// which reports what is wrong with it.
func (d *Decoder) decodeRegion(st *imageState, data []byte, sw, sh, den int, flip bool) bool {
	if !bytes.HasSuffix(data, eoi) {
		// Cut short, or bytes after its end: a partial decode that stops above the
		// cut would not see it, and the crop of another epoch would. The whole
		// decode says which (PIL fails on a truncated JPEG too).
		return false
	}
	x0, x1 := st.rs.h.span()
	y0, y1 := st.rs.v.span()
	r := turbojpeg.Region{X: max(0, x0-regionMargin), Y: max(0, y0-regionMargin)}
	r.W, r.H = min(sw, x1+regionMargin)-r.X, min(sh, y1+regionMargin)-r.Y
	rg, err := turbojpeg.DefaultRegions()
	if err != nil {
		return false
	}
	if !st.rs.noVector && (!st.rs.h.identity || flip) {
		vy0, vy1 := st.rs.vrows()
		tmp := st.rs.scratch(3 * len(st.rs.h.start) * (vy1 - vy0))
		if fn, ctx := st.hs.start(tmp, vy0-r.Y, vy1-r.Y, &st.rs.h, flip); fn != nil {
			st.rgb = grow(st.rgb, sw*stripRows*3)
			got, err := rg.DecodeRegionStrips(data, st.rgb, sw, sh, den, r, stripRows, fn, ctx)
			st.hs.done()
			if err != nil {
				return false
			}
			st.region = got
			st.rs.v.shift(-got.Y)
			st.hrows, st.hbase = tmp, vy0-got.Y
			return true
		}
	}
	if float64(r.W*r.H) > (1-regionMinSaving)*float64(sw*sh) {
		return false
	}
	st.rgb = grow(st.rgb, sw*r.H*3)
	got, err := rg.DecodeRegion(data, st.rgb, sw, sh, den, r)
	if err != nil {
		return false
	}
	st.region = got
	st.rs.h.shift(-got.X)
	st.rs.v.shift(-got.Y)
	return true
}

// grow returns b resized to n bytes, reallocated when its capacity is not n and 16
// more: the vector resampler reads a byte past a source's last pixel.
func grow(b []byte, n int) []byte {
	if cap(b) < n+16 {
		return make([]byte, n, n+16)
	}
	return b[:n]
}

// emit writes the HWC RGB pixels px (n of them) as the field's output: grayscale,
// CHW, float.
func (st *imageState) emit(f *Field, out, px []byte, n, ch int, chw bool) {
	if f.DType == Uint8 && ch == 3 && chw {
		r, g, b := out[:n], out[n:2*n], out[2*n:3*n]
		for p := range n {
			q := px[3*p : 3*p+3 : 3*p+3]
			r[p], g[p], b[p] = q[0], q[1], q[2]
		}
		return
	}
	if f.DType != Uint8 {
		st.lut.set(f)
	}
	if ch == 3 && f.DType == Float32 {
		// Float32 RGB, the common normalised output: one table lookup a value.
		for c := range 3 {
			t := &st.lut.v[c]
			for p := range n {
				i := p*3 + c
				if chw {
					i = c*n + p
				}
				binary.LittleEndian.PutUint32(out[4*i:], t[px[3*p+c]])
			}
		}
		return
	}
	size := f.DType.Size()
	for p := range n {
		q := px[3*p : 3*p+3 : 3*p+3]
		for c := range ch {
			v := q[c]
			if ch == 1 {
				// PIL's convert("L"): ITU-R 601-2 luma.
				v = byte((uint32(q[0])*19595 + uint32(q[1])*38470 + uint32(q[2])*7471 + 0x8000) >> 16)
			}
			i := p*ch + c
			if chw {
				i = c*n + p
			}
			switch size {
			case 1:
				out[i] = v
			case 2:
				u := st.lut.v[c][v]
				out[2*i], out[2*i+1] = byte(u), byte(u>>8)
			case 4:
				u := st.lut.v[c][v]
				out[4*i], out[4*i+1], out[4*i+2], out[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
			}
		}
	}
}

// set fills the table for f's dtype and normalisation, when it is not already.
func (l *lut) set(f *Field) {
	o := &f.Image
	if l.ok && l.dtype == f.DType && l.mean == o.Mean && l.std == o.Std {
		return
	}
	l.dtype, l.mean, l.std, l.ok = f.DType, o.Mean, o.Std, true
	for c := range 3 {
		for v := range 256 {
			// As torchvision's ToTensor then Normalize, in float32.
			x := float32(v) / 255
			if o.Std != ([3]float64{}) {
				x = (x - float32(o.Mean[c])) / float32(o.Std[c])
			}
			if f.DType == Float16 {
				l.v[c][v] = uint32(float16bits(x))
			} else {
				l.v[c][v] = math.Float32bits(x)
			}
		}
	}
}

// float16bits converts f to IEEE 754 half precision, rounding to nearest even.
func float16bits(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case b&0x7fffffff > 0x7f800000: // NaN
		return sign | 0x7e00
	case exp >= 31: // overflow, or infinity
		return sign | 0x7c00
	case exp <= 0: // subnormal or zero
		if exp < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint(14 - exp)
		h := mant >> shift
		rem := mant & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || rem == half && h&1 == 1 {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(exp)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // may carry into the exponent, up to infinity: right
	}
	return sign | uint16(h)
}
