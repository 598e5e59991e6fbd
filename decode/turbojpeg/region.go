package turbojpeg

import (
	"fmt"
	"os"
	"sync"
)

// Region is a rectangle of an image's pixels: columns X to X+W, rows Y to Y+H.
type Region struct{ X, Y, W, H int }

// envLibjpeg names the environment variable DefaultRegions reads: the libjpeg
// library to load.
const envLibjpeg = "SHARDLOAD_LIBJPEG"

// defaultLibjpegNames are what OpenRegions("") tries: libjpeg-turbo's libjpeg 6.2
// API, the library PIL decodes with.
var defaultLibjpegNames = []string{"libjpeg.so.62"}

var dfltRegions struct {
	once sync.Once
	r    *Regions
	err  error
}

// DefaultRegions returns the libjpeg library loaded once per process from
// $SHARDLOAD_LIBJPEG (a path) or, when that is unset or empty, libjpeg.so.62. The
// result, error included, is remembered.
func DefaultRegions() (*Regions, error) {
	dfltRegions.once.Do(func() { dfltRegions.r, dfltRegions.err = OpenRegions(os.Getenv(envLibjpeg)) })
	return dfltRegions.r, dfltRegions.err
}

// checkRegion checks DecodeRegion's arguments before any C is called: dst must hold
// rows rows of width pixels.
func checkRegion(jpeg, dst []byte, width, height, den int, r Region, rows int) error {
	if len(jpeg) == 0 {
		return fmt.Errorf("turbojpeg: empty JPEG data")
	}
	if den != 1 && den != 2 && den != 4 && den != 8 {
		return fmt.Errorf("turbojpeg: scale 1/%d (want 1/1, 1/2, 1/4 or 1/8)", den)
	}
	if width <= 0 || height <= 0 || width > maxDim || height > maxDim {
		return fmt.Errorf("turbojpeg: bad output size %dx%d", width, height)
	}
	if r.X < 0 || r.Y < 0 || r.W <= 0 || r.H <= 0 || r.X+r.W > width || r.Y+r.H > height {
		return fmt.Errorf("turbojpeg: region %+v outside the %dx%d image", r, width, height)
	}
	if need := width * rows * 3; len(dst) < need {
		return fmt.Errorf("turbojpeg: destination holds %d bytes, %d rows of %d RGB pixels need %d", len(dst), rows, width, need)
	}
	return nil
}
