package pack

import (
	"fmt"
	"math"
)

// Batch is one rank's batch of BatchSize rows of SeqLen tokens, row-major, in the
// caller's buffers. Exactly one of InputIDs and InputIDs32 is set; PositionIDs and
// CuSeqlens may be nil when not wanted.
type Batch struct {
	// InputIDs receives the tokens, BatchSize*SeqLen of them, as int64.
	InputIDs []int64
	// InputIDs32 receives the tokens as int32, when InputIDs is nil; Fill fails
	// with ErrIDRange on an id that does not fit.
	InputIDs32 []int32
	// PositionIDs receives each token's position in its segment, BatchSize*SeqLen.
	PositionIDs []int64
	// CuSeqlens receives the segments' starts over the flattened batch, then
	// BatchSize*SeqLen. Its capacity must be at least MaxCuSeqlens; Fill sets its
	// length, which varies from batch to batch.
	CuSeqlens []int32
	// MaxSeqlen is set by Fill to the longest segment's length.
	MaxSeqlen int32
}

// Filler fills batches of one spec and batch size. It holds a row's worth of
// scratch for int32 output, so one Filler serves one goroutine at a time.
type Filler struct {
	spec    Spec
	rows    int
	n       int   // tokens in a batch
	err32   error // why int32 output cannot hold eos or pad, if it cannot
	scratch []int64
}

// NewFiller makes a Filler of batches of batchSize rows of spec.SeqLen tokens. It
// fails when the spec is not valid, or with ErrBatchSize when batchSize is below 1
// or batchSize*SeqLen+1 does not fit the int32 of cu_seqlens.
func NewFiller(spec Spec, batchSize int) (*Filler, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	if batchSize < 1 || int64(batchSize) > (math.MaxInt32-1)/int64(spec.SeqLen) {
		return nil, fmt.Errorf("%w: %d rows of %d tokens (want at least 1, and at most %d tokens a batch)", ErrBatchSize, batchSize, spec.SeqLen, math.MaxInt32-1)
	}
	return &Filler{
		spec:  spec,
		rows:  batchSize,
		n:     batchSize * spec.SeqLen,
		err32: spec.Check(math.MaxInt32),
	}, nil
}

// BatchSize is the number of rows in a batch.
func (f *Filler) BatchSize() int { return f.rows }

// Tokens is the number of tokens in a batch, BatchSize*SeqLen: the length of
// InputIDs and PositionIDs.
func (f *Filler) Tokens() int { return f.n }

// MaxCuSeqlens is the most entries cu_seqlens can have, BatchSize*SeqLen+1 (every
// token a segment), the capacity Batch.CuSeqlens needs.
func (f *Filler) MaxCuSeqlens() int { return f.n + 1 }

// Fill writes a batch from its pieces: those Layout.Pieces gives for the rank's rows
// (Deal.RowsOf), then all-pad rows up to BatchSize. The pieces must fill whole
// consecutive rows from the first column of the first piece's row, as Pieces gives
// them; no pieces means a batch of pad. tokens is called for each piece holding
// document tokens (DocTokens > 0) to write the tokens From to From+len(dst) of
// document p.Doc into dst, whose length is p.DocTokens(); Fill writes eos and pad
// itself. It allocates nothing, but for a row of scratch on the first batch it writes
// as int32.
//
// A segment starts at the first column of every row, at every document's first token
// (its eos when the document is empty) and at the pad after the last document when
// that pad follows an eos. Pad that follows a document without eos continues its
// segment, unless a row starts there. position_ids count from 0 at each segment's
// start, pad included; cu_seqlens are the indices of the flattened batch where
// position_ids are 0, then BatchSize*SeqLen; MaxSeqlen is the longest segment.
func (f *Filler) Fill(b *Batch, pieces []Piece, tokens func(p Piece, dst []int64) error) error {
	return f.FillWith(b, pieces, tokens, nil)
}

