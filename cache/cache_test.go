package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardload/shardload/source"
)

// object is one object of a fakeSource.
type object struct {
	data    []byte
	version string
}

// fakeSource serves objects from memory and counts the calls it gets.
type fakeSource struct {
	mu    sync.Mutex
	objs  map[string]object
	opens map[string]int
	stats int
	down  bool          // Stat and Open fail as an unreachable store would
	gate  chan struct{} // when not nil, streams block before their first byte until it is closed
	pipe  *io.PipeReader
}

var errDown = errors.New("dial tcp 127.0.0.1:9: connect: connection refused")

func newFake() *fakeSource {
	return &fakeSource{objs: map[string]object{}, opens: map[string]int{}}
}

func (s *fakeSource) put(url string, data []byte, version string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs[url] = object{data: data, version: version}
}

func (s *fakeSource) openCount(url string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opens[url]
}

func (s *fakeSource) Stat(ctx context.Context, url string) (source.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats++
	if s.down {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: errDown}
	}
	o, ok := s.objs[url]
	if !ok {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: source.ErrNotFound}
	}
	return source.Info{URL: url, Size: int64(len(o.data)), Version: o.version}, nil
}

func (s *fakeSource) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opens[url]++
	if s.down {
		return nil, &source.Error{Op: "open", URL: url, Err: errDown}
	}
	o, ok := s.objs[url]
	if !ok {
		return nil, &source.Error{Op: "open", URL: url, Err: source.ErrNotFound}
	}
	if s.pipe != nil {
		return s.pipe, nil
	}
	var r io.Reader = bytes.NewReader(o.data)
	if s.gate != nil {
		gate := s.gate
		r = io.MultiReader(gateReader(gate), r)
	}
	return io.NopCloser(r), nil
}

// gateReader blocks until gate is closed, then reads as empty.
type gateReader chan struct{}

func (g gateReader) Read([]byte) (int, error) {
	<-g
	return 0, io.EOF
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func newCache(t *testing.T, opts Options, up source.Source) *Cache {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	c, err := New(opts, up)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func readAll(t *testing.T, src source.Source, url string) []byte {
	t.Helper()
	r, err := src.Open(t.Context(), url)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return b
}

// dirBytes sums the sizes of the regular files under dir.
// dirBytes returns the bytes and names of the files in dir, but for the tier's
// control files: lock and budget, of fixed size, and fills' HASH.lock files (empty,
// removed as a fetch ends, which may be just after its readers saw its end).
func dirBytes(t *testing.T, dir string) (total int64, names []string) {
	t.Helper()
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if d.Type().IsRegular() && d.Name() != "lock" && d.Name() != "budget" && !lockRE.MatchString(d.Name()) {
			fi, _ := d.Info()
			total += fi.Size()
			names = append(names, d.Name())
		}
		return nil
	})
	return total, names
}

// dataFile returns the one data file of url in the cache directory.
func dataFile(t *testing.T, dir, url string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "v1", hashURL(url)+"-*.data"))
	if len(m) != 1 {
		t.Fatalf("want one data file for %s, have %v", url, m)
	}
	return m[0]
}

func TestHitServesSourceBytes(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"disk", Options{DiskBytes: 1 << 20}},
		{"memory", Options{MemoryBytes: 1 << 20}},
		{"both", Options{DiskBytes: 1 << 20, MemoryBytes: 1 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newFake()
			want := randBytes(1, 300_000)
			up.put("s3://b/a.tar", want, "v1")
			if tc.opts.DiskBytes > 0 {
				tc.opts.Dir = t.TempDir()
			}
			c := newCache(t, tc.opts, up)
			// Fetched; then read from disk; from disk into memory (the second open of
			// the disk entry in this process); from memory.
			for i := range 4 {
				if got := readAll(t, c, "s3://b/a.tar"); !bytes.Equal(got, want) {
					t.Fatalf("read %d: %d bytes differ from the source's %d", i, len(got), len(want))
				}
			}
			if n := up.openCount("s3://b/a.tar"); n != 1 {
				t.Errorf("source opened %d times, want 1", n)
			}
			st := c.Stats()
			if st.Fetches != 1 || st.MemoryHits+st.DiskHits != 3 {
				t.Errorf("stats %+v: want 1 fetch and 3 hits", st)
			}
			if tc.name == "both" && (st.MemoryHits != 1 || st.MemoryEntries != 1) {
				t.Errorf("stats %+v: want the fourth read from memory", st)
			}
		})
	}
}

func TestDiskEntrySurvivesRestart(t *testing.T) {
	up := newFake()
	want := randBytes(2, 100_000)
	up.put("s3://b/a.tar", want, "v1")
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20}, up)
	readAll(t, c, "s3://b/a.tar")
	c.Close()

	c2 := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20}, up)
	if got := readAll(t, c2, "s3://b/a.tar"); !bytes.Equal(got, want) {
		t.Fatal("bytes after restart differ from the source's")
	}
	if n := up.openCount("s3://b/a.tar"); n != 1 {
		t.Errorf("source opened %d times, want 1 (the second process should hit the disk)", n)
	}
	if st := c2.Stats(); st.DiskHits != 1 {
		t.Errorf("stats %+v: want 1 disk hit", st)
	}
	_, names := dirBytes(t, dir)
	for _, n := range names {
		if n == "lock" || n == "budget" {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, "v1", n))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", n, fi.Mode().Perm())
		}
		if strings.Contains(n, "a.tar") || !fileRE.MatchString(n) {
			t.Errorf("file name %q is not a hash name", n)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "v1"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("cache directory mode %v (%v), want 0700", fi.Mode().Perm(), err)
	}
}

