package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a RateLimiter's clock that moves only when told, and records the
// waits asked of it.
type fakeClock struct {
	t     time.Time
	waits []time.Duration
}

func newFakeLimiter(opts RateOptions) (*RateLimiter, *fakeClock) {
	c := &fakeClock{t: time.Unix(1_000_000, 0)}
	l := NewRateLimiter(opts)
	l.now = func() time.Time { return c.t }
	l.sleep = func(_ context.Context, d time.Duration) error { c.waits = append(c.waits, d); return nil }
	return l, c
}

var slowDown = &Error{Op: "read", URL: "s3://b/k", Err: &StatusError{Status: 503, Code: "SlowDown"}}

// An endpoint is unlimited until it throttles; a round of throttles halves the rate
// sent over the last second once; successes raise it linearly; MinRate and MaxRate
// bound it.
func TestRateLimiterAIMD(t *testing.T) {
	ctx := context.Background()
	l, c := newFakeLimiter(RateOptions{})
	const url = "s3://b/train/0.tar"
	var tickets []Ticket
	for range 100 { // 100 requests over 0.99 s: no waits
		c.t = c.t.Add(10 * time.Millisecond)
		tk, err := l.Wait(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, tk)
	}
	if len(c.waits) != 0 || !math.IsInf(l.Rate(url), 1) {
		t.Fatalf("before any throttle: %d waits, rate %v", len(c.waits), l.Rate(url))
	}
	// The whole round is throttled: one decrease, to half of about 100/s.
	for _, tk := range tickets {
		tk.Done(slowDown)
	}
	r := l.Rate(url)
	if r < 45 || r > 51 {
		t.Fatalf("after a round of throttles the rate is %v, want about 50", r)
	}
	if s := l.Stats(); s.Throttled != 100 || s.Decreases != 1 {
		t.Fatalf("stats %+v, want 100 throttled, 1 decrease", s)
	}
	// Other buckets and hosts are not limited.
	if !math.IsInf(l.Rate("s3://other/x"), 1) || !math.IsInf(l.Rate("file:///x"), 1) {
		t.Fatal("the limit of one bucket spread to others")
	}
	// The next requests are paced 1/r apart.
	c.waits = nil
	var next []Ticket
	for range 5 {
		tk, _ := l.Wait(ctx, url)
		next = append(next, tk)
	}
	if len(c.waits) != 4 {
		t.Fatalf("waits %v, want 4 (the first goes at once)", c.waits)
	}
	step := time.Duration(float64(time.Second) / r)
	for i, w := range c.waits {
		if want := time.Duration(i+1) * step; w < want-time.Millisecond || w > want+time.Millisecond {
			t.Errorf("wait %d = %v, want %v", i, w, want)
		}
	}
	// A throttle of the new round halves it again.
	next[0].Done(slowDown)
	if r2 := l.Rate(url); math.Abs(r2-r/2) > 0.01 {
		t.Fatalf("second round: rate %v, want %v", r2, r/2)
	}
	// Successes add Increase × ref / rate each: about 10% of the reference rate per
	// rate's worth of successes.
	r2 := l.Rate(url)
	for _, tk := range next[1:] {
		tk.Done(nil)
	}
	if r3 := l.Rate(url); r3 <= r2 || r3 > r2+4*0.1*r/r2+0.01 {
		t.Fatalf("after 4 successes: rate %v, was %v", r3, r2)
	}
	// Other failures change nothing.
	before := l.Rate(url)
	next[0].Done(&Error{Op: "open", URL: url, Err: ErrNotFound})
	if l.Rate(url) != before {
		t.Fatal("a not-found moved the rate")
	}
	// Throttles all the way down stop at MinRate.
	for range 40 {
		c.t = c.t.Add(time.Second)
		tk, _ := l.Wait(ctx, url)
		tk.Done(slowDown)
	}
	if got := l.Rate(url); got != DefaultMinRate {
		t.Fatalf("after 40 rounds of throttles: rate %v, want the floor %v", got, DefaultMinRate)
	}
	// MaxRate caps the growth.
	l.SetMaxRate(1.5)
	for range 1000 {
		tk, _ := l.Wait(ctx, url)
		tk.Done(nil)
	}
	if got := l.Rate(url); got != 1.5 {
		t.Fatalf("capped at 1.5/s, the rate is %v", got)
	}
}

