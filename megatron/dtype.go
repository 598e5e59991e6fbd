package megatron

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// DType is the element type code stored in byte 17 of an .idx file: the numeric
// type of every token in the .bin. The codes are Megatron-LM's (DType in
// megatron/core/datasets/indexed_dataset.py); every value is little-endian.
type DType uint8

// The dtype codes Megatron-LM defines. Float32 and Float64 are valid codes but cannot
// hold tokens: Parse, NewWriter and AppendTokens refuse them with ErrFloatDType.
const (
	Uint8   DType = 1
	Int8    DType = 2
	Int16   DType = 3
	Int32   DType = 4
	Int64   DType = 5
	Float64 DType = 6
	Float32 DType = 7
	Uint16  DType = 8
)

var dtypeNames = [...]string{
	Uint8:   "uint8",
	Int8:    "int8",
	Int16:   "int16",
	Int32:   "int32",
	Int64:   "int64",
	Float64: "float64",
	Float32: "float32",
	Uint16:  "uint16",
}

var dtypeSizes = [...]int{
	Uint8:   1,
	Int8:    1,
	Int16:   2,
	Int32:   4,
	Int64:   8,
	Float64: 8,
	Float32: 4,
	Uint16:  2,
}

// Known reports whether d is one of the eight codes Megatron-LM defines.
func (d DType) Known() bool { return d >= Uint8 && d <= Uint16 }

// Integer reports whether d is a known integer code, one that can hold tokens.
func (d DType) Integer() bool { return d.Known() && d != Float32 && d != Float64 }

// Size is the size of one element in bytes, or 0 for an unknown code.
func (d DType) Size() int {
	if !d.Known() {
		return 0
	}
	return dtypeSizes[d]
}

// String is NumPy's name of the type ("uint16"), or "dtype(N)" for an unknown code.
func (d DType) String() string {
	if !d.Known() {
		return "dtype(" + strconv.Itoa(int(d)) + ")"
	}
	return dtypeNames[d]
}

// tokenDType returns nil when d can hold tokens, or the error saying why not.
func tokenDType(d DType) error {
	switch {
	case !d.Known():
		return fmt.Errorf("%w: code %d", ErrDType, uint8(d))
	case !d.Integer():
		return fmt.Errorf("%w: %s (code %d)", ErrFloatDType, d, uint8(d))
	}
	return nil
}

// bounds is the range of token values dtype d can store.
func (d DType) bounds() (lo, hi int64) {
	switch d {
	case Uint8:
		return 0, math.MaxUint8
	case Int8:
		return math.MinInt8, math.MaxInt8
	case Int16:
		return math.MinInt16, math.MaxInt16
	case Int32:
		return math.MinInt32, math.MaxInt32
	case Uint16:
		return 0, math.MaxUint16
	}
	return math.MinInt64, math.MaxInt64
}

