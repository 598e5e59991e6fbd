package source

// The single-stream reader: one request, resumed at the byte reached after a failure or stall.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

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
	s.p.f.out.failed(s.p.url, err, retryFor(s.ctx, pol.Budget-elapsed))
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
