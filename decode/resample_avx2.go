//go:build amd64 && cgo

package decode

/*
#cgo CFLAGS: -O2
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static int sl_have_avx2(void) {
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2");
}

// sl_hpass is PIL's horizontal pass for 3 channels, as horizontal3 and
// horizontalRows3 compute it, on rows rows of src (rows stride bytes apart, its
// first pixel the image's column x0) into tmp (rows w bytes apart): output i of a
// row is the sum over its k taps t of the pixel kstart[i]+t times kw[i*k+t], plus
// half, shifted right by 22, each channel on its own; mirrored when flip. Eight
// rows at a time: a gather reads the pixel of each tap from the eight rows at once
// (four bytes each, the next pixel's first byte too: src must hold one byte after
// the last pixel read).
__attribute__((target("avx2")))
static void sl_hpass(uint8_t *tmp, int w, const uint8_t *src, int stride, int rows,
                     const int32_t *kstart, const int32_t *kw, int n, int k, int flip, int x0) {
	const int32_t half = 1 << 21;
	const __m256i offs = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride));
	const __m256i mask = _mm256_set1_epi32(0xff);
	int y = 0;
	for (; y + 8 <= rows; y += 8) {
		const uint8_t *base = src + (size_t)y * stride;
		uint8_t *out = tmp + (size_t)y * w;
		for (int i = 0; i < n; i++) {
			const uint8_t *p = base + 3 * (size_t)(kstart[i] - x0);
			const int32_t *kk = kw + (size_t)i * k;
			__m256i r = _mm256_set1_epi32(half), g = r, b = r;
			for (int t = 0; t < k; t++) {
				__m256i v = _mm256_i32gather_epi32((const int *)(p + 3 * t), offs, 1);
				__m256i kt = _mm256_set1_epi32(kk[t]);
				r = _mm256_add_epi32(r, _mm256_mullo_epi32(_mm256_and_si256(v, mask), kt));
				g = _mm256_add_epi32(g, _mm256_mullo_epi32(_mm256_and_si256(_mm256_srli_epi32(v, 8), mask), kt));
				b = _mm256_add_epi32(b, _mm256_mullo_epi32(_mm256_and_si256(_mm256_srli_epi32(v, 16), mask), kt));
			}
			r = _mm256_and_si256(_mm256_srli_epi32(r, 22), mask);
			g = _mm256_and_si256(_mm256_srli_epi32(g, 22), mask);
			b = _mm256_and_si256(_mm256_srli_epi32(b, 22), mask);
			__m256i px = _mm256_or_si256(r, _mm256_or_si256(_mm256_slli_epi32(g, 8), _mm256_slli_epi32(b, 16)));
			uint32_t a[8];
			_mm256_storeu_si256((__m256i *)a, px);
			uint8_t *d = out + (flip ? 3 * (n - 1 - i) : 3 * i);
			for (int j = 0; j < 8; j++) memcpy(d + (size_t)j * w, &a[j], 3);
		}
	}
	for (; y < rows; y++) {
		const uint8_t *row = src + (size_t)y * stride;
		uint8_t *out = tmp + (size_t)y * w;
		for (int i = 0; i < n; i++) {
			const uint8_t *p = row + 3 * (size_t)(kstart[i] - x0);
			const int32_t *kk = kw + (size_t)i * k;
			int32_t s0 = half, s1 = half, s2 = half;
			for (int t = 0; t < k; t++) {
				s0 += (int32_t)p[3 * t] * kk[t];
				s1 += (int32_t)p[3 * t + 1] * kk[t];
				s2 += (int32_t)p[3 * t + 2] * kk[t];
			}
			uint8_t *d = out + (flip ? 3 * (n - 1 - i) : 3 * i);
			d[0] = (uint8_t)(s0 >> 22);
			d[1] = (uint8_t)(s1 >> 22);
			d[2] = (uint8_t)(s2 >> 22);
		}
	}
}

// sl_hctx is what sl_hstrip needs: the horizontal pass's taps and where its rows y0
// to y1 (of a partial decode's region) go, w bytes each.
typedef struct {
	uint8_t *tmp;
	const int32_t *kstart, *kw;
	int w, y0, y1, n, k, flip;
} sl_hctx;

// sl_hstrip is a strip function for the turbojpeg package's DecodeRegionStrips:
// the horizontal pass of the strip's rows that lie between y0 and y1, while the
// decoder's output is in the caches. Only given where AVX2 is.
static void sl_hstrip(void *c, const unsigned char *rows, int y, int nr, int pitch, int x0) {
	const sl_hctx *h = (const sl_hctx *)c;
	int a = y > h->y0 ? y : h->y0, b = y + nr < h->y1 ? y + nr : h->y1;
	if (a >= b) return;
	sl_hpass(h->tmp + (size_t)(a - h->y0) * h->w, h->w, rows + (size_t)(a - y) * pitch, pitch, b - a,
	         h->kstart, h->kw, h->n, h->k, h->flip, x0);
}

static void *sl_hstrip_fn(void) { return (void *)sl_hstrip; }

// sl_vpass is PIL's vertical pass, as vertical computes it, for the m output rows of
// w bytes: row j is the sum over its count[j] taps t of the row start[j]-base+t of
// rows (stride bytes apart) times wts[j*ksize+t], plus half, shifted right by 22,
// byte by byte; sixteen bytes at a time.
__attribute__((target("avx2")))
static void sl_vpass(uint8_t *dst, int w, int m, const uint8_t *rows, int stride, int base,
                     const int32_t *start, const int32_t *count, const int32_t *wts, int ksize) {
	const int32_t half = 1 << 21;
	const __m256i mask = _mm256_set1_epi32(0xff);
	for (int j = 0; j < m; j++) {
		const uint8_t *first = rows + (size_t)(start[j] - base) * stride;
		const int32_t *k = wts + (size_t)j * ksize;
		int c = count[j];
		uint8_t *out = dst + (size_t)j * w;
		int x = 0;
		for (; x + 16 <= w; x += 16) {
			__m256i a0 = _mm256_set1_epi32(half), a1 = a0;
			for (int t = 0; t < c; t++) {
				__m128i v = _mm_loadu_si128((const __m128i *)(first + (size_t)t * stride + x));
				__m256i kt = _mm256_set1_epi32(k[t]);
				a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(v), kt));
				a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)), kt));
			}
			a0 = _mm256_and_si256(_mm256_srli_epi32(a0, 22), mask);
			a1 = _mm256_and_si256(_mm256_srli_epi32(a1, 22), mask);
			// 32 to 16 bits, per 128-bit lane: a0's 4 low, a1's 4 low, a0's 4 high, a1's 4 high.
			__m256i p16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(a0, a1), 0xD8);
			__m128i p8 = _mm_packus_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
			_mm_storeu_si128((__m128i *)(out + x), p8);
		}
		for (; x < w; x++) {
			int32_t s = half;
			for (int t = 0; t < c; t++) s += (int32_t)first[(size_t)t * stride + x] * k[t];
			out[x] = (uint8_t)(s >> 22);
		}
	}
}
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// haveAVX2 is whether the resampler's passes run as AVX2 vector code (in C, the
// same integer arithmetic, so the same bytes as the Go passes).
var haveAVX2 = C.sl_have_avx2() != 0

// horizontalAVX2 is horizontalRows3 for any fixed tap count a.k, over rows y0 to
// y1 of src into tmp; it returns false, doing nothing, when src does not hold the
// byte after the last pixel read (its gathers read four bytes a pixel).
func horizontalAVX2(tmp, src []byte, stride, y0, y1 int, a *axis, flip bool) bool {
	n := len(a.kstart)
	w := 3 * n
	rows := y1 - y0
	if !haveAVX2 || a.k == 0 || n == 0 || rows <= 0 || len(tmp) < w*rows {
		return false
	}
	hi := 0
	for _, x := range a.kstart {
		hi = max(hi, int(x))
	}
	if int(a.kstart[0]) < 0 || len(a.kw) < n*a.k {
		return false
	}
	src = src[y0*stride:]
	if last := (rows-1)*stride + 3*(hi+a.k-1) + 4; last > cap(src) {
		return false
	}
	f := 0
	if flip {
		f = 1
	}
	C.sl_hpass((*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(tmp))), C.int(w),
		(*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(src))), C.int(stride), C.int(rows),
		(*C.int32_t)(unsafe.Pointer(unsafe.SliceData(a.kstart))), (*C.int32_t)(unsafe.Pointer(unsafe.SliceData(a.kw))),
		C.int(n), C.int(a.k), C.int(f), 0)
	runtime.KeepAlive(tmp)
	runtime.KeepAlive(src)
	runtime.KeepAlive(a)
	return true
}

// hstrip is the horizontal pass run strip by strip as a partial JPEG decode makes
// its rows (turbojpeg.Regions.DecodeRegionStrips): rows the pass reads right after
// they are decoded, not after the whole region has left the caches.
type hstrip struct {
	ctx *C.sl_hctx // C's view of the pass; its Go pointers are pinned while in use
	pin runtime.Pinner
}

// start readies the horizontal pass of a's taps (source columns in the image's
// coordinates), mirrored when flip, of rows y0 to y1 of a region into tmp (3 bytes
// an output a row): it returns the C function and context DecodeRegionStrips
// takes, or nils when the vector pass cannot run it. done must follow.
func (h *hstrip) start(tmp []byte, y0, y1 int, a *axis, flip bool) (fn, ctx unsafe.Pointer) {
	n := len(a.kstart)
	if !haveAVX2 || a.k == 0 || n == 0 || y1 <= y0 || len(tmp) < 3*n*(y1-y0) || len(a.kw) < n*a.k {
		return nil, nil
	}
	if h.ctx == nil {
		h.ctx = new(C.sl_hctx)
	}
	h.pin.Pin(unsafe.SliceData(tmp))
	h.pin.Pin(unsafe.SliceData(a.kstart))
	h.pin.Pin(unsafe.SliceData(a.kw))
	f := 0
	if flip {
		f = 1
	}
	*h.ctx = C.sl_hctx{
		tmp:    (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(tmp))),
		kstart: (*C.int32_t)(unsafe.Pointer(unsafe.SliceData(a.kstart))),
		kw:     (*C.int32_t)(unsafe.Pointer(unsafe.SliceData(a.kw))),
		w:      C.int(3 * n), y0: C.int(y0), y1: C.int(y1), n: C.int(n), k: C.int(a.k), flip: C.int(f),
	}
	return C.sl_hstrip_fn(), unsafe.Pointer(h.ctx)
}

// done ends what start began.
func (h *hstrip) done() {
	if h.ctx != nil {
		*h.ctx = C.sl_hctx{}
	}
	h.pin.Unpin()
}

// verticalAVX2 is the vertical pass of every output row: dst's rows of w bytes from
// rows (stride bytes apart, the first being source row base), with the taps of a. It
// returns false, doing nothing, when AVX2 is not there or the taps read outside
// rows.
func verticalAVX2(dst, rows []byte, w, stride, base int, a *axis) bool {
	m := len(a.start)
	if !haveAVX2 || m == 0 || len(dst) < w*m || len(a.w) < m*a.ksize {
		return false
	}
	for j, s := range a.start {
		c := int(a.count[j])
		if int(s)-base < 0 || c < 1 || c > a.ksize || (int(s)-base+c-1)*stride+w > len(rows) {
			return false
		}
	}
	C.sl_vpass((*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(dst))), C.int(w), C.int(m),
		(*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(rows))), C.int(stride), C.int(base),
		(*C.int32_t)(unsafe.Pointer(unsafe.SliceData(a.start))), (*C.int32_t)(unsafe.Pointer(unsafe.SliceData(a.count))),
		(*C.int32_t)(unsafe.Pointer(unsafe.SliceData(a.w))), C.int(a.ksize))
	runtime.KeepAlive(dst)
	runtime.KeepAlive(rows)
	runtime.KeepAlive(a)
	return true
}
