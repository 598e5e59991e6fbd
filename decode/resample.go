package decode

import "math"

// The resampler is PIL's (Pillow 9's Resample.c) for 8-bit images and its bilinear
// filter, so that an image resized here is the image PIL resizes: the same taps,
// the same weights rounded to the same 22-bit fixed point, the horizontal pass
// first with its result rounded to 8 bits, then the vertical pass. It computes only
// the output pixels a crop keeps, and reads only the source rows they need.

// precisionBits is PIL's PRECISION_BITS for 8-bit images.
const precisionBits = 32 - 8 - 2

// axis is one axis's resampling taps for the outputs in a window: output i reads
// count[i] source pixels from start[i], weighted by w[i*ksize:].
type axis struct {
	ksize        int
	start, count []int32
	w            []int32
	identity     bool // each output is one source pixel (PIL skips such a pass)
	// The same taps, k for every output (0 when the axis is too short): an output
	// with fewer reads from further left, with zero weights first, so that a pass
	// needs no per-output tap count. The sums are the same integers.
	k      int
	kstart []int32
	kw     []int32
}

// set computes the taps as PIL's precompute_coeffs and normalize_coeffs_8bpc do,
// for a source axis whose pixels lo <= x < hi may be read, the source interval
// [in0, in1) resized to outSize, and the outputs o0 <= i < o0+n.
func (a *axis) set(lo, hi int, in0, in1 float64, outSize, o0, n int) {
	scale := (in1 - in0) / float64(outSize)
	filterscale := max(scale, 1)
	support := filterscale // the bilinear filter's support is 1
	a.ksize = int(math.Ceil(support))*2 + 1
	a.start = growInt32(a.start, n)
	a.count = growInt32(a.count, n)
	a.w = growInt32(a.w, n*a.ksize)
	clear(a.w)
	var k [64]float64
	kk := k[:0]
	if a.ksize > len(k) {
		kk = make([]float64, 0, a.ksize)
	}
	a.identity = in0 == float64(lo) && in1 == float64(hi) && hi-lo == outSize
	ss := 1 / filterscale
	for i := range n {
		center := in0 + (float64(o0+i)+0.5)*scale
		xmin := int(center - support + 0.5) // PIL's (int): towards zero
		xmin = max(xmin, lo)
		xmax := min(int(center+support+0.5), hi) - xmin
		if xmax < 1 { // a crop whose edge lies under no filter tap: the nearest pixel
			xmin, xmax = min(max(int(center), lo), hi-1), 1
		}
		kk = kk[:xmax]
		var ww float64
		for x := range xmax {
			t := (float64(x+xmin) - center + 0.5) * ss
			if t < 0 {
				t = -t
			}
			w := 0.0
			if t < 1 {
				w = 1 - t
			}
			kk[x] = w
			ww += w
		}
		row := a.w[i*a.ksize : i*a.ksize+xmax]
		for x, w := range kk {
			if ww != 0 {
				w /= ww
			}
			if w < 0 {
				row[x] = int32(-0.5 + w*(1<<precisionBits))
			} else {
				row[x] = int32(0.5 + w*(1<<precisionBits))
			}
		}
		a.start[i], a.count[i] = int32(xmin), int32(xmax)
	}
	a.pad(lo, hi)
}

// pad sets the fixed-count taps from start, count and w, for source pixels lo to
// hi; it leaves k 0 when k pixels do not fit between them.
func (a *axis) pad(lo, hi int) {
	n := len(a.start)
	a.k = 0
	for _, c := range a.count {
		a.k = max(a.k, int(c))
	}
	if hi-lo < a.k {
		a.k = 0
		return
	}
	a.kstart = growInt32(a.kstart, n)
	a.kw = growInt32(a.kw, n*a.k)
	clear(a.kw)
	for i := range n {
		s, c := int(a.start[i]), int(a.count[i])
		shift := 0
		if s+a.k > hi {
			shift = s + a.k - hi
		}
		a.kstart[i] = int32(s - shift)
		copy(a.kw[i*a.k+shift:], a.w[i*a.ksize:i*a.ksize+c])
	}
}

// span returns the source pixels the taps read: lo <= x < hi.
func (a *axis) span() (lo, hi int) {
	lo, hi = math.MaxInt, 0
	for i, s := range a.start {
		lo, hi = min(lo, int(s)), max(hi, int(s+a.count[i]))
	}
	if a.k > 0 {
		for _, s := range a.kstart {
			lo, hi = min(lo, int(s)), max(hi, int(s)+a.k)
		}
	}
	return lo, hi
}

// shift moves the taps by d source pixels: for a source whose first pixel is the
// pixel -d of the one they were set for.
func (a *axis) shift(d int) {
	for i := range a.start {
		a.start[i] += int32(d)
	}
	if a.k > 0 {
		for i := range a.kstart {
			a.kstart[i] += int32(d)
		}
	}
}

func growInt32(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}

