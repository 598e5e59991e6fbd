package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardload/shardload/internal/mem"
)

// VersionReader is the optional capability to read part of one version of an object:
// the version an earlier Stat returned as Info.Version. When the object is no longer
// at that version the open (or a read) fails with an error wrapping ErrChanged.
// S3 pins with If-Match on the ETag, GCS with the generation, HTTP with If-Match (or,
// with no ETag, If-Unmodified-Since and the Last-Modified and length of each answer),
// the file backend by comparing size and modification time.
type VersionReader interface {
	OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error)
}

// InfoOpener is a Source that opens an object at the Info a Stat has just returned
// (its URL, size and version) without asking the store again: a cache that
// validated an object before fetching it saves a request an object (see
// Fetcher.OpenInfo).
type InfoOpener interface {
	OpenInfo(ctx context.Context, info Info) (io.ReadCloser, error)
}

// FetchOptions configure a Fetcher. The zero value gives the defaults.
type FetchOptions struct {
	// PartSize is the size of each ranged part. Default 8 MiB (DefaultPartSize).
	PartSize int64
	// Parallel is the most parts in flight for one stream, each holding a PartSize
	// buffer, so one stream holds at most Parallel × PartSize bytes. 1 reads an
	// object as one stream with no buffering. Default 4 (DefaultParallel).
	Parallel int
	// SingleRate decides, per object, whether parallel parts are worth their cost: an
	// object larger than one part is read first as one part, and when that part
	// arrived at SingleRate bytes per second or faster (counting only the time spent
	// waiting for it, and multiplied by the number of objects the Fetcher was reading
	// at that moment, which share the link), the rest is read as one stream straight
	// into the reader's buffers; slower, as parallel parts. Streams that fast
	// together are not what limits the reader, and parallel parts cost a copy out of
	// their buffers and a page fault per page of each new buffer. Default 256 MB/s
	// (DefaultSingleRate); negative: always parallel parts.
	SingleRate float64
	// Retry is the retry policy of every request and read.
	Retry RetryPolicy
	// RetryDeadline bounds a read of one object once an attempt of it has failed:
	// from that first failure, the time the read spends waiting for the source
	// (requests, reads, stalls, backoff waits, across all its parts) may add up to
	// RetryDeadline, after which the read fails with an error wrapping
	// ErrRetryDeadline that names the URL, the byte offset reached and the attempts
	// made. Time the reader spends between its reads does not count, so a slow
	// consumer is never cut off, and a read that never fails is not bounded by it
	// (Retry.StallTimeout ends a request that delivers nothing). Default 30 minutes
	// (DefaultRetryDeadline): a healthy multi-GiB shard still finishes after a
	// failure on a slow link (18 GB at 10 MB/s), while an origin that stalls after
	// every few bytes is given up within the half hour instead of being held for
	// hours (about 30 stall-and-retry cycles at the default StallTimeout). A fixed
	// time rather than one proportional to the size: the size is not always known,
	// and what the deadline guards against (an origin that keeps failing) does not
	// grow with it. Negative: no deadline.
	RetryDeadline time.Duration
	// RateLimiter paces every request of the Fetcher (each attempt of a Stat, a
	// listing or a read) per endpoint of the store, following its throttling
	// answers (see RateLimiter). Default DefaultRateLimiter, shared by the whole
	// process; Unlimited: no pacing.
	RateLimiter *RateLimiter
	// NoStartSpread makes requests made with a context of WithRank go at once,
	// instead of waiting for their rank's StartSpread before the first.
	NoStartSpread bool
	// Logf receives a line when an endpoint of the store starts failing (an outage:
	// "store unreachable for URL: why; retrying for up to BUDGET") and one when a
	// request there succeeds again ("store back for ENDPOINT after 20s, 31
	// retries"): two lines an outage, not one a retry (see Outages). Default
	// log.Printf.
	Logf func(format string, args ...any)
}

// Defaults of FetchOptions.
const (
	DefaultPartSize   = 8 << 20
	DefaultParallel   = 4
	DefaultSingleRate = 256e6
	// DefaultRetryDeadline is the default of FetchOptions.RetryDeadline.
	DefaultRetryDeadline = 30 * time.Minute
)

func (o FetchOptions) withDefaults() FetchOptions {
	if o.PartSize <= 0 {
		o.PartSize = DefaultPartSize
	}
	if o.Parallel <= 0 {
		o.Parallel = DefaultParallel
	}
	if o.SingleRate == 0 {
		o.SingleRate = DefaultSingleRate
	}
	if o.RetryDeadline == 0 {
		o.RetryDeadline = DefaultRetryDeadline
	}
	if o.RateLimiter == nil {
		o.RateLimiter = DefaultRateLimiter
	}
	if o.Logf == nil {
		o.Logf = log.Printf
	}
	o.Retry = o.Retry.withDefaults()
	return o
}

