//go:build !linux || !cgo

package turbojpeg

import (
	"fmt"
	"runtime"
)

// cgoBuild tells the tests whether this build can load the library at all.
const cgoBuild = false

// Lib is a loaded TurboJPEG library. In this build none can be loaded: Open always
// fails, and the methods exist only so that callers compile.
type Lib struct{ path string }

// Open fails: the library is loaded through cgo, on Linux.
func Open(path string) (*Lib, error) {
	if path == "" {
		path = defaultNames[0]
	}
	return nil, fmt.Errorf("%w: cannot load %s: this binary was built without cgo or not for Linux (%s); "+
		"rebuild with CGO_ENABLED=1 to decode with libjpeg-turbo", ErrUnavailable, path, runtime.GOOS)
}

// Path returns the name or path of the library loaded.
func (l *Lib) Path() string { return l.path }

// Factors returns no factors: nothing is loaded in this build.
func (l *Lib) Factors() [][2]int { return nil }

// Header fails: nothing is loaded in this build.
func (l *Lib) Header(jpeg []byte) (Header, error) {
	return Header{}, fmt.Errorf("%w: built without cgo", ErrUnavailable)
}

// Decode fails: nothing is loaded in this build.
func (l *Lib) Decode(jpeg, dst []byte, width, height int, format PixelFormat, flags Flags) error {
	if _, err := checkDecode(jpeg, dst, width, height, format); err != nil {
		return err
	}
	return fmt.Errorf("%w: built without cgo", ErrUnavailable)
}
