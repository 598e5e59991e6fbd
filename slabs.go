package shardload

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/internal/mem"
	"github.com/shardload/shardload/internal/pipeline"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/wire"
)

// DefaultMaxSlabBytes is Config.MaxSlabBytes's default: 1 GiB.
const DefaultMaxSlabBytes = 1 << 30

// minSlabBytes is the smallest slab sized from the batch: one huge page.
const minSlabBytes = mem.HugePage

// Fields returns the fields a loader of cfg decodes: cfg.Fields, or those of the
// first sample of the first shard of infos that has one (each with the decoder its
// extension suggests), as Open infers them.
func Fields(ctx context.Context, cfg Config, infos []shard.Info) ([]decode.Field, error) {
	if len(cfg.Fields) > 0 {
		return cfg.Fields, nil
	}
	cfg = cfg.withDefaults()
	return pipeline.InferFields(ctx, cfg.Sources, infos, shard.Options{MaxMemberSize: cfg.MaxMemberSize, MaxRatio: cfg.MaxRatio})
}

// SlabSize returns the size of the slabs of a loader of cfg over infos decoding
// fields: Config.SlabBytes when set; otherwise the size of one batch, exact for
// fixed-size columns (images, labels, npy fields with a shape) and, for ragged ones,
// the dataset's mean stored sample size (from the shards' sizes and counts) with a
// quarter more, rounded up to a huge page (2 MiB at least). A batch that turns out
// larger grows its slab while the loader runs (see Config.MaxSlabBytes).
func SlabSize(cfg Config, infos []shard.Info, fields []decode.Field) int64 {
	if cfg.SlabBytes > 0 {
		return cfg.SlabBytes
	}
	cfg = cfg.withDefaults()
	need := fixedBatchBytes(cfg.BatchSize, fields)
	ragged := false
	for i := range fields {
		ragged = ragged || fields[i].RowBytes() < 0
	}
	if ragged {
		var bytes, samples int64
		for _, s := range infos {
			if s.Size > 0 && s.Samples > 0 {
				bytes += s.Size
				samples += int64(s.Samples)
			}
		}
		mean := int64(64 << 10) // nothing known: a guess, grown if wrong
		if samples > 0 {
			mean = bytes / samples
		}
		need += int64(cfg.BatchSize) * mean * 5 / 4
	}
	return roundSlab(max(need, minSlabBytes))
}

// fixedBatchBytes is what a batch of rows takes in a slab besides its ragged columns'
// bytes: the fixed columns, every ragged column's offsets, keys of up to 64 bytes,
// and each column's alignment.
func fixedBatchBytes(rows int, fields []decode.Field) int64 {
	n := int64(rows) * 64 // keys
	for i := range fields {
		if rb := fields[i].RowBytes(); rb >= 0 {
			n += int64(rows) * rb
		} else {
			n += 8 * int64(rows+1)
		}
		n += 2 * wire.Align
	}
	return n + 8*int64(rows+1) + 2*wire.Align
}

// roundSlab rounds n up to a huge page, as the ring does.
func roundSlab(n int64) int64 {
	return (n + mem.HugePage - 1) / mem.HugePage * mem.HugePage
}

// slabs is a loader's slab sizing while it runs: the size its memory model counts,
// and how far a slab may grow for a batch larger than it.
type slabs struct {
	cfg   Config
	shape dataShape
	bytes atomic.Int64 // the largest slab's size: what the memory model counts per slab
	limit int64        // the device's buffers, when batches are copied to one; 0: none
	once  sync.Once
}

// memoryOf is cfg.memoryOf with the slabs at their size now.
func (s *slabs) memoryOf(k tune.Knobs) int64 {
	c := s.cfg
	c.SlabBytes = s.bytes.Load()
	return c.memoryOf(k, s.shape)
}