func TestDiskBudgetHoldsAfterTwiceTheBudget(t *testing.T) {
	const budget = 1 << 20
	up := newFake()
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir, DiskBytes: budget}, up)
	var read int64
	for i := 0; read < 2*budget; i++ {
		url := fmt.Sprintf("s3://b/%d.tar", i)
		data := randBytes(uint64(i), 90_000+i*1000)
		up.put(url, data, "v1")
		if got := readAll(t, c, url); !bytes.Equal(got, data) {
			t.Fatalf("%s: wrong bytes", url)
		}
		read += int64(len(data))
		if n, _ := dirBytes(t, dir); n > budget {
			t.Fatalf("after %s: %d bytes on disk, budget %d", url, n, budget)
		}
	}
	st := c.Stats()
	if st.Evicted == 0 || st.DiskBytes > budget {
		t.Errorf("stats %+v: want evictions and at most %d bytes", st, budget)
	}
	n, _ := dirBytes(t, dir)
	if n != st.DiskBytes {
		t.Errorf("%d bytes on disk, the index counts %d", n, st.DiskBytes)
	}
}

func TestEntriesBeingReadAreNotEvictedAndOverflowBypasses(t *testing.T) {
	const budget = 400_000
	up := newFake()
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir, DiskBytes: budget}, up)
	// Hold three entries open: together they fill most of the budget.
	var held []io.ReadCloser
	for i := range 3 {
		url := fmt.Sprintf("s3://b/held-%d.tar", i)
		up.put(url, randBytes(uint64(i), 120_000), "v1")
		readAll(t, c, url)
		r, err := c.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
	}
	// Objects that need room only eviction of the held entries could give are read
	// from the source, never deadlock, and never push the directory over budget.
	for i := range 4 {
		url := fmt.Sprintf("s3://b/more-%d.tar", i)
		data := randBytes(uint64(10+i), 100_000)
		up.put(url, data, "v1")
		if got := readAll(t, c, url); !bytes.Equal(got, data) {
			t.Fatalf("%s: wrong bytes", url)
		}
		if n, _ := dirBytes(t, dir); n > budget {
			t.Fatalf("%d bytes on disk, budget %d", n, budget)
		}
	}
	if st := c.Stats(); st.Bypassed == 0 {
		t.Errorf("stats %+v: want reads that bypassed the full cache", st)
	}
	for i, r := range held {
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, randBytes(uint64(i), 120_000)) {
			t.Errorf("held entry %d: read %d bytes, %v; want the source's bytes", i, len(got), err)
		}
		r.Close()
	}
	// Released, they can be evicted for a new object.
	up.put("s3://b/after.tar", randBytes(99, 300_000), "v1")
	readAll(t, c, "s3://b/after.tar")
	if _, ok := c.cachedVersion("s3://b/after.tar"); !ok {
		t.Error("an object that fits once the held entries are released was not cached")
	}
	if n, _ := dirBytes(t, dir); n > budget {
		t.Fatalf("%d bytes on disk, budget %d", n, budget)
	}
}

func TestObjectLargerThanBudgetBypasses(t *testing.T) {
	up := newFake()
	data := randBytes(3, 50_000)
	up.put("s3://b/big.tar", data, "v1")
	c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 10_000}, up)
	if got := readAll(t, c, "s3://b/big.tar"); !bytes.Equal(got, data) {
		t.Fatal("wrong bytes")
	}
	if st := c.Stats(); st.Bypassed != 1 || st.DiskEntries != 0 {
		t.Errorf("stats %+v: want 1 bypass, nothing cached", st)
	}
}

func TestConcurrentMissesMergeIntoOneFetch(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"disk", Options{DiskBytes: 1 << 22}},
		{"memory", Options{MemoryBytes: 1 << 22}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const readers = 16
			up := newFake()
			want := randBytes(4, 3<<20+17)
			up.put("s3://b/a.tar", want, "v1")
			up.gate = make(chan struct{})
			if tc.opts.DiskBytes > 0 {
				tc.opts.Dir = t.TempDir()
			}
			c := newCache(t, tc.opts, up)
			// Every Open returns before the source sends its first byte, so all of
			// them meet the one fetch in flight.
			rs := make([]io.ReadCloser, readers)
			var wg sync.WaitGroup
			for i := range rs {
				wg.Go(func() {
					r, err := c.Open(t.Context(), "s3://b/a.tar")
					if err != nil {
						t.Error(err)
						return
					}
					rs[i] = r
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			close(up.gate)
			for i, r := range rs {
				wg.Go(func() {
					defer r.Close()
					got, err := io.ReadAll(r)
					if err != nil || !bytes.Equal(got, want) {
						t.Errorf("reader %d: %d bytes, %v; want the source's %d", i, len(got), err, len(want))
					}
				})
			}
			wg.Wait()
			if n := up.openCount("s3://b/a.tar"); n != 1 {
				t.Errorf("source opened %d times for %d concurrent readers, want 1", n, readers)
			}
			if st := c.Stats(); st.Joined != readers-1 {
				t.Errorf("stats %+v: want %d joined", st, readers-1)
			}
		})
	}
}

