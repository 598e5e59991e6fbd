//go:build !linux || !cgo

package device

import (
	"fmt"
	"runtime"
)

// openDriver fails: the CUDA backend loads the driver through cgo, on Linux.
func openDriver(library string, ordinal int) (driver, error) {
	return nil, fmt.Errorf("%w: cannot load %s: this shardload was built without cgo or not for Linux (%s); "+
		"rebuild with CGO_ENABLED=1 for GPU %d, or use --device host", ErrNoDriver, library, runtime.GOOS, ordinal)
}
