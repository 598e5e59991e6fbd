package cache

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardload/shardload/source"
)

// clock is a wall clock the test moves by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testClock gives c a clock of its own, at a fixed time, and returns it.
func testClock(c *Cache) *clock {
	clk := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	c.now = clk.now
	return clk
}

// onClock makes each cache read clk.
func onClock(clk *clock, cs ...*Cache) {
	for _, c := range cs {
		c.now = clk.now
	}
}

// twoProcesses returns a source holding url (data, version v1) and two caches on one
// directory (two processes) on one test clock, the first of which has read url: it
// fetched the object and recorded its check.
func twoProcesses(t *testing.T, url, data string) (*fakeSource, *Cache, *Cache, *clock) {
	t.Helper()
	up := newFake()
	up.put(url, []byte(data), "v1")
	dir := t.TempDir()
	a := newCache(t, Options{Dir: dir}, up)
	clk := testClock(a)
	readAll(t, a, url)
	b := newCache(t, Options{Dir: dir}, up)
	onClock(clk, b)
	return up, a, b, clk
}

// statCount returns the Stats the source has answered so far.
func (s *fakeSource) statCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// checkRecord returns the record of a version check on the meta file of url's
// entry in dir, nil if none.
func checkRecord(t *testing.T, dir, url string) []byte {
	t.Helper()
	path := strings.TrimSuffix(dataFile(t, dir, url), ".data") + ".meta"
	b := make([]byte, 256)
	n, err := unix.Getxattr(path, checkAttr, b)
	if errors.Is(err, unix.ENODATA) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b[:n]
}

// opens runs open in turn, each after the clock moved by its step, and reports the
// Stats the source answered for each.
type step struct {
	c     *Cache
	after time.Duration // the clock moves this much before the open
	stats int           // Stats the open should send
	want  string        // the bytes it should read
}

func runSteps(t *testing.T, clk *clock, up *fakeSource, url string, steps []step) {
	t.Helper()
	for i, s := range steps {
		clk.add(s.after)
		before := up.statCount()
		if got := readAll(t, s.c, url); string(got) != s.want {
			t.Errorf("open %d: read %q, want %q", i, got, s.want)
		}
		if n := up.statCount() - before; n != s.stats {
			t.Errorf("open %d (%v later): %d Stats, want %d", i, s.after, n, s.stats)
		}
	}
}

// Two caches on one directory act as two processes of a node. The Stat before a
// fetch, and each Stat that finds the cached version, serve every open of the entry
// in either process for ValidateWithin (5 s): none of them asks the source. An
// open 5 s or more after the node's last check asks again, and its check serves
// the other process too.
func TestSharedValidation(t *testing.T) {
	up := newFake()
	const url = "s3://b/a.tar"
	up.put(url, []byte("version one"), "v1")
	dir := t.TempDir()
	a := newCache(t, Options{Dir: dir}, up)
	clk := testClock(a)
	runSteps(t, clk, up, url, []step{{c: a, stats: 1, want: "version one"}}) // the fetch
	if rec := checkRecord(t, dir, url); len(rec) != checkLen {
		t.Fatalf("the committed entry's meta records no check (%x)", rec)
	}
	b := newCache(t, Options{Dir: dir}, up)
	onClock(clk, b)
	runSteps(t, clk, up, url, []step{
		{c: b, after: time.Second, stats: 0, want: "version one"},                          // another process, from A's record
		{c: a, after: time.Second, stats: 0, want: "version one"},                          // the same process
		{c: b, after: 3 * time.Second, stats: 1, want: "version one"},                      // 5 s after the check: a Stat
		{c: a, after: 4 * time.Second, stats: 0, want: "version one"},                      // from B's check, 4 s before
		{c: a, after: time.Second, stats: 1, want: "version one"},                          // 5 s after B's check
		{c: b, after: 4*time.Second + 999*time.Millisecond, stats: 0, want: "version one"}, // A's, just
	})
	sa, sb := a.Stats(), b.Stats()
	if sa.ValidationsShared != 2 || sb.ValidationsShared != 2 || sa.Fetches+sb.Fetches != 1 || sa.Stale+sb.Stale != 0 {
		t.Errorf("stats A %+v, B %+v: want 2 opens each without a Stat, 1 fetch", sa, sb)
	}
}

