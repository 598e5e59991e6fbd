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
	tr := newTrio()
	dir := t.TempDir()
	c := tr.cache(t, dir, Options{})
	h, err := c.Hint("job", HintOptions{WriteEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	file := filepath.Join(dir, "hints", h.id+hintExt)
	entries := func() int {
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
	wait := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for entries() != want {
			if time.Now().After(deadline) {
				t.Fatalf("the file holds %d entries, want %d", entries(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
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
