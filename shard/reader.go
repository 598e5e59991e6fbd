package shard

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"errors"
	"fmt"
	"github.com/shardload/shardload/internal/redact"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// DefaultMaxMemberSize is the per-member cap used when Options.MaxMemberSize is zero.
const DefaultMaxMemberSize = 256 << 20

// DefaultMaxSampleSize is the per-sample cap used when Options.MaxSampleSize is zero.
const DefaultMaxSampleSize = 1 << 30

// maxZstdWindow bounds the memory a zstd frame may ask for. Shards written with zstd
// levels up to 22 use windows of at most 128 MiB.
const maxZstdWindow = 256 << 20

// Errors wrapped in an *Error; match them with errors.Is.
var (
	// ErrTruncated means the shard ended early: inside a member, inside a header,
	// or at a member boundary without the end-of-archive marker.
	ErrTruncated = errors.New("shard: truncated tar")
	// ErrBadHeader means a tar header failed its checksum or could not be parsed.
	ErrBadHeader = errors.New("shard: bad tar header")
	// ErrCorrupt means the compressed stream of a whole-shard gzip or zstd file is
	// corrupt.
	ErrCorrupt = errors.New("shard: corrupt compressed stream")
	// ErrUnsupportedCompression means the shard's first bytes name a compression
	// this reader does not decode (xz, lz4).
	ErrUnsupportedCompression = errors.New("shard: unsupported compression")
	// ErrDuplicateExtension means one sample holds two members with the same
	// extension. The error is the sample's; the reader can go on.
	ErrDuplicateExtension = errors.New("shard: duplicate extension")
	// ErrMemberTooLarge means a member is larger than Options.MaxMemberSize. The
	// error is the sample's; the reader can go on.
	ErrMemberTooLarge = errors.New("shard: member larger than the cap")
	// ErrSparse means a member is a GNU sparse file (tar --sparse): an old-GNU 'S'
	// entry or a PAX entry with GNU.sparse.* records. The Reader does not expand
	// sparse files; the error is the sample's and the reader can go on.
	ErrSparse = errors.New("shard: sparse member")
	// ErrSampleTooLarge means a sample's members together are larger than
	// Options.MaxSampleSize. The error is the sample's; the reader can go on.
	ErrSampleTooLarge = errors.New("shard: sample larger than the cap")
)