// checkBatch refuses, before the first batch, a batch size whose fixed columns alone
// do not fit: one slab larger than MaxSlabBytes, or a ring of them larger than the
// memory budget leaves with the other buffers at their least. sized says the slabs
// were sized from the batch (SlabSize), not given.
func (cfg Config) checkBatch(fields []decode.Field, d dataShape, sized bool) error {
	need := fixedBatchBytes(cfg.BatchSize, fields)
	if need <= cfg.SlabBytes && !sized {
		return nil // slabs given that hold it: startKnobs checks that they fit
	}
	need = max(roundSlab(need), cfg.SlabBytes)
	if need > cfg.MaxSlabBytes {
		return fmt.Errorf("%w: a batch of %d samples of these fields needs %s of slab, more than --max-slab-size %s (Config.MaxSlabBytes); lower the batch size or raise the limit",
			ErrMemory, cfg.BatchSize, sizeString(need), sizeString(cfg.MaxSlabBytes))
	}
	c := cfg
	c.SlabBytes = minSlabBytes
	if c.memoryOf(leastKnobs(c), d) > c.Memory {
		return nil // not the batch: the other settings do not fit (startKnobs says which)
	}
	c.SlabBytes = need
	if least := c.memoryOf(leastKnobs(c), d); least > c.Memory {
		return fmt.Errorf("%w: a batch of %d samples of these fields needs %s of slab; %d slabs of it and the other buffers at their least take %s, more than the memory budget %s (--memory, Config.Memory); raise the budget, or lower the batch size or the slabs",
			ErrMemory, cfg.BatchSize, sizeString(need), cfg.Slabs, sizeString(least), sizeString(cfg.Memory))
	}
	return nil
}

// grow returns the size a slab grows to for a batch of need bytes: with a little
// headroom, as long as every slab at that size and the other buffers at the knobs in
// effect fit the memory budget, and no larger than MaxSlabBytes (and a device's
// buffers); an error names the batch's size when even need does not fit.
func (s *slabs) grow(need int64, k tune.Knobs) (int64, error) {
	cfg := s.cfg
	limit := cfg.MaxSlabBytes
	if s.limit > 0 {
		limit = min(limit, s.limit)
	}
	fits := func(size int64) bool {
		c := cfg
		c.SlabBytes = size
		return size <= limit && c.memoryOf(k, s.shape) <= cfg.Memory
	}
	size := roundSlab(need + need/8)
	if !fits(size) {
		size = roundSlab(need)
	}
	switch {
	case fits(size):
	case need > limit && limit < cfg.MaxSlabBytes:
		return 0, fmt.Errorf("%w: the batch needs %d bytes of slab, more than the device's buffers of %d bytes: lower the batch size, or give the device larger buffers", ErrMemory, need, limit)
	case need > limit:
		return 0, fmt.Errorf("%w: the batch needs %d bytes of slab, more than --max-slab-size %s (Config.MaxSlabBytes): lower the batch size, or raise the limit", ErrMemory, need, sizeString(limit))
	default:
		return 0, fmt.Errorf("%w: the batch needs %d bytes of slab; within the memory budget %s (--memory, Config.Memory) and the other buffers, its %d slabs may grow to %d bytes at most: lower the batch size, or raise the budget",
			ErrMemory, need, sizeString(cfg.Memory), cfg.Slabs, s.most(k, limit))
	}
	if size > s.bytes.Load() {
		s.bytes.Store(size)
		s.once.Do(func() {
			cfg.Logf("shardload: rank %d: a batch of %s did not fit the slabs of %s: they grow to %s as batches need (size them up front with --slab-size, Config.SlabBytes or slab_bytes=)",
				cfg.Rank, sizeString(need), sizeString(cfg.SlabBytes), sizeString(size))
		})
	}
	return size, nil
}

// most is the largest slab the budget allows at k, for messages.
func (s *slabs) most(k tune.Knobs, limit int64) int64 {
	c := s.cfg
	c.SlabBytes = 0
	left := (c.Memory - c.memoryOf(k, s.shape)) / int64(max(c.Slabs+2, 1))
	return max(min(left, limit), 0)
}

// deviceLimit is the largest slab a device stage can copy (its buffers), 0 for none.
func deviceLimit(dev *device.Stage, o device.Options) int64 {
	if dev == nil || dev.Kind() == device.Host {
		return 0
	}
	return o.BufferBytes
}
