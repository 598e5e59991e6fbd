package decode

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// ErrBadImage means an image member could not be decoded: not a JPEG, PNG, WebP or
// GIF image, truncated, corrupt, or larger than the field's MaxBytes once decoded.
var ErrBadImage = errors.New("decode: bad image")

// ImageOptions are the transforms of an image field, in the order they apply:
// decode to RGB, crop and resize (center crop, or random-resized crop), flip, and
// for float outputs scale to [0, 1] and normalise. Resizing is bilinear with PIL's
// antialiasing: a downscale averages every source pixel under the filter, as
// PIL's Image.resize(size, Image.BILINEAR) and torchvision's transforms on PIL
// images do.
//
// The zero value is the evaluation transform: resize the shorter side to the
// crop's larger side, then center-crop.
type ImageOptions struct {
	// Resize (center crop only) is the length the shorter side is resized to before
	// the center crop, as torchvision's Resize(Resize) then CenterCrop: the longer
	// side becomes int(Resize * long / short); the crop's top-left corner is the
	// rounded half of the difference. 0 means the crop's larger side. It must be at
	// least the crop's larger side.
	Resize int
	// RandomCrop selects torchvision's RandomResizedCrop instead of the center crop:
	// a region of a random fraction of the area (Scale) and aspect ratio (Ratio,
	// drawn log-uniformly) at a random place, resized to the output's size; ten tries,
	// then a center crop of the largest region within Ratio.
	RandomCrop bool
	// Scale is the range of the random crop's area fraction; zero means 0.08 to 1.
	Scale [2]float64
	// Ratio is the range of the random crop's aspect ratio (width/height); zero means
	// 3/4 to 4/3.
	Ratio [2]float64
	// Flip mirrors an image left to right with probability 1/2.
	Flip bool
	// Mean and Std normalise float outputs per channel: (x/255 - Mean) / Std. A zero
	// Std means no normalisation (x/255). Only for float16 and float32 outputs.
	Mean, Std [3]float64
	// FullDecode turns off decoding JPEGs at a reduced scale (libjpeg-turbo only).
	// By default a JPEG whose crop region is at least four times the output's size
	// on both axes is decoded at 1/2, 1/4 or 1/8 of its size in the DCT: the
	// smallest that leaves at least twice the output's pixels a side, so that the
	// resize still averages two or more pixels into one. This is much faster on
	// large photos and within a level or two of PIL's pixels (see the README);
	// without it the pixels are PIL's.
	FullDecode bool
}

// The ImageNet statistics, what the option "imagenet" sets.
var (
	ImageNetMean = [3]float64{0.485, 0.456, 0.406}
	ImageNetStd  = [3]float64{0.229, 0.224, 0.225}
)

