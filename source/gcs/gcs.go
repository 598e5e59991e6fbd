// Package gcs is the source.Source for gs:// URLs: Google Cloud Storage, or an
// emulator such as fake-gcs-server, through the Cloud Storage client. Importing it
// registers the backend in source.Default.
package gcs

import (
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

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"

	"github.com/shardload/shardload/source"
)

// Source reads objects addressed as gs://bucket/object from Google Cloud Storage.
// The object name is used as written, without percent-decoding.
//
// The zero value is ready to use: on first use it creates a client, once, with
// Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, the gcloud
// configuration, the metadata server), or with no credentials against an emulator
// when STORAGE_EMULATOR_HOST is set (as fake-gcs-server is used). The client's own
// retries are turned off: it would retry some failures forever, and the retry policy
// of a Fetcher is the one in charge.
//
// Info.Version is the object's generation; OpenVersion reads that generation only.
// A Source is safe for concurrent use. It must not be copied after first use.
type Source struct {
	// Client, if not nil, is used as is instead of a client built as above. Set it
	// before first use.
	Client *storage.Client
	// ListPageSize is the most objects one listing page asks for. Default 1000.
	ListPageSize int

	once   sync.Once
	client *storage.Client
	err    error
}

var (
	_ source.Source        = (*Source)(nil)
	_ source.RangeReader   = (*Source)(nil)
	_ source.VersionReader = (*Source)(nil)
	_ source.Lister        = (*Source)(nil)
	_ source.Creator       = (*Source)(nil)
)

// Stat returns the object's size, update time and generation as Version.
func (g *Source) Stat(ctx context.Context, url string) (source.Info, error) {
	c, bucket, name, err := g.prepare(url)
	if err != nil {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: err}
	}
	attrs, err := c.Bucket(bucket).Object(name).Attrs(ctx)
	if err != nil {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: gcsErr(err)}
	}
	return source.Info{URL: url, Size: attrs.Size, Version: strconv.FormatInt(attrs.Generation, 10), ModTime: attrs.Updated}, nil
}

// Open returns the whole object as a stream.
func (g *Source) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return g.open(ctx, url, "", 0, -1)
}

// OpenRange returns length bytes of the object starting at off, or the rest of the
// object when length < 0. A range past the end is cut short; one starting at or past
// the end is an empty stream.
func (g *Source) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	return g.open(ctx, url, "", off, length)
}

// OpenVersion is OpenRange of generation version only: when that generation is no
// longer the object's (overwritten or deleted), it fails with ErrChanged.
func (g *Source) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	return g.open(ctx, url, version, off, length)
}

func (g *Source) open(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	c, bucket, name, err := g.prepare(url)
	if err == nil && off < 0 {
		err = fmt.Errorf("source: negative offset %d", off)
	}
	var gen int64
	if err == nil && version != "" {
		gen, err = strconv.ParseInt(version, 10, 64)
		if err != nil {
			err = fmt.Errorf("source: bad GCS generation %q", version)
		}
	}
	if err != nil {
		return nil, &source.Error{Op: "open", URL: url, Err: err}
	}
	if length == 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	obj := c.Bucket(bucket).Object(name)
	if version != "" {
		obj = obj.Generation(gen)
	}
	if length < 0 {
		length = -1
	}
	r, err := obj.NewRangeReader(ctx, off, length)
	if err != nil {
		var ge *googleapi.Error
		if errors.As(err, &ge) && ge.Code == http.StatusRequestedRangeNotSatisfiable {
			return io.NopCloser(strings.NewReader("")), nil
		}
		if version != "" && errors.Is(gcsErr(err), source.ErrNotFound) {
			// Not ErrNotFound: the object may well exist, at another generation.
			err = fmt.Errorf("%w: generation %s is gone (%v)", source.ErrChanged, version, err)
		} else {
			err = gcsErr(err)
		}
		return nil, &source.Error{Op: "open", URL: url, Err: err}
	}
	if version != "" && r.Attrs.Generation != 0 && r.Attrs.Generation != gen {
		r.Close()
		return nil, &source.Error{Op: "open", URL: url, Err: fmt.Errorf("%w: generation %d, was %d", source.ErrChanged, r.Attrs.Generation, gen)}
	}
	if off > 0 && r.Attrs.StartOffset != off && r.Remain() > 0 {
		r.Close()
		return nil, &source.Error{Op: "open", URL: url, Err: fmt.Errorf("%w: asked for byte %d, got %d", source.ErrRangeIgnored, off, r.Attrs.StartOffset)}
	}
	return &gcsStream{ctx: ctx, url: url, r: r, want: r.Remain()}, nil
}

