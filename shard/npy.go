package shard

// The header of a .npy member, as far as an index records it: the element type and
// the element count of a 1-D array, read from the header bytes alone.

import (
	"encoding/binary"
	"io"
	"slices"
	"strings"
)

// MaxNPYHeader is the most bytes of a .npy member's start that ReadNPYHeader reads: the
// magic, version and length (12 bytes at most) and a header dict of up to 64 KiB (a
// format 1.0 header's most; numpy writes about 120 bytes for a 1-D array).
const MaxNPYHeader = 12 + 64<<10

// npyMagic starts every .npy file.
const npyMagic = "\x93NUMPY"

// IsNPY reports whether a member of extension ext is a .npy array by its name: ext
// is "npy" or ends in ".npy" ("tokens.npy").
func IsNPY(ext string) bool { return ext == "npy" || strings.HasSuffix(ext, ".npy") }

// ReadNPYHeader reads the header of a .npy member from its data r and appends it to
// buf: the magic, the format version, the header's length and the header dict, and
// nothing of the array. It stops early, with what it read and no error, at bytes that
// are no .npy header (another magic, an unknown version, a header longer than
// MaxNPYHeader) or at the member's end; an error is r's.
func ReadNPYHeader(r io.Reader, buf []byte) ([]byte, error) {
	start := len(buf)
	read := func(n int) error {
		buf = slices.Grow(buf, n)[:len(buf)+n]
		m, err := io.ReadFull(r, buf[len(buf)-n:])
		buf = buf[:len(buf)-n+m]
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return io.EOF
		}
		return err
	}
	if err := read(10); err != nil {
		return buf, ignoreEOF(err)
	}
	h := buf[start:]
	if string(h[:6]) != npyMagic {
		return buf, nil
	}
	var n int
	switch h[6] {
	case 1:
		n = int(binary.LittleEndian.Uint16(h[8:10]))
	case 2, 3:
		if err := read(2); err != nil {
			return buf, ignoreEOF(err)
		}
		n64 := binary.LittleEndian.Uint32(buf[start+8:])
		if n64 > MaxNPYHeader-12 {
			return buf, nil
		}
		n = int(n64)
	default:
		return buf, nil
	}
	return buf, ignoreEOF(read(n))
}

func ignoreEOF(err error) error {
	if err == io.EOF {
		return nil
	}
	return err
}

// npyDTypes are the element types an index records, as their canonical descr (the
// numeric types a .npy decoder reads: little-endian, or single bytes), with their
// sizes.
var npyDTypes = [...]struct {
	descr string
	size  int
}{
	{"|b1", 1}, {"|i1", 1}, {"<i2", 2}, {"<i4", 4}, {"<i8", 8},
	{"|u1", 1}, {"<u2", 2}, {"<u4", 4}, {"<u8", 8},
	{"<f2", 2}, {"<f4", 4}, {"<f8", 8}, {"<c8", 8}, {"<c16", 16},
}

// NPYItemSize returns the bytes of one element of dtype, a descr as Members.DType
// returns it ("<u2": 2), and false for any other string.
func NPYItemSize(dtype string) (int, bool) {
	for _, d := range npyDTypes {
		if d.descr == dtype {
			return d.size, true
		}
	}
	return 0, false
}

// canonicalDType returns the canonical descr of the header's descr b ('>u1' and
// '|u1' are "|u1"), or "" for a type an index does not record: big-endian multi-byte,
// strings, objects, structured, unknown.
func canonicalDType(b []byte) string {
	if len(b) < 3 || len(b) > 4 {
		return ""
	}
	order, rest := b[0], string(b[1:])
	for _, d := range npyDTypes {
		if d.descr[1:] != rest {
			continue
		}
		switch {
		case order == '<' && d.size > 1, order == d.descr[0]:
			return d.descr
		case d.size == 1 && (order == '<' || order == '>' || order == '='):
			return d.descr
		}
		return ""
	}
	return ""
}

