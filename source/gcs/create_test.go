package gcs

import (
	"errors"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/sourcetest"
)

// TestGCSCreateFake writes objects to fake-gcs-server and reads them back.
func TestGCSCreateFake(t *testing.T) {
	srv := testutil.FakeGCS(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "out")
	s := &Source{} // it must find the emulator through STORAGE_EMULATOR_HOST
	// Size: more than the writer's 16 MiB chunk, a resumable upload of two chunks.
	// Behind a Fetcher, as Register puts it: Registry.Create unwraps it.
	var r source.Registry
	Register(&r, source.FetchOptions{})
	sourcetest.RunCreator(t, sourcetest.Writable{Src: s, URL: func(name string) string { return "gs://out/" + name }, Size: 17<<20 + 5, Registry: &r})

	t.Run("no bucket", func(t *testing.T) {
		err := sourcetest.Write(t.Context(), &Source{Client: srv.Client}, "gs://no-such-bucket/x", []byte("x"))
		var se *source.Error
		if !errors.Is(err, source.ErrNotFound) || !errors.As(err, &se) || se.Op != "write" {
			t.Errorf("write to a missing bucket = %v; want a write *source.Error wrapping ErrNotFound", err)
		}
	})

	t.Run("bad URL", func(t *testing.T) {
		for _, u := range []string{"gs://out", "gs://out/", "s3://out/x"} {
			if _, err := s.Create(t.Context(), u); err == nil {
				t.Errorf("Create(%q) succeeded", u)
			}
		}
	})
}
