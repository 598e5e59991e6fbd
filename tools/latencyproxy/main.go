// Command latencyproxy is an HTTP reverse proxy that holds every request for a fixed
// delay before forwarding it, so that a store on loopback (the benchmarks' MinIO)
// answers with a remote object store's time to first byte. scripts/bench-autotune.sh
// puts it in front of MinIO to measure the loader where per-request latency, not
// bandwidth, is what limits it.
//
// Usage:
//
//	go run ./tools/latencyproxy --target http://127.0.0.1:9000 [--listen 127.0.0.1:0] [--delay 50ms]
//
// It prints the address it listens on as its first line on stdout
// (http://127.0.0.1:NNNN; --listen 127.0.0.1:0 picks a free port), for a script to
// read, and then serves until SIGINT or SIGTERM.
//
// Every request waits --delay (on its own: concurrent requests wait side by side)
// and is then forwarded to --target with its method, path, query, headers and body
// as they came, the Host header included: an S3 client signs (SigV4) the Host it
// sends to, the proxy's address, and the store checks the signature against the
// Host it receives. Only the delay is added: bodies stream through in both
// directions as they arrive, with no buffering, and no X-Forwarded-* headers are
// set. A request whose client goes away during the delay is dropped unforwarded.
// --log-requests writes a line per request to stderr (method, path, Range, status,
// seconds from arrival to the response headers), to count the requests a run makes.
//
// --dir DIR serves the files under DIR (GET and HEAD, with ranges) instead of
// forwarding: a store over HTTP with no server to build. --count counts the
// requests and the response body bytes sent (what a store sent a loader); GET
// /.latencyproxy/count answers the totals so far as JSON ({"requests", "gets",
// "heads", "bytes"}), for a script to take differences around a run.
//
// It lives under tools/ because it is a measuring tool for this repository's
// benchmarks, not part of the shardload command line.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "latencyproxy:", err)
		os.Exit(2)
	}
}

// run parses args, listens, prints the listen URL as one line on stdout and serves
// until ctx is done; then it stops accepting, gives the requests in flight a moment
// to end and returns nil.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("latencyproxy", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "TCP address to listen on (port 0: a free port, printed on stdout)")
	target := fs.String("target", "", "base URL to forward to, e.g. http://127.0.0.1:9000 (required)")
	delay := fs.Duration("delay", 50*time.Millisecond, "time every request waits before it is forwarded")
	logRequests := fs.Bool("log-requests", false, "log every request on stderr")
	dir := fs.String("dir", "", "serve the files under this directory (GET, HEAD, Range) instead of forwarding to --target")
	count := fs.Bool("count", false, "count the requests and the response body bytes sent; GET "+countPath+" answers the totals as JSON")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: latencyproxy (--target URL | --dir DIR) [--listen ADDR] [--delay D] [--log-requests] [--count]\n\n"+
			"Forwards every request to URL (or serves it from DIR) after waiting D, keeping\n"+
			"its Host header, and prints its own URL as the first line on stdout.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 || (*target == "") == (*dir == "") {
		fs.Usage()
		return errors.New("one of --target URL and --dir DIR is required, and no arguments")
	}
	if *delay < 0 {
		return errors.New("--delay must not be negative")
	}
	var next http.Handler
	if *dir != "" {
		if fi, err := os.Stat(*dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("--dir %q: not a directory", *dir)
		}
		next = http.FileServer(http.Dir(*dir))
	} else {
		u, err := parseTarget(*target)
		if err != nil {
			return err
		}
		next = forwarder(u)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	log.SetPrefix("latencyproxy: ")
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	h := delayed(next, *delay)
	if *logRequests {
		h = logged(h)
	}
	if *count {
		h = counted(h)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: time.Minute,
	}
	if _, err := fmt.Fprintf(stdout, "http://%s\n", ln.Addr()); err != nil {
		ln.Close()
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// A benchmark ends its runs before it stops the proxy; a body still streaming
	// then belongs to a killed run and is cut after a short grace.
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	return nil
}

// parseTarget checks that s is an http(s) URL of a host with no path beyond "/":
// requests are forwarded with their own path unchanged (a SigV4 signature covers
// it).
func parseTarget(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("--target: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--target %q: want http://HOST:PORT or https://HOST:PORT", s)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("--target %q: only a scheme and a host, no path, query or user", s)
	}
	return u, nil
}