// admit waits until a request of op on url may go: the start spread of ctx's rank
// (WithRank), then the rate limit of url's endpoint. The ticket takes the request's
// outcome.
func (f *Fetcher) admit(ctx context.Context, op, url string) (Ticket, error) {
	if !f.opts.NoStartSpread {
		if err := waitStart(ctx); err != nil {
			return Ticket{}, &Error{Op: op, URL: url, Err: err}
		}
	}
	t, err := f.opts.RateLimiter.Wait(ctx, url)
	if err != nil {
		return Ticket{}, &Error{Op: op, URL: url, Err: err}
	}
	return t, nil
}

// Fetcher reads objects of another Source fast and reliably:
//   - Stat and List are retried under the retry policy;
//   - Open and OpenRange read an object as parts of PartSize bytes, up to Parallel of
//     them in flight, delivered in order as one stream, when the Source has ranged
//     reads (RangeReader), the object is larger than one part, and its first part,
//     read alone, arrived slower than SingleRate (times the objects being read at
//     once; else the rest is one stream);
//   - a read that fails in the middle of a body resumes at the exact byte offset with
//     a ranged request, pinned to the version Stat first saw when the Source
//     implements VersionReader (else unpinned), and fails with ErrChanged if the
//     object changed; a request that makes no progress for StallTimeout is ended and
//     retried;
//   - a VersionReader that gives an object no version (an HTTP origin with neither
//     ETag nor Last-Modified) has nothing to pin a read on: such an object is read
//     as one stream, never as parts, and a failure after its first byte fails the
//     read with ErrNoVersion instead of resuming, which could mix two versions;
//   - a read's failures are retried for Retry.Budget from the first (and at most
//     Retry.Attempts times when set), so a store that is down for a minute costs a
//     pause; only a failed request that had delivered at least Retry.MinProgress
//     bytes starts them afresh, and RetryDeadline bounds the whole read once it has
//     failed, so an origin that stalls after every few bytes is given up;
//   - an outage of an endpoint is logged when it starts and when it ends (Logf),
//     and counted (Outages);
//   - the bytes delivered are checked against the object's size.
//
// Without ranged reads, Open retries only failures before the first byte.
// A Fetcher is safe for concurrent use.
type Fetcher struct {
	src  Source
	opts FetchOptions
	out  *outages

	// Part buffers that streams gave back, for the next streams: a fresh buffer
	// costs a page fault per 4 KiB on first write, which at loopback speeds costs
	// more than the copy. At most MaxFreeBytes of them are kept.
	mu   sync.Mutex
	bufs [][]byte
	// streams counts the objects being read through the Fetcher now (the streams
	// that may read one stream on, opened and not closed), for SingleRate.
	streams  atomic.Int64
	freeHeld int64
}

// MaxFreeBytes bounds the part buffers a Fetcher keeps between streams: 2 streams'
// worth at the options' Parallel and PartSize (at the defaults, 64 MiB). They are
// memory of the process that no loader's budget counts.
func (f *Fetcher) MaxFreeBytes() int64 { return 2 * int64(f.opts.Parallel) * f.opts.PartSize }

// getBuf returns a part buffer of size bytes.
func (f *Fetcher) getBuf(size int64) []byte {
	f.mu.Lock()
	for i := len(f.bufs) - 1; i >= 0; i-- {
		if b := f.bufs[i]; int64(cap(b)) == size {
			f.bufs = slices.Delete(f.bufs, i, i+1)
			f.freeHeld -= size
			f.mu.Unlock()
			return b
		}
	}
	f.mu.Unlock()
	b := make([]byte, size)
	mem.Prefault(b)
	return b
}

// putBuf keeps a part buffer for later streams, up to MaxFreeBytes; the oldest
// buffers make room for it.
func (f *Fetcher) putBuf(b []byte) {
	size := int64(cap(b))
	if size > f.MaxFreeBytes() {
		return
	}
	f.mu.Lock()
	for f.freeHeld+size > f.MaxFreeBytes() && len(f.bufs) > 0 {
		f.freeHeld -= int64(cap(f.bufs[0]))
		f.bufs[0] = nil
		f.bufs = f.bufs[1:]
	}
	f.bufs = append(f.bufs, b[:cap(b)])
	f.freeHeld += size
	f.mu.Unlock()
}

// Tuning overrides a Fetcher's PartSize and Parallel for the reads opened with a
// context that carries it (WithTuning): a loader's tuner sets its own, within its
// memory budget, through a registry that others share. Zero fields keep the
// Fetcher's options.
type Tuning struct {
	PartSize int64
	Parallel int
}

type tuningKey struct{}

// WithTuning returns a context whose Fetcher reads use t.
func WithTuning(ctx context.Context, t Tuning) context.Context {
	return context.WithValue(ctx, tuningKey{}, t)
}

