package shardload

import (
	"golang.org/x/sys/unix"

	"github.com/shardload/shardload/internal/mem"
)

// mapChunk maps an arena chunk: huge pages, faulted in at once (see mem.MapHuge). An
// arena of 4 KiB pages made the whole loader a fifth slower (TLB misses in every
// copy through the buffers). nil when mapping fails (the caller allocates instead).
func mapChunk(n int) []byte { return mem.MapHuge(n) }

func unmapChunk(b []byte) { mem.Unmap(b) }

// physicalMemory returns the machine's memory in bytes, 0 when unknown.
func physicalMemory() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}
