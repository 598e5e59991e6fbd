package plan

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"
	"sync"

	"github.com/shardload/shardload/shard"
)

// Mix says how the samples of several streams make one epoch (Config.Mix).
//
// Each stream draws D samples per epoch: Choose, or Repeat times its samples, or,
// for a stream with a Weight, its share of what those leave of Samples. A stream's
// draws go through its samples without replacement across epochs: the draws of
// epoch e are draws [e*D, (e+1)*D) of the stream's endless sequence of cycles, each
// cycle every sample of the stream once, in an order of its own (the stream's
// shards shuffled per cycle and read in lanes, as an Order). So a stream drawn at
// fewer samples per epoch than it holds rotates through them, every sample once
// before any twice; one drawn at more repeats each sample floor(r) or ceil(r) times,
// a cycle apart.
//
// The positions of the epoch go to the streams by a fixed schedule in proportion to
// their draws (random: over the whole epoch, each stream's count in any run of
// positions within 1 + log2(streams) of its share; stratified: every batch holds
// each stream's largest-remainder share of the batch; per_stream: every batch is one
// stream's, the batches in proportion to the draws), a pure function of the counts,
// seed and epoch. Windows of the epoch permute each stream's samples among that
// stream's positions, so a stream's samples are shuffled as a single dataset's are
// and the schedule holds whatever the shuffle.
type Mix struct {
	Streams []Stream
	// Samples is the epoch's length; 0: what the streams give (Repeat or Choose, or
	// all of a stream's samples, summed). With Stratified or PerStream batching it is
	// cut to whole batches.
	Samples int64
	// Batching is how batches are made of the streams: Random (the default),
	// Stratified or PerStream.
	Batching Batching
}

// Stream is one stream of a Mix: a run of the shard list given to New.
type Stream struct {
	// First and Count name its shards: shards[First : First+Count].
	First, Count int
	// Weight is the stream's share of the epoch (relative to the other weights);
	// Repeat (times its samples) and Choose (samples) give its draws per epoch
	// instead. A stream with none of them draws all its samples once per epoch.
	Weight float64
	Repeat float64
	Choose int64
}

// Batching is how the batches of a mixed epoch are made of its streams.
type Batching string

// The batchings of a Mix.
const (
	Random     Batching = "random"     // the epoch's order, batch after batch
	Stratified Batching = "stratified" // every batch holds each stream's share
	PerStream  Batching = "per_stream" // every batch holds one stream's samples
)

// ParseBatching returns the batching named s ("" is Random).
func ParseBatching(s string) (Batching, error) {
	switch b := Batching(s); b {
	case "", Random:
		return Random, nil
	case Stratified, PerStream:
		return b, nil
	}
	return "", fmt.Errorf("plan: batching %q: want random, stratified or per_stream", s)
}

// ErrMix means a Mix cannot make an epoch of its streams.
var ErrMix = errors.New("plan: bad stream mix")

