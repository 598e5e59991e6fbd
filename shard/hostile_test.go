package shard

// Broken and hostile shards: compressed streams cut short or corrupted, sizes that
// overflow, decompression bombs in skipped data, GNU sparse members. Each test here
// failed on the reader before these cases were handled.

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
)

// rawHeader returns a USTAR header block with a valid checksum. Sizes that do not fit
// in octal are written in GNU's base-256 form.
func rawHeader(name string, flag byte, size int64) []byte {
	b := make([]byte, blockSize)
	copy(b[0:100], name)
	copy(b[100:108], "0000644\x00")
	copy(b[108:116], "0000000\x00")
	copy(b[116:124], "0000000\x00")
	putNumeric(b[124:136], size)
	copy(b[136:148], "00000000000\x00")
	b[156] = flag
	copy(b[257:263], "ustar\x00")
	copy(b[263:265], "00")
	setChecksum(b)
	return b
}

func putNumeric(f []byte, n int64) {
	clear(f)
	if n < 1<<33 {
		copy(f, fmt.Sprintf("%0*o\x00", len(f)-1, n))
		return
	}
	f[0] = 0x80
	binary.BigEndian.PutUint64(f[len(f)-8:], uint64(n))
}

func setChecksum(b []byte) {
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b[:blockSize] {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
}

// padBlock pads b with zeros to a multiple of the block size.
func padBlock(b []byte) []byte {
	return append(b, make([]byte, padding(int64(len(b))))...)
}

// paxRecord formats one PAX record, its length counting itself.
func paxRecord(k, v string) string {
	rec := " " + k + "=" + v + "\n"
	n := len(rec) + 1
	for len(strconv.Itoa(n))+len(rec) != n {
		n++
	}
	return strconv.Itoa(n) + rec
}

// paxHeader returns a PAX extended header ('x') with its records, padded.
func paxHeader(records ...string) []byte {
	data := strings.Join(records, "")
	out := rawHeader("PaxHeaders.0/x", 'x', int64(len(data)))
	return padBlock(append(out, data...))
}

// readOutcome reads a shard to its end: one line per sample (or skippable error) and
// the error it ended with (nil for io.EOF).
func readOutcome(t *testing.T, data []byte, opts Options) ([]string, error) {
	t.Helper()
	if opts.URL == "" {
		opts.URL = "mem://hostile.tar"
	}
	r := NewReader(bytes.NewReader(data), opts)
	defer r.Close()
	var lines []string
	for {
		s, err := r.Next()
		if err == io.EOF {
			return lines, nil
		}
		var se *Error
		if err != nil && !errors.As(err, &se) {
			t.Fatalf("error %v of type %T, want *Error", err, err)
		}
		if err != nil && !se.Skippable() {
			return lines, err
		}
		if err != nil {
			lines = append(lines, "error "+se.Key+": "+err.Error())
			continue
		}
		line := s.Key
		for _, f := range s.Fields {
			line += fmt.Sprintf(" %s=%d:%q", f.Ext, f.Size, f.Data)
		}
		lines = append(lines, line)
	}
}

// oneShot returns its data in reads as large as asked for, with err on the read that
// returns the last bytes, then io.EOF: a source (or decompressor) that reports a
// failure along with its last bytes and is not sticky about it.
type oneShot struct {
	data []byte
	err  error
}

func (o *oneShot) Read(p []byte) (int, error) {
	if len(o.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, o.data)
	o.data = o.data[n:]
	if len(o.data) == 0 {
		return n, o.err
	}
	return n, nil
}

// readPadded used to take a decompressor's io.ErrUnexpectedEOF right after an entry's
// padding for the clean end of the stream (io.EOF).
func TestReadPaddedKeepsSourceErrors(t *testing.T) {
	data := buildTar(t, member{name: "a.x", data: "0123456789"}, member{name: "b.x", data: "z"})
	cut := 2 * blockSize // a.x's header, data and padding: where b.x's header would start
	corrupt := errors.New("flate: corrupt input")
	for _, cause := range []error{io.ErrUnexpectedEOF, corrupt} {
		for _, together := range []bool{false, true} {
			var src io.Reader = io.MultiReader(bytes.NewReader(data[:cut]), errReader{cause})
			if together {
				src = &oneShot{data: bytes.Clone(data[:cut]), err: cause}
			}
			tr := newTarReader(src)
			if h, err := tr.Next(); err != nil || h.Name != "a.x" {
				t.Fatalf("first entry: %v, %v", h, err)
			}
			if _, err := io.Copy(io.Discard, tr); err != nil && !together {
				t.Fatal(err)
			}
			_, err := tr.Next()
			if err == io.EOF || !errors.Is(err, cause) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("%v (with the last bytes: %v): Next = %v, want the source's error", cause, together, err)
			}
		}
	}
	// Skipping an entry's data (not read) with the error on the last bytes skipped.
	tr := newTarReader(&oneShot{data: bytes.Clone(data[:cut]), err: io.ErrUnexpectedEOF})
	if _, err := tr.Next(); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Next(); err == io.EOF || err == nil {
		t.Errorf("skip: Next = %v, want io.ErrUnexpectedEOF", err)
	}
	// A clean end right after the padding is still io.EOF (shard.Reader then finds no
	// end-of-archive marker).
	tr = newTarReader(bytes.NewReader(data[:cut]))
	tr.Next()
	io.Copy(io.Discard, tr)
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("clean end: %v, want io.EOF", err)
	}
}

