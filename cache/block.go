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

// blockReader streams a disk entry. Each block's checksum is checked, the first time
// this process reads it, before any of its bytes are served, unless the entry's data
// file carries the mark of a check of every block in this boot (see mark.go). A block
// that does not match drops the entry and the reader goes on from the same byte
// through a new fetch of the object, after checking that the source still holds the
// version it was serving. Checked blocks are read as a local file is through a
// bufio.Reader: reads of smallRead bytes or more straight into the caller's buffer,
// smaller ones (a tar header) from a window of smallRead bytes, one system call for
// several of them.
type blockReader struct {
	c    *Cache
	e    *diskEntry
	fh   *os.File
	path string
	open func(off int64) (io.ReadCloser, error) // a stream of the object from off, fetched anew

	buf  []byte // a block buffer (load)
	win  []byte // a window of a checked block (window)
	view []byte // checked bytes at offset at: a block in buf, or a window in win
	at   int64  // offset of view[0]; -1: none
	off  int64  // read position
	up   io.ReadCloser
	once sync.Once
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
	if r.at < 0 || r.off < r.at || r.off >= r.at+int64(len(r.view)) {
		i := r.off / r.e.meta.Block
		off, n := r.e.meta.blockRange(i)
		if r.e.isChecked(i) && len(p) >= smallRead {
			// Checked by this process, or in this boot, already: read straight
			// into p, as from a local file, without the block buffer.
			return r.readChecked(p[:min(int64(len(p)), off+n-r.off)])
		}
		if r.e.isChecked(i) {
			if err := r.window(off + n); err != nil {
				return 0, err
			}
			return r.Read(p)
		}
		if off == r.off && int64(len(p)) >= n {
			// A whole block: read and checked in p itself, not copied through buf.
			err := r.readBlock(i, p[:n])
			if err == nil {
				r.off += n
				return int(n), nil
			}
			if !errors.Is(err, ErrCorrupt) {
				return 0, err
			}
			if err := r.recover(err); err != nil {
				return 0, err
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
	}
	n := copy(p, r.view[r.off-r.at:])
	r.off += int64(n)
	return n, nil
}

// smallRead is the size under which a read of a checked block is served from a
// window of this size: bufio.Reader's default, as the shard reader puts in front of
// a local file.
const smallRead = 8 << 10

// window reads the next smallRead bytes from the read position, at most to end (the
// end of the position's block, which is checked), into the window.
func (r *blockReader) window(end int64) error {
	if r.win == nil {
		r.win = make([]byte, smallRead)
	}
	r.at, r.view = -1, nil
	k := min(smallRead, end-r.off)
	if err := r.readAt(r.win[:k], r.off); err != nil {
		return err
	}
	r.at, r.view = r.off, r.win[:k]
	return nil
}

// ReadByte lets readers that want a buffered source (io.ByteReader) use this one
// without another buffer.
func (r *blockReader) ReadByte() (byte, error) {
	if r.up == nil && r.at >= 0 && r.off >= r.at && r.off < r.at+int64(len(r.view)) {
		c := r.view[r.off-r.at]
		r.off++
		return c, nil
	}
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return b[0], nil
}

// load reads block i into the buffer, checking its checksum unless it was checked.
func (r *blockReader) load(i int64) error {
	m := &r.e.meta
	if r.buf == nil {
		r.buf = getBlock(m.Block)
	}
	r.at, r.view = -1, nil
	off, n := m.blockRange(i)
	if err := r.readBlock(i, r.buf[:n]); err != nil {
		return err
	}
	r.at, r.view = off, r.buf[:n]
	return nil
}

// readBlock reads block i into b (its length), checking its checksum unless it was
// checked (in this process, or in this boot).
func (r *blockReader) readBlock(i int64, b []byte) error {
	m := &r.e.meta
	off, n := m.blockRange(i)
	k, err := r.fh.ReadAt(b, off)
	if int64(k) < n {
		if err == nil || err == io.EOF {
			return &source.Error{Op: "read", URL: m.URL, Err: fmt.Errorf("%w: %s ends at byte %d, recorded size %d", ErrCorrupt, r.path, off+int64(k), m.Size)}
		}
		return &source.Error{Op: "read", URL: m.URL, Err: fmt.Errorf("cache: %s: %w", r.path, err)}
	}
	if !r.e.isChecked(i) {
		r.c.n.checked.Add(1)
		if err := m.checkBlock(i, b, r.path); err != nil {
			return err
		}
		r.c.disk.checked(r.e, i, r.fh)
	}
	return nil
}

// readChecked reads p from the current position, which lies in one checked block.
func (r *blockReader) readChecked(p []byte) (int, error) {
	if err := r.readAt(p, r.off); err != nil {
		return 0, err
	}
	r.off += int64(len(p))
	return len(p), nil
}

// readAt reads all of p from off of the data file, bytes of checked blocks: a
// file that ends before is corrupt.
func (r *blockReader) readAt(p []byte, off int64) error {
	k, err := r.fh.ReadAt(p, off)
	if k < len(p) {
		m := &r.e.meta
		if err == nil || err == io.EOF {
			err = fmt.Errorf("%w: %s ends at byte %d, recorded size %d", ErrCorrupt, r.path, off+int64(k), m.Size)
		} else {
			err = fmt.Errorf("cache: %s: %w", r.path, err)
		}
		return &source.Error{Op: "read", URL: m.URL, Err: err}
	}
	return nil
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
