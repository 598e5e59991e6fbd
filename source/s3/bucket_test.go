package s3

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
)

// TestS3MissingBucket: a bucket that does not exist is ErrBucketNotFound (and still
// ErrNotFound) for a listing and for a Stat (MinIO names the error of a HEAD in a
// header); a missing object in a bucket that exists is ErrNotFound alone. Describe
// names the endpoint and where the credentials came from, without the secret.
func TestS3MissingBucket(t *testing.T) {
	srv := testutil.MinIO(t)
	srv.CreateBucket(t, "there")
	srv.SetEnv(t)
	s := &Source{}
	ctx := t.Context()
	_, err := s.Stat(ctx, "s3://no-such-bucket/x.tar")
	if !errors.Is(err, source.ErrBucketNotFound) || !errors.Is(err, source.ErrNotFound) {
		t.Errorf("Stat in a missing bucket: %v", err)
	}
	err = s.List(ctx, "s3://no-such-bucket/", func(source.Info) error { return nil })
	if !errors.Is(err, source.ErrBucketNotFound) || !errors.Is(err, source.ErrNotFound) {
		t.Errorf("List of a missing bucket: %v", err)
	}
	_, err = s.Stat(ctx, "s3://there/x.tar")
	if !errors.Is(err, source.ErrNotFound) || errors.Is(err, source.ErrBucketNotFound) {
		t.Errorf("Stat of a missing object: %v", err)
	}
	d := s.Describe(ctx, "s3://there/x.tar")
	for _, w := range []string{"endpoint " + srv.Endpoint, "path-style", "credentials from the environment (AWS_ACCESS_KEY_ID"} {
		if !strings.Contains(d, w) {
			t.Errorf("Describe does not say %q: %s", w, d)
		}
	}
	if strings.Contains(d, srv.SecretKey) || strings.Contains(d, srv.AccessKey) {
		t.Errorf("Describe shows a key: %s", d)
	}
}