// The end-of-stream check in nextHeader was skipped exactly when the stream below had
// failed: a failure recorded by the counter under the tar reader, with the tar reader
// at a member boundary, was taken for the end of the shard.
func TestFailedStreamAtBoundaryIsNoEnd(t *testing.T) {
	data := buildTar(t, member{name: "a.x", data: "1"}, member{name: "b.x", data: "2"})
	r := NewReader(bytes.NewReader(data[:2*blockSize]), Options{URL: "u.tar.gz"})
	defer r.Close()
	if err := r.start(); err != nil {
		t.Fatal(err)
	}
	// What the counter records when a decompressor fails with io.ErrUnexpectedEOF
	// and the tar reader is told io.EOF at a boundary.
	r.tarIn.err = io.ErrUnexpectedEOF
	var err error
	for err == nil {
		_, err = r.Next()
	}
	if err == io.EOF || !errors.Is(err, ErrTruncated) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v, want the stream's failure", err)
	}
}

// gzipFlushed writes members to a gzip stream, flushing the compressor after each
// member's padded data, and returns the stream and the compressed length at each flush:
// the stream cut there inflates to exactly the tar written so far.
func gzipFlushed(t *testing.T, members ...member) ([]byte, []int) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	var cuts []int
	for _, m := range members {
		if err := tw.WriteHeader(&tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(m.data))
		tw.Flush()
		zw.Flush()
		cuts = append(cuts, buf.Len())
	}
	tw.Close()
	zw.Close()
	return buf.Bytes(), cuts
}

// A gzip shard cut where the inflated stream ends at a member boundary: the reader
// used to hand out a sample with only its first field, or the samples so far, and end
// cleanly.
func TestGzipCutAtMemberBoundary(t *testing.T) {
	members := []member{
		{name: "a.jpg", data: strings.Repeat("j", 700)}, {name: "a.cls", data: "1"},
		{name: "b.jpg", data: strings.Repeat("k", 300)}, {name: "b.cls", data: "2"},
	}
	z, cuts := gzipFlushed(t, members...)
	full, err := readOutcome(t, z, Options{})
	if err != nil || len(full) != 2 {
		t.Fatalf("whole shard: %q, %v", full, err)
	}
	for _, cut := range cuts {
		for _, sizesOnly := range []bool{false, true} {
			got, err := readOutcome(t, z[:cut], Options{SizesOnly: sizesOnly})
			if !errors.Is(err, ErrTruncated) {
				t.Errorf("cut at compressed byte %d (sizes only %v): %q, %v; want ErrTruncated", cut, sizesOnly, got, err)
				continue
			}
			if !sizesOnly && (len(got) > len(full) || strings.Join(got, "|") != strings.Join(full[:len(got)], "|")) {
				t.Errorf("cut at %d: samples %q are no prefix of %q", cut, got, full)
			}
			if !strings.Contains(err.Error(), "gzip") {
				t.Errorf("cut at %d: %v does not name the compression", cut, err)
			}
		}
	}
}