// Error is a failure while reading a shard. It says where: the shard URL, the sample
// key when one is known, and the byte offset in the tar stream (after whole-shard
// decompression, when the shard was compressed).
type Error struct {
	URL    string
	Key    string // "" when the failure is not inside a sample
	Offset int64  // byte offset of the member header or of the failure; -1 unknown
	// Compression is the whole-shard compression; when not None, Offset counts bytes
	// of the decompressed tar stream.
	Compression Compression
	Err         error
	sample      bool
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(redact.URL(e.URL))
	if e.Key != "" {
		fmt.Fprintf(&b, ": sample %q", e.Key)
	}
	if e.Offset >= 0 {
		fmt.Fprintf(&b, " at byte %d", e.Offset)
		if e.Compression != None {
			fmt.Fprintf(&b, " of the %s-decompressed tar", e.Compression)
		}
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Skippable reports whether the failure belongs to one sample only, so that Next can
// go on with the following sample (a duplicate extension, a member over the cap, a
// sparse member).
// Failures of the stream itself are sticky: every later Next returns them.
func (e *Error) Skippable() bool { return e.sample }

// Options configure a Reader. The zero value works.
type Options struct {
	// URL names the shard in samples (Sample.URL) and in errors.
	URL string
	// MaxMemberSize caps the bytes of one member held in memory. Zero means
	// DefaultMaxMemberSize (256 MiB). A larger member is an error of its sample.
	MaxMemberSize int64
	// MaxSampleSize caps the bytes of one sample's members together, held in memory
	// until the sample is complete. Zero means DefaultMaxSampleSize (1 GiB). A larger
	// sample is an error of its own. It does not apply to data that is not held
	// (SizesOnly, Stream); MaxMemberSize does, as the largest member accepted.
	MaxSampleSize int64
	// Stream, when set, receives each member's data as the reader reaches it, instead
	// of the data being held until the sample is complete: a consumer that writes
	// members out (cat) holds no more than its copy buffer, whatever the sizes. key
	// is the sample the member belongs to; the fields of the samples Next returns
	// carry no Data. Stream may read data or not before it returns; the rest is
	// skipped. A read error of data fails the shard as Next would; any other error
	// Stream returns fails the shard with that error. A sample-level error (a
	// duplicate extension) is found when its member comes, after the sample's earlier
	// members were streamed.
	Stream func(key string, f Field, data io.Reader) error
	// SizesOnly skips member data: fields carry their size and offset but no Data.
	// Use it to list shards without reading their contents into memory. On an
	// uncompressed shard whose reader can seek (a local file), data is skipped by
	// seeking and only headers are read.
	SizesOnly bool
	// MaxRatio caps how many bytes of tar a compressed shard may inflate to per
	// stored byte, against decompression bombs. Zero means DefaultMaxRatio (1000); a
	// negative value turns the check off. The first 1 MiB is always allowed. The cap
	// holds for every inflated byte, whether it is read into a sample, skipped (a
	// member that is not a field, data under SizesOnly) or read after the
	// end-of-archive marker to check the compressed stream's end.
	MaxRatio float64
	// StartOffset is the byte offset in the shard's tar where the stream starts: a
	// reader of an uncompressed shard may begin at any sample's offset (Sample.Offset,
	// as an index records it), and offsets in samples and errors stay those of the
	// whole shard. A compressed stream with a StartOffset is an error
	// (ErrUnsupportedCompression): it can only be entered at its start.
	StartOffset int64
	// EndOffset, when above zero, is where the stream given to the reader ends: a
	// sample's offset (the next one's start), so that a reader of a ranged read of
	// some samples ends there with io.EOF instead of ErrTruncated.
	EndOffset int64
	// Timing records the time spent reading the source and inflating, for Times.
	Timing bool
	// Buffers, if set, supplies the memory each sample's data is read into, and the
	// caller owns it once Next returns the sample (Sample.Buf): a consumer that
	// keeps samples takes them without copying their bytes. Default: the Reader's own
	// memory, reused by the next Next.
	Buffers Buffers

	// ratioFloor, when set, replaces the 1 MiB that MaxRatio always allows, so that
	// tests and fuzz targets can try the cap on small inputs.
	ratioFloor int64
}

// Buffers supplies sample memory to a Reader (Options.Buffers).
type Buffers interface {
	// Get returns a buffer of length 0 and capacity at least n.
	Get(n int) []byte
	// Put takes back a buffer that Get returned and that the Reader no longer
	// needs (one it outgrew while reading a sample, or holds at Close).
	Put(b []byte)
}

// DefaultMaxRatio is the decompression ratio cap used when Options.MaxRatio is zero.
const DefaultMaxRatio = 1000

// ErrTooCompressed means a compressed shard inflated beyond Options.MaxRatio.
var ErrTooCompressed = errors.New("shard: decompression ratio over the cap")

// Field is one member of a sample.
type Field struct {
	// Ext is the extension: the member's base name after its first dot, lower-cased
	// ("seg.png" for "a/b/x.seg.png").
	Ext string
	// Name is the member's path in the tar, as written.
	Name string
	// Size is the member's length in bytes.
	Size int64
	// Offset is the byte offset of the member's data in the tar stream.
	Offset int64
	// Data holds the member's bytes; nil when Options.SizesOnly is set. It is owned by
	// the Reader and valid until the next call to Next, except with Options.Buffers:
	// then it lies in Sample.Buf.
	Data []byte
}

// Sample is a group of adjacent members that share a key.
type Sample struct {
	// Key is the member path up to the first dot of its base name (WebDataset's
	// __key__); directories stay in the key.
	Key string
	// URL is the shard the sample came from (WebDataset's __url__).
	URL string
	// Offset is the byte offset of the header of the sample's first member.
	Offset int64
	// Fields are the sample's members in the order they appear in the tar.
	Fields []Field
	// Buf, with Options.Buffers, is the buffer from Buffers.Get that holds every
	// field's Data, one after the other (its length is their total), or nil when
	// they are all empty. The caller owns it: it keeps it with the data or gives it
	// back with Buffers.Put.
	Buf []byte
}

// Get returns the data of the field with extension ext, and whether it exists.
func (s *Sample) Get(ext string) ([]byte, bool) {
	for i := range s.Fields {
		if s.Fields[i].Ext == ext {
			return s.Fields[i].Data, true
		}
	}
	return nil, false
}

// Bytes returns the total size of the sample's members.
func (s *Sample) Bytes() int64 {
	var n int64
	for _, f := range s.Fields {
		n += f.Size
	}
	return n
}

// Clone returns a deep copy of s whose data stays valid after the Reader moves on. The
// copies of all fields share one allocation.
func (s *Sample) Clone() *Sample {
	c := &Sample{Key: s.Key, URL: s.URL, Offset: s.Offset, Fields: make([]Field, len(s.Fields))}
	var n int
	for _, f := range s.Fields {
		n += len(f.Data)
	}
	buf := make([]byte, 0, n)
	for i, f := range s.Fields {
		c.Fields[i] = f
		if f.Data != nil {
			start := len(buf)
			buf = append(buf, f.Data...)
			c.Fields[i].Data = buf[start:len(buf):len(buf)]
		}
	}
	return c
}

// Reader reads the samples of one WebDataset shard from a stream, in the manner of
// archive/tar: Next returns one sample at a time and io.EOF at the end. Whole-shard
// compression (gzip, zstd, bzip2) is detected from the first bytes, never from the
// name.
//
// Grouping follows WebDataset: only regular files are members; a member's key is its
// path up to the first dot of its base name and its extension the rest, lower-cased;
// a base name without a dot (or starting with one) is skipped, as are top-level
// metadata members named __name__; a new sample starts whenever the key changes.
//
// A compressed shard is complete only when its compressed stream is: after the
// end-of-archive marker the Reader reads the stream to its end, so that the gzip
// CRC-32 and size of every member (a shard may be several gzip members, each
// optionally followed by zero bytes), the zstd frame checksums and the bzip2 stream
// CRC are checked before Next returns io.EOF. Every error of the decompressor is an
// error of the shard (ErrTruncated or ErrCorrupt), never its end.
//
// GNU sparse files (written by tar --sparse: old-GNU 'S' entries, PAX formats 0.0,
// 0.1 and 1.0) are not expanded: Python's tarfile would read them as regular files
// with their holes filled in, and expanding holes would let a few stored bytes stand
// for any number of zeros. Such a member is an error of its sample (ErrSparse) naming
// the member; the Reader skips its data correctly and goes on with the next sample.
//
// The data of the returned sample is owned by the Reader and overwritten by the next
// call to Next; Clone a sample to keep it. A Reader is not safe for concurrent use.
type Reader struct {
	opts Options
	src  io.Reader

	started bool
	comp    Compression
	dec     io.ReadCloser // decompressor, nil for None
	inBuf   *bufio.Reader // the buffer below a decompressor read from a stream (inBufPool)
	rawIn   counter       // counts bytes of the shard as stored; sits above src
	seeker  *seekBuffer   // set when listing a seekable shard by seeking past data
	tarIn   counter       // counts tar-stream bytes; sits between dec and tr
	tr      *tarReader

	err     error      // sticky stream error
	pending *tarHeader // header of the next sample's first member
	pendHdr tarHeader
	pendOff int64  // its header offset
	next    int64  // offset where the next header is expected
	skipKey string // key of a failed sample whose remaining members are skipped
	skip    bool
	lastKey string // key of the last member header read, for errors in its data

	buf    []byte // arena for the current sample's data
	used   int
	hint   int // with Options.Buffers: the size to ask for a new sample's buffer
	sample Sample
}

// NewReader returns a Reader of the shard in r. It reads nothing until Next.
func NewReader(r io.Reader, opts Options) *Reader {
	if opts.MaxMemberSize <= 0 {
		opts.MaxMemberSize = DefaultMaxMemberSize
	}
	if opts.MaxSampleSize <= 0 {
		opts.MaxSampleSize = DefaultMaxSampleSize
	}
	if opts.MaxRatio == 0 {
		opts.MaxRatio = DefaultMaxRatio
	}
	return &Reader{opts: opts, src: r}
}

// Compression returns the detected whole-shard compression; None before the first Next.
func (r *Reader) Compression() Compression { return r.comp }

// Offset returns the number of tar-stream bytes consumed so far (after whole-shard
// decompression).
func (r *Reader) Offset() int64 { return r.tarIn.n }

// StoredBytes returns the number of bytes consumed so far from the underlying reader:
// the shard as stored, before decompression.
func (r *Reader) StoredBytes() int64 { return r.rawIn.n }

// Close releases the decompressor. It does not close the underlying reader.
func (r *Reader) Close() error {
	if r.opts.Buffers != nil && r.buf != nil {
		r.opts.Buffers.Put(r.buf[:0])
		r.buf = nil
	}
	if r.dec != nil {
		r.dec.Close()
		r.dec = nil
	}
	if r.inBuf != nil {
		r.inBuf.Reset(nil)
		inBufPool.Put(r.inBuf)
		r.inBuf = nil
	}
	if r.err == nil {
		r.err = errors.New("shard: reader closed")
	}
	return nil
}

// zstdPool keeps zstd decoders between shards: a new one allocates its window and
// history buffers (megabytes) and faults them in.
var zstdPool sync.Pool

func getZstd(in io.Reader) (*zstd.Decoder, error) {
	if zr, ok := zstdPool.Get().(*zstd.Decoder); ok {
		if err := zr.Reset(in); err == nil {
			return zr, nil
		}
		zr.Close()
	}
	return zstd.NewReader(in, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow))
}

// pooledZstd returns its decoder to the pool on Close instead of closing it.
type pooledZstd struct{ *zstd.Decoder }

func (p pooledZstd) Close() error {
	if p.Decoder.Reset(nil) == nil {
		zstdPool.Put(p.Decoder)
	} else {
		p.Decoder.Close()
	}
	return nil
}

func (r *Reader) start() error {
	r.started = true
	r.rawIn = counter{r: r.src, timed: r.opts.Timing}
	var (
		in    io.Reader
		magic []byte
	)
	if sk, ok := r.src.(io.ReadSeeker); ok && r.opts.SizesOnly && r.seekable(sk) {
		// Headers only: a buffer that seeks lets archive/tar skip member data, with
		// no system call for members that fit in the buffer.
		sb := &seekBuffer{src: &r.rawIn, buf: make([]byte, 0, readBufferSize)}
		r.seeker = sb
		var head [6]byte
		n, err := io.ReadFull(sb, head[:])
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			return r.streamErr(0, err)
		}
		magic = head[:n]
		if _, err := sb.Seek(0, io.SeekStart); err != nil {
			return r.streamErr(0, err)
		}
		in = sb
	} else if _, ok := r.src.(io.ByteReader); ok {
		// In memory or buffered already (the convention compress/flate relies on):
		// another buffer would only copy every byte once more.
		var head [6]byte
		n, err := io.ReadFull(&r.rawIn, head[:])
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			return r.streamErr(0, err)
		}
		magic = head[:n]
		in = io.MultiReader(bytes.NewReader(magic), &r.rawIn)
	} else {
		// A small buffer: header reads do not cost a system call each, while member
		// data larger than the buffer is read straight into the arena.
		br := bufio.NewReaderSize(&r.rawIn, readBufferSize)
		var err error
		if magic, err = br.Peek(6); err != nil && err != io.EOF {
			return r.streamErr(0, err)
		}
		in = br
	}
	r.comp = DetectCompression(magic)
	if br, ok := in.(*bufio.Reader); ok && r.comp != None {
		// A decompressor reads its input in small pieces (a block's header, then the
		// block): through a large buffer, each read of the source takes what has
		// arrived (a system call per buffer, not two or three per block), for one
		// copy of the stored bytes, fewer than the inflated bytes the tar reader
		// copies anyway.
		r.inBuf = inBufPool.Get().(*bufio.Reader)
		r.inBuf.Reset(br)
		in = r.inBuf
	}
	switch r.comp {
	case Gzip:
		// The gzip reader reads a byte at a time from a buffer it is given (or makes
		// one of its own); with ours, the bytes between members are ours to read.
		br, ok := in.(*bufio.Reader)
		if !ok {
			br = bufio.NewReader(in)
		}
		zr, err := gzip.NewReader(br)
		if err != nil {
			return r.startErr(err)
		}
		zr.Multistream(false)
		r.dec = &gzipStream{zr: zr, br: br}
	case Zstd:
		zr, err := getZstd(in)
		if err != nil {
			return r.startErr(err)
		}
		r.dec = pooledZstd{zr}
	case Bzip2:
		in = bzip2.NewReader(in)
	case XZ, LZ4:
		return r.streamErr(0, fmt.Errorf("%w: %s (recompress the shard with gzip or zstd)", ErrUnsupportedCompression, r.comp))
	}
	if r.dec != nil {
		in = r.dec
	}
	if r.opts.StartOffset != 0 && (r.comp != None || r.opts.StartOffset%blockSize != 0 || r.opts.StartOffset < 0) {
		return r.streamErr(0, fmt.Errorf("%w: a %s shard read from byte %d: only an uncompressed shard can be entered at a sample's block-aligned offset (the shard changed since it was indexed?)", ErrUnsupportedCompression, r.comp, r.opts.StartOffset))
	}
	// Uncompressed, the tar stream is the stored stream: rawIn times it already.
	r.tarIn = counter{r: in, timed: r.opts.Timing && r.comp != None, n: r.opts.StartOffset}
	r.next = r.opts.StartOffset
	if r.comp != None && r.opts.MaxRatio > 0 {
		// The cap is checked on every read of the tar stream, so that no byte
		// inflates unchecked: not member data, nor data skipped, nor the drain.
		r.tarIn.ratio, r.tarIn.raw = r.opts.MaxRatio, &r.rawIn
		r.tarIn.floor = r.opts.ratioFloor
		if r.tarIn.floor <= 0 {
			r.tarIn.floor = 1 << 20
		}
		r.tarIn.limit = r.tarIn.floor
	}
	r.tr = newTarReader(&r.tarIn)
	return nil
}

