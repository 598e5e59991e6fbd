package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// More sentinels for errors.Is.
var (
	// ErrChanged means the object was replaced by another version while it was read:
	// a read resumed after a failure, or a later part of a parallel read, found a
	// version other than the one first seen. The read fails rather than mix versions.
	ErrChanged = errors.New("source: object changed while it was read")
	// ErrStalled means a read made no progress for the stall timeout. It is retryable.
	ErrStalled = errors.New("source: read stalled")
	// ErrRetriesExhausted means a request kept failing for the whole retry budget
	// (RetryPolicy.Budget), or for every attempt RetryPolicy.Attempts allows; the
	// last failure is wrapped beside it.
	ErrRetriesExhausted = errors.New("source: retries exhausted")
	// ErrRetryDeadline means a read of an object used up FetchOptions.RetryDeadline
	// after its first failure. The error names the URL, the byte offset reached and
	// the attempts made. It is not retryable.
	ErrRetryDeadline = errors.New("source: retry deadline passed")
	// ErrNoVersion means a read failed in the middle of an object whose source gives
	// nothing to pin a version on (an HTTP origin with neither ETag nor
	// Last-Modified): resuming could mix two versions of the object, so the read
	// fails instead. It is not retryable.
	ErrNoVersion = errors.New("source: the origin gives nothing to pin a version on (no ETag, no Last-Modified), so the read cannot resume")
)

// Retryable is implemented by errors that know whether the operation that failed is
// worth trying again. IsRetryable finds it anywhere in an error's chain.
type Retryable interface {
	Retryable() bool
}

// RetryAfter is implemented by errors that carry a server's Retry-After hint.
type RetryAfter interface {
	RetryAfter() time.Duration
}

// StatusError is an HTTP response that was not a success, from a backend that speaks
// HTTP. 408, 429 and 5xx other than 501 are retryable; RetryAfterHint is the
// response's Retry-After header, if it had one.
type StatusError struct {
	// Status is the HTTP status code.
	Status int
	// Code is the store's error code ("SlowDown", "NoSuchKey"), when known.
	Code string
	// RetryAfterHint is the server's Retry-After, zero when absent.
	RetryAfterHint time.Duration
	// Err is the backend's own error, if any.
	Err error
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("HTTP %d %s", e.Status, http.StatusText(e.Status))
	if e.Code != "" {
		s += " (" + e.Code + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the backend's error.
func (e *StatusError) Unwrap() error { return e.Err }

// Retryable reports whether the status is one a retry may cure.
func (e *StatusError) Retryable() bool { return RetryableStatus(e.Status) }

// RetryAfter returns the server's Retry-After hint.
func (e *StatusError) RetryAfter() time.Duration { return e.RetryAfterHint }

// RetryableStatus reports whether an HTTP status code is worth retrying: 408, 429
// and the 5xx codes that say the server may answer later.
func RetryableStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// ParseRetryAfter reads a Retry-After header of h: seconds, or an HTTP date
// (relative to now). Zero when there is none or it cannot be read.
func ParseRetryAfter(h http.Header, now time.Time) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// IsRetryable reports whether err is a failure a retry may cure: an error that says so
// through a Retryable method, a short or cut body (ErrShortRead,
// io.ErrUnexpectedEOF), a stall, or a network failure (a *net.OpError such as a
// reset or a refused connection, or a timeout).
// Context cancellation, ErrNotFound, ErrPermission, ErrChanged, ErrRetryDeadline,
// ErrNoVersion and ErrRedirect are not.
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) && !errors.Is(err, ErrStalled) {
		return false
	}
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrPermission) || errors.Is(err, ErrChanged) ||
		errors.Is(err, ErrUnknownScheme) || errors.Is(err, ErrRetryDeadline) || errors.Is(err, ErrNoVersion) || errors.Is(err, ErrRedirect) {
		return false
	}
	var r Retryable
	if errors.As(err, &r) {
		return r.Retryable()
	}
	if errors.Is(err, ErrStalled) || errors.Is(err, ErrShortRead) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	var op *net.OpError // dial, read and write failures of a connection
	return errors.As(err, &op)
}

