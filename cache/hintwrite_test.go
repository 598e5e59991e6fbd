package cache

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Announce has the reader's file written at once, whatever WriteEvery, in place of
// a publish WriteEvery held back: an epoch's new order reaches the other processes
// without waiting for the interval (an hour here).
func TestHintsAnnounceWritesAtOnce(t *testing.T) {
	r := newHintFileRig(t, time.Hour)
	tr, h, entries, wait := r.tr, r.h, r.entries, r.wait
	x, y, z := tr.urls[0], tr.urls[1], tr.urls[2]
	at := time.Now().Add(time.Minute)
	if err := h.Announce(Schedule([]string{x, y, z}, at, time.Second)); err != nil {
		t.Fatal(err)
	}
	wait(3)
	if err := h.Publish(Schedule([]string{y}, at, time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := entries(); n != 3 {
		t.Fatalf("a Publish within WriteEvery was written: the file holds %d entries, want 3", n)
	}
	if err := h.Announce(Schedule([]string{z, x}, at, time.Second)); err != nil {
		t.Fatal(err)
	}
	wait(2)
	h.mu.Lock()
	pending := h.pending
	h.mu.Unlock()
	if pending != nil {
		t.Errorf("a publish is still to be written after the Announce was")
	}
	if st := h.Stats(); st.Publishes != 3 || st.Entries != 6 {
		t.Errorf("Stats %+v: want 3 publishes of 6 entries", st)
	}
}

// With HintOptions.WriteEvery a publish counts in its own process at once and
// reaches the file from another goroutine, one soon after the last write when the
// interval has passed, only the last of several; Close writes nothing more.
func TestHintsWriteEvery(t *testing.T) {
	const every = 300 * time.Millisecond
	r := newHintFileRig(t, every)
	tr, c, h, file, entries, wait := r.tr, r.c, r.h, r.file, r.entries, r.wait
	x, y, z := tr.urls[0], tr.urls[1], tr.urls[2]
	now := time.Now()
	publish := func(urls ...string) {
		t.Helper()
		if err := h.Publish(Schedule(urls, now.Add(time.Minute), time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	publish(x, y, z) // the first: written at once, by the timer's goroutine
	wait(3)
	publish(y, z)
	publish(z)
	if n := entries(); n != 3 {
		t.Fatalf("within WriteEvery the file holds %d entries, want the first publish's 3", n)
	}
	if l := c.hints.view(); len(l.spans) != 1 {
		t.Errorf("this process sees hints of %d objects, want the last publish's 1", len(l.spans))
	}
	wait(1)
	if st := h.Stats(); st.Publishes != 3 || st.Entries != 6 || st.FileBytes == 0 {
		t.Errorf("Stats %+v: want 3 publishes of 6 entries and the bytes of two files", st)
	}
	publish(x, y)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(every + 100*time.Millisecond)
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("after Close the file is there (%v)", err)
	}
}

// hintFileRig is a cache with a disk tier and one reader's Hints of WriteEvery
// every (closed at the test's end), its file, and functions that count the file's
// entries (-1: no file) and wait until it holds want of them.
type hintFileRig struct {
	tr      *trio
	c       *Cache
	h       *Hints
	file    string
	entries func() int
	wait    func(want int)
}

func newHintFileRig(t *testing.T, every time.Duration) hintFileRig {
	tr := newTrio()
	dir := t.TempDir()
	c := tr.cache(t, dir, Options{})
	h, err := c.Hint("job", HintOptions{WriteEvery: every})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	r := hintFileRig{tr: tr, c: c, h: h, file: filepath.Join(dir, "hints", h.id+hintExt)}
	r.entries, r.wait = hintFileEntries(t, r.file)
	return r
}

// hintFileEntries returns, for the hint file at file, a function that counts its
// entries (-1: no file) and one that waits until it holds want of them.
func hintFileEntries(t *testing.T, file string) (entries func() int, wait func(want int)) {
	entries = func() int {
		t.Helper()
		b, err := os.ReadFile(file)
		if os.IsNotExist(err) {
			return -1
		}
		if err != nil {
			t.Fatal(err)
		}
		l, _, err := parseHints(b)
		if err != nil {
			t.Fatal(err)
		}
		return len(l.keys)
	}
	wait = func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for entries() != want {
			if time.Now().After(deadline) {
				t.Fatalf("the file holds %d entries, want %d", entries(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return entries, wait
}
