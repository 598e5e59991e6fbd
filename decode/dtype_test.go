package decode

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseDTypeEvery(t *testing.T) {
	// Every NumPy numeric dtype: name, size, and the descr numpy writes in .npy
	// headers for it on a little-endian machine (np.dtype(name).str).
	cases := []struct {
		d     DType
		name  string
		size  int
		descr string
	}{
		{Bool, "bool", 1, "|b1"},
		{Int8, "int8", 1, "|i1"},
		{Int16, "int16", 2, "<i2"},
		{Int32, "int32", 4, "<i4"},
		{Int64, "int64", 8, "<i8"},
		{Uint8, "uint8", 1, "|u1"},
		{Uint16, "uint16", 2, "<u2"},
		{Uint32, "uint32", 4, "<u4"},
		{Uint64, "uint64", 8, "<u8"},
		{Float16, "float16", 2, "<f2"},
		{Float32, "float32", 4, "<f4"},
		{Float64, "float64", 8, "<f8"},
		{Complex64, "complex64", 8, "<c8"},
		{Complex128, "complex128", 16, "<c16"},
	}
	if got := len(DTypes()); got != len(cases) {
		t.Fatalf("DTypes() has %d, want %d", got, len(cases))
	}
	for i, c := range cases {
		if DTypes()[i] != c.d {
			t.Errorf("DTypes()[%d] = %v, want %v", i, DTypes()[i], c.d)
		}
		if c.d.Name() != c.name || c.d.Size() != c.size || c.d.Descr() != c.descr || c.d.String() != c.name {
			t.Errorf("%v: Name %q Size %d Descr %q; want %q %d %q", c.d, c.d.Name(), c.d.Size(), c.d.Descr(), c.name, c.size, c.descr)
		}
		for _, s := range []string{c.name, c.descr} {
			got, err := ParseDType(s)
			if err != nil || got != c.d {
				t.Errorf("ParseDType(%q) = %v, %v; want %v", s, got, err, c.d)
			}
		}
		b, err := c.d.MarshalText()
		if err != nil || string(b) != c.descr {
			t.Errorf("%v.MarshalText() = %q, %v", c.d, b, err)
		}
		var back DType
		if err := back.UnmarshalText(b); err != nil || back != c.d {
			t.Errorf("UnmarshalText(%q) = %v, %v", b, back, err)
		}
	}
}

func TestParseDTypeSpellings(t *testing.T) {
	cases := []struct {
		in   string
		want DType
	}{
		{"<u1", Uint8}, // numpy accepts any order for single bytes
		{">u1", Uint8},
		{">i1", Int8},
		{"<b1", Bool},
		{">b1", Bool},
		{"<c16", Complex128},
	}
	for _, c := range cases {
		got, err := ParseDType(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseDType(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
		if got.Descr() == c.in && c.in[0] != '<' && c.in[0] != '|' {
			t.Errorf("%q: descr not canonical", c.in)
		}
	}
}

func TestParseDTypeErrors(t *testing.T) {
	cases := []struct{ in, msg string }{
		{">f4", `decode: big-endian dtype ">f4" not supported`},
		{">i8", `big-endian`},
		{">c16", `big-endian`},
		{"|f4", `no byte order`},
		{"<f16", `unsupported dtype`}, // float128
		{"float128", `unsupported dtype`},
		{"<U5", `unsupported dtype`},
		{"|S3", `unsupported dtype`},
		{"|O", `unsupported dtype`},
		{"|V8", `unsupported dtype`},
		{"<M8[ns]", `unsupported dtype`},
		{"<f04", `unsupported dtype`},
		{"f4", `unsupported dtype`},
		{"Float32", `unsupported dtype`},
		{"", `unsupported dtype`},
		{"any", `unsupported dtype`},
	}
	for _, c := range cases {
		_, err := ParseDType(c.in)
		if err == nil {
			t.Errorf("ParseDType(%q) succeeded", c.in)
			continue
		}
		if !strings.Contains(err.Error(), c.msg) {
			t.Errorf("ParseDType(%q) = %q, want it to contain %q", c.in, err, c.msg)
		}
	}
}

func TestDTypeZeroAndJSON(t *testing.T) {
	var z DType
	if !z.IsZero() || z.Name() != "" || z.Size() != 0 || z.Descr() != "" || z.String() != "any" {
		t.Fatalf("zero DType: %q %d %q %q", z.Name(), z.Size(), z.Descr(), z.String())
	}
	type layout struct {
		A, B DType
		K    Kind
	}
	b, err := json.Marshal(layout{A: Float32, K: KindNPY})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"A":"\u003cf4","B":"","K":"npy"}` { // encoding/json escapes '<'

		t.Fatalf("json: %s", b)
	}
	var back layout
	if err := json.Unmarshal(b, &back); err != nil || back != (layout{A: Float32, K: KindNPY}) {
		t.Fatalf("unmarshal: %+v, %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"A":">f8"}`), &back); err == nil {
		t.Fatal("big-endian dtype unmarshalled")
	}
}
