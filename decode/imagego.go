package decode

// Decoding in Go: image/jpeg, image/png, x/image/webp and image/gif, where
// libjpeg-turbo does not load or cannot decode the image, and the conversion of
// their images to packed RGB as PIL converts them.

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"sync"

	"golang.org/x/image/webp"
)

func decodeConfig(format int, data []byte) (image.Config, error) {
	r := bytes.NewReader(data)
	switch format {
	case fmtJPEG:
		return jpeg.DecodeConfig(r)
	case fmtPNG:
		return png.DecodeConfig(r)
	case fmtWebP:
		return webp.DecodeConfig(r)
	case fmtGIF:
		return gif.DecodeConfig(r)
	}
	return image.Config{}, errors.New("unknown format")
}

// standardHuffman is a DHT segment of the four standard Huffman tables (ITU T.81,
// K.3: DC and AC, luminance in slot 0 and chrominance in slot 1), which libjpeg
// gives a scan whose tables the JPEG leaves out (a Motion-JPEG frame does). image/jpeg
// writes exactly those, in one segment: taken from what it writes.
var standardHuffman = sync.OnceValue(func() []byte {
	var b bytes.Buffer
	if err := jpeg.Encode(&b, image.NewRGBA(image.Rect(0, 0, 8, 8)), nil); err != nil {
		panic(err)
	}
	d := b.Bytes()
	for i := 2; i+4 <= len(d) && d[i+1] != 0xda; {
		n := int(d[i+2])<<8 | int(d[i+3])
		if d[i+1] == 0xc4 {
			return d[i : i+2+n : i+2+n]
		}
		i += 2 + n
	}
	panic("image/jpeg wrote no Huffman tables")
})

// jpegWithStandardHuffman returns data to read for image/jpeg: the standard Huffman
// tables right after its SOI marker, then the rest of it. The JPEG's own tables,
// which come later, replace them; a scan whose tables it leaves out decodes with the
// standard ones, as in libjpeg (and so PIL), where image/jpeg alone would fail.
func jpegWithStandardHuffman(data []byte) io.Reader {
	if len(data) < 2 {
		return bytes.NewReader(data)
	}
	return io.MultiReader(bytes.NewReader(data[:2]), bytes.NewReader(standardHuffman()), bytes.NewReader(data[2:]))
}

// decodeGo decodes data in Go into st.rgb, as packed RGB.
func (d *Decoder) decodeGo(st *imageState, format int, data []byte, iw, ih int) error {
	r := bytes.NewReader(data)
	var img image.Image
	var err error
	switch format {
	case fmtJPEG:
		img, err = jpeg.Decode(jpegWithStandardHuffman(data))
	case fmtPNG:
		img, err = png.Decode(r)
	case fmtWebP:
		img, err = webp.Decode(r)
	case fmtGIF:
		img, err = gif.Decode(r)
	}
	if err != nil {
		return err
	}
	b := img.Bounds()
	if b.Dx() != iw || b.Dy() != ih {
		return fmt.Errorf("decoded %dx%d, header says %dx%d", b.Dx(), b.Dy(), iw, ih)
	}
	st.rgb = grow(st.rgb, iw*ih*3)
	toRGB(st.rgb, img)
	return nil
}

