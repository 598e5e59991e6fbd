package cache

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/httpsrc"
)

// logLines collects what a cache logs.
type logLines struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logf(format string, args ...any) {
	l.t.Helper()
	s := fmt.Sprintf(format, args...)
	l.t.Log(s)
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
}

// count returns how many lines hold s.
func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// onlyLock checks that the cache directory holds no file but its lock: nothing
// half-written was left, nothing was committed.
func onlyLock(t *testing.T, dir string) {
	t.Helper()
	if _, names := dirBytes(t, dir); len(names) != 0 {
		t.Errorf("cache directory holds %v; want no entry file", names)
	}
}

// enospc is what a write to a full disk returns.
func enospc(op, path string) error {
	return &os.PathError{Op: op, Path: path, Err: syscall.ENOSPC}
}

// A full disk fails the first write of every fetch: every read is served from the
// source, whole, and the cause is logged once, not once per read.
func TestDiskFullFallsThroughToSource(t *testing.T) {
	up := newFake()
	const n = 3
	for i := range n {
		up.put(fmt.Sprintf("s3://b/%d.tar", i), randBytes(uint64(20+i), 2<<20+1000*i), "v1")
	}
	dir := t.TempDir()
	logs := &logLines{t: t}
	c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 30, Logf: logs.logf}, up)
	var full atomic.Bool
	full.Store(true)
	c.disk.fault = func(op, path string) error {
		if full.Load() && op == "write" {
			return enospc(op, path)
		}
		return nil
	}
	for round := range 2 {
		for i := range n {
			url := fmt.Sprintf("s3://b/%d.tar", i)
			if got := readAll(t, c, url); !bytes.Equal(got, randBytes(uint64(20+i), 2<<20+1000*i)) {
				t.Fatalf("round %d: %s: %d bytes differ from the source's", round, url, len(got))
			}
		}
	}
	st := c.Stats()
	if st.WriteErrors != 2*n || st.DiskEntries != 0 || st.DiskBytes != 0 || st.Failed != 0 {
		t.Errorf("stats %+v: want %d write errors, nothing cached or reserved, no failures", st, 2*n)
	}
	if k := logs.count("no space left on device"); k != 1 {
		t.Errorf("the full disk was logged %d times; want once", k)
	}
	onlyLock(t, dir)

	// Space again: the next read caches.
	full.Store(false)
	readAll(t, c, "s3://b/0.tar")
	if st := c.Stats(); st.DiskEntries != 1 {
		t.Errorf("stats %+v: want the object cached once the disk has room", st)
	}
}

// The disk fills up in the middle of a fetch, after a reader has been served the
// first bytes from the cache file: that reader goes on from the source at the byte
// it got to, one that joined and read nothing reads the source from the start, and
// neither sees a byte twice or a byte of another version.
func TestDiskFullMidFetchGoesOnFromSource(t *testing.T) {
	const url, size, first = "s3://b/a.tar", 3<<20 + 17, 300_000
	for _, changed := range []bool{false, true} {
		t.Run(fmt.Sprintf("changed=%v", changed), func(t *testing.T) {
			up := newFake()
			data, newData := randBytes(30, size), randBytes(31, size)
			up.put(url, data, "v1")
			dir := t.TempDir()
			logs := &logLines{t: t}
			c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 30, Logf: logs.logf}, up)
			release := make(chan struct{})
			var writes atomic.Int32
			c.disk.fault = func(op, path string) error {
				if op == "write" && writes.Add(1) == 2 {
					<-release // the first chunk is written and readable
					return enospc(op, path)
				}
				return nil
			}
			a, err := c.Open(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			head := make([]byte, first)
			if _, err := io.ReadFull(a, head); err != nil || !bytes.Equal(head, data[:first]) {
				t.Fatalf("first bytes from the fill: %v", err)
			}
			b, how, err := c.open(t.Context(), url, 0, 0)
			if err != nil || how != fromJoin {
				t.Fatalf("second reader: %v, %v; want it to join the fetch", how, err)
			}
			defer b.Close()
			if changed {
				up.put(url, newData, "v2")
			}
			close(release)

			rest, err := io.ReadAll(a)
			if changed {
				if !errors.Is(err, ErrChanged) || !bytes.Equal(rest, data[first:first+len(rest)]) {
					t.Errorf("first reader: %d more bytes, %v; want ErrChanged and no byte of the new version", len(rest), err)
				}
			} else if err != nil || !bytes.Equal(append(head, rest...), data) {
				t.Errorf("first reader: %d bytes, %v; want the object exactly", first+len(rest), err)
			}
			want := data
			if changed {
				want = newData // it had read nothing: it reads what the source holds
			}
			if got, err := io.ReadAll(b); err != nil || !bytes.Equal(got, want) {
				t.Errorf("second reader: %d bytes, %v; want the object exactly", len(got), err)
			}
			a.Close()
			b.Close()
			c.Close() // waits for the fetch to end
			if st := c.Stats(); st.WriteErrors != 1 || st.DiskEntries != 0 || st.DiskBytes != 0 || st.Failed != 0 {
				t.Errorf("stats %+v: want one write error, nothing cached or reserved", st)
			}
			onlyLock(t, dir)
			if k := logs.count("no space left on device"); k != 1 {
				t.Errorf("logged %d times; want once", k)
			}
		})
	}
}

