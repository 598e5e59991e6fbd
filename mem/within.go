package mem

import "unsafe"

// Within reports whether b, not empty, lies inside buf's first len(buf) bytes, and
// at which offset: whether a value is a view of a buffer (a sample's arena, a slab).
func Within(b, buf []byte) (int, bool) {
	if len(b) == 0 || len(buf) == 0 {
		return 0, false
	}
	off := uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	if off > uintptr(len(buf)) || uintptr(len(b)) > uintptr(len(buf))-off {
		return 0, false
	}
	return int(off), true
}
