// Package index is the dataset index: for each shard its URL, the version and size of
// the object it was taken from, its sample count, each sample's byte offset in the
// tar, and each sample's members and their sizes. With it a loader plans an epoch
// without reading the shards, a rank whose part starts inside a shard reads from that
// sample's offset, and a batch's layout (ragged columns, a token packer's rows) is
// known before a byte of its samples is read.
//
// # Format
//
// An index is JSON lines, optionally zstd-compressed (readers detect it). The first
// line is a header, {"format": "shardload-index", "version": 2, "shards": N, "sum":
// "xxh3:..."}: sum is the XXH3 of the lines after it, as written, and a reader
// refuses an index whose lines do not match it (ErrChecksum), or that has fewer or
// more lines than N; an index without sum (an older release's) is read as it is.
// Each other line is one shard:
//
//	{"url": "s3://bucket/train-000000.tar", "version": "\"9b2cf535f27731c974343645a3985328\"",
//	 "size": 104857600, "samples": 1000, "offsets": "AIAIgAiACA...",
//	 "exts": ["cls", "jpg", "tokens.npy"], "dtypes": ["", "", "<u2"],
//	 "sizes": "AgICAgIC...", "items": "gQiBCIEI..."}
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
// # Members (version 2)
//
// exts, dtypes, sizes and items are the shard's members (shard.Members), when they
// are known: a full read of the shard records them (Scan, Recorder), compressed or
// not (the sizes are those of the members in the tar). exts are the extensions of
// the shard's members, as the shard reader groups them (the base name after its
// first dot, lower-cased: "jpg", "seg.png", "tokens.npy"), sorted, each present in
// some sample; [] for a shard of no sample. sizes is the base64 of unsigned varints,
// extension after extension in the order of exts, one per sample: the sample's
// member's size plus one, 0 for a sample without that member (so an absent member
// is not an empty one). For an extension that is a .npy ("npy", or ending in ".npy")
// whose members present are all 1-D arrays (C order) of one element type, dtypes
// holds that type at the extension's place, as the little-endian or single-byte
// numpy descr ("<u2", "<i4", "|u1": the numeric types a .npy decoder reads), and
// items holds, after sizes' manner, each member's element count plus one, for those
// extensions in the order of exts; dtypes and items are absent when no extension has
// a type. Only a .npy member's header is read for them, never its array. An extension
// with a member of another shape (2-D, a scalar), another type, Fortran order, an
// unrecorded type (big-endian, strings, objects, structured) or bytes other than its
// header and its array has no type (""): it is not packable from the index alone, and
// a packer has to read its samples. A line without exts has unknown members
// (shard.Info.Members nil): a shard of an index of version 1, or one read with a
// sample that failed (a duplicate extension). The sum covers these fields as every
// other of a line. A reader refuses members that no shard has: sizes or counts fewer
// or more than the samples, overflowing varints or bad base64, extensions out of
// order or repeated, a sample without a member, a count for an absent member, more
// elements than a member's bytes hold, or a sample whose members (with their tar
// headers) do not fit between its offset and the next (shard.Info.Check), naming the
// shard's URL.
//
// Memory: a shard's members are held as one value per sample and extension, 1, 2, 4
// or 8 bytes as the extension's largest value needs, and one more per sample for the
// element counts of a typed .npy extension: 5 bytes a sample for a jpg and a cls, 6
// for a .npy of 32,704 to 65,534 uint16 tokens (its size 4, its count 2), 4 below
// (shard.Members.Bytes).
//
// # Versions
//
// An index whose shards all have unknown members is written as version 1, byte for
// byte as releases before members wrote it; one with members is version 2. This
// release reads both. A release before version 2 refuses a version-2 index ("index
// format version 2; this build reads version 1") as it refuses any version it does
// not know; beside the shards, that fails its job before the first batch, as a broken
// index does. "shardload index --no-sizes" writes a version-1 index for such
// releases. A reader refuses a version it does not know; a field that readers may
// pass over (json.Unmarshal passes over keys it does not know) needs no new version.
//
// # Addressable offsets
//
// "shardload index" writes, compressed, an addressable index (WriteAddressable): the
// same lines without offsets and members (the counts: about 100 bytes a shard, 106 MB
// for 10^6 shards of 100 samples, almost all of it offsets and sizes), then the
// offsets and members in blocks of shards, each a zstd skippable frame, with a table
// of where each block lies at the start. A loader (Lookup.LazyOffsets, Plan) reads
// the counts of every shard and, with one ranged read per block, the offsets and
// members of the shards its rank's plan reads in part (LoadMembers: those of others):
// a rank of 80,000 over 10^6 shards decodes the offsets of about 30 of them. The
// counts do not grow with members: only their header's version differs. Read reads
// it whole. Every zstd decoder passes over skippable frames, so releases before this
// format read a version-1 one as an index without offsets (valid: they read such a
// shard from its start, and check its count by reading to its end); a plain index
// (--no-compress) and the node's store keep every line's offsets and members, as
// before.
//
// Sizes (BenchmarkIndexSize): an index takes 4.1 bytes per sample of 100-120 KB
// images as plain JSON lines and 1.1 zstd-compressed, 2.8 and 0.005 for fixed-size
// token samples: 100,000 shards of 1,000 images are a 414 MB index, 107 MB
// compressed. Read holds the offsets as 8-byte integers (800 MB for those 100 million
// samples). With the members (an image or a token array, and a label), 9.5 and 3.8
// bytes per sample of images, 9.5 and 0.008 of fixed-size tokens; Read holds them in
// 5 bytes a sample of images (500 MB for those 100 million).
package index

