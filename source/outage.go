package source

import (
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// outageCount counts, in this process, the outages the Fetchers saw.
var outageCount atomic.Int64

// Outages returns how many outages the Fetchers of this process saw: stretches
// during which requests to one endpoint of a store (EndpointOf) failed in a way a
// retry may cure, from the first such failure while none was going on to the next
// success there. A store's throttling (429, S3's SlowDown) is not an outage: the
// rate limiter answers it.
func Outages() int64 { return outageCount.Load() }

// outages follows the outages of a Fetcher's endpoints and logs one line when one
// starts and one when it ends, not one per retry.
type outages struct {
	logf   func(format string, args ...any)
	now    func() time.Time
	active atomic.Int32 // outages going on: a success with none costs one load

	mu sync.Mutex
	m  map[string]*outage // by endpoint
}

// outage is one endpoint's outage going on.
type outage struct {
	since   time.Time
	retries int64
}

func newOutages(logf func(string, ...any), now func() time.Time) *outages {
	return &outages{logf: logf, now: now, m: map[string]*outage{}}
}

// outageKey is the endpoint an outage of url's store is followed by.
func outageKey(url string) string {
	if k := EndpointOf(url); k != "" {
		return k
	}
	return Scheme(url) + ":"
}

// isOutage reports whether a retryable failure says the store is unreachable or
// failing, rather than that it throttles.
func isOutage(err error) bool {
	if !IsThrottle(err) {
		return true
	}
	// A bare 503 (a load balancer with no store behind it) is an outage; a 503 with
	// a throttling code (SlowDown), or a 429, is throttling.
	var se *StatusError
	return errors.As(err, &se) && se.Status == http.StatusServiceUnavailable && se.Code == ""
}

// failed records that a request to url failed with err (retryable) and is to be
// retried for up to budget: the first failure of an outage of its endpoint starts it,
// with a line in the log.
func (o *outages) failed(url string, err error, budget time.Duration) {
	if o == nil || !isOutage(err) {
		return
	}
	key := outageKey(url)
	o.mu.Lock()
	e := o.m[key]
	start := e == nil
	if start {
		if len(o.m) >= maxEndpoints {
			o.mu.Unlock()
			return
		}
		e = &outage{since: o.now()}
		o.m[key] = e
		o.active.Add(1)
		outageCount.Add(1)
	}
	e.retries++
	o.mu.Unlock()
	if start {
		o.logf("source: store unreachable for %s: %v; retrying for up to %v", Redact(url), innerErr(err), budget)
	}
}

// ok records that a request to url succeeded: an outage of its endpoint is over,
// with a line in the log.
func (o *outages) ok(url string) {
	if o == nil || o.active.Load() == 0 {
		return
	}
	key := outageKey(url)
	o.mu.Lock()
	e := o.m[key]
	if e != nil {
		delete(o.m, key)
		o.active.Add(-1)
	}
	o.mu.Unlock()
	if e != nil {
		o.logf("source: store back for %s after %v, %d retries", key, o.now().Sub(e.since).Round(time.Millisecond), e.retries)
	}
}