// FillWith is Fill that writes int32 input_ids through tokens32 where it can: called
// as tokens is, into the int32 ids, it returns true when it wrote them (ids whose
// every value fits), false to have Fill widen them with tokens and check each id.
// tokens32 may be nil.
func (f *Filler) FillWith(b *Batch, pieces []Piece, tokens func(p Piece, dst []int64) error, tokens32 func(p Piece, dst []int32) (bool, error)) error {
	n, s := f.n, f.spec.SeqLen
	ids64, ids32 := b.InputIDs, b.InputIDs32
	switch {
	case (ids64 == nil) == (ids32 == nil):
		return fmt.Errorf("%w: set one of InputIDs and InputIDs32", ErrBuffers)
	case ids64 != nil && len(ids64) < n, ids32 != nil && len(ids32) < n:
		return fmt.Errorf("%w: input_ids shorter than %d tokens", ErrBuffers, n)
	case b.PositionIDs != nil && len(b.PositionIDs) < n:
		return fmt.Errorf("%w: position_ids shorter than %d tokens", ErrBuffers, n)
	case b.CuSeqlens != nil && cap(b.CuSeqlens) < n+1:
		return fmt.Errorf("%w: cu_seqlens capacity below %d", ErrBuffers, n+1)
	case ids32 != nil && f.err32 != nil:
		return f.err32
	}
	if ids32 != nil && f.scratch == nil {
		f.scratch = make([]int64, s)
	}
	w := writer{b: b, cu: b.CuSeqlens[:0]}
	var base int64
	if len(pieces) > 0 {
		base = pieces[0].Row
	}
	idx := 0
	prevEOS := false
	for _, p := range pieces {
		l := int(p.To - p.From)
		if p.Row != base+int64(idx/s) || p.Col != idx%s || p.To <= p.From || p.To-p.From > int64(s-p.Col) || idx+l > n || (p.EOS && !f.spec.HasEOS) || (p.Doc < 0 && p.EOS) {
			return fmt.Errorf("%w: piece %+v at column %d of row %d", ErrPieces, p, idx%s, base+int64(idx/s))
		}
		if p.Col == 0 || (p.Doc >= 0 && p.From == 0) || (p.Doc < 0 && prevEOS) {
			w.start(idx)
		}
		if p.Doc >= 0 {
			k := p.DocTokens()
			if k > 0 {
				if ids64 != nil {
					if err := tokens(p, ids64[idx:idx+k]); err != nil {
						return fmt.Errorf("pack: tokens %d to %d of document %d: %w", p.From, p.From+int64(k), p.Doc, err)
					}
				} else if ok, err := narrow(tokens32, p, ids32[idx:idx+k]); err != nil {
					return fmt.Errorf("pack: tokens %d to %d of document %d: %w", p.From, p.From+int64(k), p.Doc, err)
				} else if !ok {
					buf := f.scratch[:k]
					if err := tokens(p, buf); err != nil {
						return fmt.Errorf("pack: tokens %d to %d of document %d: %w", p.From, p.From+int64(k), p.Doc, err)
					}
					out := ids32[idx : idx+k]
					for i, v := range buf {
						if v < math.MinInt32 || v > math.MaxInt32 {
							return fmt.Errorf("%w: document %d has token id %d at offset %d, which int32 input_ids cannot hold", ErrIDRange, p.Doc, v, p.From+int64(i))
						}
						out[i] = int32(v)
					}
				}
			}
			if p.EOS {
				w.ids(ids64, ids32, idx+k, idx+k+1, f.spec.EOS)
			}
		} else {
			w.ids(ids64, ids32, idx, idx+l, f.spec.Pad)
		}
		w.positions(idx, idx+l)
		idx += l
		prevEOS = p.EOS
	}
	if idx%s != 0 {
		return fmt.Errorf("%w: they end at column %d of row %d", ErrPieces, idx%s, base+int64(idx/s))
	}
	for ; idx < n; idx += s {
		w.start(idx)
		w.ids(ids64, ids32, idx, idx+s, f.spec.Pad)
		w.positions(idx, idx+s)
	}
	w.start(n)
	if b.CuSeqlens != nil {
		b.CuSeqlens = w.cu
	}
	b.MaxSeqlen = int32(w.maxSeg)
	return nil
}

// writer keeps the segment a Fill is in.
type writer struct {
	b        *Batch
	cu       []int32
	segStart int   // index of the current segment's first token
	pos      int64 // position of the next token in its segment
	maxSeg   int
}

// start starts a segment at index i (or ends the batch, at its length).
func (w *writer) start(i int) {
	w.maxSeg = max(w.maxSeg, i-w.segStart)
	w.segStart, w.pos = i, 0
	if w.b.CuSeqlens != nil {
		w.cu = append(w.cu, int32(i))
	}
}

// positions writes the position ids of indices [from, to), continuing the segment.
func (w *writer) positions(from, to int) {
	if p := w.b.PositionIDs; p != nil {
		// Eight at a time, without bounds checks (as megatron's decode).
		pos, p := w.pos, p[from:to]
		for len(p) >= 8 {
			q := p[:8:8]
			q[0], q[1], q[2], q[3] = pos, pos+1, pos+2, pos+3
			q[4], q[5], q[6], q[7] = pos+4, pos+5, pos+6, pos+7
			p, pos = p[8:], pos+8
		}
		for i := range p {
			p[i] = pos + int64(i)
		}
	}
	w.pos += int64(to - from)
}

// ids writes id at indices [from, to) of whichever input_ids is set.
func (w *writer) ids(ids64 []int64, ids32 []int32, from, to int, id int64) {
	if ids64 != nil {
		for i := from; i < to; i++ {
			ids64[i] = id
		}
		return
	}
	for i := from; i < to; i++ {
		ids32[i] = int32(id)
	}
}

// narrow calls tokens32, when there is one.
func narrow(tokens32 func(p Piece, dst []int32) (bool, error), p Piece, dst []int32) (bool, error) {
	if tokens32 == nil {
		return false, nil
	}
	return tokens32(p, dst)
}
