package shard

// Counting, timing and capping the bytes read, stored and inflated.

import (
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// Times returns the time spent so far reading the underlying reader (fetch) and
// inflating a compressed shard (not counting fetch). Zero unless Options.Timing.
func (r *Reader) Times() (fetch, inflate time.Duration) {
	fetch = r.rawIn.dur
	if r.comp != None {
		inflate = max(r.tarIn.dur-fetch, 0)
	}
	return fetch, inflate
}

// clockBase anchors mono.
var clockBase = time.Now()

// mono returns a monotonic timestamp for timing reads: one clock read, where
// time.Now takes two (wall and monotonic). Shards of small samples time several
// reads per sample.
func mono() time.Duration { return time.Since(clockBase) }

// counter counts the bytes read through it and remembers the first error other than
// io.EOF that its source returned. With a ratio cap (the tar stream of a compressed
// shard), it fails a read that takes the count beyond ratio times the stored bytes
// read (raw), or beyond floor if that is more.
type counter struct {
	r     io.Reader
	n     int64
	err   error
	timed bool
	dur   time.Duration // time spent in r.Read, when timed

	limit int64 // 0: no cap; else a count within the cap, rechecked when n passes it
	ratio float64
	floor int64
	raw   *counter
}

func (c *counter) Read(p []byte) (int, error) {
	var t0 time.Duration
	if c.timed {
		t0 = mono()
	}
	n, err := c.r.Read(p)
	if c.timed {
		c.dur += mono() - t0
	}
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	if c.limit != 0 && c.n > c.limit {
		if cerr := c.recheck(); cerr != nil {
			// Sticky: every later read fails the same way.
			c.err, c.r = cerr, errorReader{cerr}
			return n, cerr
		}
	}
	return n, err
}

// recheck moves the limit up to what the stored bytes read so far allow, or reports
// the stream over the cap.
func (c *counter) recheck() error {
	allowed := max(float64(c.floor), c.ratio*float64(c.raw.n))
	if float64(c.n) > allowed {
		return fmt.Errorf("%w: %d bytes of tar from %d stored bytes (cap %gx)", ErrTooCompressed, c.n, c.raw.n, c.ratio)
	}
	c.limit = math.MaxInt64
	if allowed < math.MaxInt64/2 {
		c.limit = int64(allowed)
	}
	return nil
}

// errorReader fails every read with err.
type errorReader struct{ err error }

func (e errorReader) Read([]byte) (int, error) { return 0, e.err }

// Seek lets archive/tar skip member data when the source can seek; otherwise it
// fails and archive/tar reads the data through.
func (c *counter) Seek(off int64, whence int) (int64, error) {
	sk, ok := c.r.(io.Seeker)
	if !ok {
		return 0, errCannotSeek
	}
	pos, err := sk.Seek(off, whence)
	if err == nil {
		c.n = pos
	}
	return pos, err
}

// errCannotSeek is what counter.Seek says for a source that cannot: the tar reader
// then reads what it skips.
var errCannotSeek = errors.New("shard: source cannot seek")
