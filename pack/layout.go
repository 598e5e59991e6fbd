package pack

import (
	"fmt"
	"math"
	"sort"
)

// BlockDocs is the number of documents between two checkpoints of a Layout: it keeps
// 8 bytes per BlockDocs documents, and Locate and Pieces call the length function up
// to BlockDocs times to find where they start.
const BlockDocs = 1024

// Layout is an epoch's packed layout: which tokens of which documents fill which
// row. It is a function of the spec's SeqLen and eos and of the documents' lengths
// in epoch order alone, never of the world size. It keeps the cumulative token count
// every BlockDocs documents and asks the length function again for the documents in
// between, so that an epoch of 10^8 documents costs under 1 MB.
//
// A Layout is immutable; it is safe for concurrent use when its length function is.
type Layout struct {
	spec   Spec
	docs   int
	length func(i int) int64
	eos    int64   // tokens added after each document: 1 with eos, else 0
	k      int     // documents per checkpoint
	cum    []int64 // cum[j]: tokens before document j*k; the last is the total
	rows   int64
}

// NewLayout lays out an epoch of docs documents, where length(i) is the number of
// tokens of the epoch's i-th document, its eos not included (the layout adds one
// token per document when the spec has eos). length is called once per document
// here, and again later by Locate and Pieces: it must give the same value every
// time for the same i. It fails when the spec is not valid, docs is negative or
// length nil (ErrDocs), a document's length is negative (ErrNegativeLength) or the
// epoch's tokens, with the last row's pad, pass math.MaxInt64 (ErrOverflow).
func NewLayout(spec Spec, docs int, length func(i int) int64) (*Layout, error) {
	return newLayout(spec, docs, length, BlockDocs)
}

// newLayout is NewLayout with k documents per checkpoint, so that tests can make
// blocks small.
func newLayout(spec Spec, docs int, length func(i int) int64, k int) (*Layout, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	if docs < 0 {
		return nil, fmt.Errorf("%w: a layout of %d documents", ErrDocs, docs)
	}
	if docs > 0 && length == nil {
		return nil, fmt.Errorf("%w: a layout of %d documents without a length function", ErrDocs, docs)
	}
	l := &Layout{spec: spec, docs: docs, length: length, eos: spec.eosLen(), k: k}
	// The total must leave room for the last row's pad, so that Rows()*SeqLen fits.
	limit := math.MaxInt64 - int64(spec.SeqLen)
	l.cum = make([]int64, 0, (docs+k-1)/k+1)
	var total int64
	for i := 0; i < docs; i++ {
		if i%k == 0 {
			l.cum = append(l.cum, total)
		}
		n := length(i)
		if n < 0 {
			return nil, fmt.Errorf("%w: document %d has %d tokens", ErrNegativeLength, i, n)
		}
		if n > limit-l.eos-total {
			return nil, fmt.Errorf("%w: at document %d the epoch passes %d tokens", ErrOverflow, i, limit)
		}
		total += n + l.eos
	}
	l.cum = append(l.cum, total)
	l.rows = (total + int64(spec.SeqLen) - 1) / int64(spec.SeqLen)
	return l, nil
}

// Spec is the spec the layout was made with.
func (l *Layout) Spec() Spec { return l.spec }

// Docs is the number of documents in the epoch.
func (l *Layout) Docs() int { return l.docs }

// Tokens is the number of tokens in the epoch's stream: the documents' tokens and
// one eos per document when the spec has eos; the last row's pad not included.
func (l *Layout) Tokens() int64 { return l.cum[len(l.cum)-1] }

// Rows is the number of rows of the epoch: ceil(Tokens/SeqLen), 0 when the stream is
// empty (no documents, or only empty ones without eos).
func (l *Layout) Rows() int64 { return l.rows }

// Locate gives the document holding the token at offset token of the epoch's stream
// and the token's offset within it (where within == length(doc) is the document's
// eos). Documents without tokens (empty, no eos) hold none. For a token at or past
// Tokens(), in the last row's pad or beyond, it gives doc -1 and within =
// token-Tokens(). It calls length up to BlockDocs times. token must not be negative.
func (l *Layout) Locate(token int64) (doc int, within int64) {
	doc, within, _ = l.locate(token, nil)
	return doc, within
}

