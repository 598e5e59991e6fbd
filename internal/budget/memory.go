package budget

import (
	"errors"
	"fmt"
	"github.com/shardload/shardload/internal/tune"
	"math"
	"strconv"
	"strings"
	"unsafe"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/mem"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
)

// ErrMemory means a loader's settings need more memory than its budget
// (shardload.Config.Memory).
var ErrMemory = errors.New("shardload: memory budget too small")

// Shape is what the memory a loader's knobs take depends on, from its shards.
type Shape struct {
	Remote     bool  // some shard is read from a remote store: the fetch settings matter
	MaxShard   int64 // the largest shard's stored size; 0 when some size is unknown
	MaxSamples int   // the most samples a shard holds
	// Compressed: some shard is compressed as a whole, so that its samples take an
	// unknown multiple of its stored size. The caller finds it out from the shards'
	// bytes (shard.DetectCompression) where it matters (SmallShards).
	Compressed bool
	// Inflate is what one open shard's decompressor holds (shard.InflateBytes): 0
	// when the shards are stored, or their compression is not known.
	Inflate int64
	Decoded int64 // bytes a sample's image fields decode to, beyond its stored bytes
}

// ShapeOf returns the shape of infos decoded as fields, Compressed unset.
func ShapeOf(infos []shard.Info, fields []decode.Field) Shape {
	var d Shape
	for i := range fields {
		if fields[i].Kind == decode.KindImage {
			d.Decoded += fields[i].RowBytes()
		}
	}
	known := true
	for _, s := range infos {
		if i := strings.Index(s.URL, "://"); i > 0 && s.URL[:i] != "file" {
			d.Remote = true
		}
		if s.Size <= 0 {
			known = false
		}
		d.MaxShard = max(d.MaxShard, s.Size)
		d.MaxSamples = max(d.MaxSamples, s.Samples)
	}
	if !known {
		d.MaxShard = 0
	}
	return d
}

// smallCap is what one open shard's queue can hold at most when the shards are not
// compressed: their samples' bytes twice over, a buffer of at least 4 KiB and some
// bookkeeping per sample (as the queue counts them), and the decoded images; -1 when
// a size is unknown.
func (d Shape) smallCap() int64 {
	if d.MaxShard == 0 {
		return -1
	}
	return 2*d.MaxShard + int64(d.MaxSamples)*(8<<10+d.Decoded)
}

// SmallShards reports whether a queue of q bytes can hold a whole shard, so that
// whether the shards are compressed changes what the queues hold.
func (d Shape) SmallShards(q int64) bool {
	c := d.smallCap()
	return c >= 0 && c < q
}

// queueCap is the most one open shard's queue holds with q.
func (d Shape) queueCap(q int64) int64 {
	if d.Compressed || d.smallCap() < 0 {
		return q
	}
	return min(q, d.smallCap())
}

// partsCap is the most part buffers one open shard's read holds with k: none when
// reads are local, read as one stream, or every shard fits in one part.
func (d Shape) partsCap(k tune.Knobs) int64 {
	if !d.Remote || k.FetchParallel <= 1 || (d.MaxShard > 0 && d.MaxShard <= k.FetchPartSize) {
		return 0
	}
	parts := int64(k.FetchParallel)
	if d.MaxShard > 0 {
		parts = min(parts, (d.MaxShard+k.FetchPartSize-1)/k.FetchPartSize)
	}
	return parts * k.FetchPartSize
}

// Budget is the memory model of a loader: what its buffers hold at given knobs, with
// the settings the tuner does not change.
type Budget struct {
	Memory int64 // the budget
	// Held is what the loader holds whatever its knobs: its shards' index entries
	// (their URLs, versions and the offsets it keeps) and its plan, which grow with
	// the dataset.
	Held         int64
	Slabs        int
	SlabBytes    int64
	ShuffleBytes int64
	OpenShards   int
	Shape        Shape
	Pins         tune.Pins
}

