package cache

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/shardload/shardload/source"
)

// An entry is checksummed in blocks, so that a reader can verify each block just
// before serving it, in the one pass over the data that serving makes anyway, instead
// of hashing the whole file before its first byte.
const (
	minBlock  = 256 << 10 // bytes per block of objects up to minBlock × maxBlocks
	maxBlocks = 1024      // blocks per object at most; larger objects get larger blocks
)

// blockSize returns the block size for an object of size bytes: minBlock, doubled
// until the object has at most maxBlocks blocks.
func blockSize(size int64) int64 {
	b := int64(minBlock)
	for (size+b-1)/b > maxBlocks {
		b *= 2
	}
	return b
}

// blocks returns the number of blocks of the entry.
func (m *meta) blocks() int64 { return (m.Size + m.Block - 1) / m.Block }

// blockRange returns the offset and length of block i.
func (m *meta) blockRange(i int64) (off, n int64) {
	off = i * m.Block
	return off, min(m.Block, m.Size-off)
}

// checkBlock compares block i's bytes with its recorded checksum.
func (m *meta) checkBlock(i int64, b []byte, path string) error {
	if sum := xxh3.Hash(b); sum != m.sums[i] {
		off, n := m.blockRange(i)
		return &source.Error{Op: "read", URL: m.URL, Err: fmt.Errorf("%w: %s: block %d (bytes %d-%d): checksum %016x, recorded %016x",
			ErrCorrupt, path, i, off, off+n-1, sum, m.sums[i])}
	}
	return nil
}

// formatSums encodes checksums as the meta file's xxh3 field.
func formatSums(sums []uint64) string {
	b := make([]byte, 0, 16*len(sums))
	for _, s := range sums {
		b = append(b, fmt.Sprintf("%016x", s)...)
	}
	return string(b)
}

// parseSums decodes the meta file's xxh3 field of n blocks.
func parseSums(s string, n int64) ([]uint64, error) {
	if int64(len(s)) != 16*n {
		return nil, fmt.Errorf("%d checksum digits for %d blocks", len(s), n)
	}
	if strings.Trim(s, "0123456789abcdef") != "" {
		return nil, errors.New("checksums not in lower-case hex")
	}
	sums := make([]uint64, n)
	for i := range sums {
		v, err := strconv.ParseUint(s[16*i:16*i+16], 16, 64)
		if err != nil {
			return nil, err
		}
		sums[i] = v
	}
	return sums, nil
}

// blockHasher is an io.Writer that checksums what is written to it in blocks.
type blockHasher struct {
	block int64
	n     int64
	h     *xxh3.Hasher
	sums  []uint64
}

func newBlockHasher(size int64) *blockHasher {
	return &blockHasher{block: blockSize(size), h: xxh3.New()}
}

func (b *blockHasher) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		k := min(int64(len(p)), b.block-b.n%b.block)
		b.h.Write(p[:k])
		b.n += k
		p = p[k:]
		if b.n%b.block == 0 {
			b.sums = append(b.sums, b.h.Sum64())
			b.h.Reset()
		}
	}
	return total, nil
}

// finish returns the checksums of all blocks, the last one possibly short.
func (b *blockHasher) finish() []uint64 {
	if b.n%b.block != 0 {
		b.sums = append(b.sums, b.h.Sum64())
		b.h.Reset()
	}
	return b.sums
}

// blockPool recycles buffers of the smallest block size, the one most entries have.
var blockPool = sync.Pool{New: func() any { b := make([]byte, minBlock); return &b }}

func getBlock(size int64) []byte {
	if size == minBlock {
		return *blockPool.Get().(*[]byte)
	}
	return make([]byte, size)
}

func putBlock(b []byte) {
	if cap(b) == minBlock {
		b = b[:minBlock]
		blockPool.Put(&b)
	}
}

// blockReader streams a disk entry. Every block is read whole and its checksum
// checked before any of its bytes are served, on every read: the bytes a reader is
// given are the bytes the fetch checked, whatever happened to the file since (a
// write, a media error, a byte changed under the file system). A read of whole
// blocks at a block's start is read and checked in the caller's buffer itself; any
// other read (a tar header, a member smaller than a block) is served from a block
// buffer, one system call for the block, and ReadByte from that buffer too. A block
// that does not match drops the entry and the reader goes on from the same byte
// through a new fetch of the object, after checking that the source still holds the
// version it was serving.
type blockReader struct {
	c    *Cache
	t    *Tally // the open's, nil if none
	e    *diskEntry
	fh   *os.File
	path string
	open func(off int64) (io.ReadCloser, error) // a stream of the object from off, fetched anew

	buf  []byte // a block buffer (load)
	view []byte // checked bytes at offset at: a block in buf
	at   int64  // offset of view[0]; -1: none
	off  int64  // read position
	up   io.ReadCloser
	once sync.Once
	// pending is bytes served by ReadByte not yet counted in Stats.BytesFromDisk.
	pending int64
}