// After the end-of-archive marker the compressed stream is read to its end and its
// trailer checked.
func TestCompressedTrailerVerified(t *testing.T) {
	plain := buildTar(t, member{name: "a.x", data: strings.Repeat("a", 900)}, member{name: "b.x", data: "bb"}, member{name: "c.x", data: strings.Repeat("c", 2000)})
	want, err := readOutcome(t, plain, Options{})
	if err != nil || len(want) != 3 {
		t.Fatalf("plain: %q %v", want, err)
	}
	gz := compress(t, Gzip, plain)
	// Two gzip members, split inside a member's data.
	split := 1500
	two := append(compress(t, Gzip, plain[:split]), compress(t, Gzip, plain[split:])...)
	first := len(compress(t, Gzip, plain[:split]))
	zs := compress(t, Zstd, plain)
	flip := func(b []byte, i int) []byte { b = bytes.Clone(b); b[i] ^= 0x01; return b }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	tests := []struct {
		name   string
		data   []byte
		target error // nil: reads to the end with every sample
	}{
		{"gzip", gz, nil},
		{"gzip CRC-32", flip(gz, len(gz)-8), ErrCorrupt},
		{"gzip ISIZE", flip(gz, len(gz)-2), ErrCorrupt},
		{"gzip trailer cut", gz[:len(gz)-3], ErrTruncated},
		{"gzip trailer missing", gz[:len(gz)-8], ErrTruncated},
		{"gzip then garbage", cat(gz, []byte("garbage")), ErrCorrupt},
		{"gzip then zeros", cat(gz, make([]byte, 100)), nil},
		{"gzip then zeros then garbage", cat(gz, make([]byte, 3), []byte{1}), ErrCorrupt},
		{"gzip then a cut member header", cat(gz, gz[:5]), ErrTruncated},
		{"two gzip members", two, nil},
		{"two gzip members, zeros between", cat(two[:first], make([]byte, 7), two[first:]), nil},
		{"two gzip members, first CRC-32", flip(two, first-8), ErrCorrupt},
		{"two gzip members, second CRC-32", flip(two, len(two)-8), ErrCorrupt},
		{"two gzip members, second ISIZE", flip(two, len(two)-4), ErrCorrupt},
		{"two gzip members, cut at the first's end", two[:first], ErrTruncated},
		{"two gzip members, second trailer cut", two[:len(two)-1], ErrTruncated},
		{"zstd", zs, nil},
		{"zstd checksum", flip(zs, len(zs)-1), ErrCorrupt},
		{"zstd cut", zs[:len(zs)-2], ErrTruncated},
		{"zstd then garbage", cat(zs, []byte("garbage!")), ErrCorrupt},
		{"zstd twice", cat(compress(t, Zstd, plain[:split]), compress(t, Zstd, plain[split:])), nil},
		// The data after the end marker is inflated, checked and thrown away.
		{"gzip, data after the marker", compress(t, Gzip, cat(plain, bytes.Repeat([]byte("tail"), 300))), nil},
	}
	for _, tc := range tests {
		for _, sizesOnly := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sizes-only=%v", tc.name, sizesOnly), func(t *testing.T) {
				got, err := readOutcome(t, tc.data, Options{SizesOnly: sizesOnly})
				if tc.target == nil {
					if err != nil {
						t.Fatalf("%v", err)
					}
					if !sizesOnly && strings.Join(got, "|") != strings.Join(want, "|") {
						t.Fatalf("samples %q, want %q", got, want)
					}
					if len(got) != len(want) {
						t.Fatalf("%d samples, want %d", len(got), len(want))
					}
					return
				}
				if !errors.Is(err, tc.target) {
					t.Fatalf("got %v (samples %q), want %v", err, got, tc.target)
				}
				var se *Error
				if !errors.As(err, &se) || se.URL == "" || se.Offset < 0 || se.Compression == None {
					t.Errorf("error %#v lacks URL, offset or compression", err)
				}
			})
		}
	}
}

