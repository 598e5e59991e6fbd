package decode

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/klauspost/compress/flate"
)

// Errors; match them with errors.Is. Decode wraps the per-field ones in a *FieldError.
var (
	// ErrWrongShape means an array's shape differs from the Field's Shape.
	ErrWrongShape = errors.New("decode: wrong shape")
	// ErrWrongDType means an array's dtype differs from the Field's DType.
	ErrWrongDType = errors.New("decode: wrong dtype")
	// ErrBadNPY means a member is not a .npy array this package reads: malformed,
	// truncated, Fortran-order, big-endian, or of a non-numeric dtype.
	ErrBadNPY = errors.New("decode: bad .npy")
	// ErrNotInt means an Int member does not hold a decimal int64.
	ErrNotInt = errors.New("decode: not an integer")
	// ErrNotUTF8 means a Text member is not valid UTF-8.
	ErrNotUTF8 = errors.New("decode: invalid UTF-8")
	// ErrBadJSON means a JSON member is not valid JSON.
	ErrBadJSON = errors.New("decode: invalid JSON")
	// ErrTooLarge means a gzip member inflates to more than the Field's MaxBytes (a
	// gzip bomb, or a cap set too low).
	ErrTooLarge = errors.New("decode: inflated member larger than the cap")
	// ErrCorrupt means a Gunzip member is not valid gzip (bad header, corrupt deflate
	// data, truncated, wrong checksum, trailing garbage).
	ErrCorrupt = errors.New("decode: corrupt gzip member")
	// ErrMissing means a sample has no member with the Field's extension. Decode never
	// returns it: it is for the caller that looks the member up, so that a missing
	// member is reported as &FieldError{Name, Ext, ErrMissing} like any other failure.
	ErrMissing = errors.New("decode: sample has no such member")
	// ErrInvalidField means a Field or field spec is invalid (ParseField, Validate).
	ErrInvalidField = errors.New("decode: invalid field")
	// ErrSlabTooSmall means a batch does not fit in the slab given to Collate.
	ErrSlabTooSmall = errors.New("decode: batch does not fit in the slab")
)

// sentinelError is an error with its own message that matches a sentinel.
type sentinelError struct {
	sentinel error
	msg      string
}

// Error returns the message.
func (e *sentinelError) Error() string { return e.msg }

// Unwrap returns the sentinel.
func (e *sentinelError) Unwrap() error { return e.sentinel }

func errf(sentinel error, format string, args ...any) error {
	return &sentinelError{sentinel, sentinel.Error() + ": " + fmt.Sprintf(format, args...)}
}

// FieldError is a failure to decode one field of one sample. The pipeline adds the
// sample's key and shard.
type FieldError struct {
	Field string // the field's column name
	Ext   string // the member's extension
	Err   error  // the cause; wraps one of the sentinels
}

// Error returns `field "NAME" (.EXT): ` and the cause.
func (e *FieldError) Error() string {
	return "field " + strconv.Quote(e.Field) + " (." + e.Ext + "): " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *FieldError) Unwrap() error { return e.Err }

// Value is one decoded field of one sample.
type Value struct {
	// Data is the payload: the bytes of a Raw, Text or JSON member; the array data
	// (without the header) of an NPY member; the pixels of an Image member; nil for
	// Int. It aliases the data given to Decode, or, when the member was gunzipped,
	// the returned buffer; an image's pixels are the Decoder's, valid until its next
	// Decode.
	Data []byte
	// Int is the value of an Int member.
	Int int64
	// DType is the element type of an NPY member.
	DType DType
	// Shape is the shape of an NPY member. When the Field has a Shape it is that
	// slice (shared, do not modify); otherwise a new slice.
	Shape []int
}

// Decoder decodes fields with reusable scratch state (an inflater, image buffers, the
// last .npy header it parsed), so that decoding gzip members and JPEGs does not
// allocate in the steady state and a run of .npy members with one header parses it
// once. The zero value is ready to use. A Decoder is not safe for concurrent use: use
// one per goroutine, and do not copy one after its first use.
type Decoder struct {
	// Seed seeds the random transforms (crop, flip) of the images decoded next: set
	// it for each sample, to SampleSeed(seed, epoch, key).
	Seed uint64
	// Images chooses the JPEG decoder; the zero value is ImageDecoderAuto.
	Images ImageDecoder

	br  bytes.Reader
	fr  io.ReadCloser  // flate reader, created on first use
	frr flate.Resetter // fr as a Resetter
	img *imageState    // image scratch, from a shared pool on first use
	// wholeJPEG turns off partial JPEG decoding (the tests compare with it).
	wholeJPEG bool
	npy       npyMemo
}

