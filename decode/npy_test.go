package decode

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestParseNPYLhotse(t *testing.T) {
	all, _ := readTar(t, lhotseShard)
	n := 0
	for name, b := range all {
		key, ok := strings.CutSuffix(name, ".npy")
		if !ok {
			continue
		}
		n++
		a, err := ParseNPY(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if a.DType != Float32 || a.FortranOrder || len(a.Shape) != 2 {
			t.Fatalf("%s: dtype %v fortran %v shape %v", name, a.DType, a.FortranOrder, a.Shape)
		}
		// The manifest beside each array gives its shape: frames x features.
		var m struct {
			NumFrames   int `json:"num_frames"`
			NumFeatures int `json:"num_features"`
		}
		if err := json.Unmarshal(all[key+".json"], &m); err != nil {
			t.Fatal(err)
		}
		if a.Shape[0] != m.NumFrames || a.Shape[1] != m.NumFeatures {
			t.Fatalf("%s: shape %v, manifest says (%d, %d)", name, a.Shape, m.NumFrames, m.NumFeatures)
		}
		if len(a.Data) != a.Shape[0]*a.Shape[1]*4 {
			t.Fatalf("%s: %d data bytes for shape %v", name, len(a.Data), a.Shape)
		}
		// Data aliases the input: it is its tail.
		if &a.Data[len(a.Data)-1] != &b[len(b)-1] {
			t.Fatalf("%s: Data does not alias the input", name)
		}
		// Log-mel features: finite, of plausible magnitude.
		for i := 0; i < len(a.Data); i += 4 {
			v := math.Float32frombits(binary.LittleEndian.Uint32(a.Data[i:]))
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || v < -100 || v > 100 {
				t.Fatalf("%s: element %d = %v", name, i/4, v)
			}
		}
		// The header is byte for byte what numpy writes, so the helper that the
		// hand-built tests use writes what numpy writes.
		want := npyFile(1, "<f4", false, a.Shape, a.Data)
		if !bytes.Equal(want, b) {
			t.Fatalf("%s: numpy-style header differs:\n%q\n%q", name, b[:128], want[:128])
		}
	}
	if n != 2 {
		t.Fatalf("%d arrays, want 2", n)
	}
}

func TestParseNPYHandBuilt(t *testing.T) {
	cases := []struct {
		name  string
		file  []byte
		dtype DType
		shape []int
	}{
		{"v1 3-d", npyFile(1, "<f4", false, []int{3, 4, 5}, seq(3*4*5*4)), Float32, []int{3, 4, 5}},
		{"v2", npyFile(2, "<i8", false, []int{2, 3}, seq(48)), Int64, []int{2, 3}},
		{"v3", npyFile(3, "<c16", false, []int{2}, seq(32)), Complex128, []int{2}},
		{"scalar", npyFile(1, "<f8", false, nil, seq(8)), Float64, []int{}},
		{"1-d", npyFile(1, "|u1", false, []int{5}, seq(5)), Uint8, []int{5}},
		{"bool", npyFile(1, "|b1", false, []int{4}, seq(4)), Bool, []int{4}},
		{"empty", npyFile(1, "<f4", false, []int{0, 3}, nil), Float32, []int{0, 3}},
		{"zero dim last", npyFile(1, "<f2", false, []int{7, 0}, nil), Float16, []int{7, 0}},
		{"big-endian single byte", npyFile(1, ">u1", false, []int{2}, seq(2)), Uint8, []int{2}},
		{"keys reordered, double quotes, no trailing comma",
			rawNPY(`{"shape": (2, 2), "descr": "<i4", "fortran_order": False}`, seq(16)), Int32, []int{2, 2}},
		{"odd spacing and newlines",
			rawNPY("{ 'descr' :'<u2' ,\n\t'fortran_order':False,'shape':( 3 , ) , }", seq(6)), Uint16, []int{3}},
		{"trailing comma in shape", rawNPY(`{'descr': '<u4', 'fortran_order': False, 'shape': (2, 1,), }`, seq(8)), Uint32, []int{2, 1}},
		{"python 2 long", rawNPY(`{'descr': '<i2', 'fortran_order': False, 'shape': (3L, 2L), }`, seq(12)), Int16, []int{3, 2}},
		{"header without padding", noPad(`{'descr': '|i1', 'fortran_order': False, 'shape': (2,), }`, seq(2)), Int8, []int{2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := ParseNPY(c.file)
			if err != nil {
				t.Fatal(err)
			}
			if a.DType != c.dtype || !slices.Equal(a.Shape, c.shape) || a.Shape == nil {
				t.Fatalf("got %v %#v, want %v %v", a.DType, a.Shape, c.dtype, c.shape)
			}
			n, _ := byteSize(c.shape, c.dtype.Size())
			if int64(len(a.Data)) != n || !bytes.HasSuffix(c.file, a.Data) {
				t.Fatalf("data: %d bytes, want %d", len(a.Data), n)
			}
			if cap(a.Data) != len(a.Data) {
				t.Fatal("Data capacity not capped")
			}
		})
	}
}

func TestParseNPYErrors(t *testing.T) {
	v1 := npyFile(1, "<f4", false, []int{2, 3}, seq(24))
	withVersion := func(major, minor byte) []byte {
		b := bytes.Clone(v1)
		b[6], b[7] = major, minor
		return b
	}
	longHeader := append([]byte("\x93NUMPY\x02\x00\xff\xff\xff\x7f{"), seq(10)...)
	cases := []struct {
		name string
		file []byte
		msg  string
	}{
		{"fortran", npyFile(1, "<f4", true, []int{2, 3}, seq(24)),
			"decode: Fortran-order .npy not supported; save with np.ascontiguousarray"},
		{"big-endian", npyFile(1, ">f4", false, []int{2, 3}, seq(24)), `decode: big-endian .npy ">f4" not supported`},
		{"big-endian int", npyFile(1, ">i8", false, []int{1}, seq(8)), `decode: big-endian .npy ">i8" not supported`},
		{"truncated data", v1[:len(v1)-1], "truncated: shape (2, 3) of float32 needs 24 data bytes, have 23"},
		{"no data", v1[:len(v1)-24], "truncated"},
		{"extra data", append(bytes.Clone(v1), 0), "extra bytes: shape (2, 3) of float32 needs 24 data bytes, have 25"},
		{"truncated header", v1[:40], "truncated header"},
		{"truncated prefix", v1[:8], "truncated: 8 bytes"},
		{"empty", nil, "truncated: 0 bytes"},
		{"no magic", append([]byte("PK\x03\x04"), v1[4:]...), "no \\x93NUMPY magic"},
		{"version 4", withVersion(4, 0), "unsupported format version 4.0"},
		{"version 1.1", withVersion(1, 1), "unsupported format version 1.1"},
		{"v2 header past the end", longHeader, "truncated header"},
		{"unicode", npyFile(1, "<U5", false, []int{2}, seq(40)), `.npy dtype "<U5" not supported`},
		{"bytes", npyFile(1, "|S3", false, []int{2}, seq(6)), `.npy dtype "|S3" not supported`},
		{"object", npyFile(1, "|O", false, []int{2}, seq(16)), `.npy dtype "|O" not supported`},
		{"datetime", npyFile(1, "<M8[ns]", false, []int{2}, seq(16)), `not supported`},
		{"float128", npyFile(1, "<f16", false, []int{1}, seq(16)), `not supported`},
		{"structured", rawNPY(`{'descr': [('x', '<f4'), ('y', '<f4')], 'fortran_order': False, 'shape': (2,), }`, seq(16)),
			"structured dtypes not supported"},
		{"shape not a tuple", rawNPY(`{'descr': '<f4', 'fortran_order': False, 'shape': (2), }`, seq(8)), "not a tuple"},
		{"shape a list", rawNPY(`{'descr': '<f4', 'fortran_order': False, 'shape': [2], }`, seq(8)), "not a tuple"},
		{"negative dim", rawNPY(`{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }`, seq(8)), "expected a dimension"},
		{"overflow", rawNPY(`{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }`, nil), "absurd shape"},
		{"overflow with zero dim", rawNPY(`{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4611686018427387904, 4), }`, nil), "absurd shape"},
		{"huge dim", rawNPY(`{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }`, nil), "absurd shape"},
		{"too many dims", rawNPY(`{'descr': '|u1', 'fortran_order': False, 'shape': (`+strings.Repeat("1, ", 65)+`), }`, seq(1)), "more than 64 dimensions"},
		{"leading zero", rawNPY(`{'descr': '<f4', 'fortran_order': False, 'shape': (02,), }`, seq(8)), "leading zero"},
		{"float dim", rawNPY(`{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,), }`, seq(8)), "expected ',' or ')'"},
		{"fortran 0", rawNPY(`{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }`, seq(8)), "not True or False"},
		{"fortran Falsey", rawNPY(`{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,), }`, seq(8)), "not True or False"},
		{"missing shape", rawNPY(`{'descr': '<f4', 'fortran_order': False}`, seq(4)), "no 'shape'"},
		{"missing descr", rawNPY(`{'shape': (1,), 'fortran_order': False}`, seq(4)), "no 'descr'"},
		{"missing fortran", rawNPY(`{'shape': (1,), 'descr': '<f4'}`, seq(4)), "no 'fortran_order'"},
		{"duplicate key", rawNPY(`{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}`, seq(4)), `duplicate key "descr"`},
		{"unknown key", rawNPY(`{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}`, seq(4)), `unexpected key "extra"`},
		{"junk after dict", rawNPY(`{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x`, seq(4)), "after the header dict"},
		{"no dict", rawNPY(`descr`, seq(4)), "expected '{'"},
		{"backslash", rawNPY(`{'descr': '<f\\4', 'fortran_order': False, 'shape': (1,)}`, seq(4)), "descr is not a string"},
		{"two commas", rawNPY(`{'descr': '<f4',, 'fortran_order': False, 'shape': (1,)}`, seq(4)), "expected a quoted key"},
		{"empty dict", rawNPY(`{}`, nil), "no 'descr'"},
		{"nul padding", append(wrapHeader(1, `{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}`+"\x00"), seq(4)...), "after the header dict"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseNPY(c.file)
			wantErr(t, err, ErrBadNPY, c.msg)
		})
	}
}

