package sourcetest

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Guard returns a context that ends a test that would otherwise hang (60 s): a
// safety net, never what a test asserts.
func Guard(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// ReadAll reads rc to its end and closes it, reporting a failed Close.
func ReadAll(t testing.TB, rc io.ReadCloser) ([]byte, error) {
	t.Helper()
	b, err := io.ReadAll(rc)
	if cerr := rc.Close(); cerr != nil {
		t.Errorf("Close: %v", cerr)
	}
	return b, err
}

// SlowDown answers as S3 does when it throttles: 503 SlowDown with a Retry-After.
func SlowDown(w http.ResponseWriter, retryAfter string) {
	w.Header().Del("ETag")
	w.Header().Del("Content-Length")
	w.Header().Set("Retry-After", retryAfter)
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>")
}

// Sleeps records the backoffs a retry policy asks for, without waiting: use Sleep as
// source.RetryPolicy.Sleep.
type Sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

// Sleep records d and returns at once (ctx's error, if it is done).
func (s *Sleeps) Sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

// Get returns the backoffs recorded so far.
func (s *Sleeps) Get() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}
