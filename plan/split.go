package plan

import (
	"math"
	"slices"
)

// The rank split.
//
// The ranks of a run cut what the epoch has left into World contiguous parts of a
// sequence T of the epoch's samples. T holds the windows in the order's sequence,
// but within a window it holds the window's samples in their place in the data (its
// items, the lanes' parts interleaved in proportion to their lengths), not in
// their shuffled positions. A rank yields its part window by window, and within a
// window its samples in the order's positions. So two ranks that share a window
// each take a run of every lane's part of it: each reads only its own samples, with
// one request a lane, instead of a random share of the window's samples that it
// could only read as many requests or by reading the other rank's samples too.
// Within a window a rank's samples are as shuffled as before (their positions are
// the window's permutation's); the ranks of one job together yield every sample of
// the order once, but for the samples of the windows they share not in the
// order's sequence.
//
// A mixed epoch (Mix) of stratified or per-stream batching is split by positions
// (T is the order itself), so that its batches keep their shares; one of random
// batching is split by items, its windows' pieces (a stream's lane each) interleaved
// as a single dataset's lanes are, so a rank's share of a window holds each
// stream's share.
//
// What a run leaves of a rank's part is its part less the first Consumed samples it
// yielded: whole windows, and in one window the samples at positions from some
// position on. It is held as segs: runs of T, of which those in one window may be
// bounded to a range of the window's positions.

// seg is the elements [s, e) of T whose positions in their window lie in [from,
// to); a bounded seg (from > 0 or to < noBound) lies within one window.
type seg struct {
	s, e     int64
	from, to int32
}

const noBound = math.MaxInt32

func (g seg) bounded() bool { return g.from > 0 || g.to < noBound }

// layout is one window's elements in T's order: their positions and items.
type layout struct {
	j          int64
	start, end int64
	pos, item  []int32
}

// splitter answers questions about T for one epoch's sequence.
type splitter struct {
	o       sequence
	byItems bool // T orders a window's samples by item; else by position (T is the order)
	lays    []*layout
	pcs     []piece
}

// maxLayouts is the number of windows' layouts a splitter keeps.
const maxLayouts = 4

// layout returns window j's layout.
func (sp *splitter) layout(j int64) *layout {
	for _, l := range sp.lays {
		if l.j == j {
			return l
		}
	}
	start, end := sp.o.bounds(j)
	size := int(end - start)
	l := &layout{j: j, start: start, end: end, pos: make([]int32, size), item: make([]int32, size)}
	perm := sp.o.Perm(j, size)
	if !sp.byItems {
		for k := range size {
			l.pos[k], l.item[k] = int32(k), int32(k)
			if perm != nil {
				l.item[k] = perm[k]
			}
		}
	} else {
		inv := make([]int32, size)
		for p := range inv {
			inv[p] = int32(p)
		}
		for p, q := range perm {
			inv[q] = int32(p)
		}
		// The pieces (a lane's part each) interleaved: the next item is the next of
		// the piece whose next item has the least (2i+1)/(2n), the first piece on a
		// tie, so that any run of T holds about the same share of every piece.
		sp.pcs = sp.o.pieces(j, sp.pcs[:0])
		off := make([]int64, len(sp.pcs))
		next := make([]int64, len(sp.pcs))
		var at int64
		for i, pc := range sp.pcs {
			off[i] = at
			at += pc.n
		}
		for k := range size {
			best := -1
			for i, pc := range sp.pcs {
				if next[i] < pc.n && (best < 0 || (2*next[i]+1)*sp.pcs[best].n < (2*next[best]+1)*pc.n) {
					best = i
				}
			}
			q := off[best] + next[best]
			next[best]++
			l.item[k], l.pos[k] = int32(q), inv[q]
		}
	}
	if len(sp.lays) == maxLayouts {
		sp.lays = slices.Delete(sp.lays, 0, 1)
	}
	sp.lays = append(sp.lays, l)
	return l
}

// count returns the elements of g.
func (sp *splitter) count(g seg) int64 {
	if g.s >= g.e {
		return 0
	}
	if !g.bounded() {
		return g.e - g.s
	}
	l := sp.layout(sp.windowOf(g.s))
	var n int64
	for _, p := range l.pos[g.s-l.start : g.e-l.start] {
		if p >= g.from && p < g.to {
			n++
		}
	}
	return n
}

// windowOf returns the window holding T index t (T's windows are the order's).
func (sp *splitter) windowOf(t int64) int64 {
	j, _, _ := sp.o.window(t)
	return j
}

// cut returns g's first n elements (n at most count(g)) and the rest.
func (sp *splitter) cut(g seg, n int64) (seg, seg) {
	head, tail := g, g
	if !g.bounded() {
		head.e, tail.s = g.s+n, g.s+n
		return head, tail
	}
	l := sp.layout(sp.windowOf(g.s))
	x := g.s
	for ; n > 0 && x < g.e; x++ {
		if p := l.pos[x-l.start]; p >= g.from && p < g.to {
			n--
		}
	}
	head.e, tail.s = x, x
	return head, tail
}

// segsLen returns the elements of rs.
func (sp *splitter) segsLen(rs []seg) int64 {
	var n int64
	for _, g := range rs {
		n += sp.count(g)
	}
	return n
}

