package mem

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// vmFlags returns the VmFlags of the mapping of this process that holds addr.
func vmFlags(t *testing.T, addr uintptr) []string {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	inside := false
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 { // a mapping's first line
			inside = addr >= lo && addr < hi
			continue
		}
		if flags, ok := strings.CutPrefix(line, "VmFlags:"); ok && inside {
			return strings.Fields(flags)
		}
	}
	t.Fatalf("no mapping holds %#x (%v)", addr, sc.Err())
	return nil
}

// Once a chunk's huge pages faulted in slowly, the arena's next chunks are mapped
// with base pages (advised MADV_NOHUGEPAGE: VmFlags "nh"); before, with huge pages
// advised (not "nh"; "hg" where the kernel has transparent huge pages).
func TestPoolGivesUpDearHugePages(t *testing.T) {
	idle.Lock() // chunks mapped new, not ones earlier tests left
	for _, c := range idle.chunks {
		Unmap(c)
	}
	idle.chunks = nil
	idle.Unlock()
	defer hugeDear.Store(hugeDear.Load())
	thp := false
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err == nil && !strings.Contains(string(b), "[never]") {
		thp = true
	}

	hugeDear.Store(false)
	p := Pool{MaxFree: 1 << 30, MaxArena: 4 * arenaChunk}
	defer p.Release()
	b := p.Get(arenaChunk / 2) // the largest class the arena carves: two to a chunk
	p.Get(arenaChunk / 2)
	flags := vmFlags(t, uintptr(unsafe.Pointer(unsafe.SliceData(b[:1]))))
	if slices.Contains(flags, "nh") || thp && !slices.Contains(flags, "hg") {
		t.Errorf("a chunk mapped while huge pages are cheap has VmFlags %v", flags)
	}

	hugeDear.Store(true)
	b = p.Get(arenaChunk / 2) // the next chunk
	flags = vmFlags(t, uintptr(unsafe.Pointer(unsafe.SliceData(b[:1]))))
	if !slices.Contains(flags, "nh") || slices.Contains(flags, "hg") {
		t.Errorf("a chunk mapped once huge pages were dear has VmFlags %v, want base pages (nh)", flags)
	}
	b = b[:cap(b)]
	b[0], b[len(b)-1] = 1, 2 // writable end to end
	if len(p.chunks) != 2 {
		t.Errorf("%d chunks mapped, want 2", len(p.chunks))
	}
}

// The rate that decides: 8 MiB faulted in at 0.26 GB/s is slow (the virtual
// machines measured), at 2 GB/s and at 8 GB/s is not.
func TestSlowFaults(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		slow bool
	}{{32 * time.Millisecond, true}, {4 * time.Millisecond, false}, {time.Millisecond, false}} {
		if got := slowFaults(8<<20, tc.d); got != tc.slow {
			t.Errorf("8 MiB in %v: slow %v, want %v", tc.d, got, tc.slow)
		}
	}
}

// After ReadyHeap, the next large allocation lies in memory advised to use huge
// pages (VmFlags "hg"), where the kernel has transparent huge pages. It runs in a
// process of its own, whose heap has no free range below the readied one that
// earlier tests left.
func TestReadyHeap(t *testing.T) {
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil || strings.Contains(string(b), "[never]") {
		t.Skipf("transparent huge pages are off here (%q, %v)", b, err)
	}
	if os.Getenv("MEM_READY_HEAP_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReadyHeap$", "-test.v")
		cmd.Env = append(os.Environ(), "MEM_READY_HEAP_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestReadyHeap") {
			t.Fatalf("the test in a process of its own: %v\n%s", err, out)
		}
		return
	}
	before := make([]byte, 8<<20)
	if slices.Contains(vmFlags(t, uintptr(unsafe.Pointer(unsafe.SliceData(before)))), "hg") {
		t.Fatal("the heap is advised to use huge pages before ReadyHeap: the check below proves nothing")
	}
	if !ReadyHeap(32 << 20) {
		t.Fatal("ReadyHeap(32 MiB) = false on a kernel with transparent huge pages")
	}
	var after [3][]byte
	for i := range after {
		after[i] = make([]byte, 8<<20)
		mid := uintptr(unsafe.Pointer(unsafe.SliceData(after[i]))) + 4<<20
		if flags := vmFlags(t, mid); !slices.Contains(flags, "hg") {
			t.Errorf("allocation %d of 8 MiB after ReadyHeap(32 MiB) has VmFlags %v, want huge pages advised (hg)", i, flags)
		}
	}
	runtime.KeepAlive(before)
}
