// Package index is the dataset index: for each shard its URL, the version and size of
// the object it was taken from, its sample count and each sample's byte offset in the
// tar. With it a loader plans an epoch without reading the shards, and a rank whose
// part starts inside a shard reads from that sample's offset.
//
// # Format
//
// An index is JSON lines, optionally zstd-compressed (readers detect it). The first
// line is a header, {"format": "shardload-index", "version": 1, "shards": N, "sum":
// "xxh3:..."}: sum is the XXH3 of the lines after it, as written, and a reader
// refuses an index whose lines do not match it (ErrChecksum), or that has fewer or
// more lines than N; an index without sum (an older release's) is read as it is.
// Each other line is one shard:
//
//	{"url": "s3://bucket/train-000000.tar", "version": "\"9b2cf535f27731c974343645a3985328\"",
//	 "size": 104857600, "samples": 1000, "offsets": "AIAIgAiACA..."}
//
// url is the shard's URL without secrets (package redact: no user information, no
// signature or token query parameters), which is also how lines are matched to shards.
// version and size identify the object (source.Info: an S3 ETag, a GCS generation, an
// HTTP ETag, a file's size and modification time); a line whose version differs from
// the object's is stale and the shard is counted again. offsets, present for
// uncompressed shards, is the base64 (standard alphabet, no padding) of the samples'
// offsets as unsigned varints, each the difference from the previous offset (the
// first from 0); every offset is a multiple of 512, the tar block size. A line without
// version or offsets is valid (the format "shardload ls --summary --json" prints, which
// has only url and samples): its count is trusted as it is.
//
// # Addressable offsets
//
// "shardload index" writes, compressed, an addressable index (WriteAddressable): the
// same lines without offsets (the counts: about 100 bytes a shard, 106 MB for 10^6
// shards of 100 samples, almost all of it offsets), then the offsets in blocks of
// shards, each a zstd skippable frame, with a table of where each block lies at the
// start. A loader (Lookup.LazyOffsets, Plan) reads the counts of every shard and,
// with one ranged read per block, the offsets of the shards its rank's plan reads:
// a rank of 80,000 over 10^6 shards decodes the offsets of about 30 of them. Read
// reads it whole. Every zstd decoder passes over skippable frames, so releases
// before this format read it as an index without offsets (valid: they read such a
// shard from its start, and check its count by reading to its end); a plain index
// (--no-compress) and the node's store keep every line's offsets, as before.
//
// Sizes (BenchmarkIndexSize): an index takes 4.1 bytes per sample of 100-120 KB
// images as plain JSON lines and 1.1 zstd-compressed, 2.8 and 0.005 for fixed-size
// token samples: 100,000 shards of 1,000 images are a 414 MB index, 107 MB
// compressed. Read holds the offsets as 8-byte integers (800 MB for those 100 million
// samples).
package index

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/xxh3"

	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// FileName is the name of the index object a loader looks for beside the shards when
// no index is given: "<prefix>/shardload.index" for shards "<prefix>/...".
const FileName = "shardload.index"

// formatName and formatVersion are the header's.
const (
	formatName    = "shardload-index"
	formatVersion = 1
)

// MaxLine caps one line of an index: a shard of about ten million samples.
const MaxLine = 64 << 20

// ErrFormat means an index does not parse.
var ErrFormat = errors.New("index: bad format")

type header struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	Shards  int    `json:"shards"`
	// Offsets is offsetsBlocks in the counts of an addressable index
	// (WriteAddressable), whose lines have no offsets; a reader that does not know
	// the field reads them as shards of unknown offsets.
	Offsets string `json:"offsets,omitempty"`
	// Sum is the checksum of the lines after the header, as written (each with its
	// newline): "xxh3:" and the 64-bit XXH3 in hex. A reader that finds other lines
	// refuses the index (ErrChecksum); an index without it (written before it was
	// kept, or by hand) is read as it is.
	Sum string `json:"sum,omitempty"`
}

// ErrChecksum means an index's lines are not those it was written with: edited,
// truncated or damaged since.
var ErrChecksum = errors.New("index: the lines do not match the index's checksum")

// sumPrefix starts header.Sum.
const sumPrefix = "xxh3:"