// seekBuffer is a bufio.Reader that can also seek: a seek within the buffered bytes
// costs nothing, one beyond them seeks the source.
type seekBuffer struct {
	src io.ReadSeeker
	buf []byte // buffered bytes are buf[r:]
	r   int
	pos int64 // source position of buf[len(buf)]
}

func (b *seekBuffer) Read(p []byte) (int, error) {
	if b.r == len(b.buf) {
		if len(p) >= cap(b.buf) {
			n, err := b.src.Read(p)
			b.pos += int64(n)
			return n, err
		}
		n, err := b.src.Read(b.buf[:cap(b.buf)])
		b.buf, b.r = b.buf[:n], 0
		b.pos += int64(n)
		if n == 0 {
			return 0, err
		}
	}
	n := copy(p, b.buf[b.r:])
	b.r += n
	return n, nil
}

func (b *seekBuffer) Seek(off int64, whence int) (int64, error) {
	cur := b.pos - int64(len(b.buf)-b.r)
	switch whence {
	case io.SeekCurrent:
		off += cur
	case io.SeekEnd:
		return 0, errors.New("shard: seek from end not supported")
	}
	if start := b.pos - int64(len(b.buf)); off >= start && off <= b.pos {
		b.r = int(off - start)
		return off, nil
	}
	if off < 0 {
		return cur, errors.New("shard: seek to a negative position")
	}
	pos, err := b.src.Seek(off, io.SeekStart)
	if err != nil {
		// Where the source is now is unknown only if it moved; it did not.
		return cur, err
	}
	b.buf, b.r, b.pos = b.buf[:0], 0, pos
	return pos, nil
}

