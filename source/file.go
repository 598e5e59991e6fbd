package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// File reads objects from the local file system. It serves plain paths, absolute or
// relative ("shards/train-000.tar"), and file URLs with an absolute path
// ("file:///data/train-000.tar"). The path of a file URL is used as written, without
// percent-decoding, as WebDataset does. The zero value is ready to use and safe for
// concurrent use.
//
// Create writes a file whole or not at all: into a temporary file in the same
// directory, synced and renamed over the file's name on Close (mode 0644). The
// directory must exist.
//
// Streams from Open and OpenRange read the file as it was sized when it was opened:
// bytes appended later are not read, and a file truncated while it is read fails the
// stream with an error wrapping ErrShortRead. A directory is an error.
type File struct{}

var (
	_ Source      = (*File)(nil)
	_ RangeReader = (*File)(nil)
)

// Stat returns the file's size, modification time, and a Version made of both.
func (*File) Stat(ctx context.Context, url string) (Info, error) {
	if err := ctx.Err(); err != nil {
		return Info{}, &Error{Op: "stat", URL: url, Err: err}
	}
	path, err := filePath(url)
	if err != nil {
		return Info{}, &Error{Op: "stat", URL: url, Err: err}
	}
	fi, err := os.Stat(path)
	if err == nil && fi.IsDir() {
		err = errIsDir
	}
	if err != nil {
		return Info{}, &Error{Op: "stat", URL: url, Err: fileErr(err)}
	}
	return fileInfo(url, fi), nil
}

// Open returns the whole file as a stream.
func (f *File) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return f.open(ctx, "open", url, 0, -1)
}

// OpenRange returns length bytes of the file starting at off, or the rest of the file
// when length < 0. A range past the end of the file is cut short; one starting at or
// past the end is an empty stream.
func (f *File) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	if off < 0 {
		return nil, &Error{Op: "open", URL: url, Err: fmt.Errorf("source: negative offset %d", off)}
	}
	return f.open(ctx, "open", url, off, length)
}

func (*File) open(ctx context.Context, op, url string, off, length int64) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, &Error{Op: op, URL: url, Err: err}
	}
	path, err := filePath(url)
	if err != nil {
		return nil, &Error{Op: op, URL: url, Err: err}
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, &Error{Op: op, URL: url, Err: fileErr(err)}
	}
	fi, err := fh.Stat()
	if err == nil && fi.IsDir() {
		err = errIsDir
	}
	if err != nil {
		fh.Close()
		return nil, &Error{Op: op, URL: url, Err: fileErr(err)}
	}
	if !fi.Mode().IsRegular() {
		// A pipe or a device has no size to hold the stream to.
		return &fileStream{ctx: ctx, url: url, r: fh, c: fh, want: -1}, nil
	}
	n := max(fi.Size()-off, 0)
	if length >= 0 {
		n = min(n, length)
	}
	return &fileStream{ctx: ctx, url: url, r: io.NewSectionReader(fh, off, n), c: fh, want: n}, nil
}

var errIsDir = errors.New("source: is a directory")

// filePath returns the local path a plain path or file URL names.
func filePath(url string) (string, error) {
	if Scheme(url) != "file" {
		return "", fmt.Errorf("source: not a file URL or path: %q", url)
	}
	path := url
	if i := strings.Index(url, "://"); i > 0 {
		path = url[i+len("://"):]
		if !strings.HasPrefix(path, "/") {
			return "", fmt.Errorf("source: file URL must have an absolute path (file:///abs/path): %q", url)
		}
	}
	if path == "" {
		return "", errors.New("source: empty path")
	}
	return path, nil
}

// fileErr makes a file system error matchable against this package's sentinels while
// keeping the original error matchable too.
func fileErr(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: %w", ErrPermission, err)
	}
	return err
}

