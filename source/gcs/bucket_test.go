package gcs

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
)

// TestGCSMissingBucket: a listing of a bucket that does not exist is
// ErrBucketNotFound (and still ErrNotFound); a missing object in a bucket that exists
// is ErrNotFound alone. Describe names the emulator.
func TestGCSMissingBucket(t *testing.T) {
	srv := testutil.FakeGCS(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "there")
	g := &Source{}
	ctx := t.Context()
	err := g.List(ctx, "gs://no-such-bucket/", func(source.Info) error { return nil })
	if !errors.Is(err, source.ErrBucketNotFound) || !errors.Is(err, source.ErrNotFound) {
		t.Errorf("List of a missing bucket: %v", err)
	}
	_, err = g.Stat(ctx, "gs://there/x.tar")
	if !errors.Is(err, source.ErrNotFound) || errors.Is(err, source.ErrBucketNotFound) {
		t.Errorf("Stat of a missing object: %v", err)
	}
	if d := g.Describe(ctx, "gs://there/x.tar"); !strings.Contains(d, "STORAGE_EMULATOR_HOST") {
		t.Errorf("Describe: %s", d)
	}
}