// linesSum returns header.Sum of the lines of infos, as enc would write them with
// lineOf.
func linesSum(infos []shard.Info, lineOf func(shard.Info) line) (string, error) {
	h := xxh3.New()
	bw := bufio.NewWriterSize(h, 64<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for _, info := range infos {
		if err := enc.Encode(lineOf(info)); err != nil {
			return "", err
		}
	}
	if err := bw.Flush(); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s%016x", sumPrefix, h.Sum64()), nil
}

// offsetsBlocks is header.Offsets of an addressable index.
const offsetsBlocks = "blocks"

type line struct {
	URL     string `json:"url"`
	Version string `json:"version,omitempty"`
	Size    int64  `json:"size,omitempty"`
	Samples *int   `json:"samples"`
	Offsets string `json:"offsets,omitempty"`
}

// Write writes infos as an index to w, zstd-compressed when compress is set. URLs are
// written without their secrets.
func Write(w io.Writer, infos []shard.Info, compress bool) error {
	var zw *zstd.Encoder
	if compress {
		var err error
		if zw, err = zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedBetterCompression)); err != nil {
			return err
		}
		w = zw
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	sum, err := linesSum(infos, lineOf)
	if err != nil {
		return err
	}
	if err := enc.Encode(header{Format: formatName, Version: formatVersion, Shards: len(infos), Sum: sum}); err != nil {
		return err
	}
	for _, info := range infos {
		if err := enc.Encode(lineOf(info)); err != nil {
			return err
		}
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if zw != nil {
		return zw.Close()
	}
	return nil
}

func lineOf(info shard.Info) line {
	n := info.Samples
	return line{URL: redact.URL(info.URL), Version: info.Version, Size: info.Size, Samples: &n, Offsets: encodeOffsets(info.Offsets)}
}

// Read reads an index from r (plain or zstd-compressed JSON lines; name says where it
// came from in errors). Each line is checked: offsets must be as many as the samples,
// increasing and block-aligned. It returns the shards in the order of the index.
func Read(r io.Reader, name string) ([]shard.Info, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	if isAddressable(br) {
		infos, _, err := readAddressable(br, name, true, nil)
		return infos, err
	}
	if magic, _ := br.Peek(4); bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20))
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrFormat, redact.URL(name), err)
		}
		defer zr.Close()
		r = zr
	} else {
		r = br
	}
	infos, _, err := readLines(r, name, nil)
	return infos, err
}

// readLines reads the JSON lines of an index from r, and returns its shards and its
// header (zero when it has none). A shard's URL equal to urls[i] for the i-th shard
// is that string; the others, and the versions, share a few large allocations (strs).
// A line as Write writes it allocates nothing but its offsets.
func readLines(r io.Reader, name string, urls []string) ([]shard.Info, header, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxLine)
	var infos []shard.Info
	var h header
	// The versions' bytes, and apart from them the URLs': entries looked up by key
	// take the caller's spelling of their URLs, and the URLs' chunks go then, where
	// the versions' stay.
	var versions, urlBytes strs
	var scratch []byte   // a line's offsets, decoded from base64
	var sum *xxh3.Hasher // of the lines after a header that has a Sum
	for n := 1; sc.Scan(); n++ {
		if sum != nil {
			sum.Write(sc.Bytes())
			sum.Write(newline)
		}
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		if n == 1 && bytes.Contains(text, []byte(`"format"`)) {
			if err := json.Unmarshal(text, &h); err != nil || h.Format != formatName {
				return nil, h, badLine(name, n, text, `want the header {"format": "shardload-index", ...}`)
			}
			if h.Version != formatVersion {
				return nil, h, badLine(name, n, text, fmt.Sprintf("index format version %d; this build reads version %d (rebuild the index with \"shardload index\")", h.Version, formatVersion))
			}
			if h.Shards > 0 {
				infos = make([]shard.Info, 0, min(h.Shards, 1<<20))
			}
			if h.Sum != "" {
				if !strings.HasPrefix(h.Sum, sumPrefix) {
					return nil, h, badLine(name, n, text, fmt.Sprintf("checksum %q: want %s and 16 hex digits", h.Sum, sumPrefix))
				}
				sum = xxh3.New()
			}
			continue
		}
		var info shard.Info
		var offsets []byte
		if l, ok := parseLine(text); ok {
			info = shard.Info{Samples: l.samples, Version: versions.of(l.version), Size: l.size}
			if i := len(infos); i < len(urls) && string(l.url) == urls[i] {
				info.URL = urls[i] // no string of its own
			} else {
				info.URL = urlBytes.of(l.url)
			}
			offsets = l.offsets
		} else if l := (line{}); json.Unmarshal(text, &l) == nil && l.Samples != nil {
			info = shard.Info{URL: l.URL, Samples: *l.Samples, Version: l.Version, Size: l.Size}
			offsets = []byte(l.Offsets)
		}
		if info.URL == "" || info.Samples < 0 || info.Size < 0 {
			return nil, h, badLine(name, n, text, `want {"url": ..., "samples": N, ...}`)
		}
		if len(offsets) > 0 {
			var err error
			if info.Offsets, scratch, err = decodeOffsets(offsets, info.Samples, scratch); err != nil {
				return nil, h, badLine(name, n, text, err.Error())
			}
		}
		infos = append(infos, info)
	}
	if err := sc.Err(); err != nil {
		return nil, h, fmt.Errorf("%w: %s: %v", ErrFormat, redact.URL(name), err)
	}
	if sum != nil {
		if got := fmt.Sprintf("%s%016x", sumPrefix, sum.Sum64()); got != h.Sum {
			return nil, h, fmt.Errorf("%w: %s: its %d shard lines sum to %s, its header says %s: it was edited or damaged since it was written; write it again (shardload index) rather than edit it",
				ErrChecksum, redact.URL(name), len(infos), got, h.Sum)
		}
	}
	if h.Shards > 0 && len(infos) != h.Shards {
		return nil, h, fmt.Errorf("%w: %s: %d shard lines, its header says %d: it was cut short or edited; write it again (shardload index)", ErrFormat, redact.URL(name), len(infos), h.Shards)
	}
	return infos, h, nil
}