// Of returns the most bytes the loader holds with knobs k: Held, and its buffers:
// the slab ring, the decoded samples (the open shards' queues, the shuffle windows
// and two batches being collated, plus an eighth for the buffers' size classes), the
// remote reads' parts and the decompressor of every open shard.
func (b Budget) Of(k tune.Knobs) int64 {
	return b.Held + int64(b.Slabs)*b.SlabBytes + b.Samples(k) + b.Fetch(k) + b.Inflate(k)
}

// Inflate is the open shards' decompressors' share of Of: each holds its window
// (Shape.Inflate), read-ahead shards too.
func (b Budget) Inflate(k tune.Knobs) int64 {
	return int64(b.OpenShards+k.ReadAhead) * b.Shape.Inflate
}

// Samples is the decoded samples' share of Of.
func (b Budget) Samples(k tune.Knobs) int64 {
	s := int64(b.OpenShards+k.ReadAhead)*b.Shape.queueCap(k.QueueBytes) + b.ShuffleBytes + 2*b.SlabBytes
	return s + s/8
}

// Fetch is the remote reads' parts' share of Of.
func (b Budget) Fetch(k tune.Knobs) int64 {
	return int64(b.OpenShards+k.ReadAhead) * b.Shape.partsCap(k)
}

// Least returns the least the knobs can take from set: those pinned as they are,
// the others as far as Start lowers them (for remote shards larger than a part, the
// worst case of set's fetch parts).
func (b Budget) Least(set tune.Knobs) tune.Knobs {
	least := tune.Knobs{QueueBytes: tune.MinQueueBytes, FetchParallel: 1, FetchPartSize: set.FetchPartSize}
	if b.Pins.Pinned(tune.QueueBytes) {
		least.QueueBytes = set.QueueBytes
	}
	if b.Pins.Pinned(tune.ReadAhead) {
		least.ReadAhead = set.ReadAhead
	}
	if b.Pins.Pinned(tune.FetchParallel) {
		least.FetchParallel = set.FetchParallel
	}
	return least
}

// Start returns the knobs a loader starts from: from's (a tuner's, or the settings),
// those not pinned lowered until they fit the budget, or an error wrapping ErrMemory
// that says what does not fit.
func (b Budget) Start(k tune.Knobs) (tune.Knobs, error) {
	pins := b.Pins
	for b.Of(k) > b.Memory {
		switch {
		case !pins.Pinned(tune.ReadAhead) && k.ReadAhead > 0:
			k.ReadAhead = 0
			if !pins.Pinned(tune.Workers) {
				k.Workers = min(k.Workers, b.OpenShards)
			}
		case !pins.Pinned(tune.FetchParallel) && b.Shape.partsCap(k) > 0:
			k.FetchParallel = 1
		case !pins.Pinned(tune.QueueBytes) && k.QueueBytes > tune.MinQueueBytes:
			k.QueueBytes = max(k.QueueBytes/2, tune.MinQueueBytes)
		default:
			ring := int64(b.Slabs) * b.SlabBytes
			return k, fmt.Errorf("%w: the budget is %s, the settings need %s: the shards' index entries and the plan %s, slabs %d x %s = %s, decoded samples %s (queues %d x %s, shuffle %s, two batches, size classes), fetch parts %s (%d open shards x %d x %s), decompressors %s (%d open shards x %s); raise the budget (--memory of shardload serve or bench, Config.Memory in Go) or lower what the settings name",
				ErrMemory, size(b.Memory), size(b.Of(k)), size(b.Held), b.Slabs, size(b.SlabBytes), size(ring),
				size(b.Samples(k)), b.OpenShards+k.ReadAhead, size(k.QueueBytes), size(b.ShuffleBytes),
				size(b.Fetch(k)), b.OpenShards+k.ReadAhead, k.FetchParallel, size(k.FetchPartSize),
				size(b.Inflate(k)), b.OpenShards+k.ReadAhead, size(b.Shape.Inflate))
		}
	}
	return k, nil
}