// appendSeg appends g to rs, joined to the last seg when they are adjacent and
// unbounded; empty segs are left out.
func (sp *splitter) appendSeg(rs []seg, g seg) []seg {
	if g.s >= g.e || g.bounded() && sp.count(g) == 0 {
		return rs
	}
	if n := len(rs); n > 0 && !g.bounded() && !rs[n-1].bounded() && rs[n-1].e == g.s {
		rs[n-1].e = g.e
		return rs
	}
	return append(rs, g)
}

// sub returns elements [from, to) of the sequence rs.
func (sp *splitter) sub(rs []seg, from, to int64) []seg {
	var out []seg
	var at int64
	for _, g := range rs {
		if at >= to {
			break
		}
		n := sp.count(g)
		a, b := max(from-at, 0), min(to-at, n)
		at += n
		if a >= b {
			continue
		}
		h := g
		if a > 0 {
			_, h = sp.cut(h, a)
		}
		if b-a < sp.count(h) {
			h, _ = sp.cut(h, b-a)
		}
		out = sp.appendSeg(out, h)
	}
	return out
}

// inWindow splits part (in T's order) at its first window's end: the segs of that
// window, clipped to it, appended to in, and the rest. It returns the window's number
// and bounds. It may move the start of part's first seg.
func (sp *splitter) inWindow(part []seg, in []seg) (j, start, end int64, _, rest []seg) {
	j, start, end = sp.o.window(part[0].s)
	for len(part) > 0 && part[0].s < end {
		g := part[0]
		if g.e <= end {
			in = append(in, g)
			part = part[1:]
			continue
		}
		g.e = end
		in = append(in, g)
		part[0].s = end
	}
	return j, start, end, in, part
}

// positions returns the positions (in their window) of the elements of segs in
// one window, in increasing order.
func (sp *splitter) positions(in []seg) []int32 {
	l := sp.layout(sp.windowOf(in[0].s))
	var ps []int32
	for _, g := range in {
		for _, p := range l.pos[g.s-l.start : g.e-l.start] {
			if p >= g.from && p < g.to {
				ps = append(ps, p)
			}
		}
	}
	slices.Sort(ps)
	return ps
}

// yieldCut splits part (a rank's, in T's order) into the first c samples the rank
// yields of it (window by window, in each its samples in position order) and the
// rest.
func (sp *splitter) yieldCut(part []seg, c int64) (head, tail []seg) {
	if !sp.byItems {
		// T is the order: the rank yields its samples in T's order.
		return sp.sub(part, 0, c), sp.sub(part, c, sp.segsLen(part))
	}
	var in []seg
	part = slices.Clone(part)
	for c > 0 && len(part) > 0 {
		_, _, _, in, part = sp.inWindow(part, in[:0])
		n := sp.segsLen(in)
		if n <= c {
			for _, g := range in {
				head = sp.appendSeg(head, g)
			}
			c -= n
			continue
		}
		// The window's c lowest positions go first.
		thr := sp.positions(in)[c]
		for _, g := range in {
			h, t := g, g
			h.to, t.from = min(g.to, thr), max(g.from, thr)
			head, tail = sp.appendSeg(head, h), sp.appendSeg(tail, t)
		}
		c = 0
	}
	for _, g := range part {
		tail = sp.appendSeg(tail, g)
	}
	return head, tail
}

// remaining returns what runs left of an epoch of total samples, in T's order (see
// Remaining): each run's World ranks took contiguous parts of what the runs before
// it left, per samples each (a multiple of align), and consumed the first Consumed
// samples they yield of them.
func (sp *splitter) remaining(total int64, runs []Run, align int64) ([]seg, error) {
	var rs []seg
	if total > 0 {
		rs = []seg{{0, total, 0, noBound}}
	}
	for i, run := range runs {
		if err := checkRun(i, run); err != nil {
			return nil, err
		}
		n := sp.segsLen(rs)
		per := n / int64(run.World) / align * align
		if run.Consumed < 0 || run.Consumed > per {
			return nil, errConsumed(i, run, per)
		}
		if per == 0 {
			continue // every sample goes to no rank: what is left stays as it was
		}
		var next []seg
		for r := range int64(run.World) {
			_, left := sp.yieldCut(sp.sub(rs, r*per, (r+1)*per), run.Consumed)
			for _, g := range left {
				next = sp.appendSeg(next, g)
			}
		}
		for _, g := range sp.sub(rs, int64(run.World)*per, n) {
			next = sp.appendSeg(next, g)
		}
		rs = next
	}
	return rs, nil
}

// positionRanges returns the positions of segs of a split by positions.
func (sp *splitter) positionRanges(part []seg) []Range {
	var out []Range
	for _, g := range part {
		r := Range{g.s, g.e}
		if g.bounded() {
			start, _ := sp.o.bounds(sp.windowOf(g.s))
			r = Range{max(g.s, start+int64(g.from)), min(g.e, start+int64(g.to))}
		}
		if r.Start >= r.End {
			continue
		}
		if n := len(out); n > 0 && out[n-1].End == r.Start {
			out[n-1].End = r.End
			continue
		}
		out = append(out, r)
	}
	return out
}

// items returns the items of segs in one window that ends at end, in increasing
// order, and whether they hold the window's last element of T.
func (sp *splitter) items(in []seg, end int64) ([]int32, bool) {
	l := sp.layout(sp.windowOf(in[0].s))
	var qs []int32
	last := false
	for _, g := range in {
		for k := g.s; k < g.e; k++ {
			if p := l.pos[k-l.start]; p >= g.from && p < g.to {
				qs = append(qs, l.item[k-l.start])
				last = last || k == end-1
			}
		}
	}
	slices.Sort(qs)
	return qs, last
}
