package plan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"unsafe"

	"github.com/shardload/shardload/shard"
)

// Config says which part of an epoch one rank reads. The zero value (with
// BatchSize set) is a single rank reading every shard in order.
type Config struct {
	Seed  uint64 // with Epoch, seeds the order (see Order)
	Epoch int
	// Rank is this process's rank in [0, World); World is the number of ranks
	// (default 1).
	Rank, World int
	// Shuffle, Lanes and Window are the order's settings (OrderConfig).
	Shuffle bool
	Lanes   int
	Window  int
	// Runs are the epoch's earlier runs, when this one resumes it (see Remaining):
	// the plan covers only what they left unread.
	Runs []Run
	// BatchSize is the number of samples per batch (required).
	BatchSize int
	// DropLast drops a last batch with fewer than BatchSize samples.
	DropLast bool
	// MaxWindows, when above zero, bounds the windows of the order a rank's part
	// spans: New walks them once (to find the spans) and a loader once more (to
	// yield them), about a microsecond each. A part that spans more is refused with
	// ErrPlanTooLarge before any is walked, so that counts wrong by orders of
	// magnitude (a broken index) are refused instead of planned for hours.
	MaxWindows int64
	// GapBytes: two wanted runs of samples of one shard are read as one span,
	// dropping the samples between them, when these take at most GapBytes (and
	// always when the shard's sample offsets are unknown): one request instead of
	// two, for more bytes. Default 1 MiB; negative: never.
	GapBytes int64
	// Mix, when set, makes the epoch of several streams of the shards (see Mix)
	// instead of the shards' Order; Lanes and Window are then the mix's.
	Mix *Mix
	// RanksPerNode, when above zero, says the ranks sit on nodes of RanksPerNode
	// consecutive ranks (rank r on node r/RanksPerNode, as torchrun numbers them):
	// a shuffled epoch of more than one node then keeps each node on the same
	// samples of the same shards from epoch to epoch, shuffled anew within the node
	// (see nodes.go), so that a node's cache holds what it reads next epoch. The
	// layout of a resumed epoch is its first run's (Run.RanksPerNode), whatever this
	// says. 0: the order of Order, the same for any layout.
	RanksPerNode int
	// Loaded, when set, holds the entries of some of the shards with more known than
	// the shards' own (their sample offsets, read for this plan alone: index.PlanLoaded):
	// the plan reads them there. The counts must be the shards' own.
	Loaded shard.Loaded
}

// DefaultGapBytes is Config.GapBytes's default.
const DefaultGapBytes = 1 << 20

// Span is a run of consecutive samples of one shard: samples [Skip, Skip+Take).
type Span struct {
	URL   string
	Shard int // index in the shard list given to New
	Skip  int
	Take  int
	// Feeds is the number of feeds of the span in the plan's windows: its samples
	// go to that many runs of held items (or of samples read to be dropped).
	Feeds int
}

// Plan is what one rank reads in one epoch, in order.
//
// A plan holds its spans (one or a few per shard it reads) but not its windows,
// which grow with the samples: Windows and Cursor make them again, one at a time,
// in the order the rank yields them, so that what a plan holds does not grow with
// the epoch's samples.
type Plan struct {
	// Spans are the runs of samples the rank reads, in the order it first needs
	// them; the windows (see Windows) say which of their samples go where, window by
	// window, in the order the rank yields them.
	Spans []Span
	// WindowCount is the number of the plan's windows.
	WindowCount int
	Samples     int // samples this rank yields (positions of the order, before DropLast)
	Batches     int // batches this rank yields; the same on every rank
	// Dropped is the number of samples of the epoch (of what earlier runs left, when
	// resuming) that no rank reads: the remainder of the total divided by World
	// (fewer than World samples).
	Dropped int
	// DroppedInBatch is the number of this rank's samples left out of the last,
	// partial batch when DropLast is set (the same on every rank).
	DroppedInBatch int
	// Estimated means some shard's count is an estimate (Info.Estimated): Samples and
	// Batches are what the plan expects, and a loader pads or trims its last batches
	// to Batches (or, for one rank, yields as many as the data makes).
	Estimated bool
	// Streams, for a mixed epoch (Config.Mix), are the samples this rank yields of
	// each stream, in the order of Mix.Streams.
	Streams []int64
	// Lanes is the number of lanes the order reads side by side: Config.Lanes, or a
	// mix's (at least one per stream).
	Lanes int
	// RanksPerNode is the ranks per node by which the epoch's order keeps shards on
	// nodes (Config.RanksPerNode, or a resumed epoch's first run's), 0 when it does
	// not: what a state records in the epoch's first run (Advance).
	RanksPerNode int

	order *Order
	seq   sequence
	// What the windows are made from again: the rank's part of the split's
	// sequence, the split's settings, the shards and the read gap.
	part    []seg
	byItems bool
	shards  []shard.Info
	loaded  shard.Loaded
	gap     int64
	gaps    []bool // per span: some of its samples are read to be dropped
}

