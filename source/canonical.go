package source

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Canonical returns the one spelling of url that every spelling of the same object
// shares, for matching shards with index entries and for fingerprints that ranks
// compare; the object itself is never opened. A plain path (relative or absolute,
// with "./", ".." or repeated slashes) and a file:// URL become file:///abs/path,
// with the symbolic links of its directories resolved (the file's own name is kept
// as it is); s3://, gs:// and other URLs get a lower-case scheme, and http(s) URLs a
// lower-case host without the scheme's default port. Surrounding spaces are dropped.
// A URL it cannot make sense of is returned trimmed.
//
// Each relative path costs a read of the working directory (os.Getwd: two stat
// calls); CanonicalAll and a Canonicalizer read it once for many URLs.
func Canonical(url string) string { return canonical(url, os.Getwd) }

// CanonicalAll returns the Canonical form of each of urls, reading the working
// directory once for them all.
func CanonicalAll(urls []string) []string {
	var c Canonicalizer
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = c.Canonical(u)
	}
	return out
}

// Canonicalizer is Canonical for many URLs: it reads the working directory once,
// at its first relative path, and keeps it. The zero value is ready to use. Use one
// for one batch of URLs (a dataset's, in one call), not across a change of the
// working directory. It is not safe for concurrent use.
type Canonicalizer struct {
	wd   string
	err  error
	read bool
}

// Canonical returns Canonical(url) as of the working directory c first read.
func (c *Canonicalizer) Canonical(url string) string {
	return canonical(url, func() (string, error) {
		if !c.read {
			c.wd, c.err = os.Getwd()
			c.read = true
		}
		return c.wd, c.err
	})
}

// canonical is Canonical with the working directory from getwd.
func canonical(url string, getwd func() (string, error)) string {
	url = strings.TrimSpace(url)
	scheme := Scheme(url)
	switch scheme {
	case "file":
		path, err := filePath(url)
		if err != nil {
			return url
		}
		abs := path
		if !filepath.IsAbs(path) {
			wd, err := getwd()
			if err != nil {
				return url
			}
			abs = filepath.Join(wd, path)
		} else {
			abs = filepath.Clean(path)
		}
		dir, base := filepath.Split(abs)
		return "file://" + filepath.Join(resolvedDir(dir), base)
	case "http", "https":
		rest := url[len(scheme)+len("://"):]
		host, path, _ := strings.Cut(rest, "/")
		host = strings.TrimSuffix(strings.ToLower(host), map[string]string{"http": ":80", "https": ":443"}[scheme])
		out := scheme + "://" + host
		if path != "" || strings.Contains(rest, "/") {
			out += "/" + path
		}
		return out
	}
	if i := strings.Index(url, "://"); i > 0 {
		return scheme + url[i:]
	}
	return url
}

// dirs remembers the resolved form of directories (most datasets are many files in
// a few directories); it is emptied when it grows past maxDirs.
var (
	dirsMu sync.Mutex
	dirs   = map[string]string{}
)

const maxDirs = 4096

// resolvedDir returns dir with its symbolic links resolved, or cleaned as it is where
// it does not exist.
func resolvedDir(dir string) string {
	dirsMu.Lock()
	r, ok := dirs[dir]
	dirsMu.Unlock()
	if ok {
		return r
	}
	r, err := filepath.EvalSymlinks(dir)
	if err != nil {
		r = filepath.Clean(dir)
	}
	dirsMu.Lock()
	if len(dirs) >= maxDirs {
		clear(dirs)
	}
	dirs[dir] = r
	dirsMu.Unlock()
	return r
}
