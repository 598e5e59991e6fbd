package plan

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"

	"github.com/shardload/shardload/shard"
)

// OrderConfig says how an epoch's samples are ordered. The order is a pure function
// of the shards' URLs and counts and of these settings: not of the world size, of
// timing, of worker counts or of the samples' bytes.
type OrderConfig struct {
	Seed  uint64
	Epoch int
	// Shuffle shuffles the shards per (Seed, Epoch), interleaves Lanes of them and
	// permutes each Window of samples. Off, the order is the shards' samples in the
	// order given.
	Shuffle bool
	// Lanes is the number of regions of the shuffled shard sequence read side by side
	// (each a run of whole shards, about 1/Lanes of the samples). Default 1.
	Lanes int
	// Window is the number of samples permuted as a whole (from all lanes, in
	// proportion to their lengths); 1 or less permutes nothing. The first windows of
	// an epoch are smaller (64, 128, 256, ... samples) so that the first batch does
	// not wait for a whole window.
	Window int
}

// Order is the sequence of an epoch's samples. It is built as follows.
//
//  1. The shards are shuffled per (Seed, Epoch); their samples, shard after shard,
//     form the sequence S.
//  2. S is cut at shard boundaries into Lanes lanes of about equal length.
//  3. Windows: window j takes from every lane the next part in proportion to the
//     lane's length (so that all lanes end with the epoch's last window), about
//     Window samples in all; its samples are permuted by a random permutation
//     seeded by (Seed, Epoch, j). The order is the windows, one after the other.
//
// A sample therefore moves less than two windows from where its lane puts it, every
// window mixes the samples of Lanes regions of the dataset (and the shards in them),
// and the position of any sample, and the state after any number of samples, is
// computed without reading data: a reader can start at any position by reading only
// the samples of the windows from there on.
type Order struct {
	cfg    OrderConfig
	shards []shard.Info
	perm   []int32 // shard indices in epoch order
	starts []int64 // starts[i]: position in S of shard perm[i]'s first sample; len(perm)+1
	lanes  []lane
	cuts
}

// cuts are the nominal cuts of an order's windows: warm-up windows of 64, 128, 256,
// ... samples, then windows of size samples, up to total.
type cuts struct {
	total int64
	size  int   // samples per window after the warm-up: Window, or flatWindow
	warm  int   // warm-up windows
	warmX int64 // nominal cut after the warm-up windows
}

// newCuts returns the cuts of total samples in windows of window samples (1 or
// less: flatWindow, without a warm-up).
func newCuts(total int64, window int) cuts {
	c := cuts{total: total, size: window}
	if window <= 1 {
		c.size = flatWindow
	}
	for s := int64(warmFirst); window > 1 && s < int64(window) && c.warmX < total; s *= 2 {
		c.warm++
		c.warmX += s
	}
	return c
}

// flatWindow is the size of the windows of an order that permutes nothing.
const flatWindow = 4096

// lane is a region of S: n samples from start.
type lane struct{ start, n int64 }

// warmFirst is the size of an epoch's first window; each next warm-up window doubles.
const warmFirst = 64

// NewOrder returns the order of shards' samples under cfg. It is read-only, and may
// be the one it returned before for the same shards (a list of them with the same
// counts) and settings, while that is held.
func NewOrder(shards []shard.Info, cfg OrderConfig) (*Order, error) {
	if len(shards) > math.MaxInt32 {
		return nil, fmt.Errorf("shard: %d shards, more than an order holds (%d)", len(shards), math.MaxInt32)
	}
	if !cfg.Shuffle {
		cfg.Lanes, cfg.Window = 1, 1
	}
	cfg.Lanes = max(cfg.Lanes, 1)
	cfg.Window = max(cfg.Window, 1)
	// Without permutations (Window 1), windows only cut the order into pieces,
	// which a reader yields as they come.
	total, err := countSamples(shards)
	if err != nil {
		return nil, err
	}
	build := func() (*Order, error) {
		o := newOrder(len(shards), func(i int) int64 { return int64(shards[i].Samples) }, total, cfg)
		o.shards = shards
		return o, nil
	}
	if k, ok := keyOf(shards, cfg, 0, 0); ok {
		// The order another plan of these shards holds (shared.go).
		return orders.get(k, func(o *Order) bool { return o.of(shards) }, build)
	}
	return build()
}

