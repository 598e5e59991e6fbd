package testutil

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
)

// NPY builds a .npy file as numpy writes it: format version major (1, 2 or 3), the
// header dict numpy's _write_array_header writes (keys sorted, repr values, spare
// spaces for growing the first axis) and data.
func NPY(major byte, descr string, fortran bool, shape []int, data []byte) []byte {
	return append(NPYHeader(major, NumpyHeader(descr, fortran, shape)), data...)
}

// NumpyHeader returns the header dict text exactly as numpy's _write_array_header
// writes it (numpy/lib/format.py).
func NumpyHeader(descr string, fortran bool, shape []int) string {
	fo := "False"
	if fortran {
		fo = "True"
	}
	h := "{'descr': '" + descr + "', 'fortran_order': " + fo + ", 'shape': " + pyTuple(shape) + ", }"
	if len(shape) > 0 {
		axis := shape[0]
		if fortran {
			axis = shape[len(shape)-1]
		}
		h += strings.Repeat(" ", 21-len(strconv.Itoa(axis)))
	}
	return h
}

// NPYHeader frames a header dict as numpy's _wrap_header does for a version: magic,
// version, little-endian length (uint16 for 1.0, uint32 for 2.0 and 3.0), the header
// padded with spaces and a final newline so the data starts at a multiple of 64.
func NPYHeader(major byte, header string) []byte {
	lenSize := 4
	if major == 1 {
		lenSize = 2
	}
	hlen := len(header) + 1
	pad := 64 - (8+lenSize+hlen)%64
	var b bytes.Buffer
	b.WriteString("\x93NUMPY")
	b.WriteByte(major)
	b.WriteByte(0)
	if lenSize == 2 {
		binary.Write(&b, binary.LittleEndian, uint16(hlen+pad))
	} else {
		binary.Write(&b, binary.LittleEndian, uint32(hlen+pad))
	}
	b.WriteString(header)
	b.WriteString(strings.Repeat(" ", pad))
	b.WriteByte('\n')
	return b.Bytes()
}

// pyTuple writes a shape as Python's repr of a tuple does: (), (5,), (3, 4). It is
// decode.FormatShape written again on purpose: decode's own tests use this package,
// which therefore cannot import decode.
func pyTuple(shape []int) string {
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

// ReadTar returns the regular members of a tar file, in order, as name -> bytes and
// the list of names.
func ReadTar(tb testing.TB, path string) (map[string][]byte, []string) {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	m := map[string][]byte{}
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			tb.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			tb.Fatal(err)
		}
		m[h.Name] = b
		names = append(names, h.Name)
	}
	return m, names
}
