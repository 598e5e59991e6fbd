package decode

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
)

// lhotseShard is a real Lhotse Shar shard (see ../testdata/README.md): two samples,
// each a float32 .npy feature matrix and a .json manifest.
const lhotseShard = "../testdata/lhotse__features.000000.tar"

// readTar returns the regular members of a tar file, in order, as name -> bytes and
// the list of names.
func readTar(tb testing.TB, path string) (map[string][]byte, []string) {
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

// lhotseNPYs returns the .npy members of the Lhotse shard, by member name.
func lhotseNPYs(tb testing.TB) map[string][]byte {
	tb.Helper()
	all, _ := readTar(tb, lhotseShard)
	out := map[string][]byte{}
	for name, b := range all {
		if strings.HasSuffix(name, ".npy") {
			out[name] = b
		}
	}
	if len(out) != 2 {
		tb.Fatalf("%s: %d .npy members, want 2", lhotseShard, len(out))
	}
	return out
}

// pyShape writes a shape as Python's repr of a tuple does.
func pyShape(shape []int) string { return formatShape(shape) }

// numpyHeader returns the header dict text exactly as numpy's _write_array_header
// writes it (numpy/lib/format.py): keys sorted, repr values, "}" then spare spaces
// for growing the first axis (GROWTH_AXIS_MAX_DIGITS = 21).
func numpyHeader(descr string, fortran bool, shape []int) string {
	fo := "False"
	if fortran {
		fo = "True"
	}
	h := "{'descr': '" + descr + "', 'fortran_order': " + fo + ", 'shape': " + pyShape(shape) + ", }"
	if len(shape) > 0 {
		axis := shape[0]
		if fortran {
			axis = shape[len(shape)-1]
		}
		h += strings.Repeat(" ", 21-len(strconv.Itoa(axis)))
	}
	return h
}

// wrapHeader frames a header dict as numpy's _wrap_header does for a version: magic,
// version, little-endian length (uint16 for 1.0, uint32 for 2.0 and 3.0), the header
// padded with spaces and a final newline so the data starts at a multiple of 64.
func wrapHeader(major byte, header string) []byte {
	lenSize := 4
	if major == 1 {
		lenSize = 2
	}
	hlen := len(header) + 1
	pad := 64 - (8+lenSize+hlen)%64
	var b bytes.Buffer
	b.WriteString(npyMagic)
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

// npyFile builds a .npy file as numpy would write it.
func npyFile(major byte, descr string, fortran bool, shape []int, data []byte) []byte {
	return append(wrapHeader(major, numpyHeader(descr, fortran, shape)), data...)
}

// rawNPY builds a .npy file around an arbitrary header dict text (version 1.0).
func rawNPY(header string, data []byte) []byte {
	return append(wrapHeader(1, header), data...)
}

// seq returns n bytes 0, 1, 2, ...
func seq(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

// wantErr checks that err matches target and that its message contains each of subs.
func wantErr(t *testing.T, err, target error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", target)
	}
	if target != nil && !errors.Is(err, target) {
		t.Fatalf("error %q does not match %v", err, target)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not contain %q", err, s)
		}
	}
}

// ciRequiresTurbo reports whether libjpeg-turbo must load: in CI, where
// scripts/deps.sh installs it and the binary is built with cgo.
func ciRequiresTurbo() bool { return os.Getenv("CI") == "true" && cgoEnabled }

// tarprocShard is a real shard of 90 PNG images and labels (see testdata/README.md).
const tarprocShard = "../testdata/tarproc__sample.tar"

// tarprocSamples returns the PNG members of the tarproc shard, in shard order.
func tarprocSamples(tb testing.TB) [][]byte {
	tb.Helper()
	all, names := readTar(tb, tarprocShard)
	var out [][]byte
	for _, n := range names {
		if strings.HasSuffix(n, ".png") {
			out = append(out, all[n])
		}
	}
	if len(out) != 90 {
		tb.Fatalf("%s: %d PNG members, want 90", tarprocShard, len(out))
	}
	return out
}
