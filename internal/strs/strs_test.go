package strs

import (
	"fmt"
	"testing"
)

// Of returns strings equal to the bytes given, which keep their bytes however many
// follow them and whatever becomes of the bytes given, for chunks large and small.
func TestOf(t *testing.T) {
	for _, chunk := range []int{0, 4 << 10} {
		a := Arena{Chunk: chunk}
		size := max(chunk, 64<<10)
		var got, want []string
		b := make([]byte, 0, size)
		for i := range 20_000 {
			b = fmt.Appendf(b[:0], "%d-%x", i*7919, i)
			if i%1000 == 999 {
				b = append(b, make([]byte, size/8)...) // longer than a chunk holds well
			}
			got, want = append(got, a.Of(b)), append(want, string(b))
			clear(b)
		}
		if a.Of(nil) != "" {
			t.Fatal("Of(nil) is not empty")
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("chunk %d: string %d: %q, want %q", chunk, i, got[i], want[i])
			}
		}
	}
}

// A short string costs no allocation of its own: one a chunk.
func TestOfAllocs(t *testing.T) {
	a := Arena{Chunk: 8 << 10}
	name := []byte("train-000123/sample000045.tokens.npy")
	allocs := testing.AllocsPerRun(1000, func() { _ = a.Of(name) })
	// 37 bytes a name: 221 names a chunk of 8 KiB.
	if allocs > 0.01 {
		t.Errorf("%.3f allocations a string, want one a chunk (about 0.005)", allocs)
	}
}