// MaxRate alone paces an endpoint that never throttles; Fixed keeps it there; a
// canceled wait returns the context's error.
func TestRateLimiterFixedCap(t *testing.T) {
	l, c := newFakeLimiter(RateOptions{MaxRate: 10, Fixed: true})
	for range 3 {
		tk, _ := l.Wait(context.Background(), "https://Data.Example/a")
		tk.Done(slowDown)
	}
	if want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}; !slices.Equal(c.waits, want) {
		t.Fatalf("waits %v, want %v", c.waits, want)
	}
	if got := l.Rate("https://data.example/b"); got != 10 {
		t.Fatalf("rate %v, want the fixed 10", got)
	}
	if s := l.Stats(); s.Throttled != 3 || s.Decreases != 0 || s.Waits != 2 {
		t.Fatalf("stats %+v", s)
	}
	// Unlimited never waits.
	for range 100 {
		if tk, err := Unlimited.Wait(context.Background(), "s3://b/k"); err != nil || tk != (Ticket{}) {
			t.Fatal("Unlimited made a ticket or failed")
		}
	}
	slow := NewRateLimiter(RateOptions{MaxRate: 0.001})
	ctx, cancel := context.WithCancel(context.Background())
	slow.Wait(ctx, "s3://b/k") // the first goes at once
	cancel()
	if _, err := slow.Wait(ctx, "s3://b/k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a canceled wait returned %v", err)
	}
}

// Endpoints reports, per endpoint, the limit in force, the throttles, the decreases
// and the waits, for the endpoints the limiter acted on alone; the counts of
// endpoints it forgets stay in the ForgottenEndpoints entry.
func TestRateLimiterEndpoints(t *testing.T) {
	ctx := context.Background()
	l, c := newFakeLimiter(RateOptions{})
	if got := l.Endpoints(); len(got) != 0 {
		t.Fatalf("a new limiter reports %+v", got)
	}
	// Ten requests over 0.1 s to one bucket, four of them throttled: one round, so
	// one decrease, to half of the 100/s they were sent at.
	var tickets []Ticket
	for range 10 {
		c.t = c.t.Add(10 * time.Millisecond)
		tk, _ := l.Wait(ctx, "s3://hot/k")
		tickets = append(tickets, tk)
	}
	for i, tk := range tickets {
		if i < 4 {
			tk.Done(slowDown)
		} else {
			tk.Done(nil)
		}
	}
	l.Wait(ctx, "s3://quiet/k") // never throttled: not reported
	rate := l.Rate("s3://hot/k")
	// The next three requests at once: the first goes, the next two wait 1/rate
	// and 2/rate.
	tickets = tickets[:0]
	for range 3 {
		tk, _ := l.Wait(ctx, "s3://hot/other-key")
		tickets = append(tickets, tk)
	}
	for _, tk := range tickets { // one round: one decrease
		tk.Done(&Error{Op: "open", URL: "s3://hot/other-key", Err: &StatusError{Status: 429}})
	}
	got := l.Endpoints()
	if len(got) != 1 {
		t.Fatalf("endpoints %+v, want s3://hot alone", got)
	}
	e := got[0]
	wantWait := time.Duration(3 * float64(time.Second) / rate)
	if e.Endpoint != "s3://hot" || e.Throttled != 7 || e.Decreases != 2 || e.Waits != 2 ||
		e.Waited < wantWait-time.Millisecond || e.Waited > wantWait+time.Millisecond {
		t.Fatalf("endpoint %+v, want s3://hot, 7 throttled, 2 decreases, 2 waits of %v in all", e, wantWait)
	}
	if e.Rate != l.Rate("s3://hot/k") || e.Rate >= rate {
		t.Fatalf("rate %v, want Rate's %v (below %v after the second round)", e.Rate, l.Rate("s3://hot/k"), rate)
	}
	if s := l.Stats(); s.Throttled != e.Throttled || s.Waits != e.Waits || s.Waited != e.Waited || s.Decreases != e.Decreases {
		t.Fatalf("totals %+v disagree with the one endpoint's %+v", s, e)
	}

	// Under a cap, the endpoints made to wait are reported; forgotten ones keep
	// their waits under ForgottenEndpoints.
	capped, _ := newFakeLimiter(RateOptions{MaxRate: 50}) // no burst: 20 ms apart
	for i := range maxEndpoints {
		host := fmt.Sprintf("https://h%d.example/x", i)
		capped.Wait(ctx, host)
		capped.Wait(ctx, host) // waits 20 ms
	}
	capped.Wait(ctx, "https://one-more.example/x") // forgets the others
	var waits int64
	var waited time.Duration
	for _, e := range capped.Endpoints() {
		waits += e.Waits
		waited += e.Waited
		if e.Endpoint != ForgottenEndpoints && e.Rate != 50 {
			t.Fatalf("endpoint %+v: want the cap's rate", e)
		}
	}
	if waits != maxEndpoints || waited != maxEndpoints*20*time.Millisecond {
		t.Fatalf("%d waits of %v in all after forgetting, want %d of %v", waits, waited, maxEndpoints, maxEndpoints*20*time.Millisecond)
	}
	if got := capped.Endpoints(); len(got) != 2 || got[0].Endpoint != "https://one-more.example" || got[1].Endpoint != ForgottenEndpoints {
		t.Fatalf("after forgetting: %+v, want the last endpoint and %q", got, ForgottenEndpoints)
	}
}

