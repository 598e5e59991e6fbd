package shardload

import "github.com/shardload/shardload/internal/mem"

// mapChunk maps an arena chunk: huge pages, faulted in at once (see mem.MapHuge). An
// arena of 4 KiB pages made the whole loader a fifth slower (TLB misses in every
// copy through the buffers). nil when mapping fails (the caller allocates instead).
func mapChunk(n int) []byte { return mem.MapHuge(n) }

func unmapChunk(b []byte) { mem.Unmap(b) }
