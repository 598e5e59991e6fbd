package pipeline

// Where the work goes: each batch's copy to the device, the loader's threads' CPUs.

import (
	"context"
	"fmt"

	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/logs"
	"github.com/shardload/shardload/numa"
)

// Device returns the device stage batches are handed to (Params.Device).
func (pl *Pipeline) Device() *device.Stage { return pl.p.Device }

// toDevice starts the copy of b to the device, registering its slab first. It waits
// while every device buffer holds a batch the consumer has not released.
func (pl *Pipeline) toDevice(ctx context.Context, b *Batch) error {
	dev := pl.p.Device
	if dev == nil {
		return nil
	}
	if err := dev.Register(b.Slab.Bytes()); err != nil {
		pl.regWarn.Do(func() {
			pl.p.Logf("shardload: warning: %v; copies from unregistered slabs are staged by the driver (slower)", err)
		})
	}
	xfer, err := dev.Copy(ctx, b.Slab.Bytes()[:b.Used])
	if err != nil {
		return fmt.Errorf("shardload: batch %d: %w", b.Seq, err)
	}
	b.Transfer = xfer
	return nil
}

// placeThread wires the calling goroutine to a thread on the CPUs, when set, and
// returns what undoes it.
func (pl *Pipeline) placeThread() func() {
	if len(pl.p.CPUs) == 0 {
		return func() {}
	}
	unlock, err := numa.LockThread(pl.p.CPUs)
	if err != nil {
		pl.once("place", func() {
			pl.p.Logf("shardload: warning: loader threads not placed on CPUs %s: %v", numa.FormatCPUList(pl.p.CPUs), err)
		})
		return func() {}
	}
	return unlock
}

// once calls f unless a line of the kind what went to the logger already (logs.Once).
func (pl *Pipeline) once(what string, f func()) { logs.Once(pl.p.LogKey, what, f) }
