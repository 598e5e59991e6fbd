package mem

import (
	"bytes"
	"fmt"
	"testing"
)

// CopyOut copies what copy copies, whatever the sizes and alignments of both sides,
// and nothing past the shorter of them.
func TestCopyOut(t *testing.T) {
	src := make([]byte, 3*StreamMin+300)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	for _, n := range []int{0, 1, 31, 32, 127, StreamMin - 1, StreamMin, StreamMin + 1, StreamMin + 127, 2*StreamMin + 77} {
		for _, soff := range []int{0, 1, 31} {
			for _, doff := range []int{0, 3, 32, 33} {
				for _, short := range []int{0, 5} { // dst shorter than src by short
					t.Run(fmt.Sprintf("n%d/s%d/d%d/short%d", n, soff, doff, short), func(t *testing.T) {
						dst := bytes.Repeat([]byte{0xAA}, n+doff+64)
						want := bytes.Clone(dst)
						dn := max(n-short, 0)
						got := CopyOut(dst[doff:doff+dn], src[soff:soff+n])
						wn := copy(want[doff:doff+dn], src[soff:soff+n])
						if got != wn || !bytes.Equal(dst, want) {
							t.Fatalf("CopyOut copied %d (want %d); bytes differ from copy's: %v", got, wn, !bytes.Equal(dst, want))
						}
					})
				}
			}
		}
	}
}

// BenchmarkCopyOut copies 110 KB members (an image sample) from a 256 MiB source
// into a 256 MiB destination, both beyond the caches, as collating a batch does;
// against copy.
func BenchmarkCopyOut(b *testing.B) {
	const member = 110 << 10
	src, dst := make([]byte, 256<<20), make([]byte, 256<<20)
	for i := range src {
		src[i], dst[i] = byte(i), 1
	}
	for _, c := range []struct {
		name string
		f    func(d, s []byte) int
	}{{"copy", func(d, s []byte) int { return copy(d, s) }}, {"CopyOut", CopyOut}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(member)
			so, do := 0, 0
			for b.Loop() {
				if so+member > len(src) {
					so = 0
				}
				if do+member > len(dst) {
					do = 0
				}
				c.f(dst[do:do+member], src[so:so+member])
				so, do = so+member+7*4096, do+member
			}
		})
	}
}