// tuned returns the part size and parallelism of reads opened with ctx.
func (f *Fetcher) tuned(ctx context.Context) (partSize int64, parallel int) {
	partSize, parallel = f.opts.PartSize, f.opts.Parallel
	if t, ok := ctx.Value(tuningKey{}).(Tuning); ok {
		if t.PartSize > 0 {
			partSize = t.PartSize
		}
		if t.Parallel > 0 {
			parallel = t.Parallel
		}
	}
	return partSize, parallel
}

var (
	_ Source        = (*Fetcher)(nil)
	_ RangeReader   = (*Fetcher)(nil)
	_ VersionReader = (*Fetcher)(nil)
	_ Lister        = (*Fetcher)(nil)
)

// NewFetcher returns a Fetcher reading src with opts (zero fields take defaults).
func NewFetcher(src Source, opts FetchOptions) *Fetcher {
	opts = opts.withDefaults()
	return &Fetcher{src: src, opts: opts, out: newOutages(opts.Logf, opts.Retry.Now)}
}

// Source returns the Source the Fetcher reads.
func (f *Fetcher) Source() Source { return f.src }

// Unwrap returns the Source the Fetcher reads from, as Source does; it makes a
// Fetcher a Wrapper.
func (f *Fetcher) Unwrap() Source { return f.src }

var _ Wrapper = (*Fetcher)(nil)

// Options returns the Fetcher's options, defaults filled in.
func (f *Fetcher) Options() FetchOptions { return f.opts }

// Stat stats the object, retrying retryable failures.
func (f *Fetcher) Stat(ctx context.Context, url string) (Info, error) {
	var info Info
	err := f.opts.Retry.do(ctx, f.out, url, func(int) error {
		var err error
		info, err = f.stat(ctx, url)
		return err
	})
	return info, err
}

// stat is one Stat under the stall timeout.
func (f *Fetcher) stat(ctx context.Context, url string) (info Info, err error) {
	t, err := f.admit(ctx, "stat", url)
	if err != nil {
		return Info{}, err
	}
	defer func() { t.Done(err) }()
	if f.opts.Retry.StallTimeout < 0 {
		return f.src.Stat(ctx, url)
	}
	actx, cancel := context.WithTimeoutCause(ctx, f.opts.Retry.StallTimeout, ErrStalled)
	defer cancel()
	info, err = f.src.Stat(actx, url)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), ErrStalled) {
		err = &Error{Op: "stat", URL: url, Err: fmt.Errorf("%w: no answer for %v", ErrStalled, f.opts.Retry.StallTimeout)}
	}
	return info, err
}

// List lists through the Source's Lister, retrying a failed listing from its start.
// Objects are handed to fn only once the whole listing has succeeded.
func (f *Fetcher) List(ctx context.Context, prefix string, fn func(Info) error) error {
	l, ok := f.src.(Lister)
	if !ok {
		return &Error{Op: "list", URL: prefix, Err: ErrNotLister}
	}
	var infos []Info
	err := f.opts.Retry.do(ctx, f.out, prefix, func(int) error {
		infos = infos[:0]
		t, err := f.admit(ctx, "list", prefix)
		if err != nil {
			return err
		}
		err = l.List(ctx, prefix, func(i Info) error {
			if len(infos) >= MaxListed {
				return &Error{Op: "list", URL: prefix, Err: fmt.Errorf("%w: more than %d objects", ErrTooMany, MaxListed)}
			}
			infos = append(infos, i)
			return nil
		})
		t.Done(err)
		return err
	})
	if err != nil {
		return err
	}
	for _, i := range infos {
		if err := fn(i); err != nil {
			return err
		}
	}
	return nil
}

// Open returns the whole object as a stream.
func (f *Fetcher) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return f.open(ctx, url, nil, 0, -1)
}

// OpenRange returns length bytes of the object starting at off, or the rest of the
// object when length < 0. A range past the end is cut short; one starting at or past
// the end is an empty stream.
func (f *Fetcher) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	if off < 0 {
		return nil, &Error{Op: "open", URL: url, Err: fmt.Errorf("source: negative offset %d", off)}
	}
	return f.open(ctx, url, nil, off, length)
}

// OpenVersion is OpenRange provided the object is still at version, an
// Info.Version that an earlier Stat returned; otherwise it fails with an error
// wrapping ErrChanged. The read is pinned to that version as OpenRange's is (see
// Fetcher). A cache uses it to go on with an object from the byte it got to.
func (f *Fetcher) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	if off < 0 {
		return nil, &Error{Op: "open", URL: url, Err: fmt.Errorf("source: negative offset %d", off)}
	}
	return f.open(ctx, url, &version, off, length)
}

