package cache

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Announce writes the reader's file before it returns, whatever WriteEvery, and a
// publish WriteEvery held back is dropped: an epoch's new order reaches the other
// processes at once.
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
	x, y, z := tr.urls[0], tr.urls[1], tr.urls[2]
	at := time.Now().Add(time.Minute)
	if err := h.Announce(Schedule([]string{x, y, z}, at, time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := entries(); n != 3 {
		t.Fatalf("after the first Announce the file holds %d entries, want 3", n)
	}
	if err := h.Publish(Schedule([]string{y}, at, time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := entries(); n != 3 {
		t.Fatalf("a Publish within WriteEvery was written: the file holds %d entries, want 3", n)
	}
	if err := h.Announce(Schedule([]string{z, x}, at, time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := entries(); n != 2 {
		t.Fatalf("after Announce within WriteEvery the file holds %d entries, want 2", n)
	}
	h.mu.Lock()
	pending := h.pending
	h.mu.Unlock()
	if pending != nil {
		t.Errorf("the publish held back is still to be written after an Announce")
	}
	if st := h.Stats(); st.Publishes != 3 || st.Entries != 6 {
		t.Errorf("Stats %+v: want 3 publishes of 6 entries", st)
	}
}
