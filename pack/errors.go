package pack

import "errors"

// The package's sentinel errors. Every error it makes wraps one of them, with the
// spec, document or value concerned (the error of a Fill tokens function comes back
// wrapped with its document instead); match them with errors.Is.
var (
	// ErrField means a spec's field is empty or holds a colon.
	ErrField = errors.New("pack: bad field")
	// ErrSeqLen means a spec's SEQ_LEN is not a decimal number in [1, MaxSeqLen].
	ErrSeqLen = errors.New("pack: bad sequence length")
	// ErrUnknownOption means a spec holds an option other than eos=ID and pad=ID.
	ErrUnknownOption = errors.New("pack: unknown option")
	// ErrDuplicateOption means a spec gives the same option twice.
	ErrDuplicateOption = errors.New("pack: duplicate option")
	// ErrBadID means a spec's eos or pad id is negative or not a decimal number that
	// fits in an int64.
	ErrBadID = errors.New("pack: bad token id")
	// ErrIDRange means a token id (a spec's eos or pad, or a document's token) does
	// not fit the output's dtype.
	ErrIDRange = errors.New("pack: token id out of the output's range")
	// ErrNegativeLength means a document's length, as the length function gave it,
	// is negative.
	ErrNegativeLength = errors.New("pack: negative document length")
	// ErrDocs means a layout was asked for a negative number of documents, or for
	// documents without a length function.
	ErrDocs = errors.New("pack: bad documents")
	// ErrOverflow means the epoch's tokens (with eos and the last row's pad) do not
	// fit in an int64.
	ErrOverflow = errors.New("pack: token count overflows")
	// ErrDeal means a Deal's world size, batch size, rows or start are not valid.
	ErrDeal = errors.New("pack: bad deal")
	// ErrBatchSize means a batch of this many rows cannot be filled: fewer than one
	// row, or more tokens than int32 cu_seqlens can index.
	ErrBatchSize = errors.New("pack: bad batch size")
	// ErrBuffers means a Batch's buffers are missing or too short.
	ErrBuffers = errors.New("pack: bad batch buffers")
	// ErrPieces means the pieces given to Fill do not fill whole consecutive rows of
	// one batch, starting at a row's first column.
	ErrPieces = errors.New("pack: pieces do not fill the batch's rows")
)