// ParseImageOptions parses the OPTIONS part of an image field spec: a
// comma-separated list of
//
//	resize=N          center crop after resizing the shorter side to N
//	random-crop       random-resized crop (RandomCrop)
//	scale=A-B         its area fraction range (default 0.08-1)
//	ratio=A-B         its aspect ratio range (default 0.75-1.3333333333333333)
//	flip              random horizontal flip
//	mean=R/G/B        per-channel mean, float outputs (one value for grayscale)
//	std=R/G/B         per-channel standard deviation, float outputs
//	imagenet          mean=0.485/0.456/0.406,std=0.229/0.224/0.225
//	full-decode       never decode a JPEG at a reduced scale
//
// Whether the options fit the field's dtype and shape is checked by Validate.
func ParseImageOptions(s string) (ImageOptions, error) {
	var o ImageOptions
	bad := func(format string, args ...any) (ImageOptions, error) {
		return ImageOptions{}, &sentinelError{ErrInvalidField, "decode: image options " + strconv.Quote(s) + ": " + fmt.Sprintf(format, args...)}
	}
	seen := map[string]bool{}
	for opt := range strings.SplitSeq(s, ",") {
		name, val, hasVal := strings.Cut(opt, "=")
		if seen[name] {
			return bad("%s given twice", name)
		}
		seen[name] = true
		wantVal := name == "resize" || name == "scale" || name == "ratio" || name == "mean" || name == "std"
		if hasVal != wantVal {
			if wantVal {
				return bad("%s needs a value (%s=...)", name, name)
			}
			if name == "random-crop" || name == "flip" || name == "imagenet" || name == "full-decode" {
				return bad("%s takes no value", name)
			}
		}
		var err error
		switch name {
		case "resize":
			o.Resize, err = strconv.Atoi(val)
			if err != nil || o.Resize <= 0 || o.Resize > 1<<16 {
				return bad("bad resize %q (want a positive size in pixels)", val)
			}
		case "random-crop":
			o.RandomCrop = true
		case "scale":
			if o.Scale, err = parseRange(val); err != nil {
				return bad("bad scale %q: %v", val, err)
			}
		case "ratio":
			if o.Ratio, err = parseRange(val); err != nil {
				return bad("bad ratio %q: %v", val, err)
			}
		case "flip":
			o.Flip = true
		case "mean", "std":
			v, err := parseTriple(val)
			if err != nil {
				return bad("bad %s %q: %v", name, val, err)
			}
			if name == "mean" {
				o.Mean = v
			} else {
				o.Std = v
			}
		case "imagenet":
			if seen["mean"] || seen["std"] {
				return bad("imagenet sets mean and std: give one or the other")
			}
			o.Mean, o.Std = ImageNetMean, ImageNetStd
			seen["mean"], seen["std"] = true, true
		case "full-decode":
			o.FullDecode = true
		case "":
			return bad("empty option")
		default:
			return bad("unknown option %q (want resize=N, random-crop, scale=A-B, ratio=A-B, flip, mean=R/G/B, std=R/G/B, imagenet or full-decode)", name)
		}
	}
	return o, nil
}

func parseRange(s string) ([2]float64, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return [2]float64{}, errors.New("want A-B")
	}
	x, err1 := strconv.ParseFloat(a, 64)
	y, err2 := strconv.ParseFloat(b, 64)
	if err1 != nil || err2 != nil || math.IsNaN(x) || math.IsNaN(y) || math.IsInf(x, 0) || math.IsInf(y, 0) {
		return [2]float64{}, errors.New("want two numbers A-B")
	}
	return [2]float64{x, y}, nil
}

func parseTriple(s string) ([3]float64, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 1 && len(parts) != 3 {
		return [3]float64{}, errors.New("want one value or three separated by /")
	}
	var v [3]float64
	for i, p := range parts {
		x, err := strconv.ParseFloat(p, 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return [3]float64{}, fmt.Errorf("%q is not a number", p)
		}
		v[i] = x
	}
	if len(parts) == 1 {
		v[1], v[2] = v[0], v[0]
	}
	return v, nil
}

// String returns the options in ParseImageOptions' syntax; "" for the zero value.
func (o ImageOptions) String() string {
	var opts []string
	if o.Resize != 0 {
		opts = append(opts, "resize="+strconv.Itoa(o.Resize))
	}
	if o.RandomCrop {
		opts = append(opts, "random-crop")
	}
	fmtF := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	if o.Scale != ([2]float64{}) {
		opts = append(opts, "scale="+fmtF(o.Scale[0])+"-"+fmtF(o.Scale[1]))
	}
	if o.Ratio != ([2]float64{}) {
		opts = append(opts, "ratio="+fmtF(o.Ratio[0])+"-"+fmtF(o.Ratio[1]))
	}
	if o.Flip {
		opts = append(opts, "flip")
	}
	if o.Mean == ImageNetMean && o.Std == ImageNetStd {
		opts = append(opts, "imagenet")
	} else {
		triple := func(v [3]float64) string { return fmtF(v[0]) + "/" + fmtF(v[1]) + "/" + fmtF(v[2]) }
		if o.Mean != ([3]float64{}) {
			opts = append(opts, "mean="+triple(o.Mean))
		}
		if o.Std != ([3]float64{}) {
			opts = append(opts, "std="+triple(o.Std))
		}
	}
	if o.FullDecode {
		opts = append(opts, "full-decode")
	}
	return strings.Join(opts, ",")
}

