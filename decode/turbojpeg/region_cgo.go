//go:build linux && cgo

package turbojpeg

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

// libjpeg's 6.2 ABI (jpeglib.h with JPEG_LIB_VERSION 62, as libjpeg-turbo builds
// libjpeg.so.62) on LP64 Linux: the sizes of its decompressor and error manager and
// the offsets of the fields used. jpeg_CreateDecompress checks the structure's size,
// so a library of another layout refuses to start rather than being misused.
#define SL_CINFO_SIZE 632
#define SL_ERRMGR_SIZE 168
#define SL_OFF_OUT_COLOR_SPACE 64
#define SL_OFF_SCALE_NUM 68
#define SL_OFF_SCALE_DENOM 72
#define SL_OFF_OUTPUT_WIDTH 136
#define SL_OFF_OUTPUT_HEIGHT 140
#define SL_OFF_OUTPUT_SCANLINE 168
#define SL_ERR_ERROR_EXIT 0
#define SL_ERR_EMIT_MESSAGE 8
#define SL_ERR_FORMAT_MESSAGE 24
#define SL_JCS_RGB 2
#define SL_JMSG_LENGTH_MAX 200

enum {
	SL_RG_ERROR = -1,    // libjpeg failed: the message is in msg
	SL_RG_WARNING = -2,  // libjpeg warned (corrupt or truncated data): the message is in msg
	SL_RG_SIZE = -3      // the image's scaled size is not the one asked for
};

typedef struct {
	void *lib;
	void *(*std_error)(void *);
	void (*CreateDecompress)(void *, int, size_t);
	void (*mem_src)(void *, const unsigned char *, unsigned long);
	int (*read_header)(void *, int);
	int (*start_decompress)(void *);
	void (*crop_scanline)(void *, unsigned int *, unsigned int *);
	unsigned int (*skip_scanlines)(void *, unsigned int);
	unsigned int (*read_scanlines)(void *, unsigned char **, unsigned int);
	int (*finish_decompress)(void *);
	void (*abort_decompress)(void *);
	void (*destroy_decompress)(void *);
} sl_jl;

static void *sl_jl_sym(sl_jl *t, const char *name, const char **missing) {
	void *p = dlsym(t->lib, name);
	if (!p && !*missing) *missing = name;
	return p;
}

// sl_jl_open loads path and resolves every function; on failure it returns NULL and
// sets *why.
static sl_jl *sl_jl_open(const char *path, const char **why) {
	if (sizeof(void *) != 8) { *why = "only 64-bit builds know libjpeg's structures"; return NULL; }
	sl_jl *t = calloc(1, sizeof *t);
	if (!t) { *why = "out of memory"; return NULL; }
	t->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!t->lib) { *why = dlerror(); free(t); return NULL; }
	const char *m = NULL;
	t->std_error = sl_jl_sym(t, "jpeg_std_error", &m);
	t->CreateDecompress = sl_jl_sym(t, "jpeg_CreateDecompress", &m);
	t->mem_src = sl_jl_sym(t, "jpeg_mem_src", &m);
	t->read_header = sl_jl_sym(t, "jpeg_read_header", &m);
	t->start_decompress = sl_jl_sym(t, "jpeg_start_decompress", &m);
	t->crop_scanline = sl_jl_sym(t, "jpeg_crop_scanline", &m);
	t->skip_scanlines = sl_jl_sym(t, "jpeg_skip_scanlines", &m);
	t->read_scanlines = sl_jl_sym(t, "jpeg_read_scanlines", &m);
	t->finish_decompress = sl_jl_sym(t, "jpeg_finish_decompress", &m);
	t->abort_decompress = sl_jl_sym(t, "jpeg_abort_decompress", &m);
	t->destroy_decompress = sl_jl_sym(t, "jpeg_destroy_decompress", &m);
	if (m) { *why = m; dlclose(t->lib); free(t); return NULL; }
	return t;
}

// sl_jerr is the error manager: libjpeg's, then where error_exit jumps to, the
// message that ended the decode and the skippable warning decoded through.
typedef struct {
	_Alignas(16) unsigned char pub[SL_ERRMGR_SIZE];
	jmp_buf jb;
	int warned;
	char msg[SL_JMSG_LENGTH_MAX];
	char soft[SL_JMSG_LENGTH_MAX];
} sl_jerr;