// List lists the objects whose names start with prefix's and have no "/" after it,
// one page of ListPageSize objects at a time.
func (g *Source) List(ctx context.Context, prefix string, fn func(source.Info) error) error {
	rest, ok := strings.CutPrefix(prefix, "gs://")
	if !ok && source.Scheme(prefix) == "gs" {
		rest, ok = prefix[len("gs://"):], true
	}
	bucket, namePrefix, _ := strings.Cut(rest, "/")
	if !ok || bucket == "" {
		return &source.Error{Op: "list", URL: prefix, Err: fmt.Errorf("source: not a gs://bucket/prefix URL: %q", prefix)}
	}
	c, err := g.gcsClient()
	if err != nil {
		return &source.Error{Op: "list", URL: prefix, Err: err}
	}
	q := &storage.Query{Prefix: namePrefix, Delimiter: "/"}
	if err := q.SetAttrSelection([]string{"Name", "Size", "Generation", "Updated"}); err != nil {
		return &source.Error{Op: "list", URL: prefix, Err: err}
	}
	it := c.Bucket(bucket).Objects(ctx, q)
	if g.ListPageSize > 0 {
		it.PageInfo().MaxSize = g.ListPageSize
	}
	base := prefix[:len(prefix)-len(namePrefix)]
	for {
		attrs, err := it.Next()
		if err == iterator.Done {
			return nil
		}
		if err != nil {
			return &source.Error{Op: "list", URL: prefix, Err: gcsErr(err)}
		}
		if attrs.Name == "" { // a "directory" (a common prefix)
			continue
		}
		err = fn(source.Info{URL: base + attrs.Name, Size: attrs.Size,
			Version: strconv.FormatInt(attrs.Generation, 10), ModTime: attrs.Updated})
		if err != nil {
			return err
		}
	}
}

func (g *Source) prepare(url string) (c *storage.Client, bucket, name string, err error) {
	if bucket, name, err = source.SplitBucket(url, "gs"); err != nil {
		return nil, "", "", err
	}
	c, err = g.gcsClient()
	return c, bucket, name, err
}

// Prepare builds the client (unless Client is set) in the background: finding the
// default credentials reads files and may ask the metadata server, which then
// overlaps the caller's other work. It makes a Source a source.Preparer.
func (g *Source) Prepare(url string) { go g.gcsClient() }

var _ source.Preparer = (*Source)(nil)

func (g *Source) gcsClient() (*storage.Client, error) {
	if g.Client != nil {
		return g.Client, nil
	}
	g.once.Do(func() {
		g.client, g.err = storage.NewClient(context.Background())
		if g.err != nil {
			g.err = fmt.Errorf("source: creating the GCS client: %w", g.err)
			return
		}
		g.client.SetRetry(storage.WithPolicy(storage.RetryNever))
	})
	return g.client, g.err
}

var _ source.Describer = (*Source)(nil)

// Describe says where the requests for url go and with which credentials: the
// emulator at STORAGE_EMULATOR_HOST (no credentials), or Google's endpoint with
// Application Default Credentials and where they are looked for. It sends no request.
func (g *Source) Describe(ctx context.Context, url string) string {
	if h := os.Getenv("STORAGE_EMULATOR_HOST"); h != "" {
		return "the emulator at " + h + " (from STORAGE_EMULATOR_HOST), no credentials"
	}
	if g.Client != nil {
		return "the endpoint and credentials of the Client given"
	}
	if f := os.Getenv("GOOGLE_APPLICATION_CREDENTIALS"); f != "" {
		return "endpoint https://storage.googleapis.com, Application Default Credentials from the file " + f + " (from GOOGLE_APPLICATION_CREDENTIALS)"
	}
	return "endpoint https://storage.googleapis.com, Application Default Credentials (gcloud's application_default_credentials.json, else the metadata server; set GOOGLE_APPLICATION_CREDENTIALS to name a file)"
}

// gcsErr makes a GCS error matchable against the package's sentinels and marks the
// retryable ones, keeping the client's error matchable too.
func gcsErr(err error) error {
	if errors.Is(err, storage.ErrBucketNotExist) {
		return fmt.Errorf("%w: %w", source.ErrBucketNotFound, err)
	}
	if errors.Is(err, storage.ErrObjectNotExist) {
		return fmt.Errorf("%w: %w", source.ErrNotFound, err)
	}
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		return err
	}
	switch {
	case ge.Code == http.StatusNotFound:
		return fmt.Errorf("%w: %w", source.ErrNotFound, err)
	case ge.Code == http.StatusUnauthorized, ge.Code == http.StatusForbidden:
		return fmt.Errorf("%w: %w", source.ErrPermission, err)
	case ge.Code == http.StatusPreconditionFailed:
		return fmt.Errorf("%w: %w", source.ErrChanged, err)
	case source.RetryableStatus(ge.Code):
		return &source.StatusError{Status: ge.Code, RetryAfterHint: source.ParseRetryAfter(ge.Header, time.Now()), Err: err}
	}
	return err
}

