package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// probe answers GET path on mux: the status and the body.
func probe(t *testing.T, mux http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

// /readyz says ready only once the server accepts trainers on a socket that exists
// and the store has answered within readyFresh; /livez says live throughout, the
// store answering or not.
func TestReadyzSocketAndStore(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "loader.sock")
	var storeErr atomic.Pointer[error]
	down := errors.New("connection refused")
	storeErr.Store(&down)
	now := time.Unix(1000, 0)
	h := &health{socket: sock, what: "s3://b/train-000000.tar", now: func() time.Time { return now },
		check: func(context.Context) error { return *storeErr.Load() }}
	mux := http.NewServeMux()
	h.handle(mux)
	live := func(when string) {
		t.Helper()
		if code, body := probe(t, mux, "/livez"); code != http.StatusOK {
			t.Errorf("%s: /livez %d %q", when, code, body)
		}
	}
	ready := func(when string, want int, wantBody string) {
		t.Helper()
		code, body := probe(t, mux, "/readyz")
		if code != want || !strings.Contains(body, wantBody) {
			t.Errorf("%s: /readyz %d %q, want %d and %q", when, code, body, want, wantBody)
		}
	}

	ready("before the socket", http.StatusServiceUnavailable, "does not accept trainers")
	live("before the socket")
	h.setServing(true)
	ready("serving, no socket file", http.StatusServiceUnavailable, "socket")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ready("socket listens, store not checked", http.StatusServiceUnavailable, "not checked yet")
	h.checkStore(context.Background())
	ready("socket listens, store down", http.StatusServiceUnavailable, "connection refused")
	live("store down")

	var ok error
	storeErr.Store(&ok)
	h.checkStore(context.Background())
	ready("socket and store", http.StatusOK, "the store answered")

	// The store goes away: ready for readyFresh on the last answer, then not.
	storeErr.Store(&down)
	now = now.Add(readyFresh / 2)
	h.checkStore(context.Background())
	ready("store away briefly", http.StatusOK, "ready")
	now = now.Add(readyFresh)
	h.checkStore(context.Background())
	ready("store away", http.StatusServiceUnavailable, "last answered")
	live("store away")

	// A server without a dataset of its own is ready on its socket alone.
	h.check = nil
	ready("no dataset", http.StatusOK, "no dataset")
	ln.Close() // removes the socket file
	ready("socket gone", http.StatusServiceUnavailable, "socket")
	h.setServing(false)
	ready("stopping", http.StatusServiceUnavailable, "does not accept trainers")
	live("stopping")
}

// The serve command serves the probes on its --metrics listener: ready once its
// socket listens and an HTTP store answers for the dataset's first shard; when the
// store goes away, not ready, but live, and the process keeps serving.
func TestServeProbesStoreDown(t *testing.T) {
	saved := [3]time.Duration{readyEvery, readyFresh, readyTimeout}
	readyEvery, readyFresh, readyTimeout = 20*time.Millisecond, 200*time.Millisecond, time.Second
	t.Cleanup(func() { readyEvery, readyFresh, readyTimeout = saved[0], saved[1], saved[2] })

	dir := t.TempDir()
	if code, _, stderr := runCLI(t, "gen", "--shards", "1", "--samples", "8", dir); code != 0 {
		t.Fatalf("gen: %s", stderr)
	}
	store := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer store.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	sock := filepath.Join(t.TempDir(), "s.sock")
	go func() {
		done <- run(ctx, []string{"serve", "--socket", sock, "--metrics", "127.0.0.1:0", "--retry-attempts", "1",
			"--sched-batch=false", "--no-index-store", store.URL + "/train-000000.tar"}, pw, io.Discard)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	var base string
	for sc.Scan() {
		if _, after, ok := strings.Cut(sc.Text(), "metrics on "); ok {
			base = strings.TrimSuffix(after, "/metrics")
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if base == "" {
		t.Fatal("serve printed no metrics address")
	}
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor := func(path string, want int) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, body := get(path)
			if code == want {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s: %d %q, want %d", path, code, body, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if body := waitFor("/readyz", http.StatusOK); !strings.Contains(body, sock) || !strings.Contains(body, "train-000000.tar") {
		t.Errorf("/readyz: %q: want the socket and the shard checked", body)
	}
	store.Close()
	if body := waitFor("/readyz", http.StatusServiceUnavailable); !strings.Contains(body, "store") {
		t.Errorf("/readyz with the store down: %q", body)
	}
	if code, body := get("/livez"); code != http.StatusOK {
		t.Errorf("/livez with the store down: %d %q", code, body)
	}
	if c, err := net.Dial("unixpacket", sock); err != nil {
		t.Errorf("the socket with the store down: %v", err)
	} else {
		c.Close()
	}
	select {
	case code := <-done:
		t.Fatalf("serve exited %d with the store down", code)
	default:
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("serve exited %d", code)
	}
}
