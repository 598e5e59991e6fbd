// Package megatron reads Megatron-LM indexed datasets, the .idx/.bin pair that
// Megatron-LM's tools/preprocess_data.py writes (the "MMIDIDX" format of
// megatron/core/datasets/indexed_dataset.py), and writes them for tests and
// examples.
//
// # The format
//
// The .bin is nothing but tokens: every sequence's tokens, little-endian elements of
// one dtype, back to back. The .idx says where they are. All its integers are
// little-endian:
//
//	offset  size       field
//	0       9          magic "MMIDIDX\x00\x00"
//	9       8          version, uint64, always 1
//	17      1          dtype code, uint8 (DType)
//	18      8          S, the sequence count, uint64
//	26      8          D, the length of document_indices, uint64
//	34      4*S        sequence_lengths, int32: tokens per sequence
//	34+4S   8*S        sequence_pointers, int64: byte offset of each sequence in the .bin
//	34+12S  8*D        document_indices, int64: document i is the sequences
//	                   [document_indices[i], document_indices[i+1]); it starts at 0
//	                   and ends at S, so there are D-1 documents
//	34+12S+8D  S       sequence_modes, int8, only in a multimodal dataset
//
// The dtype codes are 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
// 7 float32 and 8 uint16. Megatron-LM's preprocessing picks uint16 for vocabularies
// under 65500 tokens and int32 otherwise; this package reads every integer code and
// refuses the two float codes (ErrFloatDType), which cannot hold tokens. With
// preprocess_data.py's default each document is one sequence; with
// --split-sentences each sentence is a sequence.
//
// Megatron-LM's own reader takes the arrays at the counts' word and ignores what
// follows them; it learns whether sequence_modes is there from its caller. Parse
// needs no such word: the file must end right after document_indices or right after
// the S bytes of sequence_modes, and anything else is ErrSize.
//
// # The checks
//
// Parse trusts nothing in the file. It checks the header, then that the counts
// account for the file size exactly, without overflow whatever the counts (a count
// of 2^62 sequences, whose 12 bytes each wrap to 0 in 64 bits, is ErrSize), and that
// the file is as long as its caller said, all before it allocates anything in
// proportion to the counts: memory follows the real size of the file, never a count.
// Then every sequence length must be >= 0, every sequence must lie within the .bin,
// the sequences must be sorted and not overlap, document_indices must run from 0 to
// S without decreasing, and each document's sequences must be back to back in the
// .bin, so that a document is one byte range (Megatron-LM writes every sequence back
// to back; gaps are allowed only between documents). Every error wraps a sentinel
// (ErrBadMagic, ErrSize, ErrOverlap, ...) and says which sequence or document is
// wrong and at which byte of the .idx.
//
// # Memory
//
// An Index keeps flat arrays, never a value per document. A file as Megatron-LM
// writes it, one sequence per document and sequences back to back, costs 8 bytes per
// document: 800 MB for 10^8 documents, against the 20 bytes per document of its
// .idx. Gaps between sequences add 4 bytes per sequence; documents of other than one
// sequence each (--split-sentences) make the Index keep document_indices, 8 bytes
// per document; sequence modes add 1 byte per sequence. Parse holds no more
// than that, plus a 64 KiB read buffer, while it works. Every per-document answer
// (DocTokens, DocRange, DocSequences) takes constant time.
//
// # Tokens and writing
//
// AppendTokens turns a document's .bin bytes, read at its DocRange, into int64 tokens
// in the caller's buffer. Writer writes a pair byte for byte as Megatron-LM's
// IndexedDatasetBuilder does, for fixtures.
package megatron
