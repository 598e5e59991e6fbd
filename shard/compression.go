package shard

// Starting a Reader: buffering its input, detecting the compression, and the decompressors.

import (
	"bufio"
	"bytes"
	"compress/bzip2"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/shardload/shardload/mem"
)

// maxZstdWindow bounds the memory a zstd frame may ask for. Shards written with zstd
// levels up to 22 use windows of at most 128 MiB.
const maxZstdWindow = 256 << 20

// idleZstd keeps zstd decoders between shards, and across garbage collections:
// a new decoder allocates its history ring (8.6 MB for an 8 MiB window) and faults
// it in, and a sync.Pool drops what it holds at every other collection, so that a
// loader's later epochs allocated new rings (34 MB in 3 s of 16 token shards). Up to
// maxIdleZstd bytes of rings are kept; the most recently used decoder is taken
// first, and one idle for idleZstdFor is closed (a process that stops reading zstd
// shards does not keep their rings).
var idleZstd struct {
	sync.Mutex
	decs  []pooledZstd // oldest first
	bytes int64        // their rings
	sweep *time.Timer  // set while decoders are idle
}

const (
	// maxIdleZstd bounds the rings of idle decoders: a loader's 8 lanes of 8 MiB
	// windows take 69 MB.
	maxIdleZstd = 128 << 20
	// idleZstdFor is how long a decoder stays idle before it is closed: well over
	// an epoch boundary's pause.
	idleZstdFor = time.Minute
)

// sweepIdleZstd closes the decoders idle since before now less idleZstdFor and
// returns how long until the next one is due, 0 when none is idle. idleZstd must be
// locked.
func sweepIdleZstd(now time.Time) time.Duration {
	k := 0
	for k < len(idleZstd.decs) && now.Sub(idleZstd.decs[k].since) >= idleZstdFor {
		idleZstd.decs[k].Decoder.Close()
		idleZstd.bytes -= idleZstd.decs[k].ring
		k++
	}
	idleZstd.decs = append(idleZstd.decs[:0], idleZstd.decs[k:]...)
	clear(idleZstd.decs[len(idleZstd.decs):cap(idleZstd.decs)])
	if len(idleZstd.decs) == 0 {
		return 0
	}
	return idleZstd.decs[0].since.Add(idleZstdFor).Sub(now)
}

// sweepIdleZstdLater runs sweepIdleZstd when the timer fires, and sets the timer
// again while decoders stay idle.
func sweepIdleZstdLater() {
	idleZstd.Lock()
	defer idleZstd.Unlock()
	if next := sweepIdleZstd(time.Now()); next > 0 {
		idleZstd.sweep.Reset(next)
	} else {
		idleZstd.sweep = nil
	}
}

// getZstd returns a decoder of in, whose first bytes are head: an idle one, else a
// new one, for which the heap is readied first (rings) if head declares a window.
func getZstd(in io.Reader, head []byte) (pooledZstd, error) {
	ring := int64(0)
	if w, ok := zstdWindow(head); ok {
		ring = zstdRing(w)
	}
	idleZstd.Lock()
	if n := len(idleZstd.decs); n > 0 {
		p := idleZstd.decs[n-1]
		idleZstd.decs = idleZstd.decs[:n-1]
		idleZstd.bytes -= p.ring
		idleZstd.Unlock()
		if err := p.Reset(in); err == nil {
			p.ring = max(p.ring, ring) // a larger window grows the ring
			return p, nil
		}
		p.Decoder.Close()
	} else {
		idleZstd.Unlock()
	}
	rings.ready(ring)
	zr, err := zstd.NewReader(in, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow))
	return pooledZstd{Decoder: zr, ring: ring}, err
}

// rings readies Go heap memory in huge pages for the history rings of new zstd
// decoders (mem.ReadyHeap): a decoder allocates a ring of its frame's window (8 MiB
// for the zstd library's default level, 2 MiB for the reference tool's) on its
// first read and writes every page of it within a window of output, 4 KiB pages
// each a fault otherwise. Room for ringsAhead rings is readied at once, one garbage
// collection for a loader's lanes; more when that room is used up.
var rings ringRoom

// ringRoom counts the heap readied for rings that rings have not taken yet.
type ringRoom struct {
	sync.Mutex
	left int64
}

const (
	// ringsAhead is how many rings one readying makes room for: the loader's
	// default lanes (--open-shards).
	ringsAhead = 8
	// minReadyRing is the smallest ring readied for: below it the rings are too
	// small for huge pages to matter.
	minReadyRing = 1 << 20
	// ringExtra is the room readied for each decoder beside its ring.
	ringExtra = 1 << 20
)

