//go:build !linux || !cgo

package turbojpeg

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Regions is libjpeg-turbo's libjpeg API. In this build none can be loaded:
// OpenRegions always fails, and the methods exist only so that callers compile.
type Regions struct{ path string }

// OpenRegions fails: the library is loaded through cgo, on Linux.
func OpenRegions(path string) (*Regions, error) {
	if path == "" {
		path = defaultLibjpegNames[0]
	}
	return nil, fmt.Errorf("%w: cannot load %s: this binary was built without cgo or not for Linux (%s)", ErrUnavailable, path, runtime.GOOS)
}

// Path returns the name or path of the library loaded.
func (r *Regions) Path() string { return r.path }

// DecodeRegion fails: nothing is loaded in this build.
func (r *Regions) DecodeRegion(jpeg, dst []byte, width, height, den int, reg Region) (Region, error) {
	if err := checkRegion(jpeg, dst, width, height, den, reg, reg.H); err != nil {
		return Region{}, err
	}
	return Region{}, fmt.Errorf("%w: built without cgo", ErrUnavailable)
}

// DecodeRegionStrips fails: nothing is loaded in this build.
func (r *Regions) DecodeRegionStrips(jpeg, dst []byte, width, height, den int, reg Region, strip int, fn, ctx unsafe.Pointer) (Region, error) {
	return Region{}, fmt.Errorf("%w: built without cgo", ErrUnavailable)
}
