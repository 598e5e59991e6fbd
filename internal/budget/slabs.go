package budget

import (
	"fmt"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/internal/tune"
	"sync"
	"sync/atomic"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/mem"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/wire"
)

// MinSlabBytes is the smallest slab sized from the batch: one huge page.
const MinSlabBytes = mem.HugePage

// RoundSlab rounds n up to a huge page, as the slab ring does.
func RoundSlab(n int64) int64 {
	return (n + mem.HugePage - 1) / mem.HugePage * mem.HugePage
}

// SlabSize returns the size of a slab sized from the batch: one batch of rows samples
// of fields, exact for fixed-size columns and, for ragged ones, the shards' mean
// stored sample size with a quarter more, rounded up to a huge page (MinSlabBytes at
// least).
func SlabSize(rows int, fields []decode.Field, infos []shard.Info) int64 {
	need := wire.FixedBytes(rows, fields)
	for i := range fields {
		if fields[i].RowBytes() < 0 {
			mean, ok := plan.MeanSampleBytes(infos)
			if !ok {
				mean = 64 << 10 // nothing known: a guess, grown if wrong
			}
			need += int64(rows) * mean * 5 / 4
			break
		}
	}
	return RoundSlab(max(need, MinSlabBytes))
}

// BatchError is CheckBatch's refusal of a batch too large for the slabs, with the
// figures a caller needs to say it in its own terms (a loader process names its
// trainers' settings, not Config's fields). It wraps ErrMemory.
type BatchError struct {
	Rows    int   // the batch's samples
	Need    int64 // bytes of slab the batch's fixed-size columns need, rounded as a slab is
	MaxSlab int64 // the largest a slab may be; the cause when Need > MaxSlab
	// Slabs, Least and Memory are set when the cause is the budget: Slabs slabs of Need
	// bytes and the other buffers at their least take Least, more than Memory.
	Slabs  int
	Least  int64
	Memory int64
	// MaxRows is the largest batch of these fields that fits (0: none does).
	MaxRows int
}

func (e *BatchError) Error() string {
	if e.Need > e.MaxSlab {
		return fmt.Sprintf("%v: a batch of %d samples of these fields needs %s of slab, more than --max-slab-size %s (Config.MaxSlabBytes); lower the batch size (%d samples fit) or raise the limit",
			ErrMemory, e.Rows, size(e.Need), size(e.MaxSlab), e.MaxRows)
	}
	return fmt.Sprintf("%v: a batch of %d samples of these fields needs %s of slab; %d slabs of it and the other buffers at their least take %s, more than the memory budget %s (--memory of shardload serve or bench, Config.Memory in Go); raise the budget, or lower the batch size (%d samples fit) or the slabs",
		ErrMemory, e.Rows, size(e.Need), e.Slabs, size(e.Least), size(e.Memory), e.MaxRows)
}

// Size formats n as this package's messages do: exactly when it is a whole number of
// KiB, else to a tenth of its largest unit (1.2GiB).
func Size(n int64) string { return size(n) }

// Unwrap returns ErrMemory.
func (e *BatchError) Unwrap() error { return ErrMemory }

// CheckBatch refuses, before the first batch and before any slab is allocated, a
// batch whose fixed columns alone (fixedBytes(rows) bytes for rows samples) do not
// fit: one slab larger than maxSlab, or a ring of them larger than the budget leaves
// with the other buffers at their least (from set). sized says b's slabs are sized
// from the batch, not given. The error is a *BatchError.
func (b Budget) CheckBatch(fixedBytes func(rows int) int64, rows int, maxSlab int64, set tune.Knobs, sized bool) error {
	fixed := fixedBytes(rows)
	if fixed <= b.SlabBytes && !sized {
		return nil // slabs given that hold it: Start checks that they fit
	}
	c := b
	c.SlabBytes = MinSlabBytes
	budgetFits := c.Of(c.Least(set)) <= c.Memory // else not the batch: the other settings do not fit (Start says which)
	fits := func(rows int) (need, least int64, ok bool) {
		need = max(RoundSlab(fixedBytes(rows)), b.SlabBytes)
		c.SlabBytes = need
		least = c.Of(c.Least(set))
		return need, least, need <= maxSlab && (!budgetFits || least <= c.Memory)
	}
	need, least, ok := fits(rows)
	if ok {
		return nil
	}
	e := &BatchError{Rows: rows, Need: need, MaxSlab: maxSlab}
	if need <= maxSlab {
		e.Slabs, e.Least, e.Memory = b.Slabs, least, b.Memory
	}
	// The largest batch that fits: the need grows with the rows.
	lo, hi := 0, rows
	for lo < hi {
		m := lo + (hi-lo+1)/2
		if _, _, ok := fits(m); ok {
			lo = m
		} else {
			hi = m - 1
		}
	}
	e.MaxRows = lo
	return e
}

