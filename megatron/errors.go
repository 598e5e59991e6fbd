package megatron

import "errors"

// The sentinels every error of the package wraps; match them with errors.Is. The
// wrapping error adds what is wrong and where: the sequence or document number and
// the byte offset in the .idx (or .bin) file.
var (
	// ErrBadMagic means the .idx does not start with MMIDIDX\x00\x00.
	ErrBadMagic = errors.New("megatron: bad magic")
	// ErrVersion means the .idx version is not 1, the only one Megatron-LM writes.
	ErrVersion = errors.New("megatron: unsupported version")
	// ErrDType means the dtype code is none of Megatron-LM's eight.
	ErrDType = errors.New("megatron: unknown dtype code")
	// ErrFloatDType means the dtype is float32 or float64, which cannot hold tokens.
	ErrFloatDType = errors.New("megatron: float dtype cannot hold tokens")
	// ErrTruncated means the .idx ended before the size it was said to have, or
	// before its 34-byte header.
	ErrTruncated = errors.New("megatron: truncated index")
	// ErrSize means the sequence and document counts do not account for the .idx
	// size exactly (with or without the multimodal sequence modes).
	ErrSize = errors.New("megatron: counts do not match the index size")
	// ErrDocIndices means document_indices is not a non-decreasing run of sequence
	// numbers from 0 to the sequence count.
	ErrDocIndices = errors.New("megatron: bad document indices")
	// ErrLength means a sequence length is negative.
	ErrLength = errors.New("megatron: negative sequence length")
	// ErrPointer means a sequence lies, in part or whole, outside the .bin.
	ErrPointer = errors.New("megatron: sequence outside the data file")
	// ErrOverlap means a sequence starts before the previous one ends: the
	// pointers are not sorted or the sequences overlap.
	ErrOverlap = errors.New("megatron: overlapping sequences")
	// ErrGap means a document's sequences are not contiguous in the .bin, so it
	// has no single byte range.
	ErrGap = errors.New("megatron: gap inside a document")
	// ErrPartialToken means a byte slice given to AppendTokens does not hold a
	// whole number of elements.
	ErrPartialToken = errors.New("megatron: partial token")
	// ErrTokenRange means a token given to the Writer does not fit its dtype.
	ErrTokenRange = errors.New("megatron: token out of the dtype's range")
	// ErrTooLong means a sequence given to the Writer has more than 2^31-1 tokens,
	// more than the int32 length field holds.
	ErrTooLong = errors.New("megatron: sequence too long")
	// ErrClosed means the Writer was used after Close.
	ErrClosed = errors.New("megatron: writer closed")
)