var newline = []byte{'\n'}

// badLine returns the error of line n of the index name, text.
func badLine(name string, n int, text []byte, why string) error {
	return fmt.Errorf("%w: %s line %d: %s; got %.80q", ErrFormat, redact.URL(name), n, why, text)
}

func encodeOffsets(offs []int64) string {
	if len(offs) == 0 {
		return ""
	}
	return base64.RawStdEncoding.EncodeToString(appendDeltas(make([]byte, 0, 3*len(offs)), offs))
}

// appendDeltas appends offs to b as uvarint differences, each from the offset before
// (the first from 0).
func appendDeltas(b []byte, offs []int64) []byte {
	prev := int64(0)
	for _, o := range offs {
		b = binary.AppendUvarint(b, uint64(o-prev))
		prev = o
	}
	return b
}

// decodeOffsets decodes the base64 of a line's offsets (decodeDeltas), by way of
// scratch, which it returns grown as it needed.
func decodeOffsets(s []byte, samples int, scratch []byte) ([]int64, []byte, error) {
	if n := base64.RawStdEncoding.DecodedLen(len(s)); cap(scratch) < n {
		scratch = make([]byte, n)
	}
	n, err := base64.RawStdEncoding.Decode(scratch[:cap(scratch)], s)
	if err != nil {
		return nil, scratch, fmt.Errorf("offsets: %v", err)
	}
	offs, err := decodeDeltas(scratch[:n], samples)
	return offs, scratch, err
}

// decodeDeltas decodes the offsets of appendDeltas, checking that they are samples,
// increasing and on 512-byte tar blocks.
func decodeDeltas(b []byte, samples int) ([]int64, error) {
	if samples > len(b) { // every offset takes at least a byte
		return nil, fmt.Errorf("offsets: %d bytes for %d samples", len(b), samples)
	}
	offs := make([]int64, 0, samples)
	prev := int64(0)
	for len(b) > 0 {
		d, n := binary.Uvarint(b)
		if n <= 0 || d > 1<<62 || int64(d) > 1<<62-prev {
			return nil, errors.New("offsets: a bad varint")
		}
		b = b[n:]
		if len(offs) > 0 && d == 0 {
			return nil, fmt.Errorf("offsets: sample %d starts where sample %d does", len(offs), len(offs)-1)
		}
		prev += int64(d)
		if prev%512 != 0 {
			return nil, fmt.Errorf("offsets: sample %d at byte %d, not on a 512-byte tar block", len(offs), prev)
		}
		if len(offs) == samples {
			return nil, fmt.Errorf("offsets: more than %d for %d samples", samples, samples)
		}
		offs = append(offs, prev)
	}
	if len(offs) != samples {
		return nil, fmt.Errorf("offsets: %d for %d samples", len(offs), samples)
	}
	return offs, nil
}

// key matches shards to lines: the URL's canonical spelling (source.Canonical: a
// relative path, "./", "..", a symbolic link to a directory and a file:// URL of one
// file are the same key) without secrets.
func key(url string) string { return redact.URL(source.Canonical(url)) }

// keysOf returns the key of each of urls, reading the working directory once for
// them all (source.CanonicalAll), where key reads it for each relative path.
func keysOf(urls []string) []string {
	keys := source.CanonicalAll(urls)
	for i, k := range keys {
		keys[i] = redact.URL(k)
	}
	return keys
}

// identity names an object by what it is rather than where: its base name, version
// and size. A dataset moved to another directory or prefix (renamed or copied with
// its ETags, generations or modification times kept) keeps its entries: a shard
// without an entry under its URL takes the entry of the same identity. An object
// with no version has no identity.
func identity(url, version string, size int64) string {
	if version == "" || size < 0 {
		return ""
	}
	return path.Base(pathOf(redact.URL(url))) + "\x00" + version + "\x00" + strconv.FormatInt(size, 10)
}

// Omit returns urls without the index objects among them (FileName, and the
// temporary files of one being written), as a listing of the shards' directory
// returns them.
func Omit(urls []string) []string {
	isIndex := func(u string) bool {
		base := path.Base(pathOf(u))
		return base == FileName || strings.HasPrefix(base, "."+FileName+".tmp-")
	}
	if !slices.ContainsFunc(urls, isIndex) {
		return urls
	}
	out := make([]string, 0, len(urls))
	for _, u := range urls {
		if !isIndex(u) {
			out = append(out, u)
		}
	}
	return out
}
