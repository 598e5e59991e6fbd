package decode

import (
	"fmt"
	"strconv"
)

// DType is a NumPy numeric element type: bool, int8..int64, uint8..uint64,
// float16..float64, complex64 or complex128, always little-endian (or single-byte).
//
// The zero DType means "any" (no constraint) in a Field and "unknown" elsewhere. DType
// values are comparable with ==. The exported variables (Float32, Int64, ...) are the
// only non-zero values; get others from ParseDType.
//
// Big-endian types are not supported: shardload hands arrays to the trainer without
// copying them, so it cannot byte-swap them. ParseDType and ParseNPY reject a
// big-endian descr (">f4") unless the type is a single byte (">u1" is "|u1").
type DType struct{ id uint8 }

type dtypeInfo struct {
	name  string
	descr string // canonical NumPy descr, as numpy writes it in .npy headers
	kind  byte   // NumPy kind character: b i u f c
	size  int
}

var dtypeTable = [...]dtypeInfo{
	{}, // the zero DType
	{"bool", "|b1", 'b', 1},
	{"int8", "|i1", 'i', 1},
	{"int16", "<i2", 'i', 2},
	{"int32", "<i4", 'i', 4},
	{"int64", "<i8", 'i', 8},
	{"uint8", "|u1", 'u', 1},
	{"uint16", "<u2", 'u', 2},
	{"uint32", "<u4", 'u', 4},
	{"uint64", "<u8", 'u', 8},
	{"float16", "<f2", 'f', 2},
	{"float32", "<f4", 'f', 4},
	{"float64", "<f8", 'f', 8},
	{"complex64", "<c8", 'c', 8},
	{"complex128", "<c16", 'c', 16},
}

// The supported element types.
var (
	Bool       = DType{1}  // NumPy bool, "|b1", one byte per element
	Int8       = DType{2}  // "|i1"
	Int16      = DType{3}  // "<i2"
	Int32      = DType{4}  // "<i4"
	Int64      = DType{5}  // "<i8"
	Uint8      = DType{6}  // "|u1"
	Uint16     = DType{7}  // "<u2"
	Uint32     = DType{8}  // "<u4"
	Uint64     = DType{9}  // "<u8"
	Float16    = DType{10} // "<f2"
	Float32    = DType{11} // "<f4"
	Float64    = DType{12} // "<f8"
	Complex64  = DType{13} // "<c8"
	Complex128 = DType{14} // "<c16"
)

// DTypes returns every supported DType, in a fixed order.
func DTypes() []DType {
	out := make([]DType, 0, len(dtypeTable)-1)
	for i := 1; i < len(dtypeTable); i++ {
		out = append(out, DType{uint8(i)})
	}
	return out
}

func (d DType) info() *dtypeInfo {
	if int(d.id) < len(dtypeTable) {
		return &dtypeTable[d.id]
	}
	return &dtypeTable[0]
}

// Name returns the NumPy name ("float32"), or "" for the zero DType.
func (d DType) Name() string { return d.info().name }

// Size returns the bytes per element (4 for float32), or 0 for the zero DType.
func (d DType) Size() int { return d.info().size }

// Descr returns the canonical little-endian NumPy descr ("<f4", "|u1", "|b1"), the
// string numpy writes in .npy headers and accepts in np.dtype; "" for the zero DType.
// A DType parsed from a different spelling of the same type ("<u1", ">i1", "float32")
// reports the canonical one.
func (d DType) Descr() string { return d.info().descr }

// IsZero reports whether d is the zero DType ("any").
func (d DType) IsZero() bool { return d.id == 0 }

// String returns Name, or "any" for the zero DType.
func (d DType) String() string {
	if d.id == 0 {
		return "any"
	}
	return d.Name()
}

// MarshalText encodes d as its Descr (which numpy accepts directly); the zero DType
// encodes as the empty string.
func (d DType) MarshalText() ([]byte, error) { return []byte(d.Descr()), nil }

// UnmarshalText decodes what ParseDType accepts; the empty string gives the zero DType.
func (d *DType) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*d = DType{}
		return nil
	}
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// ParseDType parses a NumPy dtype name ("float32", "uint8", "bool", "complex64") or a
// NumPy descr: a byte-order character ('<' little, '>' big, '|' not applicable)
// followed by a kind (b i u f c) and the size in bytes ("<f4", "|u1", "|b1", "<c16").
// A multi-byte type needs '<'; '>' gives a "big-endian ... not supported" error and
// '|' a "no byte order" error. Single-byte types take any of the three.
// Object, string, unicode, void, datetime and structured dtypes are not supported.
func ParseDType(s string) (DType, error) {
	for i := 1; i < len(dtypeTable); i++ {
		if dtypeTable[i].name == s {
			return DType{uint8(i)}, nil
		}
	}
	d, p := parseDescr([]byte(s))
	switch p {
	case descrOK:
		return d, nil
	case descrBigEndian:
		return DType{}, fmt.Errorf("decode: big-endian dtype %q not supported", s)
	case descrNoOrder:
		return DType{}, fmt.Errorf("decode: dtype %q has no byte order; use %q", s, "<"+s[1:])
	}
	return DType{}, fmt.Errorf("decode: unsupported dtype %q (want a numeric NumPy name like float32 or a descr like <f4)", s)
}

type descrProblem int

const (
	descrOK descrProblem = iota
	descrUnknown
	descrBigEndian
	descrNoOrder
)

// parseDescr parses a numeric descr like "<f4" without allocating.
func parseDescr(b []byte) (DType, descrProblem) {
	if len(b) < 3 || len(b) > 4 {
		return DType{}, descrUnknown
	}
	order, kind := b[0], b[1]
	size := 0
	for _, c := range b[2:] {
		if c < '0' || c > '9' {
			return DType{}, descrUnknown
		}
		size = size*10 + int(c-'0')
	}
	if b[2] == '0' {
		return DType{}, descrUnknown
	}
	var d DType
	for i := 1; i < len(dtypeTable); i++ {
		if dtypeTable[i].kind == kind && dtypeTable[i].size == size {
			d = DType{uint8(i)}
			break
		}
	}
	if d.id == 0 {
		return DType{}, descrUnknown
	}
	switch order {
	case '<':
		return d, descrOK
	case '>':
		if size == 1 {
			return d, descrOK
		}
		return d, descrBigEndian
	case '|':
		if size == 1 {
			return d, descrOK
		}
		return d, descrNoOrder
	}
	return DType{}, descrUnknown
}

// quoteDescr quotes a descr taken from a header for an error message.
func quoteDescr(b []byte) string {
	if len(b) > 40 {
		return strconv.Quote(string(b[:40])) + "..."
	}
	return strconv.Quote(string(b))
}