// sequence is an epoch's order as a plan reads it: an Order, or a mix of streams.
type sequence interface {
	Len() int64
	// window returns the window holding position n: its number and its first and
	// end positions.
	window(n int64) (j, start, end int64)
	// bounds returns window j's first and end positions.
	bounds(j int64) (start, end int64)
	// Perm returns window j's permutation (position to item), nil for the identity.
	Perm(j int64, size int) []int32
	// pieces appends window j's items to dst, in item order, as runs of positions
	// of the orders' sequences S.
	pieces(j int64, dst []piece) []piece
	// laneCount is the number of lanes read side by side.
	laneCount() int
}

// piece is a run of a window's items: positions [s, s+n) of the sequence S of o,
// whose shards are the plan's shards from base on, read in lane lane.
type piece struct {
	lane int
	o    *Order
	base int
	s, n int64
	// ents, when set, are what o's shard indices name: runs of the plan's shards'
	// samples (a node's group, see nodeOrder), instead of shards from base on.
	ents []entry
}

// ErrNoSamples means there are fewer samples than ranks (or than one batch, with
// DropLast), so a rank would get nothing to read.
var ErrNoSamples = errors.New("shard: not enough samples for the ranks")

// New returns rank cfg.Rank's part of epoch cfg.Epoch.
//
// The epoch's samples are in the order NewOrder gives, which does not depend on the
// world size. What the runs before this one left (all of it, without Runs) is cut
// into World contiguous parts of floor(total/World) samples each, one per rank, so
// that every rank yields the same number of samples and batches and none runs out
// early and hangs a distributed job: parts of the split's sequence, which is the
// order's windows, each window's samples in their place in the data (see split.go),
// so that two ranks sharing a window each read a run of every lane's part of it. A
// rank yields its part window by window, each window's samples in the order's
// positions. The total%World samples at the end are read by no rank in that epoch
// (Plan.Dropped; fewer than World, and different samples each epoch when
// shuffling). Every other sample is read by exactly one rank. A rank reads the
// windows of its part; only the first and the last can be partial, and of those it
// reads only the samples it yields (and, where these are not runs, short gaps
// between them: a resumed rank's first window, a DropLast rank's last, a stratified or
// per-stream mix's).
//
// The plan is a pure function of (shards, cfg). A plan that resumes an epoch whose
// runs left fewer samples than World has no batches.
func New(shards []shard.Info, cfg Config) (Plan, error) {
	world := max(cfg.World, 1)
	if cfg.Rank < 0 || cfg.Rank >= world {
		return Plan{}, fmt.Errorf("shard: rank %d outside [0, %d)", cfg.Rank, world)
	}
	if cfg.BatchSize <= 0 {
		return Plan{}, fmt.Errorf("shard: batch size %d, want > 0", cfg.BatchSize)
	}
	if cfg.GapBytes == 0 {
		cfg.GapBytes = DefaultGapBytes
	}
	var o sequence
	var order *Order
	var mix *mixOrder
	nodesBy := 0
	align := int64(1)
	var err error
	if cfg.Mix != nil {
		if mix, err = newMixOrder(shards, cfg); err != nil {
			return Plan{}, err
		}
		o, align = mix, mix.batch
	} else {
		if order, err = NewOrder(shards, OrderConfig{Seed: cfg.Seed, Epoch: cfg.Epoch, Shuffle: cfg.Shuffle, Lanes: cfg.Lanes, Window: cfg.Window}); err != nil {
			return Plan{}, err
		}
		o = order
		if w, r := nodeLayout(shards, cfg); r > 0 {
			if o, err = nodeOrderOf(shards, order, w, r); err != nil {
				return Plan{}, err
			}
			order, nodesBy = nil, r
		}
	}
	// A shuffled mix whose batches are cut from the order as it comes is split by
	// items too; stratified and per-stream batches keep their shares only when
	// ranks take runs of positions.
	sp := &splitter{o: o, byItems: mix == nil || cfg.Shuffle && mix.kind == Random}
	rest, err := sp.remaining(o.Len(), cfg.Runs, align)
	if err != nil {
		return Plan{}, fmt.Errorf("%w: %w", ErrBadRuns, err)
	}
	total := sp.segsLen(rest)
	per := total / int64(world) / align * align
	if per > math.MaxInt32*int64(cfg.BatchSize) {
		return Plan{}, fmt.Errorf("shard: %d samples per rank is too many", per)
	}
	p := Plan{Samples: int(per), Dropped: int(total - per*int64(world)), order: order, seq: o, Lanes: o.laneCount(), RanksPerNode: nodesBy}
	for _, s := range shards {
		p.Estimated = p.Estimated || s.Estimated
	}
	if per == 0 && len(cfg.Runs) == 0 {
		return Plan{}, fmt.Errorf("%w: %d samples in %d shards for %d ranks", ErrNoSamples, total, len(shards), world)
	}
	p.Batches = (p.Samples + cfg.BatchSize - 1) / cfg.BatchSize
	take := per
	if cfg.DropLast {
		p.Batches = p.Samples / cfg.BatchSize
		p.DroppedInBatch = p.Samples % cfg.BatchSize
		take = int64(p.Batches) * int64(cfg.BatchSize)
		if p.Batches == 0 && len(cfg.Runs) == 0 {
			return Plan{}, fmt.Errorf("%w: %d samples per rank, fewer than one batch of %d", ErrNoSamples, per, cfg.BatchSize)
		}
	}
	lo := int64(cfg.Rank) * per
	part := sp.sub(rest, lo, lo+per)
	if take < per {
		part, _ = sp.yieldCut(part, take)
	}
	if cfg.MaxWindows > 0 {
		var windows int64
		for _, g := range part {
			windows += sp.windowOf(g.e-1) - sp.windowOf(g.s) + 1
		}
		if windows > cfg.MaxWindows {
			return Plan{}, fmt.Errorf("%w: rank %d's part of the epoch is %d samples in %d windows of the order, more than the %d it may span (are the counts right? %d samples in %d shards)",
				ErrPlanTooLarge, cfg.Rank, take, windows, cfg.MaxWindows, o.Len(), len(shards))
		}
	}
	p.part, p.byItems, p.shards, p.loaded, p.gap = part, sp.byItems, shards, cfg.Loaded, cfg.GapBytes
	// One walk of the windows finds the spans, how many feeds each has and which
	// read samples to drop; the windows themselves are made again by Cursor.
	b := p.builder()
	b.spans, b.gaps = &p.Spans, &p.gaps
	for {
		if _, ok := b.next(); !ok {
			break
		}
		p.WindowCount++
	}
	if cap(p.Spans) > len(p.Spans)+len(p.Spans)/8 {
		// Held as long as the plan: without the room that appending left.
		p.Spans, p.gaps = slices.Clone(p.Spans), slices.Clone(p.gaps)
	}
	if mix != nil {
		p.Streams = mix.partStreams(sp, part)
	}
	return p, nil
}

