package s3

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/sourcetest"
)

// isolateAWS points the AWS configuration at empty files and clears the variables
// these tests care about, so the developer's own AWS setup does not leak in.
func isolateAWS(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	for _, k := range []string{"AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
		"AWS_ENDPOINT_URL_S3", "AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION",
		PathStyleEnv} {
		t.Setenv(k, "") // restores the old value when the test ends
		os.Unsetenv(k)
	}
}

func TestS3ClientConfig(t *testing.T) {
	tests := []struct {
		name          string
		env           map[string]string
		pathStyle     bool
		region        string
		checksumsLazy bool // WhenRequired rather than the SDK default
	}{
		{"aws", nil, false, "us-east-1", false},
		{"region from env", map[string]string{"AWS_REGION": "eu-west-1"}, false, "eu-west-1", false},
		{"endpoint", map[string]string{"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, true, "us-east-1", true},
		{"s3 endpoint", map[string]string{"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}, true, "us-east-1", true},
		{"endpoint, virtual hosts", map[string]string{"AWS_ENDPOINT_URL": "http://minio:9000", PathStyleEnv: "false"}, false, "us-east-1", true},
		{"aws, path style", map[string]string{PathStyleEnv: "true"}, true, "us-east-1", false},
		{"endpoint, checksums asked for", map[string]string{"AWS_ENDPOINT_URL": "http://127.0.0.1:9",
			"AWS_REQUEST_CHECKSUM_CALCULATION": "when_supported", "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_supported"}, true, "us-east-1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			isolateAWS(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			c, err := (&Source{}).s3Client()
			if err != nil {
				t.Fatal(err)
			}
			o := c.Options()
			if o.UsePathStyle != tt.pathStyle || o.Region != tt.region {
				t.Errorf("UsePathStyle, Region = %v, %q; want %v, %q", o.UsePathStyle, o.Region, tt.pathStyle, tt.region)
			}
			lazy := o.RequestChecksumCalculation == aws.RequestChecksumCalculationWhenRequired &&
				o.ResponseChecksumValidation == aws.ResponseChecksumValidationWhenRequired
			if lazy != tt.checksumsLazy {
				t.Errorf("checksums only when required = %v, want %v", lazy, tt.checksumsLazy)
			}
		})
	}
}

func TestS3ConfigErrorRemembered(t *testing.T) {
	isolateAWS(t)
	t.Setenv(PathStyleEnv, "maybe")
	s := &Source{}
	for range 2 {
		_, err := s.Stat(t.Context(), "s3://b/k")
		var se *source.Error
		if !errors.As(err, &se) || se.Op != "stat" || !strings.Contains(err.Error(), PathStyleEnv) {
			t.Fatalf("Stat with a bad %s = %v", PathStyleEnv, err)
		}
		t.Setenv(PathStyleEnv, "true") // too late: the first error stays
	}
}

func TestS3BadURL(t *testing.T) {
	for _, url := range []string{"s3://", "s3://bucket", "s3://bucket/", "s3:///key", "gs://b/k", "b/k"} {
		if _, err := (&Source{Client: awss3.New(awss3.Options{})}).Open(t.Context(), url); err == nil || errors.Is(err, source.ErrNotFound) {
			t.Errorf("Open(%q) = %v; want a bad-URL error", url, err)
		}
	}
}

// TestS3StreamShort checks the length check of GetObject bodies, which a healthy
// server never trips.
func TestS3StreamShort(t *testing.T) {
	tests := []struct {
		name  string
		body  io.Reader
		want  int64
		short bool
	}{
		{"exact", strings.NewReader("0123"), 4, false},
		{"ends early", strings.NewReader("01"), 4, true},
		{"transport cut", io.MultiReader(strings.NewReader("01"), errReader{io.ErrUnexpectedEOF}), 4, true},
		{"unknown length", strings.NewReader("01"), -1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := &awss3.GetObjectOutput{Body: io.NopCloser(tt.body)}
			if tt.want >= 0 {
				out.ContentLength = aws.Int64(tt.want)
			}
			_, err := io.ReadAll(newS3Stream(t.Context(), "s3://b/k", out))
			if short := errors.Is(err, source.ErrShortRead); short != tt.short || (!tt.short && err != nil) {
				t.Errorf("read: %v; want short read %v", err, tt.short)
			}
			var se *source.Error
			if tt.short && (!errors.As(err, &se) || se.Op != "read" || se.URL != "s3://b/k") {
				t.Errorf("read: %v; want a read *source.Error", err)
			}
		})
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// TestS3MinIO runs S3 against a real MinIO server.
func TestS3MinIO(t *testing.T) {
	srv := testutil.MinIO(t)
	isolateAWS(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "shards")
	data := bytes.Repeat([]byte("0123456789"), 100_000) // 1 MB
	srv.Put(t, "shards", "train/000.tar", data)
	srv.Put(t, "shards", "empty.tar", nil)
	s := &Source{} // after SetEnv: it reads the environment on first use

	t.Run("stat", func(t *testing.T) {
		info, err := s.Stat(t.Context(), "s3://shards/train/000.tar")
		if err != nil {
			t.Fatal(err)
		}
		if info.URL != "s3://shards/train/000.tar" || info.Size != int64(len(data)) ||
			info.Version == "" || info.ModTime.IsZero() {
			t.Errorf("Stat = %+v", info)
		}
	})

	t.Run("open", func(t *testing.T) {
		rc, err := s.Open(t.Context(), "s3://shards/train/000.tar")
		if err != nil {
			t.Fatal(err)
		}
		if got, err := sourcetest.ReadAll(t, rc); err != nil || !bytes.Equal(got, data) {
			t.Errorf("Open read %d bytes, %v; want %d bytes", len(got), err, len(data))
		}
	})

	t.Run("range", func(t *testing.T) {
		n := int64(len(data))
		tests := []struct {
			name        string
			off, length int64
			want        []byte
		}{
			{"start", 0, 10, data[:10]},
			{"middle", 12345, 1000, data[12345:13345]},
			{"end", n - 7, 7, data[n-7:]},
			{"to end", n - 100, -1, data[n-100:]},
			{"whole", 0, -1, data},
			{"zero length", 5, 0, nil},
			{"cut at end", n - 3, 100, data[n-3:]},
			{"at end", n, 10, nil},
			{"past end", n + 100, 10, nil},
			{"past end to end", n + 100, -1, nil},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				rc, err := s.OpenRange(t.Context(), "s3://shards/train/000.tar", tt.off, tt.length)
				if err != nil {
					t.Fatalf("OpenRange(%d, %d): %v", tt.off, tt.length, err)
				}
				if got, err := sourcetest.ReadAll(t, rc); err != nil || !bytes.Equal(got, tt.want) {
					t.Errorf("OpenRange(%d, %d) read %d bytes, %v; want %d bytes", tt.off, tt.length, len(got), err, len(tt.want))
				}
			})
		}
	})

	t.Run("empty object", func(t *testing.T) {
		url := "s3://shards/empty.tar"
		if info, err := s.Stat(t.Context(), url); err != nil || info.Size != 0 {
			t.Errorf("Stat = %+v, %v", info, err)
		}
		open := map[string]func() (io.ReadCloser, error){
			"open":       func() (io.ReadCloser, error) { return s.Open(t.Context(), url) },
			"range all":  func() (io.ReadCloser, error) { return s.OpenRange(t.Context(), url, 0, -1) },
			"range part": func() (io.ReadCloser, error) { return s.OpenRange(t.Context(), url, 0, 10) },
		}
		for name, f := range open {
			rc, err := f()
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			if got, err := sourcetest.ReadAll(t, rc); err != nil || len(got) != 0 {
				t.Errorf("%s read %q, %v; want nothing", name, got, err)
			}
		}
	})

	t.Run("not found", func(t *testing.T) {
		for _, url := range []string{"s3://shards/missing.tar", "s3://no-such-bucket/000.tar"} {
			ops := []struct {
				op string
				f  func() error
			}{
				{"stat", func() error { _, err := s.Stat(t.Context(), url); return err }},
				{"open", func() error { _, err := s.Open(t.Context(), url); return err }},
				{"open", func() error { _, err := s.OpenRange(t.Context(), url, 10, 10); return err }},
			}
			for _, o := range ops {
				err := o.f()
				var se *source.Error
				if !errors.Is(err, source.ErrNotFound) || !errors.As(err, &se) || se.Op != o.op || se.URL != url {
					t.Errorf("%s %s = %v; want an *source.Error wrapping source.ErrNotFound", o.op, url, err)
				}
			}
		}
	})

	t.Run("wrong credentials", func(t *testing.T) {
		for _, env := range [][2]string{
			{"AWS_SECRET_ACCESS_KEY", "not-the-secret"},
			{"AWS_ACCESS_KEY_ID", "nobody"},
		} {
			t.Run(env[0], func(t *testing.T) {
				t.Setenv(env[0], env[1])
				s := &Source{}
				_, err := s.Stat(t.Context(), "s3://shards/train/000.tar")
				if !errors.Is(err, source.ErrPermission) {
					t.Errorf("Stat = %v; want source.ErrPermission", err)
				}
				t.Logf("stat: %v", err)
				_, err = s.Open(t.Context(), "s3://shards/train/000.tar")
				if !errors.Is(err, source.ErrPermission) {
					t.Errorf("Open = %v; want source.ErrPermission", err)
				}
				t.Logf("open: %v", err)
			})
		}
	})

	t.Run("own client via registry", func(t *testing.T) {
		var r source.Registry
		r.Register("minio", rewrite{to: "s3://", src: &Source{Client: srv.Client}})
		info, err := r.Stat(t.Context(), "minio://shards/train/000.tar")
		if err != nil || info.Size != int64(len(data)) {
			t.Errorf("Stat = %+v, %v", info, err)
		}
		rc, err := r.Open(t.Context(), "minio://shards/train/000.tar")
		if err != nil {
			t.Fatal(err)
		}
		if got, err := sourcetest.ReadAll(t, rc); err != nil || !bytes.Equal(got, data) {
			t.Errorf("Open read %d bytes, %v", len(got), err)
		}
		if _, err := r.Open(t.Context(), "s3://shards/train/000.tar"); !errors.Is(err, source.ErrUnknownScheme) {
			t.Errorf("Open of an unregistered scheme = %v; want source.ErrUnknownScheme", err)
		}
	})

	t.Run("canceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		rc, err := s.Open(ctx, "s3://shards/train/000.tar")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		cancel()
		if _, err := io.ReadAll(rc); !errors.Is(err, context.Canceled) {
			t.Errorf("read after cancel = %v; want context.Canceled", err)
		}
	})

	t.Run("server gone", func(t *testing.T) {
		srv.Stop()
		_, err := s.Stat(t.Context(), "s3://shards/train/000.tar")
		if err == nil || errors.Is(err, source.ErrNotFound) || errors.Is(err, source.ErrPermission) {
			t.Errorf("Stat with the server stopped = %v; want a plain failure", err)
		}
	})
}

// rewrite is a custom Source of the kind a library user registers: it serves its
// scheme by handing src the URL with the scheme replaced by to.
type rewrite struct {
	to  string
	src source.Source
}

func (r rewrite) url(url string) string {
	_, rest, _ := strings.Cut(url, "://")
	return r.to + rest
}

func (r rewrite) Stat(ctx context.Context, url string) (source.Info, error) {
	info, err := r.src.Stat(ctx, r.url(url))
	info.URL = url
	return info, err
}

func (r rewrite) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return r.src.Open(ctx, r.url(url))
}

// countingCreds is a credentials provider that reports each retrieval.
type countingCreds struct{ got chan struct{} }

func (c countingCreds) Retrieve(context.Context) (aws.Credentials, error) {
	c.got <- struct{}{}
	return aws.Credentials{AccessKeyID: "k", SecretAccessKey: "s", Source: "test"}, nil
}

func TestPrepareFetchesCredentialsAhead(t *testing.T) {
	creds := countingCreds{got: make(chan struct{}, 1)}
	s := &Source{Client: awss3.New(awss3.Options{Region: "us-east-1", Credentials: aws.NewCredentialsCache(creds)})}
	s.Prepare("s3://bucket/a.tar")
	<-creds.got // retrieved without any request
	// Kept by the client's cache: a request's signing does not retrieve them again.
	if _, err := s.Client.Options().Credentials.Retrieve(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-creds.got:
		t.Fatal("credentials retrieved a second time")
	default:
	}
}
