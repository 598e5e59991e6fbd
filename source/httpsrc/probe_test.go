package httpsrc

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/sourcetest"
)

// TestStatProbesWithGET: a URL signed in its query is stated with a GET of its first
// byte and no HEAD; a HEAD answered 403 or 405 falls back to that GET; the size comes
// from Content-Range and the version from the ETag, and the object then reads whole.
func TestStatProbesWithGET(t *testing.T) {
	data := bytes.Repeat([]byte("presigned "), 5000)
	mod := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name  string
		query string
		head  int // the status a HEAD gets; 0: served
		heads int64
	}{
		{"amz signature", "?X-Amz-Signature=abc&X-Amz-Expires=60", http.StatusForbidden, 0},
		{"goog signature", "?x-goog-signature=abc", http.StatusForbidden, 0},
		{"cloudfront signature", "?Expires=1&Signature=abc&Key-Pair-Id=K", http.StatusForbidden, 0},
		{"head forbidden", "", http.StatusForbidden, 1},
		{"head not allowed", "?v=1", http.StatusMethodNotAllowed, 1},
		{"head served", "", 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var heads, gets atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodHead {
					heads.Add(1)
					if tt.head != 0 {
						w.WriteHeader(tt.head)
						return
					}
				} else {
					gets.Add(1)
				}
				w.Header().Set("ETag", `"v1"`)
				http.ServeContent(w, r, "x.tar", mod, bytes.NewReader(data))
			}))
			defer srv.Close()
			url := srv.URL + "/x.tar" + tt.query
			s := &Source{}
			info, err := s.Stat(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			if info.Size != int64(len(data)) || info.Version != `"v1"` || !info.ModTime.Equal(mod) {
				t.Errorf("Stat = %+v; want size %d, version \"v1\", time %v", info, len(data), mod)
			}
			if heads.Load() != tt.heads {
				t.Errorf("%d HEADs; want %d", heads.Load(), tt.heads)
			}
			f := source.NewFetcher(s, source.FetchOptions{PartSize: 16 << 10, Parallel: 2, SingleRate: -1, RateLimiter: source.Unlimited})
			rc, err := f.Open(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := sourcetest.ReadAll(t, rc); err != nil || !bytes.Equal(got, data) {
				t.Errorf("read %d bytes, %v; want %d", len(got), err, len(data))
			}
		})
	}
	t.Run("empty", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", `"e"`)
			if r.Header.Get("Range") != "" {
				w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
				return
			}
			w.WriteHeader(http.StatusOK)
		}))
		defer srv.Close()
		info, err := (&Source{}).Stat(t.Context(), srv.URL+"/e.tar?X-Amz-Signature=s")
		if err != nil || info.Size != 0 {
			t.Errorf("Stat of an empty object = %+v, %v; want size 0", info, err)
		}
	})
	t.Run("refused GET too", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusForbidden)
		}))
		defer srv.Close()
		_, err := (&Source{}).Stat(t.Context(), srv.URL+"/x.tar?X-Amz-Signature=s")
		if !errors.Is(err, source.ErrPermission) {
			t.Errorf("Stat = %v; want ErrPermission", err)
		}
	})
}