// gcsStream is a storage.Reader that fails with ErrShortRead if it ends before its
// length. It stops when ctx is done.
type gcsStream struct {
	ctx       context.Context
	url       string
	r         *storage.Reader
	want, got int64
}

func (s *gcsStream) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, &source.Error{Op: "read", URL: s.url, Err: err}
	}
	n, err := s.r.Read(p)
	s.got += int64(n)
	switch {
	case err == io.EOF && s.got < s.want:
		return n, &source.Error{Op: "read", URL: s.url, Err: fmt.Errorf("%w: read %d of %d bytes", source.ErrShortRead, s.got, s.want)}
	case err == io.EOF:
		return n, io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		return n, &source.Error{Op: "read", URL: s.url, Err: fmt.Errorf("%w: read %d of %d bytes: %w", source.ErrShortRead, s.got, s.want, err)}
	case err != nil:
		return n, &source.Error{Op: "read", URL: s.url, Err: gcsErr(err)}
	}
	return n, nil
}

func (s *gcsStream) Close() error { return s.r.Close() }

// Create returns a writer of the object at url (see source.Creator), a
// storage.Writer: GCS publishes the object only when the upload is finalized by a
// clean Close. A failed Write or a canceled ctx cancels the upload's own context,
// so that no object appears. Uploads are retried (a chunk at a time, up to
// uploadAttempts tries each) whatever the client's policy: the upload holds what it
// resends.
func (g *Source) Create(ctx context.Context, url string) (io.WriteCloser, error) {
	c, bucket, name, err := g.prepare(url)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return nil, &source.Error{Op: "create", URL: url, Err: err}
	}
	wctx, cancel := context.WithCancel(ctx)
	obj := c.Bucket(bucket).Object(name).Retryer(storage.WithPolicy(storage.RetryAlways), storage.WithMaxAttempts(uploadAttempts))
	w := obj.NewWriter(wctx)
	w.ContentType = "application/octet-stream"
	return &gcsWriter{ctx: ctx, cancel: cancel, url: url, w: w}, nil
}

// uploadAttempts is the most tries of one chunk of an upload.
const uploadAttempts = 5

// gcsWriter is a storage.Writer that is abandoned, not finalized, after a failure.
type gcsWriter struct {
	ctx    context.Context
	cancel context.CancelFunc // of the upload's context
	url    string
	w      *storage.Writer
	err    error // the first failure; every later call returns it
	closed bool
}

func (w *gcsWriter) fail(err error) error {
	if w.err == nil {
		w.err = &source.Error{Op: "write", URL: w.url, Err: err}
	}
	w.cancel()
	return w.err
}

func (w *gcsWriter) Write(p []byte) (int, error) {
	switch {
	case w.err != nil:
		return 0, w.err
	case w.closed:
		return 0, &source.Error{Op: "write", URL: w.url, Err: errors.New("source: write after Close")}
	case w.ctx.Err() != nil:
		return 0, w.fail(w.ctx.Err())
	}
	n, err := w.w.Write(p)
	if err != nil {
		return n, w.fail(gcsErr(err))
	}
	return n, nil
}

// Close finalizes the upload, unless a Write failed or ctx is done: then the upload
// is canceled and no object appears.
func (w *gcsWriter) Close() error {
	if w.closed {
		return w.err
	}
	w.closed = true
	if w.err == nil && w.ctx.Err() != nil {
		w.fail(w.ctx.Err())
	}
	if w.err != nil {
		w.cancel()
		w.w.Close() // fails: its context is canceled
		return w.err
	}
	err := w.w.Close()
	w.cancel()
	if err != nil {
		return w.fail(gcsErr(err))
	}
	return nil
}

// Scheme is the URL scheme this package serves.
const Scheme = "gs"

func init() { Register(source.Default, source.FetchOptions{}) }

// Register makes a zero Source, behind a Fetcher with opts, serve "gs" URLs in r.
// Importing this package does so for source.Default with the default options.
func Register(r *source.Registry, opts source.FetchOptions) {
	r.Register(Scheme, source.NewFetcher(&Source{}, opts))
}
