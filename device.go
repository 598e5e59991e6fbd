package shardload

import (
	"fmt"

	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/internal/tune"
)

// openDevice opens cfg.Device with device buffers as large as a slab.
func openDevice(cfg Config) (*device.Stage, error) {
	s, err := device.Open(tune.DeviceOptions(cfg.Device, cfg.SlabBytes, cfg.Logf))
	if err != nil {
		return nil, fmt.Errorf("shardload: %w", err)
	}
	return s, nil
}