// Slabs is a loader's slab sizing while it runs: the size its memory model counts,
// and how far a slab may grow for a batch larger than it.
type Slabs struct {
	budget Budget // SlabBytes: the size the slabs started at
	max    int64  // the largest a slab may be (Config.MaxSlabBytes, a device's buffers)
	device bool   // max is a device's buffers
	grown  func(need, from, to int64)
	bytes  atomic.Int64 // the largest slab's size: what the memory model counts per slab
	once   sync.Once
}

// NewSlabs returns the sizing of slabs of b.SlabBytes that may grow to maxSlab, or to
// a device's buffers of deviceMax bytes when smaller (0: none); grown is called the
// first time a slab grows.
func NewSlabs(b Budget, maxSlab, deviceMax int64, grown func(need, from, to int64)) *Slabs {
	s := &Slabs{budget: b, max: maxSlab, grown: grown}
	if deviceMax > 0 && deviceMax < maxSlab {
		s.max, s.device = deviceMax, true
	}
	s.bytes.Store(b.SlabBytes)
	return s
}

// Memory is Budget.Of with the slabs at their size now.
func (s *Slabs) Memory(k tune.Knobs) int64 {
	b := s.budget
	b.SlabBytes = s.bytes.Load()
	return b.Of(k)
}

// Bytes returns the largest slab's size.
func (s *Slabs) Bytes() int64 { return s.bytes.Load() }

// Grow returns the size a slab grows to for a batch of need bytes: with a little
// headroom, as long as every slab at that size and the other buffers at knobs k fit
// the budget, and no larger than the limit; the error (ErrMemory) names the batch's
// size when even need does not fit.
func (s *Slabs) Grow(need int64, k tune.Knobs) (int64, error) {
	b := s.budget
	fits := func(n int64) bool {
		c := b
		c.SlabBytes = n
		return n <= s.max && c.Of(k) <= b.Memory
	}
	n := RoundSlab(need + need/8)
	if !fits(n) {
		n = RoundSlab(need)
	}
	switch {
	case fits(n):
	case need > s.max && s.device:
		return 0, fmt.Errorf("%w: the batch needs %d bytes of slab, more than the device's buffers of %d bytes: lower the batch size, or give the device larger buffers", ErrMemory, need, s.max)
	case need > s.max:
		return 0, fmt.Errorf("%w: the batch needs %d bytes of slab, more than --max-slab-size %s (Config.MaxSlabBytes): lower the batch size, or raise the limit", ErrMemory, need, size(s.max))
	default:
		c := b
		c.SlabBytes = 0
		most := max(min((b.Memory-c.Of(k))/int64(max(b.Slabs+2, 1)), s.max), 0)
		return 0, fmt.Errorf("%w: the batch needs %d bytes of slab; within the memory budget %s (--memory of shardload serve or bench, Config.Memory in Go) and the other buffers, its %d slabs may grow to %d bytes at most: lower the batch size, or raise the budget",
			ErrMemory, need, size(b.Memory), b.Slabs, most)
	}
	if n > s.bytes.Load() {
		s.bytes.Store(n)
		s.once.Do(func() {
			if s.grown != nil {
				s.grown(need, b.SlabBytes, n)
			}
		})
	}
	return n, nil
}

// DeviceOptions returns o with its defaults for a loader of slabs of slabBytes that
// logs through logf: device buffers of a slab's size, rounded up to a huge page.
func DeviceOptions(o device.Options, slabBytes int64, logf func(string, ...any)) device.Options {
	if o.BufferBytes == 0 {
		o.BufferBytes = RoundSlab(slabBytes)
	}
	if o.Logf == nil {
		o.Logf = logf
	}
	return o
}