func TestFirstReaderStreamsWhileFilling(t *testing.T) {
	up := newFake()
	want := randBytes(5, 2<<20)
	up.put("s3://b/a.tar", want, "v1")
	pr, pw := io.Pipe()
	up.pipe = pr
	c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 1 << 22}, up)
	r, err := c.Open(t.Context(), "s3://b/a.tar")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	half := len(want) / 2
	go pw.Write(want[:half])
	// The first half is readable while the source has sent nothing more.
	got := make([]byte, half)
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, want[:half]) {
		t.Fatalf("first half: %v", err)
	}
	go func() {
		pw.Write(want[half:])
		pw.Close()
	}()
	rest, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(rest, want[half:]) {
		t.Fatalf("second half: %d bytes, %v", len(rest), err)
	}
	if _, ok := c.cachedVersion("s3://b/a.tar"); !ok {
		t.Error("not cached after a full read")
	}
}

func TestFlippedByteIsDetectedAndRefetched(t *testing.T) {
	for _, memory := range []int64{0, 1 << 20} {
		t.Run(fmt.Sprintf("memory=%d", memory), func(t *testing.T) {
			up := newFake()
			want := randBytes(6, 200_000)
			up.put("s3://b/a.tar", want, "v1")
			dir := t.TempDir()
			c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20}, up)
			readAll(t, c, "s3://b/a.tar")
			c.Close()

			path := dataFile(t, dir, "s3://b/a.tar")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[123_456] ^= 0x10
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}

			c2 := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20, MemoryBytes: memory}, up)
			if got := readAll(t, c2, "s3://b/a.tar"); !bytes.Equal(got, want) {
				t.Fatal("served the corrupted bytes")
			}
			if st := c2.Stats(); st.Corrupt != 1 || st.Fetches != 1 {
				t.Errorf("stats %+v: want 1 corrupt entry and 1 refetch", st)
			}
			if n := up.openCount("s3://b/a.tar"); n != 2 {
				t.Errorf("source opened %d times, want 2", n)
			}
			if got, err := os.ReadFile(dataFile(t, dir, "s3://b/a.tar")); err != nil || !bytes.Equal(got, want) {
				t.Errorf("the new cache file does not hold the source's bytes (%v)", err)
			}
		})
	}
}

func TestNewVersionIsRefetched(t *testing.T) {
	up := newFake()
	up.put("s3://b/a.tar", []byte("first version"), `"etag-1"`)
	dir := t.TempDir()
	// Every open asks the source (TestSharedValidation: within the interval).
	c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20, MemoryBytes: 1 << 20, ValidateWithin: -1}, up)
	readAll(t, c, "s3://b/a.tar")
	readAll(t, c, "s3://b/a.tar") // now in memory too
	up.put("s3://b/a.tar", []byte("second, longer version"), `"etag-2"`)
	if got := readAll(t, c, "s3://b/a.tar"); string(got) != "second, longer version" {
		t.Fatalf("got %q after the object changed", got)
	}
	up.put("s3://b/a.tar", []byte("third, same len version"), `"etag-3"`)
	if got := readAll(t, c, "s3://b/a.tar"); string(got) != "third, same len version" {
		t.Fatalf("got %q after the object changed to the same size", got)
	}
	if st := c.Stats(); st.Stale != 2 || st.Fetches != 3 || st.DiskEntries != 1 {
		t.Errorf("stats %+v: want 2 stale, 3 fetches, 1 entry", st)
	}
	if _, names := dirBytes(t, dir); len(names) != 2 { // data, meta
		t.Errorf("files %v: want one entry", names)
	}
}

func TestUnreachableSourceServesCachedCopy(t *testing.T) {
	up := newFake()
	want := randBytes(7, 50_000)
	up.put("s3://b/a.tar", want, "v1")
	up.put("s3://b/b.tar", want, "v1")
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20}, up)
	readAll(t, c, "s3://b/a.tar")
	c.Close()

	up.down = true
	c2 := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20}, up)
	// Past the interval of the fetch's check: the open asks the source.
	c2.now = func() time.Time { return time.Now().Add(DefaultValidateWithin) }
	if got := readAll(t, c2, "s3://b/a.tar"); !bytes.Equal(got, want) {
		t.Fatal("wrong bytes from the cache while the source is down")
	}
	if info, err := c2.Stat(t.Context(), "s3://b/a.tar"); err != nil || info.Size != int64(len(want)) {
		t.Errorf("Stat while down: %+v, %v; want the cached object's info", info, err)
	}
	_, err := c2.Open(t.Context(), "s3://b/b.tar")
	if !errors.Is(err, errDown) {
		t.Errorf("uncached object while down: %v, want the source's error", err)
	}
	if st := c2.Stats(); st.Unvalidated < 1 {
		t.Errorf("stats %+v: want the unvalidated serve counted", st)
	}
}