// Draws returns each stream's draws per epoch and the epoch's length, before the
// batching's rounding (see Mix). shards are the list the streams index.
func (m Mix) Draws(shards []shard.Info) (draws []int64, total int64, err error) {
	if len(m.Streams) == 0 {
		return nil, 0, fmt.Errorf("%w: no streams", ErrMix)
	}
	var fixed, given int64
	weighted := false
	sizes := make([]int64, len(m.Streams))
	draws = make([]int64, len(m.Streams))
	for i, s := range m.Streams {
		if s.First < 0 || s.Count < 0 || s.First+s.Count > len(shards) {
			return nil, 0, fmt.Errorf("%w: stream %d names shards [%d, %d) of %d", ErrMix, i, s.First, s.First+s.Count, len(shards))
		}
		n, err := countSamples(shards[s.First : s.First+s.Count])
		if err != nil {
			return nil, 0, err
		}
		if n == 0 {
			return nil, 0, fmt.Errorf("%w: stream %d has no samples", ErrMix, i)
		}
		sizes[i] = n
		set := 0
		for _, v := range []bool{s.Weight != 0, s.Repeat != 0, s.Choose != 0} {
			if v {
				set++
			}
		}
		switch {
		case set > 1:
			return nil, 0, fmt.Errorf("%w: stream %d sets more than one of weight, repeat and choose", ErrMix, i)
		case s.Weight < 0 || s.Repeat < 0 || s.Choose < 0 || math.IsNaN(s.Weight) || math.IsInf(s.Weight, 0) || math.IsNaN(s.Repeat) || math.IsInf(s.Repeat, 0):
			return nil, 0, fmt.Errorf("%w: stream %d: weight %v, repeat %v, choose %d: want positive finite numbers", ErrMix, i, s.Weight, s.Repeat, s.Choose)
		case s.Weight > 0:
			weighted = true
			given += n
		case s.Choose > 0:
			draws[i] = s.Choose
		case s.Repeat > 0:
			if s.Repeat*float64(n) > 1<<53 {
				return nil, 0, fmt.Errorf("%w: stream %d repeats its %d samples %v times", ErrMix, i, n, s.Repeat)
			}
			draws[i] = int64(math.Round(s.Repeat * float64(n)))
		default:
			draws[i] = n
		}
		fixed += draws[i]
	}
	total = m.Samples
	if total < 0 {
		return nil, 0, fmt.Errorf("%w: %d samples per epoch", ErrMix, total)
	}
	if total == 0 {
		total = fixed + given
	}
	if !weighted {
		// The fixed draws are the weights of an epoch of another length.
		if total != fixed {
			w := make([]float64, len(draws))
			for i, d := range draws {
				w[i] = float64(d)
			}
			draws = apportion(total, w)
		}
	} else {
		rest := total - fixed
		if rest < 0 {
			return nil, 0, fmt.Errorf("%w: the streams with repeat or choose draw %d samples, more than the epoch's %d", ErrMix, fixed, total)
		}
		w := make([]float64, len(draws))
		for i, s := range m.Streams {
			w[i] = s.Weight
		}
		share := apportion(rest, w)
		for i, s := range m.Streams {
			if s.Weight > 0 {
				draws[i] = share[i]
			}
		}
	}
	for i, d := range draws {
		if d == 0 {
			return nil, 0, fmt.Errorf("%w: stream %d draws no sample in an epoch of %d", ErrMix, i, total)
		}
	}
	return draws, total, nil
}

// Len returns the samples of an epoch of m over shards with batches of batchSize:
// what Draws gives, cut to whole batches with Stratified and PerStream batching.
func (m Mix) Len(shards []shard.Info, batchSize int) (int64, error) {
	_, total, err := m.Draws(shards)
	if m.Batching == Stratified || m.Batching == PerStream {
		total = total / int64(max(batchSize, 1)) * int64(max(batchSize, 1))
	}
	return total, err
}

// Key returns a digest of m (its streams' shards, weights and draws, the epoch's
// length and the batching), and the mixed epoch's length (Len).
func (m Mix) Key(shards []shard.Info, batchSize int) (string, int64) {
	b, _ := json.Marshal(m)
	sum := sha256.Sum256(b)
	n, _ := m.Len(shards, batchSize)
	return hex.EncodeToString(sum[:8]), n
}

// apportion splits n in proportion to weights by largest remainders (ties to the
// first).
func apportion(n int64, weights []float64) []int64 {
	var sum float64
	for _, w := range weights {
		sum += w
	}
	out := make([]int64, len(weights))
	if sum <= 0 {
		return out
	}
	rem := make([]float64, len(weights))
	var given int64
	for i, w := range weights {
		q := float64(n) * w / sum
		out[i] = int64(math.Floor(q))
		rem[i] = q - math.Floor(q)
		given += out[i]
	}
	idx := make([]int, len(weights))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return rem[idx[a]] > rem[idx[b]] })
	for k := 0; given < n; k = (k + 1) % len(idx) {
		out[idx[k]]++
		given++
	}
	for k := len(idx) - 1; given > n; k-- { // float rounding
		if out[idx[k]] > 0 {
			out[idx[k]]--
			given--
		}
	}
	return out
}

// split is a schedule that gives each of total positions to one of len(counts)
// parts, part k getting counts[k] of them, spread evenly: the first x positions hold
// count(k, x) of part k, within depth (log2 of the parts, rounded up) of
// x*counts[k]/total, and count is monotone in x. It is a balanced binary tree whose
// nodes cut their positions between their halves by floor((x*left + phase)/total).
type split struct {
	nodes []splitNode
	parts int
}

type splitNode struct {
	lo, mid, hi int   // parts [lo, hi); left: [lo, mid)
	left, total int64 // positions of the left half, and of the node
	phase       uint64
	l, r        int32 // children; -1 for a leaf
}

