package httpsrc_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/shardload/shardload/source/httpsrc"
	"github.com/shardload/shardload/source/sourcetest"
)

// TestConformance runs the conformance suite against the HTTP source in front of a
// file server, alone and behind a Fetcher in both modes.
func TestConformance(t *testing.T) {
	dir := t.TempDir()
	sourcetest.WriteDir(t, dir)
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	sourcetest.Run(t, sourcetest.Backend{Src: &httpsrc.Source{Client: srv.Client()}, Base: srv.URL + "/"})
}
