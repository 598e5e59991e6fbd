package shard

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// FuzzReader feeds arbitrary bytes to the sample reader, seeded from the real shards in
// testdata/. The reader must never panic or hang, must fail only with *Error, and must
// agree with itself in sizes-only mode.
func FuzzReader(f *testing.F) {
	for _, name := range []string{"webdataset__sample.tgz", "aistore__small-mnist-3.tar", "pytorch-data__wds.tar", "webdataset__testgz.tar"} {
		data, err := os.ReadFile(filepath.Join("..", "testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data[:min(len(data), 4<<10)])
	}
	f.Add(buildTar(f, member{name: "a.x", data: "1"}, member{name: "a.x", data: "2"}, member{name: "b.y", data: "3"}))
	f.Add(compress(f, Zstd, buildTar(f, member{name: "k.seg.png", data: "abc"})))
	// Whole compressed shards, and the broken and hostile cases of hostile_test.go:
	// as they are, gzip- and zstd-compressed, with their compressed trailers damaged.
	tgz, err := os.ReadFile(filepath.Join("..", "testdata", "webdataset__sample.tgz"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tgz)
	for _, plain := range craftedShards(f) {
		f.Add(plain)
		for _, c := range []Compression{Gzip, Zstd} {
			z := compress(f, c, plain)
			f.Add(z)
			bad := bytes.Clone(z)
			bad[len(bad)-5] ^= 0x20 // the gzip CRC-32, the zstd checksum
			f.Add(bad)
			f.Add(z[:len(z)-3])
		}
	}
	sweep := sweepShard(f)
	f.Add(append(compress(f, Gzip, sweep[:1000]), compress(f, Gzip, sweep[1000:])...))
	f.Fuzz(func(t *testing.T, data []byte) {
		full := fuzzRead(t, data, false)
		sizes := fuzzRead(t, data, true)
		if len(full) != len(sizes) {
			t.Fatalf("%d samples with data, %d sizes-only", len(full), len(sizes))
		}
		for i := range full {
			if full[i] != sizes[i] {
				t.Fatalf("sample %d: %q vs sizes-only %q", i, full[i], sizes[i])
			}
		}
	})
}

// fuzzRead returns one line per sample (key, extensions, sizes), checking errors and,
// for plain tars, that each field's data is the input's bytes at its offset.
func fuzzRead(t *testing.T, data []byte, sizesOnly bool) []string {
	r := NewReader(bytes.NewReader(data), Options{URL: "fuzz", MaxMemberSize: 1 << 20, SizesOnly: sizesOnly})
	defer r.Close()
	var out []string
	for {
		s, err := r.Next()
		if err == io.EOF {
			return out
		}
		var se *Error
		if err != nil && !errors.As(err, &se) {
			t.Fatalf("error of type %T: %v", err, err)
		}
		if err != nil && !se.Skippable() {
			return out
		}
		if err != nil {
			out = append(out, "error "+se.Key)
			continue
		}
		line := s.Key
		for _, f := range s.Fields {
			line += " " + f.Ext
			if !sizesOnly && r.Compression() == None && !bytes.Equal(f.Data, data[f.Offset:f.Offset+f.Size]) {
				t.Fatalf("%s: data differs from the input at offset %d", f.Name, f.Offset)
			}
		}
		out = append(out, line)
	}
}

// craftedShards are the broken and hostile tars of hostile_test.go, small enough to
// seed fuzzing: a member hidden behind a size of 2^63-1, GNU sparse members old and
// PAX, a decompression bomb in a skipped member (for a low ratio cap), a shard cut at
// a member boundary, and a small shard of the sweep's shape.
func craftedShards(tb testing.TB) [][]byte {
	a := buildTar(tb, member{name: "a.txt", data: "A"})[:2*blockSize]
	rest := buildTar(tb, member{name: "evil.x", data: "pwned"}, member{name: "b.txt", data: "B"})
	return [][]byte{
		bytes.Join([][]byte{a, rawHeader("README", '0', math.MaxInt64), rest}, nil),
		bytes.Join([][]byte{a, paxHeader(paxRecord("size", "9223372036854775807")), rawHeader("README", '0', 0), rest}, nil),
		bytes.Join([][]byte{a, gnuSparse("s.bin", []int64{0, 100, 200, 300, 400, 500}, "hi", 600), rest}, nil),
		bytes.Join([][]byte{a, paxSparse("1.0", "s.bin", "hello", 4096), rest}, nil),
		bytes.Join([][]byte{a, paxSparse("0.1", "s.bin", "hello", 4096), rest}, nil),
		buildTar(tb, member{name: "a.x", data: "1"}, member{name: "SKIPPED", data: strings.Repeat("\x00", 128<<10)}, member{name: "b.x", data: "2"}),
		buildTar(tb, member{name: "a.jpg", data: strings.Repeat("j", 700)}, member{name: "a.cls", data: "1"})[:3*blockSize],
		sweepShard(tb)[:6<<10],
	}
}

// zstdEncoder compresses fuzz inputs (EncodeAll is safe for concurrent use); gzipW is
// reused under gzipMu: a new compressor per input would cost more than the reads.
var (
	zstdEncoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	gzipMu         sync.Mutex
	gzipW, _       = gzip.NewWriterLevel(nil, gzip.BestSpeed)
)

func fuzzCompress(c Compression, data []byte) []byte {
	if c == Zstd {
		return zstdEncoder.EncodeAll(data, nil)
	}
	gzipMu.Lock()
	defer gzipMu.Unlock()
	var buf bytes.Buffer
	gzipW.Reset(&buf)
	gzipW.Write(data)
	gzipW.Close()
	return buf.Bytes()
}

// streamErrors are the sentinels a stream error wraps, for comparing outcomes.
var streamErrors = []error{ErrTruncated, ErrBadHeader, ErrCorrupt, ErrTooCompressed, ErrUnsupportedCompression}

// fuzzOutcome reads a shard (full reads, or SizesOnly) and returns a line per sample
// or sample error, and how it ended: "EOF", or the stream error's sentinel. plain,
// when given, is the decompressed tar: every field's data must be its bytes at the
// field's offset.
func fuzzOutcome(t *testing.T, data, plain []byte, opts Options) ([]string, string) {
	opts.URL = "fuzz"
	opts.MaxMemberSize = 1 << 20
	r := NewReader(bytes.NewReader(data), opts)
	defer r.Close()
	var out []string
	for {
		s, err := r.Next()
		if err == io.EOF {
			return out, "EOF"
		}
		var se *Error
		if err != nil && !errors.As(err, &se) {
			t.Fatalf("error of type %T: %v", err, err)
		}
		if err != nil && se.Skippable() {
			out = append(out, "error "+se.Key)
			continue
		}
		if err != nil {
			for _, target := range streamErrors {
				if errors.Is(err, target) {
					return out, target.Error()
				}
			}
			t.Fatalf("stream error wrapping no sentinel: %v", err)
		}
		line := s.Key
		for _, f := range s.Fields {
			line += fmt.Sprintf(" %s=%d", f.Ext, f.Size)
			if plain != nil && !opts.SizesOnly && !bytes.Equal(f.Data, plain[f.Offset:f.Offset+f.Size]) {
				t.Fatalf("%s: data differs from the tar at offset %d", f.Name, f.Offset)
			}
		}
		out = append(out, line)
	}
}

// FuzzReaderCompressed reads its input as a plain tar and wrapped as gzip and as
// zstd, whole and then cut short and with a byte flipped in the compressed form:
//
//   - compressed whole, the shard reads exactly as the plain tar does (same samples,
//     same data at the same offsets, the same end), with data or sizes only;
//   - with a low ratio cap it reads the same or stops with ErrTooCompressed;
//   - damaged, it never reads to io.EOF with samples other than the plain tar's: a
//     decompressor's failure is never the end of a shard.
func FuzzReaderCompressed(f *testing.F) {
	for _, plain := range craftedShards(f) {
		f.Add(plain, uint16(0), uint16(0))
		f.Add(plain, uint16(4), uint16(0))   // the gzip ISIZE, the zstd checksum
		f.Add(plain, uint16(0), uint16(6))   // the gzip CRC-32
		f.Add(plain, uint16(0), uint16(300)) // compressed data
	}
	aistore, err := os.ReadFile(filepath.Join("..", "testdata", "aistore__small-mnist-3.tar"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(aistore, uint16(5000), uint16(300))
	f.Fuzz(func(t *testing.T, plain []byte, cut, flip uint16) {
		for _, sizesOnly := range []bool{false, true} {
			ref, refEnd := fuzzOutcome(t, plain, plain, Options{SizesOnly: sizesOnly})
			for _, c := range []Compression{Gzip, Zstd} {
				z := fuzzCompress(c, plain)
				got, end := fuzzOutcome(t, z, plain, Options{SizesOnly: sizesOnly, MaxRatio: -1})
				if end != refEnd || strings.Join(got, "|") != strings.Join(ref, "|") {
					t.Fatalf("%s (sizes only %v): %q, %s; plain tar: %q, %s", c, sizesOnly, got, end, ref, refEnd)
				}
				got, end = fuzzOutcome(t, z, plain, Options{SizesOnly: sizesOnly, MaxRatio: 8, ratioFloor: 16 << 10})
				if end != ErrTooCompressed.Error() && (end != refEnd || strings.Join(got, "|") != strings.Join(ref, "|")) {
					t.Fatalf("%s with a low cap (sizes only %v): %q, %s; plain tar: %q, %s", c, sizesOnly, got, end, ref, refEnd)
				}
				// cut bytes off the end; flip the byte that many bytes before the end
				// (counting from 1): small values hit the trailers.
				bad := z
				if cut != 0 {
					bad = bad[:len(bad)-int(cut)%len(bad)]
				}
				if flip != 0 && len(bad) > 0 {
					bad = bytes.Clone(bad)
					bad[len(bad)-1-(int(flip)-1)%len(bad)] ^= byte(flip>>8) | 1
				}
				if len(bad) == len(z) && bytes.Equal(bad, z) {
					continue
				}
				got, end = fuzzOutcome(t, bad, nil, Options{SizesOnly: sizesOnly, MaxRatio: -1})
				if end == "EOF" && (refEnd != "EOF" || strings.Join(got, "|") != strings.Join(ref, "|")) {
					t.Fatalf("%s damaged (cut %d, flip %d, sizes only %v): read to the end with %q; plain tar: %q, %s", c, cut, flip, sizesOnly, got, ref, refEnd)
				}
			}
		}
	})
}
