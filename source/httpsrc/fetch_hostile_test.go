package httpsrc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/sourcetest"
)

// readModes are the three ways a Fetcher reads an object larger than a part: one
// stream; parallel parts; and a first part that decides (here for one stream).
var readModes = []struct {
	name       string
	parallel   int
	singleRate float64
}{{"serial", 1, 0}, {"parts", 4, -1}, {"probe", 4, 1}}

// TestHTTPVersionPinnedWithoutETag changes an object between the GET that breaks in
// the middle of its body and the next, on origins that give different validators: a
// read must fail rather than mix the two versions, saying why.
func TestHTTPVersionPinnedWithoutETag(t *testing.T) {
	const size, partSize = 1<<20 + 123, 64 << 10
	data := randomBytes(size, 11)
	newData := randomBytes(size, 12)
	longer := randomBytes(size+1000, 13)
	mod := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	tests := []struct {
		name    string
		noETag  bool
		lastMod time.Time
		change  func(s *objServer) // before the second GET; nil: no change
		fault   func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool
		wantErr error  // nil: the read succeeds with the first version
		wantMsg string // in the error
	}{
		{name: "no ETag, no Last-Modified: refuses to resume", noETag: true,
			change:  func(s *objServer) { s.set(newData) },
			wantErr: source.ErrNoVersion, wantMsg: "nothing to pin a version on"},
		{name: "no ETag, no Last-Modified, unchanged: still refuses to resume", noETag: true,
			wantErr: source.ErrNoVersion, wantMsg: "cannot resume"},
		{name: "no ETag, no Last-Modified: a failure before the first byte is retried", noETag: true,
			fault: func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
				if n == 1 {
					sourcetest.SlowDown(w, "0")
					return true
				}
				return false
			}},
		{name: "Last-Modified changes", noETag: true, lastMod: mod,
			change:  func(s *objServer) { s.set(newData); s.lastModified = mod.Add(time.Second) },
			wantErr: source.ErrChanged},
		{name: "Last-Modified same, length changes", noETag: true, lastMod: mod,
			change:  func(s *objServer) { s.set(longer) },
			wantErr: source.ErrChanged},
		{name: "Last-Modified, unchanged: resumes", noETag: true, lastMod: mod},
		{name: "ETag changes", change: func(s *objServer) { s.set(newData) }, wantErr: source.ErrChanged},
		{name: "ETag, unchanged: resumes"},
	}
	for _, tt := range tests {
		for _, mode := range readModes {
			t.Run(tt.name+"/"+mode.name, func(t *testing.T) {
				srv := newObjServer(t, data)
				srv.noETag, srv.lastModified = tt.noETag, tt.lastMod
				fault := tt.fault
				if fault == nil {
					// The first GET is cut off after 5000 bytes of its body.
					fault = func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
						if n == 1 {
							resetAfter(5000, w, body)
							return true
						}
						return false
					}
				}
				var mu sync.Mutex
				var pins []string // the preconditions of the GETs after the first
				srv.fault = func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
					if n > 1 {
						mu.Lock()
						pins = append(pins, r.Header.Get("If-Match")+r.Header.Get("If-Unmodified-Since"))
						mu.Unlock()
					}
					return fault(n, w, r, body)
				}
				srv.before = func(n int, s *objServer) {
					if n == 2 && tt.change != nil {
						tt.change(s)
					}
				}
				var sl sourcetest.Sleeps
				f := source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{PartSize: partSize, Parallel: mode.parallel, SingleRate: mode.singleRate,
					Retry: source.RetryPolicy{Attempts: 4, StallTimeout: 30 * time.Second, Sleep: sl.Sleep}})
				url := srv.URL + "/shard.tar"
				rc, err := f.Open(sourcetest.Guard(t), url)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if tt.wantErr == nil {
					if err != nil || !bytes.Equal(got, data) {
						t.Fatalf("read %d bytes, %v; want the object's %d bytes exactly", len(got), err, len(data))
					}
					mu.Lock()
					defer mu.Unlock()
					for _, p := range pins {
						if tt.fault == nil && p == "" {
							t.Errorf("a resumed GET was not pinned to the version (%q)", pins)
						}
					}
					return
				}
				t.Log(err)
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), url) || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("read %d bytes, %v; want an error naming %s that wraps %v (%q)", len(got), err, url, tt.wantErr, tt.wantMsg)
				}
				if source.IsRetryable(err) {
					t.Errorf("%v is retryable", err)
				}
				if !bytes.Equal(got, data[:len(got)]) || len(got) >= size {
					t.Errorf("read %d bytes that are not a prefix of the first version", len(got))
				}
				if gets, _ := srv.counts(); tt.wantErr == source.ErrNoVersion && gets != 1 {
					t.Errorf("%d GETs; want the one that broke, read as a single stream and not resumed", gets)
				}
			})
		}
	}
}