// toRGB writes img as packed RGB into dst, dropping any alpha (as PIL's
// convert("RGB") does).
func toRGB(dst []byte, img image.Image) {
	b := img.Bounds()
	w := b.Dx()
	switch m := img.(type) {
	case *image.NYCbCrA:
		toRGB(dst, &m.YCbCr)
	case *image.YCbCr:
		switch m.SubsampleRatio {
		case image.YCbCrSubsampleRatio420, image.YCbCrSubsampleRatio422:
			fancyToRGB(dst, m)
			return
		}
		for y := b.Min.Y; y < b.Max.Y; y++ {
			out := dst[(y-b.Min.Y)*w*3 : (y-b.Min.Y+1)*w*3]
			yrow := m.Y[m.YOffset(b.Min.X, y):]
			for x := range w {
				ci := m.COffset(b.Min.X+x, y)
				ycbcrToRGB(out[3*x:3*x+3:3*x+3], yrow[x], m.Cb[ci], m.Cr[ci])
			}
		}
	case *image.Gray:
		for y := b.Min.Y; y < b.Max.Y; y++ {
			out := dst[(y-b.Min.Y)*w*3:]
			row := m.Pix[(y-b.Min.Y)*m.Stride:]
			for x := range w {
				v := row[x]
				out[3*x], out[3*x+1], out[3*x+2] = v, v, v
			}
		}
	case *image.RGBA:
		fourToThree(dst, m.Pix, m.Stride, w, b.Dy())
	case *image.NRGBA:
		fourToThree(dst, m.Pix, m.Stride, w, b.Dy())
	case *image.Paletted:
		var pal [256][3]byte
		for i, c := range m.Palette {
			n := color.NRGBAModel.Convert(c).(color.NRGBA)
			pal[i] = [3]byte{n.R, n.G, n.B}
		}
		for y := range b.Dy() {
			out := dst[y*w*3:]
			row := m.Pix[y*m.Stride:]
			for x := range w {
				p := pal[row[x]]
				out[3*x], out[3*x+1], out[3*x+2] = p[0], p[1], p[2]
			}
		}
	default:
		i := 0
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				var n color.NRGBA
				if c, ok := img.At(x, y).(color.CMYK); ok {
					r, g, bb := color.CMYKToRGB(c.C, c.M, c.Y, c.K)
					n = color.NRGBA{r, g, bb, 255}
				} else {
					n = color.NRGBAModel.Convert(img.At(x, y)).(color.NRGBA)
				}
				dst[i], dst[i+1], dst[i+2] = n.R, n.G, n.B
				i += 3
			}
		}
	}
}

// fancyToRGB converts a 4:2:0 or 4:2:2 image as libjpeg does by default: chroma
// upsampled with its "fancy" triangle filter (jdsample.c's h2v2 and h2v1
// fancy_upsample: each output weighs its nearer chroma sample 3 to 1 against the next
// one, on each subsampled axis), then libjpeg's colour conversion.
func fancyToRGB(dst []byte, m *image.YCbCr) {
	b := m.Bounds()
	w, h := b.Dx(), b.Dy()
	cw := (w + 1) / 2
	v2 := m.SubsampleRatio == image.YCbCrSubsampleRatio420
	// 4:2:0: column sums of the chroma rows an output row needs, 3 x nearer +
	// farther, then the horizontal step, in sixteenths.
	cbSum, crSum := make([]int32, cw), make([]int32, cw)
	cb, cr := make([]byte, w), make([]byte, w)
	for y := range h {
		cy, other := y, y
		if v2 {
			cy = y / 2
			other = cy + 1
			if y%2 == 0 {
				other = cy - 1
			}
			other = max(0, min(other, (h+1)/2-1))
		}
		row := func(c []byte, cy int) []byte {
			o := m.COffset(b.Min.X, b.Min.Y+min(cy*2, h-1))
			if !v2 {
				o = m.COffset(b.Min.X, b.Min.Y+cy)
			}
			return c[o : o+cw]
		}
		cbThis, crThis := row(m.Cb, cy), row(m.Cr, cy)
		if v2 {
			cbOther, crOther := row(m.Cb, other), row(m.Cr, other)
			for i := range cw {
				cbSum[i] = 3*int32(cbThis[i]) + int32(cbOther[i])
				crSum[i] = 3*int32(crThis[i]) + int32(crOther[i])
			}
			upsampleRow(cb, cbSum)
			upsampleRow(cr, crSum)
		} else {
			upsampleRow1(cb, cbThis)
			upsampleRow1(cr, crThis)
		}
		out := dst[y*w*3 : (y+1)*w*3]
		yrow := m.Y[m.YOffset(b.Min.X, b.Min.Y+y):]
		for x := range w {
			ycbcrToRGB(out[3*x:3*x+3:3*x+3], yrow[x], cb[x], cr[x])
		}
	}
}

