package cache

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

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