// ErrPlanTooLarge means a rank's part of an epoch spans more windows than
// Config.MaxWindows allows.
var ErrPlanTooLarge = errors.New("shard: the epoch's plan is too large")

// Order returns the epoch's order the plan reads from; nil for a mixed epoch
// (Config.Mix).
func (p *Plan) Order() *Order { return p.order }

// Emit returns, for each position the rank yields of window w, in order, the index of
// its sample among the window's held items (the order in which w.Feeds fill them).
func (p *Plan) Emit(w *Window) []int32 {
	perm := p.seq.Perm(w.Index, int(w.Size))
	if w.Items == nil && perm != nil {
		return perm
	}
	out := make([]int32, 0, w.Held)
	if perm == nil {
		for i := range w.Held {
			out = append(out, i)
		}
		return out
	}
	for _, q := range perm {
		if i, ok := slices.BinarySearch(w.Items, q); ok {
			out = append(out, int32(i))
		}
	}
	return out
}

// Cursor returns a cursor over p's windows, from the first (none for a Plan that
// New did not make).
func (p *Plan) Cursor() *Cursor {
	if p.seq == nil {
		return &Cursor{}
	}
	return &Cursor{b: p.builder()}
}

// Windows returns p's windows, in the order the rank yields them; each is made
// again as the iteration reaches it (see Cursor).
func (p *Plan) Windows() iter.Seq[*Window] {
	return func(yield func(*Window) bool) {
		c := p.Cursor()
		for {
			w, ok := c.Next()
			if !ok || !yield(w) {
				return
			}
		}
	}
}

