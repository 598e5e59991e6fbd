package shardload

import "golang.org/x/sys/unix"

// mapChunk maps n bytes of anonymous memory for the buffer arena, advised to use
// transparent huge pages: the loader's first pass over its buffers then takes one
// fault per 2 MiB instead of one per 4 KiB, which in a virtual machine costs more
// than the copies it serves. nil when mapping fails (the caller allocates instead).
func mapChunk(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil
	}
	unix.Madvise(b, unix.MADV_HUGEPAGE) // best effort
	return b
}

func unmapChunk(b []byte) { unix.Munmap(b) }
