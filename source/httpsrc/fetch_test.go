package httpsrc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/sourcetest"
)

// objServer serves one object over HTTP with ETag, If-Match and Range, and lets a
// test inject a fault into any GET.
type objServer struct {
	*httptest.Server
	mu          sync.Mutex
	data        []byte
	etag        string
	gets, heads int
	inflight    int
	maxInflight int
	// inflightFrom is the first GET counted in flight: a handler still returning
	// after the client has its whole answer overlaps the next request.
	inflightFrom int
	// fault, if set, may take over GET number n (from 1) and report true; body is
	// what the request would get.
	fault       func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool
	ignoreRange bool
	// noETag leaves the ETag out of every answer; lastModified, when set, is the
	// Last-Modified of every answer (If-Unmodified-Since is honoured against it).
	noETag       bool
	lastModified time.Time
	// before, if set, runs at the start of GET number n with mu held.
	before func(n int, s *objServer)
}

func newObjServer(t *testing.T, data []byte) *objServer {
	s := &objServer{}
	s.set(data)
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// set replaces the object, with a new ETag.
func (s *objServer) set(data []byte) {
	s.data = data
	s.etag = fmt.Sprintf("\"%x-%d\"", len(data), rand.Uint64())
}

// validators sets the ETag and Last-Modified of an answer. Called with mu held.
func (s *objServer) validators(h http.Header) {
	if !s.noETag {
		h.Set("ETag", s.etag)
	}
	if !s.lastModified.IsZero() {
		h.Set("Last-Modified", s.lastModified.UTC().Format(http.TimeFormat))
	}
}

func (s *objServer) counts() (gets, heads int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets, s.heads
}

func (s *objServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if r.Method == http.MethodHead {
		s.heads++
		data := s.data
		s.validators(w.Header())
		s.mu.Unlock()
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		return
	}
	s.gets++
	n := s.gets
	if s.before != nil {
		s.before(n, s)
	}
	data, etag, lastMod := s.data, s.etag, s.lastModified
	s.validators(w.Header())
	counted := n >= s.inflightFrom
	if counted {
		s.inflight++
		s.maxInflight = max(s.maxInflight, s.inflight)
	}
	fault := s.fault
	s.mu.Unlock()
	defer func() {
		if counted {
			s.mu.Lock()
			s.inflight--
			s.mu.Unlock()
		}
	}()
	if m := r.Header.Get("If-Match"); m != "" && m != etag {
		w.WriteHeader(http.StatusPreconditionFailed)
		return
	}
	if t, err := http.ParseTime(r.Header.Get("If-Unmodified-Since")); err == nil && !lastMod.IsZero() && lastMod.After(t) {
		w.WriteHeader(http.StatusPreconditionFailed)
		return
	}
	body, status := data, http.StatusOK
	if rng := r.Header.Get("Range"); rng != "" && !s.ignoreRange {
		a, b, _ := strings.Cut(strings.TrimPrefix(rng, "bytes="), "-")
		start, _ := strconv.Atoi(a)
		end := len(data) - 1
		if b != "" {
			end, _ = strconv.Atoi(b)
			end = min(end, len(data)-1)
		}
		if start >= len(data) {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", len(data)))
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return
		}
		body, status = data[start:end+1], http.StatusPartialContent
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end, len(data)))
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	if fault != nil && fault(n, w, r, body) {
		return
	}
	w.WriteHeader(status)
	w.Write(body)
}

// Faults.

// statusOf is the status the headers set so far call for: 206 with a Content-Range.
func statusOf(w http.ResponseWriter) int {
	if w.Header().Get("Content-Range") != "" {
		return http.StatusPartialContent
	}
	return http.StatusOK
}

// resetAfter sends the headers and k bytes, then resets the TCP connection.
func resetAfter(k int, w http.ResponseWriter, body []byte) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\n", statusOf(w), http.StatusText(statusOf(w)))
	w.Header().Write(buf)
	buf.WriteString("\r\n")
	buf.Write(body[:min(k, len(body))])
	buf.Flush()
	conn.(*net.TCPConn).SetLinger(0) // close sends RST
	conn.Close()
}

// shortBody sends the headers with the full Content-Length but only k bytes.
func shortBody(k int, w http.ResponseWriter, body []byte) {
	w.WriteHeader(statusOf(w))
	w.Write(body[:min(k, len(body))])
}