// npyMemo is the last .npy header a Decoder parsed: the samples of a shard mostly
// have the same header (token rows of one length, features of one shape), and one
// that is byte for byte the same, before data of the same length, parses the same.
type npyMemo struct {
	raw  []byte // the bytes before the array data; empty: nothing held
	size int    // the whole member's length
	h    npyHeader
}

// maxNPYMemo is the longest header npyMemo keeps (numpy pads its headers to 64 or
// 16 bytes; the longest real ones are a few hundred).
const maxNPYMemo = 1 << 10

// npyHeader returns data's parsed .npy header: the memo of the last one when data
// starts with the same bytes and has the same length, else a fresh parse.
func (d *Decoder) npyHeader(data []byte) (*npyHeader, error) {
	m := &d.npy
	if n := len(m.raw); n > 0 && m.size == len(data) && len(data) >= n && string(data[:n]) == string(m.raw) {
		return &m.h, nil
	}
	m.raw = m.raw[:0]
	if err := parseNPYHeader(data, &m.h); err != nil {
		return nil, err
	}
	m.h.descr = nil // aliases data, and is read by the parse alone
	if m.h.dataOff <= maxNPYMemo {
		m.raw, m.size = append(m.raw, data[:m.h.dataOff]...), len(data)
	}
	return &m.h, nil
}

// Release gives the Decoder's image scratch back to a pool shared by every
// Decoder (it is megabytes for large images); the Decoder stays usable. Values it
// returned for image fields must no longer be used.
func (d *Decoder) Release() {
	if d.img != nil {
		imageStates.Put(d.img)
		d.img = nil
	}
}

// Decode decodes one member with f, without reusable state: see Decoder.Decode. It
// does not allocate for fields that are not Gunzip (nor for NPY fields without a
// Shape, which allocate their Value.Shape); a Gunzip field allocates an inflater on
// every call, so a hot loop over gzip members should use a Decoder.
func (f *Field) Decode(data, buf []byte) (Value, []byte, error) {
	return f.decode(nil, data, buf)
}

// Decode decodes data, the bytes of the member f names, into a Value.
//
// buf is scratch for the inflated bytes of a Gunzip member: Decode inflates into
// buf[:0] (growing it when needed) and returns the buffer to use next time; the
// Value's Data then aliases it, so a buffer may be reused only once the Value is no
// longer needed (after the batch holding it is collated). Fields that are not Gunzip
// return buf unchanged. In the steady state (buf large enough) Decode does not
// allocate, except for the Shape of NPY fields without a fixed Shape.
//
// Int: the member holds a decimal integer with an optional sign and optional
// surrounding ASCII whitespace ("7\n"). Text: valid UTF-8. JSON: valid JSON, kept
// as bytes. NPY: a .npy array (see ParseNPY) whose dtype and shape must match the
// Field's when set. Errors are *FieldError wrapping ErrNotInt, ErrNotUTF8,
// ErrBadJSON, ErrBadNPY, ErrWrongDType, ErrWrongShape, ErrTooLarge or ErrCorrupt.
func (d *Decoder) Decode(f *Field, data, buf []byte) (Value, []byte, error) {
	return f.decode(d, data, buf)
}

