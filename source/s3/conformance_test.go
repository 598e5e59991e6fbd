package s3

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/sourcetest"
)

// TestConformance runs the conformance suite against S3 on MinIO, alone and behind
// a Fetcher in both modes.
func TestConformance(t *testing.T) {
	srv := testutil.MinIO(t)
	isolateAWS(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "conf")
	sourcetest.Put(func(name string, data []byte) { srv.Put(t, "conf", name, data) })
	sourcetest.Run(t, sourcetest.Backend{Src: &Source{ListPageSize: 2}, Base: "s3://conf/", Lists: true})
}

// TestOverwrittenBetweenParts overwrites an object on a real store while a Fetcher
// reads it: the read must fail with ErrChanged after delivering only bytes of the
// first version.
func TestOverwrittenBetweenParts(t *testing.T) {
	const size, partSize = 8 << 20, 1 << 20
	first, second := sourcetest.Data(size), sourcetest.Data(size + 1)[:size]
	stores := map[string]func(t *testing.T) (source.Source, string, func([]byte)){
		"s3": func(t *testing.T) (source.Source, string, func([]byte)) {
			srv := testutil.MinIO(t)
			isolateAWS(t)
			srv.SetEnv(t)
			srv.CreateBucket(t, "bkt")
			put := func(d []byte) { srv.Put(t, "bkt", "x.tar", d) }
			put(first)
			return &Source{}, "s3://bkt/x.tar", put
		},
	}
	for name, setup := range stores {
		t.Run(name, func(t *testing.T) {
			src, url, put := setup(t)
			// Two parts in flight at most: after the first byte, parts 3 and later
			// start only after the overwrite.
			f := source.NewFetcher(src, source.FetchOptions{PartSize: partSize, Parallel: 2, SingleRate: -1})
			rc, err := f.Open(sourcetest.Guard(t), url)
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
			if !errors.Is(err, source.ErrChanged) || !bytes.Equal(got, first[:len(got)]) || len(got) == size {
				t.Fatalf("read %d bytes, %v; want a prefix of the first version, then source.ErrChanged", len(got), err)
			}
			t.Logf("after %d bytes: %v", len(got), err)
		})
	}
}

// TestS3SlowDownProxy puts a reverse proxy in front of MinIO that answers the first
// GETs with 503 SlowDown and cuts one body short: the S3 backend's errors must be
// classified so that a Fetcher retries them and delivers the exact bytes.
func TestS3SlowDownProxy(t *testing.T) {
	srv := testutil.MinIO(t)
	isolateAWS(t)
	srv.CreateBucket(t, "bkt")
	data := sourcetest.Data(3<<20 + 17)
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
				sourcetest.SlowDown(w, "1")
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
	var sl sourcetest.Sleeps
	f := source.NewFetcher(&Source{}, source.FetchOptions{PartSize: 1 << 20, Parallel: 1, Retry: source.RetryPolicy{Sleep: sl.Sleep}})
	rc, err := f.Open(sourcetest.Guard(t), "s3://bkt/x.tar")
	if err != nil {
		t.Fatal(err)
	}
	got, err := sourcetest.ReadAll(t, rc)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v; want %d exactly", len(got), err, len(data))
	}
	if s := sl.Get(); len(s) != 3 || s[0] != time.Second || s[1] != time.Second {
		t.Errorf("slept %v; want 1s, 1s (Retry-After), then one backoff", s)
	}
	if gets != 4 {
		t.Errorf("%d GETs through the proxy; want 4", gets)
	}
}
