package source

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
)

// Lister is the optional capability to list objects. List calls fn for every object
// whose URL starts with prefix (a URL such as "s3://bucket/train-") and has no "/"
// after it: the objects of one "directory", not of its subdirectories. The order is
// the backend's; listings are paginated by the backend.
type Lister interface {
	List(ctx context.Context, prefix string, fn func(Info) error) error
}

// MaxListed is the most objects one listing (one URL given to Expand) may yield, as
// brace expansion caps its own.
const MaxListed = 1 << 20

// Errors of listing.
var (
	// ErrNotLister means a URL asks for a listing but its Source cannot list.
	ErrNotLister = errors.New("source: listing not supported for this scheme")
	// ErrNoMatch means a listing found no objects.
	ErrNoMatch = errors.New("source: no objects match")
	// ErrTooMany means a listing found more than MaxListed objects.
	ErrTooMany = errors.New("source: too many objects")
)

// IsListPattern reports whether url asks for a listing: it ends in "/", or the last
// path component holds a glob character (*, ? or [). The query and fragment of an
// http(s) URL (a presigned URL's "?X-Amz-Signature=...") are not part of its path.
func IsListPattern(url string) bool {
	if strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://") {
		if i := strings.IndexAny(url, "?#"); i >= 0 {
			url = url[:i]
		}
	}
	if strings.HasSuffix(url, "/") {
		return true
	}
	return strings.ContainsAny(url[strings.LastIndex(url, "/")+1:], "*?[")
}

// Expand expands the URLs that ask for a listing (see IsListPattern) into the sorted
// URLs of the objects they match, using the Lister of their Source; other URLs, and
// URLs whose Source cannot list, and local files that exist under their own name,
// are kept as they are. It takes URLs that are already
// brace-expanded (shard.ExpandAll). A trailing "/" lists the objects directly under
// that prefix; a glob in the last component (path.Match syntax: "train-*.tar")
// keeps the objects there whose name matches. A listing that finds nothing is an
// error wrapping ErrNoMatch. Expand first starts the set-up of the first URL's
// Source (Prepare), which a caller's next step (a listing, an index, a first read)
// needs. When no URL asks for a listing it returns urls itself.
func (r *Registry) Expand(ctx context.Context, urls []string) ([]string, error) {
	if len(urls) > 0 {
		Prepare(r, urls[0])
	}
	if !slices.ContainsFunc(urls, IsListPattern) {
		return urls, nil // nothing to list
	}
	out := make([]string, 0, len(urls))
	for _, u := range urls {
		if !IsListPattern(u) {
			out = append(out, u)
			continue
		}
		src, err := r.Lookup(u)
		if err != nil {
			return nil, err
		}
		l := ListerOf(src)
		if l == nil || literalFile(src, u) {
			out = append(out, u)
			continue
		}
		got, err := listMatching(ctx, l, u)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

// Expand expands listing URLs through the Default registry; see Registry.Expand.
func Expand(ctx context.Context, urls []string) ([]string, error) {
	return Default.Expand(ctx, urls)
}

// listMatching lists pattern's directory and keeps what its last component matches.
func listMatching(ctx context.Context, l Lister, pattern string) ([]string, error) {
	cut := strings.LastIndex(pattern, "/") + 1
	dir, glob := pattern[:cut], pattern[cut:]
	if _, err := path.Match(glob, ""); err != nil {
		return nil, &Error{Op: "list", URL: pattern, Err: fmt.Errorf("source: bad pattern %q: %w", glob, err)}
	}
	// List only what shares the pattern's literal prefix.
	prefix := dir + glob[:strings.IndexAny(glob+"*", "*?[")]
	var urls []string
	err := l.List(ctx, prefix, func(info Info) error {
		name := strings.TrimPrefix(info.URL, dir)
		if name == "" || strings.Contains(name, "/") {
			return nil
		}
		if ok, _ := path.Match(glob, name); glob != "" && !ok {
			return nil
		}
		if len(urls) >= MaxListed {
			return &Error{Op: "list", URL: pattern, Err: fmt.Errorf("%w: more than %d", ErrTooMany, MaxListed)}
		}
		urls = append(urls, info.URL)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(urls) == 0 {
		return nil, &Error{Op: "list", URL: pattern, Err: ErrNoMatch}
	}
	sort.Strings(urls)
	return urls, nil
}

// literalFile reports whether url is a local file that exists under its own name,
// glob characters and all, which is then read rather than taken as a pattern.
func literalFile(src Source, url string) bool {
	if _, ok := src.(*File); !ok || strings.HasSuffix(url, "/") {
		return false
	}
	p, err := filePath(url)
	if err != nil {
		return false
	}
	_, err = os.Stat(p)
	return err == nil
}
