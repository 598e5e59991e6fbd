package pipeline

// The packed engine: batches of rows of tokens that a packed.Loader packs straight
// into slabs of the ring (SlabBuffers), each handed to the device stage like a
// collated batch; and the packed loader's configuration of Options, its epoch
// planned (PlanPacked) or opened (OpenPacked) with the same checks and errors.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/wire"
)

// Packed is an epoch of packed rows opened (OpenPacked): its pipeline and rows, and
// what the loader says of it.
type Packed struct {
	*Pipeline
	Rows   *packed.Loader
	Plan   plan.Plan // the rank's batches (no spans of samples)
	Order  wire.OrderSettings
	Fields []decode.Field // the packed columns
	Resume wire.State     // the state the rank starts from
}

// OpenPacked opens an epoch of packed rows of o (o.Pack set): package packed plans
// and reads it, the stages write its batches into the slabs.
func OpenPacked(ctx context.Context, o Options) (*Packed, error) {
	pc, err := o.packedConfig()
	if err != nil {
		return nil, err
	}
	bufs := NewSlabBuffers() // the batches are written in the slabs
	pc.Buffers = bufs
	pk, err := packed.Open(ctx, pc)
	if err != nil {
		return nil, packedError(err)
	}
	st := pk.State()
	e := &Packed{Rows: pk, Fields: wire.PackedFields(o.Pack.SeqLen, o.Pack.Int32),
		Resume: wire.State{Epoch: st.Epoch, Order: st.Order, Samples: pk.Rows(), Rows: st.Rows}}
	if r := o.Resume; r != nil {
		e.Resume.Batches = r.Batches
	}
	o.sizeSlabs(o.SlabSize(nil, nil))
	dev, err := o.openDevice()
	if err != nil {
		pk.Close()
		return nil, err
	}
	batches := int(pk.Len())
	e.Plan = plan.Plan{Batches: batches, Samples: batches * o.BatchSize}
	e.Order = wire.OrderSettings{Dataset: st.Order, Shards: len(pc.URLs) + len(pc.Shards), Samples: pk.Rows(), Tokens: pk.Tokens(), Seed: o.Seed, Epoch: pc.Epoch,
		World: o.World, BatchSize: o.BatchSize, Shuffle: !o.NoShuffle, Mix: "pack " + o.Pack.String()}
	e.Pipeline = Start(ctx, Params{
		Packed: pk, Buffers: bufs, SeqLen: o.Pack.SeqLen, Int32IDs: o.Pack.Int32, BatchSize: o.BatchSize, Rank: o.Rank,
		Ring: o.Ring, RingOptions: o.ringOptions(), Queue: o.Slabs, Device: dev, CPUs: o.CPUs, Logf: o.Logf, LogKey: o.LogKey,
	})
	return e, nil
}

// PlanPacked plans the epoch of packed rows of o as OpenPacked does, reading no
// token.
func PlanPacked(ctx context.Context, o Options) (packed.Planned, error) {
	pc, err := o.packedConfig()
	if err != nil {
		return packed.Planned{}, err
	}
	p, err := packed.Plan(ctx, pc)
	if err != nil {
		return p, packedError(err)
	}
	return p, nil
}

// packedError is an error of package packed's planning as the loader's: ErrResume
// for a state that does not resume.
func packedError(err error) error {
	if errors.Is(err, packed.ErrResume) {
		return fmt.Errorf("%w: %w", ErrResume, err)
	}
	return fmt.Errorf("shardload: %w", err)
}

// packedConfig returns the packed loader's configuration of o.
func (o *Options) packedConfig() (packed.Config, error) {
	pc := packed.Config{
		URLs: o.URLs, Shards: o.Shards, Index: o.Index, Pack: o.Pack, BatchSize: o.BatchSize,
		Rank: o.Rank, World: o.World, Seed: o.Seed, Epoch: o.Epoch, NoShuffle: o.NoShuffle,
		OpenShards: o.OpenShards, ShuffleBuffer: o.ShuffleBuffer, ReadAhead: o.Slabs,
		Memory: o.Memory, Sources: o.Sources, Logf: o.Logf, Streams: o.Streams, EpochTokens: o.EpochTokens,
		Planned: o.Planned,
	}
	if o.ReadGap > 0 {
		pc.ReadGap = o.ReadGap
	}
	if r := o.Resume; r != nil {
		if err := CheckEpoch(o.Epoch, r); err != nil {
			return pc, err
		}
		switch {
		case r.Runs != "":
			return pc, fmt.Errorf("%w: the state is a position of an unpacked epoch (runs %q), not of packed rows", ErrResume, r.Runs)
		case r.Rows != 0 || r.Batches != 0:
			pc.Resume = &packed.State{Epoch: r.Epoch, Order: r.Order, Rows: r.Rows}
		}
		pc.Epoch = r.Epoch // at Rows 0: the start of its epoch, under any order
	}
	return pc, nil
}