// Writing the object's data worked but committing it did not (its fsync, its
// metadata, a rename): the readers still get the object whole, and nothing is
// committed or left behind.
func TestCommitFailureServesTheObject(t *testing.T) {
	const url, size = "s3://b/a.tar", 1<<20 + 500
	for _, tc := range []struct {
		name string
		fail func(op, path string) bool
	}{
		{"data fsync", func(op, path string) bool { return op == "sync" && strings.HasSuffix(path, ".data") }},
		{"meta create", func(op, path string) bool { return op == "create" && strings.HasSuffix(path, ".meta") }},
		{"meta write", func(op, path string) bool { return op == "write" && strings.HasSuffix(path, ".meta") }},
		{"meta fsync", func(op, path string) bool { return op == "sync" && strings.HasSuffix(path, ".meta") }},
		{"data rename", func(op, path string) bool { return op == "rename" && strings.HasSuffix(path, ".data") }},
		{"meta rename", func(op, path string) bool { return op == "rename" && strings.HasSuffix(path, ".meta") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newFake()
			data := randBytes(40, size)
			up.put(url, data, "v1")
			dir := t.TempDir()
			c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 30}, up)
			c.disk.fault = func(op, path string) error {
				if tc.fail(op, path) {
					return &os.PathError{Op: op, Path: path, Err: syscall.EIO}
				}
				return nil
			}
			if got := readAll(t, c, url); !bytes.Equal(got, data) {
				t.Fatalf("read %d bytes; want the object exactly", len(got))
			}
			c.Close()
			if st := c.Stats(); st.WriteErrors != 1 || st.DiskEntries != 0 || st.DiskBytes != 0 || st.Failed != 0 {
				t.Errorf("stats %+v: want one write error and nothing cached", st)
			}
			// After a failed fsync the file is not trusted: a reader behind goes on
			// from the source. After it, the file was checked: readers finish it.
			if n := up.openCount(url); tc.name != "data fsync" && n != 1 {
				t.Errorf("source opened %d times; want 1: the checked file serves the rest", n)
			}
			onlyLock(t, dir)
		})
	}
}

// A cache directory that stops being writable (here its v1 directory is replaced by
// a file, which fails as a read-only directory does and also for root, whom
// permission bits do not stop) makes reads fall through to the source, logged once.
func TestUnwritableDirectoryFallsThrough(t *testing.T) {
	up := newFake()
	up.put("s3://b/a.tar", randBytes(50, 100_000), "v1")
	up.put("s3://b/b.tar", randBytes(51, 100_000), "v1")
	dir := t.TempDir()
	logs := &logLines{t: t}
	c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 30, Logf: logs.logf}, up)
	v1 := filepath.Join(dir, "v1")
	if err := os.RemoveAll(v1); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(v1, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for i, url := range []string{"s3://b/a.tar", "s3://b/b.tar"} {
			if got := readAll(t, c, url); !bytes.Equal(got, randBytes(uint64(50+i), 100_000)) {
				t.Fatalf("%s: wrong bytes", url)
			}
		}
	}
	if st := c.Stats(); st.WriteErrors != 4 || st.DiskEntries != 0 || st.Failed != 0 {
		t.Errorf("stats %+v: want 4 write errors and nothing cached", st)
	}
	if k := logs.count("not a directory"); k != 1 {
		t.Errorf("logged %d times; want once", k)
	}
}

// The same with a read-only directory, where permission bits apply (not as root).
func TestReadOnlyDirectoryFallsThrough(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root writes to a read-only directory; TestUnwritableDirectoryFallsThrough covers this")
	}
	up := newFake()
	data := randBytes(52, 100_000)
	up.put("s3://b/a.tar", data, "v1")
	dir := t.TempDir()
	logs := &logLines{t: t}
	c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 30, Logf: logs.logf}, up)
	v1 := filepath.Join(dir, "v1")
	if err := os.Chmod(v1, 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(v1, 0o700) })
	for range 2 {
		if got := readAll(t, c, "s3://b/a.tar"); !bytes.Equal(got, data) {
			t.Fatal("wrong bytes")
		}
	}
	if st := c.Stats(); st.WriteErrors != 2 || st.DiskEntries != 0 {
		t.Errorf("stats %+v: want 2 write errors and nothing cached", st)
	}
	if k := logs.count("permission denied"); k != 1 {
		t.Errorf("logged %d times; want once", k)
	}
}

