package shardload

import (
	"fmt"

	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/internal/tune"
)

// openDevice opens cfg.Device with device buffers as large as a slab.
func openDevice(cfg Config) (*device.Stage, error) {
	o := cfg.Device
	if o.BufferBytes == 0 {
		// pinned rounds slabs up to a huge page (or the page size, which is less).
		o.BufferBytes = tune.RoundSlab(cfg.SlabBytes)
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
