package megatron

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// HeaderSize is the size of an .idx header: the 9-byte magic, the uint64 version,
// the uint8 dtype code and the uint64 sequence and document counts.
const HeaderSize = 34

// Magic is the first 9 bytes of every .idx file.
const Magic = "MMIDIDX\x00\x00"

// version is the only .idx version Megatron-LM writes and reads.
const version = 1

// chunkSize is how much of the .idx Parse reads at a time. It is a multiple of 8, so
// that no array element straddles two reads.
const chunkSize = 64 << 10

var le = binary.LittleEndian

// Index is a parsed .idx file: where each sequence and document lies in the .bin.
// Parse has checked every field, so its methods cannot fail; they panic, as a slice
// does, when asked for a document or sequence out of range. An Index is immutable and
// safe for concurrent use.
//
// It keeps the arrays flat, never a value per document. A file as Megatron-LM writes
// it, its sequences back to back from the .bin's first byte, keeps only the sequence
// offsets: 8 bytes per sequence. A file with gaps between sequences keeps the lengths
// too, 4 bytes more per sequence. document_indices (8 bytes per document) is kept
// only when a document has other than one sequence (Megatron-LM's --split-sentences);
// the multimodal sequence modes add 1 byte per sequence. MemoryBytes reports the total.
type Index struct {
	dt     DType
	isz    int64 // dt.Size()
	seqs   int
	docs   int
	tokens int64
	end    int64 // the .bin offset just past the last sequence; 0 when there is none

	// ptr is sequence_pointers. When lens is nil, the sequences are back to back,
	// ptr holds seqs+1 offsets and sequence s is [ptr[s], ptr[s+1]).
	ptr  []int64
	lens []int32 // sequence_lengths, in tokens; nil when the sequences are back to back
	// docIdx is document_indices (docs+1 entries); nil when document i is sequence i.
	docIdx []int64
	modes  []int8 // sequence_modes; nil when the .idx has none
}