#define SL_FIELD(p, off, type) (*(type *)((unsigned char *)(p) + (off)))
typedef void (*sl_format_fn)(void *, char *);
typedef void (*sl_exit_fn)(void *);
typedef void (*sl_emit_fn)(void *, int);

static void sl_jerr_format(void *cinfo, sl_jerr *e) {
	sl_format_fn format = SL_FIELD(e->pub, SL_ERR_FORMAT_MESSAGE, sl_format_fn);
	format(cinfo, e->msg);
}

static void sl_jerr_exit(void *cinfo) {
	sl_jerr *e = *(sl_jerr **)cinfo; // cinfo->err, the first field
	sl_jerr_format(cinfo, e);
	longjmp(e->jb, 1);
}

// sl_jl_extraneous and sl_jl_skippable are extraneousWarning and skippableWarning
// in C.
static int sl_jl_extraneous(const char *msg) { return strstr(msg, "extraneous bytes before marker") != NULL; }
static int sl_jl_skippable(const char *msg) { return sl_jl_extraneous(msg) || strncmp(msg, "Warning:", 8) == 0; }

// sl_jerr_emit takes a warning (level -1) that is not skippable as the end of the
// decode, with the warning's message. A skippable one is recorded, an extraneous
// bytes warning over a note, and the decode goes on. Trace messages (levels >= 0)
// are dropped.
static void sl_jerr_emit(void *cinfo, int level) {
	if (level >= 0) return;
	sl_jerr *e = *(sl_jerr **)cinfo;
	char buf[SL_JMSG_LENGTH_MAX];
	sl_format_fn format = SL_FIELD(e->pub, SL_ERR_FORMAT_MESSAGE, sl_format_fn);
	format(cinfo, buf);
	if (sl_jl_skippable(buf)) {
		if (!e->soft[0] || (sl_jl_extraneous(buf) && !sl_jl_extraneous(e->soft))) memcpy(e->soft, buf, sizeof buf);
		return;
	}
	e->warned = 1;
	memcpy(e->msg, buf, sizeof buf);
	longjmp(e->jb, 1);
}

// sl_jl_region decodes the rows y to y+h and at least the columns x to x+w of jpeg,
// scaled by 1/den, as RGB into dst, rows packed. jpeg_crop_scanline widens the
// columns to the left to an iMCU boundary: *ox and *ow are the columns decoded. The
// image's scaled size must be width x height.
// sl_rg is sl_jl_region's result, returned by value: out-parameters in Go memory
// would be allocated on the heap for every call.
typedef struct {
	int rc, ox, ow;
	char msg[SL_JMSG_LENGTH_MAX];
} sl_rg;

// sl_strip_fn takes the rows y to y+n of the region (0 its first), pitch bytes apart
// from rows, whose first column is the image's column ox; ctx is the caller's.
typedef void (*sl_strip_fn)(void *ctx, const unsigned char *rows, int y, int n, int pitch, int ox);

static int sl_jl_region1(sl_jl *t, const unsigned char *jpeg, unsigned long n, unsigned char *dst,
                        int width, int height, int den, int x, int y, int w, int h, int *ox, int *ow, char *msg,
                        sl_strip_fn fn, void *ctx, int strip);

static sl_rg sl_jl_region(sl_jl *t, const unsigned char *jpeg, unsigned long n, unsigned char *dst,
                          int width, int height, int den, int x, int y, int w, int h,
                          void *fn, void *ctx, int strip) {
	sl_rg r;
	r.ox = r.ow = 0;
	r.msg[0] = 0;
	r.rc = sl_jl_region1(t, jpeg, n, dst, width, height, den, x, y, w, h, &r.ox, &r.ow, r.msg, (sl_strip_fn)fn, ctx, strip);
	return r;
}

