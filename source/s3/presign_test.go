package s3

import (
	"bytes"
	"net/http"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/httpsrc"
	"github.com/shardload/shardload/source/sourcetest"
)

// TestPresignedURL reads an object of a real MinIO through a presigned GET URL with
// the HTTP source: MinIO refuses a HEAD signed for GET (403), so the Stat probes
// with a ranged GET. The object is read as parallel parts, and through the cache.
func TestPresignedURL(t *testing.T) {
	srv := testutil.MinIO(t)
	srv.CreateBucket(t, "shards")
	data := make([]byte, 3<<20+12345)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	srv.Put(t, "shards", "train/000.tar", data)
	srv.Put(t, "shards", "empty.tar", nil)
	presign := func(key string, expires time.Duration) string {
		bucket := "shards"
		req, err := awss3.NewPresignClient(srv.Client).PresignGetObject(t.Context(),
			&awss3.GetObjectInput{Bucket: &bucket, Key: &key}, awss3.WithPresignExpires(expires))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(req.URL, "X-Amz-Signature=") {
			t.Fatalf("presigned URL without a signature: %s", redact.URL(req.URL))
		}
		return req.URL
	}
	url := presign("train/000.tar", time.Hour)

	// What a Stat by HEAD met: the store refuses a HEAD signed for GET.
	head, err := http.Head(url)
	if err != nil {
		t.Fatal(err)
	}
	head.Body.Close()
	if head.StatusCode != http.StatusForbidden {
		t.Fatalf("HEAD of a presigned GET URL: %s; want 403 Forbidden", head.Status)
	}

	raw := &httpsrc.Source{}
	info, err := raw.Stat(t.Context(), url)
	if err != nil {
		t.Fatalf("Stat of a presigned URL: %v", err)
	}
	if info.Size != int64(len(data)) || info.Version == "" || info.ModTime.IsZero() {
		t.Fatalf("Stat = %+v; want size %d, a version and a time", info, len(data))
	}
	// An error names the URL without its signature.
	_, err = raw.OpenVersion(t.Context(), url, `"no-such-version"`, 0, 10)
	sig := signature(t, url)
	if err == nil || !strings.Contains(err.Error(), "X-Amz-Signature=REDACTED") || strings.Contains(err.Error(), sig) {
		t.Errorf("a read pinned to a version that does not exist: %v; want an error naming the URL, its signature redacted", err)
	}

	// Parallel parts of 1 MiB, pinned to the version the probe found.
	f := source.NewFetcher(raw, source.FetchOptions{PartSize: 1 << 20, Parallel: 3, SingleRate: -1})
	rc, err := f.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := sourcetest.ReadAll(t, rc); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v; want the %d bytes put", len(got), err, len(data))
	}

	empty := presign("empty.tar", time.Hour)
	if info, err := raw.Stat(t.Context(), empty); err != nil || info.Size != 0 {
		t.Errorf("Stat of an empty object's presigned URL = %+v, %v; want size 0", info, err)
	}

	c, err := cache.New(cache.Options{Dir: t.TempDir(), Logf: t.Logf}, f)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 2 { // a fill, then a hit under a URL with a new signature
		u := url
		if i == 1 {
			u = presign("train/000.tar", 2*time.Hour)
			if signature(t, u) == signature(t, url) {
				t.Fatal("the second presigned URL has the first one's signature")
			}
		}
		rc, err := c.Open(t.Context(), u)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := sourcetest.ReadAll(t, rc); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read %d through the cache: %d bytes, %v; want the %d bytes put", i, len(got), err, len(data))
		}
	}
}

// signature is the X-Amz-Signature of a presigned URL.
func signature(t *testing.T, u string) string {
	p, err := neturl.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	sig := p.Query().Get("X-Amz-Signature")
	if len(sig) < 16 {
		t.Fatalf("presigned URL with signature %q", sig)
	}
	return sig
}
