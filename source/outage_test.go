package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// testClock is a clock that moves only when something sleeps on it: the retry
// policy's and the rate limiter's waits move it by what they wait.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Unix(1_000_000, 0)} }

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	c.t = c.t.Add(max(d, 0))
	c.mu.Unlock()
	return nil
}

// downSource serves one object that becomes unreachable, on the test clock, for
// downFor: from the moment a read first passes breakAt (the read breaks there), or
// from the start when breakAt is negative. Every request in the outage fails with
// fail().
type downSource struct {
	clk     *testClock
	data    []byte
	breakAt int64
	downFor time.Duration
	fail    func() error

	mu       sync.Mutex
	downFrom time.Time // zero: the outage has not started
	requests int
}

func (s *downSource) down(op, url string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	if s.breakAt < 0 && s.downFrom.IsZero() {
		s.downFrom = s.clk.now()
	}
	if !s.downFrom.IsZero() && s.clk.now().Before(s.downFrom.Add(s.downFor)) {
		return &Error{Op: op, URL: url, Err: s.fail()}
	}
	return nil
}

func (s *downSource) Stat(_ context.Context, url string) (Info, error) {
	if err := s.down("stat", url); err != nil {
		return Info{}, err
	}
	return Info{URL: url, Size: int64(len(s.data)), Version: "v1"}, nil
}

func (s *downSource) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return s.OpenRange(ctx, url, 0, -1)
}

func (s *downSource) OpenVersion(ctx context.Context, url, version string, off, n int64) (io.ReadCloser, error) {
	if version != "v1" {
		return nil, &Error{Op: "open", URL: url, Err: ErrChanged}
	}
	return s.OpenRange(ctx, url, off, n)
}

func (s *downSource) OpenRange(_ context.Context, url string, off, n int64) (io.ReadCloser, error) {
	if err := s.down("open", url); err != nil {
		return nil, err
	}
	end := int64(len(s.data))
	if n >= 0 {
		end = min(end, off+n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.downFrom.IsZero() && off < s.breakAt && s.breakAt < end {
		return &breakingBody{r: bytes.NewReader(s.data[off:s.breakAt]), s: s, url: url}, nil
	}
	return io.NopCloser(bytes.NewReader(s.data[off:end])), nil
}

// breakingBody delivers its bytes, then starts the outage and fails as a reset
// connection does.
type breakingBody struct {
	r   *bytes.Reader
	s   *downSource
	url string
}

func (b *breakingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.s.mu.Lock()
		b.s.downFrom = b.s.clk.now()
		b.s.mu.Unlock()
		return n, &Error{Op: "read", URL: b.url, Err: &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}}
	}
	return n, err
}

func (b *breakingBody) Close() error { return nil }

// outageFetcher is a Fetcher of src with the default retry policy and a rate
// limiter, both on the test clock, and its log lines.
func outageFetcher(src *downSource, retry RetryPolicy) (*Fetcher, *lines) {
	lim := NewRateLimiter(RateOptions{})
	lim.now, lim.sleep = src.clk.now, src.clk.sleep
	retry.Now, retry.Sleep = src.clk.now, src.clk.sleep
	var l lines
	return NewFetcher(src, FetchOptions{Parallel: 1, Retry: retry, RateLimiter: lim, Logf: l.logf, NoStartSpread: true}), &l
}

type lines struct {
	mu sync.Mutex
	l  []string
}

func (l *lines) logf(format string, args ...any) {
	l.mu.Lock()
	l.l = append(l.l, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *lines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, x := range l.l {
		if strings.Contains(x, s) {
			n++
		}
	}
	return n
}

// outageErrors are the failures of an unreachable store: a refused connection,
// and a load balancer's bare 503 (which the rate limiter also takes for
// throttling, halving the endpoint's rate each round down to 1 request a second).
var outageErrors = map[string]func() error{
	"refused": func() error { return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED} },
	"503":     func() error { return &StatusError{Status: 503} },
}