// stallAfterHeaders sends the headers and k bytes, then sends nothing more until the
// client gives up.
func stallAfterHeaders(k int, w http.ResponseWriter, r *http.Request, body []byte) {
	w.WriteHeader(statusOf(w))
	w.Write(body[:min(k, len(body))])
	http.NewResponseController(w).Flush()
	<-r.Context().Done()
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestFetcherFaults(t *testing.T) {
	const size, partSize = 1<<20 + 123, 64 << 10
	parts := (size + partSize - 1) / partSize
	data := randomBytes(size, 1)
	tests := []struct {
		name        string
		fault       func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool
		ignoreRange bool
		stall       time.Duration
		extraGets   int             // GETs beyond one per part (one per stream when serial)
		wantSleeps  []time.Duration // nil: one unchecked sleep per extra GET
		wantErr     error
	}{
		{name: "clean"},
		{name: "connection reset after N bytes", extraGets: 2,
			fault: func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
				if n <= 2 {
					resetAfter(1000*n, w, body)
					return true
				}
				return false
			}},
		{name: "body shorter than Content-Length", extraGets: 1,
			fault: func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
				if n == 1 {
					shortBody(len(body)/2, w, body)
					return true
				}
				return false
			}},
		{name: "stall after the headers", stall: 300 * time.Millisecond, extraGets: 1,
			fault: func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
				if n == 1 {
					stallAfterHeaders(10, w, r, body)
					return true
				}
				return false
			}},
		{name: "503 SlowDown for the first 3 requests", extraGets: 3,
			wantSleeps: []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}, // Retry-After 7, capped
			fault: func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
				if n <= 3 {
					sourcetest.SlowDown(w, "7")
					return true
				}
				return false
			}},
		{name: "Range ignored", ignoreRange: true},
	}
	// Three ways to read: one stream; parallel parts; and the default, a first part
	// that decides (here always for one stream, the same request going on).
	modes := []struct {
		name       string
		parallel   int
		singleRate float64
	}{{"serial", 1, 0}, {"parts", 4, -1}, {"probe", 4, 1}}
	for _, tt := range tests {
		for _, mode := range modes {
			parallel := mode.parallel
			t.Run(tt.name+"/"+mode.name, func(t *testing.T) {
				srv := newObjServer(t, data)
				srv.fault, srv.ignoreRange = tt.fault, tt.ignoreRange
				var sl sourcetest.Sleeps
				stall := tt.stall
				if stall == 0 {
					stall = 30 * time.Second
				}
				f := source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{PartSize: partSize, Parallel: parallel, SingleRate: mode.singleRate,
					Retry: source.RetryPolicy{Attempts: 4, MaxRetryAfter: 2 * time.Second, StallTimeout: stall, Sleep: sl.Sleep}})
				rc, err := f.Open(sourcetest.Guard(t), srv.URL+"/shard.tar")
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("read %d bytes, %v; want the object's %d bytes exactly", len(got), err, len(data))
				}
				wantGets := 1 + tt.extraGets
				if mode.singleRate < 0 {
					wantGets = parts + tt.extraGets
				}
				gets, heads := srv.counts()
				if gets != wantGets || heads != 1 {
					t.Errorf("%d GETs, %d HEADs; want %d, 1", gets, heads, wantGets)
				}
				s := sl.Get()
				if len(s) != tt.extraGets {
					t.Errorf("slept %d times (%v); want %d", len(s), s, tt.extraGets)
				}
				if tt.wantSleeps != nil && fmt.Sprint(s) != fmt.Sprint(tt.wantSleeps) {
					t.Errorf("slept %v; want %v", s, tt.wantSleeps)
				}
			})
		}
	}
}

