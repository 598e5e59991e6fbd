package serve

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/httpsrc"
	"github.com/shardload/shardload/wire"
)

// A trainer names URLs the way a source will read them: a "?" or "#" in a file path,
// percent-encoded dot segments, and a symbolic link out of an allowed directory do
// not get past the allowlist.
func TestAllowlistNormalises(t *testing.T) {
	root := t.TempDir()
	allowed := filepath.Join(root, "allowed")
	secret := filepath.Join(root, "secret")
	for _, d := range []string{allowed, filepath.Join(allowed, "#"), filepath.Join(allowed, "sub"), secret} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(secret, "s.tar"), []byte("secret"), 0o600)
	os.WriteFile(filepath.Join(allowed, "sub", "ok.tar"), []byte("ok"), 0o600)
	if err := os.Symlink(secret, filepath.Join(allowed, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(allowed, "sub"), filepath.Join(allowed, "in")); err != nil {
		t.Fatal(err)
	}
	s := start(t, Options{Allow: []string{"file://" + allowed + "/", "https://data.example/train/", "s3://bucket/train/"}})
	f := "file://" + allowed + "/"
	for _, tt := range []struct {
		url string
		ok  bool
	}{
		{f + "sub/ok.tar", true},
		{f + "in/ok.tar", true},              // a link that stays inside
		{f + "sub/missing-{0..3}.tar", true}, // not there yet: checked as far as it exists
		{f + "#/../../secret/s.tar", false},
		{f + "sub?/../../secret/s.tar", false},
		{f + "out/s.tar", false}, // a link out of the allowed directory
		{f + "%2e%2e/secret/s.tar", false},
		{"file://" + allowed + "-other/x.tar", false},
		{"https://data.example/train/a.tar", true},
		{"https://data.example/train/a.tar?X-Amz-Signature=abc", true},
		{"https://data.example/train/%2e%2e/private/a.tar", false},
		{"https://data.example/train/..%2fprivate/a.tar", false},
		{"https://data.example/train/%2E%2E%2Fprivate/a.tar", false},
		{"https://data.example/train/./a.tar", false},
		{"https://data.example/trainer/a.tar", false},
		{"https://data.example/train@evil.example/a.tar", false},
		{"https://user:pw@data.example/train/a.tar?X-Amz-Signature=s", true},
		{"https://data.example@evil.example/train/a.tar", false},
		{"https://data.example/train/@evil.example/a.tar", true}, // a path segment, on data.example
		{"s3://bucket/train/a.tar", true},
		{"s3://bucket/train/%2e%2e/other/a.tar", false},
		{"s3://bucket/train/a\x00.tar", false},
	} {
		err := s.allowed(strings.ReplaceAll(tt.url, "{0..3}", "0"))
		if (err == nil) != tt.ok {
			t.Errorf("allowed(%q) = %v, want allowed %v", tt.url, err, tt.ok)
		}
	}
}

// The socket's directory must be the server's user's own: another user's 0700
// directory (which that user could empty and refill) is refused, naming its owner.
func TestSocketDirOfAnotherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("giving a directory to another user needs root")
	}
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, err := Listen(Options{Socket: filepath.Join(dir, "s.sock"), Allow: []string{"s3://b/"}})
	if err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("Listen in another user's directory: %v", err)
	}
}

// With AllowUIDs, the socket and its directory let other users connect (and the uid
// check decides); without, only the owner can.
func TestAllowUIDModes(t *testing.T) {
	for _, tt := range []struct {
		uids          []int
		dir, sockMode os.FileMode
	}{{nil, 0o700, 0o600}, {[]int{65534}, 0o711, 0o666}} {
		s := start(t, Options{Allow: []string{"s3://b/"}, AllowUIDs: tt.uids})
		fi, err := os.Stat(filepath.Dir(s.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		si, err := os.Stat(s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != tt.dir || si.Mode().Perm() != tt.sockMode {
			t.Errorf("AllowUIDs %v: directory %v, socket %v; want %v and %v", tt.uids, fi.Mode().Perm(), si.Mode().Perm(), tt.dir, tt.sockMode)
		}
	}
}

// panicky is a source that serves a real shard for its first opens and then panics,
// as a buggy source of a user's might.
type panicky struct {
	data  []byte
	calm  int32 // opens before the panics start
	opens atomic.Int32
}

// It holds one shard, x.tar: nothing else is found (an index beside it neither).
func (p *panicky) Stat(ctx context.Context, url string) (source.Info, error) {
	if !strings.HasSuffix(url, "/x.tar") {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: source.ErrNotFound}
	}
	return source.Info{Size: int64(len(p.data))}, nil
}

func (p *panicky) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	if !strings.HasSuffix(url, "/x.tar") {
		return nil, &source.Error{Op: "open", URL: url, Err: source.ErrNotFound}
	}
	if p.opens.Add(1) > p.calm {
		panic("boom in " + url)
	}
	return io.NopCloser(strings.NewReader(string(p.data))), nil
}

// A panic in a session's count or pipeline ends that session with an error message;
// the server and its other sessions go on.
func TestPanicEndsOneSession(t *testing.T) {
	ds := dataset(t)
	data, err := os.ReadFile(strings.ReplaceAll(ds, "{000000..000003}", "000000"))
	if err != nil {
		t.Fatal(err)
	}
	reg := &source.Registry{}
	reg.Register("file", &source.File{})
	reg.Register("count", &panicky{data: data})
	reg.Register("read", &panicky{data: data, calm: 2}) // the count and the fields, then panics
	s := start(t, Options{URLs: []string{ds}, Allow: []string{"count://b/", "read://b/"},
		Pipeline: shardload.Config{Sources: reg, Slabs: 2, SlabBytes: 4 << 20}})
	for _, u := range []string{"count://b/x.tar", "read://b/x.tar"} {
		cl := dialRaw(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 5, URLs: []string{u}})
		m := cl.awaitReady()
		for m == nil { // ready came: the error follows the batches, if any
			typ, b := cl.recv()
			if typ == wire.TypeError {
				json.Unmarshal(b, &m)
			} else if typ != wire.TypeBatch {
				t.Fatalf("%s: unexpected %s", u, b)
			}
		}
		if m == nil || m["code"] != CodePipeline || !strings.Contains(m["message"].(string), "panic") || !strings.Contains(m["message"].(string), "boom") {
			t.Errorf("%s: %v; want a pipeline error about the panic", u, m)
		}
		cl.c.Close()
	}
	// The server still serves its own dataset.
	cl, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 10})
	if m != nil {
		t.Fatal(m)
	}
	defer cl.c.Close()
	if _, e := cl.epoch(); e.Samples != 100 {
		t.Errorf("after the panics: end %+v", e)
	}
}

