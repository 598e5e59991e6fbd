package pipeline

// The packed engine: batches of rows of tokens that a packed.Loader packs, each
// written into a slab of the ring and handed to the device stage like a collated
// batch.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/wire"
)

// Rows yields packed batches: a *packed.Loader, which the pipeline does not close.
// A batch written into its slab is given back with Release, for its buffers to be
// reused.
type Rows interface {
	Next(ctx context.Context) (*packed.Batch, error)
	Release(b *packed.Batch)
}

// pack writes the batches of pl.p.Packed into slabs until the epoch's end.
func (pl *Pipeline) pack(ctx context.Context) error {
	p := &pl.p
	select {
	case <-pl.ringReady:
	case <-ctx.Done():
		return ctx.Err()
	}
	if pl.ringErr != nil {
		return pl.ringErr
	}
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
		tb := mono()
		slab, err := pl.ring.Acquire(ctx)
		add(&pl.C.Backpressure, mono()-tb)
		if err != nil {
			return err
		}
		t0 = time.Now()
		db, err := wire.PackedLayout(slab.Bytes(), &pb.Batch, p.BatchSize, p.SeqLen)
		if errors.Is(err, wire.ErrSlabTooSmall) && p.Slabs != nil {
			if err = pl.grow(slab, wire.PackedBytes(p.BatchSize, p.SeqLen, pb.InputIDs == nil), int(pb.Seq)); err == nil {
				db, err = wire.PackedLayout(slab.Bytes(), &pb.Batch, p.BatchSize, p.SeqLen)
			}
		}
		add(&pl.C.Collate, time.Since(t0))
		seq, padded := pb.Seq, pb.Padded
		p.Packed.Release(pb)
		if err != nil {
			pl.ring.Release(slab)
			return fmt.Errorf("shardload: batch %d: %w", seq, err)
		}
		out := &Batch{Layout: db, Seq: int(seq), Padded: padded, Slab: slab, ring: pl.ring}
		if err := pl.toDevice(ctx, out); err != nil {
			out.Release()
			return err
		}
		pl.C.Samples.Add(int64(p.BatchSize - padded))
		pl.C.Padded.Add(int64(padded))
		pl.C.Batches.Add(1)
		pl.C.BytesOut.Add(db.Used)
		tb = mono()
		select {
		case pl.out <- msg{b: out}:
			add(&pl.C.Backpressure, mono()-tb)
		case <-ctx.Done():
			out.Release()
			return ctx.Err()
		}
	}
}