func TestDeletedAtSourceFailsAndDrops(t *testing.T) {
	up := newFake()
	up.put("s3://b/a.tar", []byte("data"), "v1")
	c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 1 << 20}, up)
	clk := testClock(c)
	readAll(t, c, "s3://b/a.tar")
	clk.add(DefaultValidateWithin) // the check of the fetch no longer serves
	up.mu.Lock()
	delete(up.objs, "s3://b/a.tar")
	up.mu.Unlock()
	_, err := c.Open(t.Context(), "s3://b/a.tar")
	var se *source.Error
	if !errors.Is(err, source.ErrNotFound) || !errors.As(err, &se) || se.URL != "s3://b/a.tar" {
		t.Fatalf("got %v, want a not-found *source.Error naming the URL", err)
	}
	if st := c.Stats(); st.DiskEntries != 0 {
		t.Errorf("stats %+v: the entry should be dropped", st)
	}
}

func TestRebuildDropsWhatItCannotVerifyAndKeepsForeignFiles(t *testing.T) {
	up := newFake()
	for i := range 3 {
		up.put(fmt.Sprintf("s3://b/%d.tar", i), randBytes(uint64(i), 10_000), "v1")
	}
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20}, up)
	for i := range 3 {
		readAll(t, c, fmt.Sprintf("s3://b/%d.tar", i))
	}
	c.Close()
	root := filepath.Join(dir, "v1")
	// 0: truncated data. 1: meta gone. 2: intact.
	if err := os.Truncate(dataFile(t, dir, "s3://b/0.tar"), 5000); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(strings.TrimSuffix(dataFile(t, dir, "s3://b/1.tar"), ".data") + ".meta"); err != nil {
		t.Fatal(err)
	}
	// A fetch cut short, and files that are not the cache's.
	tmp := filepath.Join(root, "tmp-"+newName("s3://b/3.tar")+".data")
	foreign := []string{filepath.Join(root, "notes.txt"), filepath.Join(dir, hashURL("x")+"-0000000000000000.data")}
	for _, p := range append(foreign, tmp) {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c2 := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20}, up)
	// The entry without its meta is dropped at once; the truncated one when it is
	// first looked up (an entry's meta is read then, not when the directory opens).
	if st := c2.Stats(); st.DiskEntries != 2 {
		t.Errorf("stats %+v: want the intact entry and the truncated one", st)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file left behind: %v", err)
	}
	for _, p := range foreign {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("a file the cache did not create was touched: %v", err)
		}
	}
	for i := range 3 {
		url := fmt.Sprintf("s3://b/%d.tar", i)
		if got := readAll(t, c2, url); !bytes.Equal(got, randBytes(uint64(i), 10_000)) {
			t.Errorf("%s: wrong bytes", url)
		}
	}
	if st := c2.Stats(); st.DiskHits != 1 || st.Fetches != 2 || st.Corrupt != 1 || st.DiskEntries != 3 {
		t.Errorf("stats %+v: want 1 hit, 2 refetches, the truncated entry counted corrupt, 3 entries", st)
	}
	// The truncated entry's files are gone: the one data file left is the new one's.
	if got, err := os.ReadFile(dataFile(t, dir, "s3://b/0.tar")); err != nil || !bytes.Equal(got, randBytes(0, 10_000)) {
		t.Errorf("the refetched entry's data file does not hold the object (%v)", err)
	}
}

// Two Caches on one directory hold their locks through separate open files, as two
// processes do (flock locks belong to the open file, not the process): these tests
// are the processes of a node sharing its cache directory.

func TestOlderExclusiveHolderIsBusy(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "v1"), 0o700)
	f, err := os.OpenFile(filepath.Join(dir, "v1", "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Dir: dir}, newFake()); !errors.Is(err, ErrBusy) {
		t.Fatalf("got %v, want ErrBusy", err)
	}
}

