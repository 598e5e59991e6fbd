package serve

import (
	"testing"
	"time"
)

// A trainer's wait rises while it waits, not only when its next release reports it,
// and the figure never goes back (it is a counter).
func TestWaitUnderWay(t *testing.T) {
	var tl sessionTally
	t0 := time.Unix(1000, 0)
	tl.reportWait(2 * time.Second)
	tl.starveFrom(t0)
	tl.mu.Lock()
	at := func(d time.Duration) time.Duration { return tl.wait(t0.Add(d)) }
	if w := at(3 * time.Second); w != 5*time.Second {
		t.Errorf("reported 2s, waiting 3s: wait %v, want 5s", w)
	}
	tl.mu.Unlock()
	tl.starveTo(t0.Add(3 * time.Second))
	tl.reportWait(4900 * time.Millisecond) // the trainer's own count, a little less
	tl.mu.Lock()
	if w := at(4 * time.Second); w != 5*time.Second {
		t.Errorf("after the batch came: wait %v, want 5s (never less than shown)", w)
	}
	tl.mu.Unlock()
	tl.reportWait(6 * time.Second)
	tl.mu.Lock()
	if w := at(5 * time.Second); w != 6*time.Second {
		t.Errorf("reported 6s, not waiting: wait %v, want 6s", w)
	}
	tl.mu.Unlock()
}
