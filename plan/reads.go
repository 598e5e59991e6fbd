package plan

import (
	"math/bits"
	"slices"
	"sort"
)

// ShardReads is when a reader of an order reads a shard: how far into the order (in
// samples counted from 1, to the window) it reads the shard's first and its last
// sample still to read.
type ShardReads struct {
	Shard       int // an index in the shard list given to NewOrder
	First, Last int64
}

// Reads returns the shards that have samples in the windows of the order from the
// one holding position from on, each with where the order takes its first and its
// last sample (from that window on), in the order of their first reads: the reads
// a cache that evicts by next use wants announced. It is computed from the lanes'
// progress, without a walk of the windows: a shard's positions are where its lane
// reaches its samples, the nominal cuts of the windows that take them (window j
// takes a lane's samples at the cuts in (cut(j), cut(j+1)]), so that shards read in
// the same window are ordered by where their lanes reach them, then by lane.
// Shards without samples are left out.
func (o *Order) Reads(from int64) []ShardReads {
	if from >= o.total {
		return nil
	}
	from = max(from, 0)
	j, _, _ := o.window(from)
	x0 := o.cut(j)
	type reach struct {
		ShardReads
		lane int
	}
	var rs []reach
	for l, ln := range o.lanes {
		if ln.n == 0 {
			continue
		}
		p0 := o.progress(l, x0) // lane l's samples before window j
		// The shards of the lane still to read: from the one holding its sample p0.
		k := sort.Search(len(o.perm), func(k int) bool { return o.starts[k+1] > ln.start+p0 })
		for ; k < len(o.perm) && o.starts[k] < ln.start+ln.n; k++ {
			if o.starts[k+1] == o.starts[k] {
				continue // no samples
			}
			a := max(o.starts[k]-ln.start, p0) // its first sample still to read, in the lane
			b := o.starts[k+1] - ln.start      // past its last
			// The least cut x at which the lane has taken sample a: progress(l, x) > a.
			rs = append(rs, reach{ShardReads{Shard: int(o.perm[k]), First: mulDivUp(a+1, o.total, ln.n), Last: mulDivUp(b, o.total, ln.n)}, l})
		}
	}
	slices.SortStableFunc(rs, func(a, b reach) int {
		if a.First != b.First {
			if a.First < b.First {
				return -1
			}
			return 1
		}
		return a.lane - b.lane
	})
	out := make([]ShardReads, len(rs))
	for i, r := range rs {
		out[i] = r.ShardReads
	}
	return out
}

// mulDivUp returns a*b/c rounded up, for non-negative a, b and positive c, where the
// result fits in 64 bits.
func mulDivUp(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, r := bits.Div64(hi, lo, uint64(c))
	if r != 0 {
		q++
	}
	return int64(q)
}