// A member whose size is near 2^63 used to overflow "remain + pad": nothing was
// skipped and its data was parsed as headers, hiding members (here evil.x) from every
// other tar reader.
func TestHugeSizeHidesNoMembers(t *testing.T) {
	hidden := buildTar(t, member{name: "evil.x", data: "pwned"})
	sizes := []int64{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 - 511, math.MaxInt64 - 512, math.MaxInt64 - 5000, 1 << 62, 1 << 40}
	type variant struct {
		name string
		data []byte
	}
	var variants []variant
	for _, size := range sizes {
		for _, h := range []struct {
			name string
			hdr  []byte
		}{
			{"skipped regular", rawHeader("README", '0', size)},
			{"not a field", rawHeader("__meta__", '0', size)},
			{"non-regular V", rawHeader("label.x", 'V', size)},
			{"global PAX", rawHeader("g.x", 'g', size)},
			{"PAX size", append(paxHeader(paxRecord("size", strconv.FormatInt(size, 10))), rawHeader("README", '0', 0)...)},
			{"regular field", rawHeader("big.x", '0', size)},
		} {
			data := append(bytes.Clone(buildTar(t, member{name: "a.x", data: "1"})[:2*blockSize]), h.hdr...)
			data = append(data, hidden...)
			variants = append(variants, variant{fmt.Sprintf("%s/%d", h.name, size), data})
		}
	}
	for _, v := range variants {
		for _, c := range []Compression{None, Gzip} {
			data := v.data
			if c != None {
				data = compress(t, c, data)
			}
			for _, sizesOnly := range []bool{false, true} {
				for _, seek := range []bool{false, true} {
					var src io.Reader = bytes.NewReader(data)
					if !seek {
						src = struct{ io.Reader }{src}
					}
					r := NewReader(src, Options{URL: "u", SizesOnly: sizesOnly, MaxMemberSize: math.MaxInt64})
					var keys []string
					var err error
					for {
						var s *Sample
						s, err = r.Next()
						if err != nil {
							var se *Error
							if errors.As(err, &se) && se.Skippable() {
								continue
							}
							break
						}
						keys = append(keys, s.Key)
					}
					r.Close()
					for _, k := range keys {
						if k == "evil" {
							t.Errorf("%s %s sizes-only=%v seek=%v: the hidden member came out", v.name, c, sizesOnly, seek)
						}
					}
					var se *Error
					if err == io.EOF || !errors.As(err, &se) || !errors.Is(err, ErrBadHeader) && !errors.Is(err, ErrTruncated) {
						t.Errorf("%s %s sizes-only=%v seek=%v: ended with %v, want a bad header or a truncated shard", v.name, c, sizesOnly, seek, err)
					}
				}
			}
		}
	}
}