func TestEndpointOf(t *testing.T) {
	for _, tt := range [][2]string{
		{"s3://bucket/train/x.tar", "s3://bucket"},
		{"S3://bucket/x", "s3://bucket"},
		{"gs://b/x/y", "gs://b"},
		{"https://user:pw@Data.Example:8443/a/x.tar?sig=1", "https://data.example:8443"},
		{"http://h?x", "http://h"},
		{"/abs/x.tar", ""},
		{"rel/x.tar", ""},
		{"file:///abs/x.tar", ""},
	} {
		if got := EndpointOf(tt[0]); got != tt[1] {
			t.Errorf("EndpointOf(%q) = %q, want %q", tt[0], got, tt[1])
		}
	}
}

func TestIsThrottle(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{slowDown, true},
		{&StatusError{Status: 429}, true},
		{&StatusError{Status: 503}, true},
		{&StatusError{Status: 400, Code: "Throttling"}, true},
		{&StatusError{Status: 500, Code: "InternalError"}, false},
		{&StatusError{Status: 502}, false},
		{fmt.Errorf("%w: %w", ErrNotFound, &StatusError{Status: 404}), false},
		{io.ErrUnexpectedEOF, false},
		{nil, false},
	} {
		if got := IsThrottle(tt.err); got != tt.want {
			t.Errorf("IsThrottle(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// StartSpread is zero for one rank, bounded, a function of (rank, world) alone,
// and spreads any node's ranks and the whole job over its window.
func TestStartSpread(t *testing.T) {
	if d := StartSpread(0, 1); d != 0 || StartSpreadWindow(1) != 0 {
		t.Fatalf("one rank waits %v (window %v)", d, StartSpreadWindow(1))
	}
	if StartSpreadWindow(8) != 32*time.Millisecond || StartSpreadWindow(80_000) != MaxStartSpread {
		t.Fatalf("windows: %v for 8 ranks, %v for 80,000", StartSpreadWindow(8), StartSpreadWindow(80_000))
	}
	for _, world := range []int{2, 8, 64, 80_000} {
		window := StartSpreadWindow(world)
		var ds []time.Duration
		for rank := range world {
			d := StartSpread(rank, world)
			if d < 0 || d >= window {
				t.Fatalf("rank %d of %d waits %v, outside [0, %v)", rank, world, d, window)
			}
			if d != StartSpread(rank, world) {
				t.Fatal("not a function of rank and world")
			}
			ds = append(ds, d)
		}
		slices.Sort(ds)
		// The largest gap between neighbours is at most 3 of the even spacing: the
		// golden-ratio sequence's three-gap property.
		even := window / time.Duration(world)
		gap := ds[0]
		for i := 1; i < len(ds); i++ {
			gap = max(gap, ds[i]-ds[i-1])
		}
		if world <= 64 && gap > 3*even {
			t.Errorf("world %d: a gap of %v between starts, even spacing %v", world, gap, even)
		}
	}
	// A node's 8 ranks fall in 8 different eighths of the window.
	seen := map[time.Duration]bool{}
	for rank := 800; rank < 808; rank++ {
		seen[StartSpread(rank, 80_000)/(MaxStartSpread/8)] = true
	}
	if len(seen) < 6 {
		t.Errorf("a node's 8 ranks fall in %d eighths of the window", len(seen))
	}
}

// A Fetcher's requests with a rank's context wait for its spread (not with
// NoStartSpread), report throttles to its limiter, and retry with jitter drawn
// from the rank and URL.
func TestFetcherRateLimitAndSpread(t *testing.T) {
	var n atomic.Int64
	body := strings.Repeat("x", 1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= 3 {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		io.WriteString(w, body)
	}))
	defer srv.Close()
	lim := NewRateLimiter(RateOptions{MinRate: 100})
	var sleeps []time.Duration
	opts := FetchOptions{RateLimiter: lim, Retry: RetryPolicy{Sleep: func(_ context.Context, d time.Duration) error {
		sleeps = append(sleeps, d)
		return nil
	}}}
	f := NewFetcher(statusSource{url: srv.URL}, opts)
	ctx := WithRank(context.Background(), 5, 64)
	if ctx2 := WithRank(ctx, 5, 64); ctx2 != ctx {
		t.Fatal("WithRank of a context with the same rank made a new one")
	}
	before := startWaits.Load()
	rc, err := f.Open(ctx, srv.URL+"/x")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != body {
		t.Fatalf("read %d bytes, %v", len(b), err)
	}
	if startWaits.Load() == before && StartSpread(5, 64) > 0 {
		t.Error("the first request did not wait for the rank's start spread")
	}
	if s := lim.Stats(); s.Throttled != 3 || s.Decreases == 0 {
		t.Fatalf("limiter stats %+v: want 3 throttles and a decrease", s)
	}
	if math.IsInf(lim.Rate(srv.URL), 1) {
		t.Fatal("the endpoint has no limit after throttling")
	}
	// The same failures of the same rank wait the same; another rank's differ.
	again := func(rank int) []time.Duration {
		var ds []time.Duration
		for retry := 1; retry <= 3; retry++ {
			ds = append(ds, opts.Retry.backoffFor(WithRank(context.Background(), rank, 64), retry, slowDown, 0))
		}
		return ds
	}
	if !slices.Equal(again(5), again(5)) || slices.Equal(again(5), again(6)) {
		t.Fatalf("jitter: rank 5 %v and %v, rank 6 %v", again(5), again(5), again(6))
	}
	for i, d := range again(5) {
		hi := DefaultBaseBackoff << i
		if d < hi/2 || d > hi {
			t.Errorf("retry %d waits %v, outside [%v, %v]", i+1, d, hi/2, hi)
		}
	}
	// With NoStartSpread a fresh rank's request does not wait.
	before = startWaits.Load()
	g := NewFetcher(statusSource{url: srv.URL}, FetchOptions{RateLimiter: Unlimited, NoStartSpread: true})
	if _, err := g.Stat(WithRank(context.Background(), 7, 64), srv.URL+"/x"); err != nil {
		t.Fatal(err)
	}
	if startWaits.Load() != before {
		t.Error("NoStartSpread still waited")
	}
}

// statusSource is a minimal HTTP Source for the tests of this package (the real one
// is source/httpsrc, which imports this package): GET and HEAD, a 503 with S3's
// SlowDown code a StatusError.
type statusSource struct{ url string }

func (s statusSource) get(ctx context.Context, method, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		code := ""
		if strings.Contains(string(b), "<Code>SlowDown</Code>") {
			code = "SlowDown"
		}
		return nil, &Error{Op: "open", URL: url, Err: &StatusError{Status: resp.StatusCode, Code: code}}
	}
	return resp, nil
}

func (s statusSource) Stat(ctx context.Context, url string) (Info, error) {
	resp, err := s.get(ctx, http.MethodHead, url)
	if err != nil {
		return Info{}, err
	}
	resp.Body.Close()
	return Info{URL: url, Size: resp.ContentLength}, nil
}

func (s statusSource) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	resp, err := s.get(ctx, http.MethodGet, url)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}