func TestProcessesShareEntries(t *testing.T) {
	up := newFake()
	a, b := randBytes(1, 300_000), randBytes(2, 200_000)
	up.put("s3://b/a.tar", a, "v1")
	up.put("s3://b/b.tar", b, "v1")
	dir := t.TempDir()
	c1 := newCache(t, Options{Dir: dir, DiskBytes: 10 << 20}, up)
	c2 := newCache(t, Options{Dir: dir, DiskBytes: 10 << 20}, up)
	if !bytes.Equal(readAll(t, c1, "s3://b/a.tar"), a) {
		t.Fatal("c1: wrong bytes")
	}
	// The second process serves what the first fetched, from its files, twice.
	for range 2 {
		if !bytes.Equal(readAll(t, c2, "s3://b/a.tar"), a) {
			t.Fatal("c2: wrong bytes")
		}
	}
	if n := up.openCount("s3://b/a.tar"); n != 1 {
		t.Errorf("a.tar fetched %d times by two processes, want once", n)
	}
	if st := c2.Stats(); st.Fetches != 0 || st.DiskHits != 2 || st.DiskEntries != 1 {
		t.Errorf("c2 stats %+v: want 2 disk hits, no fetch", st)
	}
	// A fill in flight in one process: the other waits for it and serves its entry.
	gate := make(chan struct{})
	up.mu.Lock()
	up.gate = gate
	up.mu.Unlock()
	r1, err := c1.Open(t.Context(), "s3://b/b.tar")
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan []byte)
	go func() { b, _ := io.ReadAll(r1); first <- b }()
	for up.openCount("s3://b/b.tar") == 0 {
		runtime.Gosched() // the first process's fetch reaches the source
	}
	second := make(chan []byte)
	go func() { second <- readAll(t, c2, "s3://b/b.tar") }()
	close(gate)
	if got := <-first; !bytes.Equal(got, b) {
		t.Fatal("c1: wrong bytes of b.tar")
	}
	r1.Close()
	if got := <-second; !bytes.Equal(got, b) {
		t.Fatal("c2: wrong bytes of b.tar")
	}
	if n := up.openCount("s3://b/b.tar"); n != 1 {
		t.Errorf("b.tar fetched %d times while two processes wanted it at once, want once", n)
	}
}

func TestProcessesShareTheBudgetAndNeverEvictWhatTheOtherReads(t *testing.T) {
	const budget = 500_000
	up := newFake()
	dir := t.TempDir()
	c1 := newCache(t, Options{Dir: dir, DiskBytes: budget}, up)
	c2 := newCache(t, Options{Dir: dir, DiskBytes: budget}, up)
	held := randBytes(7, 150_000)
	up.put("s3://b/held.tar", held, "v1")
	readAll(t, c1, "s3://b/held.tar")
	r, err := c1.Open(t.Context(), "s3://b/held.tar")
	if err != nil {
		t.Fatal(err)
	}
	part := make([]byte, 1000)
	if _, err := io.ReadFull(r, part); err != nil {
		t.Fatal(err)
	}
	held1 := dataFile(t, dir, "s3://b/held.tar")
	// Both processes fill the directory with other objects, each many times its
	// budget: the files never pass the budget, and the entry the first process reads
	// stays.
	for i := range 12 {
		c := []*Cache{c1, c2}[i%2]
		url := fmt.Sprintf("s3://b/%d.tar", i)
		data := randBytes(uint64(100+i), 120_000)
		up.put(url, data, "v1")
		if !bytes.Equal(readAll(t, c, url), data) {
			t.Fatalf("%s: wrong bytes", url)
		}
		if n, names := dirBytes(t, dir); n > budget {
			t.Fatalf("after %s: %d bytes on disk (%v), budget %d", url, n, names, budget)
		}
		if _, err := os.Stat(held1); err != nil {
			t.Fatalf("after %s: the entry another process reads was deleted: %v", url, err)
		}
	}
	rest, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(append(part, rest...), held) {
		t.Fatalf("the held entry: %d bytes, %v", len(rest)+len(part), err)
	}
	r.Close()
	if st1, st2 := c1.Stats(), c2.Stats(); st1.Evicted+st2.Evicted == 0 {
		t.Errorf("no eviction: %+v %+v", st1, st2)
	}
	// Released, it goes when room is needed.
	for i := range 6 {
		url := fmt.Sprintf("s3://b/later-%d.tar", i)
		up.put(url, randBytes(uint64(200+i), 120_000), "v1")
		readAll(t, c2, url)
	}
	if _, err := os.Stat(held1); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the released entry was never evicted: %v", err)
	}
	if n, _ := dirBytes(t, dir); n > budget {
		t.Fatalf("%d bytes on disk, budget %d", n, budget)
	}
}

// TestStartupSparesLiveProcesses: a process starting on the directory deletes what a
// dead one left (a fetch's temporary file, its fill lock) but not the files of a
// fetch a live process is making.
func TestStartupSparesLiveProcesses(t *testing.T) {
	up := newFake()
	data := randBytes(5, 200_000)
	up.put("s3://b/live.tar", data, "v1")
	dir := t.TempDir()
	root := filepath.Join(dir, "v1")
	c1 := newCache(t, Options{Dir: dir, DiskBytes: 10 << 20}, up)
	gate := make(chan struct{})
	up.mu.Lock()
	up.gate = gate
	up.mu.Unlock()
	r, err := c1.Open(t.Context(), "s3://b/live.tar")
	if err != nil {
		t.Fatal(err)
	}
	for up.openCount("s3://b/live.tar") == 0 {
		runtime.Gosched()
	}
	live, _ := filepath.Glob(filepath.Join(root, "tmp-"+hashURL("s3://b/live.tar")+"-*.data"))
	if len(live) != 1 {
		t.Fatalf("the live fetch's temporary file: %v", live)
	}
	// What a killed process left: a temporary file and a fill lock no one holds.
	dead := filepath.Join(root, "tmp-"+newName("s3://b/dead.tar")+"-1000.data")
	deadLock := filepath.Join(root, hashURL("s3://b/dead.tar")+".lock")
	for _, p := range []string{dead, deadLock} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	newCache(t, Options{Dir: dir, DiskBytes: 10 << 20}, up)
	for _, p := range []string{dead, deadLock} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", filepath.Base(p), err)
		}
	}
	if _, err := os.Stat(live[0]); err != nil {
		t.Errorf("the live fetch's file was deleted: %v", err)
	}
	close(gate)
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the live fetch: %d bytes, %v", len(got), err)
	}
	if st := c1.Stats(); st.DiskEntries != 1 {
		t.Errorf("stats %+v: the live fetch was not committed", st)
	}
}

