package shard

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// The real shards in testdata/ and what WebDataset's group_by_keys sees in them
// (testdata/README.md).
var testdataShards = []struct {
	file    string
	comp    Compression
	samples int
	exts    []string
}{
	{"webdataset__sample.tgz", Gzip, 90, []string{"cls", "png"}},
	{"tarproc__sample.tar", None, 90, []string{"cls", "png"}},
	{"webdataset__testgz.tar", None, 1000, []string{"txt.gz"}},
	{"aistore__small-mnist-3.tar", None, 3, []string{"cls", "img"}},
	{"pytorch-data__wds.tar", None, 10, []string{"bin", "txt"}},
	{"lhotse__features.000000.tar", None, 2, []string{"json", "npy"}},
}

func readAll(t testing.TB, r *Reader) []*Sample {
	t.Helper()
	var out []*Sample
	for {
		s, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("Next after %d samples: %v", len(out), err)
		}
		out = append(out, s.Clone())
	}
}

func openTestdata(t testing.TB, name string, opts Options) *Reader {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	opts.URL = name
	r := NewReader(bytes.NewReader(data), opts)
	t.Cleanup(func() { r.Close() })
	return r
}

func TestTestdataShards(t *testing.T) {
	for _, tc := range testdataShards {
		t.Run(tc.file, func(t *testing.T) {
			r := openTestdata(t, tc.file, Options{})
			samples := readAll(t, r)
			if r.Compression() != tc.comp {
				t.Errorf("compression %v, want %v", r.Compression(), tc.comp)
			}
			if len(samples) != tc.samples {
				t.Errorf("%d samples, want %d", len(samples), tc.samples)
			}
			exts := map[string]bool{}
			keys := map[string]bool{}
			for _, s := range samples {
				if keys[s.Key] {
					t.Errorf("key %q seen twice", s.Key)
				}
				keys[s.Key] = true
				if s.URL != tc.file {
					t.Errorf("sample URL %q", s.URL)
				}
				for _, f := range s.Fields {
					exts[f.Ext] = true
					if int64(len(f.Data)) != f.Size {
						t.Errorf("%s.%s: %d bytes of data, size %d", s.Key, f.Ext, len(f.Data), f.Size)
					}
				}
				if len(s.Fields) != len(tc.exts) {
					t.Errorf("sample %q has %d fields, want %d", s.Key, len(s.Fields), len(tc.exts))
				}
			}
			got := sortedKeys(exts)
			if !slices.Equal(got, tc.exts) {
				t.Errorf("extensions %v, want %v", got, tc.exts)
			}
		})
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestTestdataDetails(t *testing.T) {
	// aistore: keys keep their directory.
	for _, s := range readAll(t, openTestdata(t, "aistore__small-mnist-3.tar", Options{})) {
		if !strings.HasPrefix(s.Key, "mnist-3/") {
			t.Errorf("aistore key %q lost its directory", s.Key)
		}
	}
	// pytorch-data: keys data/0..data/9, .txt before .bin, data equal to archive/tar's.
	ref := tarMembers(t, "pytorch-data__wds.tar")
	samples := readAll(t, openTestdata(t, "pytorch-data__wds.tar", Options{}))
	for i, s := range samples {
		if want := "data/" + string(rune('0'+i)); s.Key != want {
			t.Errorf("key %q, want %q", s.Key, want)
		}
		if s.Fields[0].Ext != "txt" || s.Fields[1].Ext != "bin" {
			t.Errorf("field order %s,%s", s.Fields[0].Ext, s.Fields[1].Ext)
		}
		for _, f := range s.Fields {
			if !bytes.Equal(f.Data, ref[f.Name]) {
				t.Errorf("%s: data differs from archive/tar", f.Name)
			}
		}
	}
	// The gzip shard is the plain one compressed: the same samples byte for byte.
	a := readAll(t, openTestdata(t, "webdataset__sample.tgz", Options{}))
	b := readAll(t, openTestdata(t, "tarproc__sample.tar", Options{}))
	if len(a) != len(b) {
		t.Fatalf("%d vs %d samples", len(a), len(b))
	}
	for i := range a {
		if a[i].Key != b[i].Key || a[i].Offset != b[i].Offset || len(a[i].Fields) != len(b[i].Fields) {
			t.Fatalf("sample %d: %q@%d vs %q@%d", i, a[i].Key, a[i].Offset, b[i].Key, b[i].Offset)
		}
		for j := range a[i].Fields {
			if !bytes.Equal(a[i].Fields[j].Data, b[i].Fields[j].Data) {
				t.Fatalf("sample %q field %s differs", a[i].Key, a[i].Fields[j].Ext)
			}
		}
	}
}

// tarMembers reads a testdata tar with archive/tar: name -> data.
func tarMembers(t *testing.T, name string) map[string][]byte {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name], _ = io.ReadAll(tr)
	}
}

