package megatron

import (
	"fmt"
	"io"
	"math"
)

// Writer writes an .idx/.bin pair byte for byte as Megatron-LM's
// IndexedDatasetBuilder does (without sequence modes): each sequence's tokens go to
// the .bin as they are added, back to back from offset 0; Close writes the .idx.
// It holds 4 bytes per sequence and 8 per document until Close.
//
// A Writer is not safe for concurrent use. The first failure to write is sticky:
// every later call returns it.
type Writer struct {
	bin, idx io.Writer
	dt       DType
	lens     []int32
	docIdx   []int64 // document_indices so far, from its leading 0
	scratch  []byte
	one      [1][]int64 // AddDocument's one sequence
	err      error
}

// NewWriter returns a Writer of tokens of dtype dt, writing the .bin to bin and, at
// Close, the .idx to idx. dt must be an integer code (ErrDType, ErrFloatDType).
func NewWriter(bin, idx io.Writer, dt DType) (*Writer, error) {
	if err := tokenDType(dt); err != nil {
		return nil, err
	}
	return &Writer{bin: bin, idx: idx, dt: dt, docIdx: []int64{0}}, nil
}

// AddDocument adds a document of one sequence holding tokens (possibly none), as
// Megatron-LM's add_item followed by end_document. Every token must fit the dtype
// (ErrTokenRange); on that error nothing is written and the Writer can go on.
func (w *Writer) AddDocument(tokens []int64) error {
	w.one[0] = tokens
	err := w.AddDocumentSequences(w.one[:])
	w.one[0] = nil
	return err
}

// AddDocumentSequences adds a document of len(seqs) sequences (possibly none), as
// Megatron-LM's add_item per sequence followed by end_document. Every token must fit
// the dtype (ErrTokenRange) and every sequence have at most 2^31-1 tokens
// (ErrTooLong); on those errors nothing is written and the Writer can go on.
func (w *Writer) AddDocumentSequences(seqs [][]int64) error {
	if w.err != nil {
		return w.err
	}
	lo, hi := w.dt.bounds()
	doc := len(w.docIdx) - 1
	for k, seq := range seqs {
		if len(seq) > math.MaxInt32 {
			return fmt.Errorf("%w: document %d, sequence %d of it: %d tokens", ErrTooLong, doc, k, len(seq))
		}
		for j, t := range seq {
			if t < lo || t > hi {
				return fmt.Errorf("%w: document %d, sequence %d of it, token %d: %d does not fit %s",
					ErrTokenRange, doc, k, j, t, w.dt)
			}
		}
	}
	for _, seq := range seqs {
		// Encode a bounded piece at a time, so that a long sequence does not
		// need a scratch buffer its size.
		for rest := seq; len(rest) > 0; {
			piece := rest[:min(len(rest), chunkSize/8)]
			rest = rest[len(piece):]
			w.scratch = appendEncoded(w.scratch[:0], piece, w.dt)
			if _, err := w.bin.Write(w.scratch); err != nil {
				w.err = fmt.Errorf("megatron: writing the .bin: %w", err)
				return w.err
			}
		}
		w.lens = append(w.lens, int32(len(seq)))
	}
	w.docIdx = append(w.docIdx, int64(len(w.lens)))
	return nil
}

// Close writes the .idx: the header, then sequence_lengths, sequence_pointers and
// document_indices. It closes neither writer. Calls after Close return ErrClosed.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	err := w.writeIndex()
	w.lens, w.docIdx, w.scratch = nil, nil, nil
	if err != nil {
		w.err = fmt.Errorf("megatron: writing the .idx: %w", err)
		return w.err
	}
	w.err = ErrClosed
	return nil
}

// writeIndex writes the .idx through a buffer of chunkSize bytes. The pointers are
// Megatron-LM's: each sequence starts where the previous one ends, the first at 0.
func (w *Writer) writeIndex() error {
	b := make([]byte, 0, chunkSize)
	b = append(b, Magic...)
	b = le.AppendUint64(b, version)
	b = append(b, byte(w.dt))
	b = le.AppendUint64(b, uint64(len(w.lens)))
	b = le.AppendUint64(b, uint64(len(w.docIdx)))
	// room makes room for 8 more bytes, writing out the buffer when it is full.
	room := func() error {
		if len(b)+8 <= cap(b) {
			return nil
		}
		_, err := w.idx.Write(b)
		b = b[:0]
		return err
	}
	for _, n := range w.lens {
		if err := room(); err != nil {
			return err
		}
		b = le.AppendUint32(b, uint32(n))
	}
	ptr, isz := int64(0), int64(w.dt.Size())
	for _, n := range w.lens {
		if err := room(); err != nil {
			return err
		}
		b = le.AppendUint64(b, uint64(ptr))
		ptr += int64(n) * isz
	}
	for _, d := range w.docIdx {
		if err := room(); err != nil {
			return err
		}
		b = le.AppendUint64(b, uint64(d))
	}
	_, err := w.idx.Write(b)
	return err
}