// open reads [off, off+length) of url; when want is not nil, only at that version.
func (f *Fetcher) open(ctx context.Context, url string, want *string, off, length int64) (io.ReadCloser, error) {
	changed := func(info Info) error {
		if want == nil || info.Version == *want {
			return nil
		}
		return &Error{Op: "open", URL: url, Err: fmt.Errorf("%w: version %s, was %s", ErrChanged, info.Version, *want)}
	}
	rr, ranged := f.src.(RangeReader)
	if !ranged {
		if off != 0 || length >= 0 {
			return nil, &Error{Op: "open", URL: url, Err: errors.New("source: ranged reads not supported by this source")}
		}
		if want != nil {
			info, err := f.Stat(ctx, url)
			if err == nil {
				err = changed(info)
			}
			if err != nil {
				return nil, err
			}
		}
		var rc io.ReadCloser
		err := f.opts.Retry.do(ctx, f.out, url, func(int) error {
			t, err := f.admit(ctx, "open", url)
			if err != nil {
				return err
			}
			rc, err = f.src.Open(ctx, url)
			t.Done(err)
			return err
		})
		return rc, err
	}
	info, err := f.Stat(ctx, url)
	if err != nil {
		var se *Error
		if errors.As(err, &se) && se.Op == "stat" {
			err = &Error{Op: "open", URL: url, Err: se.Err}
		}
		return nil, err
	}
	if err := changed(info); err != nil {
		return nil, err
	}
	info.URL = url
	return f.openKnown(ctx, rr, info, off, length)
}

// OpenInfo reads the whole object info describes, at info's size and version, as a
// Stat has just returned them: without asking the store for them again, one request
// less than Open. The read is pinned to info.Version as OpenVersion's is (an object
// written since fails with an error wrapping ErrChanged). Without a version or a
// size, or on a source that cannot read ranges, it is Open.
func (f *Fetcher) OpenInfo(ctx context.Context, info Info) (io.ReadCloser, error) {
	rr, ranged := f.src.(RangeReader)
	if !ranged || info.Version == "" || info.Size < 0 {
		return f.Open(ctx, info.URL)
	}
	return f.openKnown(ctx, rr, info, 0, -1)
}

// openKnown reads [off, off+length) of the object info describes, at info's size
// and version.
func (f *Fetcher) openKnown(ctx context.Context, rr RangeReader, info Info, off, length int64) (io.ReadCloser, error) {
	url := info.URL
	pr := partReader{f: f, rr: rr, url: url, version: info.Version, size: info.Size, clock: newRetryClock(f.opts.RetryDeadline)}
	pr.partSize, pr.parallel = f.tuned(ctx)
	if vr, ok := f.src.(VersionReader); ok {
		if info.Version != "" {
			pr.vr = vr
		} else {
			pr.noResume = true
		}
	}
	if info.Size < 0 { // size unknown: one stream, retried before its first byte
		var rc io.ReadCloser
		err := f.opts.Retry.do(ctx, f.out, url, func(int) error {
			t, err := f.admit(ctx, "open", url)
			if err != nil {
				return err
			}
			rc, err = pr.openRange(ctx, off, length)
			t.Done(err)
			return err
		})
		return rc, err
	}
	n := max(info.Size-off, 0)
	if length >= 0 {
		n = min(n, length)
	}
	if n == 0 {
		return io.NopCloser(eofReader{}), nil
	}
	if pr.noResume || pr.parallel <= 1 || n <= pr.partSize {
		rs := newResumeStream(ctx, pr, off, n)
		rs.counted = f
		f.streams.Add(1)
		return rs, nil
	}
	if f.opts.SingleRate < 0 {
		return newParallelStream(ctx, pr, off, n), nil
	}
	return newProbeStream(ctx, pr, off, n), nil
}

// probeStream reads an object as one ranged request, timing the reads of its first
// part; at the end of that part it goes on with the same request when the part
// arrived fast enough, or ends it and reads the rest as parallel parts (see
// FetchOptions.SingleRate). Going on with the same request leaves no gap between
// the first part and the rest.
type probeStream struct {
	ctx    context.Context
	p      partReader
	cur    io.ReadCloser // the whole range; after a switch, the rest's parts
	pos    int64         // offset of the next byte
	rest   int64         // where the first part ends
	end    int64
	waited time.Duration // time spent in the first part's reads
	probe  bool          // still reading the first part
	closed bool
}

func newProbeStream(ctx context.Context, p partReader, off, n int64) *probeStream {
	p.f.streams.Add(1)
	return &probeStream{ctx: ctx, p: p, cur: newResumeStream(ctx, p, off, n), pos: off, rest: off + p.partSize, end: off + n, probe: true}
}

