package shard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Info is a shard and the number of samples it holds.
type Info struct {
	URL     string
	Samples int
	// Version and Size identify the object the count was taken from (source.Info's);
	// empty and 0 when unknown.
	Version string
	Size    int64
	// Offsets, when known, hold each sample's byte offset in the uncompressed tar
	// (Sample.Offset): a reader can start at any sample without reading the ones
	// before it. nil when unknown; otherwise len(Offsets) == Samples.
	Offsets []int64
	// Estimated means Samples is an estimate (from the object's size, see
	// index.Lookup.Estimate): the shard may hold more or fewer samples. A loader then
	// reads a shard's last span to the shard's end and pads or trims the last batches
	// to the planned number instead of failing on the difference.
	Estimated bool
}

// PlanConfig says which part of an epoch one rank reads. The zero value (with
// BatchSize set) is a single rank reading every shard in order.
type PlanConfig struct {
	Seed  uint64 // with Epoch, seeds the shard order
	Epoch int
	// Rank is this process's rank in [0, World); World is the number of ranks
	// (default 1).
	Rank, World int
	// Shuffle shuffles the shard order per (Seed, Epoch). Off, shards are read in the
	// order given.
	Shuffle bool
	// BatchSize is the number of samples per batch (required).
	BatchSize int
	// DropLast drops a last batch with fewer than BatchSize samples.
	DropLast bool
}

// Span is a run of consecutive samples of one shard: samples [Skip, Skip+Take).
type Span struct {
	URL   string
	Shard int // index in the shard list given to NewPlan
	Skip  int
	Take  int
}

// Plan is what one rank reads in one epoch, in order.
type Plan struct {
	Spans   []Span
	Samples int // samples this rank yields: the sum of the spans' Take
	Batches int // batches this rank yields; the same on every rank
	// Dropped is the number of samples of the epoch that no rank reads: the remainder
	// of the total divided by World (fewer than World samples).
	Dropped int
	// DroppedInBatch is the number of this rank's samples left out of the last,
	// partial batch when DropLast is set (the same on every rank).
	DroppedInBatch int
	// Estimated means some shard's count is an estimate (Info.Estimated): Samples and
	// Batches are what the plan expects, and a loader pads or trims its last batches
	// to Batches (or, for one rank, yields as many as the data makes).
	Estimated bool
}

// ErrNoSamples means there are fewer samples than ranks (or than one batch, with
// DropLast), so a rank would get nothing to read.
var ErrNoSamples = errors.New("shard: not enough samples for the ranks")

// NewPlan returns rank cfg.Rank's part of epoch cfg.Epoch.
//
// The epoch is the concatenation of all shards' samples, in an order shuffled per
// (Seed, Epoch) when Shuffle is set. It is cut into World contiguous slices of
// floor(total/World) samples each, one per rank, so that every rank yields the same
// number of samples and batches and none runs out early and hangs a distributed job.
// The total%World samples at the end of the epoch's order are read by no rank in
// that epoch (Plan.Dropped; fewer than World, and different samples each epoch when
// shuffling). Every other sample is read by exactly one rank. A rank reads whole
// shards except at most one at each end of its slice, whose leading or trailing
// samples belong to the neighbouring rank.
//
// The plan is a pure function of (shards, cfg).
func NewPlan(shards []Info, cfg PlanConfig) (Plan, error) {
	world := max(cfg.World, 1)
	if cfg.Rank < 0 || cfg.Rank >= world {
		return Plan{}, fmt.Errorf("shard: rank %d outside [0, %d)", cfg.Rank, world)
	}
	if cfg.BatchSize <= 0 {
		return Plan{}, fmt.Errorf("shard: batch size %d, want > 0", cfg.BatchSize)
	}
	order := make([]int, len(shards))
	total := 0
	for i, s := range shards {
		if s.Samples < 0 {
			return Plan{}, fmt.Errorf("shard: %s has %d samples", s.URL, s.Samples)
		}
		if total > math.MaxInt-s.Samples {
			return Plan{}, fmt.Errorf("shard: the sample counts of the shards overflow at %s (%d samples): a broken index?", s.URL, s.Samples)
		}
		order[i] = i
		total += s.Samples
	}
	if cfg.Shuffle {
		EpochRand(cfg.Seed, cfg.Epoch, 0).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	}
	per := total / world
	p := Plan{Samples: per, Dropped: total - per*world}
	for _, s := range shards {
		p.Estimated = p.Estimated || s.Estimated
	}
	if per == 0 {
		return Plan{}, fmt.Errorf("%w: %d samples in %d shards for %d ranks", ErrNoSamples, total, len(shards), world)
	}
	p.Batches = (per + cfg.BatchSize - 1) / cfg.BatchSize
	if cfg.DropLast {
		p.Batches = per / cfg.BatchSize
		p.DroppedInBatch = per % cfg.BatchSize
		if p.Batches == 0 {
			return Plan{}, fmt.Errorf("%w: %d samples per rank, fewer than one batch of %d", ErrNoSamples, per, cfg.BatchSize)
		}
	}
	lo, hi := cfg.Rank*per, (cfg.Rank+1)*per
	at := 0 // index in the epoch's order of the current shard's first sample
	for _, i := range order {
		n := shards[i].Samples
		start, end := max(lo, at), min(hi, at+n)
		if start < end {
			p.Spans = append(p.Spans, Span{URL: shards[i].URL, Shard: i, Skip: start - at, Take: end - start})
		}
		at += n
		if at >= hi {
			break
		}
	}
	return p, nil
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
