package decode

import (
	"bytes"
	stdgzip "compress/gzip"
	"errors"
	"hash/crc32"
	"io"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
)

// gz compresses b with the standard library's gzip writer.
func gz(tb testing.TB, b []byte, hdr stdgzip.Header) []byte {
	tb.Helper()
	var out bytes.Buffer
	w, err := stdgzip.NewWriterLevel(&out, stdgzip.BestCompression)
	if err != nil {
		tb.Fatal(err)
	}
	w.Header = hdr
	if _, err := w.Write(b); err != nil {
		tb.Fatal(err)
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	return out.Bytes()
}

func mustField(tb testing.TB, spec string) Field {
	tb.Helper()
	f, err := ParseField(spec)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

func TestDecode(t *testing.T) {
	arr := npyFile(1, "<i4", false, []int{2, 3}, seq(24))
	cases := []struct {
		spec  string
		in    []byte
		data  []byte // want Value.Data
		int   int64
		dtype DType
		shape []int
	}{
		{"img=jpg", []byte("\xff\xd8\xff\xe0 jpeg"), []byte("\xff\xd8\xff\xe0 jpeg"), 0, DType{}, nil},
		{"img=jpg", []byte{}, []byte{}, 0, DType{}, nil},
		{"cls", []byte("7"), nil, 7, DType{}, nil},
		{"cls", []byte(" 42\n"), nil, 42, DType{}, nil},
		{"cls", []byte("-3\r\n"), nil, -3, DType{}, nil},
		{"cls", []byte("+12"), nil, 12, DType{}, nil},
		{"cls", []byte("0"), nil, 0, DType{}, nil},
		{"cls", []byte("9223372036854775807"), nil, math.MaxInt64, DType{}, nil},
		{"cls", []byte("-9223372036854775808"), nil, math.MinInt64, DType{}, nil},
		{"txt", []byte("héllo wörld\n"), []byte("héllo wörld\n"), 0, DType{}, nil},
		{"json", []byte(`{"a": [1, 2.5, null]}`), []byte(`{"a": [1, 2.5, null]}`), 0, DType{}, nil},
		{"json", []byte(" 3 \n"), []byte(" 3 \n"), 0, DType{}, nil},
		{"a=npy", arr, arr[len(arr)-24:], 0, Int32, []int{2, 3}},
		{"a=npy:npy:int32", arr, arr[len(arr)-24:], 0, Int32, []int{2, 3}},
		{"a=npy:npy:<i4:2x3", arr, arr[len(arr)-24:], 0, Int32, []int{2, 3}},
		{"s=npy", npyFile(1, "<f8", false, nil, seq(8)), seq(8), 0, Float64, []int{}},
		{"t=txt.gz", gz(t, []byte("gzipped text"), stdgzip.Header{}), []byte("gzipped text"), 0, DType{}, nil},
		{"c=cls.gz", gz(t, []byte("5\n"), stdgzip.Header{Name: "x.cls"}), nil, 5, DType{}, nil},
		{"a=npy.gz:npy:int32:2x3", gz(t, arr, stdgzip.Header{}), arr[len(arr)-24:], 0, Int32, []int{2, 3}},
		{"b=bin.gz", gz(t, nil, stdgzip.Header{}), []byte{}, 0, DType{}, nil},
	}
	for _, c := range cases {
		f := mustField(t, c.spec)
		for _, dec := range []struct {
			name string
			fn   func(data, buf []byte) (Value, []byte, error)
		}{
			{"Field", f.Decode},
			{"Decoder", func(data, buf []byte) (Value, []byte, error) { return new(Decoder).Decode(&f, data, buf) }},
		} {
			v, _, err := dec.fn(c.in, nil)
			if err != nil {
				t.Errorf("%s %s(%q): %v", dec.name, c.spec, c.in, err)
				continue
			}
			if !bytes.Equal(v.Data, c.data) || (v.Data == nil) != (c.data == nil) || v.Int != c.int || v.DType != c.dtype || !slices.Equal(v.Shape, c.shape) || (v.Shape == nil) != (c.shape == nil) {
				t.Errorf("%s %s(%q) = %+v; want data %q int %d dtype %v shape %#v", dec.name, c.spec, c.in, v, c.data, c.int, c.dtype, c.shape)
			}
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	arr := npyFile(1, "<f4", false, []int{2, 3}, seq(24))
	cases := []struct {
		spec   string
		in     []byte
		target error
		msg    string
	}{
		{"label=cls", []byte("abc"), ErrNotInt, `field "label" (.cls): decode: not an integer: "abc"`},
		{"cls", []byte(""), ErrNotInt, "empty member"},
		{"cls", []byte(" \n"), ErrNotInt, "empty member"},
		{"cls", []byte("1.5"), ErrNotInt, `"1.5"`},
		{"cls", []byte("1 2"), ErrNotInt, `"1 2"`},
		{"cls", []byte("--1"), ErrNotInt, `"--1"`},
		{"cls", []byte("-"), ErrNotInt, `"-"`},
		{"cls", []byte("0x10"), ErrNotInt, `"0x10"`},
		{"cls", []byte("9223372036854775808"), ErrNotInt, `"9223372036854775808"`},
		{"cls", []byte("-9223372036854775809"), ErrNotInt, ""},
		{"cls", []byte(strings.Repeat("x", 100)), ErrNotInt, `"` + strings.Repeat("x", 32) + `"...`},
		{"txt", []byte("ok\xffno"), ErrNotUTF8, `field "txt" (.txt): decode: invalid UTF-8 at byte 2`},
		{"txt", []byte("\xe2\x82"), ErrNotUTF8, "at byte 0"},
		{"json", []byte(`{"a": }`), ErrBadJSON, "invalid JSON: invalid character '}'"},
		{"json", []byte(``), ErrBadJSON, "invalid JSON"},
		{"json", []byte(`{"a":1} {"b":2}`), ErrBadJSON, "invalid JSON"},
		{"a=npy:npy:float64", arr, ErrWrongDType, `field "a" (.npy): decode: wrong dtype: got float32, want float64`},
		{"a=npy:npy:float32:3x2", arr, ErrWrongShape, "decode: wrong shape: got (2, 3), want (3, 2)"},
		{"a=npy:npy:float32:6", arr, ErrWrongShape, "got (2, 3), want (6,)"},
		{"a=npy", arr[:len(arr)-4], ErrBadNPY, "truncated"},
		{"a=npy", []byte("not an array"), ErrBadNPY, "magic"},
		{"a=npy", npyFile(1, "<f4", true, []int{2, 3}, seq(24)), ErrBadNPY, "Fortran-order"},
		{"a=npy", npyFile(1, ">f4", false, []int{2, 3}, seq(24)), ErrBadNPY, `big-endian .npy ">f4"`},
		{"t=txt.gz", []byte("plain text, not gzip"), ErrCorrupt, "not gzip"},
		{"t=txt.gz", []byte{}, ErrCorrupt, "truncated header"},
		{"t=txt.gz", []byte{0x1f}, ErrCorrupt, "truncated header"},
		{"t=txt.gz", gz(t, []byte("hello"), stdgzip.Header{})[:12], ErrCorrupt, ""},
		{"t=txt.gz", gz(t, []byte(strings.Repeat("hello ", 100)), stdgzip.Header{})[:30], ErrCorrupt, ""},
		{"t=txt.gz", gz(t, []byte("hello"), stdgzip.Header{Name: "a-name-with-no-end"})[:20], ErrCorrupt, "truncated header"},
		{"t=txt.gz", append(gz(t, []byte("hello"), stdgzip.Header{}), "junk"...), ErrCorrupt, "not gzip"},
		{"t=txt.gz", corruptCRC(gz(t, []byte("hello"), stdgzip.Header{})), ErrCorrupt, "CRC-32 mismatch"},
		{"t=txt.gz", corruptSize(gz(t, []byte("hello"), stdgzip.Header{})), ErrCorrupt, "size mismatch"},
		{"t=txt.gz", corruptBody(gz(t, []byte(strings.Repeat("hello ", 100)), stdgzip.Header{})), ErrCorrupt, ""},
		{"t=txt.gz", gz(t, []byte("ok\xff"), stdgzip.Header{}), ErrNotUTF8, "at byte 2"},
	}
	for _, c := range cases {
		f := mustField(t, c.spec)
		buf := make([]byte, 0, 16)
		v, out, err := f.Decode(c.in, buf)
		t.Run(c.spec, func(t *testing.T) {
			wantErr(t, err, c.target, c.msg)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != f.ColumnName() || fe.Ext != f.Ext {
				t.Fatalf("error %#v is not a *FieldError for %q", err, f.ColumnName())
			}
			if v.Data != nil || v.Shape != nil {
				t.Fatalf("value on error: %+v", v)
			}
			if c.target != ErrNotUTF8 && (len(out) != len(buf) || cap(out) != cap(buf)) {
				t.Fatalf("buf changed on error")
			}
		})
	}
}

func corruptCRC(b []byte) []byte { b = bytes.Clone(b); b[len(b)-8] ^= 1; return b }
func corruptSize(b []byte) []byte {
	b = bytes.Clone(b)
	b[len(b)-4]++
	return b
}
func corruptBody(b []byte) []byte { b = bytes.Clone(b); b[14] ^= 0xff; return b }

func TestGunzipBomb(t *testing.T) {
	// 64 MiB of zeros compress to about 64 KiB.
	bomb := gz(t, make([]byte, 64<<20), stdgzip.Header{})
	for _, max := range []int64{1 << 20, 64<<20 - 1} {
		f := Field{Name: "b", Ext: "bin.gz", Gunzip: true, MaxBytes: max}
		var d Decoder
		_, buf, err := d.Decode(&f, bomb, nil)
		wantErr(t, err, ErrTooLarge, "over", "MaxBytes")
		if buf != nil {
			t.Fatal("buffer returned on error")
		}
	}
	// Exactly at the cap it inflates.
	f := Field{Name: "b", Ext: "bin.gz", Gunzip: true, MaxBytes: 64 << 20}
	v, _, err := f.Decode(bomb, nil)
	if err != nil || len(v.Data) != 64<<20 {
		t.Fatalf("at the cap: %d bytes, %v", len(v.Data), err)
	}
	// A lying ISIZE does not make the decoder allocate the cap up front.
	small := gz(t, []byte("tiny"), stdgzip.Header{})
	small[len(small)-1] = 0xff // claims ~4 GiB
	f = Field{Name: "b", Ext: "bin.gz", Gunzip: true}
	_, buf, err := f.Decode(small, nil)
	wantErr(t, err, ErrCorrupt, "size mismatch")
	if buf != nil {
		t.Fatal("buffer returned on error")
	}
}

func TestGunzipFormats(t *testing.T) {
	text := []byte(strings.Repeat("The quick brown fox. ", 50))
	one := gz(t, text[:300], stdgzip.Header{})
	two := gz(t, text[300:], stdgzip.Header{})
	cases := []struct {
		name string
		in   []byte
		want []byte
	}{
		{"header with name, comment, extra", gz(t, text, stdgzip.Header{Name: "x.txt", Comment: "c", Extra: []byte("ex")}), text},
		{"two members", append(bytes.Clone(one), two...), text},
		{"zero padding", append(bytes.Clone(one), 0, 0, 0, 0), text[:300]},
		{"header crc", withHeaderCRC(one), text[:300]},
	}
	for _, c := range cases {
		f := mustField(t, "t=txt.gz")
		v, _, err := new(Decoder).Decode(&f, c.in, nil)
		if err != nil || !bytes.Equal(v.Data, c.want) {
			t.Errorf("%s: %q, %v", c.name, v.Data, err)
		}
	}
	bad := withHeaderCRC(one)
	bad[10] ^= 1
	f := mustField(t, "t=txt.gz")
	_, _, err := f.Decode(bad, nil)
	wantErr(t, err, ErrCorrupt, "header checksum mismatch")
}

// withHeaderCRC sets FHCRC on a gzip member that has no optional header fields.
func withHeaderCRC(b []byte) []byte {
	out := bytes.Clone(b[:10])
	out[3] |= gzFHCRC
	crc := crc32.ChecksumIEEE(out)
	out = append(out, byte(crc), byte(crc>>8))
	return append(out, b[10:]...)
}

// TestGunzipRealMembers inflates the .txt.gz members of a real WebDataset shard and
// compares them with the standard library's gzip reader.
func TestGunzipRealMembers(t *testing.T) {
	members, names := readTar(t, "../testdata/webdataset__testgz.tar")
	f := mustField(t, "txt.gz")
	if f.Kind != KindText || !f.Gunzip {
		t.Fatalf("%+v", f)
	}
	var d Decoder
	var buf []byte
	n := 0
	for _, name := range names {
		if !strings.HasSuffix(name, ".txt.gz") {
			continue
		}
		zr, err := stdgzip.NewReader(bytes.NewReader(members[name]))
		if err != nil {
			t.Fatal(err)
		}
		want, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		var v Value
		v, buf, err = d.Decode(&f, members[name], buf)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(v.Data, want) {
			t.Fatalf("%s: got %q, want %q", name, v.Data, want)
		}
		n++
	}
	if n != 1000 {
		t.Fatalf("%d members, want 1000", n)
	}
}

func TestDecodeAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.Race {
		t.Skip("allocation counts differ under -cover and -race")
	}
	arr := lhotseNPYs(t)
	var lhotse []byte
	for _, b := range arr {
		lhotse = b
	}
	a, _ := ParseNPY(lhotse)
	fixed := Field{Name: "f", Ext: "npy", Kind: KindNPY, DType: Float32, Shape: a.Shape}
	text := bytes.Repeat([]byte("text "), 1000)
	zipped := gz(t, text, stdgzip.Header{Name: "with-a-name.txt"})
	zippedNPY := gz(t, lhotse, stdgzip.Header{})
	cases := []struct {
		spec  string
		field *Field
		in    []byte
	}{
		{"img=jpg", nil, seq(110 << 10)},
		{"cls", nil, []byte("17\n")},
		{"", &fixed, lhotse},
		{"a=npy:npy:int32:2x3", nil, npyFile(1, "<i4", false, []int{2, 3}, seq(24))},
		{"txt", nil, text},
		{"json", nil, []byte(`{"a": [1, 2, {"b": "c"}]}`)},
		{"t=txt.gz", nil, zipped},
		{"n=npy.gz:npy:float32:" + strings.Trim(strings.ReplaceAll(FormatShape(a.Shape), ", ", "x"), "()"), nil, zippedNPY},
	}
	for _, c := range cases {
		f := c.field
		if f == nil {
			ff := mustField(t, c.spec)
			f = &ff
		}
		var d Decoder
		var buf []byte
		var err error
		_, buf, err = d.Decode(f, c.in, buf) // warm up: grow buf, make the inflater
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		got := testing.AllocsPerRun(50, func() {
			_, buf, err = d.Decode(f, c.in, buf)
		})
		if err != nil || got != 0 {
			t.Errorf("%s: Decoder.Decode: %v allocs per run, %v", f, got, err)
		}
		if !f.Gunzip {
			got = testing.AllocsPerRun(50, func() {
				_, buf, err = f.Decode(c.in, buf)
			})
			if err != nil || got != 0 {
				t.Errorf("%s: Field.Decode: %v allocs per run, %v", f, got, err)
			}
		}
	}
	// An NPY field without a Shape allocates the Value's shape, and only that.
	f := mustField(t, "npy")
	got := testing.AllocsPerRun(50, func() { _, _, _ = f.Decode(lhotse, nil) })
	if got != 1 {
		t.Errorf("ragged npy: %v allocs per run, want 1", got)
	}
}
