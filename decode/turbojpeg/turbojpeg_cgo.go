//go:build linux && cgo

package turbojpeg

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// The few TurboJPEG types used, as turbojpeg.h (2.x) declares them.
typedef void *tjhandle;
typedef struct { int num; int denom; } tjscalingfactor;

enum {
	SL_TJERR_WARNING = 0,   // TJERR_WARNING
	SL_SIZE_MISMATCH = -2,  // sl_decode: the size asked for is no scaled size of the image
	SL_NO_IMAGE = -3        // sl_decode: the headers name no image (cut short, or tables only)
};

// sl_tj is one loaded TurboJPEG library.
typedef struct {
	void *lib;
	tjhandle (*InitDecompress)(void);
	int (*DecompressHeader3)(tjhandle, const unsigned char *, unsigned long, int *, int *, int *, int *);
	int (*Decompress2)(tjhandle, const unsigned char *, unsigned long, unsigned char *, int, int, int, int, int);
	int (*Destroy)(tjhandle);
	char *(*GetErrorStr2)(tjhandle);
	int (*GetErrorCode)(tjhandle);
	tjscalingfactor *(*GetScalingFactors)(int *);
	tjscalingfactor *factors;
	int nfactors;
} sl_tj;

// sl_sym finds a function, recording the first name missing.
static void *sl_sym(sl_tj *t, const char *name, const char **missing) {
	void *p = dlsym(t->lib, name);
	if (!p && !*missing) *missing = name;
	return p;
}

// sl_open loads path and resolves every function. On failure it returns NULL and sets
// *why to dlerror's text or the missing function's name. tjGetErrorStr2 and
// tjGetErrorCode came with TurboJPEG 2.0, so an older library fails here.
static sl_tj *sl_open(const char *path, const char **why) {
	sl_tj *t = calloc(1, sizeof *t);
	if (!t) { *why = "out of memory"; return NULL; }
	t->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!t->lib) { *why = dlerror(); free(t); return NULL; }
	const char *m = NULL;
	t->InitDecompress = sl_sym(t, "tjInitDecompress", &m);
	t->DecompressHeader3 = sl_sym(t, "tjDecompressHeader3", &m);
	t->Decompress2 = sl_sym(t, "tjDecompress2", &m);
	t->Destroy = sl_sym(t, "tjDestroy", &m);
	t->GetErrorStr2 = sl_sym(t, "tjGetErrorStr2", &m);
	t->GetErrorCode = sl_sym(t, "tjGetErrorCode", &m);
	t->GetScalingFactors = sl_sym(t, "tjGetScalingFactors", &m);
	if (m) { *why = m; dlclose(t->lib); free(t); return NULL; }
	t->factors = t->GetScalingFactors(&t->nfactors);
	if (!t->factors || t->nfactors <= 0) {
		*why = "tjGetScalingFactors returned no factors";
		dlclose(t->lib); free(t); return NULL;
	}
	return t;
}

static void sl_destroy(sl_tj *t, tjhandle h) { t->Destroy(h); }

// SL_MSG_MAX is TurboJPEG's JMSG_LENGTH_MAX: the longest message it writes.
#define SL_MSG_MAX 200

// sl_msg copies the message of the call just made on h (NULL: tjInitDecompress)
// into msg and returns its code. TurboJPEG 2.x keeps libjpeg's messages in a
// thread-local buffer, so the message must be read in the C call that made it: a
// goroutine may run its next cgo call on another thread, whose buffer holds another
// call's message or "No error".
static int sl_msg(sl_tj *t, tjhandle h, char *msg) {
	const char *m = t->GetErrorStr2(h);
	int code = h ? t->GetErrorCode(h) : 1;
	if (!m) m = "unknown error";
	strncpy(msg, m, SL_MSG_MAX - 1);
	msg[SL_MSG_MAX - 1] = 0;
	return code;
}

// sl_in is sl_init's result, returned by value.
typedef struct { tjhandle h; char msg[SL_MSG_MAX]; } sl_in;

static sl_in sl_init(sl_tj *t) {
	sl_in r;
	r.msg[0] = 0;
	r.h = t->InitDecompress();
	if (!r.h) sl_msg(t, NULL, r.msg);
	return r;
}

// sl_hdr is sl_header's result, returned by value: out-parameters in Go memory
// would be allocated on the heap for every call. When rc is not 0, code and msg are
// the call's error code and message.
typedef struct { int rc, w, hgt, ss, cs, code; char msg[SL_MSG_MAX]; } sl_hdr;

static sl_hdr sl_header(sl_tj *t, tjhandle h, const unsigned char *jpeg, unsigned long n) {
	sl_hdr r;
	r.w = r.hgt = r.ss = r.cs = r.code = 0;
	r.msg[0] = 0;
	r.rc = t->DecompressHeader3(h, jpeg, n, &r.w, &r.hgt, &r.ss, &r.cs);
	if (r.rc != 0) r.code = sl_msg(t, h, r.msg);
	return r;
}