func (f *Field) decode(d *Decoder, data, buf []byte) (Value, []byte, error) {
	if f.Gunzip {
		if d == nil {
			d = new(Decoder)
		}
		out, err := d.gunzip(data, buf, f.maxBytes())
		if err != nil {
			return Value{}, buf, f.err(err)
		}
		data, buf = out, out
	}
	switch f.Kind {
	case KindRaw:
		return Value{Data: data}, buf, nil
	case KindInt:
		n, ok := parseInt(data)
		if !ok {
			if len(bytes.TrimSpace(data)) == 0 {
				return Value{}, buf, f.err(errf(ErrNotInt, "empty member"))
			}
			return Value{}, buf, f.err(errf(ErrNotInt, "%s", quotePrefix(data)))
		}
		return Value{Int: n}, buf, nil
	case KindText:
		if !utf8.Valid(data) {
			return Value{}, buf, f.err(&sentinelError{ErrNotUTF8, fmt.Sprintf("decode: invalid UTF-8 at byte %d", firstInvalidUTF8(data))})
		}
		return Value{Data: data}, buf, nil
	case KindJSON:
		if !json.Valid(data) {
			var raw json.RawMessage
			err := json.Unmarshal(data, &raw)
			var se *json.SyntaxError
			if errors.As(err, &se) {
				return Value{}, buf, f.err(errf(ErrBadJSON, "%v (byte %d)", se, se.Offset))
			}
			return Value{}, buf, f.err(errf(ErrBadJSON, "%v", err))
		}
		return Value{Data: data}, buf, nil
	case KindImage:
		if d == nil {
			d = new(Decoder)
		}
		v, err := d.decodeImage(f, data)
		if err != nil {
			return Value{}, buf, f.err(err)
		}
		return v, buf, nil
	case KindNPY:
		if d == nil {
			var h npyHeader
			if err := parseNPYHeader(data, &h); err != nil {
				return Value{}, buf, f.err(err)
			}
			return f.npyValue(&h, data, buf)
		}
		h, err := d.npyHeader(data)
		if err != nil {
			return Value{}, buf, f.err(err)
		}
		return f.npyValue(h, data, buf)
	}
	return Value{}, buf, f.err(fmt.Errorf("decode: invalid kind %d", int(f.Kind)))
}

// npyValue checks an .npy member's parsed header h against f and returns its value.
func (f *Field) npyValue(h *npyHeader, data, buf []byte) (Value, []byte, error) {
	if !f.DType.IsZero() && h.dtype != f.DType {
		return Value{}, buf, f.err(errf(ErrWrongDType, "got %s, want %s", h.dtype.Name(), f.DType.Name()))
	}
	v := Value{Data: data[h.dataOff:len(data):len(data)], DType: h.dtype}
	if len(f.Shape) > 0 {
		if !slices.Equal(h.shape(), f.Shape) {
			return Value{}, buf, f.err(errf(ErrWrongShape, "got %s, want %s", FormatShape(h.shape()), FormatShape(f.Shape)))
		}
		v.Shape = f.Shape
	} else {
		v.Shape = slices.Clone(h.shape())
		if v.Shape == nil {
			v.Shape = []int{}
		}
	}
	return v, buf, nil
}

func (f *Field) err(err error) error {
	return &FieldError{Field: f.ColumnName(), Ext: f.Ext, Err: err}
}

// parseInt parses an optionally signed decimal int64 with surrounding ASCII
// whitespace.
func parseInt(b []byte) (int64, bool) {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' }
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	neg := false
	if len(b) > 0 && (b[0] == '+' || b[0] == '-') {
		neg = b[0] == '-'
		b = b[1:]
	}
	if len(b) == 0 {
		return 0, false
	}
	var u uint64
	const limit = 1 << 63
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		if u > (limit-uint64(c-'0'))/10 {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
	}
	if neg {
		return -int64(u), true // u == 1<<63 wraps to MinInt64, as wanted
	}
	if u == limit {
		return 0, false
	}
	return int64(u), true
}

// quotePrefix quotes at most 32 bytes of b for an error message.
func quotePrefix(b []byte) string {
	if len(b) > 32 {
		return strconv.Quote(string(b[:32])) + "..."
	}
	return strconv.Quote(string(b))
}

// firstInvalidUTF8 returns the offset of the first byte that starts no valid UTF-8
// sequence, or -1.
func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

// Gzip flags (RFC 1952).
const (
	gzFHCRC    = 1 << 1
	gzFEXTRA   = 1 << 2
	gzFNAME    = 1 << 3
	gzFCOMMENT = 1 << 4
)

