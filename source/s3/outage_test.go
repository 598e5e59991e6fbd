package s3

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
)

// cutProxy forwards TCP connections to a server until it is cut: then it closes
// its listener (new connections are refused, as by a server that is down) and every
// connection it carries, until it is restored on the same address.
type cutProxy struct {
	t      *testing.T
	addr   string // where it listens
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	p := &cutProxy{t: t, target: target, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = true, true
			p.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
}

// cut takes the server away: the listener and every connection close.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// restore listens again on the same address.
func (p *cutProxy) restore() {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Errorf("listening again on %s: %v", p.addr, err)
		return
	}
	p.serve(ln)
}

// TestStoreOutage: MinIO becomes unreachable (connections cut, new ones refused)
// for 6 s, twice the old retry policy's 5 attempts (about 3 s), while one object is
// half read and as another is opened: with the default retry policy both reads
// finish with the exact bytes, the first resumed at its byte offset, and the
// retries and the outage are counted and logged once.
func TestStoreOutage(t *testing.T) {
	const outage = 6 * time.Second
	srv := testutil.MinIO(t)
	isolateAWS(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "shards")
	objs := map[string][]byte{}
	for i, name := range []string{"a.tar", "b.tar"} {
		// Larger than what the sockets between MinIO and the reader buffer (a few
		// MB on loopback), so that a cut lands inside a body still being sent.
		data := make([]byte, 32<<20+i*1000)
		for j := range data {
			data[j] = byte(j*31 + j>>16 + i)
		}
		objs[name] = data
		srv.Put(t, "shards", name, data)
	}
	p := newCutProxy(t, strings.TrimPrefix(srv.Endpoint, "http://"))
	t.Setenv("AWS_ENDPOINT_URL", "http://"+p.addr)
	t.Setenv("AWS_ENDPOINT_URL_S3", "http://"+p.addr)

	var logMu sync.Mutex
	var lines []string
	f := source.NewFetcher(&Source{}, source.FetchOptions{Parallel: 1, // one request for the whole object, cut in its body
		RateLimiter: source.NewRateLimiter(source.RateOptions{}),
		Logf: func(format string, args ...any) {
			logMu.Lock()
			lines = append(lines, strings.TrimSpace(fmt.Sprintf(format, args...)))
			logMu.Unlock()
			t.Logf(format, args...)
		}})
	retries0, resumes0 := source.Retries()
	outages0 := source.Outages()

	rc, err := f.Open(t.Context(), "s3://shards/a.tar")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	first := make([]byte, 3<<20)
	if _, err := io.ReadFull(rc, first); err != nil {
		t.Fatal(err)
	}

	p.cut()
	restored := make(chan struct{})
	time.AfterFunc(outage, func() { p.restore(); close(restored) }) // the outage's length
	var wg sync.WaitGroup
	var gotB []byte
	var errB error
	wg.Go(func() {
		rc, err := f.Open(t.Context(), "s3://shards/b.tar") // its Stat meets the outage
		if err != nil {
			errB = err
			return
		}
		defer rc.Close()
		gotB, errB = io.ReadAll(rc)
	})
	rest, err := io.ReadAll(rc)
	wg.Wait()
	<-restored
	if got := append(first, rest...); err != nil || !bytes.Equal(got, objs["a.tar"]) {
		t.Errorf("a.tar, cut after %d bytes: read %d bytes, %v; want its %d bytes", len(first), len(got), err, len(objs["a.tar"]))
	}
	if errB != nil || !bytes.Equal(gotB, objs["b.tar"]) {
		t.Errorf("b.tar, opened in the outage: read %d bytes, %v; want its %d bytes", len(gotB), errB, len(objs["b.tar"]))
	}
	retries, resumes := source.Retries()
	if retries-retries0 < 2 || resumes-resumes0 < 1 {
		t.Errorf("%d retries, %d resumed at an offset; want retries of both objects and a resume", retries-retries0, resumes-resumes0)
	}
	if n := source.Outages() - outages0; n != 1 {
		t.Errorf("%d outages counted; want 1", n)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if len(lines) != 2 || !strings.Contains(lines[0], "store unreachable for s3://shards/") || !strings.Contains(lines[1], "store back for s3://shards after ") {
		t.Errorf("log lines %q; want one saying the store is unreachable, then one that it is back", lines)
	}
}