// An object rewritten at the source within the interval of the node's last check
// is served at the version cached until the interval has passed; the open after it
// finds the new version, drops the entry and fetches the object again, in either
// process.
func TestSharedValidationChangedWithin(t *testing.T) {
	const url = "s3://b/a.tar"
	up, a, b, clk := twoProcesses(t, url, "version one")
	clk.add(time.Second)
	up.put(url, []byte("version two!"), "v2")
	runSteps(t, clk, up, url, []step{
		{c: b, after: time.Second, stats: 0, want: "version one"},     // 2 s after the check: still the old one
		{c: a, after: 2 * time.Second, stats: 0, want: "version one"}, // 4 s
		{c: b, after: time.Second, stats: 1, want: "version two!"},    // 5 s: a Stat finds v2, which is fetched
		{c: a, after: time.Second, stats: 1, want: "version two!"},    // A's copy was v1: a Stat, then B's entry
		{c: b, after: time.Second, stats: 0, want: "version two!"},
	})
	if st := b.Stats(); st.Stale != 1 || st.Fetches != 1 {
		t.Errorf("stats B %+v: want the v1 entry dropped as stale and v2 fetched", st)
	}
	if st := a.Stats(); st.Stale != 1 || st.Fetches != 1 {
		t.Errorf("stats A %+v: want its v1 entry stale, and one fetch (its first)", st)
	}
}

// A check whose record lies in the future (the clock was set back since) serves
// no open: the open asks the source, and records its own check.
func TestSharedValidationClockBack(t *testing.T) {
	const url = "s3://b/a.tar"
	up, a, b, clk := twoProcesses(t, url, "data")
	runSteps(t, clk, up, url, []step{
		{c: b, after: -time.Second, stats: 1, want: "data"},     // A's check is 1 s ahead
		{c: a, after: 0, stats: 0, want: "data"},                // B's check, now
		{c: a, after: -time.Hour, stats: 1, want: "data"},       // an hour back
		{c: b, after: time.Millisecond, stats: 0, want: "data"}, // A's check, 1 ms before
	})
}

// Without extended attributes (the fault hook answers as such a file system does)
// no check is recorded on the meta file and nothing is logged: each process asks
// the source on its first open of the entry, and serves its own check within the
// interval.
func TestSharedValidationNoXattr(t *testing.T) {
	up := newFake()
	const url = "s3://b/a.tar"
	up.put(url, []byte("data"), "v1")
	dir := t.TempDir()
	fault := func(op, path string) error {
		if op == "getxattr" || op == "setxattr" {
			return &os.PathError{Op: op, Path: path, Err: unix.ENOTSUP}
		}
		return nil
	}
	lines := &logLines{t: t}
	a := newCache(t, Options{Dir: dir, Logf: lines.logf}, up)
	a.disk.fault = fault
	clk := testClock(a)
	readAll(t, a, url)
	b := newCache(t, Options{Dir: dir, Logf: lines.logf}, up)
	b.disk.fault = fault
	onClock(clk, b)
	runSteps(t, clk, up, url, []step{
		{c: b, after: time.Second, stats: 1, want: "data"},
		{c: b, after: time.Second, stats: 0, want: "data"}, // its own check
		{c: a, after: time.Second, stats: 0, want: "data"}, // its own (the fetch's), 3 s before
		{c: a, after: 2 * time.Second, stats: 1, want: "data"},
		{c: b, after: time.Second, stats: 1, want: "data"}, // its own is 5 s old
		{c: b, after: time.Second, stats: 0, want: "data"}, // its own, 1 s before
	})
	if rec := checkRecord(t, dir, url); rec != nil {
		t.Errorf("a check recorded (%x) where the file system refuses them", rec)
	}
	if len(lines.lines) != 0 {
		t.Errorf("logged %q", lines.lines)
	}
}

// ValidateWithin negative: every open asks the source, as before the checks were
// shared, and none is recorded.
func TestSharedValidationOff(t *testing.T) {
	up := newFake()
	const url = "s3://b/a.tar"
	up.put(url, []byte("data"), "v1")
	dir := t.TempDir()
	a := newCache(t, Options{Dir: dir, ValidateWithin: -1}, up)
	clk := testClock(a)
	readAll(t, a, url)
	b := newCache(t, Options{Dir: dir, ValidateWithin: -1}, up)
	onClock(clk, b)
	runSteps(t, clk, up, url, []step{
		{c: b, stats: 1, want: "data"},
		{c: a, stats: 1, want: "data"},
		{c: a, stats: 1, want: "data"},
		{c: b, stats: 1, want: "data"},
	})
	if rec := checkRecord(t, dir, url); rec != nil {
		t.Errorf("a check recorded (%x) with ValidateWithin off", rec)
	}
	if st := a.Stats(); st.ValidationsShared != 0 {
		t.Errorf("stats %+v", st)
	}
}