// seekable reports whether sk really seeks (os.Stdin has the method but fails).
func (r *Reader) seekable(sk io.Seeker) bool {
	pos, err := sk.Seek(0, io.SeekCurrent)
	return err == nil && pos == 0
}

// Times returns the time spent so far reading the underlying reader (fetch) and
// inflating a compressed shard (not counting fetch). Zero unless Options.Timing.
func (r *Reader) Times() (fetch, inflate time.Duration) {
	fetch = r.rawIn.dur
	if r.comp != None {
		inflate = max(r.tarIn.dur-fetch, 0)
	}
	return fetch, inflate
}

// startErr reports a decompressor that failed on its first bytes.
func (r *Reader) startErr(err error) error {
	switch {
	case r.rawIn.err != nil:
		err = r.rawIn.err
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("%w: the %s stream ended early, after %d compressed bytes", ErrTruncated, r.comp, r.rawIn.n)
	default:
		err = fmt.Errorf("%w (%s): %w", ErrCorrupt, r.comp, err)
	}
	return r.streamErr(0, err)
}

// Next returns the next sample, or io.EOF after the last. A *Error whose Skippable
// reports true fails one sample only and the next call goes on; any other error is
// returned again by every later call.
func (r *Reader) Next() (*Sample, error) {
	if r.err != nil {
		return nil, r.err
	}
	if !r.started {
		if err := r.start(); err != nil {
			return nil, err
		}
	}
	s := &r.sample
	s.Key, s.URL, s.Fields, s.Buf = "", r.opts.URL, s.Fields[:0], nil
	r.used = 0
	for {
		hdr, off := r.pending, r.pendOff
		r.pending = nil
		if hdr == nil {
			var err error
			if hdr, off, err = r.nextHeader(); err != nil {
				if err == io.EOF && len(s.Fields) > 0 {
					return r.hand(s), nil
				}
				return nil, err
			}
		}
		key, ext, ok := splitName(hdr.Name)
		if !ok || !isRegular(hdr) && !hdr.Sparse {
			continue
		}
		r.lastKey = key
		if r.skip {
			if key == r.skipKey {
				continue
			}
			r.skip = false
		}
		if len(s.Fields) > 0 && key != s.Key {
			r.pendHdr = *hdr // the tar reader reuses its header
			r.pending, r.pendOff = &r.pendHdr, off
			return r.hand(s), nil
		}
		if len(s.Fields) == 0 {
			s.Key, s.Offset = key, off
		}
		held := !r.opts.SizesOnly && r.opts.Stream == nil // the data is kept in memory
		tooBig := hdr.Size > r.opts.MaxMemberSize
		sampleBig := held && !tooBig && sampleSize(s)+hdr.Size > r.opts.MaxSampleSize
		if _, dup := s.Get(ext); dup || tooBig || sampleBig || hdr.Sparse {
			var cause error
			switch {
			case sampleBig:
				cause = fmt.Errorf("%w: with member %q (%d bytes) the sample's members come to %d bytes, cap %d", ErrSampleTooLarge, hdr.Name, hdr.Size, sampleSize(s)+hdr.Size, r.opts.MaxSampleSize)
			case hdr.Sparse:
				form := "PAX GNU.sparse records"
				if hdr.Typeflag == tar.TypeGNUSparse {
					form = "old GNU type 'S'"
				}
				cause = fmt.Errorf("%w: member %q is a GNU sparse file (%s); shardload does not expand sparse files (write the shard without tar --sparse)", ErrSparse, hdr.Name, form)
			case dup:
				cause = fmt.Errorf("%w %q (member %q)", ErrDuplicateExtension, ext, hdr.Name)
			default:
				cause = fmt.Errorf("%w: member %q is %d bytes, cap %d", ErrMemberTooLarge, hdr.Name, hdr.Size, r.opts.MaxMemberSize)
			}
			r.skip, r.skipKey = true, key
			return nil, &Error{URL: r.opts.URL, Key: key, Offset: off, Compression: r.comp, Err: cause, sample: true}
		}
		f := Field{Ext: ext, Name: hdr.Name, Size: hdr.Size, Offset: r.tarIn.n}
		if r.opts.Stream != nil {
			if err := r.stream(key, f); err != nil {
				return nil, err
			}
		} else if !r.opts.SizesOnly {
			data, err := r.readData(hdr.Size)
			if err != nil {
				r.err = r.errAt(key, f.Offset+int64(len(data)), err)
				return nil, r.err
			}
			f.Data = data
		}
		s.Fields = append(s.Fields, f)
	}
}