// upsampleRow doubles a row of column sums (in quarters) into bytes: libjpeg's
// horizontal triangle filter, with its alternating rounding biases of 8 and 7
// sixteenths, and the edges' outputs from their own column alone.
func upsampleRow(out []byte, sum []int32) {
	n := len(sum)
	w := len(out)
	if n == 1 {
		out[0] = byte((sum[0]*4 + 8) >> 4)
		if w > 1 {
			out[1] = byte((sum[0]*4 + 7) >> 4)
		}
		return
	}
	out[0] = byte((sum[0]*4 + 8) >> 4)
	out[1] = byte((sum[0]*3 + sum[1] + 7) >> 4)
	for i := 1; i < n-1; i++ {
		out[2*i] = byte((sum[i]*3 + sum[i-1] + 8) >> 4)
		out[2*i+1] = byte((sum[i]*3 + sum[i+1] + 7) >> 4)
	}
	if 2*(n-1) < w {
		out[2*(n-1)] = byte((sum[n-1]*3 + sum[n-2] + 8) >> 4)
	}
	if 2*(n-1)+1 < w {
		out[2*(n-1)+1] = byte((sum[n-1]*4 + 7) >> 4)
	}
}

// upsampleRow1 doubles a chroma row as libjpeg's h2v1_fancy_upsample does (4:2:2):
// 3 to 1 with the next sample, in quarters, rounding biases 1 and 2; the edges'
// outer outputs are their sample.
func upsampleRow1(out, in []byte) {
	n, w := len(in), len(out)
	if n == 1 {
		out[0] = in[0]
		if w > 1 {
			out[1] = in[0]
		}
		return
	}
	out[0] = in[0]
	out[1] = byte((int32(in[0])*3 + int32(in[1]) + 2) >> 2)
	for i := 1; i < n-1; i++ {
		v := int32(in[i]) * 3
		out[2*i] = byte((v + int32(in[i-1]) + 1) >> 2)
		out[2*i+1] = byte((v + int32(in[i+1]) + 2) >> 2)
	}
	if 2*(n-1) < w {
		out[2*(n-1)] = byte((int32(in[n-1])*3 + int32(in[n-2]) + 1) >> 2)
	}
	if 2*(n-1)+1 < w {
		out[2*(n-1)+1] = in[n-1]
	}
}

func fourToThree(dst, pix []byte, stride, w, h int) {
	for y := range h {
		out := dst[y*w*3 : (y+1)*w*3]
		row := pix[y*stride : y*stride+4*w]
		for x := range w {
			out[3*x], out[3*x+1], out[3*x+2] = row[4*x], row[4*x+1], row[4*x+2]
		}
	}
}

// libjpeg's YCbCr to RGB tables (jdcolor.c), so that Go's decoder converts as
// libjpeg-turbo does.
var crR, cbB, crG, cbG [256]int32

func init() {
	const half = 1 << 15
	fix := func(x float64) int32 { return int32(x*65536 + 0.5) }
	for i := range 256 {
		x := int32(i - 128)
		crR[i] = (fix(1.40200)*x + half) >> 16
		cbB[i] = (fix(1.77200)*x + half) >> 16
		crG[i] = -fix(0.71414) * x
		cbG[i] = -fix(0.34414)*x + half
	}
}

func ycbcrToRGB(out []byte, y, cb, cr uint8) {
	yy := int32(y)
	out[0] = clamp8(yy + crR[cr])
	out[1] = clamp8(yy + (cbG[cb]+crG[cr])>>16)
	out[2] = clamp8(yy + cbB[cb])
}

func clamp8(v int32) byte {
	if v < 0 {
		return 0
	}
	if v > 255 {
		return 255
	}
	return byte(v)
}
