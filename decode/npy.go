package decode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// MaxDims is the largest number of dimensions ParseNPY accepts (NumPy 2's limit).
const MaxDims = 64

// npyMagic starts every .npy file.
const npyMagic = "\x93NUMPY"

// NPY is a parsed .npy array: a C-order, little-endian (or single-byte), numeric array.
type NPY struct {
	// DType is the element type.
	DType DType
	// Shape is the array's shape; empty (len 0) for a 0-d (scalar) array.
	Shape []int
	// FortranOrder is the header's fortran_order. ParseNPY rejects Fortran-order
	// arrays, so it is always false in an NPY that ParseNPY returned without error;
	// it is here so the type describes a whole .npy header.
	FortranOrder bool
	// Data is the array data, prod(Shape)*DType.Size() bytes. It aliases the input
	// of ParseNPY (its capacity is capped, so appending to it copies).
	Data []byte
}

// npyHeader is what parseNPYHeader reads; it lives on the caller's stack so that
// parsing does not allocate.
type npyHeader struct {
	dtype   DType
	descr   []byte // the descr string as written (aliases the input)
	fortran bool
	ndim    int
	dims    [MaxDims]int
	dataOff int   // offset of the array data in the input
	nbytes  int64 // prod(dims) * itemsize
}

func (h *npyHeader) shape() []int { return h.dims[:h.ndim] }

func badNPY(format string, args ...any) error {
	return &sentinelError{ErrBadNPY, "decode: bad .npy: " + fmt.Sprintf(format, args...)}
}

// ParseNPY parses a .npy file (format versions 1.0, 2.0 and 3.0) held in data. It does
// not copy: NPY.Data aliases data.
//
// The header must be the Python dict literal numpy writes, e.g.
//
//	{'descr': '<f4', 'fortran_order': False, 'shape': (3, 224, 224), }
//
// with exactly the keys descr, fortran_order and shape, in any order, single- or
// double-quoted, with any spacing and optional trailing commas; shape is a tuple of
// non-negative integers: () for a scalar, (5,) for 1-D (Python 2's 5L is accepted).
// Anything else is rejected, as are: Fortran-order arrays; big-endian multi-byte
// dtypes; object, string, unicode, void, datetime and structured dtypes; shapes with
// more than MaxDims dimensions or whose byte size overflows; and data whose length is
// not exactly prod(shape)*itemsize (truncated or with extra bytes). Every error wraps
// ErrBadNPY.
func ParseNPY(data []byte) (NPY, error) {
	var h npyHeader
	if err := parseNPYHeader(data, &h); err != nil {
		return NPY{}, err
	}
	shape := make([]int, h.ndim)
	copy(shape, h.shape())
	return NPY{DType: h.dtype, Shape: shape, Data: data[h.dataOff:len(data):len(data)]}, nil
}

// parseNPYHeader parses and checks the .npy prefix, header and data length.
func parseNPYHeader(data []byte, h *npyHeader) error {
	if len(data) < 10 {
		if n := min(len(data), 6); string(data[:n]) == npyMagic[:n] {
			return badNPY("truncated: %d bytes", len(data))
		}
	}
	if len(data) < 10 || string(data[:6]) != npyMagic {
		return badNPY("no \\x93NUMPY magic")
	}
	major, minor := data[6], data[7]
	var hlen, pre int
	switch {
	case major == 1 && minor == 0:
		hlen, pre = int(binary.LittleEndian.Uint16(data[8:10])), 10
	case (major == 2 || major == 3) && minor == 0:
		if len(data) < 12 {
			return badNPY("truncated header")
		}
		n := binary.LittleEndian.Uint32(data[8:12])
		if uint64(n) > uint64(len(data)) {
			return badNPY("truncated header: %d header bytes, file has %d", n, len(data))
		}
		hlen, pre = int(n), 12
	default:
		return badNPY("unsupported format version %d.%d", major, minor)
	}
	if hlen > len(data)-pre {
		return badNPY("truncated header: %d header bytes, file has %d", hlen, len(data)-pre)
	}
	if err := parseHeaderDict(data[pre:pre+hlen], h); err != nil {
		return err
	}
	h.dataOff = pre + hlen

	d, problem := parseDescr(h.descr)
	switch problem {
	case descrBigEndian:
		return &sentinelError{ErrBadNPY, fmt.Sprintf("decode: big-endian .npy %s not supported", quoteDescr(h.descr))}
	case descrUnknown, descrNoOrder:
		return &sentinelError{ErrBadNPY, fmt.Sprintf("decode: .npy dtype %s not supported (only numeric dtypes are)", quoteDescr(h.descr))}
	}
	h.dtype = d
	if h.fortran {
		return &sentinelError{ErrBadNPY, "decode: Fortran-order .npy not supported; save with np.ascontiguousarray"}
	}
	n, ok := byteSize(h.shape(), d.Size())
	if !ok {
		return badNPY("absurd shape %s: size overflows", FormatShape(h.shape()))
	}
	h.nbytes = n
	if have := int64(len(data) - h.dataOff); have != n {
		what := "truncated"
		if have > n {
			what = "extra bytes"
		}
		return badNPY("%s: shape %s of %s needs %d data bytes, have %d", what, FormatShape(h.shape()), d.Name(), n, have)
	}
	return nil
}

// byteSize returns prod(shape)*size, and false if it overflows an int64.
func byteSize(shape []int, size int) (int64, bool) {
	prod := uint64(size)
	zero := false
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		if d == 0 {
			zero = true // still check the other dimensions for absurdity
			continue
		}
		hi, lo := bits.Mul64(prod, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		prod = lo
	}
	if zero {
		return 0, true
	}
	return int64(prod), true
}