func (s *probeStream) Read(b []byte) (int, error) {
	if !s.probe {
		return s.cur.Read(b)
	}
	if left := s.rest - s.pos; int64(len(b)) > left {
		b = b[:left]
	}
	t0 := time.Now()
	n, err := s.cur.Read(b)
	s.waited += time.Since(t0)
	s.pos += int64(n)
	if s.pos == s.rest && err == nil {
		s.decide()
	}
	return n, err
}

// decide keeps the request for the rest when the first part arrived at SingleRate
// or faster, and otherwise replaces it with parallel parts.
func (s *probeStream) decide() {
	s.probe = false
	n := s.end - s.rest
	rate := float64(s.p.partSize) / max(s.waited.Seconds(), 1e-9) * float64(max(s.p.f.streams.Load(), 1))
	if rate >= s.p.f.opts.SingleRate || n <= s.p.partSize {
		return
	}
	s.cur.Close()
	s.cur = newParallelStream(s.ctx, s.p, s.rest, n)
}

// WriteTo copies the stream to w: through a buffer for the first part, then with the
// rest's own WriteTo when it has one (parallel parts are written from their buffers).
func (s *probeStream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	if s.probe {
		buf := make([]byte, 256<<10)
		for s.probe {
			n, err := s.Read(buf)
			if n > 0 {
				k, werr := w.Write(buf[:n])
				total += int64(k)
				if werr != nil {
					return total, werr
				}
			}
			if err == io.EOF {
				return total, nil
			}
			if err != nil {
				return total, err
			}
		}
	}
	var n int64
	var err error
	if wt, ok := s.cur.(io.WriterTo); ok {
		n, err = wt.WriteTo(w)
	} else {
		n, err = io.Copy(w, struct{ io.Reader }{s.cur})
	}
	return total + n, err
}

