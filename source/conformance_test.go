package source

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload/internal/testenv"
)

// conformanceSizes are the object sizes every backend must serve exactly.
var conformanceSizes = []int{0, 1, 1 << 10, 33 << 10, 5<<20 + 1, 65_000_000}

// conformanceData returns the test object of size n: random, and the same each time.
func conformanceData(n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24)}).Read(b)
	return b
}

// backend is one Source under test, with its objects already stored.
type backend struct {
	name   string
	src    Source
	base   string // URL prefix of the objects: base + "obj-<size>"
	scheme string
	lists  bool
}

// listNames are the objects stored under base + "list/" for the listing cases.
var listNames = []string{"list/train-000.tar", "list/train-001.tar", "list/train-002.tar", "list/train-003.tar",
	"list/train-004.tar", "list/other.txt", "list/sub/deeper.tar"}

// put stores every conformance object and the listing objects with store.
func putAll(store func(name string, data []byte)) {
	for _, n := range conformanceSizes {
		store(fmt.Sprintf("obj-%d", n), conformanceData(n))
	}
	for _, name := range listNames {
		store(name, []byte(name))
	}
}

func fileBackend(t *testing.T) backend {
	dir := t.TempDir()
	putAll(func(name string, data []byte) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	return backend{name: "file", src: &File{}, base: "file://" + dir + "/", scheme: "file", lists: true}
}

func httpBackend(t *testing.T) backend {
	fb := fileBackend(t)
	srv := httptest.NewServer(http.FileServer(http.Dir(strings.TrimPrefix(fb.base, "file://"))))
	t.Cleanup(srv.Close)
	return backend{name: "http", src: &HTTP{Client: srv.Client()}, base: srv.URL + "/", scheme: "http"}
}

func s3Backend(t *testing.T) (backend, *testenv.MinIOServer) {
	srv := testenv.MinIO(t)
	isolateAWS(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "conf")
	putAll(func(name string, data []byte) { srv.Put(t, "conf", name, data) })
	return backend{name: "s3", src: &S3{ListPageSize: 2}, base: "s3://conf/", scheme: "s3", lists: true}, srv
}

func gcsBackend(t *testing.T) (backend, *testenv.FakeGCSServer) {
	srv := testenv.FakeGCS(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "conf")
	putAll(func(name string, data []byte) { srv.Put(t, "conf", name, data) })
	// A zero GCS: it must find the emulator through STORAGE_EMULATOR_HOST.
	return backend{name: "gcs", src: &GCS{ListPageSize: 2}, base: "gs://conf/", scheme: "gs", lists: true}, srv
}

// TestConformance runs one table of cases against every backend, alone and behind a
// Fetcher that splits objects into small parallel parts.
func TestConformance(t *testing.T) {
	t.Run("file", func(t *testing.T) { runConformance(t, fileBackend(t)) })
	t.Run("http", func(t *testing.T) { runConformance(t, httpBackend(t)) })
	t.Run("s3", func(t *testing.T) { b, _ := s3Backend(t); runConformance(t, b) })
	t.Run("gcs", func(t *testing.T) { b, _ := gcsBackend(t); runConformance(t, b) })
}

func runConformance(t *testing.T, b backend) {
	for _, variant := range []struct {
		name string
		src  Source
	}{
		{"raw", b.src},
		// The first part decides: one stream for the rest on loopback, usually.
		{"fetcher", NewFetcher(b.src, FetchOptions{PartSize: 1 << 20, Parallel: 4})},
		{"fetcher-parts", NewFetcher(b.src, FetchOptions{PartSize: 1 << 20, Parallel: 4, SingleRate: -1})},
	} {
		t.Run(variant.name, func(t *testing.T) {
			src := variant.src
			rr := src.(RangeReader)
			for _, size := range conformanceSizes {
				data := conformanceData(size)
				url := fmt.Sprintf("%sobj-%d", b.base, size)
				n := int64(size)
				t.Run(fmt.Sprint(size), func(t *testing.T) {
					info, err := src.Stat(t.Context(), url)
					if err != nil || info.Size != n || info.URL != url || info.Version == "" {
						t.Fatalf("Stat = %+v, %v; want size %d and a version", info, err, n)
					}
					rc, err := src.Open(t.Context(), url)
					if err != nil {
						t.Fatal(err)
					}
					if got, err := readAll(t, rc); err != nil || !bytes.Equal(got, data) {
						t.Fatalf("Open read %d bytes, %v; want %d", len(got), err, n)
					}
					ranges := []struct {
						name        string
						off, length int64
					}{
						{"start", 0, 10}, {"middle", n / 2, 1000}, {"end", max(n-7, 0), 7},
						{"to end", n / 3, -1}, {"cut at end", max(n-3, 0), 100},
						{"at end", n, 10}, {"past end", n + 100, 10}, {"past end to end", n + 100, -1},
						{"zero length", n / 2, 0},
					}
					for _, r := range ranges {
						rc, err := rr.OpenRange(t.Context(), url, r.off, r.length)
						if err != nil {
							t.Fatalf("OpenRange %s (%d, %d): %v", r.name, r.off, r.length, err)
						}
						end := n
						if r.length >= 0 {
							end = min(n, r.off+r.length)
						}
						want := data[min(r.off, n):max(end, min(r.off, n))]
						if got, err := readAll(t, rc); err != nil || !bytes.Equal(got, want) {
							t.Errorf("OpenRange %s (%d, %d) read %d bytes, %v; want %d", r.name, r.off, r.length, len(got), err, len(want))
						}
					}
				})
			}
			t.Run("missing", func(t *testing.T) {
				url := b.base + "no-such-object.tar"
				for op, f := range map[string]func() error{
					"stat":  func() error { _, err := src.Stat(t.Context(), url); return err },
					"open":  func() error { _, err := src.Open(t.Context(), url); return err },
					"range": func() error { _, err := rr.OpenRange(t.Context(), url, 10, 10); return err },
				} {
					err := f()
					var se *Error
					if !errors.Is(err, ErrNotFound) || !errors.As(err, &se) || se.URL != url {
						t.Errorf("%s of a missing object = %v; want an *Error wrapping ErrNotFound", op, err)
					}
				}
			})
			if !b.lists {
				return
			}
			t.Run("list", func(t *testing.T) {
				var reg Registry
				reg.Register(b.scheme, src)
				want := func(names ...string) []string {
					var out []string
					for _, n := range names {
						out = append(out, b.base+"list/"+n)
					}
					return out
				}
				trains := want("train-000.tar", "train-001.tar", "train-002.tar", "train-003.tar", "train-004.tar")
				tests := []struct {
					in   []string
					want []string
				}{
					{[]string{b.base + "list/"}, append(want("other.txt"), trains...)},
					{[]string{b.base + "list/train-*.tar"}, trains},
					{[]string{b.base + "list/train-00[13].tar", b.base + "obj-1"}, append(want("train-001.tar", "train-003.tar"), b.base+"obj-1")},
					{[]string{b.base + "list/*-00?.tar"}, trains},
				}
				for _, tt := range tests {
					got, err := reg.Expand(t.Context(), tt.in)
					if err != nil || !slices.Equal(got, tt.want) {
						t.Errorf("Expand(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
					}
				}
				if _, err := reg.Expand(t.Context(), []string{b.base + "list/nothing-*.tar"}); !errors.Is(err, ErrNoMatch) {
					t.Errorf("Expand of a pattern matching nothing = %v; want ErrNoMatch", err)
				}
			})
		})
	}
}

// TestOverwrittenBetweenParts overwrites an object on a real store while a Fetcher
// reads it: the read must fail with ErrChanged after delivering only bytes of the
// first version.
func TestOverwrittenBetweenParts(t *testing.T) {
	const size, partSize = 8 << 20, 1 << 20
	first, second := conformanceData(size), conformanceData(size + 1)[:size]
	stores := map[string]func(t *testing.T) (Source, string, func([]byte)){
		"s3": func(t *testing.T) (Source, string, func([]byte)) {
			srv := testenv.MinIO(t)
			isolateAWS(t)
			srv.SetEnv(t)
			srv.CreateBucket(t, "bkt")
			put := func(d []byte) { srv.Put(t, "bkt", "x.tar", d) }
			put(first)
			return &S3{}, "s3://bkt/x.tar", put
		},
		"gcs": func(t *testing.T) (Source, string, func([]byte)) {
			srv := testenv.FakeGCS(t)
			srv.CreateBucket(t, "bkt")
			put := func(d []byte) { srv.Put(t, "bkt", "x.tar", d) }
			put(first)
			return &GCS{Client: srv.Client}, "gs://bkt/x.tar", put
		},
	}
	for name, setup := range stores {
		t.Run(name, func(t *testing.T) {
			src, url, put := setup(t)
			// Two parts in flight at most: after the first byte, parts 3 and later
			// start only after the overwrite.
			f := NewFetcher(src, FetchOptions{PartSize: partSize, Parallel: 2, SingleRate: -1})
			rc, err := f.Open(guard(t), url)
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			one := make([]byte, 1)
			if _, err := io.ReadFull(rc, one); err != nil {
				t.Fatal(err)
			}
			put(second)
			rest, err := io.ReadAll(rc)
			got := append(one, rest...)
			if !errors.Is(err, ErrChanged) || !bytes.Equal(got, first[:len(got)]) || len(got) == size {
				t.Fatalf("read %d bytes, %v; want a prefix of the first version, then ErrChanged", len(got), err)
			}
			t.Logf("after %d bytes: %v", len(got), err)
		})
	}
}

// TestS3SlowDownProxy puts a reverse proxy in front of MinIO that answers the first
// GETs with 503 SlowDown and cuts one body short: the S3 backend's errors must be
// classified so that a Fetcher retries them and delivers the exact bytes.
func TestS3SlowDownProxy(t *testing.T) {
	srv := testenv.MinIO(t)
	isolateAWS(t)
	srv.CreateBucket(t, "bkt")
	data := conformanceData(3<<20 + 17)
	srv.Put(t, "bkt", "x.tar", data)
	target, _ := url.Parse(srv.Endpoint)
	rp := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	gets := 0
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Query().Get("list-type") == "" {
			mu.Lock()
			gets++
			n := gets
			mu.Unlock()
			switch {
			case n <= 2:
				slowDown(w, "1")
				return
			case n == 3:
				// Pass the response through but cut its body after 1000 bytes.
				rec := httptest.NewRecorder()
				rp.ServeHTTP(rec, r)
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				w.Write(rec.Body.Bytes()[:1000])
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	srv.SetEnv(t)
	t.Setenv("AWS_ENDPOINT_URL", proxy.URL)
	t.Setenv("AWS_ENDPOINT_URL_S3", proxy.URL)
	var sl sleeps
	f := NewFetcher(&S3{}, FetchOptions{PartSize: 1 << 20, Parallel: 1, Retry: RetryPolicy{Sleep: sl.sleep}})
	rc, err := f.Open(guard(t), "s3://bkt/x.tar")
	if err != nil {
		t.Fatal(err)
	}
	got, err := readAll(t, rc)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v; want %d exactly", len(got), err, len(data))
	}
	if s := sl.get(); len(s) != 3 || s[0] != time.Second || s[1] != time.Second {
		t.Errorf("slept %v; want 1s, 1s (Retry-After), then one backoff", s)
	}
	if gets != 4 {
		t.Errorf("%d GETs through the proxy; want 4", gets)
	}
}
