package gcs

import (
	"bytes"
	"errors"
	"testing"

	"github.com/shardload/shardload/internal/testenv"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/sourcetest"
)

// TestGCSCreateFake writes objects to fake-gcs-server and reads them back.
func TestGCSCreateFake(t *testing.T) {
	srv := testenv.FakeGCS(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "out")
	s := &Source{} // it must find the emulator through STORAGE_EMULATOR_HOST
	url := "gs://out/train/shardload.index"
	// Size: more than the writer's 16 MiB chunk, a resumable upload of two chunks.
	sourcetest.RunCreator(t, sourcetest.Writable{Src: s, URL: func(name string) string { return "gs://out/" + name }, Size: 17<<20 + 5})

	t.Run("through a registry", func(t *testing.T) {
		// Behind a Fetcher, as Register puts it: Registry.Create unwraps it.
		var r source.Registry
		Register(&r, source.FetchOptions{})
		data := []byte("via the registry")
		if err := sourcetest.Write(t.Context(), &r, url, data); err != nil {
			t.Fatal(err)
		}
		rc, err := s.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := sourcetest.ReadAll(t, rc); err != nil || !bytes.Equal(got, data) {
			t.Errorf("read back %q, %v; want %q", got, err, data)
		}
	})

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
