package shard

// The Reader: Next, grouping members into samples, and walking the tar stream.

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
)

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

	sr     streamReader // what Options.Stream reads the current member from
	buf    []byte       // arena for the current sample's data
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
			data, err := r.readData(hdr.Size, r.place(key, f))
			if err != nil {
				r.err = r.errAt(key, f.Offset+int64(len(data)), err)
				return nil, r.err
			}
			f.Data = data
		}
		s.Fields = append(s.Fields, f)
	}
}

// place returns Options.Place's destination for member f of the sample key, or nil.
func (r *Reader) place(key string, f Field) []byte {
	if r.opts.Place == nil || f.Size == 0 {
		return nil
	}
	if dst := r.opts.Place(key, f); int64(len(dst)) == f.Size {
		return dst[:f.Size:f.Size]
	}
	return nil
}

// stream hands the current member's data to Options.Stream.
func (r *Reader) stream(key string, f Field) error {
	sr := &r.sr // the Reader's own: one on the stack would move to the heap for each member
	*sr = streamReader{t: r.tr}
	if err := r.opts.Stream(key, f, sr); sr.err != nil {
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

const blockSize = 512

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
