//go:build !linux

package pinned

import (
	"errors"
	"fmt"
	"runtime"
)

// newRing fails: slabs are memfds, which only Linux has.
func newRing(config) (*Ring, error) {
	return nil, fmt.Errorf("pinned: memfd slabs on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

func unmapSlabs([]*Slab) error { return nil }