// clip8 is PIL's clip8 for the bilinear filter: its weights are non-negative and
// their rounded sum is within k/2 of 1<<precisionBits, so a sum of bytes times them,
// plus the rounding half, lies in [0, 256<<precisionBits) and PIL's clamp never
// acts: the shift alone gives its result.
func clip8(v int32) byte { return byte(v >> precisionBits) }

// resampler resizes packed 8-bit RGB images, reusing its scratch between calls.
type resampler struct {
	h, v axis
	tmp  []byte
	// noVector keeps to the Go passes (the tests compare the vector passes with them).
	noVector bool
}

// resize resamples the RGB source src (rows stride bytes apart) into dst (n x m RGB
// pixels, packed, rows 3n bytes): the axes' windows as set in r.h (n outputs) and r.v
// (m outputs). flip mirrors the output left to right.
func (r *resampler) resize(dst, src []byte, stride int, flip bool) {
	n := len(r.h.start)
	// The source rows the vertical pass reads.
	y0, y1 := r.vrows()
	w := 3 * n
	rows, rowStride, rowBase := src[3*int(r.h.start[0]):], stride, 0
	if !r.h.identity || flip {
		// The horizontal pass, into rows y0 to y1 of tmp; it mirrors the row too.
		tmp := r.scratch(w * (y1 - y0))
		switch {
		case !r.noVector && horizontalAVX2(tmp, src, stride, y0, y1, &r.h, flip):
		case r.h.k == 3 || r.h.k == 4:
			horizontalRows3(tmp, src, stride, y0, y1, &r.h, flip)
		default:
			for y := y0; y < y1; y++ {
				horizontal3(tmp[(y-y0)*w:(y-y0+1)*w], src[y*stride:], &r.h, flip)
			}
		}
		rows, rowStride, rowBase = tmp, w, y0
	}
	r.finish(dst, rows, rowStride, rowBase)
}

// vrows returns the source rows the vertical pass reads: y0 <= y < y1.
func (r *resampler) vrows() (y0, y1 int) {
	y0 = int(r.v.start[0])
	for i := range r.v.start {
		y0 = min(y0, int(r.v.start[i]))
		y1 = max(y1, int(r.v.start[i]+r.v.count[i]))
	}
	return y0, y1
}

// scratch returns the horizontal pass's output buffer, n bytes.
func (r *resampler) scratch(n int) []byte {
	if cap(r.tmp) < n {
		r.tmp = make([]byte, n)
	}
	return r.tmp[:n]
}

// finish is resize's vertical pass into dst, from rows (stride bytes apart, the
// first being source row base) that hold what the horizontal pass gives, or the
// source itself where it has no horizontal pass.
func (r *resampler) finish(dst, rows []byte, stride, base int) {
	w := 3 * len(r.h.start)
	if r.v.identity {
		copyRows(dst, rows, w, stride, r.v.start, base)
		return
	}
	if !r.noVector && verticalAVX2(dst, rows, w, stride, base, &r.v) {
		return
	}
	for j := range r.v.start {
		k := r.v.w[j*r.v.ksize : j*r.v.ksize+int(r.v.count[j])]
		vertical(dst[j*w:(j+1)*w], rows, stride, int(r.v.start[j])-base, k)
	}
}

// copyRows copies the rows starts[j]-base of src into dst, w bytes each.
func copyRows(dst, src []byte, w, stride int, starts []int32, base int) {
	for j, y := range starts {
		o := (int(y) - base) * stride
		copy(dst[j*w:(j+1)*w], src[o:o+w])
	}
}

// horizontal3 is one row of PIL's horizontal pass for 3 channels, mirrored when
// flip, for the tap counts horizontalRows3 does not take (2, 5, or no fixed count).
func horizontal3(out, in []byte, a *axis, flip bool) {
	n := len(a.start)
	o, step := 0, 3
	if flip {
		o, step = 3*(n-1), -3
	}
	const half = int32(1 << (precisionBits - 1))
	switch a.k {
	case 2:
		for i, x := range a.kstart[:n] {
			p := in[3*x : 3*x+6 : 3*x+6]
			k := a.kw[2*i : 2*i+2 : 2*i+2]
			d := out[o : o+3 : o+3]
			d[0] = clip8(half + int32(p[0])*k[0] + int32(p[3])*k[1])
			d[1] = clip8(half + int32(p[1])*k[0] + int32(p[4])*k[1])
			d[2] = clip8(half + int32(p[2])*k[0] + int32(p[5])*k[1])
			o += step
		}
	case 5:
		for i, x := range a.kstart[:n] {
			p := in[3*x : 3*x+15 : 3*x+15]
			k := a.kw[5*i : 5*i+5 : 5*i+5]
			d := out[o : o+3 : o+3]
			d[0] = clip8(half + int32(p[0])*k[0] + int32(p[3])*k[1] + int32(p[6])*k[2] + int32(p[9])*k[3] + int32(p[12])*k[4])
			d[1] = clip8(half + int32(p[1])*k[0] + int32(p[4])*k[1] + int32(p[7])*k[2] + int32(p[10])*k[3] + int32(p[13])*k[4])
			d[2] = clip8(half + int32(p[2])*k[0] + int32(p[5])*k[1] + int32(p[8])*k[2] + int32(p[11])*k[3] + int32(p[14])*k[4])
			o += step
		}
	default:
		for i := range n {
			x := int(a.start[i]) * 3
			c := int(a.count[i])
			k := a.w[i*a.ksize : i*a.ksize+c : i*a.ksize+c]
			p := in[x : x+3*c : x+3*c]
			s0, s1, s2 := half, half, half
			for t, w := range k {
				q := p[3*t : 3*t+3 : 3*t+3]
				s0 += int32(q[0]) * w
				s1 += int32(q[1]) * w
				s2 += int32(q[2]) * w
			}
			d := out[o : o+3 : o+3]
			d[0], d[1], d[2] = clip8(s0), clip8(s1), clip8(s2)
			o += step
		}
	}
}

