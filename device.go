package shardload

import (
	"context"
	"fmt"
	"github.com/shardload/shardload/internal/mem"
	"sync"

	"github.com/shardload/shardload/device"
)

// deviceHook is the loader's device-copy stage: after a batch is collated into its
// slab, the mixer hands the slab's used bytes to the stage (see package device).
type deviceHook struct {
	stage   *device.Stage
	regWarn sync.Once
}

// openDevice opens cfg.Device with device buffers as large as a slab can be.
func openDevice(cfg Config) (*device.Stage, error) {
	o := cfg.Device
	if o.BufferBytes == 0 {
		if cfg.Ring != nil {
			o.BufferBytes = cfg.Ring.SlabBytes()
		} else {
			// pinned rounds slabs up to a huge page (or the page size, which is less).
			o.BufferBytes = (cfg.SlabBytes + mem.HugePage - 1) / mem.HugePage * mem.HugePage
		}
	}
	if o.Logf == nil {
		o.Logf = cfg.Logf
	}
	s, err := device.Open(o)
	if err != nil {
		return nil, fmt.Errorf("shardload: %w", err)
	}
	return s, nil
}

// toDevice starts the copy of b to the device, registering its slab first. It waits
// while every device buffer holds a batch the consumer has not released.
func (l *Loader) toDevice(ctx context.Context, b *Batch) error {
	if err := l.dev.stage.Register(b.slab.Bytes()); err != nil {
		l.dev.regWarn.Do(func() {
			l.cfg.Logf("shardload: warning: %v; copies from unregistered slabs are staged by the driver (slower)", err)
		})
	}
	xfer, err := l.dev.stage.Copy(ctx, b.Data()[:b.Used])
	if err != nil {
		return fmt.Errorf("shardload: batch %d: %w", b.Seq, err)
	}
	b.xfer = xfer
	return nil
}

// closeDevice closes the stage after the loader's goroutines are done.
func (l *Loader) closeDevice() error {
	if l.dev.stage == nil {
		return nil
	}
	return l.dev.stage.Close()
}

// Transfer returns the batch's copy to the device (Config.Device): Wait on it before
// the device reads the batch at its Ptr. Release also hands its device buffer back.
// With the host backend (the default) it is complete at once and Ptr is the address
// of Data.
func (b *Batch) Transfer() *device.Transfer { return b.xfer }

// Device returns the loader's device-copy stage: its kind and description.
func (l *Loader) Device() *device.Stage { return l.dev.stage }

// DeviceStats returns the device-copy stage's counters: batches and bytes handed
// over, the device's copy time and rate, and how long consumers waited for copies.
func (l *Loader) DeviceStats() device.Stats { return l.dev.stage.Stats() }