// RetryPolicy decides how failed requests and reads are retried. One policy serves
// every backend; the decision to retry comes from IsRetryable. The zero value is the
// default policy.
//
// Retries are bounded by time: a request (or a read, which resumes at the byte it
// reached) that keeps failing is tried again, with exponential backoff and full
// jitter, until Budget has passed since its first failure, so that a store that is
// down for less than Budget (a restart, a failover, a network partition healed)
// costs the job a pause, not a failure. Attempts caps the tries as well when set.
type RetryPolicy struct {
	// Attempts, when more than 0, is the most times one request is tried, counting
	// the first, whatever Budget leaves: 1 means no retries. A read that delivered
	// at least MinProgress bytes since its last failure starts counting afresh; less
	// progress does not. Default 0 (DefaultAttempts): no cap, Budget bounds the
	// retries.
	Attempts int
	// Budget is how long a request goes on being retried after its first failure
	// (the failed attempt's own time, the backoff waits, and any wait for the rate
	// limiter all count): a failure once it has passed ends the request with an
	// error wrapping ErrRetriesExhausted. For a read, the time counts while the
	// reader waits inside Read (its own pauses between reads do not), and the
	// failures are one stretch until a failed attempt had delivered MinProgress
	// bytes, after which a new failure starts the budget afresh. The last wait is
	// cut to end with the budget, and one more attempt is made then. Default 2m
	// (DefaultRetryBudget): a store down for a minute and more is ridden out.
	Budget time.Duration
	// MinProgress is the progress, in bytes since the last failure, that lets a
	// failed read start Attempts and Budget afresh. Default 1 MiB
	// (DefaultMinProgress); negative: any progress does (a read is then bounded by
	// FetchOptions.RetryDeadline alone).
	MinProgress int64
	// BaseBackoff is the wait before the first retry; it doubles each retry up to
	// MaxBackoff, and each wait is drawn uniformly from [0, that] (full jitter).
	// Defaults 100ms and 10s.
	BaseBackoff, MaxBackoff time.Duration
	// MaxRetryAfter caps a server's Retry-After: a longer hint waits this long.
	// Default 30s.
	MaxRetryAfter time.Duration
	// StallTimeout ends a request that delivers no bytes for this long (waiting for
	// the response included) and retries it. Default 60s; negative disables it.
	StallTimeout time.Duration
	// Sleep waits d or until ctx is done; tests inject a fake. Default: a timer.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now is the clock Budget is measured by; tests inject a fake (with Sleep
	// moving it). Default time.Now.
	Now func() time.Time
}

// Defaults of RetryPolicy.
const (
	// DefaultAttempts is the default of RetryPolicy.Attempts: no cap on the tries,
	// the retry budget bounds them.
	DefaultAttempts      = 0
	DefaultRetryBudget   = 2 * time.Minute
	DefaultBaseBackoff   = 100 * time.Millisecond
	DefaultMaxBackoff    = 10 * time.Second
	DefaultMaxRetryAfter = 30 * time.Second
	DefaultStallTimeout  = 60 * time.Second
	DefaultMinProgress   = 1 << 20
)

// withDefaults fills in zero fields.
func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.Attempts < 0 {
		p.Attempts = 0
	}
	if p.Budget <= 0 {
		p.Budget = DefaultRetryBudget
	}
	if p.BaseBackoff <= 0 {
		p.BaseBackoff = DefaultBaseBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = DefaultMaxBackoff
	}
	if p.MaxBackoff < p.BaseBackoff {
		p.MaxBackoff = p.BaseBackoff
	}
	if p.MaxRetryAfter <= 0 {
		p.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if p.StallTimeout == 0 {
		p.StallTimeout = DefaultStallTimeout
	}
	if p.MinProgress == 0 {
		p.MinProgress = DefaultMinProgress
	}
	if p.Sleep == nil {
		p.Sleep = sleepCtx
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	return p
}

// spent reports whether a request that has failed attempts times, elapsed after
// its first failure, may not be tried again.
func (p RetryPolicy) spent(attempts int, elapsed time.Duration) bool {
	return elapsed >= p.Budget || (p.Attempts > 0 && attempts >= p.Attempts)
}

// Backoff returns how long to wait before retry number retry (1 for the first) after
// err: a server's Retry-After (capped at MaxRetryAfter) if err carries one, else
// exponential backoff with full jitter: drawn uniformly from [0, BaseBackoff ×
// 2^(retry-1)], the bound capped at MaxBackoff.
//
// A Fetcher's own retries draw the jitter from the rank of the request's context
// (WithRank), the URL and the retry where the context carries a rank; Backoff draws
// it at random.
func (p RetryPolicy) Backoff(retry int, err error) time.Duration {
	return p.backoff(retry, err, -1)
}

// backoff is Backoff with the jitter u in [0, 1) (negative: random).
func (p RetryPolicy) backoff(retry int, err error, u float64) time.Duration {
	p = p.withDefaults()
	var ra RetryAfter
	if errors.As(err, &ra) && ra.RetryAfter() > 0 {
		return min(ra.RetryAfter(), p.MaxRetryAfter)
	}
	d := p.BaseBackoff
	for i := 1; i < retry && d < p.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, p.MaxBackoff)
	if u >= 0 && u < 1 {
		return min(time.Duration(u*float64(d+1)), d)
	}
	return rand.N(d + 1)
}