// gzipHeaderLen checks a gzip member header at the start of b and returns its length.
func gzipHeaderLen(b []byte) (int, error) {
	if len(b) >= 2 && (b[0] != 0x1f || b[1] != 0x8b) {
		return 0, errf(ErrCorrupt, "not gzip (no 1f 8b magic)")
	}
	if len(b) < 10 {
		return 0, errf(ErrCorrupt, "truncated header")
	}
	if b[2] != 8 {
		return 0, errf(ErrCorrupt, "unknown compression method %d", b[2])
	}
	flg := b[3]
	if flg&0xe0 != 0 {
		return 0, errf(ErrCorrupt, "reserved header flags set")
	}
	i := 10
	if flg&gzFEXTRA != 0 {
		if len(b) < i+2 {
			return 0, errf(ErrCorrupt, "truncated header")
		}
		i += 2 + int(binary.LittleEndian.Uint16(b[i:]))
	}
	for _, fl := range [...]byte{gzFNAME, gzFCOMMENT} {
		if flg&fl != 0 {
			if i > len(b) {
				return 0, errf(ErrCorrupt, "truncated header")
			}
			j := bytes.IndexByte(b[i:], 0)
			if j < 0 {
				return 0, errf(ErrCorrupt, "truncated header")
			}
			i += j + 1
		}
	}
	if flg&gzFHCRC != 0 {
		if len(b) < i+2 {
			return 0, errf(ErrCorrupt, "truncated header")
		}
		if uint16(crc32.ChecksumIEEE(b[:i])) != binary.LittleEndian.Uint16(b[i:]) {
			return 0, errf(ErrCorrupt, "header checksum mismatch")
		}
		i += 2
	}
	if i > len(b) {
		return 0, errf(ErrCorrupt, "truncated header")
	}
	return i, nil
}

// gunzip inflates src (one or more gzip members, optionally followed by zero
// padding, as Python's gzip module accepts) into buf[:0], checking every member's
// CRC-32 and size. It returns the grown buffer; on error the buffer must not be used.
func (d *Decoder) gunzip(src, buf []byte, limit int64) ([]byte, error) {
	defer d.br.Reset(nil) // do not keep src reachable from the Decoder
	out := buf[:0]
	if len(src) >= 18 {
		// Size the buffer from the trailer's ISIZE (a hint: it may lie, so it is
		// clamped to deflate's best ratio and to the cap) plus one byte, so that
		// reaching the end of the stream needs no growth.
		hint := int64(binary.LittleEndian.Uint32(src[len(src)-4:]))
		hint = min(hint, int64(len(src))*1032+1024, limit)
		if need := int(hint) + 1; cap(out) < need {
			out = make([]byte, 0, need)
		}
	}
	for first := true; ; first = false {
		if !first {
			for len(src) > 0 && src[0] == 0 {
				src = src[1:]
			}
			if len(src) == 0 {
				return out, nil
			}
		}
		n, err := gzipHeaderLen(src)
		if err != nil {
			return out, err
		}
		body := src[n:]
		d.br.Reset(body)
		if d.fr == nil {
			d.fr = flate.NewReader(&d.br)
			d.frr = d.fr.(flate.Resetter)
		} else if err := d.frr.Reset(&d.br, nil); err != nil {
			return out, errf(ErrCorrupt, "%v", err)
		}
		start := len(out)
		out, err = d.inflate(out, limit)
		if err != nil {
			return out, err
		}
		trailer := body[len(body)-d.br.Len():]
		if len(trailer) < 8 {
			return out, errf(ErrCorrupt, "truncated trailer")
		}
		if crc32.ChecksumIEEE(out[start:]) != binary.LittleEndian.Uint32(trailer) {
			return out, errf(ErrCorrupt, "CRC-32 mismatch")
		}
		if uint32(len(out)-start) != binary.LittleEndian.Uint32(trailer[4:]) {
			return out, errf(ErrCorrupt, "size mismatch")
		}
		src = trailer[8:]
	}
}

// inflate appends the output of d.fr to out, at most limit bytes in all.
func (d *Decoder) inflate(out []byte, limit int64) ([]byte, error) {
	for {
		if len(out) == cap(out) {
			if int64(len(out)) > limit {
				return out, errf(ErrTooLarge, "over %d bytes (raise the field's MaxBytes)", limit)
			}
			grow := int64(max(cap(out), 4096))
			grow = min(grow, limit+1-int64(len(out)))
			out = slices.Grow(out, int(grow))
		}
		n, err := d.fr.Read(out[len(out):cap(out)])
		out = out[:len(out)+n]
		if int64(len(out)) > limit {
			return out, errf(ErrTooLarge, "over %d bytes (raise the field's MaxBytes)", limit)
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			if err == io.ErrUnexpectedEOF {
				return out, errf(ErrCorrupt, "truncated deflate data")
			}
			return out, errf(ErrCorrupt, "%v", err)
		}
	}
}
