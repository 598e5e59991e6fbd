package source_test

import (
	"context"
	"io"
	"testing"

	"github.com/shardload/shardload/source"
)

// preparing is a Source that records the URLs it was asked to prepare.
type preparing struct{ urls []string }

func (p *preparing) Stat(context.Context, string) (source.Info, error) { return source.Info{}, nil }
func (p *preparing) Open(context.Context, string) (io.ReadCloser, error) {
	return nil, source.ErrNotFound
}
func (p *preparing) Prepare(url string) { p.urls = append(p.urls, url) }

func TestPrepareReachesThroughRegistriesAndWrappers(t *testing.T) {
	s3, gs := &preparing{}, &preparing{}
	inner := &source.Registry{}
	inner.Register("s3", source.NewFetcher(s3, source.FetchOptions{}))
	inner.Register("file", &source.File{})
	outer := &source.Registry{}
	outer.Register("s3", inner) // a registry that hands s3 URLs on, as a cache's upstream is
	outer.Register("gs", gs)
	outer.Register("file", &source.File{})

	source.Prepare(outer, "s3://b/a.tar")
	source.Prepare(outer, "gs://b/a.tar")
	source.Prepare(outer, "file:///tmp/a.tar") // nothing to prepare
	source.Prepare(outer, "nope://x")          // no source: nothing happens
	if len(s3.urls) != 1 || s3.urls[0] != "s3://b/a.tar" || len(gs.urls) != 1 || gs.urls[0] != "gs://b/a.tar" {
		t.Fatalf("prepared s3 %v, gs %v", s3.urls, gs.urls)
	}

	// Expand prepares the first URL's source before it lists anything.
	if _, err := outer.Expand(context.Background(), []string{"s3://b/x.tar", "gs://b/y.tar"}); err != nil {
		t.Fatal(err)
	}
	if len(s3.urls) != 2 || len(gs.urls) != 1 {
		t.Fatalf("after Expand: prepared s3 %v, gs %v; want the first URL's source once more", s3.urls, gs.urls)
	}
}
