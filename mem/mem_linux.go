package mem

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Prefault has the kernel map the whole pages of b in one call (MADV_POPULATE_WRITE,
// Linux 5.14 and later) rather than one fault per 4 KiB page on its first write: a
// fault taken from user space is dear, dearer in a virtual machine. Best effort: the
// error is for callers that report it; older kernels fault the pages in as usual.
func Prefault(b []byte) error {
	page := uintptr(unix.Getpagesize())
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	first := (start + page - 1) &^ (page - 1)
	end := (start + uintptr(len(b))) &^ (page - 1)
	if end <= first {
		return nil
	}
	return unix.Madvise(b[first-start:end-start], unix.MADV_POPULATE_WRITE)
}

// MapHuge maps n bytes (a multiple of HugePage) of anonymous memory aligned to
// HugePage, advised to use transparent huge pages and prefaulted; nil when mapping
// fails (the caller allocates instead). Unmap frees it.
func MapHuge(n int) []byte { return mapAligned(n, true) }

// MapSmall is MapHuge with base pages: the memory is advised not to use huge pages
// (MADV_NOHUGEPAGE).
func MapSmall(n int) []byte { return mapAligned(n, false) }

func mapAligned(n int, huge bool) []byte {
	size := uintptr(n + HugePage)
	p, err := unix.MmapPtr(-1, 0, nil, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil
	}
	// Keep the aligned n bytes, unmap the rest on either side.
	head := -uintptr(p) & (HugePage - 1)
	if head > 0 {
		unix.MunmapPtr(p, head)
	}
	start := unsafe.Add(p, head)
	if tail := size - head - uintptr(n); tail > 0 {
		unix.MunmapPtr(unsafe.Add(start, n), tail)
	}
	b := unsafe.Slice((*byte)(start), n)
	advice := unix.MADV_NOHUGEPAGE
	if huge {
		advice = unix.MADV_HUGEPAGE
	}
	unix.Madvise(b, advice) // best effort
	Prefault(b)
	return b
}

// Unmap frees memory MapHuge or MapSmall returned.
func Unmap(b []byte) { unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b))) }

// Physical returns the machine's memory in bytes, 0 when unknown.
func Physical() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// AdviseHuge advises transparent huge pages (MADV_HUGEPAGE) over the whole huge
// pages of b, and reports whether b holds one. Best effort: the advice outlives b's
// use, for as long as the address range stays mapped.
func AdviseHuge(b []byte) bool {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	first := (start + HugePage - 1) &^ (HugePage - 1)
	end := (start + uintptr(len(b))) &^ (HugePage - 1)
	if end <= first {
		return false
	}
	return unix.Madvise(b[first-start:end-start], unix.MADV_HUGEPAGE) == nil
}