import (
	"bufio"
	"bytes"
	"cmp"
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

	"github.com/shardload/shardload/internal/strs"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// FileName is the name of the index object a loader looks for beside the shards when
// no index is given: "<prefix>/shardload.index" for shards "<prefix>/...".
const FileName = "shardload.index"

// formatName and the versions are the header's.
const (
	formatName = "shardload-index"
	// formatVersion is the version of an index without member sizes: what every
	// release reads.
	formatVersion = 1
	// membersVersion is the version of an index with member sizes (a shard's line
	// with "exts", its block with its members), which releases before it refuse.
	membersVersion = 2
)

// versionOf returns the format version of an index of infos: membersVersion when
// any shard's members are known, formatVersion otherwise (the index an earlier
// release reads, byte for byte as it would write it).
func versionOf(infos []shard.Info) int {
	for i := range infos {
		if infos[i].Members != nil {
			return membersVersion
		}
	}
	return formatVersion
}

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
	// The members (version 2): the extensions (present, [] for a shard of no
	// sample, absent when unknown), their element types (absent when none has one),
	// and the base64 of Members.AppendSizes and AppendItems.
	Exts   *[]string `json:"exts,omitempty"`
	DTypes []string  `json:"dtypes,omitempty"`
	Sizes  string    `json:"sizes,omitempty"`
	Items  string    `json:"items,omitempty"`
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
	if err := enc.Encode(header{Format: formatName, Version: versionOf(infos), Shards: len(infos), Sum: sum}); err != nil {
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
	l := line{URL: redact.URL(info.URL), Version: info.Version, Size: info.Size, Samples: &n, Offsets: encodeOffsets(info.Offsets)}
	if m := info.Members; m != nil {
		exts := m.Exts()
		if exts == nil {
			exts = []string{}
		}
		l.Exts, l.DTypes = &exts, m.DTypes()
		l.Sizes = base64.RawStdEncoding.EncodeToString(m.AppendSizes(nil))
		l.Items = base64.RawStdEncoding.EncodeToString(m.AppendItems(nil))
	}
	return l
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
// is that string; the others, and the versions, share a few large allocations (strs.Arena).
// A line as Write writes it allocates nothing but its offsets.
func readLines(r io.Reader, name string, urls []string) ([]shard.Info, header, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxLine)
	var infos []shard.Info
	var h header
	// The versions' bytes, and apart from them the URLs': entries looked up by key
	// take the caller's spelling of their URLs, and the URLs' chunks go then, where
	// the versions' stay.
	var versions, urlBytes strs.Arena
	var scratch []byte    // a line's offsets, decoded from base64
	var names memberNames // the members' extensions, shared by the shards that have the same
	var sum *xxh3.Hasher  // of the lines after a header that has a Sum
	var lineErr error     // the first bad line's, with a sum: reported after the sum
	shardLines := 0
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
			if h.Version != formatVersion && h.Version != membersVersion {
				return nil, h, badLine(name, n, text, fmt.Sprintf("index format version %d; this build reads versions %d and %d (rebuild the index with \"shardload index\")", h.Version, formatVersion, membersVersion))
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
		shardLines++
		var info shard.Info
		var offsets []byte
		var mem rawMembers
		if l, ok := parseLine(text); ok {
			info = shard.Info{Samples: l.samples, Version: versions.Of(l.version), Size: l.size}
			if i := len(infos); i < len(urls) && string(l.url) == urls[i] {
				info.URL = urls[i] // no string of its own
			} else {
				info.URL = urlBytes.Of(l.url)
			}
			offsets, mem = l.offsets, l.members
		} else if l := (line{}); json.Unmarshal(text, &l) == nil && l.Samples != nil {
			info = shard.Info{URL: l.URL, Samples: *l.Samples, Version: l.Version, Size: l.Size}
			offsets = []byte(l.Offsets)
			if l.Exts != nil {
				mem = rawMembers{known: true, sizes: []byte(l.Sizes), items: []byte(l.Items)}
				mem.exts, mem.dtypes = *l.Exts, l.DTypes
				if mem.exts == nil {
					mem.exts = []string{}
				}
			} else if l.DTypes != nil || l.Sizes != "" || l.Items != "" {
				mem.known, mem.bad = true, true // sizes without their extensions
			}
		}
		// A bad line of an index with a sum is reported once the sum is checked: an
		// index edited since it was written (a count changed by hand, which its
		// offsets and members no longer match) is ErrChecksum.
		bad := func(why string) error {
			err := badLine(name, n, text, why)
			if sum != nil {
				lineErr = cmp.Or(lineErr, err)
				return nil
			}
			return err
		}
		if info.URL == "" || info.Samples < 0 || info.Size < 0 {
			if err := bad(`want {"url": ..., "samples": N, ...}`); err != nil {
				return nil, h, err
			}
			continue
		}
		if len(offsets) > 0 {
			var err error
			if info.Offsets, scratch, err = decodeOffsets(offsets, info.Samples, scratch); err != nil {
				if err := bad(err.Error()); err != nil {
					return nil, h, err
				}
				continue
			}
		}
		if mem.known {
			var err error
			if info.Members, err = names.decode(mem, info.Samples); err == nil {
				err = info.Check(-1, -1)
			}
			if err != nil {
				if err := bad(fmt.Sprintf("the members of %s: %v", redact.URL(info.URL), err)); err != nil {
					return nil, h, err
				}
				continue
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
				ErrChecksum, redact.URL(name), shardLines, got, h.Sum)
		}
	}
	if lineErr != nil {
		return nil, h, lineErr
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