// Behind a Registry of Fetchers, as the command line builds it, a reader cut off
// from the cache file goes on through the Fetcher pinned to the version it was
// reading (OpenVersion), and an object replaced in the meantime fails the read.
func TestDiskFullGoesOnThroughFetcher(t *testing.T) {
	const size, first = 3<<20 + 5, 200_000
	var mu sync.Mutex
	data, etag := randBytes(60, size), `"v1"`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		d, e := data, etag
		mu.Unlock()
		w.Header().Set("ETag", e)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(d))
	}))
	defer srv.Close()
	for _, changed := range []bool{false, true} {
		t.Run(fmt.Sprintf("changed=%v", changed), func(t *testing.T) {
			mu.Lock()
			data, etag = randBytes(60, size), `"v1"`
			want := data
			mu.Unlock()
			reg := &source.Registry{}
			reg.Register("http", source.NewFetcher(&httpsrc.Source{Client: srv.Client()}, source.FetchOptions{PartSize: 1 << 20, SingleRate: -1}))
			out, c, err := Wrap(Options{Dir: t.TempDir(), DiskBytes: 1 << 30, Logf: t.Logf}, reg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			release := make(chan struct{})
			var writes atomic.Int32
			c.disk.fault = func(op, path string) error {
				if op == "write" && writes.Add(1) == 2 {
					<-release
					return enospc(op, path)
				}
				return nil
			}
			url := srv.URL + "/a.tar"
			r, err := out.Open(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			head := make([]byte, first)
			if _, err := io.ReadFull(r, head); err != nil {
				t.Fatal(err)
			}
			if changed {
				mu.Lock()
				data, etag = randBytes(61, size), `"v2"`
				mu.Unlock()
			}
			close(release)
			rest, err := io.ReadAll(r)
			got := append(head, rest...)
			if changed {
				// The cache's reader or the fetcher's may see the change first:
				// either way it is source.ErrChanged (cache.ErrChanged wraps it).
				if !errors.Is(err, source.ErrChanged) || !bytes.Equal(got, want[:len(got)]) {
					t.Errorf("read %d bytes, %v; want only bytes of the first version, then ErrChanged", len(got), err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("read %d bytes, %v; want the object exactly", len(got), err)
			}
			if st := c.Stats(); st.WriteErrors != 1 {
				t.Errorf("stats %+v: want one write error", st)
			}
		})
	}
}

// Warm on a full disk fails each object with ErrUnwritable, without reading the
// source to the end for nothing.
func TestWarmOnFullDisk(t *testing.T) {
	up := newFake()
	var urls []string
	for i := range 3 {
		url := fmt.Sprintf("s3://b/%d.tar", i)
		urls = append(urls, url)
		up.put(url, randBytes(uint64(70+i), 3<<20), "v1")
	}
	dir := t.TempDir()
	logs := &logLines{t: t}
	c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 30, Logf: logs.logf}, up)
	c.disk.fault = func(op, path string) error {
		if op == "write" {
			return enospc(op, path)
		}
		return nil
	}
	p, err := c.Plan(t.Context(), urls, 0)
	if err != nil {
		t.Fatal(err)
	}
	var read int64
	err = c.Warm(t.Context(), p, WarmOptions{Concurrency: 1, Progress: func(ev WarmEvent) { read += ev.Bytes }})
	for _, url := range urls {
		if !errors.Is(err, ErrUnwritable) || !strings.Contains(err.Error(), url) || !strings.Contains(err.Error(), "no space left on device") {
			t.Fatalf("Warm = %v; want ErrUnwritable for %s, saying why", err, url)
		}
		if n := up.openCount(url); n != 1 {
			t.Errorf("%s: source opened %d times; want only the fetch that failed to write", url, n)
		}
	}
	if read != 0 {
		t.Errorf("warm read %d bytes; want none", read)
	}
	if st := c.Stats(); st.WriteErrors != 3 || st.DiskEntries != 0 {
		t.Errorf("stats %+v", st)
	}
	if k := logs.count("no space left on device"); k != 1 {
		t.Errorf("logged %d times; want once", k)
	}
	onlyLock(t, dir)
}