// size formats n for a message: exactly when it is a whole number of KiB (as the
// flags take sizes), else to a tenth of its largest unit.
func size(n int64) string {
	if n%1024 == 0 || n < 10<<10 {
		return mem.FormatSize(n)
	}
	f, unit := float64(n)/(1<<10), "KiB"
	if n >= 1<<30 {
		f, unit = float64(n)/(1<<30), "GiB"
	} else if n >= 1<<20 {
		f, unit = float64(n)/(1<<20), "MiB"
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + unit
}

// Check reports what makes b's settings impossible before anything is read: a slab
// larger than maxSlab, a ring that overflows or takes more than half of the machine's
// memory, or a budget under what the settings need at the least (from set).
func (b Budget) Check(maxSlab int64, set tune.Knobs) []error {
	var errs []error
	if b.SlabBytes > maxSlab && maxSlab > 0 {
		errs = append(errs, fmt.Errorf("SlabBytes %d is more than MaxSlabBytes %d", b.SlabBytes, maxSlab))
	}
	if b.SlabBytes > 0 && b.SlabBytes > math.MaxInt64/int64(b.Slabs) {
		return append(errs, fmt.Errorf("Slabs %d x SlabBytes %d overflows", b.Slabs, b.SlabBytes))
	}
	if phys := mem.Physical(); phys > 0 && int64(b.Slabs)*b.SlabBytes > phys/2 {
		errs = append(errs, fmt.Errorf("the slab ring of %d x %d bytes is more than half of this machine's memory (%d bytes)", b.Slabs, b.SlabBytes, phys))
	}
	least := b.Least(set)
	if need := b.Of(least); b.SlabBytes > 0 && need > b.Memory && need > 0 {
		errs = append(errs, fmt.Errorf("%w: Memory %s is less than the %s these settings need at the least: the shards' index entries and the plan %s, slabs %d x %s, shuffle %s and two batches, queues %d x %s (see MemoryBudget)",
			ErrMemory, size(b.Memory), size(need), size(b.Held), b.Slabs, size(b.SlabBytes), size(b.ShuffleBytes), b.OpenShards+least.ReadAhead, size(least.QueueBytes)))
	}
	return errs
}

// StartFrom is Start from the knobs the shared tuner s kept, when it has some, for
// those b does not pin (Workers at most openShards + ReadAhead), and k for the rest.
func (b Budget) StartFrom(s *tune.Shared, k tune.Knobs, openShards int) (tune.Knobs, error) {
	if kept, _, _, ok := s.Kept(); ok && kept.Workers > 0 {
		p := b.Pins
		if !p.Pinned(tune.ReadAhead) {
			k.ReadAhead = kept.ReadAhead
		}
		if !p.Pinned(tune.Workers) {
			k.Workers = min(kept.Workers, openShards+k.ReadAhead)
		}
		if !p.Pinned(tune.QueueBytes) {
			k.QueueBytes = kept.QueueBytes
		}
		if !p.Pinned(tune.FetchParallel) {
			k.FetchParallel = kept.FetchParallel
		}
		if !p.Pinned(tune.FetchPartSize) {
			k.FetchPartSize = kept.FetchPartSize
		}
	}
	return b.Start(k)
}

// Held is what a loader holds of its shards' index entries (each a shard.Info, its
// URL, version, and the sample offsets and member sizes it keeps, in the entries or
// read for its plan alone: plan.Plan.Loaded) and of its plan: it grows with the
// dataset, not with the knobs, and is counted in the memory budget.
func Held(infos []shard.Info, p *plan.Plan) int64 {
	n := int64(len(infos)) * int64(unsafe.Sizeof(shard.Info{}))
	for i := range infos {
		n += int64(len(infos[i].URL)+len(infos[i].Version)+8*len(infos[i].Offsets)) + infos[i].Members.Bytes()
	}
	for _, in := range p.Loaded() { // read for the plan alone (index.PlanLoaded)
		n += 8*int64(len(in.Offsets)) + in.Members.Bytes()
	}
	return n + p.Bytes()
}
