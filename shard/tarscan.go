package shard

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/shardload/shardload/internal/strs"
)

// tarReader reads the members of a tar stream: USTAR, GNU and PAX headers, GNU long
// names and PAX path and size records, the end-of-archive marker. It is what
// archive/tar does for the fields a WebDataset reader needs (name, size, type),
// without allocating per member beyond the name: shards of small samples spend most
// of their time in header handling. Errors wrap tar.ErrHeader for bad headers and
// io.ErrUnexpectedEOF for a stream cut short, as archive/tar's do.
type tarReader struct {
	r       io.Reader
	blk     [blockSize]byte
	remain  int64 // data bytes of the current entry not yet read
	pad     int64 // padding after the current entry's data
	padded  [2 * blockSize]byte
	discard []byte
	hdr     tarHeader
	names   strs.Arena // the entries' names: no allocation a name
	joined  []byte     // a ustar prefix and name joined
}

// nameChunk is the chunk of the names' arena: about 200 names of 40 bytes an
// allocation, and at most 8 KiB kept alive by a name (a sample's key) kept long.
const nameChunk = 8 << 10

// tarHeader is the part of a tar header shard.Reader uses.
type tarHeader struct {
	Name     string
	Size     int64 // bytes of data that follow the header in the stream
	Typeflag byte
	// Sparse is set for a GNU sparse file: an old-GNU 'S' entry (whose extension
	// blocks Next has read), or an entry with GNU.sparse.* PAX records, whose Name is
	// then GNU.sparse.name when given. Its data is the stored form (a sparse map and
	// the non-hole chunks), not the file's contents.
	Sparse bool
}

// maxEntrySize is the largest entry size Next accepts: an entry's data, its padding
// and the headers before it must fit in an int64 count of stream bytes.
const maxEntrySize = math.MaxInt64 - 4*blockSize

func newTarReader(r io.Reader) *tarReader {
	return &tarReader{r: r, names: strs.Arena{Chunk: nameChunk}}
}

// Next skips what is left of the current entry and returns the next entry's header,
// or io.EOF after the end-of-archive marker or at the end of the stream on a block
// boundary (shard.Reader tells the two apart).
func (t *tarReader) Next() (*tarHeader, error) {
	var err error
	if t.remain == 0 && t.pad > 0 {
		err = t.readPadded()
	} else if err = t.skip(t.remain + t.pad); err == nil {
		// No overflow: Next accepts no size over maxEntrySize.
		err = t.readBlock()
	}
	t.remain, t.pad = 0, 0
	var (
		longName   string // from a GNU 'L' entry or a PAX path record
		sparseName string // from a PAX GNU.sparse.name record
		sparse     bool   // PAX GNU.sparse.* records seen
	)
	size := int64(-1) // from a PAX size record
	for first := true; ; first = false {
		if !first {
			err = t.readBlock()
		}
		if err != nil {
			return nil, err // io.EOF on a boundary, io.ErrUnexpectedEOF inside a block
		}
		if allZero(t.blk[:]) {
			// The end-of-archive marker is two zero blocks; accept one (some writers).
			if err := t.readBlock(); err != nil && err != io.EOF {
				return nil, err
			}
			if !allZero(t.blk[:]) {
				return nil, fmt.Errorf("%w: a zero block followed by a non-zero one", tar.ErrHeader)
			}
			return nil, io.EOF
		}
		if err := t.checksum(); err != nil {
			return nil, err
		}
		n, err := parseNumeric(t.blk[124:136])
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: bad size field %q", tar.ErrHeader, t.blk[124:136])
		}
		flag := t.blk[156]
		switch flag {
		case 'x', 'L':
			if n > 1<<20 {
				return nil, fmt.Errorf("%w: %q extension header of %d bytes", tar.ErrHeader, flag, n)
			}
			data := make([]byte, n)
			if _, err := readFull(t.r, data); err != nil {
				return nil, unexpected(err)
			}
			if err := t.skip(padding(n)); err != nil {
				return nil, err
			}
			if flag == 'L' {
				longName = string(cBytes(data))
				continue
			}
			pax, err := parsePAX(data)
			if err != nil {
				return nil, err
			}
			if pax.path != "" {
				longName = pax.path
			}
			if pax.size >= 0 {
				size = pax.size
			}
			if pax.sparse {
				sparse = true
				if pax.sparseName != "" {
					sparseName = pax.sparseName
				}
			}
			continue
		}
		h := &t.hdr
		h.Typeflag = flag
		h.Size = n
		if size >= 0 {
			h.Size = size
		}
		switch {
		case longName != "":
			h.Name = longName
		case bytes.Equal(t.blk[257:263], []byte("ustar\x00")) && t.blk[345] != 0:
			t.joined = append(append(append(t.joined[:0], cBytes(t.blk[345:500])...), '/'), cBytes(t.blk[0:100])...)
			h.Name = t.names.Of(t.joined)
		default:
			h.Name = t.names.Of(cBytes(t.blk[0:100]))
		}
		if flag == 0 && len(h.Name) > 0 && h.Name[len(h.Name)-1] == '/' {
			h.Typeflag = tar.TypeDir // an old-style directory
		}
		h.Sparse = sparse || flag == tar.TypeGNUSparse
		if sparse && sparseName != "" {
			h.Name = sparseName // PAX sparse formats 0.1 and 1.0 keep the real name here
		}
		switch h.Typeflag {
		case tar.TypeLink, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeDir, tar.TypeFifo:
			h.Size = 0 // these have no data, whatever the size field says
		}
		if h.Size > maxEntrySize {
			return nil, fmt.Errorf("%w: entry %q of %d bytes: the size overflows a 64-bit stream offset", tar.ErrHeader, h.Name, h.Size)
		}
		if flag == tar.TypeGNUSparse && t.blk[gnuIsExtended] != 0 {
			// Old GNU sparse map continued in extension blocks between the header
			// and the data: read past them so that the data is where it should be.
			for {
				if err := t.readBlock(); err != nil {
					return nil, unexpected(err)
				}
				if t.blk[gnuExtIsExtended] == 0 {
					break
				}
			}
		}
		t.remain, t.pad = h.Size, padding(h.Size)
		return h, nil
	}
}