func TestFetcherFailures(t *testing.T) {
	const size, partSize = 1<<20 + 123, 64 << 10
	data := randomBytes(size, 2)
	newData := randomBytes(size, 3)
	for _, parallel := range []int{1, 4} {
		newFetcher := func(srv *objServer, sl *sourcetest.Sleeps) *source.Fetcher {
			return source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{PartSize: partSize, Parallel: parallel,
				Retry: source.RetryPolicy{Attempts: 3, StallTimeout: 30 * time.Second, Sleep: sl.Sleep}})
		}
		t.Run(fmt.Sprintf("always 500/parallel=%d", parallel), func(t *testing.T) {
			srv := newObjServer(t, data)
			srv.fault = func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
				w.WriteHeader(http.StatusInternalServerError)
				return true
			}
			var sl sourcetest.Sleeps
			rc, err := newFetcher(srv, &sl).Open(sourcetest.Guard(t), srv.URL+"/x.tar")
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			var se *source.Error
			if len(got) != 0 || !errors.Is(err, source.ErrRetriesExhausted) || !errors.As(err, &se) ||
				!strings.Contains(err.Error(), srv.URL+"/x.tar") || !strings.Contains(err.Error(), "500") {
				t.Fatalf("read %d bytes, %v; want nothing and retries exhausted naming the URL and status", len(got), err)
			}
			if gets, _ := srv.counts(); parallel == 1 && gets != 3 || gets < 3 {
				t.Errorf("%d GETs; want 3 per part tried", gets)
			}
		})
		t.Run(fmt.Sprintf("object overwritten mid-read/parallel=%d", parallel), func(t *testing.T) {
			srv := newObjServer(t, data)
			// The first GET is cut short and the object replaced before the second:
			// a resumed or later part must not read the new version.
			srv.fault = func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
				if n == 1 {
					resetAfter(5000, w, body)
					return true
				}
				return false
			}
			srv.before = func(n int, s *objServer) {
				if n == 2 {
					s.set(newData)
				}
			}
			var sl sourcetest.Sleeps
			rc, err := newFetcher(srv, &sl).Open(sourcetest.Guard(t), srv.URL+"/x.tar")
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if !errors.Is(err, source.ErrChanged) || !bytes.Equal(got, data[:len(got)]) {
				t.Fatalf("read %d bytes, %v; want a prefix of the first version and source.ErrChanged", len(got), err)
			}
			if len(got) == size {
				t.Errorf("read the whole object across a change")
			}
		})
		t.Run(fmt.Sprintf("not found/parallel=%d", parallel), func(t *testing.T) {
			srv := httptest.NewServer(http.NotFoundHandler())
			defer srv.Close()
			var sl sourcetest.Sleeps
			f := source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{Parallel: parallel, Retry: source.RetryPolicy{Sleep: sl.Sleep}})
			_, err := f.Open(t.Context(), srv.URL+"/missing.tar")
			var se *source.Error
			if !errors.Is(err, source.ErrNotFound) || !errors.As(err, &se) || se.Op != "open" || se.URL != srv.URL+"/missing.tar" {
				t.Errorf("Open = %v; want an open *source.Error wrapping source.ErrNotFound", err)
			}
			if len(sl.Get()) != 0 {
				t.Errorf("retried a missing object")
			}
		})
	}
}

// TestFetcherParallel checks that parts are in flight at once, never more than
// Parallel, and that a stream can be closed or canceled mid-object without hanging.
func TestFetcherParallel(t *testing.T) {
	const size, partSize, parallel = 4<<20 + 5, 256 << 10, 4
	data := randomBytes(size, 4)
	srv := newObjServer(t, data)
	// The first `parallel` GETs wait for each other: a fetcher that sent one part at
	// a time would never get past this barrier (the guard context ends the test).
	var barrier sync.WaitGroup
	barrier.Add(parallel)
	srv.fault = func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
		if n <= parallel {
			barrier.Done()
			barrier.Wait()
		}
		return false
	}
	f := source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{PartSize: partSize, Parallel: parallel, SingleRate: -1})
	rc, err := f.OpenRange(sourcetest.Guard(t), srv.URL+"/x.tar", 1000, size)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(got, data[1000:]) {
		t.Fatalf("read %d bytes, %v; want %d", len(got), err, size-1000)
	}
	rc.Close()
	rc.Close() // idempotent
	srv.mu.Lock()
	maxIn := srv.maxInflight
	srv.mu.Unlock()
	if maxIn != parallel {
		t.Errorf("at most %d requests in flight; want exactly Parallel = %d", maxIn, parallel)
	}

	t.Run("close mid-object", func(t *testing.T) {
		rc, err := f.Open(sourcetest.Guard(t), srv.URL+"/x.tar")
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 100)
		if _, err := io.ReadFull(rc, buf); err != nil || !bytes.Equal(buf, data[:100]) {
			t.Fatalf("first bytes: %v", err)
		}
		rc.Close() // waits for the parts in flight
		if _, err := rc.Read(buf); err == nil {
			t.Errorf("Read after Close succeeded")
		}
	})
	t.Run("canceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(sourcetest.Guard(t))
		rc, err := f.Open(ctx, srv.URL+"/x.tar")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		cancel()
		if _, err := io.ReadAll(rc); !errors.Is(err, context.Canceled) {
			t.Errorf("read after cancel = %v; want context.Canceled", err)
		}
	})
}

