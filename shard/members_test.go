package shard

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"unsafe"
)

// npyFile returns a .npy file as numpy.save writes it (format 1.0 unless version
// says otherwise): the header dict, padded with spaces and a newline so that the
// data starts on 64 bytes, then data.
func npyFile(version byte, dict string, data []byte) []byte {
	pre := 10
	if version > 1 {
		pre = 12
	}
	hlen := len(dict) + 1
	hlen += (64 - (pre+hlen)%64) % 64
	b := append([]byte(npyMagic), version, 0)
	if version > 1 {
		b = binary.LittleEndian.AppendUint32(b, uint32(hlen))
	} else {
		b = binary.LittleEndian.AppendUint16(b, uint16(hlen))
	}
	b = append(b, dict...)
	b = append(b, bytes.Repeat([]byte(" "), hlen-len(dict)-1)...)
	b = append(b, '\n')
	return append(b, data...)
}

// npy1DFile is a 1-D array of n elements of descr (size bytes each).
func npy1DFile(descr string, n, size int) []byte {
	return npyFile(1, fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }", descr, n), make([]byte, n*size))
}

// The header of a 1-D .npy gives its type and count; anything else gives nothing.
func TestNPY1D(t *testing.T) {
	for _, c := range []struct {
		name  string
		b     []byte
		dtype string
		n     int64
	}{
		{"uint16", npy1DFile("<u2", 5, 2), "<u2", 5},
		{"int32", npy1DFile("<i4", 300, 4), "<i4", 300},
		{"empty", npy1DFile("<i8", 0, 8), "<i8", 0},
		{"uint8 big-endian", npy1DFile(">u1", 3, 1), "|u1", 3},
		{"bool", npy1DFile("|b1", 7, 1), "|b1", 7},
		{"version 2", npyFile(2, `{"shape": (4L,), "descr": "<f4", "fortran_order": False}`, make([]byte, 16)), "<f4", 4},
		{"2-D", npyFile(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3), }", make([]byte, 12)), "", 0},
		{"scalar", npyFile(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (), }", make([]byte, 2)), "", 0},
		{"fortran", npyFile(1, "{'descr': '<u2', 'fortran_order': True, 'shape': (3,), }", make([]byte, 6)), "", 0},
		{"big-endian", npy1DFile(">u2", 3, 2), "", 0},
		{"unicode", npy1DFile("<U4", 2, 16), "", 0},
		{"structured", npyFile(1, "{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (3,), }", make([]byte, 6)), "", 0},
		{"short data", npy1DFile("<u2", 5, 2)[:100], "", 0},
		{"extra data", append(npy1DFile("<u2", 5, 2), 0), "", 0},
		{"other key", npyFile(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), 'x': 1}", make([]byte, 6)), "", 0},
		{"no magic", []byte("not a numpy file at all"), "", 0},
	} {
		for _, whole := range []bool{true, false} {
			head := c.b
			if !whole {
				var err error
				if head, err = ReadNPYHeader(bytes.NewReader(c.b), nil); err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
			}
			dtype, n, ok := npy1D(head, int64(len(c.b)))
			if ok != (c.dtype != "") || dtype != c.dtype || n != c.n {
				t.Errorf("%s (whole %v): %q %d %v; want %q %d", c.name, whole, dtype, n, ok, c.dtype, c.n)
			}
		}
	}
}

// ReadNPYHeader reads the header and nothing of the array.
func TestReadNPYHeaderReadsTheHeaderOnly(t *testing.T) {
	b := npy1DFile("<u2", 100_000, 2)
	r := bytes.NewReader(b)
	head, err := ReadNPYHeader(r, []byte("x"))
	if err != nil || string(head[:1]) != "x" || len(head) != 1+128 || r.Len() != len(b)-128 {
		t.Fatalf("%d bytes of header, %d left, %v; want 128 and the array", len(head)-1, r.Len(), err)
	}
}

// buildOf records the samples of a shard read whole as a Reader gives them.
func buildOf(t testing.TB, data []byte) (*Members, []*Sample) {
	t.Helper()
	r := NewReader(bytes.NewReader(data), Options{})
	var b MembersBuilder
	var samples []*Sample
	for {
		s, err := r.Next()
		if err == io.EOF {
			return b.Members(), samples
		}
		if err != nil {
			t.Fatal(err)
		}
		samples = append(samples, s.Clone())
		b.Sample()
		for _, f := range s.Fields {
			b.MemberHead(f.Ext, f.Size, f.Data)
		}
	}
}

// tarOf writes members (name, data) as a tar.
func tarOf(t testing.TB, members ...any) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i < len(members); i += 2 {
		data := members[i+1].([]byte)
		if err := tw.WriteHeader(&tar.Header{Name: members[i].(string), Mode: 0o644, Size: int64(len(data))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(data)
	}
	tw.Close()
	return buf.Bytes()
}

// Members hold what the Reader gives, in little memory, and decode from what they
// encode to.
func TestMembersRoundTrip(t *testing.T) {
	data := tarOf(t,
		"a.jpg", make([]byte, 70000), "a.cls", []byte("3"), "a.tokens.npy", npy1DFile("<u2", 5, 2),
		"b.cls", []byte{}, "b.tokens.npy", npy1DFile("<u2", 300, 2), "b.ids.npy", npy1DFile("<i4", 2, 4),
		"c.jpg", make([]byte, 10), "c.ids.npy", npy1DFile("<i8", 2, 8),
		"d.mat.npy", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", make([]byte, 16)),
	)
	m, samples := buildOf(t, data)
	if m == nil || m.Samples() != 4 {
		t.Fatalf("members %v", m)
	}
	if got := m.Exts(); !reflect.DeepEqual(got, []string{"cls", "ids.npy", "jpg", "mat.npy", "tokens.npy"}) {
		t.Fatalf("exts %q", got)
	}
	for i, s := range samples {
		for _, ext := range m.Exts() {
			size, ok := m.Size(i, ext)
			data, want := s.Get(ext)
			if ok != want || size != int64(len(data)) {
				t.Errorf("sample %d %s: size %d %v; the reader gives %d %v", i, ext, size, ok, len(data), want)
			}
		}
	}
	for _, c := range []struct {
		ext    string
		sample int
		dtype  string
		items  int64
		ok     bool
	}{
		{"tokens.npy", 0, "<u2", 5, true}, {"tokens.npy", 1, "<u2", 300, true}, {"tokens.npy", 2, "<u2", 0, false},
		{"ids.npy", 1, "", 0, false}, // <i4 then <i8: no type
		{"mat.npy", 3, "", 0, false}, // 2-D
		{"jpg", 0, "", 0, false},
	} {
		items, ok := m.Items(c.sample, c.ext)
		if m.DType(c.ext) != c.dtype || items != c.items || ok != c.ok {
			t.Errorf("%s sample %d: dtype %q items %d %v; want %q %d %v", c.ext, c.sample, m.DType(c.ext), items, ok, c.dtype, c.items, c.ok)
		}
	}
	if _, ok := m.Size(1, "jpg"); ok {
		t.Error("an absent member has a size")
	}
	if s, ok := m.Size(1, "cls"); !ok || s != 0 {
		t.Errorf("an empty member: %d %v", s, ok)
	}
	// 5 extensions: jpg's sizes need 4 bytes (70001), tokens' 2 (729), and its
	// counts 2 (301); the others 1.
	if want := int64(10 + 4*(1+1+4+1+2+2)); len(m.buf) != int(want) || m.Bytes() != int64(unsafe.Sizeof(*m))+want {
		t.Errorf("%d bytes of values, %d in all; want %d", len(m.buf), m.Bytes(), want)
	}
	got, err := DecodeMembers(m.Samples(), m.Exts(), m.DTypes(), m.AppendSizes(nil), m.AppendItems(nil))
	if err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, m)
	}
	var nilM *Members
	if _, ok := nilM.Size(0, "jpg"); ok || nilM.Exts() != nil || nilM.Bytes() != 0 || nilM.DType("x") != "" {
		t.Error("a nil Members answers")
	}
}

