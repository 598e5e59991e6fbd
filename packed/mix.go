package packed

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/shardload/shardload/plan"
)

// ErrMix means Config.Streams or EpochTokens cannot make an epoch.
var ErrMix = errors.New("packed: bad stream mix")

// positions maps a position of the epoch's order to its document: a part and the
// document's index in it.
type positions interface {
	at(n int64) (p, k int)
}

// streamTokens returns each stream's documents and tokens (eos included) over c's
// parts, where stream i is parts [c.from[s.First], c.from[s.First+s.Count]).
func (c *corpus) streamTokens(streams []plan.Stream, eos int64) (docs, tokens []int64) {
	docs, tokens = make([]int64, len(streams)), make([]int64, len(streams))
	for i, s := range streams {
		for p := c.from[s.First]; p < c.from[s.First+s.Count]; p++ {
			n := c.infos[p].Samples
			docs[i] += int64(n)
			for k := range n {
				tokens[i] += c.tokens(p, k) + eos
			}
		}
	}
	return docs, tokens
}

// mixOf returns the plan.Mix of cfg's streams over c's parts, each stream drawing a
// number of documents (plan.Stream.Choose) that gives it its share of the epoch's
// tokens at the stream's mean document length (eos included):
//
//   - a stream with a Weight gets that share (relative to the other weights) of
//     the tokens the epoch has beyond the streams with Repeat or Choose;
//   - Repeat r draws r times its documents (about r times its tokens), Choose c
//     draws c documents, none of them all its documents once;
//   - the epoch has EpochTokens tokens, or without it what the streams give: all of
//     a weighted stream's tokens once, what Repeat and Choose give of the others.
//     Without weights, EpochTokens scales every stream's draws alike.
//
// It also returns each part's stream.
func (c *corpus) mixOf(cfg *Config) (*plan.Mix, []int, error) {
	n := len(c.from) - 1
	streams := cfg.Streams
	if len(streams) == 0 {
		streams = []plan.Stream{{First: 0, Count: n, Weight: 1}}
	}
	var eos int64
	if cfg.Pack.HasEOS {
		eos = 1
	}
	partStream := make([]int, len(c.parts))
	for i := range partStream {
		partStream[i] = -1
	}
	for i, s := range streams {
		if s.First < 0 || s.Count < 1 || s.First+s.Count > n {
			return nil, nil, fmt.Errorf("%w: stream %d names URLs [%d, %d) of %d", ErrMix, i, s.First, s.First+s.Count, n)
		}
		for p := c.from[s.First]; p < c.from[s.First+s.Count]; p++ {
			if partStream[p] >= 0 {
				return nil, nil, fmt.Errorf("%w: streams %d and %d share a URL", ErrMix, partStream[p], i)
			}
			partStream[p] = i
		}
	}
	docs, tokens := c.streamTokens(streams, eos)
	want := make([]float64, len(streams)) // tokens per epoch
	var fixed, given, weights float64
	weighted := false
	for i, s := range streams {
		set := 0
		for _, v := range []bool{s.Weight != 0, s.Repeat != 0, s.Choose != 0} {
			if v {
				set++
			}
		}
		switch {
		case docs[i] == 0 || tokens[i] == 0:
			return nil, nil, fmt.Errorf("%w: stream %d has no tokens", ErrMix, i)
		case set > 1:
			return nil, nil, fmt.Errorf("%w: stream %d sets more than one of weight, repeat and choose", ErrMix, i)
		case s.Weight < 0 || s.Repeat < 0 || s.Choose < 0 || math.IsNaN(s.Weight) || math.IsInf(s.Weight, 0) || math.IsNaN(s.Repeat) || math.IsInf(s.Repeat, 0):
			return nil, nil, fmt.Errorf("%w: stream %d: weight %v, repeat %v, choose %d: want positive finite numbers", ErrMix, i, s.Weight, s.Repeat, s.Choose)
		case s.Weight > 0:
			weighted = true
			given += float64(tokens[i])
			weights += s.Weight
			continue
		case s.Repeat > 0:
			want[i] = s.Repeat * float64(tokens[i])
		case s.Choose > 0:
			want[i] = float64(s.Choose) * float64(tokens[i]) / float64(docs[i])
		default:
			want[i] = float64(tokens[i])
		}
		fixed += want[i]
	}
	total := float64(cfg.EpochTokens)
	if cfg.EpochTokens < 0 {
		return nil, nil, fmt.Errorf("%w: %d tokens an epoch", ErrMix, cfg.EpochTokens)
	}
	if total == 0 {
		total = fixed + given
	}
	if !weighted {
		for i := range want {
			want[i] *= total / fixed
		}
	} else {
		rest := total - fixed
		if rest <= 0 {
			return nil, nil, fmt.Errorf("%w: the streams with repeat or choose take %.0f tokens, the epoch's %.0f leave none to the weighted ones", ErrMix, fixed, total)
		}
		for i, s := range streams {
			if s.Weight > 0 {
				want[i] = rest * s.Weight / weights
			}
		}
	}
	m := &plan.Mix{}
	for i, s := range streams {
		d := math.Round(want[i] * float64(docs[i]) / float64(tokens[i]))
		if d > 1<<53 {
			return nil, nil, fmt.Errorf("%w: stream %d would draw %.0f documents", ErrMix, i, d)
		}
		m.Streams = append(m.Streams, plan.Stream{First: c.from[s.First], Count: c.from[s.First+s.Count] - c.from[s.First], Choose: max(int64(d), 1)})
	}
	return m, partStream, nil
}