// newOrder returns the order of n shards of count(i) samples each, total in all, under
// cfg (with defaults applied).
func newOrder(n int, count func(i int) int64, total int64, cfg OrderConfig) *Order {
	// 12 bytes a shard: a shard index and a start.
	o := &Order{cfg: cfg, perm: make([]int32, n), starts: make([]int64, n+1)}
	o.cuts = newCuts(total, cfg.Window)
	for i := range o.perm {
		o.perm[i] = int32(i)
	}
	if cfg.Shuffle {
		EpochRand(cfg.Seed, cfg.Epoch, 0).Shuffle(len(o.perm), func(i, j int) { o.perm[i], o.perm[j] = o.perm[j], o.perm[i] })
	}
	for i, s := range o.perm {
		o.starts[i+1] = o.starts[i] + count(int(s))
	}
	// Lane l starts at the shard boundary nearest l/Lanes of the samples.
	bounds := make([]int64, cfg.Lanes+1)
	for l := 1; l < cfg.Lanes; l++ {
		want := mulDiv(o.total, int64(l), int64(cfg.Lanes))
		i := sort.Search(len(o.starts), func(i int) bool { return o.starts[i] >= want })
		if i > 0 && want-o.starts[i-1] < o.starts[i]-want {
			i--
		}
		bounds[l] = max(o.starts[i], bounds[l-1])
	}
	bounds[cfg.Lanes] = o.total
	for l := range cfg.Lanes {
		o.lanes = append(o.lanes, lane{start: bounds[l], n: bounds[l+1] - bounds[l]})
	}
	return o
}

// countSamples returns the samples of shards, refusing negative counts and counts
// whose sum overflows.
func countSamples(shards []shard.Info) (int64, error) {
	var total int64
	for _, s := range shards {
		if s.Samples < 0 {
			return 0, fmt.Errorf("shard: %s has %d samples", s.URL, s.Samples)
		}
		if total > math.MaxInt64-int64(s.Samples) {
			return 0, fmt.Errorf("shard: the sample counts of the shards overflow at %s (%d samples): a broken index?", s.URL, s.Samples)
		}
		total += int64(s.Samples)
	}
	return total, nil
}

// mulDiv returns a*b/c rounded down, for non-negative a, b and positive c, without
// overflow when a*b does not fit in 64 bits (the result must).
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}

// Len returns the number of samples in the epoch.
func (o *Order) Len() int64 { return o.total }

// Config returns the order's settings, with defaults applied.
func (o *Order) Config() OrderConfig { return o.cfg }

// Windows returns the number of windows.
func (c *cuts) Windows() int64 {
	if c.total == 0 {
		return 0
	}
	if c.total <= c.warmX {
		// Ends within the warm-up.
		for j := 1; ; j++ {
			if c.cut(int64(j)) >= c.total {
				return int64(j)
			}
		}
	}
	w := int64(c.size)
	return int64(c.warm) + (c.total-c.warmX+w-1)/w
}

// cut returns the nominal cut before window j: X_j.
func (c *cuts) cut(j int64) int64 {
	var x int64
	if j <= int64(c.warm) {
		x = warmFirst * ((int64(1) << j) - 1)
	} else {
		w := int64(c.size)
		if j-int64(c.warm) > (c.total-c.warmX)/w+1 {
			return c.total
		}
		x = c.warmX + (j-int64(c.warm))*w
	}
	return min(x, c.total)
}

// progress returns how far lane l has come at nominal cut x.
func (o *Order) progress(l int, x int64) int64 {
	if o.total == 0 {
		return 0
	}
	return mulDiv(x, o.lanes[l].n, o.total)
}

// WindowStart returns the position in the order of window j's first sample; j from 0
// to Windows() (which gives Len()).
func (o *Order) WindowStart(j int64) int64 {
	x := o.cut(j)
	var a int64
	for l := range o.lanes {
		a += o.progress(l, x)
	}
	return a
}

// bounds returns window j's first and end positions.
func (o *Order) bounds(j int64) (start, end int64) { return o.WindowStart(j), o.WindowStart(j + 1) }

// window returns the window holding position n: its number and its first and end
// positions.
func (o *Order) window(n int64) (j, start, end int64) {
	nw := o.Windows()
	// The last j with WindowStart(j) <= n.
	j = int64(sort.Search(int(nw), func(k int) bool { return o.WindowStart(int64(k)+1) > n }))
	return j, o.WindowStart(j), o.WindowStart(j + 1)
}

// windowStream offsets the random streams of the windows' permutations from the
// other streams of an epoch (EpochRand).
const windowStream = 1 << 40

// Perm returns the permutation of window j, of size samples: Perm(j)[i] is the item
// (see Item) at the window's position i. nil means the identity.
func (o *Order) Perm(j int64, size int) []int32 {
	if o.cfg.Window <= 1 || size <= 1 {
		return nil
	}
	p := make([]int32, size)
	for i := range p {
		p[i] = int32(i)
	}
	EpochRand(o.cfg.Seed, o.cfg.Epoch, windowStream+uint64(j)).Shuffle(size, func(a, b int) { p[a], p[b] = p[b], p[a] })
	return p
}

// pieces appends window j's items to dst, in item order: each lane's part.
func (o *Order) pieces(j int64, dst []piece) []piece {
	x0, x1 := o.cut(j), o.cut(j+1)
	for l := range o.lanes {
		p0, p1 := o.progress(l, x0), o.progress(l, x1)
		dst = append(dst, piece{lane: l, o: o, s: o.lanes[l].start + p0, n: p1 - p0})
	}
	return dst
}

// laneCount returns the number of lanes.
func (o *Order) laneCount() int { return len(o.lanes) }