// TestRetryBudgetRidesOutOutage: with the default policy, a store unreachable for
// 60 s in the middle of a read, or before a Stat, costs a pause: the read resumes at
// its byte offset and delivers the object exactly, the Stat succeeds, within the
// largest backoff (and the rate limiter's 1 s) of the store's return; the outage is
// counted once and logged in two lines, whatever the retries.
func TestRetryBudgetRidesOutOutage(t *testing.T) {
	const outage = 60 * time.Second
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	for name, fail := range outageErrors {
		t.Run(name+"/read", func(t *testing.T) {
			src := &downSource{clk: newTestClock(), data: data, breakAt: 300_000, downFor: outage, fail: fail}
			f, log := outageFetcher(src, RetryPolicy{})
			retries0, resumes0 := Retries()
			outages0 := Outages()
			rc, err := f.Open(t.Context(), "s3://bucket/shard.tar")
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read %d bytes, %v; want the %d bytes of the object", len(got), err, len(data))
			}
			took := src.clk.now().Sub(src.downFrom)
			if took < outage || took > outage+DefaultMaxBackoff+time.Second {
				t.Errorf("the read ended %v after the store went down for %v; want within %v of its return", took, outage, DefaultMaxBackoff+time.Second)
			}
			retries, resumes := Retries()
			if retries-retries0 <= DefaultAttempts+5 || resumes-resumes0 < 1 {
				t.Errorf("%d retries, %d resumed; want more than 5 retries (the old policy's attempts), and a resume", retries-retries0, resumes-resumes0)
			}
			if n := Outages() - outages0; n != 1 {
				t.Errorf("%d outages counted; want 1", n)
			}
			if log.count("store unreachable for s3://bucket/shard.tar") != 1 || log.count("store back for s3://bucket after 1m") != 1 || len(log.l) != 2 {
				t.Errorf("log lines %q; want one saying the store is unreachable, one that it is back after 1m", log.l)
			}
		})
		t.Run(name+"/stat", func(t *testing.T) {
			src := &downSource{clk: newTestClock(), data: data, breakAt: -1, downFor: outage, fail: fail}
			f, _ := outageFetcher(src, RetryPolicy{})
			start := src.clk.now()
			info, err := f.Stat(t.Context(), "s3://bucket/shard.tar")
			if err != nil || info.Size != int64(len(data)) {
				t.Fatalf("Stat = %+v, %v", info, err)
			}
			if took := src.clk.now().Sub(start); took < outage || took > outage+DefaultMaxBackoff+time.Second {
				t.Errorf("the Stat took %v of a %v outage", took, outage)
			}
		})
	}
}

// TestRetryBudgetGivesUp: a store that stays down fails a read, and a Stat, once
// the retry budget has passed since the first failure (not before, not much after),
// with an error naming the URL, the attempts and the time; Attempts, when set, ends
// it sooner.
func TestRetryBudgetGivesUp(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 1<<20)
	for name, fail := range outageErrors {
		t.Run(name, func(t *testing.T) {
			for _, budget := range []time.Duration{0, 5 * time.Minute} {
				want := budget
				if want == 0 {
					want = DefaultRetryBudget
				}
				src := &downSource{clk: newTestClock(), data: data, breakAt: 300_000, downFor: time.Hour, fail: fail}
				f, _ := outageFetcher(src, RetryPolicy{Budget: budget})
				rc, err := f.Open(t.Context(), "s3://bucket/shard.tar")
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				took := src.clk.now().Sub(src.downFrom)
				if !errors.Is(err, ErrRetriesExhausted) || !strings.Contains(err.Error(), "s3://bucket/shard.tar") ||
					!strings.Contains(err.Error(), " attempts over ") {
					t.Errorf("budget %v: read %d bytes, %v; want retries exhausted naming the URL, the attempts and the time", budget, len(got), err)
				}
				if took < want || took > want+2*time.Second {
					t.Errorf("budget %v: gave up %v after the store went down; want %v", budget, took, want)
				}

				src = &downSource{clk: newTestClock(), data: data, breakAt: -1, downFor: time.Hour, fail: fail}
				f, _ = outageFetcher(src, RetryPolicy{Budget: budget})
				start := src.clk.now()
				_, err = f.Stat(t.Context(), "s3://bucket/shard.tar")
				if took := src.clk.now().Sub(start); !errors.Is(err, ErrRetriesExhausted) || took < want || took > want+2*time.Second {
					t.Errorf("budget %v: Stat gave up after %v: %v", budget, took, err)
				}
			}

			src := &downSource{clk: newTestClock(), data: data, breakAt: -1, downFor: time.Hour, fail: fail}
			f, _ := outageFetcher(src, RetryPolicy{Attempts: 3})
			_, err := f.Stat(t.Context(), "s3://bucket/shard.tar")
			if !errors.Is(err, ErrRetriesExhausted) || src.requests != 3 {
				t.Errorf("Attempts 3: %d requests, %v", src.requests, err)
			}
		})
	}
}

// The outage's log line says how long the request is retried for: its budget, or
// less when the caller's deadline (the start's, say) ends sooner.
func TestOutageLineSaysTheDeadline(t *testing.T) {
	for _, c := range []struct {
		timeout time.Duration
		want    string
	}{{0, "retrying for up to 2m0s"}, {3 * time.Second, "retrying for up to 3s"}} {
		src := &downSource{clk: newTestClock(), data: []byte("x"), breakAt: -1, downFor: time.Hour, fail: outageErrors["refused"]}
		f, l := outageFetcher(src, RetryPolicy{})
		ctx := t.Context()
		if c.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, c.timeout)
			defer cancel()
		}
		f.Stat(ctx, "s3://bucket/shard.tar")
		l.mu.Lock()
		first := ""
		if len(l.l) > 0 {
			first = l.l[0]
		}
		l.mu.Unlock()
		if !strings.Contains(first, c.want) {
			t.Errorf("timeout %v: the outage's first line is %q, want %q in it", c.timeout, first, c.want)
		}
	}
}
