package source

import (
	"sync"
	"testing"
	"time"
)

// TestRetryClock checks that the deadline's clock starts at the first failure and
// runs only while some stream waits.
func TestRetryClock(t *testing.T) {
	c := newRetryClock(time.Hour)
	c.enter()
	if _, ok := c.remaining(); ok {
		t.Fatal("the clock runs before a failure")
	}
	c.fail()
	c.enter() // a second stream
	c.leave()
	c.leave()
	left, ok := c.remaining()
	if !ok || left >= time.Hour || left < time.Hour-time.Minute {
		t.Fatalf("remaining = %v, %v", left, ok)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		// Nobody reads: the clock stands still.
		if l, _ := c.remaining(); l != left {
			t.Errorf("the clock ran while no stream read: %v, then %v", left, l)
		}
	})
	wg.Wait()
	if _, ok := newRetryClock(-1).remaining(); ok {
		t.Error("a negative deadline is a deadline")
	}
}