// imageLayout reads an image field's shape: height, width, channels, and whether
// the channels come first (CHW).
func imageLayout(shape []int) (h, w, c int, chw, ok bool) {
	if len(shape) != 3 {
		return 0, 0, 0, false, false
	}
	switch {
	case shape[2] == 3 || shape[2] == 1:
		return shape[0], shape[1], shape[2], false, true
	case shape[0] == 3 || shape[0] == 1:
		return shape[1], shape[2], shape[0], true, true
	}
	return 0, 0, 0, false, false
}

// checkImage returns what is wrong with an image field, or "".
func (f *Field) checkImage() string {
	if f.DType != Uint8 && f.DType != Float16 && f.DType != Float32 {
		return "an image's dtype must be uint8, float16 or float32, not " + strconv.Quote(f.DType.Name())
	}
	h, w, c, _, ok := imageLayout(f.Shape)
	if !ok {
		return "an image's shape must be HxWx3, 3xHxW, HxWx1 or 1xHxW, not " + FormatShape(f.Shape)
	}
	if h <= 0 || w <= 0 || h > 1<<16 || w > 1<<16 {
		return "image size " + FormatShape(f.Shape) + " out of range (1 to 65536 pixels a side)"
	}
	o := &f.Image
	if o.RandomCrop && o.Resize != 0 {
		return "resize applies to the center crop, not random-crop (which resizes its region to the output)"
	}
	if o.Resize != 0 && o.Resize < max(h, w) {
		return fmt.Sprintf("resize=%d is smaller than the %dx%d crop", o.Resize, h, w)
	}
	if !o.RandomCrop && (o.Scale != [2]float64{} || o.Ratio != [2]float64{}) {
		return "scale and ratio apply to random-crop"
	}
	if o.Scale != ([2]float64{}) && !(o.Scale[0] > 0 && o.Scale[0] <= o.Scale[1] && o.Scale[1] <= 1) {
		return "scale must be A-B with 0 < A <= B <= 1"
	}
	if o.Ratio != ([2]float64{}) && !(o.Ratio[0] > 0 && o.Ratio[0] <= o.Ratio[1]) {
		return "ratio must be A-B with 0 < A <= B"
	}
	norm := o.Mean != [3]float64{} || o.Std != [3]float64{}
	if norm && f.DType == Uint8 {
		return "mean and std need a float dtype (float16 or float32), not uint8"
	}
	if norm && o.Std == ([3]float64{}) {
		return "mean needs std"
	}
	if o.Std != ([3]float64{}) {
		for _, s := range o.Std[:c] {
			if s <= 0 {
				return "std must be positive"
			}
		}
	}
	if c == 1 && (o.Mean[1] != o.Mean[0] || o.Mean[2] != o.Mean[0] || o.Std[1] != o.Std[0] || o.Std[2] != o.Std[0]) {
		return "a grayscale image takes one mean and one std"
	}
	if f.MaxBytes < 0 {
		return "negative MaxBytes"
	}
	return ""
}

// SampleSeed returns the seed of one sample's random transforms: a hash of the
// job's seed, the epoch and the sample's key, so that a sample gets the same
// random crop and flip in an epoch however the epoch is read (on any rank, resumed
// or not) and another one in the next epoch. Samples with the same key get the same
// transforms.
func SampleSeed(seed uint64, epoch int, key string) uint64 {
	h := xxhash.Sum64String(key)
	return mix64(mix64(seed^0x5bd1e9955bd1e995) ^ mix64(uint64(epoch)+0x9e3779b97f4a7c15) ^ h)
}

