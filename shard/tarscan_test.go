package shard

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// entries lists (name, size, type) of a tar stream with our reader and with
// archive/tar; ok reports whether each read to the end without error.
func entries(data []byte) (ours, theirs []string, oursOK, theirsOK bool) {
	tr := newTarReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			oursOK = true
			break
		}
		if err != nil {
			break
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(io.Discard, tr); err != nil {
				break
			}
		}
		ours = append(ours, entry(h.Name, h.Size, h.Typeflag))
	}
	ar := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := ar.Next()
		if err == io.EOF {
			theirsOK = true
			break
		}
		if err != nil {
			break
		}
		// archive/tar expands a sparse file's holes, which for a mutated header can
		// mean gigabytes of zeros: stop comparing there.
		if h.Typeflag == tar.TypeGNUSparse || h.Size > int64(len(data)) {
			break
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(io.Discard, ar); err != nil {
				break
			}
		}
		theirs = append(theirs, entry(h.Name, h.Size, h.Typeflag))
	}
	return ours, theirs, oursOK, theirsOK
}

// entry renders an entry, folding the type flags that both mean "regular file"; a
// global PAX header's size is left out (archive/tar consumes its data itself).
func entry(name string, size int64, flag byte) string {
	switch flag {
	case 0, tar.TypeReg:
		flag = 'f'
	case tar.TypeXGlobalHeader:
		size = 0
	}
	return fmt.Sprintf("%s %d %c", name, size, flag)
}

func TestTarReaderMatchesArchiveTar(t *testing.T) {
	files, _ := filepath.Glob("../testdata/*.t*")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.HasPrefix(data, []byte{0x1f, 0x8b}) {
			zr, _ := gzip.NewReader(bytes.NewReader(data))
			data, _ = io.ReadAll(zr)
		}
		ours, theirs, ok1, ok2 := entries(data)
		if !ok1 || !ok2 || strings.Join(ours, "\n") != strings.Join(theirs, "\n") || len(ours) == 0 {
			t.Errorf("%s: ours ok=%v %d entries, archive/tar ok=%v %d entries", f, ok1, len(ours), ok2, len(theirs))
		}
	}
	// Forms the real shards do not have: GNU long names, a USTAR prefix, base-256 sizes
	// and directories in the old format.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	long := strings.Repeat("n", 150)
	for _, h := range []*tar.Header{
		{Name: long + ".x", Size: 3, Format: tar.FormatGNU},
		{Name: strings.Repeat("p", 120) + "/k.y", Size: 2, Format: tar.FormatUSTAR},
		{Name: "d/", Typeflag: tar.TypeDir, Format: tar.FormatGNU},
		{Name: "s.txt", Typeflag: tar.TypeSymlink, Linkname: "t", Format: tar.FormatPAX},
		{Name: "g.x", Size: 1, PAXRecords: map[string]string{"comment": "hi"}},
	} {
		h.Mode = 0o644
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(bytes.Repeat([]byte("z"), int(h.Size)))
	}
	tw.Close()
	ours, theirs, ok1, ok2 := entries(buf.Bytes())
	if !ok1 || !ok2 || strings.Join(ours, "|") != strings.Join(theirs, "|") {
		t.Errorf("ours %q (ok %v)\ntheirs %q (ok %v)", ours, ok1, theirs, ok2)
	}
}