// mixKey is what a fingerprint takes of a mix: the streams as given, the epoch's
// tokens and the draws made of them.
func mixKey(cfg *Config, m *plan.Mix) string {
	b, _ := json.Marshal(struct {
		Streams     []plan.Stream
		EpochTokens int64
		Mix         *plan.Mix
	}{cfg.Streams, cfg.EpochTokens, m})
	return string(b)
}

// mixCursor maps positions of a mixed epoch to documents by walking the windows of
// its plan (one rank of one: every position). It moves forward: it keeps the
// windows of the last keepPositions positions, and starts again from the epoch's
// first window for a position before them.
type mixCursor struct {
	p    *plan.Plan
	cur  *plan.Cursor
	used []int32 // per span of p, its samples fed to the windows walked
	next int64   // the position after the last window walked
	wins []mixWindow
	free [][]ref
}

// mixWindow is a window walked: its first position and each position's document.
type mixWindow struct {
	start int64
	docs  []ref
}

// keepPositions is how far back a mixCursor keeps its windows: a layout asks for
// up to pack.BlockDocs documents before the one it looks for.
const keepPositions = 4096

func newMixCursor(p *plan.Plan) *mixCursor {
	return &mixCursor{p: p}
}

func (c *mixCursor) at(n int64) (p, k int) {
	if c.cur == nil || len(c.wins) > 0 && n < c.wins[0].start || len(c.wins) == 0 && n < c.next {
		c.cur, c.next = c.p.Cursor(), 0
		c.used = make([]int32, len(c.p.Spans))
		for _, w := range c.wins {
			c.free = append(c.free, w.docs)
		}
		c.wins = c.wins[:0]
	}
	for n >= c.next {
		w, ok := c.cur.Next()
		if !ok {
			panic(fmt.Sprintf("packed: position %d past the mix's %d", n, c.next))
		}
		c.walk(w)
	}
	for i := len(c.wins) - 1; ; i-- {
		if w := &c.wins[i]; n >= w.start {
			d := w.docs[n-w.start]
			return d.p, d.k
		}
	}
}

// take returns a slice of n refs, reusing a dropped window's.
func (c *mixCursor) take(n int) []ref {
	if k := len(c.free); k > 0 {
		b := c.free[k-1]
		c.free = c.free[:k-1]
		if cap(b) >= n {
			return b[:n]
		}
	}
	return make([]ref, n)
}

// walk adds window w.
func (c *mixCursor) walk(w *plan.Window) {
	held, docs := c.take(int(w.Held)), c.take(int(w.Held))
	for _, f := range w.Feeds {
		sp := &c.p.Spans[f.Span]
		if f.Slot >= 0 {
			for i := range f.Count {
				held[f.Slot+i] = ref{p: sp.Shard, k: sp.Skip + int(c.used[f.Span]+i)}
			}
		}
		c.used[f.Span] += f.Count
	}
	for i, h := range c.p.Emit(w) {
		docs[i] = held[h]
	}
	c.free = append(c.free, held)
	c.wins = append(c.wins, mixWindow{start: c.next, docs: docs})
	c.next += int64(w.Held)
	// Drop the windows wholly before the last keepPositions positions.
	drop := 0
	for drop < len(c.wins)-1 && c.wins[drop+1].start <= c.next-keepPositions {
		drop++
	}
	if drop > 0 {
		for _, w := range c.wins[:drop] {
			c.free = append(c.free, w.docs)
		}
		c.wins = append(c.wins[:0], c.wins[drop:]...)
	}
}

// planReads is plan.Order.Reads for the plan of a mixed epoch (one rank of one): the
// shards fed by its windows from the one holding position from on, each with the
// first and last positions of those windows, in the order of their first reads.
func planReads(p *plan.Plan, shards int, from int64) []plan.ShardReads {
	at := make([]int32, shards) // a shard's place in out, plus one
	var out []plan.ShardReads
	var pos int64
	cur := p.Cursor()
	for {
		w, ok := cur.Next()
		if !ok {
			return out
		}
		end := pos + int64(w.Held)
		if end > from {
			for _, f := range w.Feeds {
				sh := p.Spans[f.Span].Shard
				switch {
				case f.Slot < 0:
				case at[sh] == 0:
					out = append(out, plan.ShardReads{Shard: sh, First: end, Last: end})
					at[sh] = int32(len(out))
				default:
					out[at[sh]-1].Last = end
				}
			}
		}
		pos = end
	}
}