// sl_dec is sl_decode's result, returned by value; code and msg as in sl_hdr, when
// rc is -1.
typedef struct { int rc, code; char msg[SL_MSG_MAX]; } sl_dec;

// sl_decode decodes jpeg into dst, w x hgt pixels of pf with rows pitch bytes apart.
// tjDecompress2 treats w x hgt as a bound and picks the largest scaled size within
// it, so sl_decode first checks that w x hgt is exactly the image's size scaled by
// one of the factors <= 1, returning SL_SIZE_MISMATCH if not. A header warning does
// not stop it: tjDecompress2 meets and reports it. tjDecompressHeader3 takes data
// whose headers end before the frame header for a tables-only datastream and
// succeeds without a size: that is SL_NO_IMAGE.
static sl_dec sl_decode(sl_tj *t, tjhandle h, const unsigned char *jpeg, unsigned long n,
                        unsigned char *dst, int w, int pitch, int hgt, int pf, int flags) {
	sl_dec r;
	r.rc = -1;
	r.code = 0;
	r.msg[0] = 0;
	int iw = 0, ih = 0, ss, cs;
	if (t->DecompressHeader3(h, jpeg, n, &iw, &ih, &ss, &cs) != 0) {
		r.code = sl_msg(t, h, r.msg);
		if (r.code != SL_TJERR_WARNING) return r;
		r.msg[0] = 0;
	}
	if (iw <= 0 || ih <= 0) { r.rc = SL_NO_IMAGE; return r; }
	int ok = 0;
	for (int i = 0; i < t->nfactors && !ok; i++) {
		tjscalingfactor f = t->factors[i];
		if (f.num <= 0 || f.denom <= 0 || f.num > f.denom) continue;
		ok = (iw * f.num + f.denom - 1) / f.denom == w && (ih * f.num + f.denom - 1) / f.denom == hgt;
	}
	if (!ok) { r.rc = SL_SIZE_MISMATCH; return r; }
	r.rc = t->Decompress2(h, jpeg, n, dst, w, pitch, hgt, pf, flags);
	if (r.rc != 0) { r.rc = -1; r.code = sl_msg(t, h, r.msg); }
	return r;
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"
)

// cgoBuild tells the tests whether this build can load the library at all.
const cgoBuild = true

// Lib is a loaded TurboJPEG library. It is safe for concurrent use. A Lib is never
// unloaded: the library stays mapped until the process exits.
type Lib struct {
	t       *C.sl_tj
	path    string
	factors [][2]int
	// handles holds idle decompressor instances. A tjhandle must not be used by two
	// calls at once but is not tied to a thread, so a call takes one from here (or
	// makes one) and puts it back after (or destroys it when the pool is full).
	handles chan C.tjhandle
}

// Open loads the TurboJPEG library at path, a file name or path as dlopen takes it;
// "" tries "libturbojpeg.so.0" then "libturbojpeg.so". A library that cannot be
// loaded, or that lacks a function of the TurboJPEG 2.x API, gives an error wrapping
// ErrUnavailable that names it.
func Open(path string) (*Lib, error) {
	names := []string{path}
	if path == "" {
		names = defaultNames
	}
	var whys []string
	for _, name := range names {
		cname := C.CString(name)
		var why *C.char
		t := C.sl_open(cname, &why)
		C.free(unsafe.Pointer(cname))
		if t == nil {
			whys = append(whys, fmt.Sprintf("loading %s: %s", name, C.GoString(why)))
			continue
		}
		l := &Lib{t: t, path: name, handles: make(chan C.tjhandle, poolSize)}
		fs := unsafe.Slice(t.factors, int(t.nfactors))
		for _, f := range fs {
			if f.num > 0 && f.denom > 0 && f.num <= f.denom {
				l.factors = append(l.factors, [2]int{int(f.num), int(f.denom)})
			}
		}
		return l, nil
	}
	return nil, fmt.Errorf("%w: %s (install libjpeg-turbo's TurboJPEG library, e.g. apt-get install libturbojpeg0)",
		ErrUnavailable, strings.Join(whys, "; "))
}

// Path returns the name or path of the library loaded, as given to dlopen.
func (l *Lib) Path() string { return l.path }

// Factors returns the library's scaling factors num/den that are <= 1, largest
// first (tjGetScalingFactors); libjpeg-turbo 2.x has 1/1, 7/8, 3/4, 5/8, 1/2, 3/8,
// 1/4 and 1/8. The slice is the caller's.
func (l *Lib) Factors() [][2]int {
	return append([][2]int(nil), l.factors...)
}

// get takes an idle instance or makes one.
func (l *Lib) get() (C.tjhandle, error) {
	select {
	case h := <-l.handles:
		return h, nil
	default:
	}
	return l.fresh()
}

