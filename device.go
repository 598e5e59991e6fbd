package shardload

import (
	"fmt"

	"github.com/shardload/shardload/device"
)

// openDevice opens cfg.Device with device buffers as large as a slab can be, and
// returns the options it opened it with.
func openDevice(cfg Config) (*device.Stage, device.Options, error) {
	o := cfg.Device
	if o.BufferBytes == 0 {
		// pinned rounds slabs up to a huge page (or the page size, which is less).
		o.BufferBytes = roundSlab(cfg.SlabBytes)
	}
	if o.Logf == nil {
		o.Logf = cfg.Logf
	}
	s, err := device.Open(o)
	if err != nil {
		return nil, o, fmt.Errorf("shardload: %w", err)
	}
	return s, o, nil
}
