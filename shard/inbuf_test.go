package shard

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
)

// readCounter is a stream (no ReadByte, no Seek) that counts the reads asked of it.
type readCounter struct {
	r     io.Reader
	reads int
}

func (c *readCounter) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}

// A compressed shard read from a stream is read through one buffer of
// compressedBufferSize below the decompressor: a read of the source per buffer, not
// one or two per compressed block (zstd) or per 8 KiB (gzip), with the samples as
// the uncompressed shard has them; Close gives the buffer back.
func TestCompressedStreamReadsInLargePieces(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var members []member
	for i := range 16 {
		data := make([]byte, 128<<10) // incompressible: the stored shard is as large
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		members = append(members, member{name: fmt.Sprintf("s%02d.bin", i), data: string(data)}, member{name: fmt.Sprintf("s%02d.cls", i), data: "7"})
	}
	plain := buildTar(t, members...)
	want := summary(readAll(t, NewReader(bytes.NewReader(plain), Options{})))
	for _, c := range []Compression{Zstd, Gzip} {
		t.Run(c.String(), func(t *testing.T) {
			stored := compress(t, c, plain)
			src := &readCounter{r: bytes.NewReader(stored)}
			r := NewReader(src, Options{URL: "x.tar"})
			if got := summary(readAll(t, r)); got != want {
				t.Fatalf("samples differ from the uncompressed shard's")
			}
			// The first read is the small buffer's (the magic bytes); then one a buffer,
			// and the reads that find the end.
			if most := 1 + len(stored)/compressedBufferSize + 3; src.reads > most {
				t.Errorf("%d reads of the source for %d stored bytes, want at most %d", src.reads, len(stored), most)
			}
			if r.inBuf == nil {
				t.Fatal("no buffer below the decompressor")
			}
			r.Close()
			if r.inBuf != nil {
				t.Error("the buffer was not given back at Close")
			}
		})
	}
}
