package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"

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
