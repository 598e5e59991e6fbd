package mem

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// haveStream: AVX2, and the OS saving its registers (cpu.X86.HasAVX2 checks both).
var haveStream = cpu.X86.HasAVX2

// stream copies src into dst (len(dst) == len(src)), the bulk with non-temporal
// stores, 32 bytes at a time to a dst aligned to 32, then an SFENCE so that the bytes
// are visible to other cores before the caller publishes them. In Go assembly, not
// C: a cgo call of a member's copy (110 KB, about 15 us) let the scheduler hand the
// caller's P to another thread, and the loader of image shards spent 7% more CPU
// than with copy.
func stream(dst, src []byte) {
	n := len(src)
	head := min(int(-uintptr(unsafe.Pointer(unsafe.SliceData(dst)))&31), n)
	copy(dst[:head], src[:head])
	bulk := (n - head) &^ 127
	if bulk > 0 {
		streamAVX2(unsafe.Pointer(&dst[head]), unsafe.Pointer(&src[head]), uintptr(bulk))
	}
	copy(dst[head+bulk:], src[head+bulk:])
}

// streamAVX2 copies n bytes, a multiple of 128, from src to dst, aligned to 32, with
// non-temporal stores, and fences them.
//
//go:noescape
func streamAVX2(dst, src unsafe.Pointer, n uintptr)
