package mem

import (
	"runtime"
	"testing"
	"unsafe"
)

// The arena hands out buffers of their size class, carved from mapped chunks up to
// its cap, then falls back to the heap; recycled buffers are reused; release unmaps.
func TestPoolArena(t *testing.T) {
	p := Pool{MaxFree: 1 << 30, MaxArena: 2 * arenaChunk}
	seen := map[*byte]bool{}
	var bufs [][]byte
	for range 3 * arenaChunk / (104 << 10) { // 1.5x the arena's cap in 104 KiB buffers
		b := p.Get(100_000)
		if cap(b) != 104<<10 || len(b) != 0 {
			t.Fatalf("buffer len %d cap %d, want 0 and 104 KiB", len(b), cap(b))
		}
		b = b[:cap(b)]
		b[0], b[len(b)-1] = 1, 2 // writable end to end
		first := &b[:1][0]
		if seen[first] {
			t.Fatal("a buffer handed out twice")
		}
		seen[first] = true
		bufs = append(bufs, b)
	}
	if runtime.GOOS == "linux" && (p.mapped != p.MaxArena || len(p.chunks) != 2) {
		t.Errorf("mapped %d bytes in %d chunks, want the cap %d", p.mapped, len(p.chunks), p.MaxArena)
	}
	if p.mapped > p.MaxArena {
		t.Errorf("mapped %d bytes over the cap %d", p.mapped, p.MaxArena)
	}
	for _, c := range p.chunks {
		if addr := uintptr(unsafe.Pointer(unsafe.SliceData(c))); addr%HugePage != 0 || len(c) != arenaChunk {
			t.Errorf("chunk at %#x of %d bytes: want %d bytes aligned to %d", addr, len(c), arenaChunk, HugePage)
		}
	}
	// A free buffer up to two classes larger serves before new memory.
	p.Put(bufs[7])
	if b := p.Get(95_000); &b[:1][0] != &bufs[7][0] || cap(b) != 104<<10 {
		t.Error("a free buffer one class larger was not used")
	}
	// A recycled buffer is the next one handed out of its class.
	p.Put(bufs[5])
	if b := p.Get(101_000); &b[:1][0] != &bufs[5][0] {
		t.Error("a recycled buffer was not reused")
	}
	// Larger than the arena's largest class: from the heap, same contract.
	if b := p.Get(5<<20 + 1); cap(b) != 5<<20+512<<10 {
		t.Errorf("a buffer of 5 MiB and a byte has cap %d", cap(b))
	}
	p.Release()
	if p.mapped != 0 || p.chunks != nil || p.held != 0 {
		t.Errorf("after release: mapped %d, %d chunks, %d held", p.mapped, len(p.chunks), p.held)
	}
}

// A size class is the smallest that holds the size asked for, at most an eighth
// larger (above 4 KiB), and each class's size maps back to it.
func TestSizeClasses(t *testing.T) {
	for c := range numClasses {
		if got := sizeClass(classSize(c)); got != c {
			t.Fatalf("sizeClass(classSize(%d) = %d) = %d", c, classSize(c), got)
		}
		if c > 0 && classSize(c) <= classSize(c-1) {
			t.Fatalf("class %d (%d bytes) is not larger than class %d (%d bytes)", c, classSize(c), c-1, classSize(c-1))
		}
	}
	if classSize(0) != 4<<10 || classSize(numClasses-1) != 1<<30 || classSize(maxArenaClass) != 4<<20 {
		t.Errorf("classes from %d to %d bytes, arena up to %d", classSize(0), classSize(numClasses-1), classSize(maxArenaClass))
	}
	for _, n := range []int{1, 4096, 4097, 8320, 9371, 100_000, 110_000, 120_000, 131_072, 131_073, 5 << 20, 1<<30 - 1} {
		c := sizeClass(n)
		size := classSize(c)
		if size < n || (c > 0 && classSize(c-1) >= n) {
			t.Errorf("size %d: class %d of %d bytes is not the smallest that holds it", n, c, size)
		}
		if n > 4096 && size > n+n/8 {
			t.Errorf("size %d: class of %d bytes wastes more than an eighth", n, size)
		}
	}
}

// A released Pool's chunks serve the next Pool, up to MaxIdleBytes: the next
// epoch's loader does not fault in fresh memory.
func TestPoolReusesReleasedChunks(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the arena maps chunks on Linux only")
	}
	idle.Lock() // start with none kept by the tests before
	for _, c := range idle.chunks {
		Unmap(c)
	}
	idle.chunks = nil
	idle.Unlock()
	const chunks = MaxIdleBytes/arenaChunk + 2
	fresh0, _ := Fresh()
	p := Pool{MaxFree: 1 << 40, MaxArena: chunks * arenaChunk}
	for range 2 * chunks {
		p.Get(arenaChunk / 2) // two to a chunk
	}
	fresh1, took := Fresh()
	if fresh1-fresh0 != chunks*arenaChunk || took <= 0 {
		t.Errorf("Fresh counts %d bytes (%v in all) for the first Pool's %d chunks, want %d", fresh1-fresh0, took, chunks, chunks*arenaChunk)
	}
	var first []*byte
	for _, c := range p.chunks {
		first = append(first, unsafe.SliceData(c))
	}
	if len(first) != chunks {
		t.Fatalf("%d chunks mapped, want %d", len(first), chunks)
	}
	p.Release()
	idle.Lock()
	kept := len(idle.chunks)
	idle.Unlock()
	if kept != MaxIdleBytes/arenaChunk {
		t.Fatalf("%d chunks kept after Release, want %d (MaxIdleBytes)", kept, MaxIdleBytes/arenaChunk)
	}
	q := Pool{MaxFree: 1 << 40, MaxArena: chunks * arenaChunk}
	defer q.Release()
	reused := 0
	for range 2 * chunks {
		b := unsafe.SliceData(q.Get(arenaChunk / 2)[:1])
		for _, f := range first {
			if b == f {
				reused++
			}
		}
	}
	if reused < kept { // (a fresh mapping may land where an unmapped chunk was)
		t.Errorf("the next Pool reused %d of the %d chunks kept", reused, kept)
	}
	// Only the chunks that were not kept are new.
	if fresh2, _ := Fresh(); fresh2-fresh1 != int64(chunks-kept)*arenaChunk {
		t.Errorf("Fresh counts %d bytes for the next Pool, which mapped %d chunks new", fresh2-fresh1, chunks-kept)
	}
}
