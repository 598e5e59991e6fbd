package gcs

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/sourcetest"
)

// TestConformance runs the conformance suite against GCS on fake-gcs-server, alone
// and behind a Fetcher in both modes.
func TestConformance(t *testing.T) {
	srv := testutil.FakeGCS(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "conf")
	sourcetest.Put(func(name string, data []byte) { srv.Put(t, "conf", name, data) })
	// A zero Source: it must find the emulator through STORAGE_EMULATOR_HOST.
	sourcetest.Run(t, sourcetest.Backend{Src: &Source{ListPageSize: 2}, Base: "gs://conf/", Lists: true})
}

// TestOverwrittenBetweenParts overwrites an object on a real store while a Fetcher
// reads it: the read must fail with ErrChanged after delivering only bytes of the
// first version.
func TestOverwrittenBetweenParts(t *testing.T) {
	const size, partSize = 8 << 20, 1 << 20
	first, second := sourcetest.Data(size), sourcetest.Data(size + 1)[:size]
	stores := map[string]func(t *testing.T) (source.Source, string, func([]byte)){
		"gcs": func(t *testing.T) (source.Source, string, func([]byte)) {
			srv := testutil.FakeGCS(t)
			srv.CreateBucket(t, "bkt")
			put := func(d []byte) { srv.Put(t, "bkt", "x.tar", d) }
			put(first)
			return &Source{Client: srv.Client}, "gs://bkt/x.tar", put
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