// sl_jl_region1 decodes the region into dst; with fn, strip rows at a time into the
// first strip rows of dst, each strip handed to fn before the next is decoded over it.
static int sl_jl_region1(sl_jl *t, const unsigned char *jpeg, unsigned long n, unsigned char *dst,
                        int width, int height, int den, int x, int y, int w, int h, int *ox, int *ow, char *msg,
                        sl_strip_fn fn, void *ctx, int strip) {
	_Alignas(16) unsigned char cinfo[SL_CINFO_SIZE];
	sl_jerr err;
	memset(cinfo, 0, sizeof cinfo);
	err.warned = 0;
	err.msg[0] = 0;
	err.soft[0] = 0;
	t->std_error(err.pub);
	SL_FIELD(err.pub, SL_ERR_ERROR_EXIT, sl_exit_fn) = sl_jerr_exit;
	SL_FIELD(err.pub, SL_ERR_EMIT_MESSAGE, sl_emit_fn) = sl_jerr_emit;
	SL_FIELD(cinfo, 0, void *) = err.pub;
	volatile int created = 0;
	unsigned char *volatile spare = NULL; // freed when libjpeg jumps out of a read into it
	if (setjmp(err.jb)) {
		free(spare);
		if (created) t->destroy_decompress(cinfo);
		strncpy(msg, err.msg[0] ? err.msg : "libjpeg failed", SL_JMSG_LENGTH_MAX - 1);
		msg[SL_JMSG_LENGTH_MAX - 1] = 0;
		return err.warned ? SL_RG_WARNING : SL_RG_ERROR;
	}
	// jpeg_CreateDecompress zeroes the structure, err excepted, then checks the
	// version and the size.
	t->CreateDecompress(cinfo, 62, SL_CINFO_SIZE);
	created = 1;
	t->mem_src(cinfo, jpeg, n);
	t->read_header(cinfo, 1);
	SL_FIELD(cinfo, SL_OFF_OUT_COLOR_SPACE, int) = SL_JCS_RGB;
	SL_FIELD(cinfo, SL_OFF_SCALE_NUM, unsigned int) = 1;
	SL_FIELD(cinfo, SL_OFF_SCALE_DENOM, unsigned int) = (unsigned int)den;
	t->start_decompress(cinfo);
	if ((int)SL_FIELD(cinfo, SL_OFF_OUTPUT_WIDTH, unsigned int) != width ||
	    (int)SL_FIELD(cinfo, SL_OFF_OUTPUT_HEIGHT, unsigned int) != height) {
		t->destroy_decompress(cinfo);
		return SL_RG_SIZE;
	}
	unsigned int cx = (unsigned int)x, cw = (unsigned int)w;
	if (cx != 0 || cw != (unsigned int)width) t->crop_scanline(cinfo, &cx, &cw);
	if (y > 0 && t->skip_scanlines(cinfo, (unsigned int)y) != (unsigned int)y) {
		t->destroy_decompress(cinfo);
		strcpy(msg, "jpeg_skip_scanlines skipped fewer rows than asked");
		return SL_RG_ERROR;
	}
	size_t pitch = (size_t)cw * 3;
	int first = 0; // the region's row at dst's first row
	while ((int)SL_FIELD(cinfo, SL_OFF_OUTPUT_SCANLINE, unsigned int) < y + h) {
		int r = (int)SL_FIELD(cinfo, SL_OFF_OUTPUT_SCANLINE, unsigned int) - y;
		if (fn && r - first == strip) {
			fn(ctx, dst, first, strip, (int)pitch, (int)cx);
			first = r;
		}
		unsigned char *row = dst + (size_t)(r - first) * pitch;
		if (t->read_scanlines(cinfo, &row, 1) != 1) {
			t->destroy_decompress(cinfo);
			strcpy(msg, "jpeg_read_scanlines read no row");
			return SL_RG_ERROR;
		}
	}
	if (fn) fn(ctx, dst, first, h - first, (int)pitch, (int)cx);
	// The rest of the data, so that damage below the region fails the decode as it
	// fails any other: the rows below are skipped (entropy-decoded only, where the
	// data has one scan) but the last, which jpeg_skip_scanlines would not decode,
	// then jpeg_finish_decompress reads on to the end marker.
	unsigned int oh = SL_FIELD(cinfo, SL_OFF_OUTPUT_HEIGHT, unsigned int);
	unsigned int rest = oh - SL_FIELD(cinfo, SL_OFF_OUTPUT_SCANLINE, unsigned int);
	if (rest > 1 && t->skip_scanlines(cinfo, rest - 1) != rest - 1) {
		t->destroy_decompress(cinfo);
		strcpy(msg, "jpeg_skip_scanlines skipped fewer rows than asked");
		return SL_RG_ERROR;
	}
	if (rest > 0) {
		// Not into dst, which holds the region (or the last strip, given to fn).
		unsigned char *last = malloc(pitch);
		if (!last) {
			t->destroy_decompress(cinfo);
			strcpy(msg, "out of memory");
			return SL_RG_ERROR;
		}
		spare = last;
		unsigned int got = t->read_scanlines(cinfo, &last, 1);
		spare = NULL;
		free(last);
		if (got != 1) {
			t->destroy_decompress(cinfo);
			strcpy(msg, "jpeg_read_scanlines read no row");
			return SL_RG_ERROR;
		}
	}
	t->finish_decompress(cinfo);
	t->destroy_decompress(cinfo);
	*ox = (int)cx;
	*ow = (int)cw;
	memcpy(msg, err.soft, SL_JMSG_LENGTH_MAX); // the skippable warning, if any
	return 0;
}

