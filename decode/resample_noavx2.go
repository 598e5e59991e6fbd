//go:build !amd64 || !cgo

package decode

import "unsafe"

// haveAVX2 is false: the vector passes are built for amd64 with cgo only.
const haveAVX2 = false

// horizontalAVX2 does nothing in this build: the Go pass runs.
func horizontalAVX2(tmp, src []byte, stride, y0, y1 int, a *axis, flip bool) bool { return false }

// verticalAVX2 does nothing in this build: the Go pass runs.
func verticalAVX2(dst, rows []byte, w, stride, base int, a *axis) bool { return false }

// hstrip runs no pass in this build.
type hstrip struct{}

// start returns nils: the decode keeps its rows for the Go pass.
func (h *hstrip) start(tmp []byte, y0, y1 int, a *axis, flip bool) (fn, ctx unsafe.Pointer) {
	return nil, nil
}

// done does nothing.
func (h *hstrip) done() {}
