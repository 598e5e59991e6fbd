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

func (r *Ring) grow(*Slab, int64) error { return errors.ErrUnsupported }

// HasCapIPCLock reports whether the calling thread has CAP_IPC_LOCK in its effective
// set, which lets mlock ignore RLIMIT_MEMLOCK (false where it cannot be known).
func HasCapIPCLock() bool { return false }