// Parse reads and checks an .idx file of idxSize bytes read through r. binSize is
// the size of the matching .bin, checked against every sequence's bytes; a negative
// binSize means unknown, and skips that check alone.
//
// Before it allocates anything in proportion to the counts, Parse checks the
// magic, the version (1), the dtype (an integer code), that the counts account for
// idxSize exactly (HeaderSize + 12 bytes per sequence + 8 per document_indices
// entry, plus 1 per sequence when the multimodal sequence_modes follow), with no
// arithmetic overflow whatever the counts, and that the file really is idxSize bytes
// long (its last byte is read). Then, reading the arrays in 64 KiB chunks: every
// length is >= 0, every pointer >= 0, every sequence ends within the .bin, each
// starts at or after the end of the one before (sorted, not overlapping; gaps
// allowed), document_indices starts at 0, never decreases and ends at the sequence
// count, and within a document every sequence starts where the previous one ends, so
// that each document is one byte range of the .bin (Megatron-LM writes every
// sequence back to back; a document with a gap inside is ErrGap). A document with no
// sequence is allowed: it has no tokens.
//
// Errors wrap one of the package's sentinels and name the sequence or document and
// the byte offset in the .idx where the bad value lies.
func Parse(r io.ReaderAt, idxSize, binSize int64) (*Index, error) {
	if idxSize < 0 {
		return nil, fmt.Errorf("%w: negative size %d", ErrTruncated, idxSize)
	}
	var h [HeaderSize]byte
	n := min(idxSize, HeaderSize)
	if err := readAt(r, h[:n], 0); err != nil {
		return nil, err
	}
	m := min(n, int64(len(Magic)))
	if string(h[:m]) != Magic[:m] {
		return nil, fmt.Errorf("%w: %q at byte 0, want %q", ErrBadMagic, h[:m], Magic)
	}
	if n < HeaderSize {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrTruncated, idxSize, HeaderSize)
	}
	if v := le.Uint64(h[9:]); v != version {
		return nil, fmt.Errorf("%w: version %d at byte 9, want %d", ErrVersion, v, version)
	}
	dt := DType(h[17])
	if err := tokenDType(dt); err != nil {
		return nil, fmt.Errorf("%w, at byte 17", err)
	}
	seqCount, docCount := le.Uint64(h[18:]), le.Uint64(h[26:])

	// Every product below is checked against what is left of the file before it is
	// formed, so hostile counts cannot overflow into a size that seems to fit.
	rest := uint64(idxSize - HeaderSize)
	if seqCount > rest/12 {
		return nil, fmt.Errorf("%w: sequence count %d (byte 18) needs 12 bytes each, the index has %d bytes after its header",
			ErrSize, seqCount, rest)
	}
	rest -= 12 * seqCount
	if docCount > rest/8 {
		return nil, fmt.Errorf("%w: document count %d (byte 26) needs 8 bytes each, %d bytes follow the sequences' arrays",
			ErrSize, docCount, rest)
	}
	rest -= 8 * docCount
	hasModes := false
	switch rest {
	case 0:
	case seqCount:
		hasModes = true
	default:
		return nil, fmt.Errorf("%w: %d bytes follow document_indices, want 0 or %d (one sequence mode per sequence)",
			ErrSize, rest, seqCount)
	}
	if docCount == 0 {
		return nil, fmt.Errorf("%w: document count 0 (byte 26), document_indices holds at least its leading 0", ErrDocIndices)
	}
	if seqCount >= math.MaxInt || docCount > math.MaxInt {
		return nil, fmt.Errorf("%w: %d sequences, %d documents are too many for this platform", ErrSize, seqCount, docCount)
	}
	if idxSize > HeaderSize {
		// The size was the caller's word; the file must bear it out before
		// anything is allocated in proportion to it.
		if err := readAt(r, h[:1], idxSize-1); err != nil {
			return nil, err
		}
	}

	x := &Index{
		dt:   dt,
		isz:  int64(dt.Size()),
		seqs: int(seqCount),
		docs: int(docCount) - 1,
	}
	p := parser{r: r, buf: make([]byte, min(chunkSize, idxSize-HeaderSize))}
	lensAt := int64(HeaderSize)
	ptrAt := lensAt + 4*int64(seqCount)
	docAt := ptrAt + 8*int64(seqCount)
	modesAt := docAt + 8*int64(docCount)
	if err := p.pointers(x, ptrAt); err != nil {
		return nil, err
	}
	if err := p.lengths(x, lensAt, binSize); err != nil {
		return nil, err
	}
	if err := p.documents(x, docAt); err != nil {
		return nil, err
	}
	if hasModes {
		x.modes = make([]int8, x.seqs)
		err := p.each(modesAt, int64(x.seqs), func(b []byte, at int64) error {
			i := int(at - modesAt)
			for j, v := range b {
				x.modes[i+j] = int8(v)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return x, nil
}

// ParseBytes is Parse of an .idx held in memory.
func ParseBytes(idx []byte, binSize int64) (*Index, error) {
	return Parse(bytes.NewReader(idx), int64(len(idx)), binSize)
}

// parser reads the .idx arrays a chunk at a time.
type parser struct {
	r   io.ReaderAt
	buf []byte
}

// each reads the size bytes at off a chunk at a time and hands each chunk to fn
// with its offset in the file.
func (p *parser) each(off, size int64, fn func(b []byte, at int64) error) error {
	for size > 0 {
		b := p.buf[:min(int64(len(p.buf)), size)]
		if err := readAt(p.r, b, off); err != nil {
			return err
		}
		if err := fn(b, off); err != nil {
			return err
		}
		off += int64(len(b))
		size -= int64(len(b))
	}
	return nil
}

// pointers reads sequence_pointers into x.ptr, with room for one more entry, and
// checks that none is negative.
func (p *parser) pointers(x *Index, at0 int64) error {
	x.ptr = make([]int64, x.seqs, x.seqs+1)
	return p.each(at0, 8*int64(x.seqs), func(b []byte, at int64) error {
		s0 := int((at - at0) / 8)
		for j := range len(b) / 8 {
			v := int64(le.Uint64(b[8*j:]))
			if v < 0 {
				return fmt.Errorf("%w: sequence %d (pointer at byte %d) has negative pointer %d",
					ErrPointer, s0+j, at+8*int64(j), v)
			}
			x.ptr[s0+j] = v
		}
		return nil
	})
}

// lengths reads sequence_lengths, checks each sequence against the .bin and the one
// before, and sums the tokens. It keeps the lengths only if some sequence does not
// start where the previous one ends; otherwise it appends the last sequence's end to
// x.ptr and lets the offsets stand for the lengths.
func (p *parser) lengths(x *Index, at0, binSize int64) error {
	limit := binSize
	if limit < 0 {
		limit = math.MaxInt64
	}
	ptrAt := at0 + 4*int64(x.seqs)
	var end, total int64
	err := p.each(at0, 4*int64(x.seqs), func(b []byte, at int64) error {
		s0 := int((at - at0) / 4)
		for j := range len(b) / 4 {
			s := s0 + j
			n := int32(le.Uint32(b[4*j:]))
			if n < 0 {
				return fmt.Errorf("%w: sequence %d (length at byte %d) has length %d", ErrLength, s, at+4*int64(j), n)
			}
			ptr, nb := x.ptr[s], int64(n)*x.isz
			if ptr > limit-nb {
				past := fmt.Sprintf("the .bin's %d bytes", binSize)
				if binSize < 0 {
					past = "the largest file offset"
				}
				return fmt.Errorf("%w: sequence %d (pointer at byte %d) is %d bytes at .bin offset %d, past %s",
					ErrPointer, s, ptrAt+8*int64(s), nb, ptr, past)
			}
			if s > 0 && ptr < end {
				return fmt.Errorf("%w: sequence %d (pointer at byte %d) starts at .bin offset %d, before sequence %d ends at %d",
					ErrOverlap, s, ptrAt+8*int64(s), ptr, s-1, end)
			}
			end = ptr + nb
			total += nb
			if x.lens == nil && s+1 < x.seqs && x.ptr[s+1] != end {
				// A gap follows: the offsets no longer give the lengths.
				x.lens = make([]int32, x.seqs)
				for k := range s {
					x.lens[k] = int32((x.ptr[k+1] - x.ptr[k]) / x.isz)
				}
			}
			if x.lens != nil {
				x.lens[s] = n
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if x.lens == nil {
		x.ptr = append(x.ptr, end)
	}
	x.end = end
	x.tokens = total / x.isz
	return nil
}

// documents reads document_indices and checks it, and that every document's
// sequences are back to back. It keeps the array only if some document is other
// than the sequence of its own number.
func (p *parser) documents(x *Index, at0 int64) error {
	count := x.docs + 1
	seqs := uint64(x.seqs)
	var prev int64
	err := p.each(at0, 8*int64(count), func(b []byte, at int64) error {
		i0 := int((at - at0) / 8)
		for j := range len(b) / 8 {
			i, u, where := i0+j, le.Uint64(b[8*j:]), at+8*int64(j)
			switch {
			case i == 0 && u != 0:
				return fmt.Errorf("%w: document_indices[0] (byte %d) is %d, want 0", ErrDocIndices, where, int64(u))
			case int64(u) < 0:
				return fmt.Errorf("%w: document_indices[%d] (byte %d) is %d, negative", ErrDocIndices, i, where, int64(u))
			case u > seqs:
				return fmt.Errorf("%w: document_indices[%d] (byte %d) is %d, past the sequence count %d",
					ErrDocIndices, i, where, int64(u), seqs)
			case int64(u) < prev:
				return fmt.Errorf("%w: document_indices[%d] (byte %d) is %d, below document_indices[%d] = %d: document %d ends before it starts",
					ErrDocIndices, i, where, u, i-1, prev, i-1)
			case i == count-1 && u != seqs:
				return fmt.Errorf("%w: document_indices[%d] (byte %d), the last, is %d, want the sequence count %d",
					ErrDocIndices, i, where, u, seqs)
			}
			v := int64(u)
			if x.docIdx == nil && v != int64(i) {
				x.docIdx = make([]int64, count)
				for k := range i {
					x.docIdx[k] = int64(k)
				}
			}
			if x.docIdx != nil {
				x.docIdx[i] = v
			}
			if x.lens != nil {
				// Some sequences have gaps between them: none may lie inside a document.
				for s := int(prev) + 1; s < int(v); s++ {
					if e := x.seqEnd(s - 1); x.ptr[s] != e {
						return fmt.Errorf("%w: document %d (document_indices[%d] at byte %d): sequence %d starts at .bin offset %d, sequence %d ends at %d",
							ErrGap, i-1, i, where, s, x.ptr[s], s-1, e)
					}
				}
			}
			prev = v
		}
		return nil
	})
	if err != nil {
		return err
	}
	// A document_indices never kept is 0, 1, ..., seqs: one sequence per document.
	return nil
}

// readAt fills b from r at off, or says why not.
func readAt(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %d bytes at byte %d, the file ends after %d", ErrTruncated, len(b), off, off+int64(n))
	}
	return fmt.Errorf("megatron: reading %d bytes of the index at byte %d: %w", len(b), off, err)
}

// DType is the type of every token in the .bin.
func (x *Index) DType() DType { return x.dt }

// Docs is the number of documents: the length of document_indices less one.
func (x *Index) Docs() int { return x.docs }

// Sequences is the number of sequences.
func (x *Index) Sequences() int { return x.seqs }

// Tokens is the number of tokens of all sequences (and so of all documents).
func (x *Index) Tokens() int64 { return x.tokens }

// BinEnd is the .bin offset just past the last sequence, 0 when there is none: the
// .bin size Megatron-LM's writer gives. A larger .bin has bytes no sequence uses.
func (x *Index) BinEnd() int64 { return x.end }

// HasModes reports whether the .idx holds the multimodal sequence_modes array.
func (x *Index) HasModes() bool { return x.modes != nil }

// MemoryBytes is the size of the arrays the Index holds (see Index).
func (x *Index) MemoryBytes() int64 {
	return 8*int64(cap(x.ptr)) + 4*int64(cap(x.lens)) + 8*int64(cap(x.docIdx)) + int64(cap(x.modes))
}

// DocSequences returns the sequences of document i, [first, end): end-first of them,
// possibly none.
func (x *Index) DocSequences(i int) (first, end int) {
	if uint(i) >= uint(x.docs) {
		panic(fmt.Sprintf("megatron: document %d out of range [0, %d)", i, x.docs))
	}
	if x.docIdx == nil {
		return i, i + 1
	}
	return int(x.docIdx[i]), int(x.docIdx[i+1])
}

// DocRange returns the byte range of document i in the .bin: n bytes at off. A
// document with no sequence has n == 0 and off where its next sequence would start.
func (x *Index) DocRange(i int) (off, n int64) {
	a, b := x.DocSequences(i)
	if a == b {
		if a < x.seqs {
			return x.ptr[a], 0
		}
		return x.end, 0
	}
	off = x.ptr[a]
	return off, x.seqEnd(b-1) - off
}

// DocTokens is the number of tokens of document i, the sum of its sequences'
// lengths, in constant time.
func (x *Index) DocTokens(i int) int64 {
	_, n := x.DocRange(i)
	return n / x.isz
}

// AppendDocTokens appends every document's token count, DocTokens(0) to
// DocTokens(Docs()-1), to dst and returns the extended slice.
func (x *Index) AppendDocTokens(dst []int64) []int64 {
	if x.docIdx == nil && x.lens == nil {
		for i := range x.docs {
			dst = append(dst, (x.ptr[i+1]-x.ptr[i])/x.isz)
		}
		return dst
	}
	for i := range x.docs {
		dst = append(dst, x.DocTokens(i))
	}
	return dst
}

// SequenceRange returns the byte range of sequence s in the .bin: n bytes at off.
func (x *Index) SequenceRange(s int) (off, n int64) {
	if uint(s) >= uint(x.seqs) {
		panic(fmt.Sprintf("megatron: sequence %d out of range [0, %d)", s, x.seqs))
	}
	return x.ptr[s], x.seqEnd(s) - x.ptr[s]
}

// SequenceTokens is the number of tokens of sequence s: its sequence_lengths entry.
func (x *Index) SequenceTokens(s int) int64 {
	_, n := x.SequenceRange(s)
	return n / x.isz
}

// SequenceMode is the multimodal mode of sequence s, or 0 when the .idx has no
// sequence_modes (Megatron-LM's default mode).
func (x *Index) SequenceMode(s int) int8 {
	if uint(s) >= uint(x.seqs) {
		panic(fmt.Sprintf("megatron: sequence %d out of range [0, %d)", s, x.seqs))
	}
	if x.modes == nil {
		return 0
	}
	return x.modes[s]
}

// seqEnd is the .bin offset just past sequence s.
func (x *Index) seqEnd(s int) int64 {
	if x.lens == nil {
		return x.ptr[s+1]
	}
	return x.ptr[s] + int64(x.lens[s])*x.isz
}
