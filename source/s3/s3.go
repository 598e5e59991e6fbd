// Package s3 is the source.Source for s3:// URLs: Amazon S3 and S3-compatible
// stores such as MinIO, through the AWS SDK. Importing it registers the backend in
// source.Default.
package s3

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/shardload/shardload/source"
)

// Source reads objects addressed as s3://bucket/key from Amazon S3 or an S3-compatible
// store such as MinIO. The key is used as written, without percent-decoding.
//
// The zero value is ready to use: on first use it creates a client from the standard
// AWS configuration (environment, shared config and credentials files, profiles, web
// identity, instance roles), once, and remembers a configuration error. Defaults:
//   - region us-east-1 when none is configured;
//   - AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_S3 (or endpoint_url in a profile) select
//     the endpoint, and when one is set, path-style addressing is used so that MinIO
//     and similar stores work; SHARDLOAD_S3_PATH_STYLE=true|false overrides this;
//   - with a custom endpoint, checksums are computed and validated only where the
//     API requires them, as S3-compatible stores do not all support the SDK's
//     default checksums; AWS_REQUEST_CHECKSUM_CALCULATION and
//     AWS_RESPONSE_CHECKSUM_VALIDATION, when set, win (the same settings in a
//     shared config file do not, for a custom endpoint);
//   - the endpoint may have a path (http://ais-gateway:51080/s3): requests go under
//     it; redirects (307) are followed for reads, and for Create's PutObject too,
//     its body sent again, as an AIStore gateway redirects every object request to
//     the node that holds the object.
//
// Versions are ETags in their quoted form ("d41d8cd9..."), whether the store quoted
// them or not: AIStore, for one, lists them unquoted and answers HEAD and GET with
// them quoted, and a listing's version must equal Stat's for a cache or an index to
// match them. A listing entry without an ETag has no version.
//
// A Source is safe for concurrent use. It must not be copied after first use.
type Source struct {
	// Client, if not nil, is used as is instead of a client built from the default
	// configuration. Set it before first use.
	Client *awss3.Client
	// ListPageSize is the most keys one ListObjectsV2 page asks for. Default 1000.
	ListPageSize int32

	once   sync.Once
	client *awss3.Client
	err    error
}

var (
	_ source.Source        = (*Source)(nil)
	_ source.RangeReader   = (*Source)(nil)
	_ source.VersionReader = (*Source)(nil)
	_ source.Lister        = (*Source)(nil)
	_ source.Creator       = (*Source)(nil)
)

// PathStyleEnv names the environment variable that, set to true or false, overrides
// whether S3 uses path-style addressing (http://host/bucket/key).
const PathStyleEnv = "SHARDLOAD_S3_PATH_STYLE"

// Stat returns the object's size, modification time and ETag as Version.
func (s *Source) Stat(ctx context.Context, url string) (source.Info, error) {
	c, bucket, key, err := s.prepare(url)
	if err != nil {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: err}
	}
	out, err := c.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: &bucket, Key: &key})
	if err != nil {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: s3Err(err)}
	}
	return source.Info{
		URL:     url,
		Size:    aws.ToInt64(out.ContentLength),
		Version: quoteETag(aws.ToString(out.ETag)),
		ModTime: aws.ToTime(out.LastModified),
	}, nil
}

// Open returns the whole object as a stream.
func (s *Source) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	c, bucket, key, err := s.prepare(url)
	if err != nil {
		return nil, &source.Error{Op: "open", URL: url, Err: err}
	}
	out, err := c.GetObject(ctx, &awss3.GetObjectInput{Bucket: &bucket, Key: &key})
	if err != nil {
		return nil, &source.Error{Op: "open", URL: url, Err: s3Err(err)}
	}
	return newS3Stream(ctx, url, out), nil
}

// OpenRange returns length bytes of the object starting at off, or the rest of the
// object when length < 0. A range past the end of the object is cut short; one
// starting at or past the end is an empty stream.
func (s *Source) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	return s.openRange(ctx, url, "", off, length)
}