// Read serves bytes from the current block, loading and checking the next as needed.
func (r *blockReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if r.up != nil {
		// Read to the new fetch's own end, so that it is committed when this ends.
		n, err := r.up.Read(p)
		r.off += int64(n)
		return n, err
	}
	if r.off >= r.e.meta.Size {
		return 0, io.EOF
	}
	if r.at >= 0 && r.off >= r.at && r.off < r.at+int64(len(r.view)) {
		n := copy(p, r.view[r.off-r.at:])
		r.off += int64(n)
		r.c.served(r.t, wDisk, int64(n)+r.pending)
		r.pending = 0
		return n, nil
	}
	m := &r.e.meta
	i := r.off / m.Block
	off, n := m.blockRange(i)
	if off == r.off && int64(len(p)) >= n {
		// Whole blocks: read and checked in p itself, not copied through buf.
		k, err := r.readBlocks(i, p)
		r.off += k
		r.c.served(r.t, wDisk, k)
		if err == nil {
			return int(k), nil
		}
		if !errors.Is(err, ErrCorrupt) {
			return int(k), err
		}
		if err := r.recover(err); err != nil || k > 0 {
			// The blocks before the corrupt one matched: they are served.
			return int(k), err
		}
		return r.Read(p)
	}
	if err := r.load(i); err != nil {
		if !errors.Is(err, ErrCorrupt) {
			return 0, err
		}
		if err := r.recover(err); err != nil {
			return 0, err
		}
		return r.Read(p)
	}
	return r.Read(p)
}

// ReadByte lets readers that want a buffered source (io.ByteReader) use this one
// without another buffer.
func (r *blockReader) ReadByte() (byte, error) {
	if r.up == nil && r.at >= 0 && r.off >= r.at && r.off < r.at+int64(len(r.view)) {
		c := r.view[r.off-r.at]
		r.off++
		r.pending++ // counted in Stats.BytesFromDisk by the next Read or Close
		return c, nil
	}
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return b[0], nil
}

// load reads block i into the buffer and checks its checksum.
func (r *blockReader) load(i int64) error {
	m := &r.e.meta
	if r.buf == nil {
		r.buf = getBlock(m.Block)
	}
	r.at, r.view = -1, nil
	off, n := m.blockRange(i)
	if _, err := r.readBlocks(i, r.buf[:n]); err != nil {
		return err
	}
	r.at, r.view = off, r.buf[:n]
	return nil
}

// directMax bounds a read of whole blocks into the caller's buffer, so that the
// bytes are still in the processor's caches when they are checked.
const directMax = 1 << 20

// readBlocks reads the whole blocks from block i that fit in p (at least one: p
// holds block i), at most directMax bytes or one block, into p with one system
// call, and checks each one's checksum. It returns the bytes of the blocks that
// matched, those before the first that did not, and that block's error, which wraps
// ErrCorrupt; or 0 and the read's error (a file cut short is corrupt too).
func (r *blockReader) readBlocks(i int64, p []byte) (int64, error) {
	m := &r.e.meta
	off := i * m.Block
	lim := min(int64(len(p)), max(m.Block, directMax))
	want := lim / m.Block * m.Block
	if rest := m.Size - off; rest <= lim {
		want = rest // to the end, the last block maybe short
	}
	k, err := r.fh.ReadAt(p[:want], off)
	if int64(k) < want {
		if err == nil || err == io.EOF {
			err = fmt.Errorf("%w: %s ends at byte %d, recorded size %d", ErrCorrupt, r.path, off+int64(k), m.Size)
		} else {
			err = fmt.Errorf("cache: %s: %w", r.path, err)
		}
		return 0, &source.Error{Op: "read", URL: m.URL, Err: err}
	}
	return r.check(i, p[:want])
}

// check checks the blocks in b, which starts with block i, and returns the bytes
// of those that matched before the first that did not.
func (r *blockReader) check(i int64, b []byte) (int64, error) {
	m := &r.e.meta
	var done int64
	for len(b) > 0 {
		n := min(m.Block, int64(len(b)))
		r.c.n.checked.Add(1)
		if err := m.checkBlock(i, b[:n], r.path); err != nil {
			return done, err
		}
		done += n
		b = b[n:]
		i++
	}
	return done, nil
}

// recover drops the corrupt entry and continues the stream from a new fetch.
func (r *blockReader) recover(cause error) error {
	c, url := r.c, r.e.meta.URL
	c.n.corrupt.Add(1)
	c.drop(url)
	c.opts.Logf("cache: %v; fetching %s again from byte %d", cause, url, r.off)
	up, err := r.open(r.off)
	if err != nil {
		return errors.Join(cause, err)
	}
	r.up = up
	return nil
}

// Seek sets the read position.
func (r *blockReader) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		off += r.off
	case io.SeekEnd:
		off += r.e.meta.Size
	}
	if off < 0 {
		return 0, errors.New("cache: seek before the start")
	}
	if off == r.off {
		return off, nil
	}
	if r.up != nil {
		// Reading from a new fetch: start another one at off.
		r.up.Close()
		r.up = nil
		r.off = off
		up, err := r.open(off)
		if err != nil {
			return 0, err
		}
		r.up = up
		return off, nil
	}
	r.off = off
	return off, nil
}

func (r *blockReader) Close() error {
	var err error
	r.once.Do(func() {
		r.c.served(r.t, wDisk, r.pending)
		r.pending = 0
		if r.up != nil {
			r.up.Close()
		}
		err = r.fh.Close()
		if r.buf != nil {
			putBlock(r.buf)
			r.buf = nil
		}
		r.c.release(r.e)
	})
	return err
}