func fileInfo(url string, fi fs.FileInfo) Info {
	return Info{
		URL:     url,
		Size:    fi.Size(),
		Version: fmt.Sprintf("%d-%d", fi.Size(), fi.ModTime().UnixNano()),
		ModTime: fi.ModTime(),
	}
}

// fileStream reads want bytes (or, if want < 0, up to EOF) and fails with ErrShortRead
// if the file ends first. It stops when ctx is done.
type fileStream struct {
	ctx       context.Context
	url       string
	r         io.Reader
	c         io.Closer
	want, got int64
}

func (s *fileStream) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, &Error{Op: "read", URL: s.url, Err: err}
	}
	n, err := s.r.Read(p)
	s.got += int64(n)
	switch {
	case err == io.EOF && s.want >= 0 && s.got < s.want:
		return n, &Error{Op: "read", URL: s.url,
			Err: fmt.Errorf("%w: read %d of %d bytes (file truncated?)", ErrShortRead, s.got, s.want)}
	case err != nil && err != io.EOF:
		return n, &Error{Op: "read", URL: s.url, Err: fileErr(err)}
	}
	return n, err
}

// Seek moves within the stream's window of the file, so that a tar reader listing
// members can skip their data. It fails on pipes and devices.
func (s *fileStream) Seek(off int64, whence int) (int64, error) {
	sk, ok := s.r.(io.Seeker)
	if !ok {
		return 0, &Error{Op: "seek", URL: s.url, Err: errors.New("source: not seekable")}
	}
	if _, isFile := s.r.(*os.File); isFile {
		return 0, &Error{Op: "seek", URL: s.url, Err: errors.New("source: not a regular file")}
	}
	pos, err := sk.Seek(off, whence)
	if err != nil {
		return pos, &Error{Op: "seek", URL: s.url, Err: err}
	}
	s.got = pos
	return pos, nil
}

func (s *fileStream) Close() error { return s.c.Close() }

var (
	_ Lister        = (*File)(nil)
	_ VersionReader = (*File)(nil)
)

// OpenVersion is OpenRange, failing with ErrChanged when the file's size or
// modification time is no longer the one of version.
func (f *File) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	info, err := f.Stat(ctx, url)
	if err != nil {
		return nil, &Error{Op: "open", URL: url, Err: errors.Unwrap(err)}
	}
	if info.Version != version {
		return nil, &Error{Op: "open", URL: url, Err: fmt.Errorf("%w: version %s, was %s", ErrChanged, info.Version, version)}
	}
	return f.OpenRange(ctx, url, off, length)
}

// List calls fn for the regular files in prefix's directory whose names start with
// prefix's last component, in name order. URLs keep prefix's form (plain path or
// file URL). The directory is read once whatever the prefix (a local directory
// cannot be read in part): list a directory's shards with one call, not one per
// group of names. The files' sizes and times are read a few at once.
func (*File) List(ctx context.Context, prefix string, fn func(Info) error) error {
	cut := strings.LastIndex(prefix, "/") + 1
	dirURL, base := prefix[:cut], prefix[cut:]
	dir := "."
	if dirURL != "" {
		p, err := filePath(dirURL)
		if err != nil {
			return &Error{Op: "list", URL: prefix, Err: err}
		}
		dir = p
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return &Error{Op: "list", URL: prefix, Err: fileErr(err)}
	}
	keep := entries[:0]
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), base) && e.Type().IsRegular() {
			keep = append(keep, e)
		}
	}
	infos, err := statEntries(ctx, keep)
	if err != nil {
		return &Error{Op: "list", URL: prefix, Err: err}
	}
	for i, e := range keep {
		if err := ctx.Err(); err != nil {
			return &Error{Op: "list", URL: prefix, Err: err}
		}
		if infos[i] == nil {
			continue // removed since ReadDir
		}
		if err := fn(fileInfo(dirURL+e.Name(), infos[i])); err != nil {
			return err
		}
	}
	return nil
}

// statChunk is the fewest entries a goroutine of statEntries stats.
const statChunk = 2048