func TestNodesHaveTheirOwnMemoryTier(t *testing.T) {
	up := newFake()
	up.put("s3://b/a.tar", randBytes(8, 1000), "v1")
	var mu sync.Mutex
	bound := map[int]int{}
	c := newCache(t, Options{MemoryBytes: 1 << 20, Nodes: 2, BindMemory: func(b []byte, node int) error {
		mu.Lock()
		defer mu.Unlock()
		bound[node] += len(b)
		return nil
	}}, up)
	readAll(t, c.Node(1), "s3://b/a.tar")
	readAll(t, c.Node(0), "s3://b/a.tar") // served from node 1's tier
	mu.Lock()
	defer mu.Unlock()
	if bound[1] != 1000 || bound[0] != 0 {
		t.Errorf("bound %v: want 1000 bytes on node 1 only", bound)
	}
	c.mu.Lock()
	n0, n1 := c.mem[0].lru.Len(), c.mem[1].lru.Len()
	c.mu.Unlock()
	if n0 != 0 || n1 != 1 {
		t.Errorf("entries per node %d, %d: want 0, 1", n0, n1)
	}
	if st := c.Stats(); st.MemoryHits != 1 || st.Fetches != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestMemoryBudgetHolds(t *testing.T) {
	const budget = 100_000
	up := newFake()
	c := newCache(t, Options{MemoryBytes: budget}, up)
	for i := range 20 {
		url := fmt.Sprintf("s3://b/%d.tar", i)
		up.put(url, randBytes(uint64(i), 15_000), "v1")
		readAll(t, c, url)
		if st := c.Stats(); st.MemoryBytes > budget {
			t.Fatalf("stats %+v: over the budget", st)
		}
	}
}

func TestOpenRange(t *testing.T) {
	up := newFake()
	data := randBytes(9, 10_000)
	up.put("s3://b/a.tar", data, "v1")
	c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 1 << 20}, up)
	readAll(t, c, "s3://b/a.tar")
	for _, tc := range []struct{ off, n int64 }{{0, 10}, {9990, -1}, {5000, 100}} {
		r, err := c.OpenRange(t.Context(), "s3://b/a.tar", tc.off, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(r)
		r.Close()
		end := int64(len(data))
		if tc.n >= 0 {
			end = tc.off + tc.n
		}
		if !bytes.Equal(got, data[tc.off:end]) {
			t.Errorf("range %d+%d: wrong bytes", tc.off, tc.n)
		}
	}
}

func TestCloseIsIdempotentAndEndsOpens(t *testing.T) {
	up := newFake()
	up.put("s3://b/a.tar", []byte("x"), "v1")
	c := newCache(t, Options{Dir: t.TempDir()}, up)
	c.Close()
	c.Close()
	if _, err := c.Open(context.Background(), "s3://b/a.tar"); !errors.Is(err, ErrClosed) {
		t.Fatalf("open after close: %v, want ErrClosed", err)
	}
}

func TestCloseCancelsFetchInFlight(t *testing.T) {
	up := newFake()
	up.put("s3://b/a.tar", []byte("data"), "v1")
	pr, pw := io.Pipe()
	defer pw.Close()
	up.pipe = pr
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir}, up)
	r, err := c.Open(t.Context(), "s3://b/a.tar")
	if err != nil {
		t.Fatal(err)
	}
	go pw.Write([]byte("da")) // part of the object, then nothing
	got := make([]byte, 2)
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatal(err)
	}
	go func() {
		// The fake's pipe does not watch the context: end it once Close has
		// cancelled, as a network stream would.
		<-c.ctx.Done()
		pw.CloseWithError(context.Canceled)
	}()
	c.Close()
	if _, err := io.ReadAll(r); err == nil {
		t.Error("a read of a cancelled fetch ended without an error")
	}
	r.Close()
	if _, names := dirBytes(t, dir); len(names) != 0 {
		t.Errorf("files %v after a cancelled fetch: want none", names)
	}
}

func TestWrapRegistry(t *testing.T) {
	up := newFake()
	up.put("mem://b/a.tar", []byte("remote"), "v1")
	local := filepath.Join(t.TempDir(), "x.tar")
	os.WriteFile(local, []byte("local"), 0o600)
	reg := &source.Registry{}
	reg.Register("mem", up)
	reg.Register("file", &source.File{})
	out, c, err := Wrap(Options{MemoryBytes: 1 << 20}, reg, "file")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := readAll(t, out, "mem://b/a.tar"); string(got) != "remote" {
		t.Fatal(string(got))
	}
	if got := readAll(t, out, local); string(got) != "local" {
		t.Fatal(string(got))
	}
	if st := c.Stats(); st.Fetches != 1 || st.MemoryEntries != 1 {
		t.Errorf("stats %+v: want the mem object cached and the file not", st)
	}
}