// sampleSize is the bytes of s's members so far.
func sampleSize(s *Sample) int64 {
	var n int64
	for _, f := range s.Fields {
		n += f.Size
	}
	return n
}

// stream hands the current member's data to Options.Stream.
func (r *Reader) stream(key string, f Field) error {
	sr := streamReader{t: r.tr}
	if err := r.opts.Stream(key, f, &sr); sr.err != nil {
		r.err = r.errAt(key, f.Offset+sr.n, sr.err)
		return r.err
	} else if err != nil {
		r.err = err
		return err
	}
	return nil
}

// streamReader reads a member's data for Options.Stream, keeping its read error.
type streamReader struct {
	t   *tarReader
	n   int64 // bytes read
	err error // the first error other than the member's end
}

func (s *streamReader) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.t.Read(p)
	s.n += int64(n)
	if err != nil && (err != io.EOF || s.t.remain > 0) {
		s.err = err
	}
	return n, err
}

// nextHeader returns the next tar header and the offset where it starts.
func (r *Reader) nextHeader() (*tarHeader, int64, error) {
	off := r.next
	hdr, err := r.tr.Next()
	if err == io.EOF {
		// Reads below never drop an error (readFull): a failure of the source or
		// of the decompressor before the end-of-archive marker would have been
		// returned instead of io.EOF, and one in what was read ahead after the
		// marker is no failure of the tar.
		switch {
		case r.tarIn.n < off+blockSize && (r.tarIn.err != nil || r.rawIn.err != nil):
			// Not an end: the source or the decompressor failed where a header
			// would start. Their error says what happened (errAt).
			err = io.ErrUnexpectedEOF
		case r.tarIn.n < off+blockSize && r.opts.EndOffset > 0 && off == r.opts.EndOffset:
			// The end of a ranged read, at a sample boundary.
			r.err = io.EOF
			return nil, off, io.EOF
		case r.tarIn.n < off+blockSize:
			// The tar reader reports a clean end both after the end-of-archive
			// marker and when the stream simply stops at a header boundary. Only
			// the first is a complete shard: the marker is at least one block of
			// zeros.
			err = fmt.Errorf("%w: no end-of-archive marker after %d bytes", ErrTruncated, r.tarIn.n)
			r.err = &Error{URL: r.opts.URL, Offset: r.tarIn.n, Compression: r.comp, Err: err}
			return nil, off, r.err
		default:
			if err := r.drain(); err != nil {
				r.err = err
				return nil, off, err
			}
			r.err = io.EOF
			return nil, off, io.EOF
		}
	}
	if err != nil {
		key := ""
		if r.tarIn.n < off {
			// The stream failed while archive/tar skipped the previous member's data.
			key = r.lastKey
		}
		r.err = r.errAt(key, off, err)
		return nil, off, r.err
	}
	r.lastKey = ""
	dataStart := r.tarIn.n
	if hdr.Size > math.MaxInt64-blockSize-dataStart {
		// Checked before any arithmetic: the member's end would overflow an offset.
		err := fmt.Errorf("%w: member %q is %d bytes: its end overflows a 64-bit offset", ErrBadHeader, hdr.Name, hdr.Size)
		r.err = &Error{URL: r.opts.URL, Offset: off, Compression: r.comp, Err: err}
		return nil, off, r.err
	}
	r.next = dataStart + (hdr.Size+blockSize-1)/blockSize*blockSize
	return hdr, off, nil
}