// A .npy member recorded without its header leaves the members unknown; one too
// short to be a .npy is simply not packable.
func TestMembersBuilderUnknown(t *testing.T) {
	var b MembersBuilder
	b.Sample()
	b.Member("jpg", 100)
	b.Member("npy", 5)
	if m := b.Members(); m == nil || m.DType("npy") != "" {
		t.Fatalf("a 5-byte .npy: %v", m)
	}
	b.Sample()
	b.Member("x.npy", 500)
	if m := b.Members(); m != nil {
		t.Fatal("members with a .npy header unread")
	}
	b.Reset()
	b.Sample()
	b.Member("jpg", 1)
	b.Member("jpg", 1)
	if b.Members() != nil {
		t.Fatal("an extension twice in a sample")
	}
}

// DecodeMembers refuses what no shard's members are.
func TestDecodeMembersRefuses(t *testing.T) {
	uv := func(vs ...uint64) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.AppendUvarint(b, v)
		}
		return b
	}
	npyExts := []string{"cls", "tokens.npy"}
	for _, c := range []struct {
		name         string
		samples      int
		exts, dtypes []string
		sizes, items []byte
		want         string
	}{
		{"fewer sizes", 3, []string{"cls"}, nil, uv(2, 2), nil, "bytes for 3 samples"},
		{"more sizes", 1, []string{"cls"}, nil, uv(2, 2), nil, "more than"},
		{"overflow", 1, []string{"cls"}, nil, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, nil, "bad varint"},
		{"too large", 1, []string{"cls"}, nil, uv(1<<62 + 2), nil, "bad varint"},
		{"sum overflows", 2, []string{"cls"}, nil, uv(1<<62, 1<<62), nil, "add up"},
		{"absent everywhere", 2, []string{"cls", "jpg"}, nil, uv(2, 2, 0, 0), nil, "in no sample"},
		{"sample without member", 2, []string{"cls"}, nil, uv(2, 0), nil, "no member"},
		{"unsorted", 1, []string{"jpg", "cls"}, nil, uv(1, 1), nil, "not in order"},
		{"repeated", 1, []string{"cls", "cls"}, nil, uv(1, 1), nil, "not in order"},
		{"upper case", 1, []string{"JPG"}, nil, uv(1), nil, "no reader"},
		{"slash", 1, []string{"a/b"}, nil, uv(1), nil, "no reader"},
		{"exts of no sample", 0, []string{"cls"}, nil, nil, nil, "no sample"},
		{"dtype of no npy", 1, []string{"cls"}, []string{"<u2"}, uv(1), nil, "no .npy"},
		{"unknown dtype", 1, npyExts, []string{"", "<u3"}, uv(1, 200), uv(2), "not one"},
		{"dtypes count", 1, npyExts, []string{"<u2"}, uv(1, 200), uv(2), "element types for"},
		{"no items", 1, npyExts, []string{"", "<u2"}, uv(1, 200), nil, "element counts"},
		{"items of absent", 2, npyExts, []string{"", "<u2"}, uv(1, 1, 200, 0), uv(2, 2), "count and no member"},
		{"no items of present", 1, npyExts, []string{"", "<u2"}, uv(1, 200), uv(0), "count and no member"},
		{"items do not fit", 1, npyExts, []string{"", "<u2"}, uv(1, 200), uv(100), "do not fit"},
		{"more items", 1, npyExts, []string{"", "<u2"}, uv(1, 200), uv(2, 2), "more than"},
	} {
		_, err := DecodeMembers(c.samples, c.exts, c.dtypes, c.sizes, c.items)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error saying %q", c.name, err, c.want)
		}
	}
	if m, err := DecodeMembers(0, []string{}, nil, nil, nil); err != nil || m.Samples() != 0 {
		t.Errorf("no sample: %v, %v", m, err)
	}
}

