package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/shardload/shardload/source"
)

// A store that throttles: bench's report and its JSON say what the request rate
// limiter did to the endpoint, and serve --metrics exposes the same figures under
// the endpoint's label.
func TestRateLimiterReported(t *testing.T) {
	dir := t.TempDir()
	if code, _, stderr := runCLI(t, "gen", "--shards", "2", "--samples", "8", dir); code != 0 {
		t.Fatalf("gen: %s", stderr)
	}
	// The first three requests get a 429, the rest the files.
	var throttle atomic.Int64
	throttle.Store(3)
	files := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if throttle.Add(-1) >= 0 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		files.ServeHTTP(w, r)
	}))
	defer srv.Close()
	endpoint := source.EndpointOf(srv.URL)

	code, out, stderr := runCLI(t, "bench", "--json", "--no-index-store", "--field", "jpg", "--batch-size", "4",
		srv.URL+"/train-{000000..000001}.tar")
	if code != 0 {
		t.Fatalf("bench: exit %d: %s", code, stderr)
	}
	var res benchResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, out)
	}
	var got *rateLimitResult
	for i, e := range res.RateLimit {
		if e.Endpoint == endpoint {
			got = &res.RateLimit[i]
		}
	}
	if got == nil || got.Throttled != 3 || got.Decreases < 1 || got.Rate <= 0 {
		t.Fatalf("bench's rate_limit %+v: want %s throttled 3 times, its rate lowered, a limit in force", res.RateLimit, endpoint)
	}
	if res.Samples == 0 {
		t.Error("bench read no samples (the throttled requests are retried)")
	}
	var report bytes.Buffer
	if err := res.report(&report); err != nil {
		t.Fatal(err)
	}
	t.Logf("bench's report:\n%s", report.String())
	if !strings.Contains(report.String(), "rate limit "+endpoint+": 3 throttling answers") {
		t.Errorf("bench's report says nothing of the rate limit:\n%s", report.String())
	}

	// The same process's serve: its metrics show the limiter's figures.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--socket", filepath.Join(t.TempDir(), "s.sock"), "--metrics", "127.0.0.1:0",
			filepath.Join(dir, "train-000000.tar")}, pw, io.Discard)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	var url string
	for sc.Scan() {
		if _, after, ok := strings.Cut(sc.Text(), "metrics on "); ok {
			url = after
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if url == "" {
		t.Fatal("serve printed no metrics address")
	}
	fams, _, err := scrapeMetrics(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	var now source.EndpointStats // the limiter's figures at the scrape (no request since)
	for _, e := range source.DefaultRateLimiter.Endpoints() {
		if e.Endpoint == endpoint {
			now = e
		}
	}
	for _, m := range []struct {
		name string
		want float64
	}{
		{"shardload_request_throttles_total", 3},
		{"shardload_request_rate_decreases_total", float64(got.Decreases)},
		{"shardload_request_rate_limit", now.Rate},
		{"shardload_request_rate_waits_total", float64(now.Waits)},
		{"shardload_request_rate_wait_seconds_total", now.Waited.Seconds()},
	} {
		if _, ok := fams[m.name]; !ok {
			t.Errorf("no %s", m.name)
		} else if v := counter(fams, m.name, "endpoint", endpoint); v != m.want {
			t.Errorf("%s{endpoint=%q} = %v, want %v", m.name, endpoint, v, m.want)
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("serve exited %d", code)
	}
}
