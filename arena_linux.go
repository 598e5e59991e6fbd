package shardload

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapChunk maps n bytes (a multiple of hugePage) of anonymous memory for the buffer
// arena, aligned to hugePage and advised to use transparent huge pages, and has the
// kernel fault all of it in with one call (MADV_POPULATE_WRITE, Linux 5.14 and
// later; best effort) rather than one fault per page on the loader's first pass over
// its buffers: a fault taken from user space is dear, dearer in a virtual machine.
// Huge pages matter there too: an arena of 4 KiB pages made the whole loader a fifth
// slower (TLB misses in every copy through the buffers). nil when mapping fails (the
// caller allocates instead).
func mapChunk(n int) []byte {
	size := uintptr(n + hugePage)
	p, err := unix.MmapPtr(-1, 0, nil, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil
	}
	// Keep the aligned n bytes, unmap the rest on either side.
	head := -uintptr(p) & (hugePage - 1)
	if head > 0 {
		unix.MunmapPtr(p, head)
	}
	start := unsafe.Add(p, head)
	if tail := size - head - uintptr(n); tail > 0 {
		unix.MunmapPtr(unsafe.Add(start, n), tail)
	}
	b := unsafe.Slice((*byte)(start), n)
	unix.Madvise(b, unix.MADV_HUGEPAGE)       // best effort
	unix.Madvise(b, unix.MADV_POPULATE_WRITE) // best effort
	return b
}

func unmapChunk(b []byte) { unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b))) }

// physicalMemory returns the machine's memory in bytes, 0 when unknown.
func physicalMemory() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}
