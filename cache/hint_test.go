package cache

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// trio is three objects x, y and z of one size and a disk budget that holds two of
// them: a cache reads x (at t0) and y (t0+1s), then z (at now = t0+2s), which needs
// the room of one of them. Which one goes, if any, is what the hints decide:
//
//   - no hints (or hints that do not count): LRU, x goes; y and z are held;
//   - reader1's hints (x in 100 s, y in 200 s, z now and in 50 s): y goes, needed
//     furthest away; x and z are held;
//   - reader1's and reader2's (y in 20 s): x goes, now the furthest; y and z held.
type trio struct {
	up     *countingSource
	urls   []string // x, y, z
	data   map[string][]byte
	budget int64
	t0     time.Time
}

func newTrio() *trio {
	up, urls, data := newObjects(3, func(int) int { return 40 << 10 })
	cost := entryCost(urls[0], "v1", 40<<10)
	return &trio{up: up, urls: urls, data: data, budget: 2*cost + cost/2, t0: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
}

func (tr *trio) now() time.Time { return tr.t0.Add(2 * time.Second) }

// at is now + d in unix nanoseconds.
func (tr *trio) at(d time.Duration) int64 { return tr.now().Add(d).UnixNano() }

func (tr *trio) reader1() []HintEntry {
	x, y, z := tr.urls[0], tr.urls[1], tr.urls[2]
	return []HintEntry{{z, tr.at(0)}, {z, tr.at(50 * time.Second)}, {x, tr.at(100 * time.Second)}, {y, tr.at(200 * time.Second)}}
}

func (tr *trio) reader2() []HintEntry {
	return []HintEntry{{tr.urls[1], tr.at(20 * time.Second)}}
}

// cache returns a cache of the trio's budget on dir.
func (tr *trio) cache(t *testing.T, dir string, opts Options) *Cache {
	t.Helper()
	opts.Dir, opts.DiskBytes = dir, tr.budget
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	c := newCache(t, opts, tr.up)
	fixedFetchTimes(c)
	return c
}

// fill reads x and y through c, at t0 and t0+1s; it leaves c's clock at now.
func (tr *trio) fill(t *testing.T, c *Cache) *clock {
	t.Helper()
	clk := testClock(c)
	for i, u := range tr.urls[:2] {
		clk.set(tr.t0.Add(time.Duration(i) * time.Second))
		if got := readAll(t, c, u); !bytes.Equal(got, tr.data[u]) {
			t.Fatalf("%s: the bytes differ", u)
		}
	}
	clk.set(tr.now())
	return clk
}

// readZ reads z through c and returns which of x, y, z the disk tier holds.
func (tr *trio) readZ(t *testing.T, c *Cache) string {
	t.Helper()
	if got := readAll(t, c, tr.urls[2]); !bytes.Equal(got, tr.data[tr.urls[2]]) {
		t.Fatal("z: the bytes differ")
	}
	if used, _ := dirBytes(t, c.opts.Dir); used > tr.budget {
		t.Errorf("the directory holds %d bytes, over the budget of %d", used, tr.budget)
	}
	return tr.names(held(c, tr.urls))
}

func (tr *trio) names(urls []string) string {
	s := ""
	for _, u := range urls {
		s += string("xyz"[slices.Index(tr.urls, u)])
	}
	return s
}

// hint opens a Hints of c with a slack of a nanosecond (the test's reads come at the
// times announced) and publishes next.
func hint(t *testing.T, c *Cache, name string, next []HintEntry) *Hints {
	t.Helper()
	h, err := c.Hint(name, HintOptions{Slack: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Publish(next); err != nil {
		t.Fatal(err)
	}
	return h
}

// The choice of the victim in one process: by recency with no hints, by next use
// with one reader's, by the nearest of two readers' uses with two; and under
// PolicyLRU by recency whatever the hints.
func TestEvictionFollowsTheHintsOfEveryReader(t *testing.T) {
	for _, tc := range []struct {
		name    string
		policy  Policy
		readers int
		want    string
	}{
		{"no hints", PolicyOrder, 0, "yz"},
		{"one reader", PolicyOrder, 1, "xz"},
		{"two readers", PolicyOrder, 2, "yz"},
		{"lru ignores them", PolicyLRU, 2, "yz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTrio()
			c := tr.cache(t, t.TempDir(), Options{Policy: tc.policy})
			tr.fill(t, c)
			if tc.readers >= 1 {
				hint(t, c, "job-a", tr.reader1())
			}
			if tc.readers >= 2 {
				hint(t, c, "job-b", tr.reader2())
			}
			if got := tr.readZ(t, c); got != tc.want {
				t.Errorf("the tier holds %s, want %s", got, tc.want)
			}
		})
	}
}

// Hints published by other processes sharing the directory count as this process's
// own do: two jobs of different orders, each in its own process, both count.
func TestHintsOfOtherProcessesCount(t *testing.T) {
	for _, tc := range []struct {
		name string
		want string
		// where reader1 and reader2 publish: "a", "b" (another process each) or "c"
		// (the evicting process); "" for none.
		r1, r2 string
	}{
		{"one in another process", "xz", "a", ""},
		{"two in other processes", "yz", "a", "b"},
		{"one here one there", "yz", "a", "c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTrio()
			dir := t.TempDir()
			c := tr.cache(t, dir, Options{})
			others := map[string]*Cache{"a": tr.cache(t, dir, Options{}), "b": tr.cache(t, dir, Options{}), "c": c}
			tr.fill(t, c)
			hint(t, others[tc.r1], "job-a", tr.reader1())
			if tc.r2 != "" {
				hint(t, others[tc.r2], "job-b", tr.reader2())
			}
			if got := tr.readZ(t, c); got != tc.want {
				t.Errorf("the tier holds %s, want %s", got, tc.want)
			}
			want := 1
			if tc.r2 != "" {
				want = 2
			}
			if st := c.Stats(); st.HintReaders != want || st.HintsIgnored != 0 {
				t.Errorf("Stats: %d readers counted, %d files ignored; want %d and 0", st.HintReaders, st.HintsIgnored, want)
			}
		})
	}
}

// Hint files that must not count, from another process: each is ignored with one
// log line (however many evictions look at it), counted in Stats.HintsIgnored, and
// the cache evicts as if it were not there (LRU here); those of a reader whose
// process is gone are deleted.
func TestHintFilesThatDoNotCount(t *testing.T) {
	for _, tc := range []struct {
		name    string
		spoil   func(t *testing.T, h *Hints, path string)
		log     string
		deleted bool
	}{
		{"counted", func(*testing.T, *Hints, string) {}, "", false},
		{"truncated", func(t *testing.T, _ *Hints, path string) {
			fi, _ := os.Stat(path)
			if err := os.Truncate(path, fi.Size()-5); err != nil {
				t.Fatal(err)
			}
		}, "checksum mismatch", false},
		{"cut to its header", func(t *testing.T, _ *Hints, path string) {
			if err := os.Truncate(path, 20); err != nil {
				t.Fatal(err)
			}
		}, "cut short at 20 bytes", false},
		{"garbage", func(t *testing.T, _ *Hints, path string) {
			if err := os.WriteFile(path, randBytes(9, 4000), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a hint file", false},
		{"another format", func(t *testing.T, _ *Hints, path string) {
			b, _ := os.ReadFile(path)
			copy(b, "SLHINT99")
			os.WriteFile(path, b, 0o600)
		}, `format "SLHINT99"`, false},
		{"expired", func(t *testing.T, h *Hints, _ string) {
			old := time.Now().Add(-time.Hour)
			if err := os.Chtimes(h.lock.Name(), old, old); err != nil {
				t.Fatal(err)
			}
		}, "no heartbeat", false},
		{"process gone", func(t *testing.T, h *Hints, _ string) {
			// What a process killed leaves: its files, its lock let go, and a
			// temporary file of a publish cut short.
			os.WriteFile(filepath.Join(filepath.Dir(h.lock.Name()), "tmp-"+h.id+"-0123456789abcdef.hint"), []byte("half"), 0o600)
			h.lock.Close()
			h.lock = nil
		}, "its process is gone", true},
		{"no lock file", func(t *testing.T, h *Hints, _ string) {
			os.Remove(h.lock.Name())
			h.lock.Close()
			h.lock = nil
		}, "its process is gone", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTrio()
			dir := t.TempDir()
			logs := &logLines{t: t}
			c := tr.cache(t, dir, Options{Logf: logs.logf})
			a := tr.cache(t, dir, Options{})
			tr.fill(t, c)
			h := hint(t, a, "job-a", tr.reader1())
			path := filepath.Join(dir, "hints", h.id+hintExt)
			tc.spoil(t, h, path)
			got := tr.readZ(t, c)
			for range 3 {
				c.hints.view() // later evictions look again
			}
			st := c.Stats()
			if tc.log == "" {
				if got != "xz" || st.HintsIgnored != 0 || st.HintReaders != 1 {
					t.Errorf("the tier holds %s, %d files ignored, %d readers; want xz, 0 and 1", got, st.HintsIgnored, st.HintReaders)
				}
				return
			}
			if got != "yz" {
				t.Errorf("the tier holds %s, want yz (least recently used first, as with no hints)", got)
			}
			if n := logs.count(tc.log); n != 1 {
				t.Errorf("%d log lines with %q, want 1", n, tc.log)
			}
			if st.HintsIgnored != 1 || st.HintReaders != 0 {
				t.Errorf("Stats: %d files ignored, %d readers; want 1 and 0", st.HintsIgnored, st.HintReaders)
			}
			left, _ := filepath.Glob(filepath.Join(dir, "hints", "*"+h.id+"*"))
			if tc.deleted && len(left) != 0 {
				t.Errorf("the files of a reader whose process is gone are left: %v", left)
			}
			if !tc.deleted && !slices.Contains(left, path) {
				t.Errorf("the file of a live reader was deleted: %v left", left)
			}
		})
	}
}

// A hint file written by hand for a process that is not there (its pid of no
// process, its lock file not held) is deleted with one log line.
func TestHintFileOfADeadProcess(t *testing.T) {
	tr := newTrio()
	dir := t.TempDir()
	logs := &logLines{t: t}
	c := tr.cache(t, dir, Options{Logf: logs.logf})
	tr.fill(t, c)
	l := &hintList{reader: "gone", pid: 1<<22 + 17, slack: 1}
	for _, e := range tr.reader1() {
		l.keys, l.ats = append(l.keys, hintKey(key(e.URL))), append(l.ats, e.At)
	}
	hd := filepath.Join(dir, "hints")
	os.MkdirAll(hd, 0o700)
	id := newHintID()
	os.WriteFile(filepath.Join(hd, id+hintExt), encodeHints(l, tr.t0.UnixNano(), int64(time.Hour)), 0o600)
	os.WriteFile(filepath.Join(hd, id+lockExt), nil, 0o600)
	if got := tr.readZ(t, c); got != "yz" {
		t.Errorf("the tier holds %s, want yz", got)
	}
	if n := logs.count(`reader "gone", pid 4194321`); n != 1 {
		t.Errorf("%d log lines name the dead reader, want 1", n)
	}
	if left, _ := os.ReadDir(hd); len(left) != 0 {
		t.Errorf("left in the hints directory: %v", left)
	}
}

// Hints whose time has passed count as none: they never hold an entry once their
// reader has gone by (or has not come).
func TestPastHintsCountAsNone(t *testing.T) {
	tr := newTrio()
	c := tr.cache(t, t.TempDir(), Options{})
	clk := tr.fill(t, c)
	hint(t, c, "job-a", tr.reader1())
	clk.set(tr.now().Add(time.Hour)) // every hint passed
	if got := tr.readZ(t, c); got != "yz" {
		t.Errorf("the tier holds %s, want yz (least recently used first)", got)
	}
}

// Closing a Hints withdraws it here and from the directory; Cache.Close closes those
// still open.
func TestHintsClose(t *testing.T) {
	tr := newTrio()
	dir := t.TempDir()
	c := tr.cache(t, dir, Options{})
	a := tr.cache(t, dir, Options{})
	tr.fill(t, c)
	h := hint(t, a, "job-a", tr.reader1())
	h2 := hint(t, a, "job-b", tr.reader2())
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if err := h.Publish(tr.reader1()); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Close: %v, want ErrClosed", err)
	}
	if c.hints.view(); c.Stats().HintReaders != 1 {
		t.Errorf("%d readers count after one of two closed, want 1", c.Stats().HintReaders)
	}
	a.Close()
	if err := h2.Publish(tr.reader2()); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Cache.Close: %v, want ErrClosed", err)
	}
	if _, err := a.Hint("late", HintOptions{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Hint after Cache.Close: %v, want ErrClosed", err)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, "hints")); len(left) != 0 {
		t.Errorf("left in the hints directory: %v", left)
	}
	if got := tr.readZ(t, c); got != "yz" {
		t.Errorf("the tier holds %s, want yz", got)
	}
}

// An object needed later than every entry its room would take is read from the
// source without being cached, and without evicting anything.
func TestAdmissionDeclined(t *testing.T) {
	tr := newTrio()
	c := tr.cache(t, t.TempDir(), Options{})
	tr.fill(t, c)
	x, y, z := tr.urls[0], tr.urls[1], tr.urls[2]
	hint(t, c, "job-a", []HintEntry{{x, tr.at(10 * time.Second)}, {y, tr.at(20 * time.Second)}, {z, tr.at(0)}, {z, tr.at(time.Minute)}})
	if got := tr.readZ(t, c); got != "xy" {
		t.Errorf("the tier holds %s, want xy", got)
	}
	st := c.Stats()
	if st.Declined != 1 || st.Bypassed != 1 || st.Evicted != 0 {
		t.Errorf("Stats: declined %d, bypassed %d, evicted %d; want 1, 1, 0", st.Declined, st.Bypassed, st.Evicted)
	}
	size := int64(len(tr.data[z]))
	if st.BytesBypassed != size || st.BytesFetched != 2*size {
		t.Errorf("Stats: %d bytes bypassed, %d fetched; want %d and %d", st.BytesBypassed, st.BytesFetched, size, 2*size)
	}
	// Unannounced, z is declined too: everything held is needed.
	hint(t, c, "job-b", nil)
	tr.readZ(t, c)
	if st := c.Stats(); st.Declined != 2 {
		t.Errorf("declined %d, want 2", st.Declined)
	}
}

// The memory tier follows the same rule: alone (no disk tier), and in front of
// the disk tier, whose entries it loads on their second open.
func TestMemoryTierByNextUse(t *testing.T) {
	tr := newTrio()
	size := int64(len(tr.data[tr.urls[0]]))
	memHeld := func(c *Cache) string {
		c.mu.Lock()
		defer c.mu.Unlock()
		var in []string
		for _, u := range tr.urls {
			if _, ok := c.mem[0].lru.Peek(key(u)); ok {
				in = append(in, u)
			}
		}
		return tr.names(in)
	}
	read := func(t *testing.T, c *Cache, u string) {
		t.Helper()
		if got := readAll(t, c, u); !bytes.Equal(got, tr.data[u]) {
			t.Fatalf("%s: the bytes differ", u)
		}
	}
	t.Run("alone", func(t *testing.T) {
		for _, tc := range []struct {
			readers int
			want    string
		}{{0, "yz"}, {1, "xz"}, {2, "yz"}} {
			c := newCache(t, Options{MemoryBytes: 2*size + size/2}, tr.up)
			clk := testClock(c)
			clk.set(tr.t0)
			read(t, c, tr.urls[0])
			clk.set(tr.t0.Add(time.Second))
			read(t, c, tr.urls[1])
			clk.set(tr.now())
			if tc.readers >= 1 {
				hint(t, c, "job-a", tr.reader1())
			}
			if tc.readers >= 2 {
				hint(t, c, "job-b", tr.reader2())
			}
			read(t, c, tr.urls[2])
			if got := memHeld(c); got != tc.want {
				t.Errorf("%d readers: the memory tier holds %s, want %s", tc.readers, got, tc.want)
			}
		}
	})
	t.Run("declined", func(t *testing.T) {
		c := newCache(t, Options{MemoryBytes: 2*size + size/2}, tr.up)
		clk := testClock(c)
		clk.set(tr.t0)
		read(t, c, tr.urls[0])
		read(t, c, tr.urls[1])
		clk.set(tr.now())
		hint(t, c, "job-a", []HintEntry{{tr.urls[0], tr.at(time.Second)}, {tr.urls[1], tr.at(time.Second)}})
		read(t, c, tr.urls[2])
		if got, st := memHeld(c), c.Stats(); got != "xy" || st.Declined != 1 {
			t.Errorf("the memory tier holds %s, declined %d; want xy and 1", got, st.Declined)
		}
	})
	t.Run("in front of the disk", func(t *testing.T) {
		c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 1 << 20, MemoryBytes: size + size/2}, tr.up)
		clk := testClock(c)
		clk.set(tr.t0)
		for _, u := range tr.urls[:2] {
			read(t, c, u) // fetched
			read(t, c, u) // from disk
			read(t, c, u) // loaded into memory: x, then y in its place (no hints: LRU)
		}
		if got := memHeld(c); got != "y" {
			t.Fatalf("the memory tier holds %s, want y", got)
		}
		clk.set(tr.now())
		hint(t, c, "job-a", []HintEntry{{tr.urls[1], tr.at(time.Second)}, {tr.urls[0], tr.at(time.Minute)}})
		read(t, c, tr.urls[0]) // needed after y: served from disk, not loaded
		if got, st := memHeld(c), c.Stats(); got != "y" || st.MemoryDeclined != 1 {
			t.Errorf("the memory tier holds %s, declined %d; want y and 1", got, st.MemoryDeclined)
		}
	})
}