// newSplit returns the schedule of counts, its phases drawn from rng (nil: zero).
func newSplit(counts []int64, phase func(total int64) uint64) *split {
	sp := &split{parts: len(counts)}
	sums := make([]int64, len(counts)+1)
	for i, c := range counts {
		sums[i+1] = sums[i] + c
	}
	var build func(lo, hi int) int32
	build = func(lo, hi int) int32 {
		i := int32(len(sp.nodes))
		n := splitNode{lo: lo, hi: hi, l: -1, r: -1, total: sums[hi] - sums[lo]}
		sp.nodes = append(sp.nodes, n)
		if hi-lo > 1 {
			mid := (lo + hi) / 2
			n.mid, n.left = mid, sums[mid]-sums[lo]
			if phase != nil && n.total > 0 {
				n.phase = phase(n.total)
			}
			n.l = build(lo, mid)
			n.r = build(mid, hi)
			sp.nodes[i] = n
		}
		return i
	}
	if len(counts) > 0 {
		build(0, len(counts))
	}
	return sp
}

// leftOf returns the positions of node n's first x that go to its left half.
func (n *splitNode) leftOf(x int64) int64 {
	if n.total == 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(x), uint64(n.left))
	lo, c := bits.Add64(lo, n.phase, 0)
	q, _ := bits.Div64(hi+c, lo, uint64(n.total))
	return int64(q)
}

// count returns how many of the first x positions go to part k.
func (sp *split) count(k int, x int64) int64 {
	n := &sp.nodes[0]
	for n.l >= 0 {
		l := n.leftOf(x)
		if k < n.mid {
			x, n = l, &sp.nodes[n.l]
		} else {
			x, n = x-l, &sp.nodes[n.r]
		}
	}
	return x
}

// part returns the part position x goes to, and its index among that part's
// positions.
func (sp *split) part(x int64) (k int, i int64) {
	n := &sp.nodes[0]
	for n.l >= 0 {
		l0, l1 := n.leftOf(x), n.leftOf(x+1)
		if l1 > l0 {
			x, n = l0, &sp.nodes[n.l]
		} else {
			x, n = x-l0, &sp.nodes[n.r]
		}
	}
	return n.lo, x
}

// mixOrder is the order of a mixed epoch (Mix).
type mixOrder struct {
	cuts
	seed    uint64
	epoch   int
	shuffle bool
	win     int
	batch   int64 // a batch with Stratified and PerStream batching, else 1: rank slices take multiples of it
	kind    Batching
	sched   *split // random: positions to streams; stratified: a batch's rows; per_stream: batches
	streams []*mixStream
	lanes   int
}

// mixStream is one stream of a mixOrder: its draws go through cycles of its samples.
type mixStream struct {
	first   int
	shards  []shard.Info
	n       int64 // samples
	draws   int64 // per epoch
	seed    uint64
	lanes   int
	lane0   int // its first lane among the order's
	shuffle bool
	mu      sync.Mutex // guards cycles: a plan's cursors may run at once
	cycles  map[int64]*mixCycle
}

// mixCycle is one cycle of a stream: its shards' order and its draws' lanes.
type mixCycle struct {
	o     *Order
	lanes *split
}

// mixStreamSeed derives a stream's seed from the job's.
func mixStreamSeed(seed uint64, s int) uint64 {
	return seed ^ (uint64(s)+1)*0x9e3779b97f4a7c15
}

// mixStream offsets the random streams of a mix's schedules from the others of an
// epoch (EpochRand).
const mixStreamRand = 1 << 41