// npy1D parses head, the start of a .npy member of size bytes (ReadNPYHeader's, or
// the whole member), and returns the dtype (canonicalDType) and the element count of
// the 1-D array it holds. ok is false for anything else: no .npy header, a shape of
// other than one dimension, Fortran order, a dtype an index does not record, or a
// member whose bytes are not the header and exactly the array's data.
func npy1D(head []byte, size int64) (dtype string, items int64, ok bool) {
	if len(head) < 10 || string(head[:6]) != npyMagic || head[7] != 0 {
		return "", 0, false
	}
	var pre, n int
	switch head[6] {
	case 1:
		pre, n = 10, int(binary.LittleEndian.Uint16(head[8:10]))
	case 2, 3:
		if len(head) < 12 {
			return "", 0, false
		}
		n64 := binary.LittleEndian.Uint32(head[8:12])
		if n64 > MaxNPYHeader {
			return "", 0, false
		}
		pre, n = 12, int(n64)
	default:
		return "", 0, false
	}
	if len(head) < pre+n {
		return "", 0, false
	}
	descr, dims, ok := parseNPYDict(head[pre : pre+n])
	if !ok || dims < 0 {
		return "", 0, false
	}
	dtype = canonicalDType(descr)
	isz, known := NPYItemSize(dtype)
	if !known || dims > (size-int64(pre+n))/int64(isz) || int64(pre+n)+dims*int64(isz) != size {
		return "", 0, false
	}
	return dtype, dims, true
}

// parseNPYDict parses a .npy header dict, {'descr': '<u2', 'fortran_order': False,
// 'shape': (N,), } in any order and spacing, with single or double quotes: the descr
// and N, with ok false for another shape, Fortran order, other keys or anything numpy
// does not write.
func parseNPYDict(b []byte) (descr []byte, n int64, ok bool) {
	i := 0
	ws := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
	}
	peek := func() byte {
		if i < len(b) {
			return b[i]
		}
		return 0
	}
	quoted := func() ([]byte, bool) {
		q := peek()
		if q != '\'' && q != '"' {
			return nil, false
		}
		for j := i + 1; j < len(b); j++ {
			switch b[j] {
			case q:
				s := b[i+1 : j]
				i = j + 1
				return s, true
			case '\\':
				return nil, false
			}
		}
		return nil, false
	}
	word := func(w string) bool {
		if !strings.HasPrefix(string(b[i:min(len(b), i+len(w))]), w) {
			return false
		}
		i += len(w)
		return true
	}
	integer := func() (int64, bool) {
		start, v := i, int64(0)
		for i < len(b) && b[i] >= '0' && b[i] <= '9' && i-start < 18 {
			v = v*10 + int64(b[i]-'0')
			i++
		}
		if i == start || (b[start] == '0' && i-start > 1) || (i < len(b) && b[i] >= '0' && b[i] <= '9') {
			return 0, false
		}
		if peek() == 'L' {
			i++
		}
		return v, true
	}
	ws()
	if peek() != '{' {
		return nil, 0, false
	}
	i++
	var seen [3]bool
	n = -1
	for {
		ws()
		if peek() == '}' {
			i++
			break
		}
		key, isKey := quoted()
		ws()
		if !isKey || peek() != ':' {
			return nil, 0, false
		}
		i++
		ws()
		switch string(key) {
		case "descr":
			if seen[0] {
				return nil, 0, false
			}
			seen[0] = true
			if descr, ok = quoted(); !ok {
				return nil, 0, false
			}
		case "fortran_order":
			if seen[1] || !word("False") {
				return nil, 0, false
			}
			seen[1] = true
		case "shape":
			if seen[2] || peek() != '(' {
				return nil, 0, false
			}
			seen[2] = true
			i++
			ws()
			v, isInt := integer()
			ws()
			if !isInt || peek() != ',' {
				return nil, 0, false // (), or a shape of more dimensions: not 1-D
			}
			i++
			ws()
			if peek() != ')' {
				return nil, 0, false
			}
			i++
			n = v
		default:
			return nil, 0, false
		}
		ws()
		switch peek() {
		case ',':
			i++
		case '}':
		default:
			return nil, 0, false
		}
	}
	ws()
	if i != len(b) || !seen[0] || !seen[1] || !seen[2] {
		return nil, 0, false
	}
	return descr, n, true
}