// drain reads a compressed shard's stream from the end-of-archive marker to its end,
// through the ratio cap, so that the decompressor checks the rest: the gzip CRC-32 and
// size of the last member (and any members after it), zstd frame checksums, the bzip2
// stream CRC. A stream that fails there fails the shard: until its end is verified, no
// byte before it is known to be right.
func (r *Reader) drain() error {
	if r.comp == None {
		return nil
	}
	buf := r.tr.scratch()
	for {
		_, err := r.tarIn.Read(buf)
		if err == io.EOF && r.tarIn.err == nil && r.rawIn.err == nil {
			return nil
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return r.errAt("", r.tarIn.n, err)
		}
	}
}

// hand gives a complete sample to the caller: with Options.Buffers, its buffer too.
func (r *Reader) hand(s *Sample) *Sample {
	if r.opts.Buffers != nil && r.used > 0 {
		s.Buf = r.buf[:r.used]
		r.buf = nil
		r.hint = r.used + r.used/16
	}
	return s
}

// readData reads size bytes of the current member into the arena.
func (r *Reader) readData(size int64) ([]byte, error) {
	n := int(size)
	if n > cap(r.buf)-r.used {
		if n > upfront {
			return r.readGrowing(n)
		}
		r.grow(0, n)
	}
	b := r.buf[r.used : r.used+n : r.used+n]
	m, err := readFull(r.tr, b) // an error that comes with the last bytes counts
	if err != nil {
		return b[:m], err
	}
	r.used += n
	return b, nil
}

// upfront is the largest member size readData makes room for before reading: a
// larger member's room grows with the bytes that arrive, so that a header claiming
// more than the stream holds (up to MaxMemberSize) costs memory only in proportion to
// the data actually there.
const upfront = 8 << 20