// horizontalRows3 is PIL's horizontal pass for 3 channels over rows y0 to y1 of
// src into tmp, for 3 or 4 taps an output: output by output, each output's taps
// loaded once for every row.
func horizontalRows3(tmp, src []byte, stride, y0, y1 int, a *axis, flip bool) {
	n := len(a.kstart)
	w := 3 * n
	const half = int32(1 << (precisionBits - 1))
	for i, x := range a.kstart {
		o := 3 * i
		if flip {
			o = 3 * (n - 1 - i)
		}
		in := src[y0*stride+3*int(x):]
		out := tmp[o:]
		rows := y1 - y0
		if a.k == 4 {
			k := a.kw[4*i : 4*i+4 : 4*i+4]
			k0, k1, k2, k3 := k[0], k[1], k[2], k[3]
			for y := range rows {
				p := in[y*stride : y*stride+12 : y*stride+12]
				d := out[y*w : y*w+3 : y*w+3]
				d[0] = clip8(half + int32(p[0])*k0 + int32(p[3])*k1 + int32(p[6])*k2 + int32(p[9])*k3)
				d[1] = clip8(half + int32(p[1])*k0 + int32(p[4])*k1 + int32(p[7])*k2 + int32(p[10])*k3)
				d[2] = clip8(half + int32(p[2])*k0 + int32(p[5])*k1 + int32(p[8])*k2 + int32(p[11])*k3)
			}
		} else {
			k := a.kw[3*i : 3*i+3 : 3*i+3]
			k0, k1, k2 := k[0], k[1], k[2]
			for y := range rows {
				p := in[y*stride : y*stride+9 : y*stride+9]
				d := out[y*w : y*w+3 : y*w+3]
				d[0] = clip8(half + int32(p[0])*k0 + int32(p[3])*k1 + int32(p[6])*k2)
				d[1] = clip8(half + int32(p[1])*k0 + int32(p[4])*k1 + int32(p[7])*k2)
				d[2] = clip8(half + int32(p[2])*k0 + int32(p[5])*k1 + int32(p[8])*k2)
			}
		}
	}
}

// vertical is one output row of PIL's vertical pass: out[x] = sum over taps t of
// rows[(first+t)*stride + x] * k[t], each of the len(out) bytes independently
// (channels interleaved).
func vertical(out, rows []byte, stride, first int, k []int32) {
	w := len(out)
	base := first * stride
	switch {
	case len(k) == 2:
		r0, r1 := rows[base:base+w], rows[base+stride:base+stride+w]
		k0, k1 := k[0], k[1]
		for x := range out {
			out[x] = clip8(1<<(precisionBits-1) + int32(r0[x])*k0 + int32(r1[x])*k1)
		}
	case len(k) == 3:
		r0, r1, r2 := rows[base:base+w], rows[base+stride:base+stride+w], rows[base+2*stride:base+2*stride+w]
		k0, k1, k2 := k[0], k[1], k[2]
		for x := range out {
			out[x] = clip8(1<<(precisionBits-1) + int32(r0[x])*k0 + int32(r1[x])*k1 + int32(r2[x])*k2)
		}
	case len(k) == 4:
		r0, r1, r2, r3 := rows[base:base+w], rows[base+stride:base+stride+w], rows[base+2*stride:base+2*stride+w], rows[base+3*stride:base+3*stride+w]
		k0, k1, k2, k3 := k[0], k[1], k[2], k[3]
		for x := range out {
			out[x] = clip8(1<<(precisionBits-1) + int32(r0[x])*k0 + int32(r1[x])*k1 + int32(r2[x])*k2 + int32(r3[x])*k3)
		}
	default:
		var acc [4096]int32
		for x0 := 0; x0 < w; x0 += len(acc) {
			seg := acc[:min(len(acc), w-x0)]
			for x := range seg {
				seg[x] = 1 << (precisionBits - 1)
			}
			for t, kt := range k {
				r := rows[base+t*stride+x0 : base+t*stride+x0+len(seg)]
				for x, v := range r {
					seg[x] += int32(v) * kt
				}
			}
			for x, s := range seg {
				out[x0+x] = clip8(s)
			}
		}
	}
}