func (r *ringRoom) ready(ring int64) {
	if ring < minReadyRing {
		return
	}
	r.Lock()
	defer r.Unlock()
	// A decoder's other buffers (a block's input, literals and sequences, about
	// 0.4 MB) and a reader's input buffer are allocated before its ring, from the
	// same free range: room for them too.
	need := ring + ringExtra
	if r.left < need {
		if !mem.ReadyHeap(int(need) * ringsAhead) {
			return
		}
		r.left = need * ringsAhead
	}
	r.left -= need
}

// zstdWindow returns the window a zstd frame's header declares (its content size
// for a single-segment frame), and false where h holds no frame header.
func zstdWindow(h []byte) (int64, bool) {
	var hd zstd.Header
	if hd.Decode(h) != nil || hd.Skippable {
		return 0, false
	}
	w := hd.WindowSize
	if hd.SingleSegment {
		w = hd.FrameContentSize
	}
	return int64(min(w, maxZstdWindow)), true
}

// zstdRing returns the bytes of a decoder's history ring for a window of w: the
// window and twice a block's room (the largest block, 128 KiB, and its overrun).
func zstdRing(w int64) int64 { return w + 2*(min(w, 128<<10)+32) }

// pooledZstd is a decoder and the bytes of its ring, as far as known; Close keeps
// it idle (idleZstd) instead of closing it, within maxIdleZstd.
type pooledZstd struct {
	*zstd.Decoder
	ring  int64
	since time.Time // when it went idle
}

func (p pooledZstd) Close() error {
	// A ring not known (no frame header seen) counts as a small window's.
	p.ring = max(p.ring, minReadyRing)
	if p.Decoder.Reset(nil) == nil {
		idleZstd.Lock()
		if idleZstd.bytes+p.ring <= maxIdleZstd {
			p.since = time.Now()
			idleZstd.decs = append(idleZstd.decs, p)
			idleZstd.bytes += p.ring
			p.Decoder = nil
			if idleZstd.sweep == nil {
				idleZstd.sweep = time.AfterFunc(idleZstdFor, sweepIdleZstdLater)
			}
		}
		idleZstd.Unlock()
	}
	if p.Decoder != nil {
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
		// another buffer would only copy every byte once more. The first bytes, up to
		// a zstd frame's header, tell the compression and the window.
		var head [zstd.HeaderMaxSize]byte
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
		if _, err := br.Peek(6); err != nil && err != io.EOF {
			return r.streamErr(0, err)
		}
		// The magic, and up to a zstd frame's header from what the buffer holds.
		magic, _ = br.Peek(min(br.Buffered(), zstd.HeaderMaxSize))
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
		zr, err := getZstd(in, magic)
		if err != nil {
			return r.startErr(err)
		}
		r.dec = zr
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
	r.tarIn = counter{r: in, timed: r.opts.Timing && r.comp != None, sampled: true, n: r.opts.StartOffset}
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

// compressedBufferSize is the buffer below the decompressor of a compressed shard
// read from a stream: larger than a zstd block (128 KiB) and a socket's usual read.
const compressedBufferSize = 256 << 10

// inBufPool keeps the buffers below decompressors (compressedBufferSize) between
// shards.
var inBufPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, compressedBufferSize) }}

// readBufferSize is the buffer below the tar reader. Reads at least this large bypass
// it.
const readBufferSize = 8 << 10

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

// InflateBytes is about what one open shard's decompressor holds while the shard is
// read, for a loader's memory budget: for zstd, the history of a window of 8 MiB
// (what zstd writes with at levels up to 19) and room for two blocks; for gzip, its
// 32 KiB window and tables; for bzip2, a block of up to 900 kB at four bytes a
// byte. A zstd frame of a larger window (levels 20-22, --long) holds that much more.
func InflateBytes(c Compression) int64 {
	switch c {
	case Zstd:
		return 8<<20 + 512<<10
	case Gzip:
		return 64 << 10
	case Bzip2:
		return 4 << 20
	}
	return 0
}

// CompressionOfName names the compression a shard's name says, by its extension
// (.gz, .tgz, .zst, .zstd, .bz2, .xz, .lz4); None when it says none.
func CompressionOfName(url string) Compression {
	switch strings.ToLower(path.Ext(url)) {
	case ".gz", ".tgz":
		return Gzip
	case ".zst", ".zstd":
		return Zstd
	case ".bz2":
		return Bzip2
	case ".xz":
		return XZ
	case ".lz4":
		return LZ4
	}
	return None
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