// OpenVersion is OpenRange with If-Match on the ETag version: an object that was
// overwritten fails with an error wrapping ErrChanged.
func (s *Source) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	return s.openRange(ctx, url, version, off, length)
}

func (s *Source) openRange(ctx context.Context, url, etag string, off, length int64) (io.ReadCloser, error) {
	c, bucket, key, err := s.prepare(url)
	if err == nil && off < 0 {
		err = fmt.Errorf("source: negative offset %d", off)
	}
	if err != nil {
		return nil, &source.Error{Op: "open", URL: url, Err: err}
	}
	if length == 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	rng := fmt.Sprintf("bytes=%d-", off)
	if length > 0 && off <= (1<<63-1)-length {
		rng += strconv.FormatInt(off+length-1, 10)
	}
	in := &awss3.GetObjectInput{Bucket: &bucket, Key: &key, Range: &rng}
	if etag != "" {
		etag = quoteETag(etag)
		in.IfMatch = &etag
	}
	out, err := c.GetObject(ctx, in)
	if err != nil {
		var re *smithyhttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusRequestedRangeNotSatisfiable {
			// S3 answers InvalidRange for a range starting at or past the end.
			return io.NopCloser(strings.NewReader("")), nil
		}
		return nil, &source.Error{Op: "open", URL: url, Err: s3Err(err)}
	}
	if got := quoteETag(aws.ToString(out.ETag)); etag != "" && got != "" && got != etag {
		out.Body.Close() // a store that ignored If-Match, as AIStore does
		return nil, &source.Error{Op: "open", URL: url, Err: fmt.Errorf("%w: ETag %s, was %s", source.ErrChanged, got, etag)}
	}
	// A server may answer a Range with the whole object (200, no Content-Range).
	if out.ContentRange == nil && (off > 0 || length > 0 && aws.ToInt64(out.ContentLength) > length) {
		out.Body.Close()
		return nil, &source.Error{Op: "open", URL: url, Err: source.ErrRangeIgnored}
	}
	return newS3Stream(ctx, url, out), nil
}