// A stream cut at any byte ends as archive/tar says, with one difference on purpose:
// a cut inside an entry's padding is io.ErrUnexpectedEOF for us (a shard cut short),
// a clean end for archive/tar. Cuts on a header's boundary end with io.EOF, cuts
// inside data or a header with io.ErrUnexpectedEOF. The padding and the next header
// are read together when the entry's data was read to its end.
func TestTarReaderCutAnywhere(t *testing.T) {
	sizes := []int{10, 700, 0, 512}
	var members []member
	var pads [][2]int // [start, end) of each entry's padding
	off := 0
	for i, n := range sizes {
		members = append(members, member{name: fmt.Sprintf("%c.x", 'a'+i), data: strings.Repeat("z", n)})
		off += blockSize + n
		if p := int(padding(int64(n))); p > 0 {
			pads = append(pads, [2]int{off, off + p})
			off += p
		}
	}
	data := buildTar(t, members...)
	inPadding := func(cut int) bool {
		for _, p := range pads {
			if cut >= p[0] && cut < p[1] {
				return true
			}
		}
		return false
	}
	outcome := func(next func() (string, error), read func() error) string {
		var got []string
		for {
			name, err := next()
			if err == nil {
				err = read()
			}
			switch {
			case err == io.EOF:
				return strings.Join(got, ",") + " EOF"
			case errors.Is(err, io.ErrUnexpectedEOF):
				return strings.Join(got, ",") + " unexpected EOF"
			case err != nil:
				return strings.Join(got, ",") + " " + err.Error()
			}
			got = append(got, name)
		}
	}
	boundaries := 0
	for cut := 0; cut <= len(data); cut++ {
		tr := newTarReader(bytes.NewReader(data[:cut]))
		ours := outcome(func() (string, error) {
			h, err := tr.Next()
			if err != nil {
				return "", err
			}
			return h.Name, nil
		}, func() error { _, err := io.Copy(io.Discard, tr); return err })
		ar := tar.NewReader(bytes.NewReader(data[:cut]))
		want := outcome(func() (string, error) {
			h, err := ar.Next()
			if err != nil {
				return "", err
			}
			return h.Name, nil
		}, func() error { _, err := io.Copy(io.Discard, ar); return err })
		if inPadding(cut) {
			want = strings.TrimSuffix(want, " EOF") + " unexpected EOF"
		}
		if ours != want {
			t.Errorf("cut at %d of %d: ours %q, want %q", cut, len(data), ours, want)
		}
		if strings.HasSuffix(ours, ",d.x EOF") {
			boundaries++
		}
	}
	// The cuts after the last entry: its end, after one zero block and the whole stream.
	if boundaries < 3 {
		t.Errorf("only %d cuts read every entry", boundaries)
	}
}

func TestParseNumeric(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"00000001750\x00", 1000, true}, {"   1750 \x00", 1000, true}, {"\x00\x00", 0, true},
		{"\x80\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00", 1 << 32, true},
		{"\xff\xff", 0, false}, {"12x", 0, false},
	} {
		got, err := parseNumeric([]byte(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseNumeric(%q) = %d, %v", tc.in, got, err)
		}
	}
}

// FuzzParseNumeric: parseNumeric's octal fast path agrees with the general parse of
// the trimmed text (values and whether it fails) on every field.
func FuzzParseNumeric(f *testing.F) {
	for _, s := range []string{"00000001750\x00", "   1750 \x00", "\x00\x00", "", "+17", "-1", "77777777777777777777", "777777777777777777777", "1000000000000000000000", "1 2", "8"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 0 && b[0]&0x80 != 0 {
			return // base-256
		}
		got, err := parseNumeric(b)
		var want int64
		var werr error
		if tb := bytes.Trim(b, " \x00"); len(tb) > 0 {
			want, werr = strconv.ParseInt(string(tb), 8, 64)
		}
		if got != want || (err == nil) != (werr == nil) {
			t.Fatalf("parseNumeric(%q) = %d, %v; the general parse says %d, %v", b, got, err, want, werr)
		}
	})
}

// FuzzTarReader: wherever both readers read a stream to its end, they see the same
// entries.
func FuzzTarReader(f *testing.F) {
	for _, name := range []string{"aistore__small-mnist-3.tar", "pytorch-data__wds.tar", "webdataset__testgz.tar"} {
		data, err := os.ReadFile(filepath.Join("..", "testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data[:min(len(data), 8<<10)])
	}
	f.Add(buildTar(f, member{name: "a.x", data: "1"}, member{name: strings.Repeat("d", 130) + "/b.y", data: "22"}, member{name: "c/", typ: tar.TypeDir}))
	f.Fuzz(func(t *testing.T, data []byte) {
		ours, theirs, ok1, ok2 := entries(data)
		if ok1 && ok2 && strings.Join(ours, "|") != strings.Join(theirs, "|") {
			t.Fatalf("ours %q\ntheirs %q", ours, theirs)
		}
	})
}

// sumBytes agrees with a plain loop on blocks of every byte value.
func TestSumBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for k := 0; k < 200; k++ {
		var b [blockSize]byte
		for i := range b {
			switch k % 4 {
			case 0:
				b[i] = 0xff
			case 1:
				b[i] = byte(r.Uint32())
			case 2:
				b[i] = byte(0x80 + r.IntN(128))
			default:
				b[i] = byte(r.IntN(128))
			}
		}
		var want int64
		wantHigh := 0
		for _, c := range b {
			want += int64(c)
			if c >= 0x80 {
				wantHigh++
			}
		}
		if got, high := sumBytes(&b); got != want || high != wantHigh {
			t.Fatalf("block %d: sumBytes = %d, %d; want %d, %d", k, got, high, want, wantHigh)
		}
	}
}