// Rows yields packed batches: a *packed.Loader whose Config.Buffers are the
// pipeline's SlabBuffers. The pipeline closes it, before the ring its batches are
// written in.
type Rows interface {
	Next(ctx context.Context) (*packed.Batch, error)
	Close() error
	FindTime() time.Duration // the time Open took finding the documents
}

// SlabBuffers are the packed loader's buffers (packed.Config.Buffers): each batch
// is written in a slab of the pipeline's ring, where its columns lie (wire.PackedViews),
// so that its tokens are written once. Make it before the loader and give it to
// Start (Params.Buffers), which sets the ring it takes the slabs from.
type SlabBuffers struct {
	set chan struct{} // closed once pl is set
	pl  *Pipeline
}

// NewSlabBuffers returns SlabBuffers for Params.Buffers.
func NewSlabBuffers() *SlabBuffers { return &SlabBuffers{set: make(chan struct{})} }

// Get acquires a slab (the wait is back-pressure), grown to hold a packed batch when
// it is smaller, and returns a batch whose buffers are views of it (heap buffers
// copied into it later where the slab cannot be viewed as integers).
func (s *SlabBuffers) Get(ctx context.Context) (*packed.Batch, error) {
	select {
	case <-s.set:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	pl := s.pl
	p := &pl.p
	select {
	case <-pl.ringReady:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if pl.ringErr != nil {
		return nil, pl.ringErr
	}
	tb := mono()
	slab, err := pl.ring.Acquire(ctx)
	add(&pl.C.Backpressure, mono()-tb)
	if err != nil {
		return nil, err
	}
	need := wire.PackedBytes(p.BatchSize, p.SeqLen, p.Int32IDs)
	if slab.Size() < need && p.Slabs != nil {
		if err := pl.grow(slab, need, int(pl.C.Batches.Load())); err != nil {
			pl.ring.Release(slab)
			return nil, err
		}
	}
	b := &packed.Batch{Buf: slab}
	ok, err := wire.PackedViews(slab.Bytes(), &b.Batch, p.BatchSize, p.SeqLen, p.Int32IDs)
	if err != nil {
		pl.ring.Release(slab)
		return nil, err
	}
	if !ok {
		n := p.BatchSize * p.SeqLen
		b.PositionIDs, b.CuSeqlens = make([]int64, n), make([]int32, n+1)
		if p.Int32IDs {
			b.InputIDs32 = make([]int32, n)
		} else {
			b.InputIDs = make([]int64, n)
		}
	}
	return b, nil
}

// Put gives a batch's slab back to the ring.
func (s *SlabBuffers) Put(b *packed.Batch) {
	if slab, ok := b.Buf.(*pinned.Slab); ok {
		s.pl.ring.Release(slab)
	}
}

// pack hands the batches of pl.p.Packed, filled in their slabs, on until the
// epoch's end.
func (pl *Pipeline) pack(ctx context.Context) error {
	p := &pl.p
	for {
		t0 := time.Now()
		pb, err := p.Packed.Next(ctx)
		add(&pl.C.Fetch, time.Since(t0))
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		slab, ok := pb.Buf.(*pinned.Slab)
		if !ok {
			return fmt.Errorf("shardload: batch %d: a packed batch not in a slab (packed.Config.Buffers is not the pipeline's)", pb.Seq)
		}
		// The columns are in place: this writes max_seqlen and the padding only (and
		// copies the batch where the slab could not be viewed as integers).
		t0 = time.Now()
		db, err := wire.PackedLayout(slab.Bytes(), &pb.Batch, p.BatchSize, p.SeqLen)
		add(&pl.C.Collate, time.Since(t0))
		if err != nil {
			pl.ring.Release(slab)
			return fmt.Errorf("shardload: batch %d: %w", pb.Seq, err)
		}
		out := &Batch{Layout: db, Seq: int(pb.Seq), Padded: pb.Padded, Slab: slab, ring: pl.ring}
		if err := pl.toDevice(ctx, out); err != nil {
			out.Release()
			return err
		}
		pl.C.Samples.Add(int64(p.BatchSize - pb.Padded))
		pl.C.Padded.Add(int64(pb.Padded))
		pl.C.Batches.Add(1)
		pl.C.BytesOut.Add(db.Used)
		tb := mono()
		select {
		case pl.out <- msg{b: out}:
			add(&pl.C.Backpressure, mono()-tb)
		case <-ctx.Done():
			out.Release()
			return ctx.Err()
		}
	}
}
