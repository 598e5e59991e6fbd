package shardload

import (
	"runtime"
	"testing"
)

// The arena hands out buffers of their size class, carved from mapped chunks up to
// its cap, then falls back to the heap; recycled buffers are reused; release unmaps.
func TestBufPoolArena(t *testing.T) {
	p := bufPool{maxFree: 1 << 30, maxArena: 2 * arenaChunk}
	seen := map[*byte]bool{}
	var bufs [][]byte
	for range 3 * arenaChunk / (128 << 10) { // 1.5x the arena's cap in 128 KiB buffers
		b := p.get(100_000)
		if cap(b) != 128<<10 || len(b) != 0 {
			t.Fatalf("buffer len %d cap %d, want 0 and 128 KiB", len(b), cap(b))
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
	if runtime.GOOS == "linux" && (p.mapped != p.maxArena || len(p.chunks) != 2) {
		t.Errorf("mapped %d bytes in %d chunks, want the cap %d", p.mapped, len(p.chunks), p.maxArena)
	}
	if p.mapped > p.maxArena {
		t.Errorf("mapped %d bytes over the cap %d", p.mapped, p.maxArena)
	}
	// A recycled buffer is the next one handed out of its class.
	p.putBuf(bufs[5])
	if b := p.get(70_000); &b[:1][0] != &bufs[5][0] {
		t.Error("a recycled buffer was not reused")
	}
	// Larger than the arena's largest class: from the heap, same contract.
	if b := p.get(5 << 20); cap(b) != 8<<20 {
		t.Errorf("a 5 MB buffer has cap %d", cap(b))
	}
	p.release()
	if p.mapped != 0 || p.chunks != nil || p.held != 0 {
		t.Errorf("after release: mapped %d, %d chunks, %d held", p.mapped, len(p.chunks), p.held)
	}
}
