package shard

// Counting, timing and capping the bytes read, stored and inflated.

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"
)

// Times returns the time spent so far reading the underlying reader (fetch) and
// inflating a compressed shard (not counting fetch). Zero unless Options.Timing. The
// fetch time is measured around every read; the inflate time is estimated from one
// read of the tar stream in about four (see counter.sampled).
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

// clock is what a counter times its reads with: mono, a fake in tests.
var clock = mono

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

	// sampled times each read with a chance of one in sampleEvery, and counts a
	// timed read sampleEvery times: the tar stream of a compressed shard is read
	// several times per sample (headers, members, padding), and reading the clock
	// twice around each read took 3% of the CPU of a loader of zstd token shards.
	// Each read is drawn on its own, so that the sum's expectation is the time of
	// all the reads, whatever their pattern (a fixed stride, or gaps drawn from one
	// seed, times the same reads of every shard of one layout).
	sampled bool

	limit int64 // 0: no cap; else a count within the cap, rechecked when n passes it
	ratio float64
	floor int64
	raw   *counter
}

// sampleEvery is the inverse of the chance that a sampled counter times a read.
const sampleEvery = 4

func (c *counter) Read(p []byte) (int, error) {
	timing := c.timed && (!c.sampled || rand.Uint32N(sampleEvery) == 0)
	var t0 time.Duration
	if timing {
		t0 = clock()
	}
	n, err := c.r.Read(p)
	if timing {
		d := clock() - t0
		if c.sampled {
			d *= sampleEvery
		}
		c.dur += d
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
