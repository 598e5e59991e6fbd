package turbojpeg

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
)

// ErrUnavailable is wrapped by Open's error when the library cannot be loaded
// (absent, wrong version, built without cgo).
var ErrUnavailable = errors.New("turbojpeg: libjpeg-turbo not available")

// envPath names the environment variable Default reads: the library to load.
const envPath = "SHARDLOAD_TURBOJPEG"

// defaultNames are what Open("") tries, in order: the runtime package's soname,
// then the development symlink.
var defaultNames = []string{"libturbojpeg.so.0", "libturbojpeg.so"}

// poolSize bounds the idle TurboJPEG instances a Lib keeps.
const poolSize = 64

// maxDim is the largest width or height a JPEG image can have.
const maxDim = 65535

var dflt struct {
	once sync.Once
	lib  *Lib
	err  error
}

// Default returns the library loaded once per process from $SHARDLOAD_TURBOJPEG (a
// path) or, when that is unset or empty, the default names Open tries. The result,
// error included, is remembered.
func Default() (*Lib, error) {
	dflt.once.Do(func() { dflt.lib, dflt.err = Open(os.Getenv(envPath)) })
	return dflt.lib, dflt.err
}

// Header is what a JPEG image's headers say about it.
type Header struct {
	// Width and Height are the image's size in pixels.
	Width, Height int
	// Subsamp is the chrominance subsampling, one of the Samp constants
	// (TurboJPEG's TJSAMP_* values), or -1 when TurboJPEG cannot name it.
	Subsamp int
	// Colorspace is the JPEG colorspace, one of the CS constants (TJCS_*).
	Colorspace int
}

// Chrominance subsampling, as Header.Subsamp reports it (TurboJPEG's TJSAMP_*).
const (
	Samp444  = 0 // TJSAMP_444: no subsampling
	Samp422  = 1 // TJSAMP_422: one chroma sample per 2x1 pixels
	Samp420  = 2 // TJSAMP_420: one chroma sample per 2x2 pixels
	SampGray = 3 // TJSAMP_GRAY: no chroma
	Samp440  = 4 // TJSAMP_440: one chroma sample per 1x2 pixels
	Samp411  = 5 // TJSAMP_411: one chroma sample per 4x1 pixels
)

// JPEG colorspaces, as Header.Colorspace reports them (TurboJPEG's TJCS_*). CMYK and
// YCCK images cannot be decoded to RGB or Gray: Decode fails on them, and a caller
// wanting them must convert CMYK itself (image/jpeg does).
const (
	CSRGB   = 0 // TJCS_RGB: components stored as R, G, B
	CSYCbCr = 1 // TJCS_YCbCr: the usual colour JPEG
	CSGray  = 2 // TJCS_GRAY: one component
	CSCMYK  = 3 // TJCS_CMYK: four components, stored as C, M, Y, K
	CSYCCK  = 4 // TJCS_YCCK: CMYK transformed like RGB to YCbCr (Adobe)
)

// PixelFormat is the layout of Decode's output pixels (TurboJPEG's TJPF_* values).
type PixelFormat int

const (
	// RGB is 3 bytes per pixel, R, G, B (TJPF_RGB).
	RGB PixelFormat = 0
	// Gray is 1 byte per pixel, the luminance (TJPF_GRAY).
	Gray PixelFormat = 6
)

// Channels returns the bytes per pixel of f, or 0 for a format this package does
// not know.
func (f PixelFormat) Channels() int {
	switch f {
	case RGB:
		return 3
	case Gray:
		return 1
	}
	return 0
}

// Flags change how Decode decodes (TurboJPEG's TJFLAG_* values, ORed together). 0 is
// the library's default, which is also what PIL gets: smooth chroma upsampling and
// the accurate integer inverse DCT.
type Flags int

const (
	// FastUpsample replicates chroma samples instead of interpolating them
	// (TJFLAG_FASTUPSAMPLE).
	FastUpsample Flags = 256
	// FastDCT uses the fast, less accurate integer inverse DCT (TJFLAG_FASTDCT).
	FastDCT Flags = 2048
	// AccurateDCT uses the accurate integer inverse DCT, the decoding default
	// (TJFLAG_ACCURATEDCT).
	AccurateDCT Flags = 4096
	// StopOnWarning makes a warning end the decode, as an error with Warning set
	// and the image not entirely written (TJFLAG_STOPONWARNING).
	StopOnWarning Flags = 8192
)