// newProxy returns the handler: each request waits delay (or until its client goes
// away), then goes to target's scheme and host with its path, query, headers (Host
// included) and body unchanged.
func newProxy(target *url.URL, delay time.Duration) http.Handler {
	return delayed(forwarder(target), delay)
}

// forwarder returns the handler that sends each request to target's scheme and host
// with its path, query, headers (Host included) and body unchanged.
func forwarder(target *url.URL) http.Handler {
	// The default transport keeps two idle connections per host; a loader has tens
	// of requests in flight. No proxy from the environment (the target is the store
	// on this machine), and no transparent gzip: responses pass through as sent.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.MaxIdleConns = 0
	tr.MaxIdleConnsPerHost = 1024
	tr.DisableCompression = true
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			// Not SetURL: it would rewrite the Host and may re-escape the path,
			// both of which the client's signature covers.
			r.Out.URL.Scheme = target.Scheme
			r.Out.URL.Host = target.Host
			r.Out.Host = r.In.Host
		},
		Transport:     tr,
		FlushInterval: -1, // every write goes to the client at once: no buffering
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil { // not the client hanging up
				log.Printf("%s %s: %v", r.Method, r.URL.Path, err)
			}
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	return rp
}

// delayed returns next, each request held delay first (or until its client goes
// away).
func delayed(next http.Handler, delay time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// countPath is where --count answers its totals: a path no S3 request names (a
// bucket's name cannot start with a dot).
const countPath = "/.latencyproxy/count"

// counts is what counted has seen: requests by method and the response body bytes
// sent for them.
type counts struct {
	Requests int64 `json:"requests"`
	Gets     int64 `json:"gets"`
	Heads    int64 `json:"heads"`
	Bytes    int64 `json:"bytes"` // response bodies, as written to the clients
}

// counted wraps h to count its requests and the bytes of its responses' bodies;
// GET countPath answers the totals so far as JSON, itself not counted.
func counted(h http.Handler) http.Handler {
	var mu sync.Mutex
	var c counts
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == countPath {
			mu.Lock()
			b, _ := json.Marshal(c)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.Write(append(b, '\n'))
			return
		}
		cw := &countWriter{ResponseWriter: w}
		h.ServeHTTP(cw, r)
		mu.Lock()
		c.Requests++
		switch r.Method {
		case http.MethodGet:
			c.Gets++
		case http.MethodHead:
			c.Heads++
		}
		c.Bytes += cw.n
		mu.Unlock()
	})
}

// countWriter counts the body bytes written through it.
type countWriter struct {
	http.ResponseWriter
	n int64
}

func (w *countWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n += int64(n)
	return n, err
}

// Flush passes on to the writer below, so that the proxy's flushes still stream.
func (w *countWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the writer below.
func (w *countWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logged wraps h to log each request when its response headers are written (or
// when it ends without any).
func logged(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lw := &statusWriter{ResponseWriter: w, start: time.Now(), r: r}
		h.ServeHTTP(lw, r)
		if !lw.logged {
			lw.log(0)
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	start  time.Time
	r      *http.Request
	logged bool
}

func (w *statusWriter) log(status int) {
	w.logged = true
	rng := w.r.Header.Get("Range")
	if rng == "" {
		rng = "-"
	}
	log.Printf("%s %s range %s: %d after %.3fs", w.r.Method, w.r.URL.Path, rng, status, time.Since(w.start).Seconds())
}

func (w *statusWriter) WriteHeader(status int) {
	if !w.logged {
		w.log(status)
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.logged {
		w.log(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's Flush.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
