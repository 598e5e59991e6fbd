package packed

import (
	"context"
	"fmt"
	"io"

	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/source"
)

// idxChunk is the bytes of an .idx read by one request: a 2 GB .idx (10^8
// documents) is 250 requests, and its parse holds one chunk.
const idxChunk = 8 << 20

// rangeReader is an io.ReaderAt over an object read by ranged requests of idxChunk
// bytes at the version it was found at, keeping the last chunk: reads that go
// forward through the object, as megatron.Parse's do array by array, cost one
// request per chunk.
type rangeReader struct {
	ctx     context.Context
	src     *source.Registry
	url     string
	version string
	size    int64
	buf     []byte
	off     int64 // the object offset of buf
}

func (r *rangeReader) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		o := off + int64(n)
		if o >= r.size {
			return n, io.EOF
		}
		if r.buf == nil || o < r.off || o >= r.off+int64(len(r.buf)) {
			if err := r.fill(o); err != nil {
				return n, err
			}
		}
		n += copy(p[n:], r.buf[o-r.off:])
	}
	return n, nil
}

// fill reads the chunk at off.
func (r *rangeReader) fill(off int64) error {
	n := min(int64(idxChunk), r.size-off)
	rc, err := r.src.OpenInfoRange(r.ctx, source.Info{URL: r.url, Size: r.size, Version: r.version}, off, n)
	if err != nil {
		return err
	}
	defer rc.Close()
	if int64(cap(r.buf)) < n {
		r.buf = make([]byte, n)
	}
	r.buf = r.buf[:n]
	if _, err := io.ReadFull(rc, r.buf); err != nil {
		r.buf = nil
		return fmt.Errorf("packed: %s bytes %d to %d: %w", redact.URL(r.url), off, off+n, err)
	}
	r.off = off
	return nil
}
