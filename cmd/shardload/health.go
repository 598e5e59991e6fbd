package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// The store check of serve's readiness: how often it runs, how long an answer counts,
// and how long one check may take.
var (
	readyEvery   = 30 * time.Second
	readyFresh   = 90 * time.Second
	readyTimeout = 10 * time.Second
)

// health answers the probes of serve on its --metrics listener (a kubelet's, a
// launcher's):
//
//   - /livez: 200 while the process answers. Nothing it says depends on the store, so
//     a slow or unreachable store never gets the process restarted: a restart ends
//     every trainer session of the node.
//   - /readyz: 200 only while the unix socket listens and the server's dataset was
//     found at its store within readyFresh (a Stat of its first shard, or the first
//     object of its listing, every readyEvery); 503 otherwise, with the reason.
//
// A nil *health serves nothing and checks nothing.
type health struct {
	socket string
	check  func(context.Context) error // nil: the server has no dataset of its own (--allow only)
	what   string                      // what check asks the store for
	now    func() time.Time

	serving atomic.Bool // the accept loop runs

	mu      sync.Mutex
	okAt    time.Time // when the store last answered
	lastErr error     // the last check's error; nil after a success
}

// newHealth returns the probes of a server listening on socket whose dataset is
// cfg's, checked at its store through reg (see storeCheck).
func newHealth(socket string, reg *source.Registry, cfg shardload.Config) *health {
	check, what := storeCheck(reg, cfg)
	return &health{socket: socket, check: check, what: what, now: time.Now}
}

// start runs the store check now and every readyEvery until the function it returns
// is called.
func (h *health) start() (stop func()) {
	if h == nil || h.check == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(readyEvery)
		defer t.Stop()
		for {
			h.checkStore(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// checkStore asks the store once and records the answer.
func (h *health) checkStore(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, readyTimeout)
	err := h.check(cctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastErr = err
	if err == nil {
		h.okAt = h.now()
	}
}

// setServing records whether the server accepts trainers.
func (h *health) setServing(on bool) {
	if h != nil {
		h.serving.Store(on)
	}
}

// ready reports whether serve is ready, and why (or why not).
func (h *health) ready() (bool, string) {
	if !h.serving.Load() {
		return false, "the server does not accept trainers (starting or stopping)"
	}
	fi, err := os.Lstat(h.socket)
	if err != nil {
		return false, fmt.Sprintf("socket: %v", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return false, fmt.Sprintf("socket: %s is not a socket", h.socket)
	}
	if h.check == nil {
		return true, fmt.Sprintf("socket %s listens; no dataset of the server's own to check", h.socket)
	}
	h.mu.Lock()
	okAt, lastErr := h.okAt, h.lastErr
	h.mu.Unlock()
	why := "not checked yet"
	if lastErr != nil {
		why = oneLine(lastErr)
	}
	if okAt.IsZero() {
		return false, fmt.Sprintf("the store has not answered for %s: %s", h.what, why)
	}
	if age := h.now().Sub(okAt); age > readyFresh {
		return false, fmt.Sprintf("the store last answered for %s %s ago: %s", h.what, age.Round(time.Second), why)
	}
	return true, fmt.Sprintf("socket %s listens; the store answered for %s %s ago", h.socket, h.what, h.now().Sub(okAt).Round(time.Second))
}

// handle adds /livez and /readyz to mux.
func (h *health) handle(mux *http.ServeMux) {
	if h == nil {
		return
	}
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprintln(w, "live")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		ok, why := h.ready()
		why = redact.String(why) // a presigned URL's signature, say
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: "+why)
			return
		}
		fmt.Fprintln(w, "ready: "+why)
	})
}

// errFound stops a listing at its first object.
var errFound = errors.New("found")

// storeCheck returns the check of a server's dataset at its store, through reg (the
// sources without the cache, so that a cached copy does not answer for the store):
// a Stat of its first shard or, where its first URL asks for a listing, a listing of
// that directory stopped at its first object. It returns nil when the server has no
// dataset of its own.
func storeCheck(reg *source.Registry, cfg shardload.Config) (func(context.Context) error, string) {
	first := ""
	if len(cfg.URLs) > 0 {
		first = cfg.URLs[0]
	}
	for _, st := range cfg.Streams {
		if first == "" && len(st.URLs) > 0 {
			first = st.URLs[0]
		}
	}
	if first == "" {
		return nil, ""
	}
	if urls, err := shard.Expand(first); err == nil && len(urls) > 0 {
		first = urls[0]
	}
	src, err := reg.Lookup(first)
	if err != nil {
		return func(context.Context) error { return err }, first
	}
	if lister, ok := src.(source.Lister); ok && source.IsListPattern(first) {
		dir := first[:strings.LastIndex(first, "/")+1]
		return func(ctx context.Context) error {
			err := lister.List(ctx, dir, func(source.Info) error { return errFound })
			switch {
			case errors.Is(err, errFound):
				return nil
			case err == nil:
				return fmt.Errorf("no objects under %s", dir)
			}
			return err
		}, "the listing of " + dir
	}
	return func(ctx context.Context) error {
		_, err := src.Stat(ctx, first)
		return err
	}, first
}