type member struct {
	name string
	data string
	typ  byte // 0 means tar.TypeReg
}

// buildTar writes members as a tar archive with its end marker.
func buildTar(t testing.TB, members ...member) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		h := &tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
		if m.typ != 0 {
			h.Typeflag, h.Size = m.typ, 0
			if m.typ == tar.TypeSymlink {
				h.Linkname = "target"
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(m.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// summary renders samples as "key:ext=data,ext=data;..." for compact comparisons.
func summary(samples []*Sample) string {
	var b strings.Builder
	for _, s := range samples {
		b.WriteString(s.Key + ":")
		for i, f := range s.Fields {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(f.Ext + "=" + string(f.Data))
		}
		b.WriteByte(';')
	}
	return b.String()
}

func TestGrouping(t *testing.T) {
	long := strings.Repeat("d", 120) + "/k"
	tests := []struct {
		name    string
		members []member
		want    string
	}{
		{"key and extension", []member{{name: "a/b/x.seg.png", data: "1"}, {name: "a/b/x.cls", data: "2"}},
			"a/b/x:seg.png=1,cls=2;"},
		{"extension lower-cased", []member{{name: "x.JPG", data: "1"}, {name: "x.Cls", data: "2"}},
			"x:jpg=1,cls=2;"},
		{"adjacency not group-by", []member{{name: "a.x", data: "1"}, {name: "b.x", data: "2"}, {name: "a.y", data: "3"}},
			"a:x=1;b:x=2;a:y=3;"},
		{"directories and links skipped", []member{{name: "d/", typ: tar.TypeDir}, {name: "d/a.x", data: "1"},
			{name: "d/a.l", typ: tar.TypeSymlink}, {name: "d/a.y", data: "2"}},
			"d/a:x=1,y=2;"},
		{"no dot and leading dot skipped", []member{{name: "README", data: "r"}, {name: "d/.hidden", data: "h"}, {name: "a.x", data: "1"}},
			"a:x=1;"},
		{"top-level metadata skipped", []member{{name: "__info__", data: "m"}, {name: "__a.b__", data: "m"}, {name: "a.x", data: "1"},
			{name: "d/__k__.x", data: "2"}},
			"a:x=1;d/__k__:x=2;"},
		{"dot in directory kept in key", []member{{name: "v1.2/a.b.c", data: "1"}}, "v1.2/a:b.c=1;"},
		{"long names through PAX", []member{{name: long + ".x", data: "1"}, {name: long + ".y", data: "2"}},
			long + ":x=1,y=2;"},
		{"empty member", []member{{name: "a.x", data: ""}, {name: "a.y", data: "2"}}, "a:x=,y=2;"},
		{"empty archive", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(buildTar(t, tc.members...)), Options{URL: "mem.tar"})
			if got := summary(readAll(t, r)); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestOffsets(t *testing.T) {
	data := buildTar(t, member{name: "a.x", data: "hello"}, member{name: "a.y", data: strings.Repeat("z", 600)},
		member{name: "b.x", data: "1"})
	samples := readAll(t, NewReader(bytes.NewReader(data), Options{}))
	if len(samples) != 2 {
		t.Fatalf("%d samples", len(samples))
	}
	for _, s := range samples {
		for _, f := range s.Fields {
			if got := string(data[f.Offset : f.Offset+f.Size]); got != string(f.Data) {
				t.Errorf("%s: bytes at Offset %d are not the member's", f.Name, f.Offset)
			}
		}
	}
	// Headers: 0, then 512+512 (a.x data padded), then 1024+512+1024 (600 bytes padded).
	if samples[0].Offset != 0 || samples[1].Offset != 2560 {
		t.Errorf("sample offsets %d, %d; want 0, 2560", samples[0].Offset, samples[1].Offset)
	}
}

func TestSampleErrorsAreSkippable(t *testing.T) {
	data := buildTar(t,
		member{name: "a.x", data: "1"},
		member{name: "b.x", data: "2"}, member{name: "b.x", data: "3"}, member{name: "b.y", data: "4"},
		member{name: "c.x", data: "5"},
		member{name: "d.x", data: strings.Repeat("big", 10)}, member{name: "d.y", data: "6"},
		member{name: "e.x", data: "7"})
	r := NewReader(bytes.NewReader(data), Options{URL: "s3://bkt/bad.tar", MaxMemberSize: 16})
	var got []string
	var errs []*Error
	for {
		s, err := r.Next()
		if err == io.EOF {
			break
		}
		var se *Error
		if errors.As(err, &se) && se.Skippable() {
			errs = append(errs, se)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s.Key)
	}
	if strings.Join(got, ",") != "a,c,e" {
		t.Errorf("good samples %v, want a,c,e", got)
	}
	if len(errs) != 2 {
		t.Fatalf("%d sample errors, want 2", len(errs))
	}
	if !errors.Is(errs[0], ErrDuplicateExtension) || errs[0].Key != "b" || errs[0].Offset != 2048 {
		t.Errorf("first error %v (key %q offset %d)", errs[0], errs[0].Key, errs[0].Offset)
	}
	if want := `s3://bkt/bad.tar: sample "b" at byte 2048: shard: duplicate extension "x" (member "b.x")`; errs[0].Error() != want {
		t.Errorf("message\n got %s\nwant %s", errs[0], want)
	}
	if !errors.Is(errs[1], ErrMemberTooLarge) || errs[1].Key != "d" {
		t.Errorf("second error %v", errs[1])
	}
}

func TestSizesOnly(t *testing.T) {
	full := readAll(t, openTestdata(t, "lhotse__features.000000.tar", Options{}))
	sizes := readAll(t, openTestdata(t, "lhotse__features.000000.tar", Options{SizesOnly: true}))
	if len(full) != len(sizes) {
		t.Fatalf("%d vs %d samples", len(full), len(sizes))
	}
	for i := range full {
		for j, f := range sizes[i].Fields {
			if f.Data != nil || f.Size != full[i].Fields[j].Size || f.Offset != full[i].Fields[j].Offset {
				t.Errorf("%s: sizes-only field %+v differs from %d bytes at %d", f.Name, f, full[i].Fields[j].Size, full[i].Fields[j].Offset)
			}
		}
	}
}

func TestDataValidUntilNext(t *testing.T) {
	r := NewReader(bytes.NewReader(buildTar(t, member{name: "a.x", data: "aaaa"}, member{name: "b.x", data: "bbbb"})), Options{})
	s, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	kept := s.Clone()
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if d, _ := kept.Get("x"); string(d) != "aaaa" {
		t.Errorf("clone changed to %q after Next", d)
	}
}

func compress(t testing.TB, c Compression, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.WriteCloser
	switch c {
	case Gzip:
		w = gzip.NewWriter(&buf)
	case Zstd:
		var err error
		if w, err = zstd.NewWriter(&buf); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestCompressedShards(t *testing.T) {
	plain := buildTar(t, member{name: "a.x", data: strings.Repeat("x", 5000)}, member{name: "a.y", data: "1"}, member{name: "b.x", data: "2"})
	want := summary(readAll(t, NewReader(bytes.NewReader(plain), Options{})))
	for _, c := range []Compression{Gzip, Zstd} {
		t.Run(c.String(), func(t *testing.T) {
			r := NewReader(bytes.NewReader(compress(t, c, plain)), Options{URL: "x.tar"})
			defer r.Close()
			if got := summary(readAll(t, r)); got != want {
				t.Errorf("got %s", got)
			}
			if r.Compression() != c {
				t.Errorf("detected %v", r.Compression())
			}
		})
	}
}

// expectStreamError reads data to the end and checks the error is sticky and says
// what and where.
func expectStreamError(t *testing.T, data []byte, target error, wantText ...string) *Error {
	t.Helper()
	r := NewReader(bytes.NewReader(data), Options{URL: "gs://b/broken.tar"})
	defer r.Close()
	var err error
	n := 0
	for err == nil {
		_, err = r.Next()
		n++
	}
	if err == io.EOF {
		t.Fatalf("read to the end after %d samples; want %v", n, target)
	}
	var se *Error
	if !errors.As(err, &se) || !errors.Is(err, target) {
		t.Fatalf("error %v (%T), want %v", err, err, target)
	}
	if se.Skippable() {
		t.Errorf("stream error %v reported as skippable", err)
	}
	if _, again := r.Next(); again != err {
		t.Errorf("error not sticky: then %v", again)
	}
	msg := err.Error()
	for _, w := range append(wantText, "gs://b/broken.tar") {
		if !strings.Contains(msg, w) {
			t.Errorf("message %q lacks %q", msg, w)
		}
	}
	return se
}

func TestStreamErrors(t *testing.T) {
	plain := buildTar(t, member{name: "a.x", data: strings.Repeat("x", 3000)}, member{name: "b.x", data: strings.Repeat("y", 3000)})
	// Layout: a.x header 0, data 512..3512 padded to 3584; b.x header 3584, data 4096..7096
	// padded to 7168; end marker 7168..8192, then padding to the record size.
	t.Run("truncated mid-member", func(t *testing.T) {
		se := expectStreamError(t, plain[:5000], ErrTruncated, `sample "b"`, "at byte 5000")
		if se.Offset != 5000 {
			t.Errorf("offset %d", se.Offset)
		}
	})
	t.Run("truncated inside a header", func(t *testing.T) {
		expectStreamError(t, plain[:3584+100], ErrTruncated)
	})
	t.Run("truncated at member boundary", func(t *testing.T) {
		expectStreamError(t, plain[:3584], ErrTruncated, "no end-of-archive marker", "at byte 3584")
	})
	t.Run("truncated at end of last member", func(t *testing.T) {
		expectStreamError(t, plain[:7168], ErrTruncated, "no end-of-archive marker")
	})
	t.Run("empty object", func(t *testing.T) {
		expectStreamError(t, nil, ErrTruncated)
	})
	t.Run("bad header checksum", func(t *testing.T) {
		bad := slices.Clone(plain)
		bad[3584+10] ^= 0x55 // inside b.x's name
		se := expectStreamError(t, bad, ErrBadHeader, "at byte 3584")
		if se.Offset != 3584 {
			t.Errorf("offset %d", se.Offset)
		}
	})
	t.Run("not a tar", func(t *testing.T) {
		expectStreamError(t, bytes.Repeat([]byte("not a tar file "), 100), ErrBadHeader, "at byte 0")
	})
	for _, c := range []Compression{Gzip, Zstd} {
		z := compress(t, c, plain)
		t.Run("corrupt "+c.String(), func(t *testing.T) {
			bad := slices.Clone(z)
			for i := len(bad) / 3; i < len(bad)/3+8; i++ {
				bad[i] ^= 0xff
			}
			expectStreamError(t, bad, ErrCorrupt, c.String())
		})
		t.Run("truncated "+c.String(), func(t *testing.T) {
			expectStreamError(t, z[:len(z)-12], ErrTruncated, c.String())
		})
	}
	t.Run("unsupported xz", func(t *testing.T) {
		expectStreamError(t, append([]byte{0xfd, '7', 'z', 'X', 'Z', 0}, plain...), ErrUnsupportedCompression, "xz")
	})
	t.Run("source error passes through", func(t *testing.T) {
		boom := errors.New("connection reset by peer")
		r := NewReader(io.MultiReader(bytes.NewReader(plain[:5000]), errReader{boom}), Options{URL: "u"})
		var err error
		for err == nil {
			_, err = r.Next()
		}
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), `sample "b"`) {
			t.Errorf("got %v", err)
		}
	})
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// Unsafe member names are only strings: reading never touches the filesystem.
func TestUnsafeNamesStayStrings(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	data := buildTar(t, member{name: "../escape.x", data: "1"}, member{name: "/abs/path.x", data: "2"})
	got := summary(readAll(t, NewReader(bytes.NewReader(data), Options{})))
	if got != "../escape:x=1;/abs/path:x=2;" {
		t.Errorf("got %s", got)
	}
	entries, _ := os.ReadDir(dir)
	parent, _ := os.ReadDir(filepath.Dir(dir))
	if len(entries) != 0 {
		t.Errorf("reader created %v", entries)
	}
	for _, e := range parent {
		if strings.HasPrefix(e.Name(), "escape") {
			t.Errorf("reader created %s beside the working directory", e.Name())
		}
	}
}

// seekCounter is an in-memory seekable source that counts the bytes actually read.
type seekCounter struct {
	*bytes.Reader
	read int
}

func (s *seekCounter) Read(p []byte) (int, error) {
	n, err := s.Reader.Read(p)
	s.read += n
	return n, err
}

func TestSizesOnlySeeks(t *testing.T) {
	data, err := os.ReadFile("../testdata/lhotse__features.000000.tar")
	if err != nil {
		t.Fatal(err)
	}
	want := readAll(t, NewReader(bytes.NewReader(data), Options{SizesOnly: true}))
	src := &seekCounter{Reader: bytes.NewReader(data)}
	got := readAll(t, NewReader(src, Options{SizesOnly: true}))
	if summary(got) != summary(want) || len(got) != 2 {
		t.Fatalf("seeking listing differs: %s vs %s", summary(got), summary(want))
	}
	for i := range got {
		for j := range got[i].Fields {
			if got[i].Fields[j].Size != want[i].Fields[j].Size || got[i].Fields[j].Offset != want[i].Fields[j].Offset {
				t.Errorf("field %s differs", got[i].Fields[j].Name)
			}
		}
	}
	if src.read > len(data)/10 {
		t.Errorf("read %d of %d bytes; a listing of a seekable shard reads headers only", src.read, len(data))
	}
	// A truncated seekable shard is still reported.
	cut := &seekCounter{Reader: bytes.NewReader(data[:len(data)/2])}
	r := NewReader(cut, Options{SizesOnly: true, URL: "cut"})
	for err == nil {
		_, err = r.Next()
	}
	var se *Error
	if !errors.Is(err, ErrTruncated) || !errors.As(err, &se) || se.Offset != int64(len(data)/2) {
		t.Errorf("truncated seekable shard: %v, want truncated at byte %d", err, len(data)/2)
	}
}

func TestMaxRatio(t *testing.T) {
	bomb := compress(t, Zstd, buildTar(t, member{name: "a.x", data: strings.Repeat("\x00", 4<<20)}, member{name: "b.x", data: "1"}))
	expectStreamError(t, bomb, ErrTooCompressed, "cap 1000x")
	r := NewReader(bytes.NewReader(bomb), Options{MaxRatio: -1})
	if n := len(readAll(t, r)); n != 2 {
		t.Errorf("with the cap off: %d samples", n)
	}
}

func TestTiming(t *testing.T) {
	// Enough reads of the tar stream that some are timed (one in about four is).
	var members []member
	for i := range 100 {
		members = append(members, member{name: fmt.Sprintf("%03d.x", i), data: strings.Repeat("abc", 3000)})
	}
	data := compress(t, Gzip, buildTar(t, members...))
	r := NewReader(bytes.NewReader(data), Options{Timing: true})
	readAll(t, r)
	fetch, inflate := r.Times()
	if fetch <= 0 || inflate <= 0 {
		t.Errorf("fetch %v inflate %v, want both > 0", fetch, inflate)
	}
}

// countingBuffers hands out buffers of exactly the size asked for and tracks which
// are out.
type countingBuffers struct {
	out  map[*byte]int // first byte -> capacity, of buffers not given back
	gets int
}

func (c *countingBuffers) Get(n int) []byte {
	c.gets++
	b := make([]byte, 0, max(n, 1))
	c.out[unsafe.SliceData(b[:1])] = cap(b)
	return b
}

func (c *countingBuffers) Put(b []byte) {
	p := unsafe.SliceData(b[:1])
	if _, ok := c.out[p]; !ok {
		panic("Put of a buffer that is not out")
	}
	delete(c.out, p)
}

// With Options.Buffers, each sample's data lies in its own buffer that the caller
// keeps: data stays valid after later calls to Next, a sample whose fields outgrow
// the first buffer is moved whole into a bigger one, and the reader gives back
// what it does not hand over.
func TestBuffersOwnedByCaller(t *testing.T) {
	big := strings.Repeat("B", 5000)
	data := buildTar(t,
		member{name: "a.x", data: "aaaa"}, member{name: "a.y", data: "yy"},
		member{name: "b.x", data: "b"}, member{name: "b.y", data: big}, // outgrows the hint of ~6 bytes
		member{name: "c.x", data: ""},
		member{name: "d.x", data: "dd"})
	bufs := &countingBuffers{out: map[*byte]int{}}
	r := NewReader(bytes.NewReader(data), Options{Buffers: bufs})
	var kept []*Sample
	var owned [][]byte
	for {
		s, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if s.Buf != nil {
			if len(s.Buf) != int(s.Bytes()) {
				t.Errorf("%s: Buf holds %d bytes, the fields %d", s.Key, len(s.Buf), s.Bytes())
			}
			for _, f := range s.Fields {
				if len(f.Data) > 0 {
					if off, ok := withinBuf(f.Data, s.Buf); !ok || off+len(f.Data) > len(s.Buf) {
						t.Errorf("%s.%s: data not in the sample's buffer", s.Key, f.Ext)
					}
				}
			}
			owned = append(owned, s.Buf)
		}
		// A shallow copy: the fields' data is the caller's now, not a clone.
		c := *s
		c.Fields = append([]Field(nil), s.Fields...)
		kept = append(kept, &c)
	}
	r.Close()
	if got, want := summary(kept), "a:x=aaaa,y=yy;b:x=b,y="+big+";c:x=;d:x=dd;"; got != want {
		t.Errorf("samples after later Next calls:\n got %.80q\nwant %.80q", got, want)
	}
	if kept[2].Buf != nil {
		t.Errorf("a sample of empty members has a buffer")
	}
	// Out: exactly the buffers handed over; the one b outgrew went back.
	if len(bufs.out) != len(owned) {
		t.Errorf("%d buffers out, %d handed over (%d gets)", len(bufs.out), len(owned), bufs.gets)
	}
	for _, b := range owned {
		if _, ok := bufs.out[unsafe.SliceData(b[:1])]; !ok {
			t.Errorf("a handed-over buffer was given back")
		}
	}
}

// A sample cut short by a stream error leaves its buffer with the reader, which
// gives it back at Close.
func TestBuffersGivenBackOnError(t *testing.T) {
	data := buildTar(t, member{name: "a.x", data: strings.Repeat("a", 3000)})
	bufs := &countingBuffers{out: map[*byte]int{}}
	r := NewReader(bytes.NewReader(data[:512+1000]), Options{Buffers: bufs})
	if _, err := r.Next(); err == nil {
		t.Fatal("a truncated member read without error")
	}
	r.Close()
	if len(bufs.out) != 0 || bufs.gets == 0 {
		t.Errorf("%d buffers out after Close (%d gets)", len(bufs.out), bufs.gets)
	}
}

func withinBuf(b, buf []byte) (int, bool) {
	off := uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	return int(off), off < uintptr(cap(buf))
}

// A reader started at a sample's offset (StartOffset) yields the samples from there,
// with the offsets of the whole shard, in samples and in errors; a compressed stream
// or an offset off the tar blocks is refused.
func TestStartOffset(t *testing.T) {
	data := buildTar(t, member{name: "a.x", data: "hello"}, member{name: "a.y", data: strings.Repeat("z", 600)},
		member{name: "b.x", data: "1"}, member{name: "c.x", data: "2"}, member{name: "c.x", data: "dup"}, member{name: "d.x", data: "3"})
	whole := readAllSkippingSampleErrors(t, NewReader(bytes.NewReader(data), Options{}))
	for i, s := range whole {
		r := NewReader(bytes.NewReader(data[s.Offset:]), Options{URL: "mem.tar", StartOffset: s.Offset})
		rest := readAllSkippingSampleErrors(t, r)
		if summary(rest) != summary(whole[i:]) {
			t.Fatalf("from sample %d: %s, want %s", i, summary(rest), summary(whole[i:]))
		}
		for j, got := range rest {
			if got.Offset != whole[i+j].Offset || got.Fields[0].Offset != whole[i+j].Fields[0].Offset {
				t.Errorf("from sample %d: sample %s at %d, want %d", i, got.Key, got.Offset, whole[i+j].Offset)
			}
		}
	}
	// The duplicate member's error names its offset in the whole shard.
	c := whole[1].Offset + 1024 // after b.x's header and block
	_, err := NewReader(bytes.NewReader(data[c:]), Options{URL: "mem.tar", StartOffset: c}).Next()
	var se *Error
	if !errors.As(err, &se) || se.Key != "c" || se.Offset != c+1024 {
		t.Errorf("duplicate member from its sample's offset: %v, want sample c at byte %d", err, c+1024)
	}
	for name, r := range map[string]*Reader{
		"compressed": NewReader(bytes.NewReader(compress(t, Zstd, data)), Options{StartOffset: 512}),
		"unaligned":  NewReader(bytes.NewReader(data[100:]), Options{StartOffset: 100}),
	} {
		if _, err := r.Next(); !errors.Is(err, ErrUnsupportedCompression) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// readAllSkippingSampleErrors reads every sample, stepping over errors of one sample.
func readAllSkippingSampleErrors(t *testing.T, r *Reader) []*Sample {
	t.Helper()
	var out []*Sample
	for {
		s, err := r.Next()
		if err == io.EOF {
			return out
		}
		var se *Error
		if errors.As(err, &se) && se.Skippable() {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s.Clone())
	}
}