// The bytes served by each tier and read from the source are counted.
func TestStatsCountBytes(t *testing.T) {
	up, urls, data := newObjects(2, func(i int) int { return 300_000 + i })
	c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 1 << 20, MemoryBytes: 1 << 20}, up)
	u := urls[0]
	for range 3 { // fetched; from disk; loaded into memory on its second open
		readAll(t, c, u)
	}
	big := newCache(t, Options{Dir: t.TempDir(), DiskBytes: 1000}, up)
	readAll(t, big, urls[1]) // larger than the budget
	n := int64(len(data[u]))
	st := c.Stats()
	if st.BytesFetched != n || st.BytesFromDisk != n || st.BytesFromMemory != n || st.BytesBypassed != 0 {
		t.Errorf("Stats: fetched %d, disk %d, memory %d, bypassed %d; want %d, %d, %d, 0", st.BytesFetched, st.BytesFromDisk, st.BytesFromMemory, st.BytesBypassed, n, n, n)
	}
	if st := big.Stats(); st.BytesBypassed != int64(len(data[urls[1]])) || st.BytesFetched != 0 {
		t.Errorf("Stats: bypassed %d, fetched %d; want %d, 0", st.BytesBypassed, st.BytesFetched, len(data[urls[1]]))
	}
}

// Hints that cannot be written (a full disk) count in their own process and are
// reported once; the other processes evict without them (LRU here).
func TestHintsOnAFullDisk(t *testing.T) {
	tr := newTrio()
	dir := t.TempDir()
	logs := &logLines{t: t}
	c := tr.cache(t, dir, Options{})
	a := tr.cache(t, dir, Options{Logf: logs.logf})
	a.disk.fault = func(op, path string) error {
		if strings.Contains(path, string(filepath.Separator)+"hints"+string(filepath.Separator)) && (op == "create" || op == "write") {
			return enospc(op, path)
		}
		return nil
	}
	h, err := a.Hint("job-a", HintOptions{Slack: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := h.Publish(tr.reader1()); !errors.Is(err, ErrUnwritable) || !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("Publish on a full disk: %v, want ErrUnwritable and ENOSPC", err)
		}
	}
	if n := logs.count("cannot write the hints"); n != 1 {
		t.Errorf("%d log lines, want 1", n)
	}
	tr.fill(t, c)
	if got := tr.readZ(t, c); got != "yz" {
		t.Errorf("the other process holds %s, want yz", got)
	}
	if st := c.Stats(); st.HintReaders != 0 {
		t.Errorf("the other process counts %d readers, want 0", st.HintReaders)
	}
	// In its own process they count.
	a2 := tr.cache(t, t.TempDir(), Options{Logf: t.Logf})
	a2.disk.fault = a.disk.fault
	h2, _ := a2.Hint("job-a", HintOptions{Slack: time.Nanosecond})
	tr.fill(t, a2)
	h2.Publish(tr.reader1())
	if got := tr.readZ(t, a2); got != "xz" {
		t.Errorf("the publishing process holds %s, want xz", got)
	}
}

