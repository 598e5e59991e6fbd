package httpsrc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/shardload/shardload/source"
)

// Redirects pass the check the context carries; a refused one fails the request
// without retries. Without a check they are followed.
func TestHTTPRedirectCheck(t *testing.T) {
	var secretHits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/public/a.tar":
			http.Redirect(w, r, "/private/s.tar", http.StatusFound)
		case "/private/s.tar":
			secretHits.Add(1)
			fmt.Fprint(w, "secret")
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	src := source.NewFetcher(&Source{}, source.FetchOptions{})
	u := srv.URL + "/public/a.tar"

	r, err := src.Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "secret" {
		t.Fatalf("without a check: %q", b)
	}

	var froms []string
	ctx := source.WithRedirectCheck(context.Background(), func(from, to string) error {
		froms = append(froms, from)
		if !strings.HasPrefix(to, srv.URL+"/public/") {
			return errors.New("not under /public/")
		}
		return nil
	})
	before := secretHits.Load()
	_, err = src.Open(ctx, u)
	if !errors.Is(err, source.ErrRedirect) || !strings.Contains(err.Error(), "not under /public/") || source.IsRetryable(err) {
		t.Fatalf("a redirect out of /public/: %v", err)
	}
	if secretHits.Load() != before || len(froms) != 1 || froms[0] != u {
		t.Errorf("the private object was read %d times, checks from %q", secretHits.Load()-before, froms)
	}
}

// The policy without a check: at most 10 redirects, never from https to http.
func TestCheckRedirectPolicy(t *testing.T) {
	req := func(s string) *http.Request {
		u, _ := url.Parse(s)
		return (&http.Request{URL: u}).WithContext(context.Background())
	}
	if err := checkRedirect(req("http://a/x"), []*http.Request{req("https://a/x")}); !errors.Is(err, source.ErrRedirect) {
		t.Errorf("https to http: %v", err)
	}
	if err := checkRedirect(req("https://b/x"), []*http.Request{req("https://a/x")}); err != nil {
		t.Errorf("https to https: %v", err)
	}
	via := make([]*http.Request, 10)
	for i := range via {
		via[i] = req("https://a/x")
	}
	if err := checkRedirect(req("https://a/y"), via); !errors.Is(err, source.ErrRedirect) {
		t.Errorf("an eleventh redirect: %v", err)
	}
}