// readGrowing reads n bytes of the current member into the arena, growing it as the
// bytes arrive.
func (r *Reader) readGrowing(n int) ([]byte, error) {
	got := 0
	for got < n {
		if r.used+got == cap(r.buf) {
			r.grow(got, min(n-got, max(got, upfront)))
		}
		end := min(cap(r.buf), r.used+n)
		m, err := readFull(r.tr, r.buf[r.used+got:end])
		got += m
		if err != nil {
			return r.buf[r.used : r.used+got : r.used+got], err
		}
	}
	b := r.buf[r.used : r.used+n : r.used+n]
	r.used += n
	return b, nil
}

// grow makes room for more bytes after the arena's used bytes and the partial bytes
// of the current member that follow them, which it keeps.
func (r *Reader) grow(partial, more int) {
	if r.opts.Buffers != nil {
		r.regrow(partial, more)
		return
	}
	// Earlier fields of this sample keep the old array alive; the current member
	// (and the next sample) start at the front of the new one.
	nb := make([]byte, max(2*cap(r.buf), partial+more, 64<<10))
	copy(nb, r.buf[r.used:r.used+partial])
	r.buf, r.used = nb, 0
}

// regrow gets a buffer from Options.Buffers with room for more bytes after the used
// and partial ones, moving the current sample's fields (and the partial bytes) into it.
func (r *Reader) regrow(partial, more int) {
	nb := r.opts.Buffers.Get(max(r.used+partial+more, r.hint))
	nb = nb[:cap(nb)]
	copy(nb, r.buf[:r.used+partial])
	off := 0
	for i := range r.sample.Fields {
		f := &r.sample.Fields[i]
		k := len(f.Data)
		f.Data = nb[off : off+k : off+k]
		off += k
	}
	if r.buf != nil {
		r.opts.Buffers.Put(r.buf[:0])
	}
	r.buf = nb
}

// errAt turns a read failure into an *Error naming where it happened.
func (r *Reader) errAt(key string, off int64, err error) error {
	switch {
	case errors.Is(r.tarIn.err, ErrTooCompressed):
		err = r.tarIn.err
		off = r.tarIn.n
	case r.rawIn.err != nil:
		// The source failed (a dropped connection, a short object): say so as it is.
		err = r.rawIn.err
	case r.comp != None && errors.Is(r.tarIn.err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("%w: the %s stream ended early, after %d compressed bytes", ErrTruncated, r.comp, r.rawIn.n)
		off = r.tarIn.n
	case r.comp != None && r.tarIn.err != nil:
		// The decompressor failed: report its error, not archive/tar's view of it.
		err = fmt.Errorf("%w (%s, near compressed byte %d): %w", ErrCorrupt, r.comp, r.rawIn.n, r.tarIn.err)
		off = r.tarIn.n
	case errors.Is(err, io.ErrUnexpectedEOF):
		end := r.tarIn.n
		if r.seeker != nil {
			// archive/tar sought past the end: the stream ends where the object does.
			if size, serr := r.seeker.src.Seek(0, io.SeekEnd); serr == nil {
				end = size
			}
		}
		err = fmt.Errorf("%w: stream ended after %d bytes", ErrTruncated, end)
		off = end
	case errors.Is(err, tar.ErrHeader):
		err = fmt.Errorf("%w: %w", ErrBadHeader, err)
	}
	return &Error{URL: r.opts.URL, Key: key, Offset: off, Compression: r.comp, Err: err}
}

func (r *Reader) streamErr(off int64, err error) error {
	r.err = &Error{URL: r.opts.URL, Offset: off, Compression: r.comp, Err: err}
	return r.err
}

const blockSize = 512

// compressedBufferSize is the buffer below the decompressor of a compressed shard
// read from a stream: larger than a zstd block (128 KiB) and a socket's usual read.
const compressedBufferSize = 256 << 10

// inBufPool keeps the buffers below decompressors (compressedBufferSize) between
// shards.
var inBufPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, compressedBufferSize) }}

// readBufferSize is the buffer below the tar reader. Reads at least this large bypass
// it.
const readBufferSize = 8 << 10

// isRegular reports whether a member is a regular file, as Python's tarfile (and so
// WebDataset) sees it: '0', the old '\x00', and '7' (contiguous file).
func isRegular(h *tarHeader) bool {
	return h.Typeflag == tar.TypeReg || h.Typeflag == 0 || h.Typeflag == tar.TypeCont
}

// splitName splits a member path into WebDataset's key and extension. It reports
// false for members that are not sample fields: base names without a dot or starting
// with one, and top-level metadata members named __name__.
func splitName(name string) (key, ext string, ok bool) {
	slash := strings.LastIndexByte(name, '/')
	if slash < 0 && strings.HasPrefix(name, "__") && strings.HasSuffix(name, "__") {
		return "", "", false
	}
	base := name[slash+1:]
	dot := strings.IndexByte(base, '.')
	if dot <= 0 {
		return "", "", false
	}
	ext = base[dot+1:]
	if hasUpper(ext) {
		ext = strings.ToLower(ext)
	}
	return name[:slash+1+dot], ext, true
}

func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' || c >= 0x80 {
			return true
		}
	}
	return false
}

// clockBase anchors mono.
var clockBase = time.Now()

// mono returns a monotonic timestamp for timing reads: one clock read, where
// time.Now takes two (wall and monotonic). Shards of small samples time several
// reads per sample.
func mono() time.Duration { return time.Since(clockBase) }

