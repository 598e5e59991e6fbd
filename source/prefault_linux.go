package source

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// prefault maps the pages of a new buffer in one call (MADV_POPULATE_WRITE) rather
// than one page fault per 4 KiB page on its first write. Best effort: kernels before
// 5.14 fault the pages in as usual.
func prefault(b []byte) {
	page := uintptr(unix.Getpagesize())
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	first := (start + page - 1) &^ (page - 1)
	end := (start + uintptr(len(b))) &^ (page - 1)
	if end > first {
		unix.Madvise(b[first-start:end-start], unix.MADV_POPULATE_WRITE)
	}
}
