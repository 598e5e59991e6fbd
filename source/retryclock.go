package source

// The retry deadline of one object's read, shared by the streams that read it.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

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