// The decompression ratio cap holds on every inflated byte: skipped members, data
// under SizesOnly, member data, and what follows the end-of-archive marker. It used
// to be checked only at headers, so a skipped member of 64 GiB inflated in full first.
func TestMaxRatioOnEveryByte(t *testing.T) {
	zeros := strings.Repeat("\x00", 4<<20)
	shards := []struct {
		name string
		tar  []byte
	}{
		{"skipped member", buildTar(t, member{name: "a.x", data: "1"}, member{name: "SKIPPED", data: zeros}, member{name: "b.x", data: "2"})},
		{"metadata member", buildTar(t, member{name: "a.x", data: "1"}, member{name: "__index__", data: zeros})},
		{"member data", buildTar(t, member{name: "a.x", data: "1"}, member{name: "big.x", data: zeros})},
		{"after the end marker", append(buildTar(t, member{name: "a.x", data: "1"}), zeros...)},
	}
	for _, sh := range shards {
		for _, c := range []Compression{Gzip, Zstd} {
			z := compress(t, c, sh.tar)
			for _, sizesOnly := range []bool{false, true} {
				_, err := readOutcome(t, z, Options{MaxRatio: 2, SizesOnly: sizesOnly})
				var se *Error
				if !errors.Is(err, ErrTooCompressed) || !errors.As(err, &se) {
					t.Errorf("%s %s sizes-only=%v: %v, want ErrTooCompressed", sh.name, c, sizesOnly, err)
					continue
				}
				// Stopped soon after the 1 MiB always allowed, long before the 4 MiB.
				if se.Offset > 2<<20 {
					t.Errorf("%s %s: stopped at byte %d of the tar, want within 2 MiB", sh.name, c, se.Offset)
				}
				if !strings.Contains(err.Error(), "cap 2x") {
					t.Errorf("%s %s: message %q", sh.name, c, err)
				}
			}
		}
	}
	// The cap off, or high enough: the shards read.
	z := compress(t, Zstd, shards[0].tar)
	if got, err := readOutcome(t, z, Options{MaxRatio: -1}); err != nil || len(got) != 2 {
		t.Errorf("cap off: %q, %v", got, err)
	}
	if got, err := readOutcome(t, z, Options{MaxRatio: 1e9}); err != nil || len(got) != 2 {
		t.Errorf("cap 1e9: %q, %v", got, err)
	}
}

// gnuSparse returns an old-GNU sparse entry ('S') for name holding chunks at the given
// offsets, its sparse map continued in extension blocks when it has more than four
// chunks, and its data padded.
func gnuSparse(name string, offsets []int64, chunk string, realSize int64) []byte {
	hdr := rawHeader(name, 'S', int64(len(offsets)*len(chunk)))
	copy(hdr[257:265], "ustar  \x00") // GNU magic and version
	put := func(b []byte, i int, off int64) {
		putNumeric(b[i*24:i*24+12], off)
		putNumeric(b[i*24+12:i*24+24], int64(len(chunk)))
	}
	for i := 0; i < min(4, len(offsets)); i++ {
		put(hdr[386:482], i, offsets[i])
	}
	putNumeric(hdr[483:495], realSize)
	var ext []byte
	rest := offsets[min(4, len(offsets)):]
	if len(rest) > 0 {
		hdr[gnuIsExtended] = 1
	}
	for len(rest) > 0 {
		blk := make([]byte, blockSize)
		n := min(21, len(rest))
		for i := 0; i < n; i++ {
			put(blk, i, rest[i])
		}
		rest = rest[n:]
		if len(rest) > 0 {
			blk[gnuExtIsExtended] = 1
		}
		ext = append(ext, blk...)
	}
	setChecksum(hdr)
	out := append(hdr, ext...)
	return padBlock(append(out, strings.Repeat(chunk, len(offsets))...))
}

// paxSparse returns a PAX sparse entry of format 0.0, 0.1 or 1.0 for name with one
// chunk at offset 0.
func paxSparse(format, name, chunk string, realSize int64) []byte {
	rs := strconv.FormatInt(realSize, 10)
	n := strconv.Itoa(len(chunk))
	switch format {
	case "0.0":
		return append(paxHeader(paxRecord("GNU.sparse.size", rs), paxRecord("GNU.sparse.numblocks", "1"),
			paxRecord("GNU.sparse.offset", "0"), paxRecord("GNU.sparse.numbytes", n)),
			padBlock(append(rawHeader(name, '0', int64(len(chunk))), chunk...))...)
	case "0.1":
		return append(paxHeader(paxRecord("GNU.sparse.size", rs), paxRecord("GNU.sparse.numblocks", "1"),
			paxRecord("GNU.sparse.map", "0,"+n), paxRecord("GNU.sparse.name", name)),
			padBlock(append(rawHeader("GNUSparseFile.0/"+name, '0', int64(len(chunk))), chunk...))...)
	default: // 1.0: the map is at the start of the data
		sparseMap := padBlock([]byte("1\n0\n" + n + "\n"))
		data := append(sparseMap, chunk...)
		return append(paxHeader(paxRecord("GNU.sparse.major", "1"), paxRecord("GNU.sparse.minor", "0"),
			paxRecord("GNU.sparse.name", name), paxRecord("GNU.sparse.realsize", rs)),
			padBlock(append(rawHeader("./GNUSparseFile.0/"+name, '0', int64(len(data))), data...))...)
	}
}

