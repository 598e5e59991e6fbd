package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestIsRetryable(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("something odd"), false},
		{&Error{Op: "read", URL: "s3://b/k", Err: fmt.Errorf("%w: read 1 of 2", ErrShortRead)}, true},
		{&Error{Op: "read", URL: "u", Err: io.ErrUnexpectedEOF}, true},
		{&Error{Op: "read", URL: "u", Err: ErrStalled}, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true},
		{&StatusError{Status: http.StatusServiceUnavailable, Code: "SlowDown"}, true},
		{&StatusError{Status: http.StatusTooManyRequests}, true},
		{&StatusError{Status: http.StatusNotImplemented}, false},
		{&StatusError{Status: http.StatusBadRequest}, false},
		{&Error{Op: "open", URL: "u", Err: fmt.Errorf("%w: %w", ErrNotFound, &StatusError{Status: 404})}, false},
		{&Error{Op: "open", URL: "u", Err: fmt.Errorf("%w: x", ErrPermission)}, false},
		{&Error{Op: "open", URL: "u", Err: fmt.Errorf("%w: x", ErrChanged)}, false},
		{&Error{Op: "read", URL: "u", Err: context.Canceled}, false},
		{context.DeadlineExceeded, false},
	}
	for _, tt := range tests {
		if got := IsRetryable(tt.err); got != tt.want {
			t.Errorf("IsRetryable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	p := RetryPolicy{BaseBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, MaxRetryAfter: 5 * time.Second}
	for retry, hi := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		3: 400 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 30: time.Second} {
		var low, high bool // full jitter: waits from the whole of [0, hi]
		for range 200 {
			d := p.Backoff(retry, errors.New("x"))
			if d < 0 || d > hi {
				t.Fatalf("Backoff(%d) = %v; want in [0, %v]", retry, d, hi)
			}
			low, high = low || d < hi/4, high || d > hi*3/4
		}
		if !low || !high {
			t.Errorf("Backoff(%d): 200 waits, none below %v or none above %v", retry, hi/4, hi*3/4)
		}
	}
	if d := p.Backoff(1, &StatusError{Status: 503, RetryAfterHint: 3 * time.Second}); d != 3*time.Second {
		t.Errorf("Backoff with Retry-After 3s = %v", d)
	}
	if d := p.Backoff(1, &StatusError{Status: 503, RetryAfterHint: time.Hour}); d != 5*time.Second {
		t.Errorf("Backoff with Retry-After 1h = %v; want the 5s cap", d)
	}
	h := http.Header{}
	h.Set("Retry-After", "12")
	if d := ParseRetryAfter(h, time.Now()); d != 12*time.Second {
		t.Errorf("ParseRetryAfter(12) = %v", d)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h.Set("Retry-After", now.Add(90*time.Second).Format(http.TimeFormat))
	if d := ParseRetryAfter(h, now); d != 90*time.Second {
		t.Errorf("ParseRetryAfter(date) = %v", d)
	}
}

func TestRetryDo(t *testing.T) {
	var sl sleeps
	p := RetryPolicy{Attempts: 3, Sleep: sl.sleep}
	calls := 0
	err := p.Do(t.Context(), func(int) error { calls++; return &StatusError{Status: 500} })
	if calls != 3 || !errors.Is(err, ErrRetriesExhausted) || len(sl.get()) != 2 {
		t.Errorf("always failing: %d calls, %d sleeps, %v", calls, len(sl.get()), err)
	}
	calls = 0
	err = p.Do(t.Context(), func(int) error { calls++; return ErrNotFound })
	if calls != 1 || !errors.Is(err, ErrNotFound) || errors.Is(err, ErrRetriesExhausted) {
		t.Errorf("not retryable: %d calls, %v", calls, err)
	}
	calls = 0
	before, _ := Retries()
	err = p.Do(t.Context(), func(a int) error {
		calls++
		if a < 2 {
			return io.ErrUnexpectedEOF
		}
		return nil
	})
	if calls != 2 || err != nil {
		t.Errorf("second try succeeds: %d calls, %v", calls, err)
	}
	if after, _ := Retries(); after < before+1 {
		t.Errorf("Retries went from %d to %d over a retried request", before, after)
	}
}

func TestRedact(t *testing.T) {
	tests := map[string]string{
		"https://user:hunter2@host/x.tar":                         "https://REDACTED@host/x.tar",
		"https://host/x.tar?X-Amz-Signature=abc&X-Amz-Expires=60": "https://host/x.tar?X-Amz-Signature=REDACTED&X-Amz-Expires=60",
		"s3://bucket/key with space.tar":                          "s3://bucket/key with space.tar",
		"http://host/x.tar":                                       "http://host/x.tar",
	}
	for in, want := range tests {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q; want %q", in, got, want)
		}
	}
	err := &Error{Op: "open", URL: "https://user:hunter2@host/x.tar", Err: ErrNotFound}
	if got := err.Error(); got != "open https://REDACTED@host/x.tar: source: object not found" {
		t.Errorf("Error() = %q", got)
	}
}

func TestIsRetryableURLError(t *testing.T) {
	// url.Error is a net.Error; only its timeouts and connection failures retry.
	bad := &url.Error{Op: "Get", URL: "https://x", Err: errors.New("failed to parse private key")}
	if IsRetryable(bad) {
		t.Errorf("IsRetryable(%v) = true", bad)
	}
	refused := &url.Error{Op: "Get", URL: "http://x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	if !IsRetryable(refused) {
		t.Errorf("IsRetryable(%v) = false", refused)
	}
}

// sleeps records the backoffs a policy asked for, without waiting.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) get() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}