// List lists the keys that start with prefix's key and have no "/" after it, one
// ListObjectsV2 page of ListPageSize keys at a time.
func (s *Source) List(ctx context.Context, prefix string, fn func(source.Info) error) error {
	rest, ok := strings.CutPrefix(prefix, "s3://")
	if !ok && source.Scheme(prefix) == "s3" {
		rest, ok = prefix[len("s3://"):], true
	}
	bucket, keyPrefix, _ := strings.Cut(rest, "/")
	if !ok || bucket == "" {
		return &source.Error{Op: "list", URL: prefix, Err: fmt.Errorf("source: not an s3://bucket/prefix URL: %q", prefix)}
	}
	c, err := s.s3Client()
	if err != nil {
		return &source.Error{Op: "list", URL: prefix, Err: err}
	}
	in := &awss3.ListObjectsV2Input{Bucket: &bucket, Prefix: &keyPrefix, Delimiter: aws.String("/")}
	if s.ListPageSize > 0 {
		in.MaxKeys = aws.Int32(s.ListPageSize)
	}
	base := prefix[:len(prefix)-len(keyPrefix)]
	pages := awss3.NewListObjectsV2Paginator(c, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return &source.Error{Op: "list", URL: prefix, Err: s3Err(err)}
		}
		for _, o := range page.Contents {
			err := fn(source.Info{
				URL:     base + aws.ToString(o.Key),
				Size:    aws.ToInt64(o.Size),
				Version: quoteETag(aws.ToString(o.ETag)),
				ModTime: aws.ToTime(o.LastModified),
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// quoteETag returns etag in its quoted form, as S3 sends it in headers and
// listings: "abc" for abc or "abc". An empty or weak (W/"...") ETag is returned as
// it is.
func quoteETag(etag string) string {
	if etag == "" || strings.HasPrefix(etag, "W/") {
		return etag
	}
	return `"` + strings.Trim(etag, `"`) + `"`
}

// prepare returns the client and the object's bucket and key.
func (s *Source) prepare(url string) (c *awss3.Client, bucket, key string, err error) {
	if bucket, key, err = source.SplitBucket(url, "s3"); err != nil {
		return nil, "", "", err
	}
	c, err = s.s3Client()
	return c, bucket, key, err
}

// Prepare builds the client (unless Client is set) and has it fetch its
// credentials, in the background: where they come from a web identity token, an
// instance role or SSO, that is a request of its own, which then overlaps the
// caller's other work instead of delaying the first request for url. It makes a
// Source a source.Preparer.
func (s *Source) Prepare(url string) {
	go func() {
		c, err := s.s3Client()
		if err != nil || c.Options().Credentials == nil {
			return // the first call reports it
		}
		ctx, cancel := context.WithTimeout(context.Background(), prepareTimeout)
		defer cancel()
		c.Options().Credentials.Retrieve(ctx) // kept by the client's credentials cache; an error is the first call's
	}()
}

// prepareTimeout bounds how long Prepare's goroutine waits for credentials; a
// request that needs them meanwhile waits for the same retrieval under its own
// deadline.
const prepareTimeout = 30 * time.Second

var _ source.Preparer = (*Source)(nil)

var _ source.Describer = (*Source)(nil)

// Describe says where the requests for url go and with which credentials: the
// endpoint (and what set it), the region, the addressing, and the credentials' source
// as the SDK reports it (the environment, a shared credentials file and profile, a
// web identity, an instance role), retrieving them under ctx; or why there are none.
func (s *Source) Describe(ctx context.Context, url string) string {
	c, err := s.s3Client()
	if err != nil {
		return err.Error()
	}
	o := c.Options()
	endpoint := "https://s3." + o.Region + ".amazonaws.com (AWS's; no AWS_ENDPOINT_URL set)"
	if o.BaseEndpoint != nil {
		endpoint = *o.BaseEndpoint
		switch {
		case os.Getenv("AWS_ENDPOINT_URL_S3") != "":
			endpoint += " (from AWS_ENDPOINT_URL_S3)"
		case os.Getenv("AWS_ENDPOINT_URL") != "":
			endpoint += " (from AWS_ENDPOINT_URL)"
		case s.Client == nil:
			endpoint += " (from the profile's endpoint_url)"
		}
	}
	style := "virtual-hosted-style"
	if o.UsePathStyle {
		style = "path-style"
	}
	return fmt.Sprintf("endpoint %s, region %s, %s addressing, %s", endpoint, o.Region, style, credentialSource(ctx, o.Credentials))
}

// credentialSource says where creds come from, by the source the SDK names.
func credentialSource(ctx context.Context, creds aws.CredentialsProvider) string {
	if creds == nil {
		return "no credentials (anonymous requests)"
	}
	v, err := creds.Retrieve(ctx)
	if err != nil {
		return fmt.Sprintf("no credentials found (%v): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE and a shared credentials file", err)
	}
	profile := cmp.Or(os.Getenv("AWS_PROFILE"), "default")
	switch src := v.Source; {
	case src == "EnvConfigCredentials":
		return "credentials from the environment (AWS_ACCESS_KEY_ID, access key " + keyID(v.AccessKeyID) + ")"
	case strings.HasPrefix(src, "SharedConfigCredentials"):
		file := strings.TrimSpace(strings.TrimPrefix(src, "SharedConfigCredentials:"))
		return fmt.Sprintf("credentials from the shared credentials file %s, profile %s (access key %s)", cmp.Or(file, "~/.aws/credentials"), profile, keyID(v.AccessKeyID))
	case src == "":
		return "credentials of unknown source (access key " + keyID(v.AccessKeyID) + ")"
	default:
		return fmt.Sprintf("credentials from %s (profile %s, access key %s)", src, profile, keyID(v.AccessKeyID))
	}
}

// keyID shows an access key id by its first characters: enough to tell keys apart
// in a message, not the whole identifier.
func keyID(id string) string {
	if len(id) <= 4 {
		return "…"
	}
	return id[:4] + "…"
}

func (s *Source) s3Client() (*awss3.Client, error) {
	if s.Client != nil {
		return s.Client, nil
	}
	s.once.Do(func() { s.client, s.err = newS3Client(context.Background()) })
	return s.client, s.err
}

// newS3Client builds a client from the default AWS configuration with the defaults
// documented on Source.
func newS3Client(ctx context.Context) (*awss3.Client, error) {
	var pathStyle *bool
	if v := os.Getenv(PathStyleEnv); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("source: %s=%q: want true or false", PathStyleEnv, v)
		}
		pathStyle = &b
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("source: loading AWS config: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	return awss3.NewFromConfig(cfg, func(o *awss3.Options) {
		// One attempt per call: the retry policy of a Fetcher is the one in charge.
		o.Retryer = aws.NopRetryer{}
		if o.HTTPClient != nil {
			o.HTTPClient = replayClient{o.HTTPClient}
		}
		custom := o.BaseEndpoint != nil // resolved from cfg and the environment by now
		o.UsePathStyle = custom
		if pathStyle != nil {
			o.UsePathStyle = *pathStyle
		}
		// LoadDefaultConfig has already turned "not configured" into WhenSupported,
		// so only the environment can say the user asked for it.
		if custom && os.Getenv("AWS_REQUEST_CHECKSUM_CALCULATION") == "" {
			o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		}
		if custom && os.Getenv("AWS_RESPONSE_CHECKSUM_VALIDATION") == "" {
			o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		}
	}), nil
}

// s3Err makes an S3 error matchable against ErrNotFound (ErrBucketNotFound for a
// missing bucket) and ErrPermission while keeping the SDK's error (and its message)
// matchable too.
func s3Err(err error) error {
	code, status := "", 0
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	if code == "NotFound" && re != nil && re.Response != nil {
		// A HEAD's answer has no body to name its error: MinIO names it in a header.
		if c := re.Response.Header.Get("X-Minio-Error-Code"); c != "" {
			code = c
		}
	}
	switch {
	case code == "NoSuchBucket":
		return fmt.Errorf("%w: %w", source.ErrBucketNotFound, err)
	case status == http.StatusNotFound, code == "NoSuchKey", code == "NotFound":
		return fmt.Errorf("%w: %w", source.ErrNotFound, err)
	case status == http.StatusForbidden, code == "AccessDenied", code == "InvalidAccessKeyId",
		code == "SignatureDoesNotMatch":
		return fmt.Errorf("%w: %w", source.ErrPermission, err)
	case status == http.StatusPreconditionFailed, code == "PreconditionFailed":
		return fmt.Errorf("%w: %w", source.ErrChanged, err)
	case source.RetryableStatus(status), code == "SlowDown", code == "InternalError", code == "RequestTimeout":
		var after time.Duration
		if re != nil && re.Response != nil {
			after = source.ParseRetryAfter(re.Response.Header, time.Now())
		}
		return &source.StatusError{Status: status, Code: code, RetryAfterHint: after, Err: err}
	}
	return err
}

// s3Stream is a GetObject body that fails with ErrShortRead if it ends before
// Content-Length bytes. It stops when ctx is done.
type s3Stream struct {
	ctx       context.Context
	url       string
	body      io.ReadCloser
	want, got int64 // want < 0: unknown
}

func newS3Stream(ctx context.Context, url string, out *awss3.GetObjectOutput) *s3Stream {
	want := int64(-1)
	if out.ContentLength != nil {
		want = *out.ContentLength
	}
	return &s3Stream{ctx: ctx, url: url, body: out.Body, want: want}
}

func (s *s3Stream) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, &source.Error{Op: "read", URL: s.url, Err: err}
	}
	n, err := s.body.Read(p)
	s.got += int64(n)
	switch {
	case err == io.EOF && s.want >= 0 && s.got < s.want:
		return n, &source.Error{Op: "read", URL: s.url,
			Err: fmt.Errorf("%w: read %d of %d bytes", source.ErrShortRead, s.got, s.want)}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return n, &source.Error{Op: "read", URL: s.url,
			Err: fmt.Errorf("%w: read %d of %d bytes: %w", source.ErrShortRead, s.got, s.want, err)}
	case err != nil && err != io.EOF:
		return n, &source.Error{Op: "read", URL: s.url, Err: s3Err(err)}
	}
	return n, err
}