// GNU sparse members are refused, as an error of their sample naming the member; the
// rest of the shard reads on. Old-GNU 'S' entries with extension blocks used to fail
// the whole shard (the blocks were taken for data), PAX ones came out as samples keyed
// ./GNUSparseFile.NNN/... holding the raw sparse map.
func TestSparseMembersRefused(t *testing.T) {
	before := buildTar(t, member{name: "a.txt", data: "A"})[:2*blockSize]
	after := buildTar(t, member{name: "s.cls", data: "7"}, member{name: "b.txt", data: "B"})
	many := []int64{0, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 11000, 12000, 13000, 14000, 15000,
		16000, 17000, 18000, 19000, 20000, 21000, 22000, 23000, 24000, 25000, 26000, 27000}
	cases := []struct {
		name   string
		entry  []byte
		form   string
		expand int64 // the size archive/tar expands the file to
	}{
		{"old GNU", gnuSparse("s.bin", []int64{0, 4096}, "hello", 8192), "old GNU", 8192},
		{"old GNU with extension blocks", gnuSparse("s.bin", many, "hi", 28000), "old GNU", 28000},
		{"PAX 0.0", paxSparse("0.0", "s.bin", "hello", 4096), "PAX", 4096},
		{"PAX 0.1", paxSparse("0.1", "s.bin", "hello", 4096), "PAX", 4096},
		{"PAX 1.0", paxSparse("1.0", "s.bin", "hello", 4096), "PAX", 4096},
	}
	for _, tc := range cases {
		data := bytes.Join([][]byte{before, tc.entry, after}, nil)
		// archive/tar reads the crafted entry as the sparse file it is.
		ar := tar.NewReader(bytes.NewReader(data))
		var names []string
		for {
			h, err := ar.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: archive/tar: %v", tc.name, err)
			}
			n, err := io.Copy(io.Discard, ar)
			if err != nil {
				t.Fatalf("%s: archive/tar reading %s: %v", tc.name, h.Name, err)
			}
			if h.Name == "s.bin" && n != tc.expand {
				t.Fatalf("%s: archive/tar expands s.bin to %d bytes, want %d", tc.name, n, tc.expand)
			}
			names = append(names, h.Name)
		}
		if strings.Join(names, " ") != "a.txt s.bin s.cls b.txt" {
			t.Fatalf("%s: archive/tar sees %q", tc.name, names)
		}
		for _, sizesOnly := range []bool{false, true} {
			got, err := readOutcome(t, data, Options{SizesOnly: sizesOnly})
			if err != nil {
				t.Errorf("%s: %v (samples %q)", tc.name, err, got)
				continue
			}
			if len(got) != 3 || !strings.HasPrefix(got[0], "a ") || !strings.HasPrefix(got[2], "b ") {
				t.Errorf("%s: samples %q, want a, the sparse sample's error, b", tc.name, got)
				continue
			}
			for _, want := range []string{"error s:", "sparse member", `"s.bin"`, tc.form, "does not expand sparse files"} {
				if !strings.Contains(got[1], want) {
					t.Errorf("%s: error %q lacks %q", tc.name, got[1], want)
				}
			}
		}
		r := NewReader(bytes.NewReader(data), Options{URL: "sparse.tar"})
		r.Next()
		_, err := r.Next()
		var se *Error
		if !errors.Is(err, ErrSparse) || !errors.As(err, &se) || !se.Skippable() || se.Key != "s" || se.Offset != 2*blockSize {
			t.Errorf("%s: %#v, want a skippable ErrSparse of sample s at byte %d", tc.name, err, 2*blockSize)
		}
		r.Close()
	}
}