// Close ends the stream and the requests it has in flight.
func (s *probeStream) Close() error {
	if !s.closed {
		s.closed = true
		s.p.f.streams.Add(-1)
	}
	return s.cur.Close()
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// partReader opens ranges of one object at one version.
type partReader struct {
	f        *Fetcher
	rr       RangeReader
	vr       VersionReader // nil: unpinned
	url      string
	version  string
	size     int64
	noResume bool        // nothing to pin on: a failure after the first byte ends the read
	clock    *retryClock // the object's retry deadline, shared by its streams
	partSize int64       // the read's parts (FetchOptions or Tuning)
	parallel int
}

func (p partReader) openRange(ctx context.Context, off, n int64) (io.ReadCloser, error) {
	if p.vr != nil {
		return p.vr.OpenVersion(ctx, p.url, p.version, off, n)
	}
	return p.rr.OpenRange(ctx, p.url, off, n)
}

// resumeStream reads [off, off+n) of an object, resuming after retryable failures at
// the byte it got to, under the stall watchdog and the object's retry deadline.
type resumeStream struct {
	ctx   context.Context
	p     partReader
	start int64 // where the stream began
	off   int64 // next byte to deliver
	end   int64
	body  io.ReadCloser
	// attempt is the current attempt's context, its stall watchdog, and the timer
	// of the retry deadline (once the object has failed).
	actx     context.Context
	cancel   context.CancelCauseFunc
	timer    *time.Timer
	deadline *deadlineTimer
	// counted is the Fetcher whose streams count this one until it is closed; nil
	// for a part's stream.
	counted *Fetcher
	tries   int   // failed attempts that count against Retry.Attempts
	gained  int64 // bytes delivered since the last failure
	last    error // the last failure
	pending error // a failure that came with bytes, handled on the next Read
	err     error
	// The failures since the last real progress (Retry.MinProgress) are one
	// outage, bounded by Retry.Budget: its time is counted while the reader is
	// inside Read, from readAt (this Read's start, or the outage's), with used
	// what the Reads before counted.
	inOutage bool
	readAt   time.Time
	used     time.Duration
}

func newResumeStream(ctx context.Context, p partReader, off, n int64) *resumeStream {
	return &resumeStream{ctx: ctx, p: p, start: off, off: off, end: off + n}
}

// Read delivers the next bytes, resuming transparently.
func (s *resumeStream) Read(b []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if s.off >= s.end {
		s.closeBody()
		return 0, io.EOF
	}
	if len(b) == 0 {
		return 0, nil
	}
	s.p.clock.enter()
	defer s.p.clock.leave()
	s.readAt = s.p.f.opts.Retry.Now()
	defer s.leaveOutage()
	for {
		if err := s.pending; err != nil {
			s.pending = nil
			if !s.retry(err) {
				return 0, s.fail(err)
			}
		}
		if s.body == nil {
			if err := s.openBody(); err != nil {
				if s.retry(err) {
					continue
				}
				return 0, s.fail(err)
			}
		}
		want := min(int64(len(b)), s.end-s.off)
		n, err := s.body.Read(b[:want])
		if n > 0 {
			s.off += int64(n)
			s.gained += int64(n)
			s.kick()
		}
		if err == nil && s.off >= s.end {
			s.closeBody()
			return n, nil
		}
		if err == io.EOF {
			if s.off >= s.end {
				s.closeBody()
				return n, io.EOF
			}
			err = &Error{Op: "read", URL: s.p.url, Err: fmt.Errorf("%w: stream ended at byte %d of %d",
				ErrShortRead, s.off, s.end)}
		}
		if err != nil {
			err = s.attemptErr(err)
			s.closeBody()
			if n > 0 {
				// Deliver what arrived; the failure is handled on the next Read.
				s.pending = err
				return n, nil
			}
			if s.retry(err) {
				continue
			}
			return 0, s.fail(err)
		}
		if n > 0 {
			return n, nil
		}
	}
}

// openBody opens the rest of the range under a fresh watchdog and, once the object
// has failed, the retry deadline's timer.
func (s *resumeStream) openBody() error {
	if err := s.ctx.Err(); err != nil {
		return &Error{Op: "read", URL: s.p.url, Err: err}
	}
	t, err := s.p.f.admit(s.ctx, "read", s.p.url)
	if err != nil {
		return err
	}
	s.actx, s.cancel = context.WithCancelCause(s.ctx)
	if st := s.p.f.opts.Retry.StallTimeout; st > 0 {
		cancel := s.cancel
		s.timer = time.AfterFunc(st, func() { cancel(ErrStalled) })
	}
	s.deadline = s.p.clock.watch(s.cancel)
	s.p.clock.attempt()
	body, err := s.p.openRange(s.actx, s.off, s.end-s.off)
	t.Done(err)
	if err != nil {
		err = s.attemptErr(err)
		s.closeBody()
		return err
	}
	s.p.f.out.ok(s.p.url)
	s.body = body
	return nil
}

// leaveOutage counts the time of a Read that ends in an outage into it.
func (s *resumeStream) leaveOutage() {
	if s.inOutage {
		s.used += s.p.f.opts.Retry.Now().Sub(s.readAt)
	}
}

// kick restarts the watchdog after progress.
func (s *resumeStream) kick() {
	if s.timer != nil {
		s.timer.Reset(s.p.f.opts.Retry.StallTimeout)
	}
}

// attemptErr turns the failure of an attempt the watchdog ended into ErrStalled, and
// of one the retry deadline ended into ErrRetryDeadline.
func (s *resumeStream) attemptErr(err error) error {
	if s.actx == nil || s.ctx.Err() != nil {
		return err
	}
	switch cause := context.Cause(s.actx); {
	case errors.Is(cause, ErrStalled):
		return &Error{Op: "read", URL: s.p.url, Err: fmt.Errorf("%w: no bytes for %v at byte %d",
			ErrStalled, s.p.f.opts.Retry.StallTimeout, s.off)}
	case errors.Is(cause, ErrRetryDeadline):
		return s.deadlineErr()
	}
	return err
}

// retry reports whether to try again after err, having waited the backoff. When it
// will not, because the attempts, the retry deadline or the means to resume ran out,
// it sets s.err.
func (s *resumeStream) retry(err error) bool {
	if !IsRetryable(err) || s.ctx.Err() != nil {
		return false
	}
	pol := s.p.f.opts.Retry
	if s.gained > 0 && s.gained >= pol.MinProgress {
		s.tries = 0 // real progress since the last failure: a new outage
		s.inOutage = false
	}
	if !s.inOutage {
		s.inOutage, s.used = true, 0 // from this Read's start
	}
	now := pol.Now()
	elapsed := s.used + now.Sub(s.readAt)
	s.gained = 0
	s.tries++
	s.last = err
	c := s.p.clock
	c.fail()
	switch {
	case s.p.noResume && s.off > s.start:
		s.err = &Error{Op: "read", URL: s.p.url, Err: fmt.Errorf("%w: it failed at byte %d of %d: %w",
			ErrNoVersion, s.off, s.p.size, innerErr(err))}
		return false
	case c.expired():
		s.err = s.deadlineErr()
		return false
	case pol.spent(s.tries, elapsed):
		s.err = exhausted(s.tries, elapsed, err)
		return false
	}
	s.p.f.out.failed(s.p.url, err, pol.Budget)
	d := min(pol.backoffFor(s.ctx, s.tries, err, s.off), pol.Budget-elapsed)
	if left, ok := c.remaining(); ok && left < d {
		d = left // wait no longer than the deadline
	}
	if pol.Sleep(s.ctx, d) != nil {
		return false
	}
	if c.expired() {
		s.err = s.deadlineErr()
		return false
	}
	retried.Add(1)
	if s.off > s.start {
		resumed.Add(1)
	}
	return true
}

// deadlineErr is the failure of a read whose retry deadline passed.
func (s *resumeStream) deadlineErr() error {
	c := s.p.clock
	msg := fmt.Sprintf("%v of waiting for the source since the first failure, at byte %d of %d, after %d attempts", c.limit, s.off, s.p.size, c.attempts.Load())
	if s.last != nil {
		return &Error{Op: "read", URL: s.p.url, Err: fmt.Errorf("%w: %s (last failure: %w)", ErrRetryDeadline, msg, innerErr(s.last))}
	}
	return &Error{Op: "read", URL: s.p.url, Err: fmt.Errorf("%w: %s", ErrRetryDeadline, msg)}
}

// innerErr is the cause inside an *Error, so that an error wrapping it in another
// *Error names the operation and URL once.
func innerErr(err error) error {
	var se *Error
	if errors.As(err, &se) {
		return se.Err
	}
	return err
}

func (s *resumeStream) fail(err error) error {
	if s.err == nil {
		if s.ctx.Err() != nil {
			err = &Error{Op: "read", URL: s.p.url, Err: s.ctx.Err()}
		}
		s.err = err
	}
	return s.err
}

func (s *resumeStream) closeBody() {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if s.deadline != nil {
		s.deadline.stop()
		s.deadline = nil
	}
	if s.body != nil {
		s.body.Close()
		s.body = nil
	}
	if s.cancel != nil {
		s.cancel(context.Canceled)
		s.cancel = nil
	}
}

// Close ends the stream. It is idempotent.
func (s *resumeStream) Close() error {
	if s.counted != nil {
		s.counted.streams.Add(-1)
		s.counted = nil
	}
	s.closeBody()
	if s.err == nil {
		s.err = &Error{Op: "read", URL: s.p.url, Err: errors.New("source: read after close")}
	}
	return nil
}

// retryClock is the retry deadline of one object's read (FetchOptions.RetryDeadline),
// shared by the streams that read it (its parts). It starts at the first failed
// attempt and runs only while at least one of the streams is inside a Read, waiting
// for the source: the time a reader spends between reads does not count.
type retryClock struct {
	limit    time.Duration // <= 0: no deadline
	attempts atomic.Int64  // requests made for the object

	mu      sync.Mutex
	waiting int       // Reads in progress
	started bool      // an attempt has failed
	since   time.Time // start of the current stretch of waiting, once started
	used    time.Duration
}

func newRetryClock(limit time.Duration) *retryClock { return &retryClock{limit: limit} }

// attempt counts a request.
func (c *retryClock) attempt() { c.attempts.Add(1) }

// enter and leave bracket a Read.
func (c *retryClock) enter() {
	if c.limit <= 0 {
		return
	}
	c.mu.Lock()
	if c.waiting == 0 && c.started {
		c.since = time.Now()
	}
	c.waiting++
	c.mu.Unlock()
}

func (c *retryClock) leave() {
	if c.limit <= 0 {
		return
	}
	c.mu.Lock()
	c.waiting--
	if c.waiting == 0 && c.started {
		c.used += time.Since(c.since)
	}
	c.mu.Unlock()
}

// fail starts the clock, from within a Read, if it has not started.
func (c *retryClock) fail() {
	if c.limit <= 0 {
		return
	}
	c.mu.Lock()
	if !c.started {
		c.started, c.since = true, time.Now()
	}
	c.mu.Unlock()
}

// remaining returns the time left; ok is false when there is no deadline or the
// clock has not started.
func (c *retryClock) remaining() (left time.Duration, ok bool) {
	if c.limit <= 0 {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		return 0, false
	}
	used := c.used
	if c.waiting > 0 {
		used += time.Since(c.since)
	}
	return c.limit - used, true
}

func (c *retryClock) expired() bool {
	left, ok := c.remaining()
	return ok && left <= 0
}

// watch returns a timer that ends an attempt (cancel with ErrRetryDeadline) when
// the deadline passes; nil when the clock has not started or has no deadline.
func (c *retryClock) watch(cancel context.CancelCauseFunc) *deadlineTimer {
	left, ok := c.remaining()
	if !ok {
		return nil
	}
	d := &deadlineTimer{c: c, cancel: cancel}
	d.mu.Lock()
	d.t = time.AfterFunc(max(left, 0), d.fire)
	d.mu.Unlock()
	return d
}

// deadlineTimer fires when the retry deadline may have passed: the clock does not
// run while no stream is reading, so it checks and waits again if not.
type deadlineTimer struct {
	c      *retryClock
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	t      *time.Timer
	done   bool
}

func (d *deadlineTimer) fire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return
	}
	if left, _ := d.c.remaining(); left > 0 {
		d.t.Reset(left)
		return
	}
	d.done = true
	d.cancel(ErrRetryDeadline)
}