func newMixOrder(shards []shard.Info, cfg Config) (*mixOrder, error) {
	m := cfg.Mix
	kind, err := ParseBatching(string(m.Batching))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMix, err)
	}
	for _, s := range shards {
		if s.Estimated {
			return nil, fmt.Errorf("%w: %s has an estimated count: a mix of streams is planned from exact counts (index the shards: shardload index)", ErrMix, s.URL)
		}
	}
	draws, total, err := m.Draws(shards)
	if err != nil {
		return nil, err
	}
	mo := &mixOrder{seed: cfg.Seed, epoch: cfg.Epoch, shuffle: cfg.Shuffle, win: cfg.Window, batch: 1, kind: kind}
	if !mo.shuffle {
		mo.win = 1
	}
	rng := EpochRand(cfg.Seed, cfg.Epoch, mixStreamRand)
	phase := func(t int64) uint64 { return rng.Uint64N(uint64(t)) }
	if !mo.shuffle {
		phase = nil
	}
	w := make([]float64, len(draws))
	for i, d := range draws {
		w[i] = float64(d)
	}
	switch kind {
	case Random:
		mo.sched = newSplit(draws, phase)
	case Stratified, PerStream:
		b := int64(cfg.BatchSize)
		mo.batch = b
		total = total / b * b
		if total == 0 {
			return nil, fmt.Errorf("%w: an epoch of %d samples holds no whole batch of %d", ErrMix, total, b)
		}
		if kind == Stratified {
			rows := apportion(b, w)
			mo.sched = newSplit(rows, phase)
		} else {
			mo.sched = newSplit(apportion(total/b, w), phase)
		}
	}
	mo.cuts = newCuts(total, mo.win)
	// Lanes: the order's, shared in proportion to the draws, one at least each.
	lanes := apportion(int64(max(cfg.Lanes, 1)), w)
	for i, s := range m.Streams {
		st := &mixStream{first: s.First, shards: shards[s.First : s.First+s.Count], seed: mixStreamSeed(cfg.Seed, i),
			lanes: int(max(lanes[i], 1)), lane0: mo.lanes, shuffle: mo.shuffle, cycles: map[int64]*mixCycle{}}
		if !st.shuffle {
			st.lanes = 1
		}
		st.n, _ = countSamples(st.shards)
		st.draws = mo.streamCount(i, total)
		if st.draws == 0 {
			return nil, fmt.Errorf("%w: stream %d gets no sample of an epoch of %d in %s batches of %d at these weights", ErrMix, i, total, kind, cfg.BatchSize)
		}
		mo.lanes += st.lanes
		mo.streams = append(mo.streams, st)
	}
	return mo, nil
}

// Len returns the samples of the epoch.
func (mo *mixOrder) Len() int64 { return mo.total }

func (mo *mixOrder) laneCount() int { return mo.lanes }

// bounds returns window j's first and end positions.
func (mo *mixOrder) bounds(j int64) (start, end int64) { return mo.cut(j), mo.cut(j + 1) }

// window returns the window holding position n.
func (mo *mixOrder) window(n int64) (j, start, end int64) {
	nw := mo.Windows()
	j = int64(sort.Search(int(nw), func(k int) bool { return mo.cut(int64(k)+1) > n }))
	return j, mo.cut(j), mo.cut(j + 1)
}

// streamCount returns how many of the epoch's first x positions are stream s's.
func (mo *mixOrder) streamCount(s int, x int64) int64 {
	switch mo.kind {
	case Stratified:
		return x/mo.batch*mo.sched.count(s, mo.batch) + mo.sched.count(s, x%mo.batch)
	case PerStream:
		k := x / mo.batch
		n := mo.batch * mo.sched.count(s, k)
		if r := x % mo.batch; r > 0 {
			if p, _ := mo.sched.part(k); p == s {
				n += r
			}
		}
		return n
	}
	return mo.sched.count(s, x)
}

// streamOf returns the stream of position x.
func (mo *mixOrder) streamOf(x int64) int {
	switch mo.kind {
	case Stratified:
		s, _ := mo.sched.part(x % mo.batch)
		return s
	case PerStream:
		s, _ := mo.sched.part(x / mo.batch)
		return s
	}
	s, _ := mo.sched.part(x)
	return s
}

// Perm returns window j's permutation: each position's item, where a stream's
// positions hold its items in a random order (seeded per window and stream).
func (mo *mixOrder) Perm(j int64, size int) []int32 {
	x0 := mo.cut(j)
	off := make([]int32, len(mo.streams))
	var at int32
	perms := make([][]int32, len(mo.streams))
	for s := range mo.streams {
		off[s] = at
		n := int32(mo.streamCount(s, x0+int64(size)) - mo.streamCount(s, x0))
		at += n
		if mo.win > 1 && n > 1 {
			p := make([]int32, n)
			for i := range p {
				p[i] = int32(i)
			}
			EpochRand(mo.streams[s].seed, mo.epoch, windowStream+uint64(j)).Shuffle(int(n), func(a, b int) { p[a], p[b] = p[b], p[a] })
			perms[s] = p
		}
	}
	out := make([]int32, size)
	next := make([]int32, len(mo.streams))
	for i := range out {
		s := mo.streamOf(x0 + int64(i))
		k := next[s]
		next[s]++
		if perms[s] != nil {
			k = perms[s][k]
		}
		out[i] = off[s] + k
	}
	return out
}