// Cursor makes a plan's windows one at a time, in the order the rank yields them:
// what it holds is one window's, whatever the epoch's size. A Cursor is not safe
// for concurrent use; any number of cursors of one plan may run at once.
type Cursor struct {
	b planBuilder
}

// Next returns the next window, or false after the last.
func (c *Cursor) Next() (*Window, bool) {
	if c.b.sp == nil {
		return nil, false
	}
	w, ok := c.b.next()
	if !ok {
		return nil, false
	}
	return &w, true
}

// builder returns a builder of p's windows from the first.
func (p *Plan) builder() planBuilder {
	lanes := p.seq.laneCount()
	b := planBuilder{o: p.seq, sp: &splitter{o: p.seq, byItems: p.byItems}, shards: p.shards, loaded: p.loaded, gap: p.gap,
		part: slices.Clone(p.part), last: make([]int, lanes), cur: make([]Span, lanes), partial: make([]bool, lanes)}
	for i := range b.last {
		b.last[i] = -1
	}
	return b
}

// planBuilder turns a rank's part into windows, spans and feeds, a window at a
// time.
type planBuilder struct {
	o      sequence
	sp     *splitter
	shards []shard.Info
	loaded shard.Loaded
	pcs    []piece // scratch
	in     []seg   // scratch
	gap    int64
	part   []seg // what is left of the rank's part (segs of the split's sequence T)
	last   []int // per lane, the index of its last span; -1 before the first
	cur    []Span
	spanN  int // spans made so far
	// partial: per lane, whether its last span ends in a window the rank yields
	// only part of. A full window's samples start a span of their own after one:
	// the partial window (a resumed rank's first) then has spans of known lengths,
	// not one that reads on to its shard's end before the first batch is out.
	partial []bool
	full    bool // the window being added is the rank's whole
	// spans and gaps, when set (New's walk), get the spans as they are made and
	// extended, and whether each reads samples to drop them.
	spans *[]Span
	gaps  *[]bool
}

// next returns the rank's next window, or false after the last.
func (b *planBuilder) next() (Window, bool) {
	if len(b.part) == 0 {
		return Window{}, false
	}
	var j, start, end int64
	j, start, end, b.in, b.part = b.sp.inWindow(b.part, b.in[:0])
	w := Window{Index: j, Size: int32(end - start)}
	b.full = b.sp.segsLen(b.in) == end-start
	// The held items, in increasing item order: piece by piece (lane by lane),
	// each a run of S positions (whole for a full window, else the held items
	// only).
	var want []int32
	if !b.full {
		want, w.Last = b.sp.items(b.in, end)
		w.Items = want
	} else {
		w.Last = true
	}
	var q0 int32
	b.pcs = b.o.pieces(j, b.pcs[:0])
	for _, pc := range b.pcs {
		q1 := q0 + int32(pc.n)
		if b.full {
			b.addRun(&w, pc, pc.s, pc.s+pc.n)
		} else {
			// The wanted items of this piece, as runs of consecutive positions.
			lo, _ := slices.BinarySearch(want, q0)
			hi, _ := slices.BinarySearch(want, q1)
			for i := lo; i < hi; {
				k := i + 1
				for k < hi && want[k] == want[k-1]+1 {
					k++
				}
				s := pc.s + int64(want[i]-q0)
				b.addRun(&w, pc, s, s+int64(k-i))
				i = k
			}
		}
		q0 = q1
	}
	return w, true
}

// addRun adds positions [s, e) of piece pc's sequence to window w's held items.
func (b *planBuilder) addRun(w *Window, pc piece, s, e int64) {
	o, l := pc.o, pc.lane
	for s < e {
		i := sort.Search(len(o.perm), func(i int) bool { return o.starts[i+1] > s })
		si, skip := pc.base+int(o.perm[i]), int(s-o.starts[i])
		if pc.ents != nil {
			e := pc.ents[o.perm[i]]
			si, skip = e.shard, e.skip+skip
		}
		take := int(min(e, o.starts[i+1]) - s)
		b.addPiece(w, l, si, skip, take)
		s += int64(take)
	}
}