// Slab rings that the machine cannot hold are refused when the server starts, not
// when a trainer's session maps them and the kernel kills the server.
func TestRingBounded(t *testing.T) {
	for _, tt := range []struct {
		cfg      shardload.Config
		sessions int
		want     string
	}{
		{shardload.Config{Slabs: 100000, SlabBytes: 16 << 20}, 1, "more than half of this machine's memory"},
		{shardload.Config{SlabBytes: 1 << 40}, 1, "more than half of this machine's memory"},
		{shardload.Config{SlabBytes: 1 << 30, Memory: 8 << 30}, 1 << 20, "lower --max-sessions"},
		{shardload.Config{SlabBytes: 1 << 30}, 1, "memory budget too small"},
		{shardload.Config{QueueBytes: -1}, 1, "QueueBytes -1 is negative"},
	} {
		_, err := Listen(Options{Socket: filepath.Join(t.TempDir(), "s.sock"), Allow: []string{"s3://b/"}, Pipeline: tt.cfg, MaxSessions: tt.sessions})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v x %d sessions: %v; want %q", tt.cfg, tt.sessions, err, tt.want)
		}
	}
}

// A hello's URL patterns are counted before they are expanded: a pattern that would
// overflow, or name more shards than the server allows one trainer, is refused at
// once, and the server goes on.
func TestHelloURLsBounded(t *testing.T) {
	s := start(t, Options{URLs: []string{dataset(t)}, Allow: []string{"s3://b/"}, MaxShards: 1000})
	for _, tt := range []struct {
		urls []string
		want string
	}{
		{[]string{"s3://b/x-{0..9223372036854775807}.tar"}, "9223372036854775808 URLs"},
		{[]string{"s3://b/x-{0..1048574}.tar"}, "more than 1000 shards"},
		{[]string{"s3://b/x-{0..600}.tar", "s3://b/y-{0..600}.tar"}, "more than 1000 shards"},
	} {
		cl := dialRaw(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 5, URLs: tt.urls})
		m := cl.awaitReady()
		if m == nil || m["code"] != CodeBadRequest || !strings.Contains(m["message"].(string), tt.want) {
			t.Errorf("%q: %v; want a bad request saying %q", tt.urls, m, tt.want)
		}
		cl.c.Close()
	}
	cl, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 10})
	if m != nil {
		t.Fatal(m)
	}
	defer cl.c.Close()
	if _, e := cl.epoch(); e.Samples != 100 {
		t.Errorf("after the refusals: end %+v", e)
	}
}

// A trainer's URL under an allowed prefix that redirects elsewhere is not followed
// there: the session fails naming the refused redirect, and nothing outside the
// prefix is read.
func TestRedirectOutOfAllowlist(t *testing.T) {
	var secretHits atomic.Int32
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/allowed/a.tar":
			http.Redirect(w, r, "/secret/s.tar", http.StatusFound)
		case "/secret/s.tar":
			secretHits.Add(1)
			http.Error(w, "secret", http.StatusOK)
		default:
			http.NotFound(w, r)
		}
	}))
	defer web.Close()
	reg := &source.Registry{}
	reg.Register("http", source.NewFetcher(&httpsrc.Source{}, source.FetchOptions{}))
	s := start(t, Options{Allow: []string{web.URL + "/allowed/"}, Pipeline: shardload.Config{Sources: reg, Slabs: 2, SlabBytes: 4 << 20}})
	cl := dialRaw(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 5, URLs: []string{web.URL + "/allowed/a.tar"}})
	defer cl.c.Close()
	m := cl.awaitReady()
	if m == nil || m["code"] != CodePipeline || !strings.Contains(m["message"].(string), "redirect refused") {
		t.Fatalf("a redirect out of the allowlist: %v", m)
	}
	if n := secretHits.Load(); n != 0 {
		t.Errorf("the object outside the allowlist was read %d times", n)
	}
}