// TestHTTPDateVersion checks the version an origin without ETag gets, and that a
// ranged answer is checked against it.
func TestHTTPDateVersion(t *testing.T) {
	data := randomBytes(10_000, 14)
	mod := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	srv := newObjServer(t, data)
	srv.noETag, srv.lastModified = true, mod
	h := &Source{Client: srv.Client()}
	url := srv.URL + "/x"
	info, err := h.Stat(t.Context(), url)
	if want := "Mon, 06 May 2024 07:08:09 GMT; 10000 bytes"; err != nil || info.Version != want || info.Size != 10_000 {
		t.Fatalf("Stat = %+v, %v; want version %q", info, err, want)
	}
	rc, err := h.OpenVersion(t.Context(), url, info.Version, 100, 50)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data[100:150]) {
		t.Fatalf("OpenVersion read %d bytes, %v", len(got), err)
	}
	for _, v := range []string{
		"Mon, 06 May 2024 07:08:09 GMT; 10001 bytes", // another length
		"Mon, 06 May 2024 07:08:08 GMT; 10000 bytes", // modified since
	} {
		if _, err := h.OpenVersion(t.Context(), url, v, 100, 50); !errors.Is(err, source.ErrChanged) {
			t.Errorf("OpenVersion(%q) = %v; want source.ErrChanged", v, err)
		}
	}
	// An unquoted ETag (not what RFC 9110 allows, but seen) is compared as an ETag.
	for _, v := range []string{`"abc"`, `W/"abc"`, "abc123", ""} {
		if _, _, ok := dateVersion(v); ok {
			t.Errorf("dateVersion(%q) took an ETag for a date", v)
		}
	}
}

// TestFetcherOpenVersion checks that a Fetcher reads a version only while the source
// holds it.
func TestFetcherOpenVersion(t *testing.T) {
	data := randomBytes(300_000, 15)
	srv := newObjServer(t, data)
	f := source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{PartSize: 64 << 10})
	url := srv.URL + "/x"
	info, err := f.Stat(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := f.OpenVersion(sourcetest.Guard(t), url, info.Version, 1000, -1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data[1000:]) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	srv.mu.Lock()
	srv.set(randomBytes(300_000, 16))
	srv.mu.Unlock()
	if _, err := f.OpenVersion(sourcetest.Guard(t), url, info.Version, 1000, -1); !errors.Is(err, source.ErrChanged) || !strings.Contains(err.Error(), url) {
		t.Errorf("OpenVersion of a replaced object = %v; want source.ErrChanged naming the URL", err)
	}
}

// trickle is a fault that sends the headers and 1,000 bytes of every GET, then
// nothing until the client gives up.
func trickle(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
	stallAfterHeaders(1000, w, r, body)
	return true
}