// mix64 is splitmix64's finaliser.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// rng is splitmix64: small, fast, and good enough to draw crops.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

// float returns a uniform float64 in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) / (1 << 53) }

// uniform returns a uniform float64 in [a, b).
func (r *rng) uniform(a, b float64) float64 { return a + (b-a)*r.float() }

// intn returns a uniform int in [0, n), n > 0.
func (r *rng) intn(n int) int {
	hi, _ := mulUint64(r.next(), uint64(n))
	return int(hi)
}

func mulUint64(a, b uint64) (hi, lo uint64) {
	const mask32 = 1<<32 - 1
	a0, a1 := a&mask32, a>>32
	b0, b1 := b&mask32, b>>32
	w0 := a0 * b0
	t := a1*b0 + w0>>32
	w1 := t&mask32 + a0*b1
	return a1*b1 + t>>32 + w1>>32, a * b
}

// region is a crop of the source image and the size it is resized to: the source
// rectangle (X, Y, W, H), resized to OW x OH, of which the output is the window at
// (WX, WY) of the output's size.
type region struct {
	X, Y, W, H int
	OW, OH     int
	WX, WY     int
}

// geometry places the crop of an iw x ih image for an output of oh x ow, as
// torchvision's Resize + CenterCrop or RandomResizedCrop do on PIL images.
func (o *ImageOptions) geometry(iw, ih, ow, oh int, r *rng) region {
	if o.RandomCrop {
		x, y, w, h := o.randomCrop(iw, ih, r)
		return region{X: x, Y: y, W: w, H: h, OW: ow, OH: oh}
	}
	size := o.Resize
	if size == 0 {
		size = max(ow, oh)
	}
	// torchvision's _compute_resized_output_size: the short side becomes size, the
	// long one int(size * long / short).
	rw, rh := size, size
	if iw < ih {
		rh = int(float64(size) * float64(ih) / float64(iw))
	} else if ih < iw {
		rw = int(float64(size) * float64(iw) / float64(ih))
	}
	// CenterCrop: int(round((resized - crop) / 2.0)), Python's round (half to even).
	return region{W: iw, H: ih, OW: rw, OH: rh,
		WX: int(math.RoundToEven(float64(rw-ow) / 2)), WY: int(math.RoundToEven(float64(rh-oh) / 2))}
}

// randomCrop is torchvision's RandomResizedCrop.get_params.
func (o *ImageOptions) randomCrop(iw, ih int, r *rng) (x, y, w, h int) {
	scale, ratio := o.Scale, o.Ratio
	if scale == ([2]float64{}) {
		scale = [2]float64{0.08, 1}
	}
	if ratio == ([2]float64{}) {
		ratio = [2]float64{3.0 / 4, 4.0 / 3}
	}
	area := float64(iw * ih)
	lo, hi := math.Log(ratio[0]), math.Log(ratio[1])
	for range 10 {
		target := area * r.uniform(scale[0], scale[1])
		aspect := math.Exp(r.uniform(lo, hi))
		w := int(math.RoundToEven(math.Sqrt(target * aspect)))
		h := int(math.RoundToEven(math.Sqrt(target / aspect)))
		if w > 0 && w <= iw && h > 0 && h <= ih {
			y := r.intn(ih - h + 1)
			x := r.intn(iw - w + 1)
			return x, y, w, h
		}
	}
	in := float64(iw) / float64(ih)
	switch {
	case in < ratio[0]:
		w = iw
		h = int(math.RoundToEven(float64(w) / ratio[0]))
	case in > ratio[1]:
		h = ih
		w = int(math.RoundToEven(float64(h) * ratio[1]))
	default:
		w, h = iw, ih
	}
	return (iw - w) / 2, (ih - h) / 2, w, h
}