// statEntries returns the file information of entries (nil for one removed since
// it was listed), GOMAXPROCS goroutines at a time for many.
func statEntries(ctx context.Context, entries []fs.DirEntry) ([]fs.FileInfo, error) {
	infos := make([]fs.FileInfo, len(entries))
	workers := min(runtime.GOMAXPROCS(0), (len(entries)+statChunk-1)/statChunk)
	var wg sync.WaitGroup
	for w := range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(entries); i += max(workers, 1) {
				if i%256 == 0 && ctx.Err() != nil {
					return
				}
				if fi, err := entries[i].Info(); err == nil {
					infos[i] = fi
				}
			}
		}()
	}
	wg.Wait()
	return infos, ctx.Err()
}

var _ Creator = (*File)(nil)

// Create returns a writer of the file at url (see Creator): the bytes go to a
// temporary file beside it, which Close syncs, makes 0644 and renames over url, then
// syncs the directory. The directory must exist; a directory at url is an error.
func (*File) Create(ctx context.Context, url string) (io.WriteCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, &Error{Op: "create", URL: url, Err: err}
	}
	path, err := filePath(url)
	if err != nil {
		return nil, &Error{Op: "create", URL: url, Err: err}
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return nil, &Error{Op: "create", URL: url, Err: errIsDir}
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if base == "" {
		return nil, &Error{Op: "create", URL: url, Err: errIsDir}
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if errors.Is(err, fs.ErrNotExist) {
		err = fmt.Errorf("directory %s: %w", dir, fs.ErrNotExist)
	}
	if err != nil {
		return nil, &Error{Op: "create", URL: url, Err: fileErr(err)}
	}
	return &fileWriter{ctx: ctx, url: url, path: path, dir: dir, f: tmp}, nil
}

// fileWriter writes a temporary file and renames it over path on a clean Close.
type fileWriter struct {
	ctx            context.Context
	url, path, dir string
	f              *os.File
	err            error // the first failure; every later call returns it
	closed         bool
}

func (w *fileWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if w.closed {
		return 0, &Error{Op: "write", URL: w.url, Err: os.ErrClosed}
	}
	if err := w.ctx.Err(); err != nil {
		w.err = &Error{Op: "write", URL: w.url, Err: err}
		return 0, w.err
	}
	n, err := w.f.Write(p)
	if err != nil {
		w.err = &Error{Op: "write", URL: w.url, Err: fileErr(err)}
	}
	return n, w.err
}

// Close publishes the file unless a Write failed or ctx is done; either way the
// temporary file is gone afterwards.
func (w *fileWriter) Close() error {
	if w.closed {
		return w.err
	}
	w.closed = true
	tmp := w.f.Name()
	fail := func(err error) error {
		if w.err == nil {
			w.err = &Error{Op: "write", URL: w.url, Err: err}
		}
		w.f.Close()
		os.Remove(tmp)
		return w.err
	}
	if w.err != nil {
		return fail(w.err)
	}
	if err := w.ctx.Err(); err != nil {
		return fail(err)
	}
	if err := w.f.Sync(); err != nil {
		return fail(fileErr(err))
	}
	if err := w.f.Chmod(0o644); err != nil {
		return fail(fileErr(err))
	}
	if err := w.f.Close(); err != nil {
		os.Remove(tmp)
		w.err = &Error{Op: "write", URL: w.url, Err: fileErr(err)}
		return w.err
	}
	if err := w.ctx.Err(); err != nil {
		os.Remove(tmp)
		w.err = &Error{Op: "write", URL: w.url, Err: err}
		return w.err
	}
	if err := os.Rename(tmp, w.path); err != nil {
		os.Remove(tmp)
		w.err = &Error{Op: "write", URL: w.url, Err: fileErr(err)}
		return w.err
	}
	// The rename is durable once the directory is synced; a file system that cannot
	// sync a directory has published the file all the same.
	if d, err := os.Open(w.dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