// Item returns the shard (an index in the shard list given to NewOrder) and sample
// index of item q of window j: the window's items are its lanes' parts, lane after
// lane, each in lane order.
func (o *Order) Item(j int64, q int) (shardIdx, sample int) {
	x0, x1 := o.cut(j), o.cut(j+1)
	rest := int64(q)
	for l := range o.lanes {
		p0, p1 := o.progress(l, x0), o.progress(l, x1)
		if rest < p1-p0 {
			return o.sampleAt(o.lanes[l].start + p0 + rest)
		}
		rest -= p1 - p0
	}
	panic(fmt.Sprintf("shard: item %d outside window %d", q, j))
}

// ShardSample is a sample named by its shard (an index in the shard list given to
// NewOrder) and its index in the shard.
type ShardSample struct{ Shard, Sample int }

// WindowItems appends window j's items to dst in item order, so that the q-th
// appended is Item(j, q), and returns it: one search a lane, then a walk.
func (o *Order) WindowItems(j int64, dst []ShardSample) []ShardSample {
	x0, x1 := o.cut(j), o.cut(j+1)
	for l := range o.lanes {
		p0, p1 := o.progress(l, x0), o.progress(l, x1)
		if p1 <= p0 {
			continue
		}
		s, end := o.lanes[l].start+p0, o.lanes[l].start+p1
		i := sort.Search(len(o.perm), func(i int) bool { return o.starts[i+1] > s })
		for ; s < end; s++ {
			for s >= o.starts[i+1] {
				i++
			}
			dst = append(dst, ShardSample{int(o.perm[i]), int(s - o.starts[i])})
		}
	}
	return dst
}

// sampleAt returns the shard and sample at position s of S.
func (o *Order) sampleAt(s int64) (shardIdx, sample int) {
	i := sort.Search(len(o.perm), func(i int) bool { return o.starts[i+1] > s })
	return int(o.perm[i]), int(s - o.starts[i])
}

// At returns the shard and sample index at position n of the order.
func (o *Order) At(n int64) (shardIdx, sample int) {
	j, start, end := o.window(n)
	q := int(n - start)
	if p := o.Perm(j, int(end-start)); p != nil {
		q = int(p[q])
	}
	return o.Item(j, q)
}

// Range is a run of positions [Start, End) of an epoch's order.
type Range struct{ Start, End int64 }

// Run is one run of an epoch: a job of World ranks, each of which consumed Consumed
// samples of its part before it stopped (the same on every rank: ranks consume in
// step).
type Run struct {
	World    int
	Consumed int64
	// RanksPerNode, in an epoch's first run, is the ranks per node by which its
	// order keeps shards on nodes (Plan.RanksPerNode; 0: none): the epoch's order
	// is that layout's in every run of the epoch. Later runs have none.
	RanksPerNode int
}

// Remaining returns the positions of an order of total samples that the runs left
// unread, in the order the next run takes them, where ranks split the order by
// positions (a mixed epoch's; a plain order's ranks split it by items, see New):
// each run of World ranks splits what the runs before it left into World equal
// contiguous parts (the rest, fewer than World samples, goes to no rank) and each
// rank consumed the first Consumed samples of its part. What is left is every
// rank's unconsumed part, rank after rank, followed by the rest no rank had.
func Remaining(total int64, runs []Run) ([]Range, error) {
	sp := splitter{}
	rs, err := sp.remaining(total, runs, 1)
	return sp.positionRanges(rs), err
}

// checkRun checks run i's world size.
func checkRun(i int, run Run) error {
	if run.World < 1 {
		return fmt.Errorf("shard: run %d has world size %d", i, run.World)
	}
	return nil
}

// errConsumed: run i's ranks consumed more than their parts of per samples.
func errConsumed(i int, run Run, per int64) error {
	return fmt.Errorf("shard: run %d consumed %d samples per rank of %d", i, run.Consumed, per)
}

// ErrBadRuns means a resume state's runs do not fit the epoch.
var ErrBadRuns = errors.New("shard: the runs do not fit the epoch")

// Feed says which samples of a span go where in a window: the span's next Count
// samples fill the window's held items from Slot on, or are dropped when Slot is -1
// (samples between two wanted ones, read because seeking past them costs more).
type Feed struct {
	Span  int
	Slot  int32
	Count int32
}

// Window is one window of a rank's plan: which of its samples the rank reads, where
// they come from, and which positions of the window it yields.
type Window struct {
	Index int64 // the window's number in the order
	Size  int32 // samples in the whole window
	Held  int32 // samples the rank holds, and yields
	// Items are the window's items the rank holds, in increasing order, when it
	// holds only some (nil: all). The rank yields them in the order of their
	// positions (see Plan.Emit).
	Items []int32
	// Last reports whether the rank holds the window's last sample in the rank
	// split's sequence: the one rank of a job that also yields the samples found
	// past an estimated shard's count in the window.
	Last  bool
	Feeds []Feed // in the order each span delivers them
}

// Full reports whether the rank yields the whole window.
func (w *Window) Full() bool { return w.Held == w.Size }