func TestFormatShape(t *testing.T) {
	for _, c := range []struct {
		s    []int
		want string
	}{{nil, "()"}, {[]int{5}, "(5,)"}, {[]int{3, 224, 224}, "(3, 224, 224)"}} {
		if got := FormatShape(c.s); got != c.want {
			t.Errorf("FormatShape(%v) = %q, want %q", c.s, got, c.want)
		}
	}
}

// noPad frames a version 1.0 header with no padding and no newline.
func noPad(header string, data []byte) []byte {
	b := []byte(npyMagic + "\x01\x00")
	b = binary.LittleEndian.AppendUint16(b, uint16(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

// TestNPYMemoIsAFreshParse decodes a run of members with one Decoder, which keeps the
// last header it parsed, and each member again with a Decoder of its own: every value
// and error must be the same. The run repeats headers before data of another length,
// changes one byte of a header (the dtype, the shape) at the same length, and puts
// broken members between good ones.
func TestNPYMemoIsAFreshParse(t *testing.T) {
	i4 := npyFile(1, "<i4", false, []int{2, 3}, seq(24))
	f4 := npyFile(1, "<f4", false, []int{2, 3}, seq(24))  // the same length, another dtype
	i4t := npyFile(1, "<i4", false, []int{3, 2}, seq(24)) // the same length, another shape
	short := i4[:len(i4)-4]                               // the same header, truncated data
	long := append(slices.Clone(i4), 0, 0, 0, 0)          // the same header, extra bytes
	broken := slices.Clone(i4)
	broken[len(npyMagic)+4] = '[' // the same length, a bad dict
	members := [][]byte{i4, i4, f4, i4, short, i4, long, i4, i4t, i4, broken, i4, f4, f4, i4t}
	fields := []Field{
		{Name: "any", Ext: "npy", Kind: KindNPY},
		{Name: "i4", Ext: "npy", Kind: KindNPY, DType: Int32},
		{Name: "i4x23", Ext: "npy", Kind: KindNPY, DType: Int32, Shape: []int{2, 3}},
	}
	for _, f := range fields {
		var memo Decoder
		for i, m := range members {
			var fresh Decoder
			want, _, werr := fresh.Decode(&f, m, nil)
			got, _, gerr := memo.Decode(&f, m, nil)
			if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
				t.Fatalf("field %s, member %d: error %v, a fresh parse gives %v", f.Name, i, gerr, werr)
			}
			if got.DType != want.DType || !slices.Equal(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) || len(got.Data) > 0 && &got.Data[0] != &m[len(m)-len(got.Data)] {
				t.Fatalf("field %s, member %d: got %v %v %d bytes, a fresh parse gives %v %v %d bytes", f.Name, i, got.DType, got.Shape, len(got.Data), want.DType, want.Shape, len(want.Data))
			}
		}
	}
}