// hparser parses the header dict literal.
type hparser struct {
	b []byte
	i int
}

func (p *hparser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *hparser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *hparser) errf(format string, args ...any) error {
	return badNPY("header: "+format+" at header byte %d", append(args, p.i)...)
}

// str parses a Python string literal without escapes.
func (p *hparser) str() ([]byte, bool) {
	q := p.peek()
	if q != '\'' && q != '"' {
		return nil, false
	}
	start := p.i + 1
	for j := start; j < len(p.b); j++ {
		switch p.b[j] {
		case q:
			p.i = j + 1
			return p.b[start:j], true
		case '\\', '\n', '\r':
			return nil, false
		}
	}
	return nil, false
}

// word parses True or False.
func (p *hparser) bool() (bool, bool) {
	rest := p.b[p.i:]
	switch {
	case bytes.HasPrefix(rest, []byte("True")):
		p.i += 4
		return true, p.identEnd()
	case bytes.HasPrefix(rest, []byte("False")):
		p.i += 5
		return false, p.identEnd()
	}
	return false, false
}

func (p *hparser) identEnd() bool {
	c := p.peek()
	return !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z')
}

// int parses a non-negative Python int literal (with an optional Python 2 L suffix).
func (p *hparser) int() (int, error) {
	start := p.i
	n := 0
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		d := int(p.b[p.i] - '0')
		if n > (math.MaxInt-d)/10 {
			return 0, badNPY("absurd shape: dimension %s... overflows", p.b[start:p.i])
		}
		n = n*10 + d
		p.i++
	}
	if p.i == start {
		return 0, p.errf("expected a dimension")
	}
	if p.b[start] == '0' && p.i-start > 1 {
		p.i = start
		return 0, p.errf("dimension with a leading zero")
	}
	if p.peek() == 'L' {
		p.i++
	}
	if !p.identEnd() {
		return 0, p.errf("bad dimension")
	}
	return n, nil
}

// tuple parses the shape tuple into h.dims.
func (p *hparser) tuple(h *npyHeader) error {
	if p.peek() != '(' {
		return p.errf("shape is not a tuple")
	}
	p.i++
	p.ws()
	if p.peek() == ')' {
		p.i++
		h.ndim = 0
		return nil
	}
	n := 0
	for {
		d, err := p.int()
		if err != nil {
			return err
		}
		if n == MaxDims {
			return badNPY("absurd shape: more than %d dimensions", MaxDims)
		}
		h.dims[n] = d
		n++
		p.ws()
		switch p.peek() {
		case ',':
			p.i++
			p.ws()
			if p.peek() == ')' {
				p.i++
				h.ndim = n
				return nil
			}
		case ')':
			if n == 1 {
				return p.errf("shape (%d) is not a tuple; a 1-d shape is written (%d,)", d, d)
			}
			p.i++
			h.ndim = n
			return nil
		default:
			return p.errf("expected ',' or ')' in shape")
		}
	}
}

// parseHeaderDict parses the header's dict literal into h (descr, fortran, dims).
func parseHeaderDict(b []byte, h *npyHeader) error {
	p := hparser{b: b}
	p.ws()
	if p.peek() != '{' {
		return p.errf("expected '{'")
	}
	p.i++
	const (
		seenDescr = 1 << iota
		seenFortran
		seenShape
	)
	seen := 0
	for {
		p.ws()
		if p.peek() == '}' {
			p.i++
			break
		}
		keyAt := p.i
		key, ok := p.str()
		if !ok {
			return p.errf("expected a quoted key or '}'")
		}
		p.ws()
		if p.peek() != ':' {
			return p.errf("expected ':'")
		}
		p.i++
		p.ws()
		var bit int
		switch string(key) {
		case "descr":
			bit = seenDescr
			if c := p.peek(); c == '[' || c == '{' {
				return badNPY("structured dtypes not supported")
			}
			d, ok := p.str()
			if !ok {
				return p.errf("descr is not a string")
			}
			h.descr = d
		case "fortran_order":
			bit = seenFortran
			v, ok := p.bool()
			if !ok {
				return p.errf("fortran_order is not True or False")
			}
			h.fortran = v
		case "shape":
			bit = seenShape
			if err := p.tuple(h); err != nil {
				return err
			}
		default:
			p.i = keyAt
			return p.errf("unexpected key %q", key)
		}
		if seen&bit != 0 {
			p.i = keyAt
			return p.errf("duplicate key %q", key)
		}
		seen |= bit
		p.ws()
		if p.peek() == ',' {
			p.i++
			continue
		}
		if p.peek() != '}' {
			return p.errf("expected ',' or '}'")
		}
		p.i++
		break
	}
	p.ws()
	if p.i != len(p.b) {
		return p.errf("unexpected bytes after the header dict")
	}
	switch {
	case seen&seenDescr == 0:
		return badNPY("header has no 'descr'")
	case seen&seenFortran == 0:
		return badNPY("header has no 'fortran_order'")
	case seen&seenShape == 0:
		return badNPY("header has no 'shape'")
	}
	return nil
}

// FormatShape writes a shape the way Python writes a tuple: (), (5,), (3, 4).
func FormatShape(shape []int) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, d := range shape {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(d))
	}
	if len(shape) == 1 {
		b.WriteByte(',')
	}
	b.WriteByte(')')
	return b.String()
}
