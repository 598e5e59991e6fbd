package cache

import (
	"fmt"
	"io"
	"testing"
)

// BenchmarkWarmRead reads 256 MiB of disk entries (64 of 4 MiB) that are in the
// page cache, every block checked as it is served, in three patterns of reads:
// "tar" as the shard reader reads an uncompressed shard from a cache entry (a
// 512-byte header, then a member of 3 KiB to 600 KiB read whole into the caller's
// buffer, then its padding), and plain reads of 32 KiB and of 1 MiB. The figures of
// BENCHMARKS.md ("Cache verification on every read") come from it.
func BenchmarkWarmRead(b *testing.B) {
	const entries, size = 64, 4 << 20
	up := newFake()
	urls := make([]string, entries)
	for i := range urls {
		urls[i] = fmt.Sprintf("s3://b/bench-%03d.tar", i)
		up.put(urls[i], randBytes(uint64(1000+i), size), "v1")
	}
	c, err := New(Options{Dir: b.TempDir(), DiskBytes: 1 << 30, Logf: b.Logf}, up)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	// Fill, then read once more, so that every entry is a disk hit in the page cache.
	for range 2 {
		for _, u := range urls {
			readOne(b, c, u, func(r io.Reader, buf []byte) error {
				_, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{r}, buf)
				return err
			})
		}
	}
	members := []int{3 << 10, 40 << 10, 150 << 10, 600 << 10}
	for _, p := range []struct {
		name string
		read func(r io.Reader, buf []byte) error
	}{
		{"tar", func(r io.Reader, buf []byte) error {
			for i := 0; ; i++ {
				if _, err := io.ReadFull(r, buf[:512]); err != nil {
					return eofOK(err)
				}
				n := members[i%len(members)]
				n += (512 - n%512) % 512
				if _, err := io.ReadFull(r, buf[:n]); err != nil {
					return eofOK(err)
				}
			}
		}},
		{"32KiB", readsOf(32 << 10)},
		{"1MiB", readsOf(1 << 20)},
	} {
		b.Run(p.name, func(b *testing.B) {
			b.SetBytes(entries * size)
			b.ReportAllocs()
			for b.Loop() {
				for _, u := range urls {
					readOne(b, c, u, p.read)
				}
			}
			if st := c.Stats(); st.Fetches != entries || st.Corrupt != 0 {
				b.Fatalf("stats %+v: want only the first fetches, nothing corrupt", st)
			}
		})
	}
}

// readsOf returns a read pattern of reads of n bytes.
func readsOf(n int) func(io.Reader, []byte) error {
	return func(r io.Reader, buf []byte) error {
		for {
			if _, err := r.Read(buf[:n]); err != nil {
				return eofOK(err)
			}
		}
	}
}

func eofOK(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return nil
	}
	return err
}

var benchBuf = make([]byte, 1<<20)

// readOne opens url and reads it with read.
func readOne(b *testing.B, c *Cache, url string, read func(io.Reader, []byte) error) {
	r, err := c.Open(b.Context(), url)
	if err != nil {
		b.Fatal(err)
	}
	if err := read(r, benchBuf); err != nil {
		b.Fatal(err)
	}
	r.Close()
}