// sl_collector and sl_collect are a strip function for the tests of
// DecodeRegionStrips: each strip is copied where DecodeRegion would put its rows,
// and anything out of order is counted.
typedef struct {
	unsigned char *dst;
	int next, calls, x, bad;
} sl_collector;

static void sl_collect(void *c, const unsigned char *rows, int y, int n, int pitch, int x) {
	sl_collector *k = (sl_collector *)c;
	if (y != k->next || n <= 0 || (k->calls > 0 && x != k->x)) k->bad++;
	k->calls++;
	k->x = x;
	memcpy(k->dst + (size_t)y * pitch, rows, (size_t)n * pitch);
	k->next = y + n;
}

static void *sl_collect_fn(void) { return (void *)sl_collect; }
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"
)

// Regions is libjpeg-turbo's libjpeg API (libjpeg.so.62), loaded at run time to
// decode a part of an image: jpeg_crop_scanline decodes only the columns asked for
// (widened to the left to an iMCU boundary), and jpeg_skip_scanlines skips the rows
// above and below them without their inverse DCT (the data is still read to its
// end, so that damage anywhere is seen). It is safe for concurrent use.
type Regions struct {
	t    *C.sl_jl
	path string
}

// OpenRegions loads the libjpeg library at path, a file name or path as dlopen
// takes it; "" means libjpeg.so.62. A library that cannot be loaded, or that lacks
// a function used (jpeg_crop_scanline and jpeg_skip_scanlines came with
// libjpeg-turbo 1.5), gives an error wrapping ErrUnavailable.
func OpenRegions(path string) (*Regions, error) {
	names := []string{path}
	if path == "" {
		names = defaultLibjpegNames
	}
	var whys []string
	for _, name := range names {
		cname := C.CString(name)
		var why *C.char
		t := C.sl_jl_open(cname, &why)
		C.free(unsafe.Pointer(cname))
		if t == nil {
			whys = append(whys, fmt.Sprintf("loading %s: %s", name, C.GoString(why)))
			continue
		}
		return &Regions{t: t, path: name}, nil
	}
	return nil, fmt.Errorf("%w: %s (install libjpeg-turbo's libjpeg, e.g. apt-get install libjpeg62-turbo)",
		ErrUnavailable, strings.Join(whys, "; "))
}

// Path returns the name or path of the library loaded, as given to dlopen.
func (r *Regions) Path() string { return r.path }

// DecodeRegion decodes the rows reg.Y to reg.Y+reg.H and at least the columns reg.X
// to reg.X+reg.W of jpeg, scaled by 1/den (1, 2, 4 or 8) in the inverse DCT, into dst
// as packed RGB, as Decode would decode them with flags 0, save for the decoded
// region's first and last columns where they are not the image's (the chroma
// upsampling there sees no neighbour beyond them). width x height must be the
// image's size so scaled (ScaledSize). It returns the region decoded: reg widened to
// the left to an iMCU boundary, its rows got.W*3 bytes apart in dst. dst must hold
// width*reg.H*3 bytes.
//
// The decode reads the whole of jpeg, past the region to its end marker (the rows
// below the region are only entropy-decoded), so that what it reports does not
// depend on the region. A warning from libjpeg that is not skippable
// (Error.Skippable), as for a truncated or corrupt image wherever the damage is,
// ends it with an *Error with Warning set and the warning's message. A skippable
// one does not: the region is decoded and returned with an *Error with Warning set,
// an extraneous bytes warning if there was one (Error.Extraneous), the first
// warning otherwise.
func (r *Regions) DecodeRegion(jpeg, dst []byte, width, height, den int, reg Region) (Region, error) {
	if err := checkRegion(jpeg, dst, width, height, den, reg, reg.H); err != nil {
		return Region{}, err
	}
	return r.decode(jpeg, dst, width, height, den, reg, nil, nil, 0)
}

