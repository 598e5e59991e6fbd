package pack

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// corpus is a test epoch: documents of given lengths whose tokens are computed.
type corpus struct {
	lens []int64
}

// tok is the token at offset j of document i: distinct across documents and never
// an eos or pad id of the tests (those are below 10).
func tok(i int, j int64) int64 { return 10 + int64(i)*100_003 + j }

func (c *corpus) length(i int) int64 { return c.lens[i] }

// tokens is a Fill tokens function for the corpus that checks its arguments.
func (c *corpus) tokens(p Piece, dst []int64) error {
	if p.Doc < 0 || p.Doc >= len(c.lens) || p.From < 0 || p.From+int64(len(dst)) > c.lens[p.Doc] {
		return fmt.Errorf("tokens asked for %+v into %d", p, len(dst))
	}
	if len(dst) != p.DocTokens() {
		return fmt.Errorf("tokens for %+v given %d, want %d", p, len(dst), p.DocTokens())
	}
	for i := range dst {
		dst[i] = tok(p.Doc, p.From+int64(i))
	}
	return nil
}

// randomCorpus makes n documents of 0 to 3*seq tokens, some empty and some many rows
// long.
func randomCorpus(r *rand.Rand, n, seq int) *corpus {
	c := &corpus{lens: make([]int64, n)}
	for i := range c.lens {
		switch r.IntN(10) {
		case 0:
			c.lens[i] = 0
		case 1:
			c.lens[i] = int64(seq*(3+r.IntN(5)) + r.IntN(seq))
		default:
			c.lens[i] = int64(r.IntN(3*seq + 1))
		}
	}
	return c
}

// tokenRef is what the reference knows of one token of the stream.
type tokenRef struct {
	id  int64
	doc int   // -1 for pad
	off int64 // offset within the document; its length for its eos
	eos bool
}

// refRows is the reference: the stream built by hand, token by token, cut into rows,
// the last padded.
func refRows(spec Spec, c *corpus) [][]tokenRef {
	var stream []tokenRef
	for i, n := range c.lens {
		for j := int64(0); j < n; j++ {
			stream = append(stream, tokenRef{id: tok(i, j), doc: i, off: j})
		}
		if spec.HasEOS {
			stream = append(stream, tokenRef{id: spec.EOS, doc: i, off: n, eos: true})
		}
	}
	for len(stream)%spec.SeqLen != 0 {
		stream = append(stream, tokenRef{id: spec.Pad, doc: -1})
	}
	var rows [][]tokenRef
	for len(stream) > 0 {
		rows = append(rows, stream[:spec.SeqLen])
		stream = stream[spec.SeqLen:]
	}
	return rows
}

// padRow is an all-pad row.
func padRow(spec Spec) []tokenRef {
	row := make([]tokenRef, spec.SeqLen)
	for i := range row {
		row[i] = tokenRef{id: spec.Pad, doc: -1}
	}
	return row
}

// naiveSegments computes position_ids, cu_seqlens and max_seqlen of a flattened
// batch from the definition, token by token: a segment starts at each row's start, at
// each document's first token, and at pad that follows an eos.
func naiveSegments(flat []tokenRef, seq int) (pos []int64, cu []int32, maxSeq int32) {
	pos = make([]int64, len(flat))
	for i, t := range flat {
		start := i%seq == 0 ||
			(t.doc >= 0 && t.off == 0) ||
			(t.doc < 0 && flat[i-1].eos)
		if start {
			pos[i] = 0
		} else {
			pos[i] = pos[i-1] + 1
		}
	}
	for i, p := range pos {
		if p == 0 {
			cu = append(cu, int32(i))
		}
	}
	cu = append(cu, int32(len(flat)))
	for i := 1; i < len(cu); i++ {
		maxSeq = max(maxSeq, cu[i]-cu[i-1])
	}
	return pos, cu, maxSeq
}

// newBatch makes a Batch's buffers for f, int64 or int32 input_ids.
func newBatch(f *Filler, int32IDs bool) *Batch {
	b := &Batch{
		PositionIDs: make([]int64, f.Tokens()),
		CuSeqlens:   make([]int32, 0, f.MaxCuSeqlens()),
	}
	if int32IDs {
		b.InputIDs32 = make([]int32, f.Tokens())
	} else {
		b.InputIDs = make([]int64, f.Tokens())
	}
	return b
}

// checkBatch compares a filled batch with the reference rows it should hold.
func checkBatch(t testing.TB, spec Spec, b *Batch, want [][]tokenRef) {
	t.Helper()
	var flat []tokenRef
	for _, row := range want {
		flat = append(flat, row...)
	}
	for i, w := range flat {
		var got int64
		if b.InputIDs != nil {
			got = b.InputIDs[i]
		} else {
			got = int64(b.InputIDs32[i])
		}
		if got != w.id {
			t.Fatalf("token %d (row %d col %d) is %d, want %d (%+v)", i, i/spec.SeqLen, i%spec.SeqLen, got, w.id, w)
		}
	}
	pos, cu, maxSeq := naiveSegments(flat, spec.SeqLen)
	for i := range pos {
		if b.PositionIDs[i] != pos[i] {
			t.Fatalf("position_ids[%d] = %d, want %d\n got %v\nwant %v", i, b.PositionIDs[i], pos[i], b.PositionIDs, pos)
		}
	}
	if fmt.Sprint(b.CuSeqlens) != fmt.Sprint(cu) {
		t.Fatalf("cu_seqlens = %v, want %v", b.CuSeqlens, cu)
	}
	if b.MaxSeqlen != maxSeq {
		t.Fatalf("max_seqlen = %d, want %d", b.MaxSeqlen, maxSeq)
	}
}
