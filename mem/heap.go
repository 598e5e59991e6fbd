package mem

import (
	"runtime"
	"runtime/metrics"
)

// ReadyHeap readies about n bytes of the Go heap for large buffers that code outside
// this module allocates and keeps (the zstd decoders' history windows, megabytes
// each), where a Pool cannot serve them: it allocates n bytes, advises transparent
// huge pages over them (AdviseHuge), and has the garbage collector free them at
// once. The Go allocator places a large allocation at the lowest free addresses
// that fit, so the next ones made take that range and fault it in 2 MiB at a time
// instead of 4 KiB. A fault is dear where a virtual machine's host maps its memory
// lazily: 11 µs a 4 KiB page (2.9 ms a MB) against 1.6 ms a MB or less in huge
// pages, measured on the machine of BENCHMARKS.md ("The zstd decoders' windows in
// huge pages").
//
// It costs a garbage collection, so callers ready room for several buffers at once,
// and it does nothing where the live heap is over MaxReadyHeapLive: a collection
// of a large heap can cost more than the faults save. The range stays advised after
// the buffers are freed: Linux may then back it with huge pages again (khugepaged),
// so the process can keep up to n bytes resident there that the Go runtime has
// released. It returns whether the advice took (false off Linux, with transparent
// huge pages off, for n below two huge pages, or over a large heap).
func ReadyHeap(n int) bool {
	if n < 2*HugePage || liveHeap() > MaxReadyHeapLive {
		return false
	}
	// A huge page more, for the range's ends that are not whole huge pages.
	b := make([]byte, n+HugePage)
	ok := AdviseHuge(b)
	runtime.KeepAlive(b)
	if ok {
		runtime.GC()
	}
	return ok
}

// MaxReadyHeapLive is the live heap above which ReadyHeap does nothing.
const MaxReadyHeapLive = 256 << 20

// liveHeap returns the bytes of heap objects the last garbage collection marked.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