// backoffFor is Backoff for a request made with ctx: with jitter drawn from the
// rank ctx carries (WithRank), the failed object's URL and the retry, else random.
func (p RetryPolicy) backoffFor(ctx context.Context, retry int, err error, off int64) time.Duration {
	u, ok := jitterOf(ctx, err, retry, off)
	if !ok {
		u = -1
	}
	return p.backoff(retry, err, u)
}

// Do calls op until it succeeds, fails with an error that is not retryable, ctx is
// done, or the policy is spent: Budget has passed since the start of the first
// failed call, or Attempts calls have failed. It waits Backoff between calls (the
// last wait cut to end with the budget). op gets the attempt number, from 1. The
// error returned is op's last; when the policy was spent it also wraps
// ErrRetriesExhausted. The jitter of its waits comes from the rank ctx carries
// (WithRank), the URL op's error names and the attempt, where ctx carries a rank;
// else it is random.
func (p RetryPolicy) Do(ctx context.Context, op func(attempt int) error) error {
	return p.do(ctx, nil, "", op)
}

// retryFor returns how long a request that failed may still be retried: left of its
// budget, or less when ctx ends sooner (a caller's deadline: the start's), as the
// log line of an outage says it.
func retryFor(ctx context.Context, left time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		if until := time.Until(dl); until < left {
			left = max(until, 0)
		}
	}
	return left.Round(time.Second)
}

// do is Do, telling the failures and successes to o (when not nil) as requests to
// url.
func (p RetryPolicy) do(ctx context.Context, o *outages, url string, op func(attempt int) error) error {
	p = p.withDefaults()
	var first time.Time
	for attempt := 1; ; attempt++ {
		start := p.Now()
		err := op(attempt)
		if err == nil {
			o.ok(url)
		}
		if err == nil || !IsRetryable(err) || ctx.Err() != nil {
			return err
		}
		if attempt == 1 {
			first = start
		}
		elapsed := p.Now().Sub(first)
		if p.spent(attempt, elapsed) {
			return exhausted(attempt, elapsed, err)
		}
		o.failed(url, err, retryFor(ctx, p.Budget-elapsed))
		if serr := p.Sleep(ctx, min(p.backoffFor(ctx, attempt, err, 0), p.Budget-elapsed)); serr != nil {
			return err
		}
		retried.Add(1)
	}
}

// retried and resumed count, in this process, the requests tried again after a
// retryable failure, and the reads among them that went on at a byte offset past
// their start.
var retried, resumed atomic.Int64

// Retries returns how many times, in this process, a request to a source was tried
// again after a retryable failure (RetryPolicy.Do, and the reads of a Fetcher), and
// how many of those resumed a read at the byte offset it had reached.
func Retries() (retries, resumes int64) { return retried.Load(), resumed.Load() }

// exhausted wraps the last error of attempts failed tries over elapsed since the
// first failure, keeping an *Error on top so that callers still see the operation
// and URL.
func exhausted(attempts int, elapsed time.Duration, err error) error {
	msg := fmt.Sprintf("after %d attempts over %v", attempts, elapsed.Round(time.Millisecond))
	var se *Error
	if errors.As(err, &se) {
		return &Error{Op: se.Op, URL: se.URL, Err: fmt.Errorf("%w %s: %w", ErrRetriesExhausted, msg, se.Err)}
	}
	return fmt.Errorf("%w %s: %w", ErrRetriesExhausted, msg, err)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