func (d *deadlineTimer) stop() {
	d.mu.Lock()
	d.done = true
	d.t.Stop()
	d.mu.Unlock()
}

// parallelStream reads [off, off+n) as parts fetched by up to Parallel goroutines
// into Parallel buffers, and delivers them in order.
type parallelStream struct {
	ctx    context.Context
	cancel context.CancelFunc
	f      *Fetcher
	url    string
	order  chan *part     // parts in object order, as they are started
	free   chan []byte    // buffers not in use; its capacity bounds memory
	wg     sync.WaitGroup // the dispatcher and part goroutines
	cur    *part
	pos    int // read position in cur.buf
	err    error
	once   sync.Once
}

type part struct {
	buf  []byte
	done chan struct{} // closed when buf is full or err is set
	err  error
}

func newParallelStream(ctx context.Context, p partReader, off, n int64) *parallelStream {
	ctx, cancel := context.WithCancel(ctx)
	par, size := p.parallel, p.partSize
	s := &parallelStream{
		ctx:    ctx,
		cancel: cancel,
		f:      p.f,
		url:    p.url,
		order:  make(chan *part, par),
		free:   make(chan []byte, par),
	}
	for range par {
		s.free <- nil // allocated on first use
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(s.order)
		for start := off; start < off+n; start += size {
			var buf []byte
			select {
			case buf = <-s.free:
			case <-ctx.Done():
				return
			}
			plen := min(size, off+n-start)
			if buf == nil {
				buf = p.f.getBuf(size)
			}
			pt := &part{buf: buf[:plen], done: make(chan struct{})}
			select {
			case s.order <- pt:
			case <-ctx.Done():
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer close(pt.done)
				pt.err = fillPart(ctx, p, start, pt.buf)
			}()
		}
	}()
	return s
}

