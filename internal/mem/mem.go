// Package mem holds the memory mechanisms several stages share, each defined once:
// the huge page size buffers are aligned to, faulting a buffer's pages in with one
// call, and mapping huge-page-aligned chunks for buffer arenas.
package mem

// HugePage is the size of a transparent huge page that buffers are aligned and
// rounded to: the x86-64 (and 4 KiB-page arm64) PMD size.
const HugePage = 2 << 20
