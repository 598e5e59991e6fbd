package shard

// The errors of a Reader: the sentinels, *Error, and how a failure is reported.

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/shardload/shardload/redact"
)

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

// SampleOnly reports whether err is (or wraps) an *Error that fails one sample only
// (Skippable); false for nil and for every other error. Readers call it for every
// sample, so it allocates nothing when err is nil.
func SampleOnly(err error) bool {
	if err == nil {
		return false
	}
	var se *Error
	return errors.As(err, &se) && se.Skippable()
}

// ErrTooCompressed means a compressed shard inflated beyond Options.MaxRatio.
var ErrTooCompressed = errors.New("shard: decompression ratio over the cap")

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