// fillPart reads exactly len(buf) bytes at off into buf.
func fillPart(ctx context.Context, p partReader, off int64, buf []byte) error {
	rs := newResumeStream(ctx, p, off, int64(len(buf)))
	defer rs.Close()
	_, err := io.ReadFull(rs, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
		err = &Error{Op: "read", URL: p.url, Err: fmt.Errorf("%w: part at byte %d", ErrShortRead, off)}
	}
	return err
}

// Read delivers the parts' bytes in order.
func (s *parallelStream) Read(b []byte) (int, error) {
	if err := s.next(); err != nil {
		return 0, err
	}
	n := copy(b, s.cur.buf[s.pos:])
	s.pos += n
	return n, nil
}

// WriteTo writes the parts' bytes to w in order, straight from the part buffers
// (io.Copy uses it and needs no buffer of its own).
func (s *parallelStream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		if err := s.next(); err == io.EOF {
			return total, nil
		} else if err != nil {
			return total, err
		}
		n, err := w.Write(s.cur.buf[s.pos:])
		s.pos += n
		total += int64(n)
		if err != nil {
			return total, s.setErr(err)
		}
	}
}

// next makes s.cur a part with bytes left to deliver, waiting for it, or returns the
// stream's error (io.EOF at its end).
func (s *parallelStream) next() error {
	if s.err != nil {
		return s.err
	}
	for s.cur == nil || s.pos == len(s.cur.buf) {
		if s.cur != nil {
			s.free <- s.cur.buf[:cap(s.cur.buf)] // never blocks: it came from free
			s.cur = nil
		}
		var pt *part
		var ok bool
		select {
		case pt, ok = <-s.order:
		case <-s.ctx.Done():
			return s.setErr(&Error{Op: "read", URL: s.url, Err: context.Cause(s.ctx)})
		}
		if !ok {
			if err := s.ctx.Err(); err != nil {
				return s.setErr(&Error{Op: "read", URL: s.url, Err: err})
			}
			return s.setErr(io.EOF)
		}
		select {
		case <-pt.done:
		case <-s.ctx.Done():
			return s.setErr(&Error{Op: "read", URL: s.url, Err: context.Cause(s.ctx)})
		}
		if pt.err != nil {
			return s.setErr(pt.err)
		}
		s.cur, s.pos = pt, 0
	}
	return nil
}

func (s *parallelStream) setErr(err error) error {
	s.err = err
	if err != io.EOF {
		s.cancel()
	}
	return err
}

// Close cancels the parts in flight and waits for their goroutines. It is idempotent.
func (s *parallelStream) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.wg.Wait()
		// Every part goroutine is done: their buffers can go to later streams. (The
		// part being read, if any, is left to the garbage collector: a Read may
		// still be returning from it.)
		for pt := range s.order {
			s.f.putBuf(pt.buf)
		}
		for drained := false; !drained; {
			select {
			case b := <-s.free:
				if b != nil {
					s.f.putBuf(b)
				}
			default:
				drained = true
			}
		}
		if s.err == nil {
			s.err = &Error{Op: "read", URL: s.url, Err: errors.New("source: read after close")}
		}
	})
	return nil
}
