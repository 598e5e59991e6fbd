package plan

import (
	"encoding/binary"
	"errors"
	"fmt"
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
	// MaxBytes, when above zero, bounds the memory the plan may take: a rank's part
	// that would need more is refused with ErrPlanTooLarge before it is
	// built. Counts that are wrong by orders of magnitude (a broken index) are
	// refused this way instead of taking the machine's memory.
	MaxBytes int64
	// GapBytes: two wanted runs of samples of one shard are read as one span,
	// dropping the samples between them, when these take at most GapBytes (and
	// always when the shard's sample offsets are unknown): one request instead of
	// two, for more bytes. Default 1 MiB; negative: never.
	GapBytes int64
	// Mix, when set, makes the epoch of several streams of the shards (see Mix)
	// instead of the shards' Order; Lanes and Window are then the mix's.
	Mix *Mix
}

// DefaultGapBytes is Config.GapBytes's default.
const DefaultGapBytes = 1 << 20

// Span is a run of consecutive samples of one shard: samples [Skip, Skip+Take).
type Span struct {
	URL   string
	Shard int // index in the shard list given to New
	Skip  int
	Take  int
}

// Plan is what one rank reads in one epoch, in order.
type Plan struct {
	// Spans are the runs of samples the rank reads, in the order it first needs
	// them; Windows say which of their samples go where, window by window, in the
	// order the rank yields them.
	Spans   []Span
	Windows []Window
	Samples int // samples this rank yields (positions of the order, before DropLast)
	Batches int // batches this rank yields; the same on every rank
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

	order *Order
	seq   sequence
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
	p := Plan{Samples: int(per), Dropped: int(total - per*int64(world)), order: order, seq: o, Lanes: o.laneCount()}
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
	if cfg.MaxBytes > 0 {
		var windows int64
		for _, g := range part {
			windows += sp.windowOf(g.e-1) - sp.windowOf(g.s) + 1
		}
		if need := windows * windowBytes(o.laneCount()); need > cfg.MaxBytes {
			return Plan{}, fmt.Errorf("%w: rank %d's part of the epoch is %d samples in %d windows of the order, whose plan takes about %d MB, more than the %d MB it may (are the counts right? %d samples in %d shards)",
				ErrPlanTooLarge, cfg.Rank, take, windows, need>>20, cfg.MaxBytes>>20, o.Len(), len(shards))
		}
	}
	b := planBuilder{p: &p, o: o, sp: sp, shards: shards, gap: cfg.GapBytes, last: make([]int, o.laneCount()), partial: make([]bool, o.laneCount())}
	for i := range b.last {
		b.last[i] = -1
	}
	b.addPart(part)
	if mix != nil {
		p.Streams = mix.partStreams(sp, part)
	}
	return p, nil
}

// ErrPlanTooLarge means a rank's plan would take more memory than
// Config.MaxBytes allows.
var ErrPlanTooLarge = errors.New("shard: the epoch's plan is too large")

// windowBytes is about what one window of a plan takes, with its feeds, for lanes
// lanes: a window holds a feed per lane, and one more per shard a lane's part
// crosses into.
func windowBytes(lanes int) int64 {
	return int64(unsafe.Sizeof(Window{})) + int64(2*lanes+1)*int64(unsafe.Sizeof(Feed{}))
}

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

// planBuilder turns a rank's part into windows, spans and feeds.
type planBuilder struct {
	p      *Plan
	o      sequence
	sp     *splitter
	shards []shard.Info
	pcs    []piece // scratch
	gap    int64
	last   []int // per lane, the index of its last span; -1 before the first
	// partial: per lane, whether its last span ends in a window the rank yields
	// only part of. A full window's samples start a span of their own after one:
	// the partial window (a resumed rank's first) then has spans of known lengths,
	// not one that reads on to its shard's end before the first batch is out.
	partial []bool
	full    bool // the window being added is the rank's whole
}

// addPart adds the rank's part (segs of the split's sequence T), window by window.
func (b *planBuilder) addPart(part []seg) {
	var in []seg
	part = slices.Clone(part)
	for len(part) > 0 {
		var j, start, end int64
		j, start, end, in, part = b.sp.inWindow(part, in[:0])
		w := Window{Index: j, Size: int32(end - start)}
		b.full = b.sp.segsLen(in) == end-start
		// The held items, in increasing item order: piece by piece (lane by lane),
		// each a run of S positions (whole for a full window, else the held items
		// only).
		var want []int32
		if !b.full {
			want, w.Last = b.sp.items(in, end)
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
		b.p.Windows = append(b.p.Windows, w)
	}
}

// addRun adds positions [s, e) of piece pc's sequence to window w's held items.
func (b *planBuilder) addRun(w *Window, pc piece, s, e int64) {
	o, l := pc.o, pc.lane
	for s < e {
		i := sort.Search(len(o.perm), func(i int) bool { return o.starts[i+1] > s })
		si := pc.base + int(o.perm[i])
		skip := int(s - o.starts[i])
		take := int(min(e, o.starts[i+1]) - s)
		b.addPiece(w, l, si, skip, take)
		s += int64(take)
	}
}

// addPiece adds samples [skip, skip+take) of shard si, read in lane l, to window w.
func (b *planBuilder) addPiece(w *Window, l, si, skip, take int) {
	p := b.p
	defer func() { b.partial[l] = !b.full }()
	if k := b.last[l]; k >= 0 && p.Spans[k].Shard == si && !(b.full && b.partial[l]) {
		sp := &p.Spans[k]
		end := sp.Skip + sp.Take
		if skip >= end && (skip == end || b.cheapGap(si, end, skip)) {
			if skip > end {
				w.Feeds = append(w.Feeds, Feed{Span: k, Slot: -1, Count: int32(skip - end)})
			}
			sp.Take += skip - end + take
			w.Feeds = append(w.Feeds, Feed{Span: k, Slot: w.Held, Count: int32(take)})
			w.Held += int32(take)
			return
		}
	}
	info := b.shards[si]
	p.Spans = append(p.Spans, Span{URL: info.URL, Shard: si, Skip: skip, Take: take})
	b.last[l] = len(p.Spans) - 1
	w.Feeds = append(w.Feeds, Feed{Span: len(p.Spans) - 1, Slot: w.Held, Count: int32(take)})
	w.Held += int32(take)
}

// cheapGap reports whether reading samples [from, to) of shard si to drop them costs
// less than a new read: they take at most the gap bytes, or the shard cannot be
// entered at a sample (its offsets are unknown) anyway.
func (b *planBuilder) cheapGap(si, from, to int) bool {
	offs := b.shards[si].Offsets
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

// Whole reports, for each of p's spans, whether it reads its shard whole: every
// sample, from the shard's start to its end, none of them dropped. Such a span needs
// none of the shard's sample offsets (it is read from the start and checked by its
// count at the end), so a loader need not hold them.
func (p *Plan) Whole(shards []shard.Info) []bool {
	whole := make([]bool, len(p.Spans))
	for k, sp := range p.Spans {
		whole[k] = sp.Skip == 0 && sp.Shard >= 0 && sp.Shard < len(shards) && sp.Take == shards[sp.Shard].Samples && sp.Take > 0
	}
	for _, w := range p.Windows {
		for _, f := range w.Feeds {
			if f.Slot < 0 {
				whole[f.Span] = false // samples read and dropped: a gap
			}
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