// TestFetcherRetryDeadline reads from an origin that trickles 1,000 bytes and then
// stalls, on every request, with attempts that start afresh after any progress (as
// they all did before MinProgress) and more attempts than it can use: only the retry
// deadline ends the read, and its error says where and after how many attempts. The
// timers are the stall timeout and the deadline under test; nothing sleeps.
func TestFetcherRetryDeadline(t *testing.T) {
	const size, partSize = 256 << 10, 64 << 10
	const deadline = 300 * time.Millisecond
	data := randomBytes(size, 17)
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) {
			srv := newObjServer(t, data)
			srv.fault = trickle
			var sl sourcetest.Sleeps
			f := source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{PartSize: partSize, Parallel: mode.parallel, SingleRate: mode.singleRate,
				RetryDeadline: deadline,
				Retry:         source.RetryPolicy{Attempts: 1000, MinProgress: -1, StallTimeout: 30 * time.Millisecond, Sleep: sl.Sleep}})
			url := srv.URL + "/slow.tar"
			t0 := time.Now()
			rc, err := f.Open(sourcetest.Guard(t), url)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			took := time.Since(t0)
			t.Log(err)
			if !errors.Is(err, source.ErrRetryDeadline) || source.IsRetryable(err) || !strings.Contains(err.Error(), url) ||
				!strings.Contains(err.Error(), "attempts") || !strings.Contains(err.Error(), "at byte ") {
				t.Fatalf("read %d bytes in %v, %v; want the retry deadline naming the URL, the offset and the attempts", len(got), took, err)
			}
			if !bytes.Equal(got, data[:len(got)]) {
				t.Errorf("read %d bytes that are not the object's", len(got))
			}
			if took < deadline {
				t.Errorf("failed after %v, before the deadline %v", took, deadline)
			}
			gets, _ := srv.counts()
			if mode.parallel == 1 {
				// One stream: it got to len(got), in gets attempts, or one more whose
				// request the deadline cut before the server saw it.
				want := fmt.Sprintf("at byte %d of %d, after %d attempts", len(got), size, gets)
				orOne := fmt.Sprintf("at byte %d of %d, after %d attempts", len(got), size, gets+1)
				if !strings.Contains(err.Error(), want) && !strings.Contains(err.Error(), orOne) {
					t.Errorf("%v; want %q", err, want)
				}
			}
			if gets < 2 {
				t.Errorf("%d GETs; want retries before the deadline", gets)
			}
		})
	}
}

// TestFetcherTrickleRunsOutOfAttempts: 1,000 bytes per attempt is less than
// MinProgress, so it does not start the attempts afresh and the read fails after
// Attempts requests, well before any deadline.
func TestFetcherTrickleRunsOutOfAttempts(t *testing.T) {
	const size = 256 << 10
	data := randomBytes(size, 18)
	srv := newObjServer(t, data)
	srv.fault = trickle
	var sl sourcetest.Sleeps
	f := source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{Parallel: 1,
		Retry: source.RetryPolicy{Attempts: 4, StallTimeout: 100 * time.Millisecond, Sleep: sl.Sleep}})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // a guard only
	defer cancel()
	rc, err := f.Open(ctx, srv.URL+"/slow.tar")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if !errors.Is(err, source.ErrRetriesExhausted) || len(got) > 4000 || !bytes.Equal(got, data[:len(got)]) {
		t.Fatalf("read %d bytes, %v; want at most 4 × 1000 and retries exhausted", len(got), err)
	}
	if gets, _ := srv.counts(); gets != 4 {
		t.Errorf("%d GETs; want 4", gets)
	}
}

// TestFetcherProgressStartsAttemptsAfresh: attempts that each deliver MinProgress
// bytes or more before they break start the count afresh, so a read through a
// connection that breaks every 100 kB gets through with Attempts 2.
func TestFetcherProgressStartsAttemptsAfresh(t *testing.T) {
	const size = 1 << 20
	data := randomBytes(size, 19)
	srv := newObjServer(t, data)
	srv.fault = func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
		if n <= 3 {
			resetAfter(100_000, w, body)
			return true
		}
		return false
	}
	var sl sourcetest.Sleeps
	f := source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{Parallel: 1,
		Retry: source.RetryPolicy{Attempts: 2, MinProgress: 64 << 10, StallTimeout: 30 * time.Second, Sleep: sl.Sleep}})
	rc, err := f.Open(sourcetest.Guard(t), srv.URL+"/x.tar")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v; want all %d", len(got), err, size)
	}
	if gets, _ := srv.counts(); gets != 4 {
		t.Errorf("%d GETs; want 4", gets)
	}
}
