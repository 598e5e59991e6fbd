package s3

import (
	"errors"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/sourcetest"
)

// TestS3CreateMinIO writes objects to a real MinIO server and reads them back.
func TestS3CreateMinIO(t *testing.T) {
	srv := testutil.MinIO(t)
	isolateAWS(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "out")
	s := &Source{}

	// Behind a Fetcher, as Register puts it: Registry.Create unwraps it.
	var r source.Registry
	Register(&r, source.FetchOptions{})
	sourcetest.RunCreator(t, sourcetest.Writable{Src: s, URL: func(name string) string { return "s3://out/" + name }, Size: 3<<20 + 5, Registry: &r})

	t.Run("no bucket", func(t *testing.T) {
		err := sourcetest.Write(t.Context(), s, "s3://no-such-bucket/x", []byte("x"))
		var se *source.Error
		if !errors.Is(err, source.ErrNotFound) || !errors.As(err, &se) || se.Op != "write" {
			t.Errorf("write to a missing bucket = %v; want a write *source.Error wrapping ErrNotFound", err)
		}
	})

	t.Run("bad URL", func(t *testing.T) {
		for _, u := range []string{"s3://out", "s3://out/", "gs://out/x"} {
			if _, err := s.Create(t.Context(), u); err == nil {
				t.Errorf("Create(%q) succeeded", u)
			}
		}
	})
}
