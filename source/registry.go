package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
)

// Scheme returns the scheme of a shard URL: the part before "://", lower-cased, or
// "file" for a plain path.
func Scheme(url string) string {
	i := strings.Index(url, "://")
	if i <= 0 {
		return "file"
	}
	return strings.ToLower(url[:i])
}

// SplitBucket splits a URL of a bucket store's scheme ("s3", "gs"; any case) into its
// bucket and the object's key: "s3://b/train/x.tar" gives "b" and "train/x.tar". It
// is an error when url is not such a URL or names no object.
func SplitBucket(url, scheme string) (bucket, key string, err error) {
	i := strings.Index(url, "://")
	if i <= 0 || !strings.EqualFold(url[:i], scheme) {
		return "", "", fmt.Errorf("source: not a %s://bucket/key URL: %q", scheme, url)
	}
	bucket, key, _ = strings.Cut(url[i+3:], "/")
	if bucket == "" || key == "" {
		return "", "", fmt.Errorf("source: not a %s://bucket/key URL: %q", scheme, url)
	}
	return bucket, key, nil
}

// Registry maps URL schemes to Sources. The zero value is empty and ready to use; it
// is safe for concurrent use.
type Registry struct {
	mu      sync.RWMutex
	sources map[string]Source
}

// Register makes src serve URLs of the given scheme ("s3", "file", "myproto"),
// replacing any Source registered for it before.
func (r *Registry) Register(scheme string, src Source) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sources == nil {
		r.sources = make(map[string]Source)
	}
	r.sources[strings.ToLower(scheme)] = src
}

// Lookup returns the Source for url's scheme, or an *Error wrapping ErrUnknownScheme.
func (r *Registry) Lookup(url string) (Source, error) {
	scheme := Scheme(url)
	r.mu.RLock()
	src, ok := r.sources[scheme]
	r.mu.RUnlock()
	if !ok {
		return nil, &Error{Op: "open", URL: url, Err: fmt.Errorf("%w %q (registered: %s)",
			ErrUnknownScheme, scheme, strings.Join(r.Schemes(), ", "))}
	}
	return src, nil
}

// Schemes returns the registered schemes, sorted.
func (r *Registry) Schemes() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.sources))
	for s := range r.sources {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// Stat looks up url's Source and stats the object.
func (r *Registry) Stat(ctx context.Context, url string) (Info, error) {
	src, err := r.Lookup(url)
	if err != nil {
		return Info{}, err
	}
	return src.Stat(ctx, url)
}

// Open looks up url's Source and opens the object.
func (r *Registry) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	src, err := r.Lookup(url)
	if err != nil {
		return nil, err
	}
	return src.Open(ctx, url)
}

// Create looks up url's Source and returns a writer of the object, through
// CreatorOf (a Fetcher hands the write to the backend it wraps). See Creator for
// when the object appears. It is an *Error wrapping ErrUnknownScheme when no Source
// serves the scheme, and one wrapping ErrNotCreator when its Source cannot write.
func (r *Registry) Create(ctx context.Context, url string) (io.WriteCloser, error) {
	src, err := r.Lookup(url)
	if err != nil {
		return nil, &Error{Op: "create", URL: url, Err: errors.Unwrap(err)}
	}
	c := CreatorOf(src)
	if c == nil {
		return nil, &Error{Op: "create", URL: url, Err: fmt.Errorf("%w (%s://)", ErrNotCreator, Scheme(url))}
	}
	return c.Create(ctx, url)
}

var (
	_ Source  = (*Registry)(nil)
	_ Creator = (*Registry)(nil)
)

// Default is the registry used by the package-level functions. It serves "file"
// (and plain paths) with File. The cloud backends live in packages of their own
// (source/s3, source/gcs, source/httpsrc) and register themselves in Default when
// imported, each behind a Fetcher with the default FetchOptions; source/all imports
// them all.
var Default = &Registry{}

func init() { Default.Register("file", &File{}) }

// Register makes src serve URLs of scheme in the Default registry.
func Register(scheme string, src Source) { Default.Register(scheme, src) }

// Open opens url through the Default registry.
func Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return Default.Open(ctx, url)
}

// Create writes url through the Default registry (see Registry.Create).
func Create(ctx context.Context, url string) (io.WriteCloser, error) {
	return Default.Create(ctx, url)
}

// Stat stats url through the Default registry.
func Stat(ctx context.Context, url string) (Info, error) {
	return Default.Stat(ctx, url)
}

// OpenRange looks up url's Source and returns length bytes of the object from off (to
// the end when length < 0): through the Source's RangeReader when it has one, else by
// opening the whole object and discarding its first off bytes.
func (r *Registry) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	src, err := r.Lookup(url)
	if err != nil {
		return nil, err
	}
	if rr, ok := src.(RangeReader); ok {
		return rr.OpenRange(ctx, url, off, length)
	}
	body, err := src.Open(ctx, url)
	if err != nil {
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, body, off); err != nil {
		body.Close()
		if err == io.EOF {
			err = fmt.Errorf("%w: no byte %d", ErrShortRead, off)
		}
		return nil, &Error{Op: "read", URL: url, Err: err}
	}
	if length < 0 {
		return body, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(body, length), body}, nil
}

// OpenInfoRange looks up info.URL's Source and reads length bytes from off of the
// object at info.Version, whose size is info.Size: through the Source's
// InfoRangeOpener (a Fetcher) in one request, else as OpenVersion.
func (r *Registry) OpenInfoRange(ctx context.Context, info Info, off, length int64) (io.ReadCloser, error) {
	src, err := r.Lookup(info.URL)
	if err != nil {
		return nil, err
	}
	if o, ok := src.(InfoRangeOpener); ok {
		return o.OpenInfoRange(ctx, info, off, length)
	}
	return r.OpenVersion(ctx, info.URL, info.Version, off, length)
}

// OpenVersion looks up url's Source and reads length bytes from off of the object at
// version (an earlier Info.Version), failing with an error wrapping ErrChanged when the
// object is no longer at it: through the Source's VersionReader when it has one (every
// built-in backend, and a Fetcher over one), else unpinned, as OpenRange.
func (r *Registry) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	src, err := r.Lookup(url)
	if err != nil {
		return nil, err
	}
	if vr, ok := src.(VersionReader); ok && version != "" {
		return vr.OpenVersion(ctx, url, version, off, length)
	}
	return r.OpenRange(ctx, url, off, length)
}