func (s *s3Stream) Close() error { return s.body.Close() }

// MaxPut is the largest object Create writes: S3's limit on one PutObject.
const MaxPut = 5 << 30

// Create returns a writer of the object at url (see source.Creator). The bytes are
// held in memory and sent as one PutObject on Close, which S3 publishes whole or not
// at all; it is tried again under source.RetryPolicy's defaults when it fails in a
// way a retry may cure. Objects are small things such as an index: more than MaxPut
// bytes fail the write.
func (s *Source) Create(ctx context.Context, url string) (io.WriteCloser, error) {
	c, bucket, key, err := s.prepare(url)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return nil, &source.Error{Op: "create", URL: url, Err: err}
	}
	return &s3Writer{ctx: ctx, url: url, c: c, bucket: bucket, key: key}, nil
}

// s3Writer buffers an object and puts it on Close.
type s3Writer struct {
	ctx         context.Context
	url         string
	c           *awss3.Client
	bucket, key string
	buf         bytes.Buffer
	err         error // the first failure; every later call returns it
	closed      bool
}

func (w *s3Writer) Write(p []byte) (int, error) {
	switch {
	case w.err != nil:
		return 0, w.err
	case w.closed:
		return 0, &source.Error{Op: "write", URL: w.url, Err: os.ErrClosed}
	case w.ctx.Err() != nil:
		w.err = &source.Error{Op: "write", URL: w.url, Err: w.ctx.Err()}
		return 0, w.err
	case int64(w.buf.Len())+int64(len(p)) > MaxPut:
		w.err = &source.Error{Op: "write", URL: w.url, Err: fmt.Errorf("source: object larger than %d bytes, the most one PutObject takes", int64(MaxPut))}
		return 0, w.err
	}
	return w.buf.Write(p)
}

