// Package shard turns WebDataset tar shards into samples: brace expansion of shard
// URLs, the streaming sample reader, and a shard's entry (Info: its count, version,
// size, sample offsets and members' sizes, Members). It reads from an io.Reader and
// knows nothing of where the bytes come from (package source), what the fields mean
// (package decode) or who reads which samples (package plan).
//
// # Shard URLs
//
// Expand and ExpandAll expand brace patterns as WebDataset (Python's braceexpand)
// does: numeric ranges keeping their zero padding, steps and descending ranges, letter
// ranges, lists and nested groups, escaped braces. At most MaxExpansion URLs come from
// one call; Count works the number out before anything is allocated, so a pattern
// that would give more fails at once with ErrBadPattern instead of filling memory.
// A directory written {hash:P} is filled from each URL's file name by HashPrefix: a
// dataset spread over P hashed key prefixes (DIR/3/train-000123.tar) is named by one
// pattern, DIR/{hash:16}/train-{000000..000999}.tar, with no listing.
//
// # Samples
//
// A Reader reads one shard as a stream, in the manner of archive/tar: Next returns one
// Sample at a time and io.EOF after the last. The grouping is WebDataset's: only
// regular files are members; a member's key is its path up to the first dot of its
// base name and its extension the rest, lower-cased; members without an extension and
// top-level __name__ metadata are skipped; a new sample starts whenever the key
// changes. Tar headers (USTAR, GNU long names, PAX path and size records) are parsed by
// the package itself, for the three fields a WebDataset reader needs. Whole-shard
// compression (gzip, zstd, bzip2) is detected from the first bytes, never from the
// name; xz and lz4 are recognised and refused (ErrUnsupportedCompression).
//
// A sample's data is the Reader's, reused by the next Next (Clone keeps one), unless
// Options.Buffers supplies the memory, which the caller then owns (Sample.Buf).
// Options.SizesOnly reads headers only (seeking past data where the source can seek),
// to count and list shards. Options.Stream hands each member's data to a function as
// the reader reaches it instead of holding the sample until it is complete, so that a
// consumer writing members out holds no more than its copy buffer.
//
// # Damaged and hostile input
//
// Every failure is an *Error naming the shard URL, the sample key when one is known and
// the byte offset in the tar stream, wrapping one of the package's sentinels. Failures
// of one sample are skippable (Error.Skippable) and Next goes on with the next sample;
// failures of the stream are sticky. The Reader checks:
//
//   - the decompressor: every error it gives is an error of the shard (ErrTruncated or
//     ErrCorrupt), never its end;
//   - the trailer: a compressed shard is complete only when its compressed stream is,
//     so after the end-of-archive marker the Reader reads the stream to its end and
//     checks the gzip CRC-32 and size of every member, the zstd frame checksums and
//     the bzip2 stream CRC before it returns io.EOF; a stream that stops without the
//     end-of-archive marker is ErrTruncated, a header that fails its checksum
//     ErrBadHeader;
//   - the decompression ratio: a compressed shard may inflate to at most
//     Options.MaxRatio bytes of tar per stored byte (DefaultMaxRatio, 1000, after the
//     first 1 MiB), counting every inflated byte, read or skipped (ErrTooCompressed);
//   - sparse members: GNU sparse files (old-GNU 'S' entries, PAX sparse formats) are
//     not expanded but refused as an error of their sample (ErrSparse), their data
//     skipped correctly;
//   - sizes: a member larger than Options.MaxMemberSize (DefaultMaxMemberSize,
//     256 MiB) is ErrMemberTooLarge, a sample whose members together exceed
//     Options.MaxSampleSize (DefaultMaxSampleSize, 1 GiB) ErrSampleTooLarge, both
//     errors of their sample; two members with one extension in a sample are
//     ErrDuplicateExtension. MaxSampleSize does not apply to data that is not held
//     (SizesOnly, Stream); MaxMemberSize does.

package shard