// OpenVersion sends one Stat (it sent two: its own and the open's), or none for a
// cached copy at the version asked checked within the interval, and one for a
// copy of another version, which it does not take on a shared check's word.
func TestSharedValidationOpenVersion(t *testing.T) {
	up := newFake()
	const url = "s3://b/a.tar"
	up.put(url, []byte("0123456789"), "v1")
	c := newCache(t, Options{Dir: t.TempDir()}, up)
	clk := testClock(c)
	read := func(version string, stats int, want string) {
		t.Helper()
		before := up.statCount()
		r, err := c.OpenVersion(t.Context(), url, version, 2, 3)
		if want == "" {
			if !errors.Is(err, source.ErrChanged) {
				t.Errorf("OpenVersion %s: %v, want source.ErrChanged", version, err)
			}
		} else {
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(r)
			r.Close()
			if string(got) != want {
				t.Errorf("OpenVersion %s: %q, want %q", version, got, want)
			}
		}
		if n := up.statCount() - before; n != stats {
			t.Errorf("OpenVersion %s: %d Stats, want %d", version, n, stats)
		}
	}
	read("v1", 1, "234")
	c.wg.Wait() // the fetch goes on after the ranged read: let it commit
	clk.add(6 * time.Second)
	read("v1", 1, "234")
	read("v1", 0, "234")
	read("v2", 1, "") // the source holds v1
	up.put(url, []byte("abcdefghij"), "v2")
	read("v2", 1, "cde") // the copy is v1: a Stat finds v2, which is fetched
}

// A cache with only a memory tier shares its checks within the process.
func TestSharedValidationMemory(t *testing.T) {
	up := newFake()
	const url = "s3://b/a.tar"
	up.put(url, []byte("data"), "v1")
	c := newCache(t, Options{MemoryBytes: 1 << 20}, up)
	clk := testClock(c)
	runSteps(t, clk, up, url, []step{
		{c: c, stats: 1, want: "data"},
		{c: c, after: 4 * time.Second, stats: 0, want: "data"},
		{c: c, after: time.Second, stats: 1, want: "data"},
		{c: c, after: time.Second, stats: 0, want: "data"},
	})
}

// A shared check of an entry that another process evicts before it is opened
// fetches nothing on the check's word: the open asks the source.
func TestSharedValidationEntryGone(t *testing.T) {
	const url = "s3://b/a.tar"
	up, a, b, clk := twoProcesses(t, url, "data")
	clk.add(time.Second)
	readAll(t, b, url) // B has loaded the entry and holds A's check of it
	// A drops the entry (as an eviction would); B still lists it.
	path := dataFile(t, a.opts.Dir, url)
	a.drop(url)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the entry's file is still there: %v", err)
	}
	up.put(url, []byte("DATA"), "v2")
	before := up.statCount()
	if got := readAll(t, b, url); !bytes.Equal(got, []byte("DATA")) {
		t.Errorf("read %q after the entry went, want the source's v2", got)
	}
	if n := up.statCount() - before; n < 1 {
		t.Errorf("%d Stats: the open took the gone entry's check", n)
	}
	if st := b.Stats(); st.Fetches != 1 {
		t.Errorf("stats %+v: want v2 fetched", st)
	}
}

// Stat answers with a cached copy's Info when a check within the interval serves
// (as an open of it would), records the check it makes otherwise, and drops a copy
// it finds stale: a Stat and the open after it agree on the version.
func TestSharedValidationStat(t *testing.T) {
	const url = "s3://b/a.tar"
	up, a, b, clk := twoProcesses(t, url, "version one")
	stat := func(c *Cache, stats int, version string) {
		t.Helper()
		before := up.statCount()
		info, err := c.Stat(t.Context(), url)
		if err != nil || info.Version != version || info.URL != url {
			t.Errorf("Stat: %+v, %v; want version %s", info, err, version)
		}
		if n := up.statCount() - before; n != stats {
			t.Errorf("Stat: %d Stats of the source, want %d", n, stats)
		}
	}
	clk.add(time.Second)
	stat(b, 0, "v1") // the fetch's check
	clk.add(4 * time.Second)
	stat(b, 1, "v1")                                                                             // 5 s: asks, and records
	runSteps(t, clk, up, url, []step{{c: a, after: time.Second, stats: 0, want: "version one"}}) // from B's Stat
	up.put(url, []byte("version two!"), "v2")
	clk.add(5 * time.Second)
	stat(b, 1, "v2") // drops B's copy
	runSteps(t, clk, up, url, []step{{c: b, stats: 1, want: "version two!"}})
	if st := b.Stats(); st.Stale != 1 || st.ValidationsShared != 1 {
		t.Errorf("stats B %+v: want the copy found stale by a Stat, one Stat served by a check", st)
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