// DecodeRegionStrips is DecodeRegion with the region's rows decoded strip rows at a
// time into the first strip rows of dst, which must hold width*strip*3 bytes: after
// each strip is decoded, and before the next overwrites it, the C function fn is
// called with ctx, the strip, its first row (0 is reg.Y), its row count, the bytes
// from one row to the next and the image column of its first pixel:
//
//	void fn(void *ctx, const unsigned char *rows, int y, int n, int pitch, int x);
//
// so that the caller processes each strip while it is in the CPU's caches. fn must
// not keep rows or call back into Go; ctx must follow cgo's rules for pointers
// passed to C (Go memory it points to holds no unpinned Go pointers). When it
// fails, fn may have been called for some strips; a skippable warning comes back
// as from DecodeRegion, beside the region, every strip handed to fn.
func (r *Regions) DecodeRegionStrips(jpeg, dst []byte, width, height, den int, reg Region, strip int, fn, ctx unsafe.Pointer) (Region, error) {
	if fn == nil || strip <= 0 {
		return Region{}, errors.New("turbojpeg: DecodeRegionStrips needs a function and a strip height")
	}
	if err := checkRegion(jpeg, dst, width, height, den, reg, min(strip, reg.H)); err != nil {
		return Region{}, err
	}
	return r.decode(jpeg, dst, width, height, den, reg, fn, ctx, strip)
}

// decode runs the C decode of a checked region: whole into dst when fn is nil,
// by strips through fn otherwise.
func (r *Regions) decode(jpeg, dst []byte, width, height, den int, reg Region, fn, ctx unsafe.Pointer, strip int) (Region, error) {
	res := C.sl_jl_region(r.t, (*C.uchar)(unsafe.Pointer(unsafe.SliceData(jpeg))), C.ulong(len(jpeg)),
		(*C.uchar)(unsafe.Pointer(unsafe.SliceData(dst))), C.int(width), C.int(height), C.int(den),
		C.int(reg.X), C.int(reg.Y), C.int(reg.W), C.int(reg.H), fn, ctx, C.int(strip))
	runtime.KeepAlive(jpeg)
	runtime.KeepAlive(dst)
	switch res.rc {
	case 0:
		got := Region{X: int(res.ox), Y: reg.Y, W: int(res.ow), H: reg.H}
		if res.msg[0] != 0 {
			msg := res.msg // a copy, so that res itself stays on the stack
			return got, &Error{Msg: C.GoString(&msg[0]), Warning: true}
		}
		return got, nil
	case C.SL_RG_SIZE:
		return Region{}, errors.New("turbojpeg: the image's scaled size is not the one given")
	}
	msg := res.msg // a copy, so that res itself stays on the stack
	return Region{}, &Error{Msg: C.GoString(&msg[0]), Warning: res.rc == C.SL_RG_WARNING}
}

// stripCollector is a strip function for the tests (test files cannot hold C): with
// it, DecodeRegionStrips writes the region's rows into C memory as DecodeRegion
// writes them into dst.
type stripCollector struct {
	c *C.sl_collector
	n int
}

func newStripCollector(n int) *stripCollector {
	c := (*C.sl_collector)(C.calloc(1, C.size_t(unsafe.Sizeof(C.sl_collector{}))))
	c.dst = (*C.uchar)(C.calloc(C.size_t(n), 1))
	return &stripCollector{c: c, n: n}
}

// fn returns the function and context to give DecodeRegionStrips.
func (s *stripCollector) fn() (fn, ctx unsafe.Pointer) { return C.sl_collect_fn(), unsafe.Pointer(s.c) }

// result returns the rows written, the calls, the column of the last strip and
// how many strips came out of order.
func (s *stripCollector) result() (rows []byte, calls, x, bad int) {
	return C.GoBytes(unsafe.Pointer(s.c.dst), C.int(s.n)), int(s.c.calls), int(s.c.x), int(s.c.bad)
}

func (s *stripCollector) free() {
	C.free(unsafe.Pointer(s.c.dst))
	C.free(unsafe.Pointer(s.c))
}