// AppendTokens decodes b, little-endian elements of dtype dt as a .bin holds them,
// appends them to dst as int64 and returns the extended slice. It allocates only
// when dst lacks room for len(b)/dt.Size() more tokens. It fails, returning dst
// unchanged, when dt is not an integer code (ErrDType, ErrFloatDType) or when len(b)
// is not a multiple of the element size (ErrPartialToken).
func AppendTokens(dst []int64, b []byte, dt DType) ([]int64, error) {
	if err := tokenDType(dt); err != nil {
		return dst, err
	}
	size := dt.Size()
	if len(b)%size != 0 {
		return dst, fmt.Errorf("%w: %d bytes of %s", ErrPartialToken, len(b), dt)
	}
	n := len(b) / size
	start := len(dst)
	dst = slices.Grow(dst, n)[:start+n]
	out := dst[start:]
	switch dt {
	case Uint8:
		for i, v := range b[:n] {
			out[i] = int64(v)
		}
	case Int8:
		for i, v := range b[:n] {
			out[i] = int64(int8(v))
		}
	case Uint16:
		widen16(out, b, false)
	case Int16:
		widen16(out, b, true)
	case Int32:
		widen32(out, b)
	case Int64:
		for i := range out {
			out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
	}
	return dst, nil
}

// widen16 writes the len(out) little-endian 16-bit elements of b into out, sign
// extended when signed. Eight at a time, from constant offsets of fixed-length
// slices, the loop has no bounds checks: the decode of packed rows runs at several
// GB/s (BenchmarkAppendTokens).
func widen16(out []int64, b []byte, signed bool) {
	le := binary.LittleEndian
	b = b[:2*len(out)]
	if signed {
		for len(out) >= 8 {
			o, s := out[:8:8], b[:16:16]
			o[0], o[1] = int64(int16(le.Uint16(s[0:]))), int64(int16(le.Uint16(s[2:])))
			o[2], o[3] = int64(int16(le.Uint16(s[4:]))), int64(int16(le.Uint16(s[6:])))
			o[4], o[5] = int64(int16(le.Uint16(s[8:]))), int64(int16(le.Uint16(s[10:])))
			o[6], o[7] = int64(int16(le.Uint16(s[12:]))), int64(int16(le.Uint16(s[14:])))
			out, b = out[8:], b[16:]
		}
		for i := range out {
			out[i] = int64(int16(le.Uint16(b[2*i:])))
		}
		return
	}
	for len(out) >= 8 {
		o, s := out[:8:8], b[:16:16]
		o[0], o[1] = int64(le.Uint16(s[0:])), int64(le.Uint16(s[2:]))
		o[2], o[3] = int64(le.Uint16(s[4:])), int64(le.Uint16(s[6:]))
		o[4], o[5] = int64(le.Uint16(s[8:])), int64(le.Uint16(s[10:]))
		o[6], o[7] = int64(le.Uint16(s[12:])), int64(le.Uint16(s[14:]))
		out, b = out[8:], b[16:]
	}
	for i := range out {
		out[i] = int64(le.Uint16(b[2*i:]))
	}
}

// widen32 writes the len(out) little-endian int32 elements of b into out, as widen16.
func widen32(out []int64, b []byte) {
	le := binary.LittleEndian
	b = b[:4*len(out)]
	for len(out) >= 8 {
		o, s := out[:8:8], b[:32:32]
		o[0], o[1] = int64(int32(le.Uint32(s[0:]))), int64(int32(le.Uint32(s[4:])))
		o[2], o[3] = int64(int32(le.Uint32(s[8:]))), int64(int32(le.Uint32(s[12:])))
		o[4], o[5] = int64(int32(le.Uint32(s[16:]))), int64(int32(le.Uint32(s[20:])))
		o[6], o[7] = int64(int32(le.Uint32(s[24:]))), int64(int32(le.Uint32(s[28:])))
		out, b = out[8:], b[32:]
	}
	for i := range out {
		out[i] = int64(int32(le.Uint32(b[4*i:])))
	}
}

// appendEncoded appends tokens to dst as little-endian elements of dt. The caller
// has checked that dt is an integer code and every token within its bounds.
func appendEncoded(dst []byte, tokens []int64, dt DType) []byte {
	switch dt {
	case Uint8, Int8:
		for _, t := range tokens {
			dst = append(dst, byte(t))
		}
	case Uint16, Int16:
		for _, t := range tokens {
			dst = binary.LittleEndian.AppendUint16(dst, uint16(t))
		}
	case Int32:
		for _, t := range tokens {
			dst = binary.LittleEndian.AppendUint32(dst, uint32(t))
		}
	case Int64:
		for _, t := range tokens {
			dst = binary.LittleEndian.AppendUint64(dst, uint64(t))
		}
	}
	return dst
}

// AppendTokens32 is AppendTokens to int32, for the dtypes every id of which an int32
// holds (uint8, int8, uint16, int16 and int32): it appends the tokens and returns
// true. For the others it appends nothing and returns false: the caller widens them
// with AppendTokens and checks each id.
func AppendTokens32(dst []int32, b []byte, dt DType) ([]int32, bool, error) {
	if err := tokenDType(dt); err != nil {
		return dst, false, err
	}
	size := dt.Size()
	if len(b)%size != 0 {
		return dst, false, fmt.Errorf("%w: %d bytes of %s", ErrPartialToken, len(b), dt)
	}
	n := len(b) / size
	start := len(dst)
	grow := func() []int32 {
		dst = slices.Grow(dst, n)[:start+n]
		return dst[start:]
	}
	le := binary.LittleEndian
	switch dt {
	case Uint8:
		out := grow()
		for i, v := range b[:n] {
			out[i] = int32(v)
		}
	case Int8:
		out := grow()
		for i, v := range b[:n] {
			out[i] = int32(int8(v))
		}
	case Uint16:
		out := grow()
		b = b[:2*n]
		for len(out) >= 8 {
			o, s := out[:8:8], b[:16:16]
			o[0], o[1] = int32(le.Uint16(s[0:])), int32(le.Uint16(s[2:]))
			o[2], o[3] = int32(le.Uint16(s[4:])), int32(le.Uint16(s[6:]))
			o[4], o[5] = int32(le.Uint16(s[8:])), int32(le.Uint16(s[10:]))
			o[6], o[7] = int32(le.Uint16(s[12:])), int32(le.Uint16(s[14:]))
			out, b = out[8:], b[16:]
		}
		for i := range out {
			out[i] = int32(le.Uint16(b[2*i:]))
		}
	case Int16:
		out := grow()
		for i := range out {
			out[i] = int32(int16(le.Uint16(b[2*i:])))
		}
	case Int32:
		out := grow()
		for i := range out {
			out[i] = int32(le.Uint32(b[4*i:]))
		}
	default:
		return dst, false, nil
	}
	return dst, true, nil
}