// Check refuses members of another count, or larger than their samples' room in the
// shard.
func TestCheckMembers(t *testing.T) {
	m, err := DecodeMembers(2, []string{"jpg"}, nil, []byte{101, 101}, nil) // two of 100 bytes
	if err != nil {
		t.Fatal(err)
	}
	ok := Info{URL: "s3://b/a.tar", Samples: 2, Size: 3072, Offsets: []int64{0, 1024}, Members: m}
	if err := ok.Check(-1, 0); err != nil {
		t.Fatal(err)
	}
	compressed := Info{URL: "s3://b/a.tar.gz", Samples: 2, Size: 1024, Members: m}
	if err := compressed.Check(-1, 0); err != nil {
		t.Fatal(err)
	}
	big, _ := DecodeMembers(2, []string{"jpg"}, nil, []byte{101, 0x81, 0x08}, nil) // 100 and 1024 bytes
	for name, in := range map[string]Info{
		"count":          {URL: "s3://b/a.tar", Samples: 3, Size: 3072, Members: m},
		"past next":      {URL: "s3://b/a.tar", Samples: 2, Size: 4096, Offsets: []int64{0, 512}, Members: m},
		"past the end":   {URL: "s3://b/a.tar", Samples: 2, Size: 2048, Offsets: []int64{0, 1024}, Members: big},
		"too compressed": {URL: "s3://b/a.tar.gz", Samples: 2, Size: 1024, Members: big}, // 2560 bytes of tar, at most 2048
	} {
		err := in.Check(-1, 2)
		if !errors.Is(err, ErrBadCount) || !strings.Contains(err.Error(), in.URL) {
			t.Errorf("%s: %v; want ErrBadCount naming the shard", name, err)
		}
	}
}

