package serve

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// checkPrefix validates an Allow prefix.
func checkPrefix(p string) error {
	if !strings.Contains(p, "://") {
		return fmt.Errorf("serve: allowed prefix %q: want a URL such as s3://bucket/prefix/ or file:///data/", p)
	}
	if _, err := normalize(p); err != nil {
		return fmt.Errorf("serve: allowed prefix %q: %v", p, err)
	}
	return nil
}

// normalize returns the form of u that the server checks against its prefixes: the
// URL as the source will use it, or an error saying why it is refused.
//
//   - file URLs: the file source uses the path as written, so "?" and "#" (which a URL
//     check would take for a query or fragment) and "%" (which it would decode) are
//     refused; "." and ".." segments are refused; symbolic links are resolved, so
//     that a link under an allowed directory that points elsewhere is not followed
//     out of it (the check and the open are not atomic: a link swapped in between is
//     followed).
//   - other URLs: the path is percent-decoded before "." and ".." segments are looked
//     for (an HTTP origin decodes "%2e%2e" and "..%2f"); user information is left
//     out and a query (a presigned URL's signature) is kept.
func normalize(u string) (string, error) {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok || scheme == "" {
		return "", errors.New("not a URL with a scheme")
	}
	if strings.ContainsAny(u, "\x00\r\n") {
		return "", errors.New("control characters")
	}
	if scheme == "file" {
		if strings.ContainsAny(rest, "?#%") {
			return "", errors.New(`a file path with "?", "#" or "%" (the file source reads it literally)`)
		}
		if hasDotSegment(rest) {
			return "", errors.New(`a "." or ".." path segment`)
		}
		return "file://" + resolveLinks(rest), nil
	}
	// User information names no other object: it is left out of the comparison
	// (and cannot pass for the host: "https://allowed.example@other.example/" is
	// compared as "https://other.example/").
	if end := strings.IndexAny(rest, "/?#"); end >= 0 {
		if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
			rest = rest[at+1:]
		}
	} else if at := strings.LastIndex(rest, "@"); at >= 0 {
		rest = rest[at+1:]
	}
	u = scheme + "://" + rest
	path := rest
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	dec, err := url.PathUnescape(path)
	if err != nil {
		return "", fmt.Errorf("bad percent-escape: %v", err)
	}
	if hasDotSegment(path) || hasDotSegment(dec) || strings.ContainsAny(dec, "\x00\\") {
		return "", errors.New(`a "." or ".." path segment (after percent-decoding) or a backslash`)
	}
	return u, nil
}

// hasDotSegment reports whether a path has a "." or ".." segment.
func hasDotSegment(path string) bool {
	for _, seg := range strings.Split(path, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// resolveLinks returns path with its symbolic links resolved, as far as it exists:
// the longest existing ancestor is resolved and the rest appended.
func resolveLinks(path string) string {
	trail := ""
	p := path
	for {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			if trail == "" {
				return keepSlash(r, path)
			}
			return keepSlash(filepath.Join(r, trail), path)
		} else if !errors.Is(err, os.ErrNotExist) {
			return path // unreadable: leave it as written; the open will fail
		}
		dir, base := filepath.Split(strings.TrimSuffix(p, "/"))
		if dir == "" || dir == p {
			return path
		}
		trail = filepath.Join(base, trail)
		p = dir
	}
}

// keepSlash gives r the trailing slash of orig, which marks a prefix as a directory.
func keepSlash(r, orig string) string {
	if strings.HasSuffix(orig, "/") && !strings.HasSuffix(r, "/") {
		return r + "/"
	}
	return r
}

// allowed reports whether a trainer may read u: one of the server's own URLs, or,
// once normalised (see normalize), under an Allow prefix at a segment boundary. It
// returns why not.
func (s *Server) allowed(u string) error {
	if s.own[u] {
		return nil
	}
	n, err := normalize(u)
	if err != nil {
		return fmt.Errorf("refused: %v", err)
	}
	for _, p := range s.allow {
		if !strings.HasPrefix(n, p) {
			continue
		}
		if strings.HasSuffix(p, "/") || len(n) == len(p) || n[len(p)] == '/' {
			return nil
		}
	}
	return errors.New("not under a prefix given by --allow")
}