func TestPlanAndWarm(t *testing.T) {
	up := newFake()
	var urls []string
	for i := range 6 {
		url := fmt.Sprintf("s3://b/%d.tar", i)
		urls = append(urls, url)
		up.put(url, randBytes(uint64(i), 20_000), "v1")
	}
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20}, up)
	readAll(t, c, urls[0])
	readAll(t, c, urls[1])
	up.put(urls[1], randBytes(100, 20_000), "v2")
	p, err := c.Plan(t.Context(), append(urls, "s3://b/missing.tar"), 3)
	if err != nil {
		t.Fatal(err)
	}
	if p.Cached != 1 || p.Fetch != 5 || p.Errors != 1 || p.FetchBytes != 5*20_000 || !p.Fits {
		t.Fatalf("plan %+v", p)
	}
	if p.Entries[1].State != Stale || p.Entries[2].State != Missing || !errors.Is(p.Entries[6].Err, source.ErrNotFound) {
		t.Errorf("entries %+v", p.Entries)
	}
	var got int64
	done := 0
	err = c.Warm(t.Context(), p, WarmOptions{Concurrency: 2, Progress: func(ev WarmEvent) {
		got += ev.Bytes
		if ev.Done && ev.Err == nil {
			done++
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got != p.FetchBytes || done != 5 {
		t.Errorf("progress: %d bytes, %d done; want %d, 5", got, done, p.FetchBytes)
	}
	p2, err := c.Plan(t.Context(), urls, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p2.Fetch != 0 || p2.Cached != 6 {
		t.Errorf("after warm: %+v", p2)
	}
	opens := up.openCount(urls[3])
	if err := c.Warm(t.Context(), p2, WarmOptions{}); err != nil || up.openCount(urls[3]) != opens {
		t.Errorf("second warm: %v, %d opens; want nothing fetched", err, up.openCount(urls[3])-opens)
	}
	small := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 50_000}, up)
	p3, err := small.Plan(t.Context(), urls, 0)
	if err != nil || p3.Fits {
		t.Errorf("plan for a small budget: %+v, %v; want it not to fit", p3, err)
	}
}

// Listing URLs expand through a wrapped registry as through the bare one, and a
// scheme whose source cannot list says so.
func TestWrappedRegistryLists(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"train-1.tar", "train-2.tar", "eval-1.tar"} {
		os.WriteFile(filepath.Join(dir, n), []byte(n), 0o600)
	}
	reg := &source.Registry{}
	// Listed through the cache here (not left uncached), to exercise Cache.List.
	reg.Register("file", &source.File{})
	reg.Register("mem", newFake())
	out, c, err := Wrap(Options{MemoryBytes: 1 << 20}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pattern := "file://" + dir + "/train-*.tar"
	want, err := reg.Expand(context.Background(), []string{pattern})
	if err != nil {
		t.Fatal(err)
	}
	got, err := out.Expand(context.Background(), []string{pattern})
	if err != nil || !slices.Equal(got, want) || len(got) != 2 {
		t.Fatalf("through the cache: %v %v, bare: %v", got, err, want)
	}
	if _, err := out.Expand(context.Background(), []string{"mem://b/train-*.tar"}); !errors.Is(err, source.ErrNotLister) {
		t.Errorf("listing a source that cannot list: %v", err)
	}
}

// rangeFake is a fakeSource with ranged reads, counting them.
type rangeFake struct {
	*fakeSource
	ranges int
}

func (s *rangeFake) OpenRange(ctx context.Context, url string, off, n int64) (io.ReadCloser, error) {
	s.mu.Lock()
	s.ranges++
	o, ok := s.objs[url]
	s.mu.Unlock()
	if !ok {
		return nil, &source.Error{Op: "open", URL: url, Err: source.ErrNotFound}
	}
	end := int64(len(o.data))
	if n >= 0 {
		end = min(end, off+n)
	}
	return io.NopCloser(bytes.NewReader(o.data[off:end])), nil
}

// Behind a Registry, as Wrap builds it, a range of an object not cached is read from
// the scheme's source as a range, not cut from a whole fetch; the whole object is
// fetched into the cache behind it, once, and the next range is a hit.
func TestOpenRangeBehindRegistryReadsARangeAndFillsBehind(t *testing.T) {
	up := &rangeFake{fakeSource: newFake()}
	data := randBytes(10, 50_000)
	up.put("mem://b/a.tar", data, "v1")
	reg := &source.Registry{}
	reg.Register("mem", up)
	_, c, err := Wrap(Options{Dir: t.TempDir(), DiskBytes: 1 << 20}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read := func(off, n int64) {
		t.Helper()
		r, err := c.OpenRange(t.Context(), "mem://b/a.tar", off, n)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(r)
		r.Close()
		if !bytes.Equal(got, data[off:off+n]) {
			t.Fatalf("range %d+%d: wrong bytes", off, n)
		}
	}
	read(40_000, 100)
	read(41_000, 100) // while the object may still be filling: another range, no second fetch
	c.behindWG.Wait()
	st := c.Stats()
	if up.openCount("mem://b/a.tar") != 1 || st.Fetches != 1 || st.DiskEntries != 1 || up.ranges < 1 || up.ranges > 2 {
		t.Fatalf("%d ranged reads, %d whole opens, stats %+v: want the ranges read as ranges and one fetch behind them", up.ranges, up.openCount("mem://b/a.tar"), st)
	}
	ranges := up.ranges
	read(10_000, 5_000)
	if st := c.Stats(); up.ranges != ranges || up.openCount("mem://b/a.tar") != 1 || st.DiskHits != 1 {
		t.Errorf("%d ranged reads, stats %+v: want the third range from the cache", up.ranges, st)
	}
}

// TestWholeObjectRangeIsCached: OpenRange and OpenVersion of a whole object (off 0,
// length < 0, as a loader reading a shard of known version asks) fill the cache even
// when the source reads ranges, and the next open is a hit.
func TestWholeObjectRangeIsCached(t *testing.T) {
	up := &rangeFake{fakeSource: newFake()}
	data := randBytes(11, 50_000)
	up.put("mem://b/a.tar", data, "v1")
	up.put("mem://b/b.tar", data, "v1")
	reg := &source.Registry{}
	reg.Register("mem", up)
	_, c, err := Wrap(Options{Dir: t.TempDir(), DiskBytes: 1 << 20}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	open := []func(url string) (io.ReadCloser, error){
		func(url string) (io.ReadCloser, error) { return c.OpenRange(t.Context(), url, 0, -1) },
		func(url string) (io.ReadCloser, error) { return c.OpenVersion(t.Context(), url, "v1", 0, -1) },
	}
	for i, url := range []string{"mem://b/a.tar", "mem://b/b.tar"} {
		for range 2 {
			r, err := open[i](url)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(r)
			r.Close()
			if !bytes.Equal(got, data) {
				t.Fatalf("%s: wrong bytes", url)
			}
		}
		if n := up.openCount(url); n != 1 || up.ranges != 0 {
			t.Errorf("%s: %d whole opens, %d ranged reads: want one fetch into the cache", url, n, up.ranges)
		}
	}
	if st := c.Stats(); st.Fetches != 2 || st.DiskHits != 2 || st.Bypassed != 0 {
		t.Errorf("stats %+v: want 2 fetches, 2 hits, no bypass", st)
	}
}

// preparingSource is a fakeSource that records what it was asked to prepare.
type preparingSource struct {
	*fakeSource
	prepared []string
}

func (p *preparingSource) Prepare(url string) { p.prepared = append(p.prepared, url) }

func TestPrepareReachesTheUpstream(t *testing.T) {
	up := &preparingSource{fakeSource: newFake()}
	reg := &source.Registry{}
	reg.Register("s3", up)
	wrapped, c, err := Wrap(Options{Dir: t.TempDir(), DiskBytes: 1 << 20, Logf: t.Logf}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	source.Prepare(wrapped, "s3://b/a.tar")
	if len(up.prepared) != 1 || up.prepared[0] != "s3://b/a.tar" {
		t.Fatalf("upstream prepared %v, want the URL once", up.prepared)
	}
}

// Opening a directory reads no entry's meta file: an entry's is read when its object
// is first looked up, so that a process's start does not grow with the entries other
// processes committed.
func TestEntriesAreReadWhenLookedUp(t *testing.T) {
	up := newFake()
	const n = 20
	for i := range n {
		up.put(fmt.Sprintf("s3://b/%d.tar", i), randBytes(uint64(i), 3_000), "v1")
	}
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20}, up)
	for i := range n {
		readAll(t, c, fmt.Sprintf("s3://b/%d.tar", i))
	}
	c.Close()
	// Every meta file now says nothing a reader could use.
	metas, _ := filepath.Glob(filepath.Join(dir, "v1", "*.meta"))
	if len(metas) != n {
		t.Fatalf("%d meta files, want %d", len(metas), n)
	}
	for _, p := range metas {
		if err := os.WriteFile(p, []byte("{not json"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c2 := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20}, up)
	if st := c2.Stats(); st.DiskEntries != n || st.Corrupt != 0 {
		t.Fatalf("stats %+v after opening: want %d entries, none read yet", st, n)
	}
	// The one looked up is found out, dropped and fetched again; the others stay
	// as they are until their turn.
	if got := readAll(t, c2, "s3://b/7.tar"); !bytes.Equal(got, randBytes(7, 3_000)) {
		t.Fatal("wrong bytes")
	}
	if st := c2.Stats(); st.Corrupt != 1 || st.Fetches != 1 || st.DiskEntries != n {
		t.Errorf("stats %+v: want 1 corrupt entry refetched, %d entries", st, n)
	}
	if got := readAll(t, c2, "s3://b/7.tar"); !bytes.Equal(got, randBytes(7, 3_000)) {
		t.Fatal("wrong bytes from the new entry")
	}
	if st := c2.Stats(); st.DiskHits != 1 {
		t.Errorf("stats %+v: the new entry was not served", st)
	}
}
