package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestProxy: a request through the proxy takes at least the delay, reaches the
// target with the Host header the client sent, its path and query, and its body
// comes back intact.
func TestProxy(t *testing.T) {
	const delay = 100 * time.Millisecond
	type seen struct{ host, uri string }
	got := make(chan seen, 1)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Host, r.RequestURI}
		// Echo, once the whole body is read: Go's HTTP/1 server may close a request's
		// body once the response starts, which cut a streamed echo short at times.
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write(b)
	}))
	defer backend.Close()
	u, err := url.Parse(backend.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(newProxy(u, delay))
	defer proxy.Close()

	body := make([]byte, 3<<20)
	rand.Read(body)
	const uri = "/bench/small/train-000001.tar?x-id=GetObject&partNumber=2"
	req, err := http.NewRequest("PUT", proxy.URL+uri, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "store.example:9000"
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	echoed, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if elapsed < delay {
		t.Errorf("response headers after %v, want at least the delay %v", elapsed, delay)
	}
	s := <-got
	if s.host != req.Host {
		t.Errorf("target saw Host %q, want %q", s.host, req.Host)
	}
	if s.uri != uri {
		t.Errorf("target saw %q, want %q", s.uri, uri)
	}
	if !bytes.Equal(echoed, body) {
		t.Errorf("body: got %d bytes back, want the %d sent, equal", len(echoed), len(body))
	}
}

// TestProxyStreams: the first part of a response reaches the client while the target
// is still writing (no buffering of the body), also with a Content-Length (as an S3
// GET has; ReverseProxy flushes only bodies of unknown length by itself), with
// --log-requests too.
func TestProxyStreams(t *testing.T) {
	for _, logRequests := range []bool{false, true} {
		t.Run(fmt.Sprint("log-requests=", logRequests), func(t *testing.T) { testStreams(t, logRequests) })
	}
}

func testStreams(t *testing.T, logRequests bool) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "13")
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-release: // the client has read the first line
		case <-time.After(10 * time.Second):
		}
		io.WriteString(w, "second\n")
	}))
	defer backend.Close()
	u, _ := url.Parse(backend.URL)
	h := newProxy(u, time.Millisecond)
	if logRequests {
		h = logged(h)
	}
	proxy := httptest.NewServer(h)
	defer proxy.Close()

	type first struct {
		line string
		rest io.ReadCloser
		err  error
	}
	got := make(chan first, 1)
	go func() {
		resp, err := http.Get(proxy.URL + "/x")
		if err != nil {
			got <- first{err: err}
			return
		}
		br := bufio.NewReader(resp.Body)
		l, err := br.ReadString('\n')
		got <- first{l, struct {
			io.Reader
			io.Closer
		}{br, resp.Body}, err}
	}()
	var f first
	select {
	case f = <-got:
	case <-time.After(5 * time.Second):
		unblock()
		f = <-got
		if f.rest != nil {
			f.rest.Close()
		}
		t.Fatal("the first line did not arrive while the target held the rest: the proxy buffers")
	}
	if f.err != nil || f.line != "first\n" {
		t.Fatalf("first line %q, %v", f.line, f.err)
	}
	defer f.rest.Close()
	unblock()
	rest, err := io.ReadAll(f.rest)
	if err != nil || string(rest) != "second\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
}

// TestRun: run prints its URL first, serves through it, and returns nil when its
// context ends (as on SIGINT or SIGTERM).
func TestRun(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer backend.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--target", backend.URL, "--delay", "10ms", "--log-requests"}, pw)
		pw.Close()
	}()
	first, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimSpace(first)
	if !strings.HasPrefix(addr, "http://127.0.0.1:") {
		t.Fatalf("first line %q", first)
	}
	resp, err := http.Get(addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("got %q", b)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
}

// TestRunDirCount: --dir serves files with ranges, --count counts the requests and
// the body bytes sent, and answers them at countPath.
func TestRunDirCount(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("0123456789"), 1000)
	if err := os.WriteFile(filepath.Join(dir, "a.tar"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--dir", dir, "--delay", "0", "--count"}, pw)
		pw.Close()
	}()
	first, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimSpace(first)
	get := func(path, rng string) []byte {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, addr+path, nil)
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if b := get("/a.tar", ""); !bytes.Equal(b, data) {
		t.Fatalf("whole file: %d bytes", len(b))
	}
	if b := get("/a.tar", "bytes=100-199"); !bytes.Equal(b, data[100:200]) {
		t.Fatalf("range: %q", b)
	}
	resp, err := http.Head(addr + "/a.tar")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var c counts
	if err := json.Unmarshal(get(countPath, ""), &c); err != nil {
		t.Fatal(err)
	}
	if want := (counts{Requests: 3, Gets: 2, Heads: 1, Bytes: int64(len(data)) + 100}); c != want {
		t.Fatalf("counts %+v, want %+v", c, want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestParseTarget(t *testing.T) {
	for _, s := range []string{"http://127.0.0.1:9000", "https://h/"} {
		if _, err := parseTarget(s); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	for _, s := range []string{"", "127.0.0.1:9000", "ftp://h", "http://h/base", "http://h?q=1"} {
		if _, err := parseTarget(s); err == nil {
			t.Errorf("%s: no error", s)
		}
	}
}