// ScaledSize returns ceil(w*num/den), ceil(h*num/den) as TurboJPEG's TJSCALED does:
// the size of a w x h image decoded with scaling factor num/den.
func ScaledSize(w, h, num, den int) (int, int) {
	return (w*num + den - 1) / den, (h*num + den - 1) / den
}

// Error is a TurboJPEG or libjpeg failure: its message (tjGetErrorStr2, read in the
// C call that failed) and whether the library called it a warning (tjGetErrorCode
// returned TJERR_WARNING, or libjpeg's emit_message was called with level -1). A
// warning means the data was not entirely sound, e.g. "Premature end of JPEG file"
// for a truncated file, or extraneous bytes before a marker (see Skippable).
type Error struct {
	// Msg is the library's message.
	Msg string
	// Warning is true when the library called the failure non-fatal.
	Warning bool
}

// Error returns "turbojpeg: " and the library's message.
func (e *Error) Error() string { return "turbojpeg: " + e.Msg }

// Skippable reports whether e is a warning libjpeg decodes through without missing
// data: bytes that are not a marker where one should start (Extraneous), which
// libjpeg skips, or a note on the headers' metadata (libjpeg's messages that begin
// "Warning:", such as an unknown JFIF revision). Every other warning ("Premature end
// of JPEG file", "Corrupt JPEG data: premature end of data segment", "Corrupt JPEG
// data: bad Huffman code", ...) means pixels are missing or wrong. libjpeg reports
// only the first warning of a decode to TurboJPEG, so a skippable warning from
// Decode says nothing of what came after it; DecodeRegion sees every warning.
func (e *Error) Skippable() bool { return e.Warning && skippableWarning(e.Msg) }

// Extraneous reports whether e is libjpeg's "Corrupt JPEG data: N extraneous bytes
// before marker 0xNN": bytes that are not a marker where one should start. PIL and
// image/jpeg skip them too, and they may be junk after whole entropy-coded data, but
// they may also be what is left of entropy-coded data decoded wrongly: libjpeg-turbo
// decodes an invalid Huffman code as a zero without a warning of its own. A caller
// that must not deliver damaged pixels checks such an image another way.
func (e *Error) Extraneous() bool { return e.Warning && extraneousWarning(e.Msg) }

// extraneousWarning and skippableWarning are Extraneous and Skippable on a
// warning's message; sl_jl_extraneous and sl_jl_skippable in the cgo build are the
// same tests.
func extraneousWarning(msg string) bool {
	return strings.Contains(msg, "extraneous bytes before marker")
}

func skippableWarning(msg string) bool {
	return extraneousWarning(msg) || strings.HasPrefix(msg, "Warning:")
}

// errNoImage is the error for JPEG data whose headers end before the frame header,
// which TurboJPEG takes for a tables-only datastream and reports no size for.
var errNoImage = errors.New("turbojpeg: no image in the JPEG data (headers cut short, or tables only)")

// checkDecode checks Decode's arguments before any C is called and returns the
// row pitch in bytes.
func checkDecode(jpeg, dst []byte, width, height int, format PixelFormat) (int, error) {
	if len(jpeg) == 0 {
		return 0, errors.New("turbojpeg: empty JPEG data")
	}
	ch := format.Channels()
	if ch == 0 {
		return 0, fmt.Errorf("turbojpeg: unknown pixel format %d", int(format))
	}
	if width <= 0 || height <= 0 || width > maxDim || height > maxDim {
		return 0, fmt.Errorf("turbojpeg: bad output size %dx%d", width, height)
	}
	if need := width * height * ch; len(dst) < need {
		return 0, fmt.Errorf("turbojpeg: destination holds %d bytes, %dx%d with %d channels needs %d",
			len(dst), width, height, ch, need)
	}
	return width * ch, nil
}
