package cache_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/httpsrc"
	"github.com/shardload/shardload/source/sourcetest"
)

// TestConformance runs the source conformance suite against a Cache, alone and
// behind a Fetcher in both modes: in front of local files, and in front of an HTTP
// origin behind a Fetcher in a Registry, as the command line builds it.
func TestConformance(t *testing.T) {
	dir := t.TempDir()
	sourcetest.WriteDir(t, dir)
	t.Run("file", func(t *testing.T) {
		c, err := cache.New(cache.Options{Dir: t.TempDir()}, &source.File{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		sourcetest.Run(t, sourcetest.Backend{Src: c, Base: "file://" + dir + "/", Lists: true})
	})
	t.Run("http", func(t *testing.T) {
		srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
		t.Cleanup(srv.Close)
		var reg source.Registry
		reg.Register("http", source.NewFetcher(&httpsrc.Source{Client: srv.Client()}, source.FetchOptions{}))
		c, err := cache.New(cache.Options{Dir: t.TempDir()}, &reg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		sourcetest.Run(t, sourcetest.Backend{Src: c, Base: srv.URL + "/"})
	})
}
