package shardload

import "golang.org/x/sys/unix"

// mapChunk maps n bytes of anonymous memory for the buffer arena, advised to use
// transparent huge pages, and has the kernel fault all of it in with one call
// (MADV_POPULATE_WRITE, Linux 5.14 and later; best effort) rather than one fault per
// page on the loader's first pass over its buffers: a fault taken from user space is
// dear, dearer in a virtual machine. Huge pages matter there too: an arena of 4 KiB
// pages made the whole loader a fifth slower (TLB misses in every copy through the
// buffers). nil when mapping fails (the caller allocates instead).
func mapChunk(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil
	}
	unix.Madvise(b, unix.MADV_HUGEPAGE)       // best effort
	unix.Madvise(b, unix.MADV_POPULATE_WRITE) // best effort
	return b
}

func unmapChunk(b []byte) { unix.Munmap(b) }