// pieces appends window j's items: stream by stream, the stream's draws of the
// window, cycle by cycle and lane by lane.
func (mo *mixOrder) pieces(j int64, dst []piece) []piece {
	x0, x1 := mo.cut(j), mo.cut(j+1)
	for s, st := range mo.streams {
		base := int64(mo.epoch) * st.draws
		dst = st.pieces(base+mo.streamCount(s, x0), base+mo.streamCount(s, x1), dst)
	}
	return dst
}

// partStreams returns the samples of each stream in a rank's part, window by
// window: a whole window's by the schedule, a window's share by the positions of
// its samples (a window's permutation keeps each stream's items among the stream's
// positions).
func (mo *mixOrder) partStreams(sp *splitter, part []seg) []int64 {
	out := make([]int64, len(mo.streams))
	part = slices.Clone(part)
	var in []seg
	for len(part) > 0 {
		var start, end int64
		_, start, end, in, part = sp.inWindow(part, in[:0])
		if sp.segsLen(in) == end-start {
			for s := range out {
				out[s] += mo.streamCount(s, end) - mo.streamCount(s, start)
			}
			continue
		}
		for _, p := range sp.positions(in) {
			out[mo.streamOf(start+int64(p))]++
		}
	}
	return out
}

// pieces appends the items of the stream's draws [u0, u1).
func (st *mixStream) pieces(u0, u1 int64, dst []piece) []piece {
	for u := u0; u < u1; {
		c := u / st.n
		lo, hi := u-c*st.n, min(u1-c*st.n, st.n)
		cy := st.cycle(c)
		for l := range cy.o.lanes {
			p0, p1 := cy.lanes.count(l, lo), cy.lanes.count(l, hi)
			if p1 > p0 {
				dst = append(dst, piece{lane: st.lane0 + l, o: cy.o, base: st.first, s: cy.o.lanes[l].start + p0, n: p1 - p0})
			}
		}
		u = c*st.n + hi
	}
	return dst
}

// cycle returns cycle c of the stream: its shards shuffled and cut into lanes, whose
// draws go to the lanes in proportion to their samples.
//
// A cycle that starts with an epoch is shuffled per (stream, c). One that starts
// within an epoch reads its shards as the cycle before it did: the epoch's draws of
// the two are then the ends of the same lanes, which hold no sample twice when the
// stream draws no more than its samples per epoch.
func (st *mixStream) cycle(c int64) *mixCycle {
	c = c / st.period() * st.period()
	st.mu.Lock()
	defer st.mu.Unlock()
	if cy := st.cycles[c]; cy != nil {
		return cy
	}
	o, err := NewOrder(st.shards, OrderConfig{Seed: st.seed, Epoch: int(c), Shuffle: st.shuffle, Lanes: st.lanes, Window: 1})
	if err != nil {
		panic(err) // the counts were checked by Draws
	}
	counts := make([]int64, len(o.lanes))
	for l, ln := range o.lanes {
		counts[l] = ln.n
	}
	var phase func(int64) uint64
	if st.shuffle {
		rng := EpochRand(st.seed, int(c), mixStreamRand)
		phase = func(t int64) uint64 { return rng.Uint64N(uint64(t)) }
	}
	if len(st.cycles) > 4 {
		clear(st.cycles) // a plan's windows move forward: few cycles at a time
	}
	cy := &mixCycle{o: o, lanes: newSplit(counts, phase)}
	st.cycles[c] = cy
	return cy
}

// StreamOf returns which stream of m each shard of a list of n belongs to (-1 for
// none); nil for a nil Mix.
func (m *Mix) StreamOf(n int) []int {
	if m == nil {
		return nil
	}
	out := slices.Repeat([]int{-1}, n)
	for i, s := range m.Streams {
		for k := s.First; k < s.First+s.Count && k < n; k++ {
			out[k] = i
		}
	}
	return out
}

// period returns every how many cycles a cycle starts with an epoch.
func (st *mixStream) period() int64 {
	a, b := st.n, st.draws
	for b != 0 {
		a, b = b, a%b
	}
	return st.draws / a
}