// A disk that fills up in the middle of the epochs: the cache keeps its budget,
// serves exact bytes (drive checks every one), and logs the cause once.
func TestFullDiskWithHints(t *testing.T) {
	const shards, size = 16, 48 << 10
	up, urls, data := newObjects(shards, func(int) int { return size })
	reads, starts := epochs(urls, size, 3, 5)
	r := &run{reads: reads, starts: starts, step: time.Second, base: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	budget := int64(shards/2)*entryCost(urls[0], "v1", size) + size/2
	logs := &logLines{t: t}
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir, DiskBytes: budget, Logf: logs.logf}, up)
	fixedFetchTimes(c)
	h, err := c.Hint("trainer", HintOptions{Slack: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	var full atomic.Bool
	c.disk.fault = func(op, path string) error {
		if full.Load() && (op == "write" || op == "create") {
			return enospc(op, path)
		}
		return nil
	}
	r.drive(t, c, h, up, data, func(i int) {
		full.Store(i >= shards+3) // from the fourth read of the second epoch
		if used, _ := dirBytes(t, dir); used > budget {
			t.Fatalf("after read %d the directory holds %d bytes, over the budget of %d", i, used, budget)
		}
	})
	st := c.Stats()
	if st.WriteErrors == 0 {
		t.Error("no fetch met the full disk")
	}
	if n := logs.count("cannot write the cache"); n != 1 {
		t.Errorf("%d log lines for the full disk, want 1", n)
	}
	if n := logs.count("cannot write the hints"); n != 1 {
		t.Errorf("%d log lines for the hints, want 1", n)
	}
	if st.DiskEntries == 0 {
		t.Error("the entries committed before the disk filled up were lost")
	}
}

// Readers publishing while others read, in two processes: every byte exact, the
// budget held (go test -race).
func TestHintsConcurrent(t *testing.T) {
	up, urls, data := newObjects(12, func(i int) int { return 20<<10 + 1000*i })
	dir := t.TempDir()
	budget := int64(5 * (32 << 10))
	var cs []*Cache
	for range 2 {
		cs = append(cs, newCache(t, Options{Dir: dir, DiskBytes: budget}, up))
	}
	var wg sync.WaitGroup
	for p, c := range cs {
		for g := range 3 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(p), uint64(g)))
				h, err := c.Hint(fmt.Sprintf("p%d-r%d", p, g), HintOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				defer h.Close()
				for round := range 6 {
					perm := rng.Perm(len(urls))
					var next []HintEntry
					for i, k := range perm {
						next = append(next, HintEntry{URL: urls[k], At: time.Now().Add(time.Duration(i) * time.Millisecond).UnixNano()})
					}
					if err := h.Publish(next); err != nil {
						t.Error(err)
						return
					}
					for _, k := range perm[:4+round] {
						if got := readAll(t, c, urls[k]); !bytes.Equal(got, data[urls[k]]) {
							t.Errorf("%s: the bytes differ", urls[k])
						}
					}
				}
			})
		}
	}
	wg.Wait()
	if used, _ := dirBytes(t, dir); used > budget {
		t.Errorf("the directory holds %d bytes, over the budget of %d", used, budget)
	}
}