// TestFetcherTuning checks that a context's source.Tuning sets the parts of the
// reads opened with it: their number in flight and their size (so their count).
func TestFetcherTuning(t *testing.T) {
	const size = 4<<20 + 5
	data := randomBytes(size, 5)
	srv := newObjServer(t, data)
	f := source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{PartSize: 256 << 10, Parallel: 4, SingleRate: -1})
	ctx := source.WithTuning(sourcetest.Guard(t), source.Tuning{PartSize: 1 << 20, Parallel: 2})
	rc, err := f.Open(ctx, srv.URL+"/x.tar")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v; want %d", len(got), err, size)
	}
	srv.mu.Lock()
	gets, maxIn := srv.gets, srv.maxInflight
	srv.mu.Unlock()
	if gets != 5 || maxIn > 2 {
		t.Errorf("%d GETs, at most %d in flight; want 5 parts of 1 MiB, at most 2 at once", gets, maxIn)
	}
}

// The first part decides how the rest is read: as one stream when it arrived at
// SingleRate or faster, else as parallel parts. The rates are set so that the
// decision does not depend on the machine's speed.
func TestFetcherProbe(t *testing.T) {
	const size, partSize, parallel = 2<<20 + 7, 256 << 10, 4
	data := randomBytes(size, 5)
	t.Run("fast: one stream", func(t *testing.T) {
		srv := newObjServer(t, data)
		f := source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{PartSize: partSize, Parallel: parallel, SingleRate: 1})
		rc, err := f.Open(sourcetest.Guard(t), srv.URL+"/x.tar")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		if got, err := io.ReadAll(rc); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read %d bytes, %v; want %d", len(got), err, size)
		}
		srv.mu.Lock()
		gets, maxIn := srv.gets, srv.maxInflight
		srv.mu.Unlock()
		if gets != 1 || maxIn != 1 {
			t.Errorf("%d GETs, at most %d in flight; want the one request for the whole object", gets, maxIn)
		}
	})
	t.Run("slow: parallel parts", func(t *testing.T) {
		srv := newObjServer(t, data)
		srv.inflightFrom = 2 // the parts after the probe
		// GETs 2 to parallel+1 (the rest's first parts) wait for each other.
		var barrier sync.WaitGroup
		barrier.Add(parallel)
		srv.fault = func(n int, w http.ResponseWriter, r *http.Request, body []byte) bool {
			if n >= 2 && n <= parallel+1 {
				barrier.Done()
				barrier.Wait()
			}
			return false
		}
		f := source.NewFetcher(&Source{Client: srv.Client()}, source.FetchOptions{PartSize: partSize, Parallel: parallel, SingleRate: 1e18})
		rc, err := f.Open(sourcetest.Guard(t), srv.URL+"/x.tar")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		var buf bytes.Buffer
		if _, err := io.Copy(&buf, rc); err != nil || !bytes.Equal(buf.Bytes(), data) { // WriteTo
			t.Fatalf("read %d bytes, %v; want %d", buf.Len(), err, size)
		}
		srv.mu.Lock()
		gets, maxIn := srv.gets, srv.maxInflight
		srv.mu.Unlock()
		if want := 1 + (size-partSize+partSize-1)/partSize; gets != want || maxIn != parallel {
			t.Errorf("%d GETs, at most %d in flight; want %d and %d", gets, maxIn, want, parallel)
		}
	})
}

// TestHTTPRangeIgnored checks the HTTP backend alone against a server that answers
// every ranged request with the whole object.
func TestHTTPRangeIgnored(t *testing.T) {
	data := randomBytes(10_000, 5)
	srv := newObjServer(t, data)
	srv.ignoreRange = true
	h := &Source{Client: srv.Client()}
	for _, r := range []struct{ off, n int64 }{{0, 10}, {123, 1000}, {9990, 100}, {5000, -1}, {10_000, 5}} {
		rc, err := h.OpenRange(t.Context(), srv.URL+"/x", r.off, r.n)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		end := int64(len(data))
		if r.n >= 0 {
			end = min(end, r.off+r.n)
		}
		if want := data[min(r.off, end):end]; err != nil || !bytes.Equal(got, want) {
			t.Errorf("OpenRange(%d, %d) read %d bytes, %v; want %d", r.off, r.n, len(got), err, len(want))
		}
	}
}

// TestHTTPWrongContentRange checks that a 206 for other bytes than asked is refused.
func TestHTTPWrongContentRange(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Range", "bytes 0-9/100")
		w.WriteHeader(http.StatusPartialContent)
		w.Write(make([]byte, 10))
	}))
	defer srv.Close()
	_, err := (&Source{Client: srv.Client()}).OpenRange(t.Context(), srv.URL+"/x", 50, 10)
	if err == nil || !strings.Contains(err.Error(), "Content-Range") {
		t.Errorf("OpenRange = %v; want a Content-Range mismatch", err)
	}
}
