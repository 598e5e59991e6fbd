package source

import (
	"context"
	"errors"
	"hash/fnv"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// RateOptions configure a RateLimiter. The zero value gives the defaults.
type RateOptions struct {
	// MaxRate caps the requests per second sent to one endpoint, whatever the store
	// says. Zero: no cap (the limit is only what the store's throttling answers
	// set).
	MaxRate float64
	// MinRate is the lowest limit a run of throttling answers can bring an endpoint
	// to, in requests per second. Default 1 (DefaultMinRate).
	MinRate float64
	// Decrease multiplies an endpoint's rate when the store throttles a request
	// sent at that rate (multiplicative decrease), at most once per round: answers
	// to requests sent before the last decrease do not decrease it again.
	// Default 0.5 (DefaultDecrease); it must lie in (0, 1).
	Decrease float64
	// Increase is how fast an endpoint's limit grows back on success (additive
	// increase): each success adds Increase × (the rate before the last decrease) /
	// (the current rate), so that while requests succeed at the limit it grows by
	// Increase × that rate per second. Default 0.1 (DefaultIncrease): a halving
	// is undone in about 5 s of successes. Past the rate before the decrease, each
	// success adds Increase: the limit probes upwards by Increase × itself per
	// second.
	Increase float64
	// Fixed turns the adaptation off: the limit is MaxRate (or none) whatever the
	// store answers.
	Fixed bool
}

// Defaults of RateOptions.
const (
	DefaultMinRate  = 1.0
	DefaultDecrease = 0.5
	DefaultIncrease = 0.1
)

// maxEndpoints bounds the endpoints a RateLimiter keeps state for; past it, those
// with no limit in force are forgotten.
const maxEndpoints = 4096

// A RateLimiter paces the requests a process sends to each endpoint of a store (a
// bucket of S3 or GCS, a host of HTTP; see EndpointOf), following the store's
// throttling answers (IsThrottle: S3's 503 SlowDown, HTTP 429 and 503, GCS's 429
// and 503): an endpoint has no limit until it throttles a request; then its rate
// drops to Decrease × the rate requests were being sent at (over the last second,
// or since the endpoint's first request when that is less), again on each later
// round of throttling, down to MinRate; every success raises it a little
// (Increase), up to MaxRate if set. Requests beyond the rate wait their turn,
// spaced 1/rate apart (with a burst of rate/100 allowed), and keep the turn they
// were given when the rate changes. Fetchers share one (DefaultRateLimiter unless their
// options name another), so every loader and session of a process, which all read
// through them, is paced together.
//
// A RateLimiter is safe for concurrent use.
type RateLimiter struct {
	opts RateOptions

	mu        sync.Mutex
	endpoints map[string]*endpoint
	maxRate   float64       // opts.MaxRate, or what SetMaxRate set
	forgotten EndpointStats // the counts of endpoints forgotten (maxEndpoints)

	throttled, decreases, waits atomic.Int64
	waited                      atomic.Int64 // nanoseconds

	// now and sleep are the clock; tests replace them.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
}

// endpoint is the pacing state of one endpoint.
type endpoint struct {
	rate  float64   // requests per second; +Inf: no limit
	ref   float64   // the rate before the last decrease (the scale of the increase)
	tat   time.Time // the theoretical time of the next request (GCRA)
	round int64     // decreases so far: a throttle of a request sent before the last one is of an old round
	// The requests sent over the last second, as two one-second buckets.
	bucket    int64 // start of the current bucket, in seconds since the epoch
	cur, prev int64
	first     time.Time // the first request counted
	// What the limiter did to the endpoint's requests (see EndpointStats).
	throttled, decreases, waits int64
	waited                      time.Duration
}

// NewRateLimiter returns a RateLimiter with opts (zero fields take defaults).
func NewRateLimiter(opts RateOptions) *RateLimiter {
	if opts.MinRate <= 0 {
		opts.MinRate = DefaultMinRate
	}
	if opts.Decrease <= 0 || opts.Decrease >= 1 {
		opts.Decrease = DefaultDecrease
	}
	if opts.Increase <= 0 {
		opts.Increase = DefaultIncrease
	}
	return &RateLimiter{opts: opts, maxRate: max(opts.MaxRate, 0), endpoints: map[string]*endpoint{},
		now: time.Now, sleep: sleepCtx}
}

// DefaultRateLimiter is the RateLimiter of every Fetcher whose FetchOptions name
// none: one per process, with the default options.
var DefaultRateLimiter = NewRateLimiter(RateOptions{})

// Unlimited is a RateLimiter that never makes a request wait: a Fetcher with it in
// its options sends every request at once, whatever the store answers.
var Unlimited = NewRateLimiter(RateOptions{Fixed: true})

// SetMaxRate sets the cap on each endpoint's rate, in requests per second (0: no
// cap), as RateOptions.MaxRate does; it applies from the next request on. It is how
// a command line flag caps the process's DefaultRateLimiter.
func (l *RateLimiter) SetMaxRate(rate float64) {
	if l == Unlimited {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.maxRate = max(rate, 0)
	for _, e := range l.endpoints {
		e.rate = l.clamp(e.rate)
	}
}

// clamp bounds rate by the cap.
func (l *RateLimiter) clamp(rate float64) float64 {
	if l.maxRate > 0 && rate > l.maxRate {
		return l.maxRate
	}
	return rate
}

// RateStats count what a RateLimiter did since it was made.
type RateStats struct {
	// Throttled is the throttling answers the stores gave (IsThrottle).
	Throttled int64
	// Decreases is the times an endpoint's rate was decreased (at most once a
	// round, however many answers of the round were throttled).
	Decreases int64
	// Waits is the requests that waited for their turn, and Waited their waits in all.
	Waits  int64
	Waited time.Duration
}

// Stats returns the limiter's counts.
func (l *RateLimiter) Stats() RateStats {
	return RateStats{Throttled: l.throttled.Load(), Decreases: l.decreases.Load(),
		Waits: l.waits.Load(), Waited: time.Duration(l.waited.Load())}
}

// EndpointStats are what a RateLimiter did to the requests of one endpoint (see
// EndpointOf) since it was made.
type EndpointStats struct {
	// Endpoint is EndpointOf's name of it: "s3://bucket", "https://host:port".
	// ForgottenEndpoints stands for the endpoints the limiter no longer keeps
	// (beyond the thousands it keeps state for, those it never limited).
	Endpoint string
	// Rate is the limit in force, in requests per second; +Inf when there is none
	// (the store never throttled and no MaxRate caps it).
	Rate float64
	// Throttled is the store's throttling answers (IsThrottle) to the endpoint's
	// requests; Decreases the times they decreased its rate (once a round).
	Throttled, Decreases int64
	// Waits is the requests that waited for their turn, and Waited their waits in
	// all.
	Waits  int64
	Waited time.Duration
}

// ForgottenEndpoints is the Endpoint of the EndpointStats of the endpoints a
// RateLimiter forgot (see EndpointStats).
const ForgottenEndpoints = "other"

// Endpoints returns the figures of the endpoints the limiter has acted on: those
// with a limit in force, throttled or made to wait, sorted by name. Their counts
// never go down: an endpoint the limiter forgets (one it never limited) adds them
// to the ForgottenEndpoints entry.
func (l *RateLimiter) Endpoints() []EndpointStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []EndpointStats
	for k, e := range l.endpoints {
		rate := l.clamp(e.rate)
		if math.IsInf(rate, 1) && e.throttled == 0 && e.waits == 0 {
			continue
		}
		out = append(out, EndpointStats{Endpoint: k, Rate: rate, Throttled: e.throttled, Decreases: e.decreases,
			Waits: e.waits, Waited: e.waited})
	}
	if l.forgotten.Waits > 0 {
		f := l.forgotten
		f.Endpoint, f.Rate = ForgottenEndpoints, math.Inf(1)
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b EndpointStats) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	return out
}

// Rate returns the limit in force for the endpoint of url, in requests per second;
// +Inf when there is none.
func (l *RateLimiter) Rate(url string) float64 {
	key := EndpointOf(url)
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.endpoints[key]; ok && key != "" {
		return l.clamp(e.rate)
	}
	if l.maxRate > 0 && key != "" {
		return l.maxRate
	}
	return math.Inf(1)
}

// EndpointOf returns the endpoint whose requests a RateLimiter paces together:
// "s3://bucket" and "gs://bucket" for S3 and GCS (a store's request limits are per
// bucket, or per key prefix inside one: pacing the bucket is the cautious side),
// "scheme://host" for HTTP and other schemes. Local files (an empty result) are
// never paced.
func EndpointOf(url string) string {
	scheme := Scheme(url)
	if scheme == "file" || scheme == "" {
		return ""
	}
	i := strings.Index(url, "://")
	if i < 0 {
		return ""
	}
	rest := url[i+3:]
	if j := strings.IndexAny(rest, "/?#"); j >= 0 {
		rest = rest[:j]
	}
	if scheme == "http" || scheme == "https" {
		if k := strings.LastIndexByte(rest, '@'); k >= 0 {
			rest = rest[k+1:] // no user information in a key
		}
		rest = strings.ToLower(rest)
	}
	return scheme + "://" + rest
}

// IsThrottle reports whether err is a store telling the client to slow down: an
// HTTP 429 or 503 (S3's SlowDown is a 503; GCS throttles with 429 or 503) or a
// StatusError whose code says so.
func IsThrottle(err error) bool {
	var se *StatusError
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code {
	case "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests", "TooManyRequestsException":
		return true
	}
	return se.Status == http.StatusTooManyRequests || se.Status == http.StatusServiceUnavailable
}

// Ticket is one request admitted by a RateLimiter: Done reports how it went.
type Ticket struct {
	l     *RateLimiter
	e     *endpoint
	round int64
}

// Done reports the outcome of the request: a throttling answer (IsThrottle)
// decreases the endpoint's rate, once a round; a success (nil) raises it. Other
// failures change nothing. Done of a zero Ticket does nothing.
func (t Ticket) Done(err error) {
	if t.l == nil || t.e == nil {
		return
	}
	t.l.done(t.e, t.round, err)
}

// Wait waits until a request to url may go, or ctx is done (then it returns ctx's
// error). Report its outcome through the Ticket.
func (l *RateLimiter) Wait(ctx context.Context, url string) (Ticket, error) {
	if l == nil || l == Unlimited {
		return Ticket{}, nil
	}
	key := EndpointOf(url)
	if key == "" {
		return Ticket{}, nil
	}
	now := l.now()
	l.mu.Lock()
	if l.opts.Fixed && l.maxRate <= 0 {
		l.mu.Unlock()
		return Ticket{}, nil
	}
	e := l.endpoints[key]
	if e == nil {
		if len(l.endpoints) >= maxEndpoints {
			for k, o := range l.endpoints {
				if math.IsInf(o.rate, 1) {
					// (Never throttled; its waits, under MaxRate, are kept in all.)
					l.forgotten.Waits += o.waits
					l.forgotten.Waited += o.waited
					delete(l.endpoints, k)
				}
			}
		}
		e = &endpoint{rate: math.Inf(1)}
		l.endpoints[key] = e
	}
	rate := l.clamp(e.rate)
	var wait time.Duration
	if !math.IsInf(rate, 1) {
		// GCRA: a request may go at tat - tolerance; the next one's tat is 1/rate later.
		interval := time.Duration(float64(time.Second) / rate)
		tolerance := time.Duration(float64(interval) * max(rate/100-1, 0)) // a burst of rate/100 requests
		if e.tat.Before(now) {
			e.tat = now
		}
		if at := e.tat.Add(-tolerance); at.After(now) {
			wait = at.Sub(now)
		}
		e.tat = e.tat.Add(interval)
	}
	t := Ticket{l: l, e: e, round: e.round}
	if wait <= 0 {
		e.count(now)
		l.mu.Unlock()
		return t, nil
	}
	e.waits++
	e.waited += wait
	l.mu.Unlock()
	l.waits.Add(1)
	l.waited.Add(int64(wait))
	if err := l.sleep(ctx, wait); err != nil {
		return Ticket{}, err
	}
	sentAt := l.now()
	if at := now.Add(wait); sentAt.Before(at) {
		sentAt = at // a fake clock that did not move
	}
	l.mu.Lock()
	e.count(sentAt)
	l.mu.Unlock()
	return t, nil
}

// count records a request sent at t in the one-second buckets.
func (e *endpoint) count(t time.Time) {
	if e.first.IsZero() {
		e.first = t
	}
	s := t.Unix()
	switch {
	case s == e.bucket+1:
		e.prev, e.cur, e.bucket = e.cur, 0, s
	case s > e.bucket:
		e.prev, e.cur, e.bucket = 0, 0, s
	}
	e.cur++ // (a request sent before the bucket, by a late waker, counts in it)
}

// sent returns the rate requests were sent at over the second before now (a
// sliding window over the two buckets), or since the first when that was less than
// a second ago (at least 50 ms): a storm's first second is not averaged with the
// quiet before it.
func (e *endpoint) sent(now time.Time) float64 {
	if since := now.Sub(e.first); since < time.Second {
		return float64(e.prev+e.cur) / max(since, 50*time.Millisecond).Seconds()
	}
	s := now.Unix()
	switch {
	case s == e.bucket:
		frac := float64(now.Nanosecond()) / 1e9
		return float64(e.prev)*(1-frac) + float64(e.cur)
	case s == e.bucket+1:
		frac := float64(now.Nanosecond()) / 1e9
		return float64(e.cur) * (1 - frac)
	case s < e.bucket: // a clock that went back
		return float64(e.prev + e.cur)
	}
	return 0
}

func (l *RateLimiter) done(e *endpoint, round int64, err error) {
	if err == nil {
		if l.opts.Fixed {
			return
		}
		l.mu.Lock()
		if !math.IsInf(e.rate, 1) {
			e.rate = l.clamp(e.rate + l.opts.Increase*max(e.ref, e.rate)/e.rate)
		}
		l.mu.Unlock()
		return
	}
	if !IsThrottle(err) {
		return
	}
	l.throttled.Add(1)
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e.throttled++
	if l.opts.Fixed {
		return
	}
	if round != e.round {
		return // sent before the last decrease, at the rate it already corrected
	}
	cur := e.rate
	if sent := e.sent(now); sent < cur {
		cur = sent
	}
	e.ref = max(cur, l.opts.MinRate)
	e.rate = l.clamp(max(cur*l.opts.Decrease, l.opts.MinRate))
	e.round++
	e.decreases++
	l.decreases.Add(1)
	// The requests already scheduled keep their turns; the next ones are spaced at
	// the new rate from the last of them.
}

// rankKey is the context key of WithRank.
type rankKey struct{}

// rankInfo is what WithRank puts in a context.
type rankInfo struct {
	rank, world int
	start       time.Time // no request before it
}

// Defaults of StartSpread.
const (
	// MaxStartSpread is the longest any rank's first requests wait.
	MaxStartSpread = 250 * time.Millisecond
	// StartSpreadPerRank is how much the window over which ranks spread their
	// first requests widens per rank of the job, up to MaxStartSpread.
	StartSpreadPerRank = 4 * time.Millisecond
)

// StartSpread returns how long rank, of a job of world ranks, waits before its first
// request, so that ranks started together do not all send theirs in the same
// millisecond: zero for a job of one rank; else a point of a window of
// min(world × StartSpreadPerRank, MaxStartSpread), the rank's multiple of the
// golden ratio modulo 1, so that any run of consecutive ranks (a node's) spreads
// evenly over the whole window. A function of rank and world alone, never random.
func StartSpread(rank, world int) time.Duration {
	if world <= 1 || rank < 0 {
		return 0
	}
	window := StartSpreadWindow(world)
	const phi = 0.6180339887498949 // the golden ratio's inverse
	_, frac := math.Modf(float64(rank) * phi)
	return time.Duration(frac * float64(window))
}

// StartSpreadWindow returns the window over which the ranks of a job of world ranks
// spread their first requests (see StartSpread): min(world × StartSpreadPerRank,
// MaxStartSpread), zero for one rank.
func StartSpreadWindow(world int) time.Duration {
	if world <= 1 {
		return 0
	}
	return min(time.Duration(world)*StartSpreadPerRank, MaxStartSpread)
}

// WithRank returns a context that says which rank of a job of world ranks its
// requests are for. A Fetcher's requests made with it:
//   - wait, before the first, until StartSpread(rank, world) after WithRank was
//     called (unless the Fetcher's options say NoStartSpread);
//   - draw their retries' jitter from the rank, the URL and the attempt, not from a
//     random source: ranks that fail on the same object at once retry at different
//     times, the same each run.
//
// A context that carries the same rank and world already is returned as it is, so
// the spread is counted from the first call.
func WithRank(ctx context.Context, rank, world int) context.Context {
	if ri, ok := ctx.Value(rankKey{}).(*rankInfo); ok && ri.rank == rank && ri.world == world {
		return ctx
	}
	return context.WithValue(ctx, rankKey{}, &rankInfo{rank: rank, world: world, start: time.Now().Add(StartSpread(rank, world))})
}

// rankOf returns the rank a context carries.
func rankOf(ctx context.Context) (*rankInfo, bool) {
	ri, ok := ctx.Value(rankKey{}).(*rankInfo)
	return ri, ok
}

// waitStart waits until ctx's rank may send its first request.
func waitStart(ctx context.Context) error {
	ri, ok := rankOf(ctx)
	if !ok {
		return nil
	}
	if d := time.Until(ri.start); d > 0 {
		startWaits.Add(1)
		return sleepCtx(ctx, d)
	}
	return nil
}

// startWaits counts the requests that waited for their rank's start spread.
var startWaits atomic.Int64

// jitterOf returns a number in [0, 1) for the jitter of retry number retry after
// err: from the rank ctx carries, the URL the error names and the retry when ctx
// carries a rank; ok is false when it does not.
func jitterOf(ctx context.Context, err error, retry int, off int64) (u float64, ok bool) {
	ri, ok := rankOf(ctx)
	if !ok {
		return 0, false
	}
	h := fnv.New64a()
	var b [32]byte
	put := func(i int, v uint64) {
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	put(0, uint64(ri.rank))
	put(8, uint64(ri.world))
	put(16, uint64(retry))
	put(24, uint64(off))
	h.Write(b[:])
	var se *Error
	if errors.As(err, &se) {
		h.Write([]byte(se.URL))
	}
	// fnv's low bits mix poorly: finish with a multiply and shift.
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return float64(x>>11) / (1 << 53), true
}
