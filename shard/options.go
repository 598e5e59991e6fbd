package shard

// Options of a Reader, their defaults, and the Buffers it reads samples into.

import "io"

// DefaultMaxMemberSize is the per-member cap used when Options.MaxMemberSize is zero.
const DefaultMaxMemberSize = 256 << 20

// DefaultMaxSampleSize is the per-sample cap used when Options.MaxSampleSize is zero.
const DefaultMaxSampleSize = 1 << 30

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
	// carry no Data. Stream may read data or not before it returns, and not after;
	// the rest is skipped. A read error of data fails the shard as Next would; any
	// other error Stream returns fails the shard with that error. A sample-level
	// error (a duplicate extension) is found when its member comes, after the
	// sample's earlier members were streamed.
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
	// Place, if set, is asked for each member's destination before its data is
	// read: a slice of exactly the member's Size bytes puts the data there (the
	// field's Data is then that slice, outside Sample.Buf), anything else (nil) reads
	// it as usual. A loader that knows where a member's bytes will end up (its row of
	// a batch, from an index's member sizes) reads them there once. key is the
	// sample's; Place is not called with SizesOnly or Stream.
	Place func(key string, f Field) []byte

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