// fresh makes an instance that holds no table of an earlier image.
func (l *Lib) fresh() (C.tjhandle, error) {
	in := C.sl_init(l.t)
	if in.h == nil {
		msg := in.msg // a copy, so that in itself stays on the stack
		return nil, &Error{Msg: "tjInitDecompress: " + C.GoString(&msg[0])}
	}
	return in.h, nil
}

// put returns an instance to the pool, or destroys it when the pool is full.
func (l *Lib) put(h C.tjhandle) {
	select {
	case l.handles <- h:
	default:
		C.sl_destroy(l.t, h)
	}
}

// done puts h back after a call that succeeded, or destroys it after one that
// failed or warned: a TurboJPEG 2.x instance that stopped in the middle of a
// datastream (headers cut short, a tables-only datastream) fails every later call
// ("Bogus DQT index"), so one that failed is not reused.
func (l *Lib) done(h C.tjhandle, ok bool) {
	if ok {
		l.put(h)
		return
	}
	C.sl_destroy(l.t, h)
}

// newError makes the *Error of a call's code and message, as the C call that
// failed copied them.
func newError(code C.int, msg *C.char) *Error {
	return &Error{Msg: C.GoString(msg), Warning: code == C.SL_TJERR_WARNING}
}

// Header reads jpeg's headers (tjDecompressHeader3). On a warning the Header is
// filled and the error is an *Error with Warning set; other failures from the library
// give an *Error and a zero Header. Data whose headers stop before the image's size
// (cut short, or a tables-only datastream, which the library accepts) is an error
// too, not an *Error.
func (l *Lib) Header(jpeg []byte) (Header, error) {
	if len(jpeg) == 0 {
		return Header{}, fmt.Errorf("turbojpeg: empty JPEG data")
	}
	h, err := l.get()
	if err != nil {
		return Header{}, err
	}
	ok := false
	defer func() { l.done(h, ok) }()
	res := C.sl_header(l.t, h, (*C.uchar)(unsafe.Pointer(unsafe.SliceData(jpeg))), C.ulong(len(jpeg)))
	runtime.KeepAlive(jpeg)
	rc := res.rc
	hdr := Header{Width: int(res.w), Height: int(res.hgt), Subsamp: int(res.ss), Colorspace: int(res.cs)}
	if rc != 0 {
		msg := res.msg // a copy, so that res itself stays on the stack
		e := newError(res.code, &msg[0])
		if !e.Warning {
			return Header{}, e
		}
		if hdr.Width > 0 && hdr.Height > 0 {
			return hdr, e
		}
	}
	if hdr.Width <= 0 || hdr.Height <= 0 {
		return Header{}, errNoImage
	}
	ok = rc == 0
	return hdr, nil
}

// Decode decodes jpeg into dst as width x height pixels of format (RGB: 3 bytes per
// pixel, Gray: 1), rows packed (pitch = width*channels), with tjDecompress2.
// width x height must be the image's size scaled by one of the library's factors
// (ScaledSize with one of Factors); TurboJPEG then scales in the inverse DCT. Any
// other size is an error. dst must hold at least width*height*channels bytes; only
// those are written.
//
// A failure from the library is an *Error, its message that of this call whatever
// the thread or the instance's history. The result never depends on what was
// decoded before: an image that does not define every table it uses (a JPEG
// without quantization tables fails, one without Huffman tables decodes with the
// standard ones) is decoded on an instance of its own. One with Warning set means the data was not
// entirely sound: unless flags has StopOnWarning, the image was decoded into dst
// regardless (a truncated file decodes with its missing rows gray). The message is
// the first warning's; libjpeg does not report the later ones.
func (l *Lib) Decode(jpeg, dst []byte, width, height int, format PixelFormat, flags Flags) error {
	pitch, err := checkDecode(jpeg, dst, width, height, format)
	if err != nil {
		return err
	}
	// An image that leaves a table to the decoder gets an instance of its own,
	// destroyed after: see selfContained.
	own := selfContained(jpeg)
	get := l.get
	if !own {
		get = l.fresh
	}
	h, err := get()
	if err != nil {
		return err
	}
	ok := false
	defer func() { l.done(h, ok && own) }()
	res := C.sl_decode(l.t, h, (*C.uchar)(unsafe.Pointer(unsafe.SliceData(jpeg))), C.ulong(len(jpeg)),
		(*C.uchar)(unsafe.Pointer(unsafe.SliceData(dst))), C.int(width), C.int(pitch), C.int(height),
		C.int(format), C.int(flags))
	runtime.KeepAlive(jpeg)
	runtime.KeepAlive(dst)
	switch res.rc {
	case 0:
		ok = true
		return nil
	case C.SL_NO_IMAGE:
		return errNoImage
	case C.SL_SIZE_MISMATCH:
		hdr, _ := l.Header(jpeg)
		return fmt.Errorf("turbojpeg: %dx%d is not a scaled size of the %dx%d image (factors %v)",
			width, height, hdr.Width, hdr.Height, l.factors)
	}
	msg := res.msg // a copy, so that res itself stays on the stack
	return newError(res.code, &msg[0])
}