// locate is Locate that also gives the document's token count, eos included. With
// a Walk that lies at or before token and no further back than token's checkpoint,
// it walks on from the Walk's document instead of from the checkpoint.
func (l *Layout) locate(token int64, w *Walk) (doc int, within, n int64) {
	if token < 0 {
		panic(fmt.Sprintf("pack: Locate of token %d", token))
	}
	if token >= l.Tokens() {
		return -1, token - l.Tokens(), 0
	}
	// The last checkpoint at or before token; its block holds the token, since the
	// next checkpoint is past it.
	j := sort.Search(len(l.cum), func(j int) bool { return l.cum[j] > token }) - 1
	doc, t := j*l.k, l.cum[j]
	if w != nil && w.ok && w.start <= token && w.doc >= doc {
		doc, t = w.doc, w.start
	}
	first := doc
	for ; doc < l.docs; doc++ {
		n = l.docLen(doc)
		if token < t+n {
			return doc, token - t, n
		}
		t += n
	}
	panic(fmt.Sprintf("pack: the length function gives other lengths than it gave NewLayout (documents %d to %d)", first, l.docs-1))
}

// Walk is where the last Pieces call made with it ended, so that the next one, when
// it starts at or after that point, walks on from there instead of from its block's
// checkpoint: a rank's batches, asked for in order, then cost about one length call
// a document instead of up to BlockDocs a batch. The zero Walk is ready for use; a
// Walk belongs to one Layout.
type Walk struct {
	doc   int   // a document
	start int64 // the tokens before it
	ok    bool
}

// docLen is the number of tokens document i adds to the stream, eos included.
func (l *Layout) docLen(i int) int64 {
	n := l.length(i)
	if n < 0 {
		panic(fmt.Sprintf("pack: the length function gives document %d a length of %d, after %d tokens in all to NewLayout", i, n, l.Tokens()))
	}
	return n + l.eos
}

// Piece is a run of consecutive tokens of one document (or of pad) inside one row.
type Piece struct {
	// Doc is the document's index in epoch order; -1 for pad.
	Doc int
	// From and To are the piece's first token and the token past its last, as
	// offsets within the document, where offset length(Doc) is the document's eos.
	// For pad, From is 0 and To the number of pad tokens.
	From, To int64
	// Row is the row the piece lies in, counted from the epoch's first.
	Row int64
	// Col is the column in the row of the piece's first token.
	Col int
	// EOS says the piece's last token is the document's eos.
	EOS bool
}

// Len is the number of tokens the piece fills in its row, eos included.
func (p Piece) Len() int { return int(p.To - p.From) }

// DocTokens is the number of the document's own tokens in the piece: Len less its
// eos; 0 for pad.
func (p Piece) DocTokens() int {
	if p.Doc < 0 {
		return 0
	}
	if p.EOS {
		return p.Len() - 1
	}
	return p.Len()
}

// Pieces appends to dst the pieces that fill rows [rowFrom, rowTo) in order, and
// returns it. A document is cut where a row ends and continues at the start of the
// next; empty documents without eos give no piece; the tail of the last row, after
// the last document, is one pad piece (Doc -1). Rows are clamped to [0, Rows()]:
// rows past the epoch give no pieces (Fill pads them). It calls length up to
// BlockDocs times to find the first piece and once per document after it, and
// allocates only when dst is too short.
func (l *Layout) Pieces(rowFrom, rowTo int64, dst []Piece) []Piece {
	return l.WalkPieces(nil, rowFrom, rowTo, dst)
}

// WalkPieces is Pieces that starts walking from w when it can, and leaves w where it
// ended (w nil: Pieces).
func (l *Layout) WalkPieces(w *Walk, rowFrom, rowTo int64, dst []Piece) []Piece {
	rowFrom = max(rowFrom, 0)
	rowTo = min(rowTo, l.rows)
	if rowFrom >= rowTo {
		return dst
	}
	s := int64(l.spec.SeqLen)
	t, end := rowFrom*s, rowTo*s
	stream := min(end, l.Tokens())
	if t < stream {
		doc, within, n := l.locate(t, w)
		for {
			take := min(n-within, s-t%s, stream-t)
			dst = append(dst, Piece{
				Doc: doc, From: within, To: within + take,
				Row: t / s, Col: int(t % s),
				EOS: l.eos == 1 && within+take == n,
			})
			t += take
			within += take
			if t == stream {
				break
			}
			for within == n {
				if doc++; doc >= l.docs {
					panic("pack: the length function gives other lengths than it gave NewLayout")
				}
				within, n = 0, l.docLen(doc)
			}
		}
		if w != nil {
			*w = Walk{doc: doc, start: t - within, ok: true}
		}
	}
	if t < end {
		dst = append(dst, Piece{Doc: -1, From: 0, To: end - t, Row: t / s, Col: int(t % s)})
	}
	return dst
}