func TestParsePolicy(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Policy
		ok   bool
	}{{"order", PolicyOrder, true}, {"LRU", PolicyLRU, true}, {" lru ", PolicyLRU, true}, {"", 0, false}, {"belady", 0, false}} {
		got, err := ParsePolicy(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParsePolicy(%q) = %v, %v", tc.in, got, err)
		}
	}
	var zero Options
	if zero.Policy != PolicyOrder || DefaultPolicy != PolicyOrder {
		t.Error("the default policy is not order")
	}
	var p Policy
	if err := p.UnmarshalText([]byte("lru")); err != nil || p != PolicyLRU {
		t.Errorf("UnmarshalText: %v, %v", p, err)
	}
	if b, _ := PolicyLRU.MarshalText(); string(b) != "lru" {
		t.Errorf("MarshalText: %s", b)
	}
	if _, err := New(Options{Policy: 7}, newFake()); err == nil {
		t.Error("New took an unknown policy")
	}
}

// A hint file reads back what was written, and costs about 13 bytes an entry for
// reads a second apart.
func TestHintFileRoundTrip(t *testing.T) {
	l := &hintList{reader: "job-7/rank-3", pid: 4242, slack: int64(30 * time.Second)}
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	const n = 4096
	for i := range n {
		l.keys = append(l.keys, hintKey(fmt.Sprintf("s3://b/train-%06d.tar", i)))
		l.ats = append(l.ats, t0+int64(i)*int64(time.Second)+int64(i%7)*1e6)
	}
	b := encodeHints(l, t0-5e9, int64(time.Minute))
	got, life, err := parseHints(b)
	if err != nil {
		t.Fatal(err)
	}
	if life != int64(time.Minute) || got.reader != l.reader || got.pid != l.pid || got.slack != l.slack || !slices.Equal(got.keys, l.keys) || !slices.Equal(got.ats, l.ats) {
		t.Error("the file does not read back what was written")
	}
	if per := float64(len(b)) / n; per > 14 {
		t.Errorf("%.1f bytes per entry", per)
	}
	t.Logf("%d entries: %d bytes (%.1f per entry)", n, len(b), float64(len(b))/n)
	for i := range len(b) {
		if _, _, err := parseHints(b[:i]); err == nil {
			t.Fatalf("a file cut to %d bytes parses", i)
		}
	}
}