// addPiece adds samples [skip, skip+take) of shard si, read in lane l, to window w.
func (b *planBuilder) addPiece(w *Window, l, si, skip, take int) {
	defer func() { b.partial[l] = !b.full }()
	if k := b.last[l]; k >= 0 && b.cur[l].Shard == si && !(b.full && b.partial[l]) {
		sp := &b.cur[l]
		end := sp.Skip + sp.Take
		if skip >= end && (skip == end || b.cheapGap(si, end, skip)) {
			if skip > end {
				b.feed(w, Feed{Span: k, Slot: -1, Count: int32(skip - end)})
			}
			sp.Take += skip - end + take
			if b.spans != nil {
				(*b.spans)[k].Take = sp.Take
			}
			b.feed(w, Feed{Span: k, Slot: w.Held, Count: int32(take)})
			w.Held += int32(take)
			return
		}
	}
	info := b.shards[si]
	b.cur[l] = Span{URL: info.URL, Shard: si, Skip: skip, Take: take}
	b.last[l] = b.spanN
	b.spanN++
	if b.spans != nil {
		*b.spans = append(*b.spans, b.cur[l])
		*b.gaps = append(*b.gaps, false)
	}
	b.feed(w, Feed{Span: b.last[l], Slot: w.Held, Count: int32(take)})
	w.Held += int32(take)
}

// feed adds f to w's feeds (in New's walk, which keeps no window, it counts it).
func (b *planBuilder) feed(w *Window, f Feed) {
	if b.spans == nil {
		w.Feeds = append(w.Feeds, f)
	} else {
		(*b.spans)[f.Span].Feeds++
		if f.Slot < 0 {
			(*b.gaps)[f.Span] = true
		}
	}
}

// cheapGap reports whether reading samples [from, to) of shard si to drop them costs
// less than a new read: they take at most the gap bytes, or the shard cannot be
// entered at a sample (its offsets are unknown) anyway.
func (b *planBuilder) cheapGap(si, from, to int) bool {
	offs := b.loaded.At(b.shards, si).Offsets
	if len(offs) <= to {
		return true
	}
	return b.gap >= 0 && offs[to]-offs[from] <= b.gap
}

// EpochRand returns the random source for one purpose (stream) of one epoch: a pure
// function of (seed, epoch, stream), so that every run with the same settings makes
// the same choices.
func EpochRand(seed uint64, epoch int, stream uint64) *rand.Rand {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[0:], seed)
	binary.LittleEndian.PutUint64(key[8:], uint64(epoch))
	binary.LittleEndian.PutUint64(key[16:], stream)
	copy(key[24:], "shardld\x00")
	return rand.New(rand.NewChaCha8(key))
}

// Bytes is about what p holds in memory: its spans and the order's list of shards
// (the windows are made again as they are read, see Cursor). The shard list given to
// New is the caller's.
func (p *Plan) Bytes() int64 {
	n := int64(cap(p.Spans))*int64(unsafe.Sizeof(Span{})) + int64(cap(p.gaps)) + int64(cap(p.part))*int64(unsafe.Sizeof(seg{}))
	if no, ok := p.seq.(*nodeOrder); ok {
		return n + no.bytes()
	}
	return n + int64(len(p.shards))*12 // an order's permutation and starts a shard
}

// Loaded returns the entries of shards that p was planned with beyond the shards'
// own (Config.Loaded): a reader of p's spans takes a shard's entry from there when
// it holds one (shard.Loaded.At).
func (p *Plan) Loaded() shard.Loaded { return p.loaded }

// Whole reports, for each of p's spans, whether it reads its shard whole: every
// sample, from the shard's start to its end, none of them dropped. Such a span needs
// none of the shard's sample offsets (it is read from the start and checked by its
// count at the end), so a loader need not hold them.
func (p *Plan) Whole(shards []shard.Info) []bool {
	whole := make([]bool, len(p.Spans))
	for k, sp := range p.Spans {
		whole[k] = sp.Skip == 0 && sp.Shard >= 0 && sp.Shard < len(shards) && sp.Take == shards[sp.Shard].Samples && sp.Take > 0
	}
	for k, gap := range p.gaps {
		if gap {
			whole[k] = false // samples read and dropped
		}
	}
	return whole
}

// InPart reports, for each of shards, whether p reads it in part: some span of it
// does not read it whole (see Whole). Only those shards' sample offsets are of use
// to a loader of p.
func (p *Plan) InPart(shards []shard.Info) []bool {
	part := make([]bool, len(shards))
	for k, whole := range p.Whole(shards) {
		if s := p.Spans[k].Shard; !whole && s >= 0 && s < len(shards) {
			part[s] = true
		}
	}
	return part
}