// Offsets in an old-GNU sparse header ('S') and in its extension blocks of the flag
// that says another extension block follows.
const (
	gnuIsExtended    = 482
	gnuExtIsExtended = 504
)

// readPadded reads the current entry's padding and the next header block with one
// read: the common case, an entry whose data was read to its end, then costs one
// read of the source instead of two. Errors are those of skip and of reading the
// header: io.EOF only when the source itself ended cleanly (io.EOF) right after the
// padding. Any other error of the source, io.ErrUnexpectedEOF from a decompressor
// included, is returned as it is: it is never taken for the end of the stream.
func (t *tarReader) readPadded() error {
	pad := int(t.pad)
	n, err := readFull(t.r, t.padded[:pad+blockSize])
	switch {
	case err == nil:
		copy(t.blk[:], t.padded[pad:pad+blockSize])
		return nil
	case err != io.EOF:
		return err
	case n == pad:
		return io.EOF
	default:
		return io.ErrUnexpectedEOF
	}
}

// readBlock reads one block into t.blk: io.EOF when the source ended cleanly before
// its first byte, io.ErrUnexpectedEOF when it ended inside it.
func (t *tarReader) readBlock() error {
	n, err := readFull(t.r, t.blk[:])
	if err == io.EOF && n > 0 {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readFull is io.ReadFull, except that an error of the source other than io.EOF is
// returned even when it came with the last bytes asked for, and io.EOF is returned
// as it is (not turned into io.ErrUnexpectedEOF): the callers tell a clean end from a
// failure by the source's own error, and a decompressor that fails with
// io.ErrUnexpectedEOF must not look like one that ended.
func readFull(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			if err == io.EOF && n == len(buf) {
				return n, nil
			}
			return n, err
		}
	}
	return n, nil
}