// What DecodeMembers accepts encodes back to the bytes it was given, and answers
// within its bounds.
func FuzzDecodeMembers(f *testing.F) {
	m, _ := buildOf(f, tarOf(f, "a.cls", []byte("1"), "a.tokens.npy", npy1DFile("<u2", 3, 2), "b.cls", []byte{}))
	f.Add(2, "cls tokens.npy", ",<u2", m.AppendSizes(nil), m.AppendItems(nil))
	f.Add(1, "cls", "", []byte{2}, []byte{})
	f.Fuzz(func(t *testing.T, samples int, exts, dtypes string, sizes, items []byte) {
		if samples > 1<<20 {
			return
		}
		var ds []string
		if dtypes != "" {
			ds = strings.Split(dtypes, ",")
		}
		m, err := DecodeMembers(samples, strings.Fields(exts), ds, sizes, items)
		if err != nil {
			return
		}
		if !bytes.Equal(m.AppendSizes(nil), sizes) || (m.DTypes() != nil && !bytes.Equal(m.AppendItems(nil), items)) {
			t.Fatal("encodes to other bytes")
		}
		for s := range m.Samples() {
			if m.SampleBytes(s) < 0 {
				t.Fatal("negative bytes")
			}
			for _, ext := range m.Exts() {
				size, ok := m.Size(s, ext)
				n, typed := m.Items(s, ext)
				isz, _ := NPYItemSize(m.DType(ext))
				if size < 0 || n < 0 || typed && (!ok || n*int64(isz) > size) {
					t.Fatalf("sample %d %s: %d bytes %v, %d items %v", s, ext, size, ok, n, typed)
				}
			}
		}
	})
}

// npy1D takes any header without failing, and what it takes fits the member.
func FuzzNPY1D(f *testing.F) {
	f.Add(npy1DFile("<u2", 5, 2), int64(0))
	f.Add(npyFile(2, `{"shape": (4L,), "descr": "<f4", "fortran_order": False}`, make([]byte, 16)), int64(0))
	f.Fuzz(func(t *testing.T, head []byte, extra int64) {
		size := int64(len(head)) + extra%1024
		dtype, n, ok := npy1D(head, size)
		isz, known := NPYItemSize(dtype)
		if ok && (!known || n < 0 || n*int64(isz) > size) {
			t.Fatalf("%q of %d bytes: %q %d", head, size, dtype, n)
		}
	})
}