// counter counts the bytes read through it and remembers the first error other than
// io.EOF that its source returned. With a ratio cap (the tar stream of a compressed
// shard), it fails a read that takes the count beyond ratio times the stored bytes
// read (raw), or beyond floor if that is more.
type counter struct {
	r     io.Reader
	n     int64
	err   error
	timed bool
	dur   time.Duration // time spent in r.Read, when timed

	limit int64 // 0: no cap; else a count within the cap, rechecked when n passes it
	ratio float64
	floor int64
	raw   *counter
}

func (c *counter) Read(p []byte) (int, error) {
	var t0 time.Duration
	if c.timed {
		t0 = mono()
	}
	n, err := c.r.Read(p)
	if c.timed {
		c.dur += mono() - t0
	}
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	if c.limit != 0 && c.n > c.limit {
		if cerr := c.recheck(); cerr != nil {
			// Sticky: every later read fails the same way.
			c.err, c.r = cerr, errorReader{cerr}
			return n, cerr
		}
	}
	return n, err
}

// recheck moves the limit up to what the stored bytes read so far allow, or reports
// the stream over the cap.
func (c *counter) recheck() error {
	allowed := max(float64(c.floor), c.ratio*float64(c.raw.n))
	if float64(c.n) > allowed {
		return fmt.Errorf("%w: %d bytes of tar from %d stored bytes (cap %gx)", ErrTooCompressed, c.n, c.raw.n, c.ratio)
	}
	c.limit = math.MaxInt64
	if allowed < math.MaxInt64/2 {
		c.limit = int64(allowed)
	}
	return nil
}

// errorReader fails every read with err.
type errorReader struct{ err error }

func (e errorReader) Read([]byte) (int, error) { return 0, e.err }

// Seek lets archive/tar skip member data when the source can seek; otherwise it
// fails and archive/tar reads the data through.
func (c *counter) Seek(off int64, whence int) (int64, error) {
	sk, ok := c.r.(io.Seeker)
	if !ok {
		return 0, errCannotSeek
	}
	pos, err := sk.Seek(off, whence)
	if err == nil {
		c.n = pos
	}
	return pos, err
}

// errCannotSeek is what counter.Seek says for a source that cannot: the tar reader
// then reads what it skips.
var errCannotSeek = errors.New("shard: source cannot seek")

// gzipStream reads a whole-shard gzip file: one or more members, each optionally
// followed by zero bytes (as Python's gzip module reads them). The gzip reader checks
// each member's CRC-32 and size when it reaches the member's end; gzipStream then
// reads the bytes up to the next member itself, so that the end of the file is
// io.EOF only where the last member ended (and its trailer was right), and anything
// else after it is an error.
type gzipStream struct {
	zr  *gzip.Reader // with Multistream(false): io.EOF at the end of each member
	br  *bufio.Reader
	err error // sticky: the end of the file, or a failure between members
}

func (g *gzipStream) Read(p []byte) (int, error) {
	for g.err == nil {
		n, err := g.zr.Read(p)
		if err != io.EOF {
			return n, err
		}
		g.err = g.nextMember()
		if n > 0 {
			return n, nil
		}
	}
	return 0, g.err
}

// nextMember skips zero bytes after a member and starts the next one: io.EOF when
// the file ends there.
func (g *gzipStream) nextMember() error {
	for {
		c, err := g.br.ReadByte()
		if err != nil {
			return err
		}
		if c != 0 {
			break
		}
	}
	g.br.UnreadByte()
	if b, _ := g.br.Peek(2); b[0] != 0x1f || len(b) == 2 && b[1] != 0x8b {
		return fmt.Errorf("bytes after a gzip member that are neither zeros nor another member: %w", gzip.ErrHeader)
	}
	if err := g.zr.Reset(g.br); err != nil {
		return unexpected(err) // a header cut short is no end
	}
	g.zr.Multistream(false)
	return nil
}

func (g *gzipStream) Close() error { return nil }

// Compression is a whole-shard compression format.
type Compression int

// Compressions that DetectCompression recognises.
const (
	None Compression = iota
	Gzip
	Zstd
	Bzip2
	XZ
	LZ4
)

func (c Compression) String() string {
	switch c {
	case Gzip:
		return "gzip"
	case Zstd:
		return "zstd"
	case Bzip2:
		return "bzip2"
	case XZ:
		return "xz"
	case LZ4:
		return "lz4"
	}
	return "none"
}

// DetectCompression names the compression whose magic number starts b.
func DetectCompression(b []byte) Compression {
	switch {
	case bytes.HasPrefix(b, []byte{0x1f, 0x8b}):
		return Gzip
	case bytes.HasPrefix(b, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return Zstd
	case bytes.HasPrefix(b, []byte("BZh")):
		return Bzip2
	case bytes.HasPrefix(b, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return XZ
	case bytes.HasPrefix(b, []byte{0x04, 0x22, 0x4d, 0x18}):
		return LZ4
	}
	return None
}