func FuzzParseHints(f *testing.F) {
	l := &hintList{reader: "r", pid: 1, slack: 1, keys: []uint64{1, 2, 3}, ats: []int64{1e18, 1e18 + 5, 1e18 - 5}}
	f.Add(encodeHints(l, 1e18, 1e9))
	f.Add([]byte(hintMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, _, err := parseHints(b)
		if err != nil {
			return
		}
		if len(l.keys) != len(l.ats) {
			t.Fatal("keys and times differ in number")
		}
		for _, at := range l.ats {
			if at <= 0 || at >= maxHintAt {
				t.Fatalf("time %d out of range", at)
			}
		}
	})
}

// BenchmarkPublish is the cost of one publish of an epoch of 4096 shards to the
// reader's file.
func BenchmarkPublish(b *testing.B) {
	c, err := New(Options{Dir: b.TempDir(), DiskBytes: 1 << 20, Logf: b.Logf}, newFake())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	h, _ := c.Hint("bench", HintOptions{})
	var urls []string
	for i := range 4096 {
		urls = append(urls, fmt.Sprintf("s3://bucket/dataset/train-%06d.tar", i))
	}
	next := Schedule(urls, time.Now(), 2*time.Second)
	b.ReportAllocs()
	b.SetBytes(int64(len(urls)))
	for b.Loop() {
		if err := h.Publish(next); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHintView is the cost the policy adds to a fetch that must evict: reading
// the hints of 8 readers of 4096 shards each (7 of them in files of other
// processes, unchanged) and ranking a tier of 4096 entries.
func BenchmarkHintView(b *testing.B) {
	dir := b.TempDir()
	c, err := New(Options{Dir: dir, DiskBytes: 1 << 20, Logf: b.Logf}, newFake())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var urls []string
	for i := range 4096 {
		urls = append(urls, fmt.Sprintf("s3://bucket/dataset/train-%06d.tar", i))
	}
	for p := range 8 {
		o := c
		if p > 0 {
			o, _ = New(Options{Dir: dir, DiskBytes: 1 << 20, Logf: b.Logf}, newFake())
			defer o.Close()
		}
		h, _ := o.Hint("bench", HintOptions{})
		rng := rand.New(rand.NewPCG(uint64(p), 1))
		perm := rng.Perm(len(urls))
		var order []string
		for _, i := range perm {
			order = append(order, urls[i])
		}
		h.Publish(Schedule(order, time.Now(), time.Second))
	}
	keys := make([]uint64, len(urls))
	for i, u := range urls {
		keys[i] = hintKey(key(u))
	}
	b.ReportAllocs()
	for b.Loop() {
		r := c.ranker(key(urls[0]))
		for i, k := range keys {
			r.rankOf(k, i)
		}
	}
}