// Close puts the object, unless a Write failed or ctx is done.
func (w *s3Writer) Close() error {
	if w.closed {
		return w.err
	}
	w.closed = true
	if w.err != nil {
		return w.err
	}
	data := w.buf.Bytes()
	ctx := context.WithValue(w.ctx, putBodyKey{}, data) // for replayClient
	err := source.RetryPolicy{}.Do(w.ctx, func(int) error {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		_, err := w.c.PutObject(ctx, &awss3.PutObjectInput{
			Bucket: &w.bucket, Key: &w.key, Body: bytes.NewReader(data),
			ContentLength: aws.Int64(int64(len(data))), ContentType: aws.String("application/octet-stream"),
		})
		if err != nil {
			return s3Err(err)
		}
		return nil
	})
	w.buf = bytes.Buffer{}
	if err != nil {
		w.err = &source.Error{Op: "write", URL: w.url, Err: err}
	}
	return w.err
}

// putBodyKey is the context key under which Create's PutObject carries its body for
// replayClient.
type putBodyKey struct{}

// replayClient lets the HTTP client follow a redirect of a PutObject that Create
// makes, by giving the request a GetBody that returns its bytes again: the SDK's
// requests have none, and net/http then returns a 307 to a request with a body
// instead of following it. An AIStore gateway answers every PUT with such a
// redirect, to the target node that stores the object.
type replayClient struct{ next awss3.HTTPClient }

// Do sends req, replayable when it carries Create's body.
func (c replayClient) Do(req *http.Request) (*http.Response, error) {
	if data, ok := req.Context().Value(putBodyKey{}).([]byte); ok && req.GetBody == nil &&
		req.Body != nil && req.ContentLength == int64(len(data)) {
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	}
	return c.next.Do(req)
}

// Scheme is the URL scheme this package serves.
const Scheme = "s3"

func init() { Register(source.Default, source.FetchOptions{}) }

// Register makes a zero Source, behind a Fetcher with opts, serve "s3" URLs in r.
// Importing this package does so for source.Default with the default options.
func Register(r *source.Registry, opts source.FetchOptions) {
	r.Register(Scheme, source.NewFetcher(&Source{}, opts))
}
