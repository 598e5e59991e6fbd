package source

// The Fetcher: its options, part buffers and tuning, and its Source methods.

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

	"github.com/shardload/shardload/mem"
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

// InfoRangeOpener is a Source that reads a range of an object at the size and
// version an index or an earlier Stat recorded, without asking the store for them
// again: one request a range instead of two (see Fetcher.OpenInfoRange).
type InfoRangeOpener interface {
	OpenInfoRange(ctx context.Context, info Info, off, length int64) (io.ReadCloser, error)
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

// OpenInfoRange is OpenVersion(info.URL, info.Version, off, length) for an object
// whose size and version are known (from an index, or a Stat): the read is pinned to
// the version by the backend (S3 and HTTP If-Match, the GCS generation, the file's
// size and time), so it is one request, not a Stat and a request. Without a size or
// a version, or on a source that cannot pin a version, it is OpenVersion.
func (f *Fetcher) OpenInfoRange(ctx context.Context, info Info, off, length int64) (io.ReadCloser, error) {
	if off < 0 {
		return nil, &Error{Op: "open", URL: info.URL, Err: fmt.Errorf("source: negative offset %d", off)}
	}
	if info.Version == "" {
		return f.open(ctx, info.URL, nil, off, length)
	}
	rr, ranged := f.src.(RangeReader)
	_, pinned := f.src.(VersionReader)
	if !ranged || !pinned || info.Size < 0 {
		return f.open(ctx, info.URL, &info.Version, off, length)
	}
	return f.openKnown(ctx, rr, info, off, length)
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