// Read reads the current entry's data.
func (t *tarReader) Read(p []byte) (int, error) {
	if t.remain <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > t.remain {
		p = p[:t.remain]
	}
	n, err := t.r.Read(p)
	t.remain -= int64(n)
	if err == io.EOF && t.remain > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// skip discards n bytes, seeking when the stream can.
func (t *tarReader) skip(n int64) error {
	if n <= 0 {
		return nil
	}
	if sk, ok := t.r.(io.Seeker); ok && n > 1 {
		if _, err := sk.Seek(n-1, io.SeekCurrent); err == nil {
			// Read the last byte, so that a stream cut short is noticed here.
			n = 1
		}
	}
	buf := t.scratch()
	for n > 0 {
		m, err := t.r.Read(buf[:min(n, int64(len(buf)))])
		n -= int64(m)
		// An error that came with the last bytes is still an error, unless it is
		// the clean end of the stream.
		if err != nil && (n > 0 || err != io.EOF) {
			return unexpected(err)
		}
	}
	return nil
}

// checksum verifies the header block's checksum (unsigned or, as some old writers
// computed it, signed).
func (t *tarReader) checksum() error {
	want, err := parseNumeric(t.blk[148:156])
	if err != nil {
		return fmt.Errorf("%w: bad checksum field", tar.ErrHeader)
	}
	// The sum of the header's bytes with the checksum field counted as eight
	// spaces; some writers summed them as signed bytes.
	unsigned, high := sumBytes(&t.blk)
	for _, c := range t.blk[148:156] {
		unsigned -= int64(c)
		if c >= 0x80 {
			high--
		}
	}
	unsigned += 8 * ' '
	if want != unsigned && want != unsigned-256*int64(high) {
		return fmt.Errorf("%w: checksum mismatch", tar.ErrHeader)
	}
	return nil
}

// sumBytes returns the sum of a block's bytes and how many are 0x80 or more, eight
// bytes at a time: four 16-bit lanes cannot overflow over 64 words of two bytes
// each (64 × 2 × 255 < 65536).
func sumBytes(b *[blockSize]byte) (sum int64, high int) {
	const lo = 0x00ff00ff00ff00ff
	var acc uint64
	for i := 0; i < blockSize; i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		acc += w&lo + (w>>8)&lo
		high += bits.OnesCount64(w & 0x8080808080808080)
	}
	return int64(acc&0xffff + (acc>>16)&0xffff + (acc>>32)&0xffff + acc>>48), high
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func padding(n int64) int64 { return -n & (blockSize - 1) }

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// cBytes returns b up to its first NUL.
func cBytes(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return b
}

// parseNumeric parses a tar number field: octal text padded with spaces or NULs, or
// GNU's base-256 binary form (first byte's high bit set).
func parseNumeric(b []byte) (int64, error) {
	if len(b) > 0 && b[0]&0x80 != 0 {
		if b[0]&0x40 != 0 {
			return 0, errors.New("negative base-256 number")
		}
		var v int64
		for i, c := range b {
			if i == 0 {
				c &= 0x7f
			}
			if v>>55 != 0 {
				return 0, errors.New("base-256 number overflows")
			}
			v = v<<8 | int64(c)
		}
		return v, nil
	}
	i, j := 0, len(b)
	for i < j && (b[i] == ' ' || b[i] == 0) {
		i++
	}
	for j > i && (b[j-1] == ' ' || b[j-1] == 0) {
		j--
	}
	// Octal digits alone, the common case (two fields of every header), parsed here:
	// 20 digits cannot overflow. Anything else (a sign, more digits, a bad byte) takes
	// strconv's parse and its errors.
	if j-i <= 20 {
		var v int64
		k := i
		for ; k < j && b[k]-'0' < 8; k++ {
			v = v<<3 | int64(b[k]-'0')
		}
		if k == j {
			return v, nil
		}
	}
	return strconv.ParseInt(string(b[i:j]), 8, 64)
}

// paxInfo is what a PAX extended header says that shard.Reader uses.
type paxInfo struct {
	path       string
	size       int64 // -1 when absent
	sparse     bool  // GNU.sparse.* records (other than the name alone): a sparse file
	sparseName string
}

// parsePAX reads the records of a PAX extended header.
func parsePAX(data []byte) (paxInfo, error) {
	info := paxInfo{size: -1}
	for len(data) > 0 {
		sp := bytes.IndexByte(data, ' ')
		if sp <= 0 {
			return paxInfo{}, fmt.Errorf("%w: bad PAX record", tar.ErrHeader)
		}
		n, perr := strconv.Atoi(string(data[:sp]))
		if perr != nil || n <= sp+1 || n > len(data) || data[n-1] != '\n' {
			return paxInfo{}, fmt.Errorf("%w: bad PAX record length", tar.ErrHeader)
		}
		rec := data[sp+1 : n-1]
		data = data[n:]
		eq := bytes.IndexByte(rec, '=')
		if eq < 0 {
			return paxInfo{}, fmt.Errorf("%w: PAX record without '='", tar.ErrHeader)
		}
		switch key, val := string(rec[:eq]), rec[eq+1:]; {
		case key == "path":
			info.path = string(val)
		case key == "size":
			v, perr := strconv.ParseInt(string(val), 10, 64)
			if perr != nil || v < 0 {
				return paxInfo{}, fmt.Errorf("%w: bad PAX size %q", tar.ErrHeader, val)
			}
			info.size = v
		case key == "GNU.sparse.name":
			info.sparseName = string(val)
		case strings.HasPrefix(key, "GNU.sparse."):
			// major, minor, map, offset, numbytes, size, realsize: formats 0.0, 0.1
			// and 1.0 of GNU tar's sparse files.
			info.sparse = true
		}
	}
	return info, nil
}

// scratch returns a buffer for reads that are thrown away.
func (t *tarReader) scratch() []byte {
	if t.discard == nil {
		t.discard = make([]byte, 32<<10)
	}
	return t.discard
}
